"""The numerics of schedule 'keys_m' (codegen/sm90_keys_m.py: queries and probabilities as hi/lo e4m3 pairs; on the
packed fp8_ds_mla token, per-block scales and the bf16 rope),
emulated in float64 by bench/hilo_e4m3_error.py: the emulation rounds as the e4m3fn format, and the pairs stay within
the 1e-2 bar where a single e4m3 does not. (The kernel itself: tests/test_fp8_gpu.py on the GPU, its SASS in
tests/test_sass.py.)"""
from __future__ import annotations

import pytest


def test_e4m3_emulation_rounds_as_the_format(bench_tool):
    np = pytest.importorskip("numpy")
    m = bench_tool("hilo_e4m3_error")
    got = m.e4m3(np.array([448.0, 500.0, 0.1, 2.0**-9, 2.0**-11, -1.0625, 1.0625 + 2.0**-6]))
    # max, saturated, 0.1 -> 13 * 2^-7, the smallest subnormal, below half of it -> 0, ties to even, above the tie
    assert got.tolist() == [448.0, 448.0, 13 * 2.0**-7, 2.0**-9, 0.0, -1.0, 1.125]


def test_hilo_pairs_carry_q_and_p_within_the_bar_and_single_e4m3_does_not(bench_tool):
    np = pytest.importorskip("numpy")
    m = bench_tool("hilo_e4m3_error")
    rng = np.random.default_rng(0)
    assert m.error(rng, "hilo", "hilo", 1.0, n=512) < 5e-3
    # the lazy rescale's P: scale 128, p up to 2^1.5 (the running maximum lagging by the slack)
    assert m.error(rng, "hilo", "hilo", 1.0, n=512, p_scale=128.0, lag=1.5) < 5e-3
    assert m.error(rng, "single", "exact", 1.0, n=512) > 1e-2
    # q's lo part unscaled (hi and lo into one accumulator): as close as keys_m's lo x 16, wide and narrow queries
    for sd in (1.0, 16.0):
        assert m.error(rng, "hilo", "hilo", sd, n=512, q_lo_shift=0) < 5e-3, sd


def test_packed_token_numerics_stay_within_the_bar_for_spread_scales(bench_tool):
    """keys_m on fp8_ds_mla, emulated: latent blocks scaled per key, the rope in bf16, P^T per scale block against the
    block's largest scale; log-normal scales from sd 0.25 to 2 (a 1:3000 range) stay near 1e-3."""
    np = pytest.importorskip("numpy")
    m = bench_tool("hilo_e4m3_error")
    assert m.bf16(np.array([1.00390625, 1.005859375, -3.14159])).tolist() == [1.0, 1.0078125, -3.140625]
    # fp16, as the kernel forms P per scale block: ties to even, subnormals on a 2^-24 grid
    assert m.f16(np.array([1 + 2**-11, 1 + 3 * 2**-11, 2**-20 + 2**-26, -65504.0])).tolist() == [1.0, 1 + 2**-9, 2**-20,
                                                                                                   -65504.0]
    rng = np.random.default_rng(1)
    for spread in (0.25, 2.0):
        assert m.error_packed(rng, spread, n=512) < 5e-3, spread
