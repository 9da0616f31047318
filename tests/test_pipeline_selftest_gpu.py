"""The mbarrier KV ring on a real GPU: every runnable self-test variant of the default matrix
streams fresh random data through the ring and must reproduce NumPy's sums exactly."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kvforge.codegen.matrix import load_matrix

pytestmark = pytest.mark.gpu

VARIANTS = [v for v in load_matrix() if v.family == "pipeline_selftest"]


def _runnable(v):
    from kvforge.runtime.device import runs_on
    from kvforge.runtime.device import device_arch

    if not runs_on(v.arch, device_arch()):
        pytest.skip(f"{v.arch} cubins do not run on this {device_arch()} GPU (compile-verified in CI)")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_selftest_debug_build_matches_numpy(variant):
    from kvforge.runtime.selftest import check_pipeline_selftest

    _runnable(variant)
    r = check_pipeline_selftest(variant, mib=96, debug=True, seed=int(variant.config_hash[:6], 16))
    assert r["ok"], f"{r['mismatches']} of {r['tiles']} tiles' sums differ from NumPy"


@pytest.mark.parametrize("variant", VARIANTS[::3], ids=lambda v: v.name)
def test_selftest_release_build_matches_numpy(variant):
    from kvforge.runtime.selftest import check_pipeline_selftest

    _runnable(variant)
    r = check_pipeline_selftest(variant, mib=300, seed=7)
    assert r["ok"], f"{r['mismatches']} of {r['tiles']} tiles' sums differ from NumPy"


@pytest.mark.parametrize("grid", [1, 3, 7])
def test_few_ctas_run_many_laps_of_the_ring(grid):
    """Few CTAs over many tiles: each slot's phase flips hundreds of times."""
    import torch

    from kvforge.runtime.selftest import launch_pipeline_selftest, reference_sums

    variant = next(v for v in VARIANTS if v.config.fill == "expect_tx" and v.config.pipeline.num_qk_stages == 3)
    _runnable(variant)
    cfg = variant.config
    tiles = 601
    host = np.random.default_rng(grid).integers(0, 2**32, tiles * cfg.tile_bytes // 4, dtype=np.uint32)
    src = torch.from_numpy(host.view(np.int32)).cuda().view(torch.uint32)
    out = torch.full((tiles, cfg.pipeline.num_qk_stages, cfg.pipeline.num_consumer), -1, dtype=torch.int32,
                     device="cuda").view(torch.uint32)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        launch_pipeline_selftest(variant, src, out, grid=grid, debug=True, stream=side)
    side.synchronize()
    got = out.view(torch.int32).cpu().numpy().view(np.uint32)
    np.testing.assert_array_equal(got, reference_sums(host, variant))


def test_debug_build_traps_with_a_message_instead_of_hanging(tmp_path):
    """A ring whose full barrier expects one arrival too many must trap, naming the barrier."""
    script = textwrap.dedent("""
        import numpy as np, torch
        from kvforge.codegen.matrix import load_matrix
        from kvforge.codegen.render import render_variant
        from kvforge.runtime.compiler import compile_source
        from kvforge.runtime.launch import load
        v = next(v for v in load_matrix()
                 if v.family == "pipeline_selftest" and v.arch == "sm_90" and v.config.fill == "arrive")
        src = render_variant(v)
        bad = src.replace("using Ring = kvforge::KVRing<{k}, kNumQKStages, {f},".format(
            k=v.config.pipeline.num_kv_stages, f=v.config.pipeline.full_arrive_count),
            "using Ring = kvforge::KVRing<{k}, kNumQKStages, {f},".format(
            k=v.config.pipeline.num_kv_stages, f=v.config.pipeline.full_arrive_count + 1))
        assert bad != src
        k = compile_source(v.name, v.arch, bad, debug=True)
        kern = load(k, v.name, v.main_kernel.dynamic_smem_bytes)
        data = torch.zeros(v.config.tile_bytes // 4 * 4, dtype=torch.int32, device="cuda")
        out = torch.zeros(4 * v.config.pipeline.num_qk_stages * v.config.pipeline.num_consumer, dtype=torch.int32, device="cuda")
        from kvforge.runtime.launch import resolve_stream
        kern.launch((1, 1, 1), v.main_kernel.block, v.main_kernel.dynamic_smem_bytes, resolve_stream(None),
                    data.data_ptr(), out.data_ptr(), np.int32(4))
        torch.cuda.synchronize()
        print("NO TRAP")
    """)
    env = {**os.environ, "KVFORGE_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    out = r.stdout + r.stderr
    assert "NO TRAP" not in out
    assert r.returncode != 0
    assert "barrier of slot" in out and "timed out" in out, out[-3000:]
