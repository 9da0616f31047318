"""The fp8 keys-as-M prototype (bench/proto/mla_fp8_keys_m.cu, timed by bench/mla_fp8_native_ab.py) compiles to
what it is meant to measure: fp8 wgmma (QGMMA) for both products and no 16-bit tile of the cache (no HGMMA), V^T
fragments by ldmatrix.trans (LDSM), TMA tile loads (UTMALDG); and its ring refuses a depth that would let a
warpgroup read a slot by an older phase's parity. A measurement tool, not a shipped kernel: its numerics and
speed were checked on the H200 by the script (bench/RESULTS.md, thirty-second session)."""
from __future__ import annotations

from pathlib import Path

import pytest

from test_sass import needs_cuobjdump, sass_functions
from toolchains import needs_nvrtc

SOURCE = Path(__file__).resolve().parents[1] / "bench" / "proto" / "mla_fp8_keys_m.cu"
SYMBOL = "mla_fp8_keys_m"


def _build(page: int, stages: int, wgs: int, qkc: int = 2):
    from kvforge.runtime.compiler import compile_source

    defines = f"#define KF_PAGE {page}\n#define KF_STAGES {stages}\n#define KF_HEADS 16\n#define KF_WGS {wgs}\n"
    return compile_source(SYMBOL, "sm_90a", defines + f"#define KF_QKC {qkc}\n" + SOURCE.read_text())


@needs_nvrtc
@needs_cuobjdump
@pytest.mark.parametrize("page,stages,wgs", [(64, 4, 2), (16, 2, 2), (128, 4, 1)])
def test_prototype_multiplies_fp8_by_wgmma_without_a_16bit_tile(page, stages, wgs, tmp_path):
    sass = sass_functions(_build(page, stages, wgs).cubin, tmp_path)[SYMBOL]
    ops = [line.split()[1] for line in sass.splitlines() if line.strip().startswith("/*") and len(line.split()) > 1]
    qgmma = sum(op.startswith("QGMMA") for op in ops)
    # per tile: 18 QK k32 steps (m64n32k32) and 8 dim blocks x 2 key steps x (hi, lo) PV products (m64n16k32)
    assert qgmma == 18 + 32, f"{qgmma} QGMMA"
    assert not any(op.startswith("HGMMA") for op in ops), "a 16-bit wgmma: the cache was converted"
    assert any(op.startswith("LDSM") for op in ops) and any(op.startswith("UTMALDG") for op in ops)


@needs_nvrtc
def test_prototype_refuses_a_ring_the_warpgroups_would_share_by_parity():
    from kvforge.runtime.errors import CompileError

    with pytest.raises(CompileError, match="a multiple of the math warpgroups"):
        _build(64, 3, 2)


def _numerics():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hilo_e4m3_error", SOURCE.with_name("hilo_e4m3_error.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_e4m3_emulation_rounds_as_the_format():
    np = pytest.importorskip("numpy")
    m = _numerics()
    got = m.e4m3(np.array([448.0, 500.0, 0.1, 2.0**-9, 2.0**-11, -1.0625, 1.0625 + 2.0**-6]))
    # max, saturated, 0.1 -> 13 * 2^-7, the smallest subnormal, below half of it -> 0, ties to even, above the tie
    assert got.tolist() == [448.0, 448.0, 13 * 2.0**-7, 2.0**-9, 0.0, -1.0, 1.125]


def test_hilo_pairs_carry_q_and_p_within_the_bar_and_single_e4m3_does_not():
    np = pytest.importorskip("numpy")
    m = _numerics()
    rng = np.random.default_rng(0)
    assert m.error(rng, "hilo", "hilo", 1.0, n=512) < 5e-3
    assert m.error(rng, "single", "exact", 1.0, n=512) > 1e-2
