"""The kernels compile to what the design says, read from their SASS (NVRTC's cubin, disassembled
with `cuobjdump -sass`; no GPU needed): for sm90, wgmma (HGMMA), TMA loads (UTMALDG), the warpgroup
register split (USETMAXREG), and no local memory (LDL/STL: spills or stack arrays); for fp8, the
hardware e4m3 conversion, and on the register path no ldmatrix (no 16-bit tile) but byte permutes;
bulk-copy producers (UBLKCP).

cuobjdump and the nvdisasm it runs come from the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
wheels (the `dev` extra); the test skips, saying so, where they are missing. One sm90 variant of
the default matrix per distinct kernel shape (a tile of one or several pages' TMA boxes, one or
several queries per head) keeps it to three compiles.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvforge.codegen.matrix import load_matrix
from kvforge.runtime.resources import kernel_resources
from toolchains import needs_nvrtc



def _cuobjdump() -> Path | None:
    """cuobjdump from the nvidia wheels (nvidia/cu13/bin, next to nvdisasm), else from PATH."""
    try:
        import nvidia
    except ImportError:
        roots = []
    else:
        roots = [Path(p) for p in nvidia.__path__]
    for root in roots:
        for found in sorted(root.glob("*/bin/cuobjdump")):
            if (found.parent / "nvdisasm").exists():
                return found
    on_path = shutil.which("cuobjdump")
    return Path(on_path) if on_path and shutil.which("nvdisasm") else None


CUOBJDUMP = _cuobjdump()
needs_cuobjdump = pytest.mark.skipif(
    CUOBJDUMP is None, reason="cuobjdump and nvdisasm are not installed: pip install nvidia-cuda-cuobjdump "
                              "nvidia-cuda-nvdisasm (the 'dev' extra: pip install -e '.[cuda,dev]')")


def _sm90_representatives():
    """The first sm90 MLA variant (by name) of each kernel shape: (several TMA boxes per tile, s_q > 1,
    QK accumulator chains)."""
    picked = {}
    for v in sorted(load_matrix(), key=lambda v: v.name):
        if v.family == "mla_decode" and v.backend == "sm90" and v.config.schedule != "keys_m":
            picked.setdefault((v.config.boxes_per_tile > 1, v.config.max_s_q > 1, v.config.qk_chains), v)
    return list(picked.values())


SM90 = _sm90_representatives()
# the sm90 kernels with 16-bit wgmma operands (schedule 'keys_m', fp8 operands, has its own test below)
ALL_SM90 = [v for v in sorted(load_matrix(), key=lambda v: v.name)
            if v.family == "mla_decode" and v.backend == "sm90" and v.config.schedule != "keys_m"]
KEYS_M = [v for v in sorted(load_matrix(), key=lambda v: v.name) if v.backend == "sm90" and getattr(v.config, "schedule", "") == "keys_m"]
# every sm90 main kernel: MLA's and GQA's wgmma kernels
SM90_MAIN = [v for v in sorted(load_matrix(), key=lambda v: v.name)
             if v.family in ("mla_decode", "gqa_decode") and v.backend == "sm90" and getattr(v.config, "schedule", "") != "keys_m"]


def sass_functions(cubin: bytes, tmp_path: Path) -> dict[str, str]:
    """Kernel name -> its SASS text."""
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    env = dict(os.environ, PATH=f"{CUOBJDUMP.parent}{os.pathsep}{os.environ.get('PATH', '')}")  # nvdisasm
    r = subprocess.run([str(CUOBJDUMP), "-sass", str(path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, f"cuobjdump -sass failed:\n{r.stdout}{r.stderr}"
    parts = re.split(r"^\s*Function : (\S+)\s*$", r.stdout, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_ptxas_spills_are_read_for_the_named_kernel_only():
    from kvforge.runtime.resources import ptxas_spills

    log = "".join(f"ptxas info    : Function properties for {name}\nptxas         .     {stack} bytes stack frame, "
                  f"{st} bytes spill stores, {ld} bytes spill loads\nptxas info    : Used 40 registers\n"
                  for name, stack, st, ld in (("k_combine", 0, 0, 0), ("k", 16, 128, 96)))
    assert ptxas_spills(log, "k") == (16, 128, 96) and ptxas_spills(log, "k_combine") == (0, 0, 0)
    assert ptxas_spills(log, "other") == (0, 0, 0)


def test_the_representatives_cover_the_sm90_kernel_shapes():
    assert 3 <= len(SM90) <= 4, [v.name for v in SM90]
    assert {v.config.boxes_per_tile > 1 for v in SM90} == {True, False}


def test_the_default_matrix_has_sm90_gqa_kernels():
    assert {v.config.math_threads // 128 for v in SM90_MAIN if v.family == "gqa_decode"} == {1, 2}


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("variant", SM90_MAIN, ids=lambda v: v.name)
def test_sm90_main_kernel_uses_wgmma_tma_and_setmaxnreg_without_local_memory(variant, tmp_path):
    """wgmma, TMA tile loads (fp8: cp.async.bulk of the fp8 ring's tiles, or the producers' global loads),
    setmaxnreg, no local memory."""
    from kvforge.runtime import compile

    k = compile(variant)
    res = k.resources
    report = (f"{variant.name}: {res.registers} registers per thread at launch (setmaxnreg then moves them "
              f"between warpgroups), spill stores/loads {res.spill_store_bytes}/{res.spill_load_bytes} B, "
              f"stack {res.stack_frame_bytes} B")
    print(report)
    sass = sass_functions(k.cubin, tmp_path)
    assert variant.name in sass, f"{variant.name} is not in the cubin: {sorted(sass)}"
    main = sass[variant.name]
    loads = ("UTMALDG", "TMA tile loads")
    if variant.config.is_fp8:
        loads = (("UBLKCP", "fp8 tiles by bulk copy") if variant.config.converts_in_math
                 else ("UTMALDG", "fp8 boxes by TMA into their 16-bit slot") if variant.config.converts_in_slot
                 else ("LDG", "fp8 tiles loaded into the producers' registers"))
    for op, what in (("HGMMA", "wgmma"), loads, ("USETMAXREG", "setmaxnreg")):
        assert re.search(rf"\b{op}\b", main), f"no {op} ({what}) in the main kernel; {report}"
    # the combine (launched by PDL on sm_90) starts as these CTAs exit: an explicit trigger after the main loop
    # (griddepcontrol.launch_dependents, SASS PREEXIT) made split calls 3-5% slower (bench/pdl_ab.py)
    assert not re.search(r"\bPREEXIT\b", main), f"an explicit PDL trigger in the sm90 main kernel; {report}"
    local = sorted(set(re.findall(r"\b(?:LDL|STL)\b[.\w]*", main)))
    if variant.config.is_fp8:
        # ptxas keeps a few words on the stack in the fp8 kernels (the slot staging's producers at 72 registers,
        # values live across the math loop: 8-36 B, loaded in the prologue, the producers' loop, the epilogue;
        # bench/RESULTS.md); never among the wgmmas
        lines = main.splitlines()
        gmma = [i for i, line in enumerate(lines) if "HGMMA" in line]
        inside = [line.strip() for line in lines[gmma[0]:gmma[-1]] if re.search(r"\b(?:LDL|STL)\b", line)]
        assert not inside, f"local memory among the wgmmas: {inside[:4]}; {report}"
        assert res.spill_store_bytes <= 48 and res.spill_load_bytes <= 48, report
    else:
        assert not local, f"local memory in the main kernel ({', '.join(local)}); {report}"
        assert res.spill_store_bytes == res.spill_load_bytes == 0, report
    # setmaxnreg only moves registers within the launch's allocation: asking for more hangs the kernel
    cfg = variant.config
    math_wgs = cfg.math_threads // 128
    assert cfg.producer_regs + math_wgs * cfg.math_regs <= (1 + math_wgs) * res.registers, (
        f"setmaxnreg {cfg.producer_regs} + {math_wgs} x {cfg.math_regs} exceeds {1 + math_wgs} x {res.registers}; "
        f"{report}")


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("variant", KEYS_M, ids=lambda v: v.name)
def test_keys_m_kernel_multiplies_fp8_by_wgmma_without_converting_the_cache(variant, tmp_path):
    """Schedule 'keys_m': fp8 wgmma (QGMMA: 18 QK k32 steps, 16 on the packed token, and 8 dim blocks x 2 key steps
    x hi/lo PV products per tile), 16-bit wgmma only for the packed token's bf16 rope (4 k16 steps; the cache never
    becomes a 16-bit tile), V^T by ldmatrix (LDSM), tiles by TMA (UTMALDG; the packed token's scales by cp.async,
    LDGSTS; block scales by bulk copies, UBLKCP), at most a few words of local memory, no serialised wgmma, no explicit PDL trigger, and the wgmma
    descriptors in uniform registers (few R2UR: the warpgroup index is warp-uniform to ptxas), P^T stored as words
    (no byte stores) after its hi/lo split in fp16."""
    from kvforge.runtime import compile

    k = compile(variant)
    main = sass_functions(k.cubin, tmp_path)[variant.name]
    ops = [m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", main, re.M)]
    tiling = variant.config.keys_m_tiling
    assert ops.count("QGMMA") == tiling.qk_steps + 32, ops.count("QGMMA")
    assert ops.count("HGMMA") == tiling.rope_steps and "PREEXIT" not in ops
    for op in ("LDSM", "UTMALDG") + (("LDGSTS",) if tiling.packed else ()) + (("UBLKCP",) if tiling.scale_block else ()):
        assert op in ops, f"no {op}"
    # P^T goes to shared memory as 32-bit words (a lane pair's four keys per word), its hi/lo split in fp16
    assert not re.search(r"\bSTS\.U8\b", main), "P^T stored byte by byte"
    assert re.search(r"\bF2FP\.SATFINITE\.E4M3\.F16\b", main), "no fp16 -> e4m3 conversion (P's split)"
    # 9-14 in the whole kernel (prologue, producer, epilogue); a descriptor per wgmma in ordinary registers made 109
    assert ops.count("R2UR") <= 24, f"{ops.count('R2UR')} R2UR: descriptors built in ordinary registers"
    # scaled layouts: the producer warpgroup hands its registers to the math warpgroups (setmaxnreg: 232 each); a lone
    # producer warp (288 threads) capped every thread at 168 and left them 12-24 B of stack. Per-tensor fits 168.
    assert ("USETMAXREG" in ops) == tiling.producer_warpgroup, "setmaxnreg where the producer is a warpgroup"
    assert k.resources.spill_store_bytes == 0 and k.resources.spill_load_bytes == 0, k.resources
    assert "LDL" not in ops and "STL" not in ops, "local memory"
    assert "C7515" not in k.log, "ptxas serialised the wgmma pipeline"
    assert KEYS_M, "the default matrix has schedule 'keys_m' variants"


def _combine_representatives():
    """One CUDA variant per combine shape: MLA (512 output columns) and GQA at each head_dim."""
    picked = {}
    for v in sorted(load_matrix(), key=lambda v: v.name):
        if v.family in ("mla_decode", "gqa_decode") and v.backend in ("sm80", "sm90") and v.config.arch in ("sm_90", "sm_90a"):
            picked.setdefault(v.config.head_dim_v, v)
    return list(picked.values())


@needs_nvrtc
@pytest.mark.parametrize("variant", _combine_representatives(), ids=lambda v: v.name)
def test_the_combine_kernel_fits_four_ctas_per_sm_without_local_memory(variant):
    """The combine's registers are capped for four CTAs of 256 threads per SM (64 each), and its
    batch of 16-byte loads fits in them: no spills, no stack."""
    from kvforge.runtime import compile

    k = compile(variant)
    name = f"{variant.name}_combine"
    res = kernel_resources(k.cubin, name, k.log)
    assert 0 < res.registers <= 64, f"{name}: {res.registers} registers per thread"
    assert (res.stack_frame_bytes, res.spill_store_bytes, res.spill_load_bytes) == (0, 0, 0), res


@needs_nvrtc
@pytest.mark.parametrize("variant", SM90_MAIN, ids=lambda v: v.name)
def test_ptxas_does_not_serialise_the_sm90_wgmma_pipeline(variant):
    """ptxas serialises every wgmma of a kernel (info C7514/C7515/C7518: 'wgmma.mma_async instructions
    are serialized ...') when code touches an accumulator inside an open wgmma stage or the
    warpgroups diverge around their wgmmas; the kernel still runs, several times slower
    (bench/RESULTS.md, sm90 notes 2-4). No sm90 variant's compile log may say so."""
    from kvforge.runtime import compile

    log = compile(variant).log
    assert "ptxas" in log, "the compile log was not kept"
    serialised = [line.strip() for line in log.splitlines() if "serialized" in line or "C7517" in line]
    assert not serialised, "\n".join(serialised)


def _lazy_rescale_representatives():
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant

    picks = {}
    for v in sorted(ALL_SM90, key=lambda v: v.name):
        key = (v.config.schedule, v.config.is_fp8)
        if key not in picks:
            picks[key] = Variant(build(DecodeConfig, {**v.config.model_dump(mode="json"), "lazy_rescale": True}))
    return list(picks.values())


@needs_nvrtc
@pytest.mark.parametrize("variant", _lazy_rescale_representatives(), ids=lambda v: v.name)
def test_lazy_rescale_keeps_the_wgmma_pipeline(variant, tmp_path):
    """lazy_rescale puts each warp's output rescale under a warp vote: the same wgmmas and waits as
    without it, no serialisation, no new local memory, and the vote in the SASS."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    eager = Variant(build(DecodeConfig, {**variant.config.model_dump(mode="json"), "lazy_rescale": False}))
    assert "_lz_" in variant.name and "_lz_" not in eager.name
    lazy_k, eager_k = compile(variant), compile(eager)
    assert not [ln for ln in lazy_k.log.splitlines() if "serialized" in ln or "C7517" in ln]
    lazy_s = sass_functions(lazy_k.cubin, tmp_path)[variant.name]
    eager_s = sass_functions(eager_k.cubin, tmp_path)[eager.name]
    for op in (r"\bHGMMA\b", r"WARPGROUP\.DEPBAR"):
        assert len(re.findall(op, lazy_s)) == len(re.findall(op, eager_s)), op
    assert re.search(r"\bVOTE\.ANY\b", lazy_s), "no warp vote around the rescale"
    # no local memory the eager build does not have (the fp8 slot kernel's eager build spills more than its lazy
    # one since the warpgroup index became warp-uniform to ptxas: 56/160 B against 28/32)
    assert lazy_k.resources.spill_store_bytes <= eager_k.resources.spill_store_bytes
    assert lazy_k.resources.spill_load_bytes <= eager_k.resources.spill_load_bytes


@needs_nvrtc
@needs_cuobjdump
def test_seesaw_b_first_keeps_the_wgmma_pipeline_without_local_memory(tmp_path):
    """seesaw_b_first (FlashMLA's pair order, its third hand-off and P_B's own tile): as many HGMMA and
    WARPGROUP.DEPBAR as the built-in seesaw (no wgmma serialised by a wait under a run-time branch), no local
    memory, and P_B's tile fits the shared memory the sm90 CTA may hold."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    base = next(v for v in ALL_SM90 if v.config.seesaw and not v.config.is_fp8 and v.config.max_s_q == 1)
    bf = Variant(build(DecodeConfig, {**base.config.model_dump(mode="json"), "seesaw_b_first": True}))
    assert "_bf_" in bf.name and bf.config.handoffs == 3 and bf.config.layout["p_b"].offset % 1024 == 0
    base_k, bf_k = compile(base), compile(bf)
    assert not [ln for ln in bf_k.log.splitlines() if "serialized" in ln or "C7517" in ln or "C7518" in ln]
    base_s = sass_functions(base_k.cubin, tmp_path)[base.name]
    bf_s = sass_functions(bf_k.cubin, tmp_path)[bf.name]
    for op in (r"\bHGMMA\b", r"WARPGROUP\.DEPBAR"):
        assert len(re.findall(op, bf_s)) == len(re.findall(op, base_s)), op
    assert not re.search(r"\b(?:LDL|STL)\b", bf_s), "local memory in the seesaw_b_first kernel"
    assert bf_k.resources.spill_store_bytes == bf_k.resources.spill_load_bytes == 0


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("variant", [v for v in ALL_SM90 if v.config.converts_in_slot], ids=lambda v: v.name)
def test_fp8_slot_loads_ahead_keeps_the_math_and_issues_from_a_second_site(variant, tmp_path):
    """fp8_slot_loads_ahead (opt-in): the producers' poll adds a second site issuing a tile's TMA boxes (tile t + 1's,
    while tile t lands) beside the blocking one, and nothing else changes: the math's wgmmas and waits, no local
    memory among the wgmmas, the spill bound of the fp8 kernels (the producers' few words either way)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    ahead = Variant(build(DecodeConfig, {**variant.config.model_dump(mode="json"), "fp8_slot_loads_ahead": True}))
    assert "_f8slot_la_" in ahead.name and "_la_" not in variant.name
    on_k, off_k = compile(ahead), compile(variant)
    assert not [ln for ln in on_k.log.splitlines() if "serialized" in ln or "C7517" in ln or "C7518" in ln]
    on_s, off_s = sass_functions(on_k.cubin, tmp_path)[ahead.name], sass_functions(off_k.cubin, tmp_path)[variant.name]
    for op in (r"\bHGMMA\b", r"WARPGROUP\.DEPBAR"):
        assert len(re.findall(op, on_s)) == len(re.findall(op, off_s)), op
    assert len(re.findall(r"\bUTMALDG\b", on_s)) == 2 * len(re.findall(r"\bUTMALDG\b", off_s))
    lines = on_s.splitlines()
    gmma = [i for i, line in enumerate(lines) if "HGMMA" in line]
    assert not [ln for ln in lines[gmma[0]:gmma[-1]] if re.search(r"\b(?:LDL|STL)\b", ln)], "local memory among the wgmmas"
    res = on_k.resources
    assert res.spill_store_bytes <= 48 and res.spill_load_bytes <= 48, res


@needs_nvrtc
@needs_cuobjdump
def test_sm80_kernels_trigger_the_combine_after_their_loop_and_sm90_kernels_by_exiting(tmp_path):
    """PDL triggers as measured (bench/pdl_ab.py): the sm80 backend's main kernels trigger their combine once
    every tile is consumed (PREEXIT in SASS), the sm90 kernels carry no trigger (so the per-variant test's
    'no PREEXIT' can fail: the same opcode is found where it is emitted)."""
    from kvforge.runtime import compile

    sm80 = next(v for v in _sm80_lazy_representatives() if v.config.family == "gqa_decode")
    sm90 = ALL_SM90[0]
    counts = {}
    for v in (sm80, sm90):
        counts[v.backend] = len(re.findall(r"\bPREEXIT\b", sass_functions(compile(v).cubin, tmp_path)[v.name]))
    assert counts["sm80"] >= 1 and counts["sm90"] == 0, counts


def _sm80_lazy_representatives():
    picks = {}
    for v in sorted(load_matrix(), key=lambda v: v.name):
        c = v.config
        if v.backend == "sm80" and v.arch == "sm_90" and v.language == "cuda" and getattr(c, "family", None) in ("mla_decode", "gqa_decode"):
            key = (c.family, c.is_fp8 and c.fp8_registers)
            picks.setdefault(key, v)
    return list(picks.values())


@needs_nvrtc
@pytest.mark.parametrize("variant", _sm80_lazy_representatives(), ids=lambda v: v.name)
def test_sm80_lazy_rescale_votes_without_local_memory(variant, tmp_path):
    """lazy_rescale on the sm80 kernel: the output rescale under a warp vote, the same mma count,
    no local memory."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    lazy = Variant(build(DecodeConfig, {**variant.config.model_dump(mode="json"), "lazy_rescale": True}))
    lazy_k, eager_k = compile(lazy), compile(variant)
    lazy_s = sass_functions(lazy_k.cubin, tmp_path)[lazy.name]
    eager_s = sass_functions(eager_k.cubin, tmp_path)[variant.name]
    assert len(re.findall(r"\bHMMA\b", lazy_s)) == len(re.findall(r"\bHMMA\b", eager_s))
    assert re.search(r"\bVOTE\.ANY\b", lazy_s), "no warp vote around the rescale"
    assert not re.findall(r"\b(?:LDL|STL)\b", lazy_s), "local memory"
    assert lazy_k.resources.spill_store_bytes == lazy_k.resources.spill_load_bytes == 0


ALL_FP8 = [v for v in sorted(load_matrix(), key=lambda v: v.name)
           if getattr(v.config, "is_fp8", False) and v.language == "cuda"]


def test_the_default_matrix_has_fp8_variants_of_every_layout():
    layouts = {(v.family, v.config.scale_mode) for v in ALL_FP8}
    assert layouts >= {("mla_decode", "per_tensor"), ("mla_decode", "block"), ("mla_decode", "fp8_ds_mla"),
                       ("gqa_decode", "per_tensor"), ("gqa_decode", "block")}, layouts


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("variant", ALL_FP8, ids=lambda v: v.name)
def test_fp8_conversion_uses_the_hardware_e4m3_instructions(variant, tmp_path):
    """The convert warps dequantize with the sm_89+ e4m3 -> f16x2 instruction (F2FP.F16.E4M3),
    never an integer emulation, and the fp8 kernels keep to registers (no LDL/STL) at one CTA
    per SM (MLA 64 heads: the 16-bit kernel's own 32-byte spill class, 40 bytes, tolerated)."""
    from kvforge.runtime import compile

    k = compile(variant)
    res = k.resources
    main = sass_functions(k.cubin, tmp_path)[variant.name]
    assert re.search(r"\bF2FP\.F16\.E4M3\b", main), "no F2FP.F16.E4M3 (hardware e4m3 conversion) in the kernel"
    keys_m = getattr(variant.config, "schedule", "") == "keys_m"  # 24 B: its own SASS test says why
    spill_ok = 64 if variant.config.heads_per_cta * variant.config.max_s_q >= 64 else 32 if keys_m else 0
    assert res.spill_store_bytes <= spill_ok, (
        f"{variant.name}: {res.spill_store_bytes} B of spill stores at {res.registers} registers")


ALL_BULK = [v for v in sorted(load_matrix(), key=lambda v: v.name) if getattr(v.config, "kv_load", "") == "bulk"]


def test_the_default_matrix_has_bulk_copy_variants():
    assert {v.config.head_dim_qk for v in ALL_BULK} >= {128, 256}, [v.name for v in ALL_BULK]


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("variant", ALL_BULK, ids=lambda v: v.name)
def test_bulk_copy_producers_issue_ublkcp_without_local_memory(variant, tmp_path):
    """kv_load='bulk': the ring is filled by cp.async.bulk (UBLKCP, one per K/V row), and the
    kernel keeps to registers (no LDL/STL)."""
    from kvforge.runtime import compile

    k = compile(variant)
    main = sass_functions(k.cubin, tmp_path)[variant.name]
    assert re.search(r"\bUBLKCP\b", main), "no UBLKCP (cp.async.bulk) in the kernel"
    assert not re.search(r"\b(LDL|STL)\b", main), "local memory traffic (LDL/STL) in the kernel"
    assert k.resources.spill_store_bytes == 0


ALL_TMA = [v for v in sorted(load_matrix(), key=lambda v: v.name) if getattr(v.config, "kv_load", "") == "tma"]


def test_the_default_matrix_has_gqa_tma_variants():
    assert {(v.family, v.config.head_dim_qk) for v in ALL_TMA} >= {("gqa_decode", 64)}, [v.name for v in ALL_TMA]


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("variant", ALL_TMA, ids=lambda v: v.name)
def test_tma_producers_issue_utmaldg_and_consumers_read_swizzled_tiles_without_local_memory(variant, tmp_path):
    """kv_load='tma': whole tiles arrive by TMA boxes (UTMALDG), partial last tiles by cp.async
    (LDGSTS) into the same swizzled places; ldmatrix reads them; no local memory, no spills."""
    from kvforge.runtime import compile

    k = compile(variant)
    main = sass_functions(k.cubin, tmp_path)[variant.name]
    assert re.search(r"\bUTMALDG\b", main), "no UTMALDG (TMA box load) in the kernel"
    assert re.search(r"\bLDGSTS\b", main), "no LDGSTS (cp.async of the partial tile) in the kernel"
    assert re.search(r"\bLDSM\b", main), "no LDSM (ldmatrix) in the kernel"
    assert not re.search(r"\b(LDL|STL)\b", main), "local memory traffic (LDL/STL) in the kernel"
    assert k.resources.spill_store_bytes == 0


ALL_FP8_REGISTERS = [v for v in ALL_FP8 if getattr(v.config, "fp8_registers", False)]


def test_the_default_matrix_has_register_path_variants_of_both_families_and_both_v_conversions():
    kinds = {(v.family, v.config.scale_mode, v.config.raw_bf16_v) for v in ALL_FP8_REGISTERS}
    assert kinds >= {("gqa_decode", "per_tensor", False), ("gqa_decode", "block", False), ("gqa_decode", "block", True),
                     ("mla_decode", "per_tensor", False)}, kinds


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("variant", ALL_FP8_REGISTERS, ids=lambda v: v.name)
def test_register_path_reads_fp8_fragments_without_a_16_bit_tile(variant, tmp_path):
    """fp8_convert='registers': no ldmatrix in the main kernel (Q and P are read k-permuted by plain
    loads, K and V as fp8 words; on TMA-filled tiles P, whose V keys keep the PTX order, is read by
    ldmatrix and the tiles arrive by UTMALDG), byte permutes for V's fragments, the hardware e4m3
    conversion for K (and V unless it is moved bit-wise into bf16), and no local memory."""
    from kvforge.runtime import compile

    k = compile(variant)
    main = sass_functions(k.cubin, tmp_path)[variant.name]
    if variant.config.kv_load == "tma":
        assert re.search(r"\bUTMALDG\b", main), "no UTMALDG (TMA box load) in a kv_load='tma' kernel"
        assert re.search(r"\bLDSM\b", main), "P is read by ldmatrix on TMA-filled tiles: no LDSM"
    else:
        assert not re.search(r"\bLDSM\b", main), "ldmatrix (LDSM) in a register-path kernel: a 16-bit tile is read"
    assert re.search(r"\bPRMT\b", main), "no byte permutes (PRMT): V's fragments are not built from fp8 words"
    cvts = len(re.findall(r"\bF2FP\.F16\.E4M3\b", main))
    assert cvts > 0, "no F2FP.F16.E4M3 (hardware e4m3 conversion)"
    assert not re.search(r"\b(LDL|STL)\b", main), "local memory traffic (LDL/STL) in the kernel"
    assert k.resources.spill_store_bytes == 0


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("family,d,block,v_convert", [("gqa_decode", 128, 64, "cvt"), ("gqa_decode", 128, 128, "cvt"),
                                                      ("gqa_decode", 256, 32, "cvt"), ("gqa_decode", 128, 64, "bits"),
                                                      ("mla_decode", 576, 64, "cvt")])
def test_prescaled_p_keeps_the_running_v_maxima_in_registers(family, d, block, v_convert, tmp_path):
    """fp8_block_p='scaled' (block scales): the per-block running V maxima C live in registers. Picking the
    C of a warp's own block by a select on its column group became an indexed load of the consumer state
    (local memory: STL of the whole state, LDL per block) until written as a masked sum."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import select_decode_config
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    mla = family == "mla_decode"
    cfg = select_decode_config(family, "sm_90", "bf16", 64 if mla else 16, heads=16 if mla else 4, head_dim=d, s_q=1,
                               backend="sm80", scale_mode="block", scale_block_size=block, fp8_convert="registers")
    cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "fp8_block_p": "scaled", "fp8_v_convert": v_convert})
    variant = Variant(cfg)
    k = compile(variant)
    main = sass_functions(k.cubin, tmp_path)[variant.name]
    assert not re.search(r"\b(LDL|STL)\b", main), "local memory traffic (LDL/STL) in the kernel"
    assert k.resources.spill_store_bytes == 0 and k.resources.stack_frame_bytes == 0
    assert not re.search(r"\bLDSM\b", main), "ldmatrix in a register-path kernel"


@needs_nvrtc
@needs_cuobjdump
def test_ring_path_kernels_still_read_16_bit_tiles_with_ldmatrix(tmp_path):
    """The contrast that makes the LDSM check above meaningful: a convert-warp kernel's consumers
    read their 16-bit tiles with ldmatrix."""
    from kvforge.runtime import compile

    ring = next(v for v in ALL_FP8 if getattr(v.config, "convert", None) is not None)
    main = sass_functions(compile(ring).cubin, tmp_path)[ring.name]
    assert re.search(r"\bLDSM\b", main)


def _merge_representatives():
    """One sm90 variant of each (schedule, fp8 staging) with merge_in_kernel flipped (on where the
    default matrix has it off, and the reverse), as (merging, plain) variant pairs."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant

    picks = {}
    for v in ALL_SM90:
        key = (v.config.schedule, v.config.fp8_staging if v.config.is_fp8 else None)
        if key not in picks:
            flip = Variant(build(DecodeConfig, {**v.config.model_dump(mode="json"),
                                                "merge_in_kernel": not v.config.merge_in_kernel}))
            picks[key] = (flip, v) if flip.config.merge_in_kernel else (v, flip)
    return list(picks.values())


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("pair", _merge_representatives(), ids=lambda p: p[0].name)
def test_merge_in_kernel_adds_the_count_and_keeps_the_wgmma_pipeline(pair, tmp_path):
    """merge_in_kernel: the merging CTA's count (a global atomic and device-wide fences) and its merge
    come after the math: the same wgmmas and waits as without it, no serialisation, no new local memory."""
    from kvforge.runtime import compile

    merging, plain = pair
    assert "_mk_" in merging.name and "_mk_" not in plain.name
    mk, pk = compile(merging), compile(plain)
    assert not [ln for ln in mk.log.splitlines() if "serialized" in ln or "C7517" in ln]
    ms, ps = sass_functions(mk.cubin, tmp_path)[merging.name], sass_functions(pk.cubin, tmp_path)[plain.name]
    for op in (r"\bHGMMA\b", r"WARPGROUP\.DEPBAR"):
        assert len(re.findall(op, ms)) == len(re.findall(op, ps)), op
    adds = [len(re.findall(r"\bATOMG\.E\.(?:ADD|EXCH)\b", s)) for s in (ms, ps)]
    assert adds[0] > adds[1], f"no counting atomic (ATOMG.E.ADD/EXCH: {adds[0]} merging, {adds[1]} plain)"
    assert re.search(r"\bMEMBAR\.(?:SC\.)?GPU\b|\bMEMBAR\.ALL\.GPU\b", ms), "no device-wide fence"
    assert (mk.resources.spill_store_bytes, mk.resources.spill_load_bytes) <= (
        pk.resources.spill_store_bytes, pk.resources.spill_load_bytes), (mk.resources, pk.resources)


@needs_nvrtc
@needs_cuobjdump
def test_16bit_partials_are_stored_and_combined_in_16_byte_and_8_byte_units(tmp_path):
    """partials_16bit: the split epilogue still stores 16-byte units (STG.E.128) and keeps its local-memory
    class; the combine loads 8 bytes per four columns (LDG.E.64) where the fp32 partials take 16 (LDG.E.128),
    and keeps them packed until it adds them: no local memory at its 64 registers (unpacked at load, a batch of 12
    spilled)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    base = next(v for v in ALL_SM90 if not v.config.is_fp8 and v.config.schedule == "lockstep")
    on, off = (Variant(build(DecodeConfig, {**base.config.model_dump(mode="json"), "partials_16bit": p}))
               for p in (True, False))
    ck_on, ck_off = compile(on), compile(off)
    f_on, f_off = sass_functions(ck_on.cubin, tmp_path), sass_functions(ck_off.cubin, tmp_path)
    comb_on = next(t for n, t in f_on.items() if n.endswith("_combine"))
    comb_off = next(t for n, t in f_off.items() if n.endswith("_combine"))
    assert re.search(r"\bLDG\.E\.64\b", comb_on) and not re.search(r"\bLDG\.E\.128\b", comb_on)
    assert re.search(r"\bLDG\.E\.128\b", comb_off)
    assert not re.search(r"\b(?:LDL|STL)\b", comb_on) and not re.search(r"\b(?:LDL|STL)\b", comb_off)
    assert re.search(r"\bSTG\.E\.128\b", f_on[on.name])
    assert not re.search(r"\b(?:LDL|STL)\b", f_on[on.name]) and ck_on.resources.spill_store_bytes == 0


@needs_nvrtc
@needs_cuobjdump
def test_l2_evict_first_puts_a_cache_policy_on_every_kv_tile_load(tmp_path):
    """l2_evict_first: every TMA tile load (UTMALDG) of the 16-bit lockstep kernel carries the cache policy as a
    memory descriptor operand (`desc[URn]`; ptxas folds the constant createpolicy into a uniform register); without
    it no load does; the HGMMA count and the local-memory class are unchanged."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    base = next(v for v in ALL_SM90 if not v.config.is_fp8 and v.config.schedule == "lockstep")
    on, off = (Variant(build(DecodeConfig, {**base.config.model_dump(mode="json"), "l2_evict_first": p}))
               for p in (True, False))
    ck_on, ck_off = compile(on), compile(off)
    s_on, s_off = sass_functions(ck_on.cubin, tmp_path)[on.name], sass_functions(ck_off.cubin, tmp_path)[off.name]
    loads_on = re.findall(r"UTMALDG[^;]*;", s_on)
    loads_off = re.findall(r"UTMALDG[^;]*;", s_off)
    assert loads_on and len(loads_on) == len(loads_off), (len(loads_on), len(loads_off))
    assert all(re.search(r"desc\[UR\d+\]", ld) for ld in loads_on), loads_on[:2]
    assert not any("desc[" in ld for ld in loads_off), loads_off[:2]
    assert len(re.findall(r"\bHGMMA\b", s_on)) == len(re.findall(r"\bHGMMA\b", s_off))
    assert not re.search(r"\b(?:LDL|STL)\b", s_on) and ck_on.resources.spill_store_bytes == 0


def _prefetch_representatives():
    """One sm90 TMA-producer variant of each (schedule, fp8 staging) of the default matrix, as (prefetching 2
    tiles ahead, not prefetching) pairs."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.variant import Variant

    picks = {}
    for v in ALL_SM90:
        if v.config.is_fp8 and not v.config.converts_in_slot:
            continue  # bulk-copy producers: no tensor map to prefetch through (config validation says so)
        key = (v.config.schedule, v.config.fp8_staging if v.config.is_fp8 else None)
        if key not in picks:
            picks[key] = tuple(Variant(build(DecodeConfig, {**v.config.model_dump(mode="json"), "l2_prefetch_tiles": n}))
                               for n in (2, 0))
    return list(picks.values())


def test_the_prefetch_representatives_cover_every_tma_producer():
    assert {(p.config.schedule, p.config.converts_in_slot) for p, _ in _prefetch_representatives()} == {
        ("lockstep", False), ("seesaw", False), ("seesaw", True)}


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("pair", _prefetch_representatives(), ids=lambda p: p[0].name)
def test_l2_prefetch_issues_tma_prefetches_from_the_producers_only(pair, tmp_path):
    """l2_prefetch_tiles: the producers issue tensor prefetches into L2 (UTMAPF), one per column box of
    the tile ahead, and nothing else changes: the math's wgmmas and waits, the TMA loads, no more spills (the
    fp8 slot kernels' producers spill a few bytes either way)."""
    from kvforge.runtime import compile

    on, off = pair
    assert "_pf2_" in on.name and "_pf" not in off.name
    ok, fk = compile(on), compile(off)
    assert not [ln for ln in ok.log.splitlines() if "serialized" in ln or "C7517" in ln]
    os_, fs = sass_functions(ok.cubin, tmp_path)[on.name], sass_functions(fk.cubin, tmp_path)[off.name]
    assert re.search(r"\bUTMAPF\b", os_) and not re.search(r"\bUTMAPF\b", fs), "no TMA prefetch (UTMAPF)"
    for op in (r"\bHGMMA\b", r"WARPGROUP\.DEPBAR", r"\bUTMALDG\b"):
        assert len(re.findall(op, os_)) == len(re.findall(op, fs)), op
    assert ok.resources.spill_store_bytes <= fk.resources.spill_store_bytes and \
        ok.resources.spill_load_bytes <= fk.resources.spill_load_bytes, (ok.resources, fk.resources)


@needs_nvrtc
@needs_cuobjdump
def test_the_phase_trace_compiles_in_only_when_defined(tmp_path):
    """bench/phase_trace.py's marks (KVFORGE_PHASE_TRACE, measurement only): with the define the kernel reads the
    global timer and the SM's clock into the kvforge_phase_trace array, with the same wgmmas; without it the shipped
    kernel has neither. (The lockstep: it compiles in a second, the seesaw in ten; both include the same header.)"""
    from kvforge.codegen.render import render_variant
    from kvforge.runtime.compiler import compile_source

    variant = next(v for v in ALL_SM90 if not v.config.seesaw and not v.config.is_fp8)
    source = render_variant(variant)
    traced = compile_source(variant.name, variant.arch, "#define KVFORGE_PHASE_TRACE 1\n" + source)
    plain = compile_source(variant.name, variant.arch, source)
    ts, ps = sass_functions(traced.cubin, tmp_path)[variant.name], sass_functions(plain.cubin, tmp_path)[variant.name]
    assert b"kvforge_phase_trace" in traced.cubin and b"kvforge_phase_trace" not in plain.cubin
    assert re.search(r"SR_GLOBALTIMER", ts) and not re.search(r"SR_GLOBALTIMER", ps)
    assert len(re.findall(r"\bHGMMA\b", ts)) == len(re.findall(r"\bHGMMA\b", ps))
