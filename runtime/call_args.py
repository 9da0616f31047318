"""Argument checks of the decode API: every tensor's device, dtype, rank, shape and strides, and
the shape facts a call is launched with, each error naming the argument and what is allowed.

`validate()` is the full check. Torch callers pay it once per *signature* (dtypes, shapes,
devices, contiguity of every tensor, read straight from the tensors by runtime/decode.py): a
signature already validated skips the checks, since all they could reject is in it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from kvforge.codegen.policy import (GQA_GROUPS, GQA_HEAD_DIMS, LOG2E, MAX_Q_ROWS, MAX_S_Q, MLA_DIMS, MLA_MAX_HEADS,
                                    PAGE_SIZES)

from .kv_format import KVFormat, cache_format, mla_token_dim
from .tensors import TensorArg, device_view


@dataclass(frozen=True)
class CallShape:
    """What a validated call launches with (everything but the pointers)."""

    family: str
    device_id: int
    dtype: str            # 'bf16' / 'fp16'
    batch: int
    s_q: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int         # d_qk
    page_size: int
    num_pages: int
    max_pages: int
    out_shape: tuple
    lse_shape: tuple
    kv: KVFormat | None = None  # None: a 16-bit cache of q's dtype

    @property
    def kv_format(self) -> KVFormat:
        return self.kv or KVFormat(self.dtype)

    @property
    def group(self) -> int:
        """The selector's `heads`: H for MLA, the query group Hq / Hkv for GQA."""
        return self.num_q_heads if self.family == "mla_decode" else self.num_q_heads // self.num_kv_heads

    @property
    def default_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


def softmax_scale_value(softmax_scale) -> float | None:
    """softmax_scale as a float (None stays None: the call's default 1/sqrt(d_qk)): any finite real number (0 gives
    uniform weights over the visible keys, a negative scale favours the smallest scores); anything else is refused
    by name before a launch."""
    if softmax_scale is None or type(softmax_scale) is float and math.isfinite(softmax_scale):
        return softmax_scale
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale: must be a real number (a Python or NumPy float or int) or None, "
                        f"got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: must be finite, got {softmax_scale}")
    return float(softmax_scale)


def scale_log2(softmax_scale, default_log2: float) -> float:
    """softmax_scale (checked by softmax_scale_value; None: the default, given as `default_log2`) in the kernels'
    log2 units."""
    value = softmax_scale_value(softmax_scale)
    return default_log2 if value is None else value * LOG2E


def _join(values) -> str:
    return ", ".join(map(str, values))


def validate(family: str, q, k_cache, v_cache, block_table, cache_seqlens, out, lse, scales: dict | None = None):
    """(CallShape, TensorArg views of q, k, v, block_table, cache_seqlens, out or None, lse or None).
    `scales` maps the scale arguments' names (kv_scale; k_scale, v_scale) to their values."""
    scales = scales or {}
    qa = device_view(q, "q", dtype=("bf16", "fp16"), ndim=4 if family == "mla_decode" else (3, 4))
    dev = qa.device_id
    if family == "mla_decode":
        batch, s_q, heads, dqk = qa.shape
        if dqk != MLA_DIMS[0]:
            raise ValueError(f"q: last dimension must be {MLA_DIMS[0]} (512 latent + 64 rope), got {dqk}")
        if not 1 <= heads <= MLA_MAX_HEADS:
            raise ValueError(f"q: {heads} heads; MLA decode supports 1..{MLA_MAX_HEADS}")
        ka = device_view(k_cache, "kv_cache", ndim=(3, 4), device_id=dev)
        kv = cache_format(family, (ka,), qa.dtype, scales or {"kv_scale": None})
        if len(ka.shape) == 4 and ka.shape[2] != 1:
            raise ValueError(f"kv_cache: a 4-D MLA cache must have h_kv=1, got shape {ka.shape}")
        if ka.shape[-1] != mla_token_dim(kv):
            raise ValueError(f"kv_cache: last dimension must be {mla_token_dim(kv)}, got shape {ka.shape}")
        va, hkv, out_shape = ka, 1, (batch, s_q, heads, MLA_DIMS[1])
        page_arg = "kv_cache"
    else:
        if len(qa.shape) == 3:
            (batch, heads, dqk), s_q = qa.shape, 1
        else:
            batch, s_q, heads, dqk = qa.shape
        if dqk not in GQA_HEAD_DIMS:
            raise ValueError(f"q: head dim {dqk}; supported: {_join(GQA_HEAD_DIMS)}")
        ka = device_view(k_cache, "k_cache", ndim=4, device_id=dev)
        va = device_view(v_cache, "v_cache", ndim=4, device_id=dev)
        kv = cache_format(family, (ka, va), qa.dtype, scales or {"k_scale": None, "v_scale": None})
        if ka.shape != va.shape:
            raise ValueError(f"v_cache: shape {va.shape} must equal k_cache's {ka.shape}")
        _, _, hkv, dk = ka.shape
        if dk != dqk:
            raise ValueError(f"k_cache: head dim {dk} does not match q's {dqk}")
        if hkv < 1 or heads % hkv:
            raise ValueError(f"q: {heads} query heads is not a multiple of the {hkv} KV heads")
        group = heads // hkv
        if group not in GQA_GROUPS:
            raise ValueError(f"q: {heads} query heads over {hkv} KV heads is a group of {group}; "
                             f"supported {_join(GQA_GROUPS)}")
        if group * s_q > MAX_Q_ROWS:
            raise ValueError(f"q: group {group} x s_q {s_q} = {group * s_q} query rows per KV head; "
                             f"at most {MAX_Q_ROWS}")
        out_shape, page_arg = qa.shape, "k_cache"
    if not 1 <= s_q <= MAX_S_Q:
        raise ValueError(f"q: s_q={s_q} is outside the supported 1..{MAX_S_Q}")
    num_pages, page_size = ka.shape[0], ka.shape[1]
    if page_size not in PAGE_SIZES:
        raise ValueError(f"{page_arg}: page_size={page_size}; supported: {_join(PAGE_SIZES)}")
    bt = device_view(block_table, "block_table", dtype="int32", ndim=2, device_id=dev)
    sl = device_view(cache_seqlens, "cache_seqlens", dtype="int32", ndim=1, device_id=dev)
    if bt.shape[0] != batch:
        raise ValueError(f"block_table: batch {bt.shape[0]} does not match q's batch {batch}")
    if sl.shape[0] != batch:
        raise ValueError(f"cache_seqlens: batch {sl.shape[0]} does not match q's batch {batch}")
    lse_shape = (batch, heads, s_q)
    oa = la = None
    if out is not None:
        oa = device_view(out, "out", dtype=qa.dtype, device_id=dev)
        if oa.shape != tuple(out_shape):
            raise ValueError(f"out: shape must be {tuple(out_shape)}, got {oa.shape}")
    for a in (qa, oa):  # the kernels move 16-byte units of q's and out's rows (cp.async, vector and bulk stores)
        if a is not None and a.ptr % 16:
            raise ValueError(f"{a.name}: data pointer {a.ptr:#x} is not 16-byte aligned (the kernels move 16-byte "
                             f"units of its rows); pass a tensor whose storage starts on a 16-byte boundary")
    if lse is not None:
        la = device_view(lse, "lse", dtype="fp32", device_id=dev)
        if la.shape != lse_shape:
            raise ValueError(f"lse: shape must be {lse_shape}, got {la.shape}")
    shape = CallShape(family, dev, qa.dtype, batch, s_q, heads, hkv, dqk, page_size, num_pages, bt.shape[1],
                      tuple(out_shape), lse_shape, kv if kv.is_fp8 else None)
    return shape, (qa, ka, va, bt, sl, oa, la)


def check_ranges_on_host(shape: CallShape, bt: TensorArg, sl: TensorArg) -> None:
    """The debug mode's host-side range checks of cache_seqlens and the used block-table entries
    (copies both to the host: a synchronisation)."""
    import numpy as np

    lens, table = _to_host(sl), _to_host(bt)
    if lens is None or table is None:
        return
    cap = shape.max_pages * shape.page_size
    bad = np.nonzero((lens < 0) | (lens > cap))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"cache_seqlens[{i}]={int(lens[i])}: must be in 0..{cap} "
                         f"(block_table has {shape.max_pages} pages of {shape.page_size} tokens)")
    for b, n in enumerate(lens):
        used = table[b, : -(-int(n) // shape.page_size)]
        if used.size and (used.min() < 0 or used.max() >= shape.num_pages):
            raise ValueError(f"block_table[{b}]: pages used by its {int(n)} tokens must be in "
                             f"0..{shape.num_pages - 1}, found {int(used.min())}..{int(used.max())}")


def _to_host(t: TensorArg):
    mod = type(t.obj).__module__.split(".")[0]
    if mod == "torch":
        return t.obj.cpu().numpy()
    if mod == "cupy":
        return t.obj.get()
    return None
