"""CUDA-graph capture of every shape class the selector picks, back to back, with unrelated CUDA
work (matmuls, synchronizes, allocations) between the captures, as a serving engine does; each
graph is then replayed with new lengths and queries and checked.

Issue 10 saw once a capture invalidated (cudaErrorStreamCaptureInvalidated) in a process that had
captured other shapes and run FlashInfer's planner between captures. What the code showed: a
kernel's first use loaded its module (cuda.core ObjectCode -> cuLibraryLoadData) and, with
CUDA_MODULE_LOADING=LAZY (the default), the per-context load of a kernel happened at its first
launch. A first launch can fall inside a capture even after a warm-up call of the same shape: the
combine kernel runs only when sequences are split, which depends on the batch, so a warm-up at a
large batch (no split) followed by a capture at a small one (split) launched `combine` for the
first time inside the capture. Module loading is a potentially unsafe call under torch's default
global capture mode. runtime/launch.py now loads every kernel of a variant, into the device's
primary context, when the variant is first used, under a relaxed capture mode for the loading
thread: a capture never sees a lazy load. The first call of a shape inside a capture therefore
works (compiling is host-only work, and the length check is skipped while capturing), which
test_first_ever_call_of_a_shape_inside_a_capture pins down.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest


from paged_inputs import assert_matches, make_case, reference

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [pytest.mark.gpu]

# (family, heads or group, head dim, s_q, page size): MLA heads 1/16/32/64/128 x s_q 1/2, GQA
# D 64/128/256 x groups 1/4/8/16; page sizes 16 and 64 alternate so both meet every head count.
SHAPES = ([("mla_decode", h, 576, s_q, (16, 64)[(i + s_q) % 2]) for i, h in enumerate((1, 16, 32, 64, 128))
           for s_q in (1, 2)]
          + [("gqa_decode", g, d, 1, (16, 64)[(i + j) % 2]) for i, d in enumerate((64, 128, 256))
             for j, g in enumerate((1, 4, 8, 16))])
LENS = [[900, 33, 0, 257], [1, 700, 64, 3], [512, 2, 899, 100]]
CAPACITY = [max(col) for col in zip(*LENS)]  # pages are allocated for these, so every set fits the table


def _splits(ctas: int) -> int:
    """Splits per sequence for `ctas` CTAs of one-CTA-per-SM variants on device 0."""
    from kvforge.codegen.policy import num_splits
    from kvforge.runtime.device import sm_count

    return num_splits(ctas, 1, sm_count(0))


def _case(shape, seed):
    family, heads, d, s_q, page = shape
    hq, hkv = (heads, 1) if family == "mla_decode" else (2 * heads, 2)
    case = make_case(family, batch=4, s_q=s_q, hq=hq, hkv=hkv, d=d, page_size=page, lens=CAPACITY, seed=seed)
    case.seqlens.copy_(torch.tensor(LENS[0], dtype=torch.int32))
    case.host["lens"] = np.array(LENS[0], dtype=np.int32)
    return case


def _call(shape, case, out, lse):
    import kvforge

    if shape[0] == "mla_decode":
        return kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, out=out, lse=lse,
                                  causal=shape[3] > 1)
    return kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, out=out, lse=lse,
                              causal=shape[3] > 1)


def _buffers(shape, case):
    b, s_q, hq, _ = case.q.shape
    dv = 512 if shape[0] == "mla_decode" else shape[2]
    return (torch.full((b, s_q, hq, dv), float("nan"), dtype=case.q.dtype, device="cuda"),
            torch.full((b, hq, s_q), float("nan"), dtype=torch.float32, device="cuda"))


def _check(shape, case, out, lse):
    family, s_q = shape[0], shape[3]
    want_o, want_l = reference(family, case.host, causal=s_q > 1)
    assert_matches(out, lse, want_o, want_l, what=str(shape))


def _compile_shape(shape):
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile
    from kvforge.runtime.select import select_decode_config

    family, heads, d, s_q, page = shape
    compile(Variant(select_decode_config(family, "sm_90", "bf16", page, heads=heads, head_dim=d, s_q=s_q)))


def _precompile(shapes):
    """NVRTC for every shape in parallel processes (host work; fills the session's disk cache)."""
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(_compile_shape, shapes))


def _unrelated_work(i):
    a = torch.randn(512 + 64 * (i % 5), 1024, device="cuda")
    b = torch.randn(1024, 768, device="cuda")
    (a @ b).sum().item()
    junk = [torch.empty(1 << (16 + i % 6), dtype=torch.uint8, device="cuda") for _ in range(3)]
    del junk
    torch.cuda.synchronize()


@pytest.mark.timeout(600)
def test_capture_every_selected_shape_back_to_back_then_replay_with_new_lengths():
    _precompile(SHAPES)
    cases, bufs, graphs = [], [], []
    for i, shape in enumerate(SHAPES):  # warm-up outside capture, as engines do
        case = _case(shape, seed=100 + i)
        out, lse = _buffers(shape, case)
        _call(shape, case, out, lse)
        cases.append(case)
        bufs.append((out, lse))
    torch.cuda.synchronize()
    for i, shape in enumerate(SHAPES):
        _unrelated_work(i)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            _call(shape, cases[i], *bufs[i])
        graphs.append(g)
        torch.randn(256, 256, device="cuda").exp_()  # more work on the default stream between captures
    for step, lens in enumerate(LENS[1:]):
        for i, shape in enumerate(SHAPES):
            case, (out, lse) = cases[i], bufs[i]
            new_q = torch.randn(case.q.shape, device="cuda").to(case.q.dtype)
            case.q.copy_(new_q)
            case.seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
            case.host["q"] = new_q.double().cpu().numpy()
            case.host["lens"] = np.array(lens, dtype=np.int32)
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            graphs[i].replay()
            if step == 1 or i % 4 == 0:  # the reference is slow on the host: all shapes once, a few twice
                torch.cuda.synchronize()
                _check(shape, case, out, lse)
    torch.cuda.synchronize()
    graphs.clear()  # destroyed here, outside any capture (see tests/conftest.py)


@pytest.mark.timeout(300)
def test_first_ever_call_of_a_shape_inside_a_capture():
    """No warm-up: compile, module load and the first launch of all three kernels happen while
    torch.cuda.graph captures (global mode). It must work; a batch of 1 takes the split path, so
    the combine kernel is among them."""
    from kvforge.runtime import decode

    shape = ("gqa_decode", 2, 64, 2, 32)  # in no other test: nothing is compiled or loaded yet
    case = make_case("gqa_decode", batch=1, s_q=2, hq=4, hkv=2, d=64, page_size=32, lens=[3000], seed=7)
    assert _splits(2) > 1
    out, lse = _buffers(shape, case)
    _unrelated_work(0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _call(shape, case, out, lse)
    for lens in ([3000], [17], [2048]):
        case.seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.host["lens"] = np.array(lens, dtype=np.int32)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check(shape, case, out, lse)


@pytest.mark.timeout(300)
def test_capture_at_a_small_batch_after_warm_up_at_a_large_one():
    """The shape of the issue: warm-up where no sequence is split (the combine kernel never runs),
    then a capture of the same variant at a batch that splits (combine's first launch)."""
    from kvforge.runtime import decode

    shape = ("mla_decode", 128, 576, 1, 64)
    big = make_case("mla_decode", batch=128, s_q=1, hq=128, hkv=1, d=576, page_size=64, lens=[64] * 128, seed=8)
    out_big, lse_big = _buffers(shape, big)
    _call(shape, big, out_big, lse_big)
    torch.cuda.synchronize()
    small = make_case("mla_decode", batch=1, s_q=1, hq=128, hkv=1, d=576, page_size=64, lens=[4096], seed=9)
    assert _splits(2 * 128) == 1 and _splits(2) > 1
    out, lse = _buffers(shape, small)
    _unrelated_work(1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _call(shape, small, out, lse)
    g.replay()
    torch.cuda.synchronize()
    _check(shape, small, out, lse)
