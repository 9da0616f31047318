"""The high-level decode API: kvforge.mla_decode and kvforge.gqa_decode.

Each call checks every argument (before any launch), picks the variant for the shapes and the
device, compiles it on first use (through the cache), and launches the split plan, the main kernel
and, when sequences are split, the combine kernel on the caller's stream. The split count depends
on the batch, the heads and the SM count only, never on the lengths: a call can be captured in a
CUDA graph and replayed with new `cache_seqlens`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kvforge.codegen.decode import MAX_SPLITS, DecodeConfig
from kvforge.codegen.variant import Variant

from .compiler import compile
from .device import device_arch, sm_count
from .launch import LoadedKernel, load, resolve_stream
from .select import select_decode_config
from .tensors import TensorArg, device_view

MLA_DQK, MLA_DV = 576, 512
GQA_HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (16, 32, 64, 128)
MAX_S_Q = 8
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeKernels:
    variant: Variant
    plan: LoadedKernel
    main: LoadedKernel
    combine: LoadedKernel


@lru_cache(maxsize=None)
def decode_kernels(config: DecodeConfig, device_id: int = 0) -> DecodeKernels:
    """The variant's three kernels, compiled (via the cache) and loaded once per device."""
    variant = Variant(config)
    compiled = compile(variant)
    plan, main, combine = variant.kernels
    return DecodeKernels(variant, load(compiled, plan.symbol, 0, device_id),
                         load(compiled, main.symbol, main.dynamic_smem_bytes, device_id),
                         load(compiled, combine.symbol, 0, device_id))


# ---- allocation in the caller's framework -----------------------------------------------------
def _framework(obj) -> str:
    mod = type(obj).__module__.split(".")[0]
    return mod if mod in ("torch", "cupy") else "other"


def _empty(like, shape, dtype: str, device_id: int):
    kind = _framework(like)
    if kind == "torch":
        import torch

        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int32": torch.int32}[dtype]
        return torch.empty(shape, dtype=tdt, device=f"cuda:{device_id}")
    if kind == "cupy":
        import cupy

        if dtype == "bf16":
            raise TypeError("cupy has no bfloat16: pass `out` explicitly")
        with cupy.cuda.Device(device_id):
            return cupy.empty(shape, dtype={"fp16": "float16", "fp32": "float32", "int32": "int32"}[dtype])
    raise TypeError(f"cannot allocate for {type(like).__name__} inputs: pass out and lse explicitly "
                    "(kvforge allocates with torch or cupy only)")


def _default_stream(like, stream):
    if stream is not None:
        return stream
    kind = _framework(like)
    if kind == "torch":
        import torch

        return torch.cuda.current_stream().cuda_stream
    if kind == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return None


def _is_capturing(like) -> bool:
    if _framework(like) == "torch":
        import torch

        return torch.cuda.is_current_stream_capturing()
    return False


def _to_host(t: TensorArg) -> np.ndarray | None:
    kind = _framework(t.obj)
    if kind == "torch":
        return t.obj.cpu().numpy()
    if kind == "cupy":
        return t.obj.get()
    return None


# ---- argument checks --------------------------------------------------------------------------
def _check_common(q: TensorArg, block_table, cache_seqlens, batch: int, device_id: int):
    bt = device_view(block_table, "block_table", dtype="int32", ndim=2, device_id=device_id)
    sl = device_view(cache_seqlens, "cache_seqlens", dtype="int32", ndim=1, device_id=device_id)
    if bt.shape[0] != batch:
        raise ValueError(f"block_table: batch {bt.shape[0]} does not match q's batch {batch}")
    if sl.shape[0] != batch:
        raise ValueError(f"cache_seqlens: batch {sl.shape[0]} does not match q's batch {batch}")
    return bt, sl


def _check_lengths(sl: TensorArg, bt: TensorArg, num_pages: int, page_size: int) -> None:
    """Host-side range checks of cache_seqlens and the used block-table entries (one sync)."""
    lens = _to_host(sl)
    if lens is None:
        return
    cap = bt.shape[1] * page_size
    bad = np.nonzero((lens < 0) | (lens > cap))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"cache_seqlens[{i}]={int(lens[i])}: must be in 0..{cap} "
                         f"(block_table has {bt.shape[1]} pages of {page_size} tokens)")
    table = _to_host(bt)
    for b, n in enumerate(lens):
        used = table[b, : -(-int(n) // page_size)]
        if used.size and (used.min() < 0 or used.max() >= num_pages):
            raise ValueError(f"block_table[{b}]: pages used by its {int(n)} tokens must be in 0..{num_pages - 1}, "
                             f"found {int(used.min())}..{int(used.max())}")


def _check_out(out, lse, q: TensorArg, out_shape, lse_shape, device_id):
    if out is None:
        out = _empty(q.obj, out_shape, q.dtype, device_id)
    o = device_view(out, "out", dtype=q.dtype, device_id=device_id)
    if o.shape != tuple(out_shape):
        raise ValueError(f"out: shape must be {tuple(out_shape)}, got {o.shape}")
    if lse is None:
        lse = _empty(q.obj, lse_shape, "fp32", device_id)
    ls = device_view(lse, "lse", dtype="fp32", device_id=device_id)
    if ls.shape != tuple(lse_shape):
        raise ValueError(f"lse: shape must be {tuple(lse_shape)}, got {ls.shape}")
    return out, o, lse, ls


def _num_splits(ctas: int, ctas_per_sm: int, device_id: int) -> int:
    """Splits per sequence so that the grid fills the SMs: a function of shapes and the SM count."""
    return max(1, min(MAX_SPLITS, (sm_count(device_id) * ctas_per_sm) // max(ctas, 1)))


def _launch(k: DecodeKernels, *, q, kcache, vcache, bt, sl, out, lse, batch, s_q, num_q_heads, num_kv_heads,
            head_blocks, softmax_scale, causal, stream, device_id):
    cfg = k.variant.config
    main = k.variant.main_kernel
    splits = _num_splits(head_blocks * batch, cfg.ctas_per_sm, device_id)
    like = q.obj
    plan = _empty(like, (batch, 2), "int32", device_id)
    plan_ptr = device_view(plan, "split_plan", device_id=device_id).ptr
    part_o_ptr = part_lse_ptr = 0
    if splits > 1:
        part_o = _empty(like, (batch * splits * s_q * num_q_heads * cfg.head_dim_v,), "fp32", device_id)
        part_lse = _empty(like, (batch * splits * s_q * num_q_heads,), "fp32", device_id)
        part_o_ptr, part_lse_ptr = (device_view(x, "workspace", device_id=device_id).ptr for x in (part_o, part_lse))
    st = resolve_stream(_default_stream(like, stream), device_id)
    min_keys = cfg.min_keys_per_split
    k.plan.launch((math.ceil(batch / 256), 1, 1), (256, 1, 1), 0, st, sl.ptr, plan_ptr, np.int32(batch),
                  np.int32(splits), np.int32(min_keys))
    k.main.launch((head_blocks, batch, splits), main.block, main.dynamic_smem_bytes, st,
                  q.ptr, kcache.ptr, vcache.ptr, bt.ptr, sl.ptr, plan_ptr, out.ptr, lse.ptr, part_o_ptr, part_lse_ptr,
                  np.int32(s_q), np.int32(num_q_heads), np.int32(num_kv_heads), np.int32(bt.shape[1]),
                  np.int32(splits), np.float32(softmax_scale * LOG2E), np.int32(1 if causal else 0))
    if splits > 1:
        comb = k.variant.kernels[2]
        k.combine.launch((num_q_heads, s_q, batch), comb.block, 0, st, part_o_ptr, part_lse_ptr, plan_ptr, out.ptr,
                         lse.ptr, np.int32(s_q), np.int32(num_q_heads), np.int32(splits))
    return splits


def _check_config(cfg, family, dev, dtype, page_size, head_dim, s_q, group) -> None:
    """A pinned config must match the call's shapes and run on the device."""
    from .device import runs_on

    want = {"family": family, "q_dtype": dtype, "kv_dtype": dtype, "page_size": page_size,
            "head_dim_qk": head_dim, "backend": "sm80"}
    if group is not None:
        want["heads_per_cta"] = group
    for field, value in want.items():
        if getattr(cfg, field) != value:
            raise ValueError(f"config.{field}={getattr(cfg, field)!r} does not fit this call, which needs {value!r}")
    if cfg.max_s_q < s_q:
        raise ValueError(f"config.max_s_q={cfg.max_s_q} is below this call's s_q={s_q}")
    if not runs_on(cfg.arch, device_arch(dev)):
        raise ValueError(f"config.arch={cfg.arch!r} does not run on this {device_arch(dev)} device")


def _check_kv_dtype(t: TensorArg, q_dtype: str) -> None:
    if t.dtype != q_dtype:
        if t.dtype == "fp8_e4m3":
            raise TypeError(f"{t.name}: fp8_e4m3 KV needs the sm90 backend, which has not landed; use bf16/fp16")
        raise TypeError(f"{t.name}: dtype must match q ({q_dtype}), got {t.dtype}")


def _scalar_scale(name: str, value, kv_dtype: str) -> None:
    if value is not None:
        raise ValueError(f"{name}: scales apply to fp8_e4m3 KV caches only; this cache is {kv_dtype} "
                         "(fp8 KV arrives with the sm90 backend)")


def _checked_call(family, q, qa: TensorArg, kc: TensorArg, vc: TensorArg, block_table, cache_seqlens, out, lse, *,
                  out_shape, lse_shape, head_dim, select_heads, num_q_heads, num_kv_heads, softmax_scale, causal,
                  stream, check_inputs, config):
    """The part both families share once their own shapes are checked: the common arguments,
    outputs and lengths, the variant, and the launch."""
    dev, batch = qa.device_id, qa.shape[0]
    s_q = 1 if len(qa.shape) == 3 else qa.shape[1]
    num_pages, page_size = kc.shape[0], kc.shape[1]
    bt, sl = _check_common(qa, block_table, cache_seqlens, batch, dev)
    out, oa, lse, la = _check_out(out, lse, qa, out_shape, lse_shape, dev)
    if check_inputs and not _is_capturing(q):
        _check_lengths(sl, bt, num_pages, page_size)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    if _on_rocm():
        return _hip_call(family, qa, kc, vc, bt, sl, oa, la, out, lse, select_heads=select_heads, head_dim=head_dim,
                         num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, scale=scale, causal=causal and s_q > 1,
                         stream=stream, config=config)
    if config is None:
        kernels = _selected_kernels(family, qa.dtype, page_size, select_heads, head_dim, s_q, dev)
    else:
        _check_config(config, family, dev, qa.dtype, page_size, head_dim, s_q,
                      select_heads if family == "gqa_decode" else None)
        kernels = decode_kernels(config, dev)
    cfg = kernels.variant.config
    head_blocks = -(-num_q_heads // cfg.heads_per_cta) if family == "mla_decode" else num_kv_heads
    _launch(kernels, q=qa, kcache=kc, vcache=vc, bt=bt, sl=sl, out=oa, lse=la, batch=batch,
            s_q=s_q, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_blocks=head_blocks,
            softmax_scale=scale, causal=causal and s_q > 1, stream=stream, device_id=dev)
    return out, lse


@lru_cache(maxsize=None)
def _selected_kernels(family, dtype, page_size, heads, head_dim, s_q, device_id) -> DecodeKernels:
    """The built-in choice for these shapes, compiled and loaded (one dict lookup per call after the first)."""
    cfg = select_decode_config(family, device_arch(device_id), dtype, page_size, heads=heads, head_dim=head_dim,
                               s_q=s_q)
    return decode_kernels(cfg, device_id)


@lru_cache(maxsize=1)
def _on_rocm() -> bool:
    from .device import cuda_device_count
    from .hip_launch import rocm_device_count

    return cuda_device_count() == 0 and rocm_device_count() > 0


def _hip_call(family, qa, kc, vc, bt, sl, oa, la, out, lse, *, select_heads, head_dim, num_q_heads, num_kv_heads,
              scale, causal, stream, config):
    """The same call on a ROCm device: cdna variant, hiprtc through the cache, hip-python launches.
    Never run here (no AMD GPU); compile-verified in CI."""
    from kvforge.codegen.variant import Variant

    from .hip_compiler import compile_hip
    from .hip_launch import load_hip, rocm_arch
    from .select import select_cdna_config

    batch = qa.shape[0]
    s_q = 1 if len(qa.shape) == 3 else qa.shape[1]
    cfg = config or select_cdna_config(family, rocm_arch(qa.device_id), qa.dtype, kc.shape[1], heads=select_heads,
                                       head_dim=head_dim, s_q=s_q)
    variant = Variant(cfg)
    compiled = compile_hip(variant)
    plan_k, main_k, comb_k = (load_hip(compiled, k.symbol) for k in variant.kernels)
    head_blocks = -(-num_q_heads // cfg.heads_per_cta) if family == "mla_decode" else num_kv_heads
    splits = 1 if head_blocks * batch >= 64 else max(1, min(MAX_SPLITS, 128 // (head_blocks * batch)))
    like = qa.obj
    plan = _empty(like, (batch, 2), "int32", qa.device_id)
    part_o = _empty(like, (max(1, batch * splits * s_q * num_q_heads * cfg.head_dim_v),), "fp32", qa.device_id)
    part_lse = _empty(like, (max(1, batch * splits * s_q * num_q_heads),), "fp32", qa.device_id)
    st = _default_stream(like, stream)
    ptr = lambda t: ("ptr", int(t.data_ptr()))  # noqa: E731 - torch on ROCm
    plan_k.launch((-(-batch // 256), 1, 1), (256, 1, 1), st, ("ptr", sl.ptr), ptr(plan), batch, splits,
                  cfg.min_keys_per_split)
    main_k.launch((head_blocks, batch, splits), (cfg.threads, 1, 1), st, ("ptr", qa.ptr), ("ptr", kc.ptr),
                  ("ptr", vc.ptr), ("ptr", bt.ptr), ("ptr", sl.ptr), ptr(plan), ("ptr", oa.ptr), ("ptr", la.ptr),
                  ptr(part_o), ptr(part_lse), s_q, num_q_heads, num_kv_heads, bt.shape[1], splits, float(scale * LOG2E),
                  1 if causal else 0)
    if splits > 1:
        comb_k.launch((num_q_heads, s_q, batch), (256, 1, 1), st, ptr(part_o), ptr(part_lse), ptr(plan),
                      ("ptr", oa.ptr), ("ptr", la.ptr), s_q, num_q_heads, splits)
    return out, lse


def mla_decode(q, kv_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False, kv_scale=None,
               out=None, lse=None, stream=None, check_inputs: bool = True, config: DecodeConfig | None = None):
    """DeepSeek-style MLA decode over a paged latent cache.

    q [B, s_q, H, 576] bf16/fp16; kv_cache [num_pages, page_size, 576] (or [.., 1, 576]), same dtype;
    block_table [B, max_pages] int32; cache_seqlens [B] int32. Returns (out [B, s_q, H, 512],
    lse [B, H, s_q] fp32, natural log). `check_inputs=False` skips the host-side range check of the
    lengths and block table (it syncs; it is skipped automatically during graph capture).
    `config` pins the variant instead of the built-in choice; it must fit the shapes.
    """
    qa = device_view(q, "q", dtype=("bf16", "fp16"), ndim=4)
    dev = qa.device_id
    batch, s_q, heads, dqk = qa.shape
    if dqk != MLA_DQK:
        raise ValueError(f"q: last dimension must be {MLA_DQK} (512 latent + 64 rope), got {dqk}")
    if not 1 <= s_q <= MAX_S_Q:
        raise ValueError(f"q: s_q={s_q} is outside the supported 1..{MAX_S_Q}")
    if not 1 <= heads <= 128:
        raise ValueError(f"q: {heads} heads; MLA decode supports 1..128")
    kv = device_view(kv_cache, "kv_cache", ndim=(3, 4), device_id=dev)
    _check_kv_dtype(kv, qa.dtype)
    _scalar_scale("kv_scale", kv_scale, kv.dtype)
    if len(kv.shape) == 4 and kv.shape[2] != 1:
        raise ValueError(f"kv_cache: a 4-D MLA cache must have h_kv=1, got shape {kv.shape}")
    if kv.shape[-1] != MLA_DQK:
        raise ValueError(f"kv_cache: last dimension must be {MLA_DQK}, got shape {kv.shape}")
    page_size = kv.shape[1]
    if page_size not in PAGE_SIZES:
        raise ValueError(f"kv_cache: page_size={page_size}; supported: {', '.join(map(str, PAGE_SIZES))}")
    return _checked_call("mla_decode", q, qa, kv, kv, block_table, cache_seqlens, out, lse,
                         out_shape=(batch, s_q, heads, MLA_DV), lse_shape=(batch, heads, s_q), head_dim=MLA_DQK,
                         select_heads=heads, num_q_heads=heads, num_kv_heads=1, softmax_scale=softmax_scale,
                         causal=causal, stream=stream, check_inputs=check_inputs, config=config)


def gqa_decode(q, k_cache, v_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False, k_scale=None,
               v_scale=None, out=None, lse=None, stream=None, check_inputs: bool = True,
               config: DecodeConfig | None = None):
    """MHA/GQA/MQA decode over paged K and V caches.

    q [B, Hq, D] or [B, s_q, Hq, D] bf16/fp16 with D in {64, 128, 256}; k_cache, v_cache
    [num_pages, page_size, Hkv, D], same dtype, Hq % Hkv == 0 and Hq / Hkv in {1, 2, 4, 8, 16};
    block_table [B, max_pages] int32; cache_seqlens [B] int32. Returns (out shaped like q,
    lse [B, Hq, s_q] fp32, natural log). `check_inputs` and `config` as for mla_decode.
    """
    qa = device_view(q, "q", dtype=("bf16", "fp16"), ndim=(3, 4))
    dev = qa.device_id
    if len(qa.shape) == 3:
        batch, hq, d = qa.shape
        s_q = 1
    else:
        batch, s_q, hq, d = qa.shape
    if d not in GQA_HEAD_DIMS:
        raise ValueError(f"q: head dim {d}; supported: {', '.join(map(str, GQA_HEAD_DIMS))}")
    if not 1 <= s_q <= MAX_S_Q:
        raise ValueError(f"q: s_q={s_q} is outside the supported 1..{MAX_S_Q}")
    ka = device_view(k_cache, "k_cache", ndim=4, device_id=dev)
    va = device_view(v_cache, "v_cache", ndim=4, device_id=dev)
    for t in (ka, va):
        _check_kv_dtype(t, qa.dtype)
    _scalar_scale("k_scale", k_scale, ka.dtype)
    _scalar_scale("v_scale", v_scale, va.dtype)
    if ka.shape != va.shape:
        raise ValueError(f"v_cache: shape {va.shape} must equal k_cache's {ka.shape}")
    _, page_size, hkv, dk = ka.shape
    if dk != d:
        raise ValueError(f"k_cache: head dim {dk} does not match q's {d}")
    if page_size not in PAGE_SIZES:
        raise ValueError(f"k_cache: page_size={page_size}; supported: {', '.join(map(str, PAGE_SIZES))}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"q: {hq} query heads is not a multiple of the {hkv} KV heads")
    group = hq // hkv
    if group not in (1, 2, 4, 8, 16):
        raise ValueError(f"q: {hq} query heads over {hkv} KV heads is a group of {group}; supported 1, 2, 4, 8, 16")
    if group * s_q > 128:
        raise ValueError(f"q: group {group} x s_q {s_q} = {group * s_q} query rows per KV head; at most 128")
    return _checked_call("gqa_decode", q, qa, ka, va, block_table, cache_seqlens, out, lse, out_shape=qa.shape,
                         lse_shape=(batch, hq, s_q), head_dim=d, select_heads=group, num_q_heads=hq, num_kv_heads=hkv,
                         softmax_scale=softmax_scale, causal=causal, stream=stream, check_inputs=check_inputs,
                         config=config)
