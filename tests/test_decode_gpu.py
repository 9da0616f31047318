"""MLA and GQA paged decode on the GPU against the float64 reference: ragged and zero lengths,
shuffled pages, NaN in every byte the kernel must not read, poisoned outputs, causal s_q > 1,
split and unsplit paths, CUDA-graph replay, torch and cupy inputs."""
from __future__ import annotations


import numpy as np
import pytest


from paged_inputs import assert_matches, make_case, reference, rel_l2

from kvforge.codegen.select import mla16_bulk_tilings

pytestmark = pytest.mark.gpu
TOL = 1e-2


def _splits(ctas: int) -> int:
    """Splits per sequence for `ctas` CTAs of one-CTA-per-SM variants on device 0."""
    from kvforge.codegen.policy import num_splits
    from kvforge.runtime.device import sm_count

    return num_splits(ctas, 1, sm_count(0))


def _run(family, case, *, causal=False, scale=None, out=None, lse=None, stream=None):
    import kvforge

    if family == "mla_decode":
        return kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=causal,
                                  softmax_scale=scale, out=out, lse=lse, stream=stream)
    return kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=causal,
                              softmax_scale=scale, out=out, lse=lse, stream=stream)


def _poisoned(case, family):
    import torch

    b, s_q, hq, _ = case.q.shape
    dv = 512 if family == "mla_decode" else case.q.shape[-1]
    out = torch.full((b, s_q, hq, dv), float("nan"), dtype=case.q.dtype, device="cuda")
    lse = torch.full((b, hq, s_q), float("nan"), dtype=torch.float32, device="cuda")
    return out, lse


def _check(family, case, out, lse, *, causal, scale=None):
    import torch

    torch.cuda.synchronize()
    want_o, want_l = reference(family, case.host, causal=causal, scale=scale)
    return assert_matches(out, lse, want_o, want_l, tol=TOL)


LENS_RAGGED = [0, 1, 17, 64, 200, 1000, 333, 2]


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("heads", [16, 128])
def test_mla_ragged_lengths_and_page_sizes(page_size, heads):
    case = make_case("mla_decode", batch=8, s_q=1, hq=heads, hkv=1, d=576, page_size=page_size, lens=LENS_RAGGED,
                     seed=page_size + heads)
    out, lse = _poisoned(case, "mla_decode")
    _run("mla_decode", case, out=out, lse=lse)
    _check("mla_decode", case, out, lse, causal=False)


@pytest.mark.parametrize("heads", [1, 3, 20, 64, 100])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mla_any_head_count_and_both_dtypes(heads, dtype):
    case = make_case("mla_decode", batch=3, s_q=1, hq=heads, hkv=1, d=576, page_size=64, lens=[130, 5, 700],
                     dtype=dtype, seed=heads)
    out, lse = _run("mla_decode", case)
    _check("mla_decode", case, out, lse, causal=False)


@pytest.mark.parametrize("s_q", [2, 3, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_mla_multi_query_with_the_causal_rule(s_q, causal):
    case = make_case("mla_decode", batch=4, s_q=s_q, hq=16, hkv=1, d=576, page_size=32, lens=[s_q - 1, 40, 1, 257],
                     seed=s_q)
    out, lse = _poisoned(case, "mla_decode")
    _run("mla_decode", case, causal=causal, out=out, lse=lse)
    _check("mla_decode", case, out, lse, causal=causal)


@pytest.mark.parametrize("heads,s_q", [(1, 2), (8, 2), (3, 4), (4, 4), (2, 8)])
def test_mla_few_heads_multi_query_in_16_row_ctas(heads, s_q):
    """16-bit MLA of 16 query rows or fewer at s_q > 1 (the built-in choice: the sm80 kernel on every arch): CTAs of
    16 rows, not 32 or 64 (the sm80 choice once stopped halving at 16 heads), causal, ragged, NaN-poisoned outputs."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    cfg = select_decode_config("mla_decode", device_arch(0), "bf16", 64, heads=heads, head_dim=576, s_q=s_q)
    assert cfg.backend == "sm80" and cfg.heads_per_cta * cfg.max_s_q == 16
    case = make_case("mla_decode", batch=4, s_q=s_q, hq=heads, hkv=1, d=576, page_size=64,
                     lens=[s_q, 1000, 65, 4 * 64 + 3], seed=heads * 10 + s_q)
    out, lse = _poisoned(case, "mla_decode")
    _run("mla_decode", case, causal=True, out=out, lse=lse)
    _check("mla_decode", case, out, lse, causal=True)


def test_mla_long_single_sequence_takes_the_split_path():
    from kvforge.runtime import decode

    case = make_case("mla_decode", batch=1, s_q=1, hq=128, hkv=1, d=576, page_size=64, lens=[9000], seed=3)
    out, lse = _poisoned(case, "mla_decode")
    _run("mla_decode", case, out=out, lse=lse, scale=0.05)
    _check("mla_decode", case, out, lse, causal=False, scale=0.05)
    assert _splits(2) > 1


@pytest.mark.parametrize("s_q,heads,page_size,lens,chains", [(1, 64, 64, [0, 1, 333, 2000], 1),
                                                             (2, 32, 32, [1, 40, 257, 900], 2),
                                                             (1, 128, 16, [9000], 1), (4, 16, 128, [4, 77, 1500], 1),
                                                             (1, 40, 64, [64, 65, 3000], 2),
                                                             (8, 8, 16, [129, 192, 191], 1)])
def test_mla_sm90_seesaw_schedule(s_q, heads, page_size, lens, chains):
    """The sm90 kernel's seesaw schedule (tiles in pairs, each math warpgroup the whole QK of one,
    softmaxes handed over, P_B in B's rope chunk, two sub-stages per ring stage): even and odd tile
    counts per CTA (every compile-time tail case), partial last tiles A and B, lengths 0/1, splits,
    causal s_q up to 8, heads not a multiple of 64; one and two QK accumulator chains."""
    import kvforge
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    from kvforge.codegen.select import sm90_choice

    cfg = build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", page_size, s_q).model_dump(mode="json"),
                               "schedule": "seesaw", "qk_chains": chains})
    case = make_case("mla_decode", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576, page_size=page_size, lens=lens,
                     seed=s_q + heads + 11)
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", case, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("lazy,scale", [(True, None), (False, None), (True, 1.0), (False, 0.5)])
@pytest.mark.parametrize("s_q,heads,page_size,lens,chains", [(1, 64, 64, [0, 1, 333, 2000], 1),
                                                             (2, 32, 32, [1, 40, 257, 900], 2),
                                                             (1, 128, 16, [9000], 1), (4, 16, 128, [4, 77, 1500], 1),
                                                             (8, 8, 16, [129, 192, 191], 1)])
def test_mla_sm90_seesaw_b_first(s_q, heads, page_size, lens, chains, lazy, scale):
    """seesaw_b_first (FlashMLA's pair order): warpgroup 0 rescales P_A to warpgroup 1's maxima into A's rope
    chunk (a third hand-off), P_B in its own tile, warpgroup 1 multiplies P_B V_B[R] first and P_A V_A[R]
    second; the seesaw's tail cases (the last pair without B keeps the two-hand-off protocol), eager and lazy
    rescales, and softmax scales whose logits move the maxima by more than the lazy slack (so the rescales run)."""
    import kvforge
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    from kvforge.codegen.select import sm90_choice

    cfg = build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", page_size, s_q).model_dump(mode="json"),
                               "schedule": "seesaw", "qk_chains": chains, "seesaw_b_first": True,
                               "lazy_rescale": lazy})
    case = make_case("mla_decode", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576, page_size=page_size, lens=lens,
                     seed=s_q + heads + 17)
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=s_q > 1, softmax_scale=scale, out=out,
                       lse=lse, config=cfg)
    _check("mla_decode", case, out, lse, causal=s_q > 1, scale=scale)


@pytest.mark.parametrize("ahead", [1, 2, 4])
@pytest.mark.parametrize("schedule", ["lockstep", "seesaw"])
@pytest.mark.parametrize("s_q,heads,page_size,lens", [(1, 128, 64, [0, 1, 333, 130, 4100]), (2, 64, 16, [9000]),
                                                      (1, 64, 128, [65, 200, 3000])])
def test_mla_sm90_l2_prefetch(ahead, schedule, s_q, heads, page_size, lens):
    """l2_prefetch_tiles: the TMA producers also prefetch the tile `ahead` into L2, never past the CTA's
    last tile; the outputs are the reference's whatever the chunk's tile count (fewer tiles than `ahead`,
    lengths 0/1, partial last tiles), split or not, causal s_q = 2, pages of 16, 64 and 128 keys."""
    import kvforge
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    cfg = build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", page_size, s_q).model_dump(mode="json"),
                               "schedule": schedule, "l2_prefetch_tiles": ahead})
    case = make_case("mla_decode", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576, page_size=page_size, lens=lens,
                     seed=ahead + s_q + heads)
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", case, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize("schedule", ["lockstep", "seesaw"])
@pytest.mark.parametrize("scale", [None, 0.3, 1.0])
@pytest.mark.parametrize("s_q,heads,lens", [(1, 64, [0, 1, 333, 4100]), (2, 32, [9000])])
def test_mla_sm90_lazy_rescale(lazy, schedule, scale, s_q, heads, lens):
    """lazy_rescale (the sm90 default: a row's running maximum moves only when a tile's exceeds it by
    more than 2^8, and a warp skips its output rescale when none of its rows moved) and the eager
    rescale it replaced, on both sm90 schedules: the default softmax scale and logits of std ~7 and
    ~24 (maxima moving by less and by more than the slack), lengths 0/1, partial tiles, a split
    sequence with causal s_q = 2."""
    import kvforge
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    cfg = build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", 64, s_q).model_dump(mode="json"),
                               "schedule": schedule, "lazy_rescale": lazy})
    case = make_case("mla_decode", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576, page_size=64, lens=lens,
                     seed=s_q + heads + 5)
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=s_q > 1, softmax_scale=scale,
                       out=out, lse=lse, config=cfg)
    _check("mla_decode", case, out, lse, causal=s_q > 1, scale=scale)


@pytest.mark.parametrize("family,heads,d", [("mla_decode", 16, 576), ("gqa_decode", 4, 128)])
@pytest.mark.parametrize("scale", [None, 0.3, 1.0])
def test_sm80_lazy_rescale(family, heads, d, scale):
    """lazy_rescale on the sm80 kernel (the built-in tiling for the shape, pinned): the default
    softmax scale and larger logits, ragged lengths with 0 and 1, a split sequence, s_q = 2 causal."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    base = select_decode_config(family, device_arch(0), "bf16", 64, heads=heads, head_dim=d, s_q=2, backend="sm80")
    cfg = build(DecodeConfig, {**base.model_dump(mode="json"), "lazy_rescale": True})
    hkv = 1 if family == "mla_decode" else 2
    case = make_case(family, batch=4, s_q=2, hq=heads * hkv, hkv=hkv, d=d, page_size=64, lens=[1, 0, 777, 9000],
                     seed=heads + 3)
    out, lse = _poisoned(case, family)
    import kvforge

    if family == "mla_decode":
        kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=True, softmax_scale=scale,
                           out=out, lse=lse, config=cfg)
    else:
        kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=True,
                           softmax_scale=scale, out=out, lse=lse, config=cfg)
    _check(family, case, out, lse, causal=True, scale=scale)


def test_mla_sm90_schedule_follows_the_split_plan():
    """On sm_90 the built-in 16-bit MLA variant runs the seesaw where the grid fills the GPU without
    cutting sequences and the lockstep where the plan splits them: the functions choose per call's
    batch, a plan object loads both at construction and picks per run; every result checked."""
    import kvforge
    from kvforge.runtime.decode import select_config
    from kvforge.runtime.device import device_arch, sm_count
    from kvforge.runtime.select import sm90_sequences_split

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    big = next(b for b in range(1, 512) if not sm90_sequences_split(b, 128, 1, sm_count(0)))
    assert sm90_sequences_split(big - 1, 128, 1, sm_count(0))
    assert select_config("mla_decode", "bf16", 64, 128, 576, 1, 0, None, big).schedule == "seesaw"
    assert select_config("mla_decode", "bf16", 64, 128, 576, 1, 0, None, big - 1).schedule == "lockstep"
    dec = kvforge.MLADecode(128, 64, "bf16", max_batch=big)
    assert {b: dec.plan_for_batch(b).config.schedule for b in (1, big - 1, big)} == {
        1: "lockstep", big - 1: "lockstep", big: "seesaw"}
    for batch in (big, 3):
        lens = [(37 * i) % 700 + (i % 3) for i in range(batch)]  # 0 .. 700 keys, ragged
        case = make_case("mla_decode", batch=batch, s_q=1, hq=128, hkv=1, d=576, page_size=64, lens=lens, seed=batch)
        out, lse = _poisoned(case, "mla_decode")
        _run("mla_decode", case, out=out, lse=lse)
        _check("mla_decode", case, out, lse, causal=False)
        out, lse = _poisoned(case, "mla_decode")
        dec.run(case.q, case.k, case.block_table, case.seqlens, out=out, lse=lse)
        _check("mla_decode", case, out, lse, causal=False)


@pytest.mark.parametrize("s_q,heads,page_size,lens", [(1, 64, 64, [0, 1, 333, 2000]), (2, 32, 32, [1, 40, 257, 900]),
                                                      (1, 128, 16, [9000])])
def test_mla_sm90_with_two_qk_accumulator_chains(s_q, heads, page_size, lens):
    """The sm90 kernel with qk_chains=2 (not the built-in choice; bench/qk_chains_ab.py times it)."""
    import kvforge
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    from kvforge.codegen.select import sm90_choice

    cfg = build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", page_size, s_q).model_dump(mode="json"),
                               "qk_chains": 2})
    case = make_case("mla_decode", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576, page_size=page_size, lens=lens,
                     seed=s_q + heads)
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", case, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
def test_gqa_head_dims_and_groups(d, group):
    hkv = 2
    case = make_case("gqa_decode", batch=5, s_q=1, hq=hkv * group, hkv=hkv, d=d, page_size=16,
                     lens=[0, 1, 31, 300, 77], seed=d + group)
    out, lse = _poisoned(case, "gqa_decode")
    _run("gqa_decode", case, out=out, lse=lse)
    _check("gqa_decode", case, out, lse, causal=False)


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gqa_page_sizes_and_dtypes(page_size, dtype):
    case = make_case("gqa_decode", batch=4, s_q=1, hq=32, hkv=8, d=128, page_size=page_size,
                     lens=[129, 1, 500, 64], dtype=dtype, seed=page_size)
    out, lse = _run("gqa_decode", case)
    _check("gqa_decode", case, out, lse, causal=False)


@pytest.mark.parametrize("kv_load", ["tma", "bulk", "cp_async"])
@pytest.mark.parametrize("d,page_size,s_q", [(128, 16, 1), (256, 128, 1), (128, 32, 3)])
def test_gqa_tma_bulk_copy_and_cp_async_producers(kv_load, d, page_size, s_q):
    """The three ways of filling the ring, pinned, on ragged lengths (partial last tiles whose V rows
    past the end hold NaN in the cache) with NaN-poisoned outputs."""
    import kvforge
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    if kv_load != "cp_async" and device_arch(0) not in ("sm_90", "sm_100a"):
        pytest.skip(f"kv_load={kv_load!r} needs sm_90 or newer; this device is {device_arch(0)}")
    cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", page_size, heads=4, head_dim=d, s_q=s_q,
                               backend="sm80", kv_load=kv_load)
    assert cfg.kv_load == kv_load
    case = make_case("gqa_decode", batch=4, s_q=s_q, hq=8, hkv=2, d=d, page_size=page_size,
                     lens=[s_q, 1000, 77, 3], seed=d + page_size)
    out, lse = _poisoned(case, "gqa_decode")
    kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=s_q > 1, out=out, lse=lse,
                       config=cfg)
    _check("gqa_decode", case, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("page_size,heads,s_q", [(16, 16, 1), (64, 8, 2), (128, 16, 1), (32, 4, 4)])
def test_mla_bulk_copy_producers(page_size, heads, s_q):
    """MLA on the sm80 kernel with kv_load='bulk' (one cp.async.bulk per 1152-byte row) on ragged
    lengths: 0/1, a split long sequence, partial last tiles, NaN-poisoned outputs."""
    import kvforge
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    if device_arch(0) not in ("sm_90", "sm_100a"):
        pytest.skip(f"kv_load='bulk' needs sm_90 or newer; this device is {device_arch(0)}")
    cfg = select_decode_config("mla_decode", device_arch(0), "bf16", page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80", kv_load="bulk")
    assert cfg.kv_load == "bulk" and cfg.backend == "sm80"
    case = make_case("mla_decode", batch=5, s_q=s_q, hq=heads, hkv=1, d=576, page_size=page_size,
                     lens=[0 if s_q == 1 else s_q, 1, 3000, 77 + s_q, 4 * cfg.block_n], seed=page_size + heads)
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=s_q > 1, out=out, lse=lse,
                       config=cfg)
    _check("mla_decode", case, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("block_n,stages,producers,consumers", list(mla16_bulk_tilings()))
def test_mla_16_heads_on_each_bulk_tiling(block_n, stages, producers, consumers):
    """The 16-head bulk-copy MLA kernel (sm80, sm_90) at every tiling bench/mla16_ab.py times:
    ragged lengths with 0 and 1, partial last tiles, one long split sequence, NaN-poisoned outputs."""
    import kvforge
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the 16-head bulk-copy tilings are measured on sm_90; this device is {device_arch(0)}")
    cfg = mla16_bulk_tilings()[(block_n, stages, producers, consumers)]
    assert cfg.kv_load == "bulk" and cfg.backend == "sm80"
    case = make_case("mla_decode", batch=5, s_q=1, hq=16, hkv=1, d=576, page_size=64,
                     lens=[0, 1, 9000, 77, 4 * block_n], seed=block_n + stages + producers + consumers)
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, out=out, lse=lse, config=cfg)
    _check("mla_decode", case, out, lse, causal=False)


@pytest.mark.parametrize("d,page_size,group,s_q,dtype", [
    (64, 16, 1, 1, "bf16"), (64, 64, 8, 2, "fp16"), (128, 64, 16, 1, "bf16"), (128, 128, 1, 4, "fp16"),
    (256, 16, 4, 1, "fp16"), (256, 32, 16, 8, "bf16"), (128, 16, 16, 8, "bf16"), (64, 128, 2, 1, "bf16")])
def test_gqa_tma_tiles(d, page_size, group, s_q, dtype):
    """kv_load='tma' (boxes of page rows x 64 columns into 128-byte-swizzled tiles) across head
    dims, page sizes (boxes of whole pages and of half pages), groups and s_q with the causal rule:
    lengths 0 and 1, a tile-aligned length (no partial tile), a split long sequence and ragged
    ones, NaN in the unused cache rows and in the outputs beforehand."""
    import kvforge
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    if device_arch(0) not in ("sm_90", "sm_100a"):
        pytest.skip(f"TMA needs sm_90 or newer; this device is {device_arch(0)}")
    cfg = select_decode_config("gqa_decode", device_arch(0), dtype, page_size, heads=group, head_dim=d, s_q=s_q,
                               backend="sm80", kv_load="tma")
    hkv = 3
    case = make_case("gqa_decode", batch=6, s_q=s_q, hq=hkv * group, hkv=hkv, d=d, page_size=page_size,
                     lens=[0 if s_q == 1 else s_q, 1, 4 * cfg.block_n, 2500, 77 + s_q, s_q], dtype=dtype, seed=d + group + page_size)
    out, lse = _poisoned(case, "gqa_decode")
    kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=s_q > 1, out=out, lse=lse,
                       config=cfg)
    _check("gqa_decode", case, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("d", [64, 128])
def test_split_partials_of_odd_sizes_stay_aligned_for_the_combine(d):
    """batch x splits x s_q x heads odd (5 sequences x 3 heads, MHA): the partial rows the combine
    reads as float4 still start 16-byte aligned (the workspace holds the partial outputs first;
    it held the lse values first until a test with 3 KV heads hit a misaligned float4 read)."""
    case = make_case("gqa_decode", batch=5, s_q=1, hq=3, hkv=3, d=d, page_size=16, lens=[3000, 1, 777, 64, 2049],
                     seed=d)
    out, lse = _poisoned(case, "gqa_decode")
    _run("gqa_decode", case, out=out, lse=lse)
    _check("gqa_decode", case, out, lse, causal=False)


def test_gqa_accepts_3d_queries():
    import kvforge

    case = make_case("gqa_decode", batch=2, s_q=1, hq=8, hkv=2, d=64, page_size=32, lens=[50, 3], seed=1)
    out, lse = kvforge.gqa_decode(case.q[:, 0].contiguous(), case.k, case.v, case.block_table, case.seqlens)
    assert tuple(out.shape) == (2, 8, 64)
    _check("gqa_decode", case, out[:, None], lse, causal=False)


@pytest.mark.parametrize("s_q,group", [(2, 4), (4, 8), (8, 16)])
def test_gqa_multi_query_causal(s_q, group):
    case = make_case("gqa_decode", batch=3, s_q=s_q, hq=group * 2, hkv=2, d=128, page_size=16,
                     lens=[s_q, 100, 1], seed=s_q)
    out, lse = _poisoned(case, "gqa_decode")
    _run("gqa_decode", case, causal=True, out=out, lse=lse)
    _check("gqa_decode", case, out, lse, causal=True)


def test_gqa_grid_just_past_a_full_wave_is_split_to_even_out_its_waves():
    """A GQA grid just past the GPU's CTA slots (2 sequences more than fill it, 8 KV heads) is split
    (policy.num_splits with wave_splits) so its last wave is not nearly empty; ragged lengths (0 .. 1500
    keys, so the device plan gives short sequences fewer splits) still match the float64 reference."""
    from kvforge.runtime.decode import plan_for, select_config

    cfg = select_config("gqa_decode", "bf16", 16, 4, 128, 1, 0)
    plan = plan_for(cfg, 0)
    batch = plan.num_sms * cfg.ctas_per_sm // 8 + 2
    assert plan.splits(batch, 32, 8) > 1, (batch, cfg.ctas_per_sm, plan.num_sms)
    lens = [(97 * i) % 1500 + (i % 4) for i in range(batch)]
    case = make_case("gqa_decode", batch=batch, s_q=1, hq=32, hkv=8, d=128, page_size=16, lens=lens, seed=68)
    out, lse = _poisoned(case, "gqa_decode")
    _run("gqa_decode", case, out=out, lse=lse)
    _check("gqa_decode", case, out, lse, causal=False)


def test_gqa_long_single_sequence_takes_the_split_path():
    case = make_case("gqa_decode", batch=1, s_q=1, hq=32, hkv=8, d=128, page_size=16, lens=[20000], seed=9)
    out, lse = _poisoned(case, "gqa_decode")
    _run("gqa_decode", case, out=out, lse=lse)
    _check("gqa_decode", case, out, lse, causal=False)


@pytest.mark.parametrize("family", ["mla_decode", "gqa_decode"])
def test_cuda_graph_capture_then_replay_with_new_lengths_and_queries(family):
    import torch

    hq, hkv, d = (64, 1, 576) if family == "mla_decode" else (16, 4, 128)
    case = make_case(family, batch=2, s_q=1, hq=hq, hkv=hkv, d=d, page_size=64, lens=[3000, 700], seed=11)
    out, lse = _poisoned(case, family)
    _run(family, case, out=out, lse=lse)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(family, case, out=out, lse=lse)
    for step, lens in enumerate(([3000, 700], [1, 650], [2999, 0], [64, 1])):  # within each sequence's pages
        new_q = torch.randn(case.q.shape, device="cuda").to(case.q.dtype)
        case.q.copy_(new_q)
        case.seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.host["q"] = new_q.double().cpu().numpy()
        case.host["lens"] = np.array(lens, dtype=np.int32)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        _check(family, case, out, lse, causal=False)


def test_user_stream_is_used():
    import torch

    case = make_case("gqa_decode", batch=2, s_q=1, hq=8, hkv=8, d=128, page_size=16, lens=[100, 900], seed=5)
    out, lse = _poisoned(case, "gqa_decode")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    _run("gqa_decode", case, out=out, lse=lse, stream=s)
    s.synchronize()
    _check("gqa_decode", case, out, lse, causal=False)


def test_cupy_inputs():
    cp = pytest.importorskip("cupy")
    import kvforge

    case = make_case("gqa_decode", batch=2, s_q=1, hq=8, hkv=2, d=64, page_size=16, lens=[40, 300], dtype="fp16",
                     seed=8)
    q, k, v = (cp.asarray(t.cpu().numpy()) for t in (case.q, case.k, case.v))
    bt, sl = cp.asarray(case.host["bt"]), cp.asarray(case.host["lens"])
    out, lse = kvforge.gqa_decode(q, k, v, bt, sl)
    cp.cuda.get_current_stream().synchronize()
    import torch

    _check("gqa_decode", case, torch.from_numpy(cp.asnumpy(out)), torch.from_numpy(cp.asnumpy(lse)), causal=False)


def _merge_config(schedule: str, s_q: int = 1, partials_16bit: bool | None = None):
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice

    data = {**sm90_choice("mla_decode", "bf16", 64, s_q).model_dump(mode="json"), "schedule": schedule,
            "merge_in_kernel": True}
    if partials_16bit is not None:
        data["partials_16bit"] = partials_16bit
    return build(DecodeConfig, data)


# (batch, heads, s_q): on 132 SMs the grid cuts sequences into 2 (b=32 h=128), 3 (b=20 h=128) and 8 chunks
# (b=8 h=128; b=6 h=32 s_q=2): sequences of up to policy.MERGE_MAX_SPLITS chunks (short ones get fewer) are
# merged in the kernel, longer ones by the combine, in one launch
MERGE_SHAPES = [(32, 128, 1), (20, 128, 1), (8, 128, 1), (6, 32, 2)]


@pytest.mark.parametrize("schedule,partials_16bit", [("lockstep", None), ("seesaw", None), ("lockstep", False)],
                         ids=["lockstep", "seesaw", "lockstep-fp32-partials"])
@pytest.mark.parametrize("batch,heads,s_q", MERGE_SHAPES, ids=lambda x: str(x))
def test_mla_sm90_merge_in_kernel(schedule, partials_16bit, batch, heads, s_q):
    """merge_in_kernel: the last CTA of each split (sequence, head block) merges its partials (an atomic
    count in the workspace, zeroed once and left zero by every call). Ragged lengths give sequences
    1 .. 8 chunks (0 and 1 keys, a chunk boundary, partial tiles); three calls on new queries and
    lengths check that the counts are reset, a fourth on another stream that they start at zero there.
    The partials in the default dtype (policy.SM90_PARTIALS_16BIT) and, for the lockstep, in fp32."""
    import torch

    import kvforge
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    cfg = _merge_config(schedule, s_q, partials_16bit)
    splits = _splits(batch * -(-heads // cfg.heads_per_cta))
    assert splits > 1, splits
    rng = np.random.default_rng(batch + heads + s_q)
    base = [0, 1, 256, 257, 2000, 3000, 513, 64 * 31 + 5]
    for step in range(4):
        lens = [base[i % len(base)] if step == 0 else int(x) for i, x in
                enumerate(rng.integers(1, 3100, size=batch))]
        case = make_case("mla_decode", batch=batch, s_q=s_q, hq=heads, hkv=1, d=576, page_size=64, lens=lens,
                         seed=step + 50 * batch)
        out, lse = _poisoned(case, "mla_decode")
        stream = torch.cuda.Stream() if step == 3 else None
        kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=s_q > 1, out=out, lse=lse,
                           config=cfg, stream=stream)
        if stream is not None:
            stream.synchronize()
        _check("mla_decode", case, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("schedule", ["lockstep", "seesaw"])
def test_mla_sm90_merge_in_kernel_with_a_refused_split(schedule):
    """A sequence the device guard refuses (a bad page id in its second chunk only): its CTAs still count,
    its rows come out NaN whichever split finishes last, the others exact; the next call is clean."""
    import torch

    import kvforge
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    cfg = _merge_config(schedule)
    batch, heads = 32, 128
    lens = [2900 if b % 3 else 700 for b in range(batch)]
    case = make_case("mla_decode", batch=batch, s_q=1, hq=heads, hkv=1, d=576, page_size=64, lens=lens, seed=77)
    bad = 4
    kvforge.check_errors()
    good_page = int(case.block_table[bad, 40])
    case.block_table[bad, 40] = case.k.shape[0] + 9  # token 2560..: the second of two chunks
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, out=out, lse=lse, config=cfg)
    torch.cuda.synchronize()
    with pytest.raises(kvforge.DeviceInputError):
        kvforge.check_errors()
    got = out.float().cpu().numpy()
    assert np.isnan(got[bad]).all() and np.isnan(lse[bad].cpu().numpy()).all()
    good = [b for b in range(batch) if b != bad]
    want_o, _ = reference("mla_decode", case.host, causal=False)  # the host copy holds the good page
    assert not np.isnan(got[good]).any() and rel_l2(got[good], want_o[good]) < TOL
    case.block_table[bad, 40] = good_page
    out, lse = _poisoned(case, "mla_decode")
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, out=out, lse=lse, config=cfg)
    _check("mla_decode", case, out, lse, causal=False)
    kvforge.check_errors()


def test_max_seq_len_hint_runs_long_split_chunks_on_the_seesaw():
    """mla_decode(max_seq_len=...) and MLADecode.run(max_seq_len=...): 33 sequences of 128 heads are cut in
    two chunks on 132 SMs; with the longest at 4,200 keys (chunks of 2,112: 33 tiles) the hint picks the
    seesaw (merging the two chunks in the kernel); outputs against the reference either way, and a hint
    shorter than the truth (speed only) still gives the right answer."""
    import kvforge
    from kvforge.runtime import decode
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the hint picks among sm90 schedules")
    lens = [4200] + [100 + 37 * i for i in range(32)]
    case = make_case("mla_decode", batch=33, s_q=1, hq=128, hkv=1, d=576, page_size=64, lens=lens, seed=33)
    assert decode._long_chunks(case.q, 4200) and not decode._long_chunks(case.q, 1000)
    for hint in (4200, 1000, None):
        out, lse = _poisoned(case, "mla_decode")
        kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, out=out, lse=lse, max_seq_len=hint)
        _check("mla_decode", case, out, lse, causal=False)
    hinted = [p for sig, p in decode._MLA._seen.items() if sig and sig[0] == "long-chunks"]
    assert hinted and all(p.plan.config.schedule == "seesaw" for p in hinted)
    dec = kvforge.MLADecode(128, 64, "bf16", max_batch=33)
    out, lse = _poisoned(case, "mla_decode")
    dec.run(case.q, case.k, case.block_table, case.seqlens, out=out, lse=lse, max_seq_len=4200)
    _check("mla_decode", case, out, lse, causal=False)
    assert dec.plan_for_batch(33, long_chunks=True).config.schedule == "seesaw"


def test_a_zeroed_workspace_allocated_inside_a_graph_capture():
    """A split call's first use of a stream's workspace may fall inside a CUDA-graph capture: allocating it
    and zeroing its merge counts (cuMemAlloc and a memset on a private non-blocking stream, in a relaxed
    capture mode) must leave the capture valid, and the counts must read back zero."""
    import torch
    from cuda.bindings import driver

    from kvforge.runtime.memory import DeviceBuffer
    from kvforge.runtime.plan import WORKSPACE_PREFIX_BYTES

    x = torch.zeros(4, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
        buf = DeviceBuffer(0, WORKSPACE_PREFIX_BYTES + (1 << 20), zero_bytes=WORKSPACE_PREFIX_BYTES)
        x.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [2.0] * 4  # both captured adds replayed: the capture stayed valid
    host = np.full(WORKSPACE_PREFIX_BYTES // 4, -1, dtype=np.int32)
    (err,) = driver.cuMemcpyDtoH(host.ctypes.data, buf.ptr, WORKSPACE_PREFIX_BYTES)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    assert (host == 0).all()
    with pytest.raises(ValueError, match="zero_bytes=6: a multiple of 4"):
        DeviceBuffer(0, 64, zero_bytes=6)
