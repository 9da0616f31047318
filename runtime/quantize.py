"""FP8 (OCP e4m3fn) KV-cache layouts: `kvforge.quantize_kv` makes them from a bf16/fp16 cache and
`kvforge.dequantize_kv` turns them back into float32 (what a float64 reference compares against).

Three layouts (docs/fp8.md):
- "per_tensor": a float8_e4m3fn cache shaped like the input and one fp32 scale (a 1-element
  tensor): value = fp8 * scale.
- "block": a float8_e4m3fn cache shaped like the input and an fp32 scale tensor shaped like it with
  the last dimension replaced by ceil(D / scale_block_size) (per token, and per KV head for GQA;
  MLA's 576 = 4 x 128 + 64 leaves a short last block with block size 128).
- "fp8_ds_mla": DeepSeek's packed MLA token, a uint8 cache [num_pages, page_size, 656]: 512 e4m3
  latent values, 4 fp32 scales (one per 128 latent channels), then the 64 rope values in bf16.

Works on torch tensors on any device (CPU included). The decode kernels do not read these layouts
yet (issue: FP8 KV caches); the decode API rejects FP8 caches with a message saying so.
"""
from __future__ import annotations

import math

E4M3_MAX = 448.0
from kvforge.codegen.policy import DS_MLA_LATENT, DS_MLA_SCALE_BLOCK as DS_MLA_BLOCK, SCALE_BLOCK_SIZES
from kvforge.codegen.policy import DS_MLA_TOKEN_BYTES as DS_MLA_BYTES  # 512 e4m3 + 4 x fp32 + 64 x bf16

LAYOUTS = ("per_tensor", "block", "fp8_ds_mla")
DS_MLA_ROPE = 64


def _torch():
    import torch

    return torch


def _check_cache(cache, layout: str):
    torch = _torch()
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"cache: expected a torch tensor, got {type(cache).__name__}")
    if cache.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"cache: dtype must be bfloat16 or float16 to quantize, got {cache.dtype}")
    if cache.dim() not in (3, 4):
        raise ValueError(f"cache: expected [num_pages, page_size, D] or [num_pages, page_size, Hkv, D], "
                         f"got shape {tuple(cache.shape)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: supported {', '.join(map(repr, LAYOUTS))}")


def _scale_of(amax):
    """fp32 scale mapping amax to the e4m3 range (1 where a block is all zeros)."""
    torch = _torch()
    scale = amax.float() / E4M3_MAX
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _to_e4m3(values, scale):
    torch = _torch()
    return (values.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_kv(cache, layout: str = "per_tensor", scale_block_size: int | None = None):
    """(fp8 cache, scales) for `layout`; for "fp8_ds_mla", (the uint8 packed cache, None).

    cache: a bf16/fp16 torch tensor [num_pages, page_size, D] or [num_pages, page_size, Hkv, D]
    (MLA: D = 576, and "fp8_ds_mla" needs it). `scale_block_size` (32, 64, 128) is required for
    "block" and not accepted otherwise.
    """
    _check_cache(cache, layout)
    torch = _torch()
    if layout != "block" and scale_block_size is not None:
        raise ValueError(f"scale_block_size={scale_block_size}: only the 'block' layout takes one")
    if layout == "per_tensor":
        scale = _scale_of(cache.abs().amax()).reshape(1)
        return _to_e4m3(cache, scale), scale
    if layout == "block":
        if scale_block_size not in SCALE_BLOCK_SIZES:
            raise ValueError(f"scale_block_size={scale_block_size}: the 'block' layout needs one of "
                             f"{', '.join(map(str, SCALE_BLOCK_SIZES))}")
        d = cache.shape[-1]
        blocks = math.ceil(d / scale_block_size)
        pad = blocks * scale_block_size - d
        padded = torch.nn.functional.pad(cache.float(), (0, pad)) if pad else cache.float()
        grouped = padded.reshape(*cache.shape[:-1], blocks, scale_block_size)
        scales = _scale_of(grouped.abs().amax(dim=-1))
        q = (grouped / scales.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).reshape(*cache.shape[:-1], -1)[..., :d]
        return q.to(torch.float8_e4m3fn).contiguous(), scales.contiguous()
    # fp8_ds_mla
    if cache.shape[-1] != DS_MLA_LATENT + DS_MLA_ROPE or (cache.dim() == 4 and cache.shape[2] != 1):
        raise ValueError(f"cache: the fp8_ds_mla layout packs MLA caches [num_pages, page_size, 576] "
                         f"(or [.., 1, 576]), got shape {tuple(cache.shape)}")
    flat = cache.reshape(cache.shape[0], cache.shape[1], -1)
    latent = flat[..., :DS_MLA_LATENT].float().reshape(*flat.shape[:2], 4, DS_MLA_BLOCK)
    scales = _scale_of(latent.abs().amax(dim=-1))                                     # [P, ps, 4]
    q = (latent / scales.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    packed = torch.empty((*flat.shape[:2], DS_MLA_BYTES), dtype=torch.uint8, device=cache.device)
    packed[..., :DS_MLA_LATENT] = q.reshape(*flat.shape[:2], DS_MLA_LATENT).view(torch.uint8)
    packed[..., DS_MLA_LATENT:DS_MLA_LATENT + 16] = scales.contiguous().view(torch.uint8).reshape(*flat.shape[:2], 16)
    rope = flat[..., DS_MLA_LATENT:].to(torch.bfloat16).contiguous()
    packed[..., DS_MLA_LATENT + 16:] = rope.view(torch.uint8).reshape(*flat.shape[:2], 2 * DS_MLA_ROPE)
    return packed, None


def dequantize_kv(cache, scales=None):
    """float32 values of a quantized cache: fp8 with a 1-element (per-tensor) or block scale
    tensor, or a uint8 fp8_ds_mla cache [.., 656] (scales=None), as a [num_pages, page_size, 576]
    tensor for the latter."""
    torch = _torch()
    if cache.dtype == torch.uint8:
        if cache.shape[-1] != DS_MLA_BYTES or scales is not None:
            raise ValueError(f"cache: a uint8 cache is the fp8_ds_mla layout ([.., {DS_MLA_BYTES}], no separate "
                             f"scales), got shape {tuple(cache.shape)} and scales={'given' if scales is not None else None}")
        lead = cache.shape[:-1]
        q = cache[..., :DS_MLA_LATENT].contiguous().view(torch.float8_e4m3fn).float()
        s = cache[..., DS_MLA_LATENT:DS_MLA_LATENT + 16].contiguous().view(torch.float32)      # [.., 4]
        latent = (q.reshape(*lead, 4, DS_MLA_BLOCK) * s.unsqueeze(-1)).reshape(*lead, DS_MLA_LATENT)
        rope = cache[..., DS_MLA_LATENT + 16:].contiguous().view(torch.bfloat16).float()
        return torch.cat([latent, rope], dim=-1)
    if cache.dtype != torch.float8_e4m3fn:
        raise TypeError(f"cache: dtype must be float8_e4m3fn or uint8 (fp8_ds_mla), got {cache.dtype}")
    if scales is None:
        raise ValueError("scales: an fp8_e4m3fn cache needs its scales (per-tensor or block)")
    values = cache.float()
    if scales.numel() == 1:
        return values * scales.float().reshape(())
    d, blocks = cache.shape[-1], scales.shape[-1]
    if tuple(scales.shape[:-1]) != tuple(cache.shape[:-1]):
        raise ValueError(f"scales: shape must be {tuple(cache.shape[:-1])} + (ceil(D / block),), "
                         f"got {tuple(scales.shape)}")
    block = block_size_of(d, blocks)
    expanded = scales.float().repeat_interleave(block, dim=-1)[..., :d]
    return values * expanded


def block_size_of(d: int, blocks: int) -> int:
    """The scale block size a scale tensor's last dimension implies for head dim `d`."""
    for bs in SCALE_BLOCK_SIZES:
        if math.ceil(d / bs) == blocks:
            return bs
    raise ValueError(f"scales: last dimension {blocks} matches no scale block size for D={d} "
                     f"(ceil(D / b) for b in {', '.join(map(str, SCALE_BLOCK_SIZES))})")
