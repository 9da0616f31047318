"""The KV cache's format and scales of a decode call: 16-bit, or fp8 e4m3 in one of the three
layouts (docs/fp8.md), read from the caches' dtypes and the scale arguments, each error naming
the argument and what is allowed.

- a bf16/fp16 cache (the q dtype) takes no scale;
- a float8_e4m3fn cache takes per-tensor scales (a Python float, or a 1-element fp32 device tensor
  that a captured graph reads at replay) or block scales (an fp32 tensor shaped like the cache with
  its last dimension replaced by ceil(D / scale_block_size), block size 32, 64 or 128);
- a uint8 MLA cache whose tokens are 656 bytes is DeepSeek's packed `fp8_ds_mla` layout, which
  carries its scales (none may be passed).

`scale_values()` turns the scale arguments into what the kernel takes: (k pointer, v pointer,
k value, v value), a pointer of 0 meaning "use the value".
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from kvforge.codegen.policy import DS_MLA_TOKEN_BYTES, MLA_DIMS, SCALE_BLOCK_SIZES

from .tensors import TensorArg, device_view

SCALE_HELP = ("a float, a 1-element float32 device tensor (per-tensor), or float32 block scales shaped like the "
              "cache with the last dimension replaced by ceil(D / scale_block_size), scale_block_size in "
              f"{{{', '.join(map(str, SCALE_BLOCK_SIZES))}}}")


@dataclass(frozen=True)
class KVFormat:
    """kv_dtype ('bf16', 'fp16', 'fp8_e4m3'), scale_mode ('none', 'per_tensor', 'block', 'fp8_ds_mla')
    and the block size of block scales."""

    kv_dtype: str
    scale_mode: str = "none"
    scale_block_size: int | None = None

    @property
    def is_fp8(self) -> bool:
        return self.kv_dtype == "fp8_e4m3"


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def cache_format(family: str, caches: tuple[TensorArg, ...], q_dtype: str, scales: dict) -> KVFormat:
    """The format of `caches` (MLA: the one latent cache; GQA: k_cache, v_cache) given the scale
    arguments `scales` (name -> value or None). Raises TypeError/ValueError naming the argument."""
    first = caches[0]
    if first.dtype == "uint8" and first.shape and first.shape[-1] == DS_MLA_TOKEN_BYTES:
        if family != "mla_decode":
            raise TypeError(f"{first.name}: a uint8 cache of {DS_MLA_TOKEN_BYTES}-byte tokens is the fp8_ds_mla "
                            "layout of MLA caches; GQA takes float8_e4m3fn caches with k_scale and v_scale")
        for name, value in scales.items():
            if value is not None:
                raise ValueError(f"{name}: an fp8_ds_mla cache carries its scales in each token; pass None")
        return KVFormat("fp8_e4m3", "fp8_ds_mla")
    for t in caches:
        if t.dtype not in (q_dtype, "fp8_e4m3"):
            raise TypeError(f"{t.name}: dtype must be {q_dtype} (q's) or float8_e4m3fn (with scales), or uint8 "
                            f"[.., {DS_MLA_TOKEN_BYTES}] (MLA fp8_ds_mla), got {t.dtype}")
    if len(caches) > 1 and caches[0].dtype != caches[1].dtype:
        raise TypeError(f"{caches[1].name}: dtype {caches[1].dtype} differs from {caches[0].name}'s {caches[0].dtype}")
    if first.dtype != "fp8_e4m3":
        for name, value in scales.items():
            if value is not None:
                raise ValueError(f"{name}: scales apply to float8_e4m3fn KV caches; pass None for a {first.dtype} "
                                 "cache")
        return KVFormat(first.dtype)
    modes = []
    for (name, value), cache in zip(scales.items(), caches * (len(scales) // len(caches))):
        if value is None:
            raise ValueError(f"{name}: required for a float8_e4m3fn {cache.name}: {SCALE_HELP}")
        modes.append(_scale_mode(name, value, cache))
    if len(set(modes)) > 1:
        raise ValueError(f"{', '.join(scales)}: must be the same kind (both per-tensor, or block scales of one "
                         f"block size), got {' and '.join(_describe(m) for m in modes)}")
    mode, block = modes[0]
    return KVFormat("fp8_e4m3", mode, block)


def _describe(mode: tuple[str, int | None]) -> str:
    return "per-tensor" if mode[0] == "per_tensor" else f"block scales of {mode[1]}"


def _scale_mode(name: str, value, cache: TensorArg) -> tuple[str, int | None]:
    if _is_number(value):
        if not math.isfinite(value) or value == 0:
            raise ValueError(f"{name}: a per-tensor scale must be finite and non-zero, got {value}")
        return "per_tensor", None
    s = device_view(value, name, dtype="fp32", device_id=cache.device_id)
    numel = math.prod(s.shape)
    if numel == 1:
        return "per_tensor", None
    d = cache.shape[-1]
    blocks = s.shape[-1] if s.shape else 0
    sizes = [bs for bs in SCALE_BLOCK_SIZES if -(-d // bs) == blocks]
    if s.shape[:-1] != cache.shape[:-1] or not sizes:
        want = " or ".join(str(tuple(cache.shape[:-1]) + (-(-d // bs),)) for bs in SCALE_BLOCK_SIZES)
        raise ValueError(f"{name}: block scales of {cache.name} {tuple(cache.shape)} must have shape {want} "
                         f"(block size {', '.join(map(str, SCALE_BLOCK_SIZES))}), got {tuple(s.shape)}")
    if s.ptr % 16:  # the producers copy a page run's scale rows in 16-byte units (cp.async, bulk copies)
        raise ValueError(f"{name}: data pointer {s.ptr:#x} is not 16-byte aligned (the kernels copy block scales in "
                         f"16-byte units); pass a tensor whose storage starts on a 16-byte boundary")
    return "block", sizes[-1]


def planned_format(family: str, fp8_layout: str | None, scale_block_size: int | None, head_dim: int) -> KVFormat | None:
    """The KVFormat a plan object (MLADecode / GQADecode) is built for, from its `fp8_layout` and
    `scale_block_size` arguments (None: a 16-bit cache); a block size is named as the calls' scale
    shapes name it (the largest with the same ceil(D / block))."""
    layouts = ("per_tensor", "block") + (("fp8_ds_mla",) if family == "mla_decode" else ())
    if fp8_layout is None:
        if scale_block_size is not None:
            raise ValueError(f"scale_block_size={scale_block_size}: only with fp8_layout='block'")
        return None
    if fp8_layout not in layouts:
        raise ValueError(f"fp8_layout={fp8_layout!r}: supported {', '.join(map(repr, layouts))} (or None for a "
                         "bf16/fp16 cache)")
    if (fp8_layout == "block") != (scale_block_size is not None):
        raise ValueError(f"scale_block_size={scale_block_size}: required (one of "
                         f"{', '.join(map(str, SCALE_BLOCK_SIZES))}) exactly when fp8_layout='block'")
    if scale_block_size is not None:
        if scale_block_size not in SCALE_BLOCK_SIZES:
            raise ValueError(f"scale_block_size={scale_block_size}: supported {', '.join(map(str, SCALE_BLOCK_SIZES))}")
        blocks = -(-head_dim // scale_block_size)
        scale_block_size = max(bs for bs in SCALE_BLOCK_SIZES if -(-head_dim // bs) == blocks)
    return KVFormat("fp8_e4m3", fp8_layout, scale_block_size)


def mla_token_dim(fmt: KVFormat) -> int:
    """The last dimension an MLA cache of this format has."""
    return DS_MLA_TOKEN_BYTES if fmt.scale_mode == "fp8_ds_mla" else MLA_DIMS[0]


def scale_values(k_scale, v_scale) -> tuple[int, int, float, float]:
    """(k pointer, v pointer, k value, v value) for the kernel: a tensor passes its device pointer,
    a number its value (pointer 0)."""
    kp, kv = _one(k_scale)
    vp, vv = _one(v_scale)
    return kp, vp, kv, vv


def _one(x) -> tuple[int, float]:
    if x is None:
        return 0, 1.0
    if _is_number(x):
        return 0, float(x)
    if type(x).__module__.startswith("torch"):
        return x.data_ptr(), 1.0
    return device_view(x, "scale", contiguous=False).ptr, 1.0
