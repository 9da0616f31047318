"""kvforge under torch.compile on the GPU: fullgraph traces of functions calling kvforge.mla_decode /
gqa_decode (no graph breaks) match the eager call and the float64 reference; opcheck of the
registered ops; mode="reduce-overhead" (cudagraph trees) replayed with new lengths and queries."""
from __future__ import annotations


import numpy as np
import pytest


from paged_inputs import assert_matches, make_case, reference

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
TOL = 1e-2


def _reference(family, case, *, causal):
    return reference(family, case.host, causal=causal)


def _assert_matches_reference(family, case, out, lse, *, causal):
    want_o, want_l = _reference(family, case, causal=causal)
    assert_matches(out, lse, want_o, want_l, tol=TOL)


def _reset():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def _no_graph_breaks():
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()) == 0


def test_fullgraph_compile_of_mla_decode_matches_eager_and_reference():
    import kvforge

    _reset()
    case = make_case("mla_decode", batch=3, s_q=2, hq=16, hkv=1, d=576, page_size=64, lens=[700, 2, 129], seed=21)

    def step(q, kv, bt, sl):
        out, lse = kvforge.mla_decode(q * 1.0, kv, bt, sl, causal=True)
        return out, lse

    eager_o, eager_l = step(case.q, case.k, case.block_table, case.seqlens)
    compiled = torch.compile(step, fullgraph=True)
    got_o, got_l = compiled(case.q, case.k, case.block_table, case.seqlens)
    torch.cuda.synchronize()
    assert _no_graph_breaks()
    assert tuple(got_o.shape) == (3, 2, 16, 512) and tuple(got_l.shape) == (3, 16, 2)
    torch.testing.assert_close(got_o, eager_o, rtol=0, atol=0)  # same kernels, same split: bitwise
    torch.testing.assert_close(got_l, eager_l, rtol=0, atol=0)
    _assert_matches_reference("mla_decode", case, got_o, got_l, causal=True)


@pytest.mark.parametrize("q_rank", [3, 4])
def test_fullgraph_compile_of_gqa_decode_with_and_without_out_buffers(q_rank):
    import kvforge

    _reset()
    case = make_case("gqa_decode", batch=4, s_q=1, hq=32, hkv=8, d=128, page_size=16, lens=[129, 1, 900, 0],
                     seed=22 + q_rank)
    q = case.q[:, 0].contiguous() if q_rank == 3 else case.q

    def step(q, k, v, bt, sl, out, lse):
        o1, l1 = kvforge.gqa_decode(q, k, v, bt, sl)
        o2, l2 = kvforge.gqa_decode(q, k, v, bt, sl, out=out, lse=lse)
        return o1 + 0, l1, o2, l2

    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full((4, 32, 1), float("nan"), dtype=torch.float32, device="cuda")
    compiled = torch.compile(step, fullgraph=True)
    o1, l1, o2, l2 = compiled(q, case.k, case.v, case.block_table, case.seqlens, out, lse)
    torch.cuda.synchronize()
    assert _no_graph_breaks()
    assert tuple(o1.shape) == tuple(q.shape)
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    torch.testing.assert_close(out, o1, rtol=0, atol=0)  # the out= buffer was written in place
    eager_o, eager_l = kvforge.gqa_decode(q, case.k, case.v, case.block_table, case.seqlens)
    torch.testing.assert_close(o1, eager_o, rtol=0, atol=0)
    torch.testing.assert_close(l1, eager_l, rtol=0, atol=0)
    _assert_matches_reference("gqa_decode", case, o1, l1, causal=False)


def test_opcheck_of_the_registered_ops():
    from kvforge.runtime import torch_ops

    ops = torch_ops.register()
    case = make_case("gqa_decode", batch=2, s_q=2, hq=8, hkv=2, d=64, page_size=16, lens=[40, 3], seed=23)
    torch.library.opcheck(ops.gqa_decode.default, (case.q, case.k, case.v, case.block_table, case.seqlens, None,
                                                    True, True))
    mla = make_case("mla_decode", batch=2, s_q=1, hq=16, hkv=1, d=576, page_size=64, lens=[65, 300], seed=24)
    torch.library.opcheck(ops.mla_decode.default, (mla.q, mla.k, mla.block_table, mla.seqlens, 0.05, False, True))
    out = torch.empty(2, 1, 16, 512, dtype=mla.q.dtype, device="cuda")
    lse = torch.empty(2, 16, 1, dtype=torch.float32, device="cuda")
    torch.library.opcheck(ops.mla_decode_out.default, (mla.q, mla.k, mla.block_table, mla.seqlens, out, lse, None,
                                                        False, True))


@pytest.mark.parametrize("family", ["mla_decode", "gqa_decode"])
def test_reduce_overhead_replays_with_new_lengths_and_queries(family):
    import kvforge

    _reset()
    hq, hkv, d = (64, 1, 576) if family == "mla_decode" else (16, 4, 128)
    case = make_case(family, batch=2, s_q=1, hq=hq, hkv=hkv, d=d, page_size=64, lens=[3000, 700], seed=25)

    if family == "mla_decode":
        def step(q, kv, v, bt, sl):
            return kvforge.mla_decode(q, kv, bt, sl)
    else:
        def step(q, k, v, bt, sl):
            return kvforge.gqa_decode(q, k, v, bt, sl)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    # warm-up and recording happen on the first calls; later ones replay the CUDA graph
    for i, lens in enumerate(([3000, 700], [1, 650], [2999, 0], [64, 1], [1500, 699], [3000, 700])):
        new_q = torch.randn(case.q.shape, device="cuda").to(case.q.dtype)
        case.q.copy_(new_q)
        case.seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.host["q"] = new_q.double().cpu().numpy()
        case.host["lens"] = np.array(lens, dtype=np.int32)
        torch.compiler.cudagraph_mark_step_begin()
        out, lse = compiled(case.q, case.k, case.v, case.block_table, case.seqlens)
        out, lse = out.clone(), lse.clone()  # the graph's outputs are overwritten by the next replay
        torch.cuda.synchronize()
        _assert_matches_reference(family, case, out, lse, causal=False)
    assert _no_graph_breaks()


@pytest.mark.parametrize("family", ["mla_decode", "gqa_decode"])
def test_fullgraph_compile_with_an_fp8_cache_and_its_scales(family):
    """fp8 caches under torch.compile: the scales (a device tensor for K, a float for GQA's V)
    travel into the op; the compiled call matches the eager one bitwise, without graph breaks."""
    import kvforge

    _reset()
    hq, hkv, d = (16, 1, 576) if family == "mla_decode" else (32, 8, 128)
    case = make_case(family, batch=3, s_q=1, hq=hq, hkv=hkv, d=d, page_size=64, lens=[700, 2, 129], seed=23)
    k8, ks = kvforge.quantize_kv(torch.nan_to_num(case.k), "per_tensor")
    if family == "mla_decode":
        def step(q, kv, bt, sl, s):
            return kvforge.mla_decode(q * 1.0, kv, bt, sl, kv_scale=s)
        args = (case.q, k8, case.block_table, case.seqlens, ks)
    else:
        v8, vs = kvforge.quantize_kv(torch.nan_to_num(case.v), "per_tensor")
        vs_value = float(vs.item())

        def step(q, k, v, bt, sl, s):
            return kvforge.gqa_decode(q * 1.0, k, v, bt, sl, k_scale=s, v_scale=vs_value)
        args = (case.q, k8, v8, case.block_table, case.seqlens, ks)
    eager_o, eager_l = step(*args)
    got_o, got_l = torch.compile(step, fullgraph=True)(*args)
    torch.cuda.synchronize()
    assert _no_graph_breaks()
    torch.testing.assert_close(got_o, eager_o, rtol=0, atol=0)
    torch.testing.assert_close(got_l, eager_l, rtol=0, atol=0)
    assert not torch.isnan(got_o).any()
