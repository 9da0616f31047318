"""kvforge.quantize_kv / dequantize_kv: the three FP8 KV layouts, their byte layout, their error,
and bad arguments (CPU; needs torch with float8_e4m3fn)."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: quantize_kv works on torch tensors")

from kvforge.runtime.quantize import DS_MLA_BYTES, dequantize_kv, quantize_kv  # noqa: E402


def _cache(shape, seed=0, dtype=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.linspace(0.1, 8.0, shape[-1])  # channels of different range
    return x.to(dtype or torch.bfloat16)


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("shape", [(6, 16, 576), (5, 32, 4, 128), (3, 64, 2, 64)])
def test_per_tensor_round_trip_is_within_e4m3_precision(shape):
    cache = _cache(shape)
    q, scale = quantize_kv(cache, "per_tensor")
    assert q.dtype == torch.float8_e4m3fn and q.shape == cache.shape and scale.shape == (1,)
    assert float(scale) == pytest.approx(float(cache.float().abs().max()) / 448.0)
    back = dequantize_kv(q, scale)
    assert _rel(back, cache.float()) < 0.06  # e4m3: 3 mantissa bits; one scale over channels of 80x range


@pytest.mark.parametrize("shape,block", [((6, 16, 576), 128), ((6, 16, 576), 64), ((5, 32, 4, 128), 32),
                                         ((3, 64, 2, 256), 128)])
def test_block_scales_have_the_documented_shape_and_beat_one_scale(shape, block):
    cache = _cache(shape, seed=1)
    q, scales = quantize_kv(cache, "block", scale_block_size=block)
    assert scales.shape == (*shape[:-1], math.ceil(shape[-1] / block)) and scales.dtype == torch.float32
    back = dequantize_kv(q, scales)
    err_block = _rel(back, cache.float())
    err_tensor = _rel(dequantize_kv(*quantize_kv(cache, "per_tensor")), cache.float())
    assert err_block < 0.04 and err_block < err_tensor


def test_mla_576_with_block_128_leaves_a_short_last_block():
    cache = _cache((2, 16, 576), seed=2)
    q, scales = quantize_kv(cache, "block", scale_block_size=128)
    assert scales.shape[-1] == 5
    tail = cache[..., 512:].float().abs().amax(dim=-1) / 448.0
    assert torch.allclose(scales[..., 4], tail)


def test_fp8_ds_mla_packs_the_656_byte_token():
    cache = _cache((3, 64, 576), seed=3)
    packed, none = quantize_kv(cache, "fp8_ds_mla")
    assert none is None and packed.dtype == torch.uint8 and packed.shape == (3, 64, DS_MLA_BYTES)
    token = packed[1, 7]
    scales = token[512:528].clone().view(torch.float32)
    want = cache[1, 7, :512].float().reshape(4, 128).abs().amax(dim=-1) / 448.0
    assert torch.allclose(scales, want)
    rope = token[528:].clone().view(torch.bfloat16)
    assert torch.equal(rope, cache[1, 7, 512:].to(torch.bfloat16))  # rope stays exact bf16
    latent = token[:512].clone().view(torch.float8_e4m3fn).float().reshape(4, 128) * scales[:, None]
    assert _rel(latent.reshape(-1), cache[1, 7, :512].float()) < 0.04
    back = dequantize_kv(packed)
    assert back.shape == (3, 64, 576) and _rel(back, cache.float()) < 0.04


def test_all_zero_blocks_get_scale_one_not_nan():
    cache = torch.zeros((2, 16, 576), dtype=torch.bfloat16)
    for layout, kw in (("per_tensor", {}), ("block", {"scale_block_size": 64}), ("fp8_ds_mla", {})):
        q, s = quantize_kv(cache, layout, **kw)
        back = dequantize_kv(q, s)
        assert not torch.isnan(back).any() and float(back.abs().max()) == 0.0


def test_bad_arguments_name_what_is_wrong():
    cache = _cache((2, 16, 576))
    with pytest.raises(ValueError, match=r"layout='nope'"):
        quantize_kv(cache, "nope")
    with pytest.raises(ValueError, match=r"scale_block_size=48: .* 32, 64, 128"):
        quantize_kv(cache, "block", scale_block_size=48)
    with pytest.raises(ValueError, match=r"scale_block_size=64: only the 'block' layout"):
        quantize_kv(cache, "per_tensor", scale_block_size=64)
    with pytest.raises(ValueError, match=r"fp8_ds_mla layout packs MLA caches"):
        quantize_kv(_cache((2, 16, 2, 128)), "fp8_ds_mla")
    with pytest.raises(TypeError, match=r"cache: dtype must be bfloat16 or float16"):
        quantize_kv(cache.float())
    q, s = quantize_kv(cache, "block", scale_block_size=64)
    with pytest.raises(ValueError, match=r"scales: an fp8_e4m3fn cache needs its scales"):
        dequantize_kv(q)
    with pytest.raises(ValueError, match=r"scales: shape must be"):
        dequantize_kv(q, s[:1])
    with pytest.raises(ValueError, match=r"last dimension 7 matches no scale block size"):
        dequantize_kv(q, torch.ones((*q.shape[:-1], 7)))
    assert np.isfinite(dequantize_kv(q, s).numpy()).all()
