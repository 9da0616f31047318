"""The decode API: the plan/run objects `MLADecode` / `GQADecode`, and the functions
`kvforge.mla_decode` / `kvforge.gqa_decode`, a thin layer over cached plans.

A call checks its arguments on the host (shapes, dtypes, devices, strides; cached per tensor
signature for torch), then launches the main kernel and, when sequences are split, the combine
kernel on the caller's stream (split partials go to a workspace kept per plan and stream). It
never synchronises and never copies to the host: the lengths
and the block table are checked on the device (a sequence that points outside the cache gets NaN
rows and an entry in the error record that `kvforge.check_errors()` raises). `check_inputs=True`
(or KVFORGE_DEBUG=1) adds the old host-side range checks, which synchronise. The split count
depends on the batch, the heads and the SM count only, so a call can be captured in a CUDA graph
and replayed with new `cache_seqlens`.
"""
from __future__ import annotations

import gc
import operator
import os
import threading
import weakref
from contextlib import contextmanager
from functools import lru_cache

from kvforge.codegen import policy
from kvforge.codegen.decode import DecodeConfig
from kvforge.codegen.plan_args import MLA_PYTHON_NAMES, PYTHON_NAMES, check_fp8_arch, check_plan_args
from kvforge.codegen.variant import Variant

from . import torch_ops
from .call_args import CallShape, check_ranges_on_host, validate
from .call_args import scale_log2 as softmax_scale_log2
from .kv_format import KVFormat, planned_format, scale_values
from .device import device_arch, on_device, sm_count
from .launch import LaunchError
from .plan import WORKSPACE_PREFIX_BYTES, DecodePlan, workspace_floats_for


# ---- plans ------------------------------------------------------------------------------------
# KVFORGE_BACKEND=sm80 (or sm90) forces the backend of the built-in choice (read once, at import);
# unset, the measured preference per shape (codegen/select.py, preferred_backend).
_BACKEND = os.environ.get("KVFORGE_BACKEND") or None
@lru_cache(maxsize=None)
def _on_rocm() -> bool:
    from .device import cuda_device_count
    from .hip_launch import rocm_device_count

    return cuda_device_count() == 0 and rocm_device_count() > 0


def select_config(family: str, dtype: str, page_size: int, heads: int, head_dim: int, s_q: int,
                  device_id: int, kv: KVFormat | None = None, batch: int | None = None,
                  long_chunks: bool = False) -> DecodeConfig:
    """The built-in choice for these shapes on the device (sm80 backend on CUDA, cdna on ROCm).
    `kv`: an fp8 cache's format (None: a 16-bit cache of `dtype`). `batch`: the launch's sequences
    (None: unknown), which tells how many chunks the split plan cuts each into (the sm90 MLA schedule).
    `long_chunks`: a caller's max_seq_len says the split chunks are long (`_long_chunks`)."""
    from .select import select_cdna_config, select_for_launch

    fp8 = kv is not None and kv.is_fp8
    if _on_rocm():
        from .hip_launch import rocm_arch

        arch = rocm_arch(device_id)
        if fp8:
            check_fp8_arch(arch, "kv_cache", "this device is")
        return select_cdna_config(family, arch, dtype, page_size, heads=heads, head_dim=head_dim, s_q=s_q)
    arch = device_arch(device_id)
    if fp8:
        check_fp8_arch(arch, "kv_cache", "this device is")
    return select_for_launch(family, arch, 0 if batch is None else sm_count(device_id), dtype, page_size,
                             heads=heads, head_dim=head_dim, s_q=s_q, batch=batch, long_chunks=long_chunks,
                             scale_mode=kv.scale_mode if fp8 else "none",
                             scale_block_size=kv.scale_block_size if fp8 else None, backend=_BACKEND)


def _long_chunks(q, max_seq_len) -> bool:
    """mla_decode's `max_seq_len` hint (the longest sequence of the call, known on the host: no sync): whether the
    sm90 MLA kernel's split plan would give that sequence long chunks (`select.sm90_long_chunks`), which makes
    the seesaw schedule the faster one. A hint: never checked against cache_seqlens; a wrong one costs speed
    only. False off sm_90 and where q does not look like an MLA query (validation reports that)."""
    try:
        n = -1 if isinstance(max_seq_len, bool) else operator.index(max_seq_len)
    except TypeError:
        n = -1
    if n < 0:
        raise ValueError(f"max_seq_len={max_seq_len!r}: expected a non-negative int (the longest sequence of the "
                         "call, a hint for the kernel's schedule), or None")
    shape = getattr(q, "shape", None)
    if shape is None or len(shape) != 4:
        return False
    dev = getattr(q, "device", None)
    dev = getattr(dev, "index", None) if hasattr(dev, "index") else getattr(dev, "id", None)
    least = _least_long_seq_len(int(shape[0]), int(shape[2]), int(shape[1]), int(dev or 0))
    return 0 <= least <= n


@lru_cache(maxsize=4096)
def _least_long_seq_len(batch: int, heads: int, s_q: int, device_id: int) -> int:
    """The shortest max_seq_len `_long_chunks` takes as long for this launch shape (-1: none, e.g. unsplit,
    one head block, not sm_90): the rule is monotone in the length, so a binary search finds it once."""
    if _on_rocm() or not 1 <= s_q <= policy.MAX_S_Q or heads < 1 or batch < 1 or device_arch(device_id) != "sm_90":
        return -1
    from .select import sm90_long_chunks

    sms = sm_count(device_id)
    lo, hi = 0, 1 << 31
    if not sm90_long_chunks(hi, batch, heads, s_q, sms):
        return -1
    while lo < hi:
        mid = (lo + hi) // 2
        if sm90_long_chunks(mid, batch, heads, s_q, sms):
            hi = mid
        else:
            lo = mid + 1
    return lo


_plans: dict[tuple, DecodePlan] = {}
_plans_lock = threading.Lock()


def plan_for(config: DecodeConfig, device_id: int) -> DecodePlan:
    """The variant's plan on the device: compiled (through the cache) and loaded once. The cold
    path runs with Python's cycle collector paused: it allocates enough to trigger a collection,
    and a collection inside a caller's global-mode graph capture may destroy unrelated dead CUDA
    objects (a CUDA graph, a stream), which invalidates that capture."""
    key = (config, device_id)
    plan = _plans.get(key)
    if plan is None:
        with _plans_lock, _gc_paused():
            plan = _plans.get(key)
            if plan is None:
                plan = _plans[key] = DecodePlan(Variant(config), device_id)
    return plan


@contextmanager
def _gc_paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _check_config(cfg: DecodeConfig, shape: CallShape) -> None:
    """A pinned config must match the call's shapes and run on the device."""
    from .device import runs_on

    kv = shape.kv_format
    want = {"family": shape.family, "q_dtype": shape.dtype, "kv_dtype": kv.kv_dtype, "scale_mode": kv.scale_mode,
            "scale_block_size": kv.scale_block_size, "page_size": shape.page_size, "head_dim_qk": shape.head_dim}
    if shape.family == "gqa_decode":
        want["heads_per_cta"] = shape.group
    for field, value in want.items():
        if getattr(cfg, field) != value:
            raise ValueError(f"config.{field}={getattr(cfg, field)!r} does not fit this call, which needs {value!r}")
    if cfg.max_s_q < shape.s_q:
        raise ValueError(f"config.max_s_q={cfg.max_s_q} is below this call's s_q={shape.s_q}")
    if _on_rocm():
        from .hip_launch import rocm_arch

        if cfg.arch != rocm_arch(shape.device_id):
            raise ValueError(f"config.arch={cfg.arch!r} does not run on this {rocm_arch(shape.device_id)} device")
    elif cfg.backend == "cdna" or not runs_on(cfg.arch, device_arch(shape.device_id)):
        raise ValueError(f"config.arch={cfg.arch!r} does not run on this {device_arch(shape.device_id)} device")


# ---- the frameworks' tensors, streams and devices ------------------------------------------------
def _framework(obj) -> str:
    mod = type(obj).__module__.split(".")[0]
    return mod if mod in ("torch", "cupy") else "other"


def _empty(like, shape, dtype: str, device_id: int):
    kind = _framework(like)
    if kind == "torch":
        import torch

        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        return torch.empty(shape, dtype=tdt, device=like.device)
    if kind == "cupy":
        import cupy

        if dtype == "bf16":
            raise TypeError("cupy has no bfloat16: pass `out` explicitly")
        with cupy.cuda.Device(device_id):
            return cupy.empty(shape, dtype={"fp16": "float16", "fp32": "float32"}[dtype])
    raise TypeError(f"cannot allocate for {type(like).__name__} inputs: pass out and lse explicitly "
                    "(kvforge allocates with torch or cupy only)")


def _ptr(obj) -> int:
    """A tensor's device address (torch directly; others through their DLPack/CAI view)."""
    if _framework(obj) == "torch":
        return obj.data_ptr()
    from .tensors import device_view

    return device_view(obj, "tensor", contiguous=False).ptr


def _stream_handle(stream, like, device_id: int) -> int:
    """The raw stream handle a call launches on: `stream` as given, else the framework's current
    stream of the tensors' device (torch, cupy), else the device's default stream."""
    if stream is None:
        kind = _framework(like)
        if kind == "torch":
            import torch

            try:
                return torch._C._cuda_getCurrentRawStream(device_id)
            except AttributeError:  # older torch
                return torch.cuda.current_stream(device_id).cuda_stream
        if kind == "cupy":
            import cupy

            with cupy.cuda.Device(device_id):
                return cupy.cuda.get_current_stream().ptr
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "handle"):  # cuda.core Stream
        return int(stream.handle)
    raise TypeError(f"stream: expected None, an int handle, a torch/cupy/cuda.core stream or an object with "
                    f"__cuda_stream__, got {type(stream).__name__}")


def _is_capturing(like, stream_handle: int) -> bool:
    from cuda.bindings import driver

    err, status = driver.cuStreamIsCapturing(stream_handle)
    return err == driver.CUresult.CUDA_SUCCESS and status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


# ---- one call ----------------------------------------------------------------------------------
_DEBUG = os.environ.get("KVFORGE_DEBUG") == "1"  # read once, at import
_torch = None  # the torch module, bound when the first torch tensor arrives


def _bind_torch():
    global _torch
    import torch

    _torch = torch
    return torch


class _Prepared:
    """A validated call signature: its shape, plan, launch sizes and what the hot path allocates."""

    __slots__ = ("shape", "plan", "geometry", "ws_floats", "scale_log2", "sizes", "torch_device", "out_dtype")

    def __init__(self, shape: CallShape, plan: DecodePlan) -> None:
        self.shape, self.plan = shape, plan
        self.geometry = plan.geometry(shape.batch, shape.s_q, shape.num_q_heads, shape.num_kv_heads)
        self.ws_floats = plan.workspace_floats(shape.batch, shape.s_q, shape.num_q_heads, self.geometry[0])
        self.scale_log2 = shape.default_scale * policy.LOG2E  # exp2 with the scale folded in
        self.sizes = (shape.batch, shape.s_q, shape.num_q_heads, shape.num_kv_heads, shape.num_pages,
                      shape.max_pages, self.geometry)
        self.torch_device = self.out_dtype = None
        if _torch is not None:
            self.torch_device = _torch.device("cuda", shape.device_id)
            self.out_dtype = {"bf16": _torch.bfloat16, "fp16": _torch.float16}[shape.dtype]


def _torch_facts(t):
    return (t.dtype, t.shape, t.get_device(), t.is_contiguous())


def _scale_facts(x):
    """A scale argument's part of a call signature: its kind, and a tensor's facts."""
    if x is None or isinstance(x, (int, float)):
        return type(x)
    return _torch_facts(x)


class _Runner:
    """The call path shared by the functions and the plan objects of one family."""

    MAX_SIGNATURES = 256

    def __init__(self, family: str) -> None:
        self.family = family
        self._seen: dict[tuple, _Prepared] = {}

    def _prepare(self, q, k, v, bt, sl, out, lse, plan_source, sig, scales):
        """The cold path of a new signature (checks, variant choice, compile and load): run with the
        cycle collector paused (see plan_for), so that a first call inside a caller's capture does
        not set off a collection of unrelated dead CUDA objects there."""
        with _gc_paused():
            shape, views = validate(self.family, q, k, v, bt, sl, out, lse, scales)
            prepared = _Prepared(shape, plan_source.plan(shape))
        if sig is not None and len(self._seen) < self.MAX_SIGNATURES:
            self._seen[sig] = prepared
        return prepared, views

    def call(self, q, k, v, bt, sl, out, lse, softmax_scale, causal, stream, check_inputs, plan_source,
             workspace=None, scales=None):
        """`scales`: None, or the scale arguments by name ({'kv_scale': ..} or {'k_scale': .., 'v_scale': ..})."""
        T = _torch
        if T is None and type(q).__module__.startswith("torch"):
            T = _bind_torch()
        if T is not None and isinstance(q, T.Tensor):
            return self._torch_call(T, q, k, v, bt, sl, out, lse, softmax_scale, causal, stream, check_inputs,
                                    plan_source, workspace, scales)
        return self._generic_call(q, k, v, bt, sl, out, lse, softmax_scale, causal, stream, check_inputs,
                                  plan_source, workspace, scales)

    @staticmethod
    def _scale_args(plan, scales):
        """The scale arguments of an fp8 kernel (None for a 16-bit one). The packed fp8_ds_mla layout
        passes none: its kernel reads the scales in the tokens."""
        if not plan.takes_scales:
            return None
        if scales is None:
            return scale_values(None, None)
        vals = tuple(scales.values())
        return scale_values(vals[0], vals[-1])

    def _torch_call(self, T, q, k, v, bt, sl, out, lse, softmax_scale, causal, stream, check_inputs, plan_source,
                    workspace, scales):
        """The hot path for torch tensors: one tuple of tensor facts decides whether the checks ran."""
        try:
            q_ptr = q.data_ptr()
            sig = (plan_source.key, _torch_facts(q), _torch_facts(k), None if v is k else _torch_facts(v),
                   _torch_facts(bt), _torch_facts(sl), None if out is None else _torch_facts(out),
                   None if lse is None else _torch_facts(lse),
                   None if scales is None else tuple(_scale_facts(x) for x in scales.values()),
                   # q's and out's 16-byte alignment (validate's check): a shifted view is a new signature
                   q_ptr & 15, None if out is None else out.data_ptr() & 15)
        except (AttributeError, TypeError):  # an argument that is not a torch tensor: full checks below
            sig = q_ptr = None
        prep = self._seen.get(sig) if sig is not None else None
        views = None
        if prep is None:
            prep, views = self._prepare(q, k, v, bt, sl, out, lse, plan_source, sig, scales)
        shape = prep.shape
        dev = shape.device_id
        if out is None:
            out = T.empty(shape.out_shape, dtype=prep.out_dtype, device=prep.torch_device)
        if lse is None:
            lse = T.empty(shape.lse_shape, dtype=T.float32, device=prep.torch_device)
        handle = T._C._cuda_getCurrentRawStream(dev) if stream is None else _stream_handle(stream, q, dev)
        if check_inputs or (check_inputs is None and _DEBUG):
            self._debug_checks(prep, views, q, k, v, bt, sl, out, lse, handle, scales)
        ws = self._workspace(prep, workspace, handle, q) if prep.ws_floats else 0
        scale_log2 = softmax_scale_log2(softmax_scale, prep.scale_log2)
        ptrs = (q.data_ptr() if q_ptr is None else q_ptr, k.data_ptr(), v.data_ptr(), bt.data_ptr(), sl.data_ptr(),
                out.data_ptr(), lse.data_ptr())
        causal_flag = 1 if causal and shape.s_q > 1 else 0
        kv_scales = self._scale_args(prep.plan, scales)
        plan = prep.plan
        if plan.launcher.platform == "cuda" and T._C._cuda_getDevice() != dev:
            with on_device(dev):  # the tensors' device, whatever the caller's current one is
                plan.launch_packed(prep.sizes, ptrs, ws, scale_log2, causal_flag, handle, kv_scales)
            return out, lse
        try:
            plan.launch_packed(prep.sizes, ptrs, ws, scale_log2, causal_flag, handle, kv_scales)
        except LaunchError as err:  # a thread that never made a context current (torch binds one lazily)
            if "INVALID_CONTEXT" not in str(err):
                raise
            with on_device(dev):
                plan.launch_packed(prep.sizes, ptrs, ws, scale_log2, causal_flag, handle, kv_scales)
        return out, lse

    def _generic_call(self, q, k, v, bt, sl, out, lse, softmax_scale, causal, stream, check_inputs, plan_source,
                      workspace, scales):
        """DLPack / __cuda_array_interface__ tensors (cupy, ...): full checks every call."""
        prep, views = self._prepare(q, k, v, bt, sl, out, lse, plan_source, None, scales)
        shape = prep.shape
        dev = shape.device_id
        if out is None:
            out = _empty(q, shape.out_shape, shape.dtype, dev)
        if lse is None:
            lse = _empty(q, shape.lse_shape, "fp32", dev)
        handle = _stream_handle(stream, q, dev)
        if check_inputs or (check_inputs is None and _DEBUG):
            self._debug_checks(prep, views, q, k, v, bt, sl, out, lse, handle, scales)
        ws = self._workspace(prep, workspace, handle, q) if prep.ws_floats else 0
        scale_log2 = softmax_scale_log2(softmax_scale, prep.scale_log2)
        ptrs = tuple(_ptr(x) for x in (q, k, v, bt, sl, out, lse))
        causal_flag = 1 if causal and shape.s_q > 1 else 0
        kv_scales = self._scale_args(prep.plan, scales)
        if prep.plan.launcher.platform == "cuda":
            with on_device(dev):
                prep.plan.launch_packed(prep.sizes, ptrs, ws, scale_log2, causal_flag, handle, kv_scales)
        else:
            prep.plan.launch_packed(prep.sizes, ptrs, ws, scale_log2, causal_flag, handle, kv_scales)
        return out, lse

    def _debug_checks(self, prep, views, q, k, v, bt, sl, out, lse, handle, scales=None) -> None:
        """The debug mode's host-side range checks (they synchronise; skipped while capturing)."""
        if views is None:
            _, views = validate(self.family, q, k, v, bt, sl, out, lse, scales)
        if not _is_capturing(q, handle):
            check_ranges_on_host(prep.shape, views[3], views[4])

    @staticmethod
    def _workspace(prep, workspace, handle, like) -> int:
        if workspace is not None:  # a plan object's own
            return workspace(prep.ws_floats)
        if prep.plan.launcher.platform == "cuda":
            s = prep.shape
            return prep.plan.stream_workspace(handle, s.s_q, s.num_q_heads, s.num_kv_heads)
        return _ptr(_empty(like, (prep.ws_floats,), "fp32", prep.shape.device_id))


class _SelectedPlans:
    """The functions' plan source: the built-in choice (or a pinned config) per shape class."""

    def __init__(self, config: DecodeConfig | None, long_chunks: bool = False) -> None:
        self.config = config
        self.long_chunks = long_chunks
        self.key = "long-chunks" if long_chunks else config

    def plan(self, shape: CallShape) -> DecodePlan:
        if self.config is not None:
            _check_config(self.config, shape)
            return plan_for(self.config, shape.device_id)
        cfg = select_config(shape.family, shape.dtype, shape.page_size, shape.group, shape.head_dim, shape.s_q,
                            shape.device_id, shape.kv, shape.batch, self.long_chunks)
        return plan_for(cfg, shape.device_id)


_MLA, _GQA = _Runner("mla_decode"), _Runner("gqa_decode")
_DEFAULT_PLANS = _SelectedPlans(None)
_LONG_CHUNK_PLANS = _SelectedPlans(None, long_chunks=True)  # mla_decode's max_seq_len says: long split chunks


@lru_cache(maxsize=64)
def _pinned(config: DecodeConfig) -> _SelectedPlans:
    return _SelectedPlans(config)


def _mla_decode_impl(q, kv_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False, kv_scale=None,
                     out=None, lse=None, stream=None, check_inputs=None, config=None):
    return _MLA.call(q, kv_cache, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream,
                     check_inputs, _DEFAULT_PLANS if config is None else _pinned(config), None,
                     None if kv_scale is None else {"kv_scale": kv_scale})


def _gqa_decode_impl(q, k_cache, v_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False,
                     k_scale=None, v_scale=None, out=None, lse=None, stream=None, check_inputs=None, config=None):
    return _GQA.call(q, k_cache, v_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream,
                     check_inputs, _DEFAULT_PLANS if config is None else _pinned(config), None,
                     None if k_scale is None and v_scale is None else {"k_scale": k_scale, "v_scale": v_scale})


def mla_decode(q, kv_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False, kv_scale=None,
               out=None, lse=None, stream=None, check_inputs=None, config: DecodeConfig | None = None,
               max_seq_len: int | None = None):
    """DeepSeek-style MLA decode over a paged latent cache.

    q [B, s_q, H, 576] bf16/fp16; kv_cache [num_pages, page_size, 576] (or [.., 1, 576]), same dtype,
    or an fp8 cache (docs/fp8.md): float8_e4m3fn with `kv_scale` (a float, a 1-element fp32 device
    tensor, or block scales [num_pages, page_size, ceil(576 / block)]), or the packed uint8
    fp8_ds_mla cache [num_pages, page_size, 656] (no kv_scale; `kvforge.quantize_kv` makes each);
    block_table [B, max_pages] int32; cache_seqlens [B] int32. Returns (out [B, s_q, H, 512],
    lse [B, H, s_q] fp32, natural log). Never synchronises: out-of-range lengths or pages give
    NaN rows and an error `kvforge.check_errors()` raises. `check_inputs=True` (or KVFORGE_DEBUG=1)
    also checks them on the host first (a sync; skipped during graph capture). `config` pins the
    variant instead of the built-in choice; it must fit the shapes. `max_seq_len`: optionally, the longest
    sequence of the call as a host int (as an engine's metadata has it; a hint, never checked against
    cache_seqlens): on sm_90 with 128 heads, sequences the split plan cuts into chunks of 2048+ keys then
    run the seesaw schedule, 2-6% faster there (bench/RESULTS.md); a wrong hint costs speed only.
    """
    if torch_ops.is_compiling():
        return torch_ops.mla_decode_op(q, kv_cache, block_table, cache_seqlens, softmax_scale=softmax_scale,
                                       causal=causal, kv_scale=kv_scale, out=out, lse=lse, stream=stream,
                                       check_inputs=check_inputs, config=config, max_seq_len=max_seq_len)
    source = _DEFAULT_PLANS if config is None else _pinned(config)
    if max_seq_len is not None and _long_chunks(q, max_seq_len) and config is None:
        source = _LONG_CHUNK_PLANS
    return _MLA.call(q, kv_cache, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream,
                     check_inputs, source, None, None if kv_scale is None else {"kv_scale": kv_scale})


def gqa_decode(q, k_cache, v_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False, k_scale=None,
               v_scale=None, out=None, lse=None, stream=None, check_inputs=None,
               config: DecodeConfig | None = None):
    """MHA/GQA/MQA decode over paged K and V caches.

    q [B, Hq, D] or [B, s_q, Hq, D] bf16/fp16 with D in {64, 128, 256}; k_cache, v_cache
    [num_pages, page_size, Hkv, D], same dtype (or float8_e4m3fn with `k_scale` and `v_scale`: per-tensor
    floats or 1-element fp32 device tensors, or block scales [num_pages, page_size, Hkv, ceil(D / block)]),
    Hq % Hkv == 0 and Hq / Hkv in {1, 2, 4, 8, 16};
    block_table [B, max_pages] int32; cache_seqlens [B] int32. Returns (out shaped like q,
    lse [B, Hq, s_q] fp32, natural log). `check_inputs` and `config` as for mla_decode.
    """
    if torch_ops.is_compiling():
        return torch_ops.gqa_decode_op(q, k_cache, v_cache, block_table, cache_seqlens, softmax_scale=softmax_scale,
                                       causal=causal, k_scale=k_scale, v_scale=v_scale, out=out, lse=lse,
                                       stream=stream, check_inputs=check_inputs, config=config)
    return _GQA.call(q, k_cache, v_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream,
                     check_inputs, _DEFAULT_PLANS if config is None else _pinned(config), None,
                     None if k_scale is None and v_scale is None else {"k_scale": k_scale, "v_scale": v_scale})


# ---- plan/run objects for engines ------------------------------------------------------------------
class _FixedPlan:
    """A plan object's plan source: one variant, and the shape class it was built for. Holds its
    owner weakly, so a dropped plan object dies at once instead of waiting for the cycle collector."""

    def __init__(self, owner: "_DecodeObject", long_chunks: bool = False) -> None:
        self._owner = weakref.ref(owner)
        self.long_chunks = long_chunks
        self.key = ("fixed", id(owner), long_chunks)

    def plan(self, shape: CallShape) -> DecodePlan:
        owner = self._owner()
        owner._check_shape(shape)
        return owner.plan_for_batch(shape.batch, self.long_chunks)


class _DecodeObject:
    family = ""
    arg_names = PYTHON_NAMES  # how the constructor spells its arguments, for check_plan_args' errors

    def __init__(self, *, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: str,
                 max_batch: int, s_q: int, device: int, config: DecodeConfig | None, fp8_layout: str | None = None,
                 scale_block_size: int | None = None) -> None:
        check_plan_args(self.family, self.arg_names, heads=num_q_heads, kv_heads=num_kv_heads, head_dim=head_dim,
                        page_size=page_size, s_q=s_q, max_batch=max_batch, dtype=dtype)
        kv = planned_format(self.family, fp8_layout, scale_block_size, head_dim)
        self.device_id = device.index if hasattr(device, "index") and device.index is not None else int(device or 0)
        self.max_batch, self.s_q = max_batch, s_q
        self._shape = CallShape(self.family, self.device_id, dtype, max_batch, s_q, num_q_heads, num_kv_heads,
                                head_dim, page_size, 1, 1, (), (), kv)
        group = self._shape.group
        self._pinned = config is not None
        if config is None:
            config = select_config(self.family, dtype, page_size, group, head_dim, s_q, self.device_id, kv, max_batch)
        else:
            _check_config(config, self._shape)
        self.config = config  # the variant at max_batch
        self.plan = plan_for(config, self.device_id)
        # Smaller batches may take another variant (the sm90 MLA kernel's schedule depends on how many
        # chunks the split plan cuts sequences into, which is not monotonic in the batch: a grid just past a
        # full wave is split to even out its waves): every variant a batch of 1 .. max_batch takes is
        # compiled and loaded here, so that run() never compiles.
        self._plans = {config: self.plan}
        if not self._pinned:
            # the launches whose choices cover every batch and max_seq_len hint (`select.plan_launches`)
            from .select import plan_launches

            sms = 0 if _on_rocm() else sm_count(self.device_id)
            for batch, long_chunks in plan_launches(self.family, group, num_q_heads, s_q, max_batch, sms):
                cfg = select_config(self.family, dtype, page_size, group, head_dim, s_q, self.device_id, kv, batch,
                                    long_chunks)
                if cfg not in self._plans:
                    self._plans[cfg] = plan_for(cfg, self.device_id)
        blocks = config.head_blocks(num_q_heads, num_kv_heads)
        rows = policy.workspace_rows(max_batch, s_q, num_q_heads, blocks, config.ctas_per_sm, self.plan.num_sms,
                                     config.wave_splits)
        self._workspace = None
        self._workspace_floats = workspace_floats_for(rows, config.head_dim_v)
        self._source = _FixedPlan(self)
        self._long_source = _FixedPlan(self, long_chunks=True)  # MLADecode.run's max_seq_len says: long chunks
        self._runner = _Runner(self.family)

    def _check_shape(self, shape: CallShape) -> None:
        want = self._shape
        for field in ("dtype", "kv_format", "page_size", "num_q_heads", "num_kv_heads", "head_dim", "device_id"):
            if getattr(shape, field) != getattr(want, field):
                raise ValueError(f"{field}={getattr(shape, field)!r} does not match this {type(self).__name__}, "
                                 f"planned for {getattr(want, field)!r}")
        if shape.batch > self.max_batch:
            raise ValueError(f"q: batch {shape.batch} exceeds max_batch={self.max_batch} of this {type(self).__name__}")
        if shape.s_q != self.s_q:
            raise ValueError(f"q: s_q={shape.s_q} does not match this {type(self).__name__}, planned for s_q={self.s_q}")

    def plan_for_batch(self, batch: int, long_chunks: bool = False) -> DecodePlan:
        """The plan a run of `batch` sequences launches (one of those loaded at construction); `long_chunks`:
        the run's max_seq_len hint said its split chunks are long (MLA)."""
        if self._pinned:
            return self.plan
        s = self._shape
        cfg = select_config(self.family, s.dtype, s.page_size, s.group, s.head_dim, s.s_q, self.device_id, s.kv, batch,
                            long_chunks)
        plan = self._plans.get(cfg)
        if plan is None:  # not expected: the constructor loaded the choice of every batch up to max_batch
            plan = self._plans.setdefault(cfg, plan_for(cfg, self.device_id))
        return plan

    def _workspace_ptr(self, floats: int) -> int:
        if floats > self._workspace_floats:  # cannot happen for batch <= max_batch (policy.workspace_rows)
            raise RuntimeError(f"workspace of {self._workspace_floats} floats is short of {floats}")
        if self._workspace is None:
            from .memory import DeviceBuffer

            self._workspace = DeviceBuffer(self.device_id, 4 * self._workspace_floats,
                                           zero_bytes=WORKSPACE_PREFIX_BYTES)
        return self._workspace.ptr

    def _run(self, q, k, v, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream, check_inputs,
             scales=None, long_chunks=False):
        return self._runner.call(q, k, v, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream,
                                 check_inputs, self._long_source if long_chunks else self._source, self._workspace_ptr,
                                 scales)


class MLADecode(_DecodeObject):
    """MLA decode planned once for a shape class, run per step (FlashInfer-style plan/run).

        dec = kvforge.MLADecode(num_heads=128, page_size=64, dtype="bf16", max_batch=256)
        out, lse = dec.run(q, kv_cache, block_table, cache_seqlens)

    The variant is chosen, compiled and loaded and the split workspace allocated here; `run`
    checks the tensors (once per signature), writes pointers and launches. One object per stream:
    concurrent runs of one object on different streams would share its workspace. `fp8_layout`
    ('per_tensor', 'block' with `scale_block_size`, or 'fp8_ds_mla') plans for an fp8 cache
    (docs/fp8.md); `run` then takes `kv_scale` as mla_decode does.
    """

    family = "mla_decode"
    arg_names = MLA_PYTHON_NAMES

    def __init__(self, num_heads: int, page_size: int, dtype: str = "bf16", *, max_batch: int, s_q: int = 1,
                 device=0, config: DecodeConfig | None = None, fp8_layout: str | None = None,
                 scale_block_size: int | None = None) -> None:
        super().__init__(num_q_heads=num_heads, num_kv_heads=1, head_dim=policy.MLA_DIMS[0], page_size=page_size,
                         dtype=dtype, max_batch=max_batch, s_q=s_q, device=device, config=config,
                         fp8_layout=fp8_layout, scale_block_size=scale_block_size)

    def run(self, q, kv_cache, block_table, cache_seqlens, *, out=None, lse=None, softmax_scale=None, causal=False,
            kv_scale=None, stream=None, check_inputs=None, max_seq_len: int | None = None):
        """`max_seq_len`: mla_decode's hint (the longest sequence of the run, a host int); the variant it may
        pick was loaded at construction."""
        long_chunks = max_seq_len is not None and _long_chunks(q, max_seq_len) and not self._pinned
        return self._run(q, kv_cache, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream,
                         check_inputs, None if kv_scale is None else {"kv_scale": kv_scale}, long_chunks)


class GQADecode(_DecodeObject):
    """GQA/MHA/MQA decode planned once for a shape class; see MLADecode."""

    family = "gqa_decode"

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: str = "bf16", *,
                 max_batch: int, s_q: int = 1, device=0, config: DecodeConfig | None = None,
                 fp8_layout: str | None = None, scale_block_size: int | None = None) -> None:
        super().__init__(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                         dtype=dtype, max_batch=max_batch, s_q=s_q, device=device, config=config,
                         fp8_layout=fp8_layout, scale_block_size=scale_block_size)

    def run(self, q, k_cache, v_cache, block_table, cache_seqlens, *, out=None, lse=None, softmax_scale=None,
            causal=False, k_scale=None, v_scale=None, stream=None, check_inputs=None):
        scales = None if k_scale is None and v_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
        return self._run(q, k_cache, v_cache, block_table, cache_seqlens, out, lse, softmax_scale, causal, stream,
                         check_inputs, scales)
