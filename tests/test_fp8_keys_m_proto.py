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
