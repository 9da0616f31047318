"""The torch.library ops without a GPU: importing kvforge never imports torch, the fake
implementations give the right shapes, dtypes and devices (FakeTensorMode, symbolic batch), and
torch.compile(fullgraph=True) puts one kvforge op in the graph, also when the first kvforge call
of the process is the one being traced."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from kvforge.runtime import torch_ops


def test_import_and_is_compiling_never_import_torch():
    code = textwrap.dedent("""
        import sys
        import kvforge
        from kvforge.runtime import torch_ops
        assert torch_ops.is_compiling() is False
        assert "torch" not in sys.modules, "kvforge imported torch"
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


torch = pytest.importorskip("torch", reason="torch is not installed: the torch.library ops are not tested here")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def _mla_args(b, s_q, h, device="cuda", dtype=None):
    dtype = dtype or torch.bfloat16
    return (torch.empty(b, s_q, h, 576, dtype=dtype, device=device),
            torch.empty(40, 64, 576, dtype=dtype, device=device),
            torch.empty(b, 5, dtype=torch.int32, device=device),
            torch.empty(b, dtype=torch.int32, device=device))


def _gqa_args(q_shape, hkv, device="cuda", dtype=None):
    dtype = dtype or torch.float16
    d = q_shape[-1]
    return (torch.empty(q_shape, dtype=dtype, device=device),
            torch.empty(40, 16, hkv, d, dtype=dtype, device=device),
            torch.empty(40, 16, hkv, d, dtype=dtype, device=device),
            torch.empty(q_shape[0], 5, dtype=torch.int32, device=device),
            torch.empty(q_shape[0], dtype=torch.int32, device=device))


@pytest.mark.parametrize("b,s_q,h", [(1, 1, 1), (3, 2, 16), (7, 8, 128)])
def test_mla_fake_gives_out_with_512_columns_and_fp32_lse(b, s_q, h):
    ops = torch_ops.register()
    with FakeTensorMode():
        out, lse = ops.mla_decode(*_mla_args(b, s_q, h), 0.1, True, True)
        assert tuple(out.shape) == (b, s_q, h, 512) and out.dtype == torch.bfloat16
        assert tuple(lse.shape) == (b, h, s_q) and lse.dtype == torch.float32
        assert out.device == lse.device == torch.device("cuda:0")


@pytest.mark.parametrize("q_shape,hkv", [((4, 32, 128), 8), ((2, 3, 8, 64), 8), ((5, 2, 64, 256), 4)])
def test_gqa_fake_gives_out_like_q_and_lse_per_query_head(q_shape, hkv):
    ops = torch_ops.register()
    with FakeTensorMode():
        args = _gqa_args(q_shape, hkv)
        out, lse = ops.gqa_decode(*args, None, False, True)
        s_q = 1 if len(q_shape) == 3 else q_shape[1]
        assert tuple(out.shape) == q_shape and out.dtype == torch.float16
        assert tuple(lse.shape) == (q_shape[0], q_shape[-2], s_q) and lse.dtype == torch.float32


def test_fake_keeps_the_inputs_device_index():
    ops = torch_ops.register()
    with FakeTensorMode():
        out, lse = ops.gqa_decode(*_gqa_args((2, 8, 64), 2, device="cuda:1"), None, False, True)
        assert out.device == lse.device == torch.device("cuda:1")


def test_op_helpers_with_out_write_the_given_buffers_and_allocate_the_missing_one():
    with FakeTensorMode():
        args = _mla_args(2, 1, 16)
        out = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16, device="cuda")
        got_out, lse = torch_ops.mla_decode_op(*args, out=out)
        assert got_out is out
        assert tuple(lse.shape) == (2, 16, 1) and lse.dtype == torch.float32
        gargs = _gqa_args((2, 8, 64), 2)
        lse_buf = torch.empty(2, 8, 1, dtype=torch.float32, device="cuda")
        o, got_lse = torch_ops.gqa_decode_op(*gargs, lse=lse_buf)
        assert got_lse is lse_buf and tuple(o.shape) == (2, 8, 64)


def test_fake_rejects_a_query_of_the_wrong_rank_naming_q():
    ops = torch_ops.register()
    with FakeTensorMode():
        q, kv, bt, sl = _mla_args(2, 1, 16)
        with pytest.raises(ValueError, match=r"q: expected 4 dimensions"):
            ops.mla_decode(torch.empty(1, 16, 576, dtype=torch.bfloat16, device="cuda"), kv, bt, sl, None, False,
                           True)
        with pytest.raises(TypeError, match=r"q: dtype must be bf16 or fp16"):
            ops.mla_decode(torch.empty(2, 1, 16, 576, device="cuda"), kv, bt, sl, None, False, True)


@pytest.mark.parametrize("arg", ["stream", "config", "max_seq_len"])
def test_arguments_the_op_cannot_carry_are_refused_naming_them(arg):
    with FakeTensorMode():
        with pytest.raises(ValueError, match=rf"^{arg}: not supported inside torch.compile"):
            torch_ops.mla_decode_op(*_mla_args(1, 1, 16), **{arg: 1})


def test_ops_are_registered_once():
    assert torch_ops.register() is torch_ops.register()
    assert torch.ops.kvforge.mla_decode.default._schema.name == "kvforge::mla_decode"
    schema = str(torch.ops.kvforge.gqa_decode_out.default._schema)
    assert re.search(r"Tensor\(a\d*!\) out", schema) and re.search(r"Tensor\(a\d*!\) lse", schema), schema


class _Graphs:
    """A torch.compile backend that records the dynamo graph and never runs it (no GPU here)."""

    class Traced(Exception):
        pass

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)

        def run(*args):
            raise self.Traced()

        return run

    def kvforge_calls(self):
        return [str(n.target) for g in self.graphs for n in g.graph.nodes
                if n.op == "call_function" and str(n.target).startswith("kvforge.")]


def _trace(fn, *args, dynamic=None):
    rec = _Graphs()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=rec, fullgraph=True, dynamic=dynamic)
    with pytest.raises(_Graphs.Traced):
        compiled(*args)
    return rec


def test_fullgraph_trace_of_the_mla_helper_is_one_op():
    def step(q, kv, bt, sl):
        assert torch_ops.is_compiling()
        out, lse = torch_ops.mla_decode_op(q, kv, bt, sl, softmax_scale=0.07, causal=True)
        return out * 2, lse

    rec = _trace(step, *_mla_args(2, 2, 16, device="cpu"), dynamic=True)
    assert rec.kvforge_calls() == ["kvforge.mla_decode"]
    assert len(rec.graphs) == 1


def test_fullgraph_trace_of_the_gqa_helper_with_out_is_the_out_op():
    def step(q, k, v, bt, sl, out):
        return torch_ops.gqa_decode_op(q, k, v, bt, sl, out=out)

    args = _gqa_args((3, 8, 64), 2, device="cpu")
    out = torch.empty(3, 8, 64, dtype=torch.float16)
    rec = _trace(step, *args, out)
    assert rec.kvforge_calls() == ["kvforge.gqa_decode_out"]


def test_is_compiling_is_false_in_eager_code():
    assert torch_ops.is_compiling() is False


def test_first_call_of_the_process_may_be_the_traced_one():
    """kvforge imported before torch and never called eagerly: registering the ops happens
    inside the trace (dynamo runs it for real) without a graph break."""
    code = textwrap.dedent("""
        import kvforge
        from kvforge.runtime import torch_ops
        import torch

        graphs = []
        def backend(gm, inputs):
            graphs.append(gm)
            def run(*a):
                raise KeyboardInterrupt  # traced; nothing runs without a GPU
            return run
        def step(q, k, v, bt, sl):
            if torch_ops.is_compiling():
                return torch_ops.gqa_decode_op(q, k, v, bt, sl)
            raise AssertionError("not compiling")
        args = (torch.empty(2, 8, 64, dtype=torch.bfloat16), torch.empty(4, 16, 2, 64, dtype=torch.bfloat16),
                torch.empty(4, 16, 2, 64, dtype=torch.bfloat16), torch.empty(2, 3, dtype=torch.int32),
                torch.empty(2, dtype=torch.int32))
        try:
            torch.compile(step, backend=backend, fullgraph=True)(*args)
        except KeyboardInterrupt:
            pass
        calls = [str(n.target) for n in graphs[0].graph.nodes if str(n.target).startswith("kvforge.")]
        assert calls == ["kvforge.gqa_decode"], calls
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def test_public_functions_trace_to_the_op_once_decode_py_routes_them():
    """The wiring in runtime/decode.py: kvforge.mla_decode under torch.compile becomes the op."""
    import kvforge
    from kvforge.runtime import decode

    if not hasattr(decode, "_mla_decode_impl"):
        pytest.skip("runtime/decode.py does not route through torch_ops yet (no _mla_decode_impl)")

    def step(q, kv, bt, sl):
        return kvforge.mla_decode(q, kv, bt, sl, causal=True)

    rec = _trace(step, *_mla_args(2, 1, 16, device="cpu"))
    assert rec.kvforge_calls() == ["kvforge.mla_decode"]


def test_fullgraph_trace_with_fp8_scales_carries_them_into_the_op():
    """fp8 caches under torch.compile: a tensor scale and a float scale both travel in the op's
    (tensor, value) slots; the fake gives the 16-bit output shapes."""
    def step(q, k8, v8, bt, sl, ks):
        return torch_ops.gqa_decode_op(q, k8, v8, bt, sl, k_scale=ks, v_scale=0.5)

    q, k, v, bt, sl = _gqa_args((3, 8, 64), 2, device="cpu")
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    rec = _trace(step, q, k8, v8, bt, sl, torch.ones(1))
    assert rec.kvforge_calls() == ["kvforge.gqa_decode"]
    node = next(n for g in rec.graphs for n in g.graph.nodes if str(n.target) == "kvforge.gqa_decode")
    assert node.args[-1] == 0.5 and node.args[-2] is None and node.args[-3] is None, node.args
    with FakeTensorMode():
        mq, mkv, mbt, msl = _mla_args(2, 1, 16)
        out, lse = torch_ops.mla_decode_op(mq, mkv.to(torch.float8_e4m3fn), mbt, msl, kv_scale=0.25)
        assert tuple(out.shape) == (2, 1, 16, 512) and out.dtype == torch.bfloat16
    with pytest.raises(TypeError, match=r"^kv_scale: expected a float or a float32 tensor, got str"):
        torch_ops.mla_decode_op(*_mla_args(1, 1, 16, device="cpu"), kv_scale="1")
