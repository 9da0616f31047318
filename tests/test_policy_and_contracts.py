"""One source of truth: the C policy formulas equal the Python ones; every rendered kernel's
signature, block and shared memory equal its contract, and so do the C launchers' declarations
(sm90's TMA map included); no shared-memory regions overlap."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvforge.codegen import policy
from kvforge.codegen.contract import TENSOR_MAP_CTYPE, GridDim
from kvforge.codegen.matrix import load_matrix
from kvforge.codegen.render import render_launch_header, render_variant

VARIANTS = load_matrix()


def test_c_policy_matches_python_on_many_inputs(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler here: the C policy is checked where g++ exists (CI)")
    src = tmp_path / "policy.cpp"
    src.write_text("#include <cstdio>\n" + policy.C_POLICY + """
int main() {
  int a, b, c, d;
  while (std::scanf("%d %d %d %d", &a, &b, &c, &d) == 4) {
    int n, chunk;
    policy_split_plan(a, b, c, d, &n, &chunk);
    std::printf("%d %d %d %d %d\\n", n, chunk, policy_num_splits(a, c / 64, b, 1), policy_min_keys_per_split(d),
                policy_num_splits(a, c / 64, b, 4));
  }
}
""")
    exe = tmp_path / "policy"
    subprocess.run([cxx, "-std=c++17", "-O1", str(src), "-o", str(exe)], check=True)
    import random

    rnd = random.Random(0)
    cases = [(rnd.choice([0, 1, -5, rnd.randrange(0, 300_000)]), rnd.randrange(1, 65), rnd.choice([64, 128, 256, 512]),
              rnd.choice([16, 32, 64, 128])) for _ in range(3000)]
    out = subprocess.run([str(exe)], input="\n".join(" ".join(map(str, c)) for c in cases), capture_output=True,
                         text=True, check=True).stdout.split("\n")
    for (seqlen, splits, min_keys, bn), line in zip(cases, out):
        n, chunk, ns, mk, ns4 = map(int, line.split())
        assert (n, chunk) == policy.split_plan(seqlen, splits, min_keys, bn), (seqlen, splits, min_keys, bn)
        assert ns == policy.num_splits(seqlen, min_keys // 64, splits)
        assert ns4 == policy.num_splits(seqlen, min_keys // 64, splits, policy.WAVE_SPLITS)
        assert mk == policy.min_keys_per_split(bn)


@given(st.integers(0, 10**6), st.integers(1, policy.MAX_SPLITS), st.sampled_from([16, 32, 64, 128]))
@settings(max_examples=300, deadline=None)
def test_the_split_plan_covers_each_sequence_exactly(seqlen, splits, bn):
    n, chunk = policy.split_plan(seqlen, splits, policy.min_keys_per_split(bn), bn)
    assert 1 <= n <= splits and chunk % bn == 0
    if seqlen:
        assert (n - 1) * chunk < seqlen <= n * chunk  # every chunk non-empty, all keys covered


def test_workspace_bound_holds_for_every_batch():
    for wave in (1, policy.WAVE_SPLITS):
        for blocks in (1, 2, 8, 32):
            for max_batch in (1, 7, 64, 300):
                rows = policy.workspace_rows(max_batch, 1, 1, blocks, 2, 132, wave)
                worst = max(b * policy.num_splits(blocks * b, 2, 132, wave) for b in range(1, max_batch + 1))
                assert worst <= rows
            # the stream workspace of the functional calls: every batch that splits, however large
            bound = policy.split_pairs_bound(blocks, 2, 132, wave)
            for b in range(1, 4000):
                k = policy.num_splits(blocks * b, 2, 132, wave)
                assert k == 1 or b * k <= bound, (wave, blocks, b, k)


def test_without_wave_splits_the_plan_only_fills_one_wave():
    """wave_splits=1 (MLA) keeps the fill-the-GPU rule: min(MAX_SPLITS, slots // ctas), 1 past a wave."""
    for sms in (1, 2, 7, 108, 132, 170):
        for cps in (1, 2, 3, 4):
            for ctas in range(1, 3 * sms * cps + 3):
                assert policy.num_splits(ctas, cps, sms) == max(1, min(policy.MAX_SPLITS, sms * cps // ctas))


def test_wave_splits_even_out_a_nearly_empty_last_wave():
    """GQA (wave_splits 4) on 132 SMs x 2 CTAs: full waves stay unsplit; 544 CTAs (3 waves, the last
    3% full) take 3 splits (7 waves of thirds, measured 1.11x at b=68: bench/RESULTS.md); the split
    CTAs never exceed WAVE_SPLIT_SLOTS x slots."""
    slots = 264
    assert [policy.num_splits(c, 2, 132, 4) for c in (264, 512, 528, 1024)] == [1, 1, 1, 1]
    assert policy.num_splits(544, 2, 132, 4) == 3 and policy.num_splits(576, 2, 132, 4) == 3
    for ctas in range(1, 20 * slots):
        k = policy.num_splits(ctas, 2, 132, 4)
        assert k == 1 or ctas * k <= max(policy.WAVE_SPLIT_SLOTS * slots, slots)


_SIG = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(([^)]*)\)|__attribute__\(\(amdgpu_flat_work_group_size'
                  r'\(1, ([^)]*)\)\)\))\s*\n(\w+)\(([^)]*)\)', re.M)


def _constexprs(src: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"constexpr int (\w+) = (-?\d+);", src)}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_rendered_kernels_match_their_contracts(variant):
    src = render_variant(variant)
    consts = _constexprs(src)
    found = {m.group(3): m for m in _SIG.finditer(src)}
    assert set(found) == {k.symbol for k in variant.kernels}, "kernels in the source differ from the contracts"
    for k in variant.kernels:
        m = found[k.symbol]
        params = [p.strip() for p in m.group(4).split(",")]
        parsed = []
        for p in params:  # "<qualifiers and type> [__restrict__] <name>", e.g. sm90's
            ctype, name = p.rsplit(" ", 1)  # "const __grid_constant__ kvforge::sm90::TensorMap kv_map"
            parsed.append((name, ctype.replace(" __restrict__", "").strip()))
        assert parsed == [(a.name, a.ctype) for a in k.args]
        if variant.backend == "sm90" and k.role == "main" and not variant.config.is_fp8:  # the TMA map(s), last
            if variant.family == "gqa_decode":  # K's and V's
                assert parsed[-2:] == [("k_map", TENSOR_MAP_CTYPE), ("v_map", TENSOR_MAP_CTYPE)]
                assert k.args[-2].scalar_kind == k.args[-1].scalar_kind == "tmap"
            else:
                assert parsed[-1] == ("kv_map", TENSOR_MAP_CTYPE) and k.args[-1].scalar_kind == "tmap"
        bound = (m.group(1) or m.group(2)).split(",")[0].strip()
        threads = int(bound) if bound.isdigit() else consts.get(bound)
        if threads is None and bound in ("kThreads",):
            threads = consts["kThreads"]
        assert threads == k.threads, f"{k.symbol}: launch bound {bound} = {threads}, contract block {k.block}"
    if variant.family != "pipeline_selftest":
        main = variant.contracts["main"]
        if variant.backend == "cdna":  # static LDS: the array size is the layout, no dynamic shared memory
            assert main.dynamic_smem_bytes == 0 and consts["kLdsBytes"] == variant.config.layout.total_bytes
        else:
            assert consts["kSmemBytes"] == main.dynamic_smem_bytes == variant.config.layout.total_bytes
        comb = variant.contracts["combine"]
        assert consts["kCombineThreads"] == comb.threads  # the combine strides its columns by its block


_DECL = re.compile(r'^extern "C" __global__ void (\w+)\(([^)]*)\);$', re.M)


@pytest.mark.parametrize("family", ["mla_decode", "gqa_decode"])
def test_launch_header_declarations_and_launches_match_the_contracts(family):
    """Each launcher declares its kernels with the contracts' C types and launches them with the
    contracts' arguments; an sm90 launcher encodes `kv_map` with its config's page size and box rows,
    a GQA kv_load='tma' launcher `k_map` and `v_map` over rows of num_kv_heads heads."""
    variants = [v for v in VARIANTS if v.family == family and v.language == "cuda"]
    text = render_launch_header(family, variants)
    declared = {m.group(1): [t.strip() for t in m.group(2).split(",")] for m in _DECL.finditer(text)}
    assert declared == {k.symbol: [a.ctype for a in k.args] for v in variants for k in v.kernels}
    # sm90: a map over the cache (16-bit, or fp8 bytes for fp8_staging='slot' and schedule 'keys_m'; the other fp8
    # stagings load without one)
    sm90 = [v for v in variants if v.backend == "sm90" and v.family == "mla_decode"
            and (not v.config.is_fp8 or v.config.converts_in_slot or v.config.keys_m)]
    # GQA (the sm80 kernel with kv_load='tma', and the sm90 GQA kernel on 16-bit caches; on fp8 ones its producers
    # load the rows into registers, without maps): k_map and v_map
    tma = [v for v in variants if getattr(v.config, "kv_load", "") == "tma"
           or (v.backend == "sm90" and v.family == "gqa_decode" and not v.config.is_fp8)]
    assert ('#include "kvforge/sm90_tile.cuh"' in text) == bool(sm90 or tma)
    assert ("cudaGetDriverEntryPointByVersion" in text) == bool(sm90 or tma)
    for v in variants:
        run = text[text.index(f"{v.name}_run("):]
        run = run[:run.index("\n}\n")]
        main = v.contracts["main"]
        assert f"{main.symbol}<<<" in run and ", ".join(a.name for a in main.args) + ");" in run
        cfg = v.config
        dtype = {"bf16": "BFLOAT16", "fp16": "FLOAT16", "fp8_e4m3": "UINT8"}.get(cfg.kv_dtype)
        elem = 1 if cfg.is_fp8 else 2  # bytes per cache element
        if v in sm90:
            assert main.args[-1].name == "kv_map" and "const kvforge::sm90::TensorMap& kv_map" in run
            encode = run[run.index("kvforge_tma::paged_kv_map("):]
            encode = " ".join(encode[:encode.index(");")].split())
            row = cfg.kv_token_bytes  # a cached token's bytes (the packed fp8_ds_mla token: 656)
            assert encode == (f"kvforge_tma::paged_kv_map(&kv_map_cache, k_cache, num_pages, "
                              f"CU_TENSOR_MAP_DATA_TYPE_{dtype}, {row // elem}, {cfg.page_size}, "
                              f"{row}, {row * cfg.page_size}, {128 // elem}, "
                              f"{cfg.box_rows}")
        elif v in tma:
            # rows of every KV head: [num_pages][page_size][num_kv_heads * D], boxes of one head's 128 bytes
            assert [a.name for a in main.args[-2:]] == ["k_map", "v_map"]
            for arg, cache in (("k_map", "k_cache"), ("v_map", "v_cache")):
                assert f"const kvforge::sm90::TensorMap& {arg} = {arg}_cache.map;" in run
                encode = run[run.index(f"kvforge_tma::paged_kv_map(&{arg}_cache"):]
                encode = " ".join(encode[:encode.index(");")].split())
                heads = " * (cuuint64_t)num_kv_heads"
                d = cfg.head_dim_qk
                assert encode == (f"kvforge_tma::paged_kv_map(&{arg}_cache, {cache}, num_pages, "
                                  f"CU_TENSOR_MAP_DATA_TYPE_{dtype}, {d}{heads}, {cfg.page_size}, {d * elem}{heads}, "
                                  f"{d * elem * cfg.page_size}{heads}, {128 // elem}, {min(cfg.page_size, cfg.block_n)}")
        else:
            assert "kv_map" not in run and "k_map" not in run


def test_grid_dims_print_and_evaluate_alike():
    d = GridDim("num_q_heads", 64)
    assert d.c() == "(num_q_heads + 63) / 64" and d.value({"num_q_heads": 65}) == 2
    assert GridDim().c() == "1" and GridDim("batch").value({"batch": 7}) == 7


def test_no_smem_regions_overlap_in_any_default_variant():
    for v in VARIANTS:
        assert v.config.layout.overlaps() == [], v.name


def test_the_overlap_check_finds_a_clash():
    from kvforge.codegen.smem import Region, SmemLayout

    bad = SmemLayout((Region("a", 0, 128), Region("b", 64, 128)), 256)
    assert bad.overlaps() == [("a", "b")]
    assert SmemLayout((Region("a", 0, 128), Region("b", 64, 128)), 256, (("a", "b"),)).overlaps() == []
    assert SmemLayout((Region("a", 0, 300),), 256).overlaps() == [("a", "<end>")]


@given(family=st.sampled_from(["mla_decode", "gqa_decode"]), d=st.sampled_from([64, 128, 256]),
       hpc=st.sampled_from([1, 2, 4, 8, 16, 32, 64]), page=st.sampled_from([16, 32, 64, 128]),
       bn=st.sampled_from([16, 32, 64, 128]), s_q=st.integers(1, 4), stages=st.integers(2, 6),
       consumers=st.sampled_from([1, 2, 4, 8]), producers=st.sampled_from([1, 2, 4]),
       backend=st.sampled_from(["sm80", "cdna"]))
@settings(max_examples=400, deadline=None)
def test_every_accepted_config_has_a_layout_without_overlaps(family, d, hpc, page, bn, s_q, stages, consumers,
                                                              producers, backend):
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import ConfigError, build

    dqk, dv = (576, 512) if family == "mla_decode" else (d, d)
    data = dict(family=family, backend=backend, arch="sm_90" if backend == "sm80" else "gfx942", head_dim_qk=dqk,
                head_dim_v=dv, heads_per_cta=hpc, page_size=page, block_n=bn, max_s_q=s_q)
    if backend == "sm80":
        data["pipeline"] = {"num_kv_stages": stages, "num_consumer": consumers, "num_producer": producers}
    else:
        data["kv_buffers"] = ({"role": "K", "BN": bn, "WN": 16, "BK": 16, "depth": dqk, "num_threads": 64 * consumers},
                              {"role": "V", "BN": bn, "WN": bn, "BK": 16, "depth": dv, "num_threads": 64 * consumers})
    try:
        cfg = build(DecodeConfig, data)
    except ConfigError:
        return
    layout = cfg.layout
    assert layout.overlaps() == [] and layout.total_bytes <= 232448
    ends = sorted((r.offset, r.offset + r.size) for r in layout.regions if r.size)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ends, ends[1:]))


def test_old_style_names_still_select_their_variants():
    from kvforge.codegen.matrix import filter_variants

    v = next(v for v in VARIANTS if v.family == "mla_decode" and v.backend == "sm80")
    assert "_ps64_" in v.name or "_ps16_" in v.name
    old = v.legacy_name
    assert old != v.name and "_ps" not in old
    assert v in filter_variants(VARIANTS, old)
    # two cdna variants that once differed only in the hash now differ in MFMA shape and threads
    cdna = [x for x in VARIANTS if x.backend == "cdna" and x.family == "gqa_decode" and x.arch == "gfx90a"]
    fields = [x.name.rsplit("_", 1)[0] for x in cdna]
    assert len(set(fields)) == len(fields)
