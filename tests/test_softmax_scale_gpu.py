"""The softmax scale's sign and zero on every CUDA decode kernel, against the float64 reference.

A negative scale favours the smallest scores (a row's maximum is then its smallest raw score, so a kernel that
took maxima before scaling would get it wrong), and 0 gives every visible key the same weight (masked keys must
still get none: -inf x 0 is NaN). bench/RESULTS.md ("The softmax scale folded into one FFMA") has why the kernels
scale each score before its maximum. Each case runs ragged lengths with 0 and 1, partial tiles and (where the
kernel splits) a split sequence, NaN in the outputs beforehand; fp8 per-tensor caches with a negative device scale
(dequantized values negated, folded into the same scale) too."""
from __future__ import annotations

import pytest

from paged_inputs import assert_matches, make_case, reference

pytestmark = pytest.mark.gpu
TOL = 1e-2
SCALES = [-0.3, 0.0]

# id -> (family, backend, schedule or None, heads (MLA) / group (GQA), head dim, s_q, lens)
KERNELS = {
    "mla_sm80_h16": ("mla_decode", "sm80", None, 16, 576, 1, [0, 1, 333, 9000]),
    "mla_sm90_lockstep_h32_sq2": ("mla_decode", "sm90", "lockstep", 32, 576, 2, [1, 0, 777, 9000]),
    "mla_sm90_seesaw_h128": ("mla_decode", "sm90", "seesaw", 128, 576, 1, [0, 1, 333, 4100]),
    "gqa_sm80_g4": ("gqa_decode", "sm80", None, 4, 128, 1, [0, 1, 17, 200, 9000]),
    "gqa_sm90_g8_sq8": ("gqa_decode", "sm90", None, 8, 128, 8, [8, 1, 77, 2500]),
}


def _sm90():
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")


def _config(family, backend, schedule, heads, d, s_q, **kv):
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    cfg = select_decode_config(family, device_arch(0), "bf16", 64, heads=heads, head_dim=d, s_q=s_q, backend=backend,
                               **kv)
    assert cfg.backend == backend
    if schedule is not None:
        cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "schedule": schedule})
    return cfg


def _poisoned(family, q):
    import torch

    b, s_q, hq, d = q.shape
    dv = 512 if family == "mla_decode" else d
    return (torch.full((b, s_q, hq, dv), float("nan"), dtype=q.dtype, device="cuda"),
            torch.full((b, hq, s_q), float("nan"), dtype=torch.float32, device="cuda"))


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_negative_and_zero_softmax_scales(kernel, scale):
    import kvforge
    import torch

    family, backend, schedule, heads, d, s_q, lens = KERNELS[kernel]
    if backend == "sm90":
        _sm90()
    cfg = _config(family, backend, schedule, heads, d, s_q)
    hkv = 1 if family == "mla_decode" else 2
    case = make_case(family, batch=len(lens), s_q=s_q, hq=heads * hkv, hkv=hkv, d=d, page_size=64, lens=lens,
                     seed=heads + d + s_q)
    out, lse = _poisoned(family, case.q)
    causal = s_q > 1
    if family == "mla_decode":
        kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=causal, softmax_scale=scale,
                           out=out, lse=lse, config=cfg)
    else:
        kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=causal,
                           softmax_scale=scale, out=out, lse=lse, config=cfg)
    torch.cuda.synchronize()
    want_o, want_l = reference(family, case.host, causal=causal, scale=scale)
    assert_matches(out, lse, want_o, want_l, tol=TOL, what=f"{cfg.backend} scale {scale}")


# fp8 per-tensor caches whose device scale is negative: the folded c = softmax scale x k_scale < 0
FP8 = {
    "mla_sm90_registers": ("mla_decode", "registers", 64, 576, 1, [0, 1, 333, 9000]),
    "mla_sm90_slot": ("mla_decode", "slot", 64, 576, 1, [0, 1, 333, 4100]),
    "gqa_sm90": ("gqa_decode", None, 8, 128, 4, [4, 1, 77, 2500]),
}


@pytest.mark.parametrize("kernel", list(FP8))
def test_a_negative_per_tensor_fp8_scale(kernel):
    import kvforge
    import torch
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from test_fp8_gpu import make_fp8_case

    _sm90()
    family, staging, heads, d, s_q, lens = FP8[kernel]
    hkv = 1 if family == "mla_decode" else 2
    c = make_fp8_case(family, "per_tensor", batch=len(lens), s_q=s_q, hq=heads * hkv, hkv=hkv, d=d, page_size=64,
                      lens=lens, seed=heads + 7)
    if family == "mla_decode":
        cfg = build(DecodeConfig, sm90_choice("mla_decode", "bf16", 64, s_q, fp8_staging=staging,
                                              kv={"kv_dtype": "fp8_e4m3", "scale_mode": "per_tensor"}
                                              ).model_dump(mode="json"))
    else:
        cfg = _config(family, "sm90", None, heads, d, s_q, scale_mode="per_tensor")
    b = c.base
    out, lse = _poisoned(family, b.q)
    causal = s_q > 1
    if family == "mla_decode":
        kvforge.mla_decode(b.q, c.k, b.block_table, b.seqlens, kv_scale=-c.k_scale, softmax_scale=0.3, out=out,
                           lse=lse, config=cfg)
        deq_k = deq_v = -c.deq_k
    else:
        kvforge.gqa_decode(b.q, c.k, c.v, b.block_table, b.seqlens, causal=causal, k_scale=-c.k_scale,
                           v_scale=c.v_scale, softmax_scale=0.3, out=out, lse=lse, config=cfg)
        deq_k, deq_v = -c.deq_k, c.deq_v
    torch.cuda.synchronize()
    want_o, want_l = reference(family, b.host, causal=causal, scale=0.3, k=deq_k, v=deq_v)
    assert_matches(out, lse, want_o, want_l, tol=TOL, what=f"{kernel}, k_scale < 0")
