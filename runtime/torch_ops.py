"""kvforge's decode functions as torch.library custom ops, so torch.compile traces them whole.

`kvforge::mla_decode`, `kvforge::gqa_decode` (functional: they allocate out and lse) and their
`*_out` forms (write into given out and lse) are registered once, with fake implementations that
give the output shapes, dtypes and devices without running anything. The public functions call
`is_compiling()` first and, while torch.compile traces them, return `mla_decode_op(...)` /
`gqa_decode_op(...)`, which put the op in the graph. This module never imports torch by itself:
`import kvforge` stays cheap and works without torch; torch is bound on the first call made
after the caller imported it.
"""
import sys

from .call_args import softmax_scale_value

MLA_DV = 512

_ops = None         # torch.ops.kvforge once the ops are registered


def _never() -> bool:
    return False


def is_compiling() -> bool:
    """True while torch.compile (dynamo) or torch.export traces the caller, False in eager code.

    Eager cost: a global read and torch's own check (~0.3 us). Before the caller has imported
    torch nothing can be tracing, so it answers False without importing torch. The first call
    after torch is imported binds torch's check and registers the ops (once), also when that
    first call is itself being traced.
    """
    return _compiling()


def _unbound() -> bool:
    """is_compiling until torch is bound (a function, not None: dynamo guards on it by identity)."""
    if not _bind():
        return False
    import torch  # already imported; read fresh, as dynamo keeps the global it read

    return torch.compiler.is_compiling()


_compiling = _unbound


def _bind() -> bool:
    """Bind torch's is_compiling and register the ops, if the caller has imported torch."""
    global _compiling
    if "torch" not in sys.modules:
        return False
    register()
    import torch

    _compiling = torch.compiler.is_compiling
    return True


# What torch._dynamo.assume_constant_result does, without importing torch here: dynamo runs
# _bind for real when it meets it while tracing (registering ops is not traceable) and treats
# its result as a constant.
_bind._dynamo_marked_constant = True


def _impl(name: str):
    """runtime.decode's eager implementation `_<name>_impl` (returns (out, lse)), or the public
    function where that does not exist; looked up at call time, so both layouts of decode.py work."""
    from . import decode

    return getattr(decode, f"_{name}_impl", None) or getattr(decode, name)


def register():
    """Register the kvforge ops with torch.library (idempotent). Returns torch.ops.kvforge."""
    global _ops
    if _ops is not None:
        return _ops
    import torch
    from torch import Tensor

    def on_device(q: Tensor):
        """The tensors' device current while the eager implementation runs: torch's current
        stream and kvforge's default stream are then the ones of q's device."""
        if q.device.index is None or q.device.index == torch.cuda.current_device():
            return _NULL
        return torch.cuda.device(q.device)

    # ---- MLA ---------------------------------------------------------------------------------
    @torch.library.custom_op("kvforge::mla_decode", mutates_args=(), device_types="cuda")
    def mla_decode(q: Tensor, kv_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                   softmax_scale: float | None = None, causal: bool = False, check_inputs: bool = True,
                   kv_scale: Tensor | None = None, kv_scale_value: float | None = None) -> tuple[Tensor, Tensor]:
        with on_device(q):
            return _impl("mla_decode")(q, kv_cache, block_table, cache_seqlens, softmax_scale=softmax_scale,
                                       causal=causal, check_inputs=check_inputs,
                                       kv_scale=_scale(kv_scale, kv_scale_value))

    @mla_decode.register_fake
    def _(q, kv_cache, block_table, cache_seqlens, softmax_scale=None, causal=False, check_inputs=True,
          kv_scale=None, kv_scale_value=None):
        _fake_check("mla_decode", q, (4,))
        b, s_q, h, _ = q.shape
        return q.new_empty((b, s_q, h, MLA_DV)), q.new_empty((b, h, s_q), dtype=torch.float32)

    @torch.library.custom_op("kvforge::mla_decode_out", mutates_args=("out", "lse"), device_types="cuda")
    def mla_decode_out(q: Tensor, kv_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor, out: Tensor,
                       lse: Tensor, softmax_scale: float | None = None, causal: bool = False,
                       check_inputs: bool = True, kv_scale: Tensor | None = None,
                       kv_scale_value: float | None = None) -> None:
        with on_device(q):
            _impl("mla_decode")(q, kv_cache, block_table, cache_seqlens, softmax_scale=softmax_scale, causal=causal,
                                out=out, lse=lse, check_inputs=check_inputs,
                                kv_scale=_scale(kv_scale, kv_scale_value))

    @mla_decode_out.register_fake
    def _(q, kv_cache, block_table, cache_seqlens, out, lse, softmax_scale=None, causal=False, check_inputs=True,
          kv_scale=None, kv_scale_value=None):
        _fake_check("mla_decode_out", q, (4,))
        return None

    # ---- GQA ---------------------------------------------------------------------------------
    @torch.library.custom_op("kvforge::gqa_decode", mutates_args=(), device_types="cuda")
    def gqa_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                   softmax_scale: float | None = None, causal: bool = False, check_inputs: bool = True,
                   k_scale: Tensor | None = None, k_scale_value: float | None = None,
                   v_scale: Tensor | None = None, v_scale_value: float | None = None) -> tuple[Tensor, Tensor]:
        with on_device(q):
            return _impl("gqa_decode")(q, k_cache, v_cache, block_table, cache_seqlens, softmax_scale=softmax_scale,
                                       causal=causal, check_inputs=check_inputs,
                                       k_scale=_scale(k_scale, k_scale_value), v_scale=_scale(v_scale, v_scale_value))

    @gqa_decode.register_fake
    def _(q, k_cache, v_cache, block_table, cache_seqlens, softmax_scale=None, causal=False, check_inputs=True,
          k_scale=None, k_scale_value=None, v_scale=None, v_scale_value=None):
        _fake_check("gqa_decode", q, (3, 4))
        s_q = 1 if q.dim() == 3 else q.shape[1]
        return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[-2], s_q), dtype=torch.float32)

    @torch.library.custom_op("kvforge::gqa_decode_out", mutates_args=("out", "lse"), device_types="cuda")
    def gqa_decode_out(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                       out: Tensor, lse: Tensor, softmax_scale: float | None = None, causal: bool = False,
                       check_inputs: bool = True, k_scale: Tensor | None = None, k_scale_value: float | None = None,
                       v_scale: Tensor | None = None, v_scale_value: float | None = None) -> None:
        with on_device(q):
            _impl("gqa_decode")(q, k_cache, v_cache, block_table, cache_seqlens, softmax_scale=softmax_scale,
                                causal=causal, out=out, lse=lse, check_inputs=check_inputs,
                                k_scale=_scale(k_scale, k_scale_value), v_scale=_scale(v_scale, v_scale_value))

    @gqa_decode_out.register_fake
    def _(q, k_cache, v_cache, block_table, cache_seqlens, out, lse, softmax_scale=None, causal=False,
          check_inputs=True, k_scale=None, k_scale_value=None, v_scale=None, v_scale_value=None):
        _fake_check("gqa_decode_out", q, (3, 4))
        return None

    _ops = torch.ops.kvforge
    return _ops


class _NullContext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL = _NullContext()


def _fake_check(op: str, q, ranks: tuple[int, ...]) -> None:
    """What the fake implementation can check without data: q's rank and dtype (the real call
    checks everything else before it launches)."""
    import torch

    if q.dim() not in ranks:
        raise ValueError(f"kvforge::{op}: q: expected {' or '.join(map(str, ranks))} dimensions, "
                         f"got shape {tuple(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"kvforge::{op}: q: dtype must be bf16 or fp16, got {q.dtype}")


_WHY_NOT_UNDER_COMPILE = {
    "max_seq_len": "a host length would specialise the compiled graph on every new value; the op takes the "
                   "built-in variant choice",
}


def _unsupported_under_compile(**kwargs) -> None:
    for name, value in kwargs.items():
        if value is not None:
            why = _WHY_NOT_UNDER_COMPILE.get(name, "the op runs on torch's current stream with the built-in variant "
                                                   "choice")
            raise ValueError(f"{name}: not supported inside torch.compile ({why}); got {value!r}")


def _scale(tensor, value):
    """An fp8 scale argument back from the op's two slots (a tensor, or a Python number)."""
    return tensor if tensor is not None else value


def _split_scale(name: str, x):
    """An fp8 scale argument as the op's (tensor, value) slots: a tensor (per-tensor or block
    scales) or a Python number; None for a 16-bit cache."""
    if x is None:
        return None, None
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "dtype"):
        raise TypeError(f"{name}: expected a float or a float32 tensor, got {type(x).__name__}")
    return (None, float(x)) if isinstance(x, (int, float)) else (x, None)


def mla_decode_op(q, kv_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False, kv_scale=None,
                  out=None, lse=None, stream=None, check_inputs=True, config=None, max_seq_len=None):
    """kvforge.mla_decode through the registered op: what the public function returns while
    torch.compile traces it. Same arguments and result as kvforge.mla_decode; `stream`, `config` and
    `max_seq_len` (a host int would specialise the graph on every new length) must be None (ValueError
    naming the argument); an fp8 cache's `kv_scale` (a tensor or a float)
    goes into the op. With `out` and/or `lse` the out-variant writes them (a missing one is
    allocated) and they are returned."""
    _unsupported_under_compile(stream=stream, config=config, max_seq_len=max_seq_len)
    scale = softmax_scale_value(softmax_scale)
    ops = _ops or register()
    ks = _split_scale("kv_scale", kv_scale)
    if out is None and lse is None:
        return ops.mla_decode(q, kv_cache, block_table, cache_seqlens, scale, bool(causal), bool(check_inputs), *ks)
    import torch

    if q.dim() != 4:
        raise ValueError(f"q: expected 4 dimensions, got shape {tuple(q.shape)}")
    b, s_q, h, _ = q.shape
    if out is None:
        out = q.new_empty((b, s_q, h, MLA_DV))
    if lse is None:
        lse = q.new_empty((b, h, s_q), dtype=torch.float32)
    ops.mla_decode_out(q, kv_cache, block_table, cache_seqlens, out, lse, scale, bool(causal), bool(check_inputs),
                       *ks)
    return out, lse


def gqa_decode_op(q, k_cache, v_cache, block_table, cache_seqlens, *, softmax_scale=None, causal=False,
                  k_scale=None, v_scale=None, out=None, lse=None, stream=None, check_inputs=True, config=None):
    """kvforge.gqa_decode through the registered op (see mla_decode_op); `stream` and `config`
    must be None; `k_scale` / `v_scale` go into the op."""
    _unsupported_under_compile(stream=stream, config=config)
    scale = softmax_scale_value(softmax_scale)
    ops = _ops or register()
    ks, vs = _split_scale("k_scale", k_scale), _split_scale("v_scale", v_scale)
    if out is None and lse is None:
        return ops.gqa_decode(q, k_cache, v_cache, block_table, cache_seqlens, scale, bool(causal),
                              bool(check_inputs), *ks, *vs)
    import torch

    if q.dim() not in (3, 4):
        raise ValueError(f"q: expected 3 or 4 dimensions, got shape {tuple(q.shape)}")
    s_q = 1 if q.dim() == 3 else q.shape[1]
    if out is None:
        out = q.new_empty(q.shape)
    if lse is None:
        lse = q.new_empty((q.shape[0], q.shape[-2], s_q), dtype=torch.float32)
    ops.gqa_decode_out(q, k_cache, v_cache, block_table, cache_seqlens, out, lse, scale, bool(causal),
                       bool(check_inputs), *ks, *vs)
    return out, lse
