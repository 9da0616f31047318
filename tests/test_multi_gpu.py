"""Two GPUs: a decode on cuda:1 tensors while cuda:0 is current matches the reference, runs on
cuda:1's current stream and leaves the caller's current device alone; tensors split across devices
are refused naming the argument and both devices; two processes sharing one KVFORGE_CACHE_DIR
compile the same variant concurrently into one entry."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from paged_inputs import assert_matches, make_case, reference

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.fixture(autouse=True)
def _two_gpus():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        pytest.skip(f"needs 2 CUDA GPUs, this machine has {n}")
    torch.cuda.set_device(0)


def _on(case, device):
    for name in ("q", "k", "v", "block_table", "seqlens"):
        t = getattr(case, name)
        if t is not None:
            setattr(case, name, t.to(device))
    return case


def _call(family, case, **kw):
    import kvforge

    if family == "mla_decode":
        return kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, **kw)
    return kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, **kw)


def _case(family, seed):
    if family == "mla_decode":
        return make_case(family, batch=3, s_q=1, hq=16, hkv=1, d=576, page_size=64, lens=[500, 1, 64], seed=seed)
    return make_case(family, batch=3, s_q=1, hq=16, hkv=4, d=128, page_size=16, lens=[500, 1, 64], seed=seed)


def _check(family, case, out, lse):
    want_o, want_l = reference(family, case.host, causal=False)
    assert_matches(out, lse, want_o, want_l,
                   what=f"{family} on {out.device} (NaN: not written, or written before the poison on this stream)")


@pytest.mark.parametrize("family", ["mla_decode", "gqa_decode"])
def test_decode_on_cuda1_while_cuda0_is_current(family):
    case = _on(_case(family, seed=31), "cuda:1")
    assert torch.cuda.current_device() == 0
    out, lse = _call(family, case)
    assert out.device == lse.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0, "kvforge changed the caller's current device"
    torch.cuda.synchronize(1)
    _check(family, case, out, lse)
    # and the same shapes on cuda:0 afterwards (kernels are loaded per device)
    case0 = _on(_case(family, seed=32), "cuda:0")
    out0, lse0 = _call(family, case0)
    torch.cuda.synchronize(0)
    _check(family, case0, out0, lse0)


@pytest.mark.parametrize("family,arg", [("mla_decode", "kv_cache"), ("mla_decode", "block_table"),
                                        ("gqa_decode", "v_cache"), ("gqa_decode", "cache_seqlens")])
def test_tensors_split_across_devices_are_refused_naming_argument_and_devices(family, arg):
    case = _on(_case(family, seed=33), "cuda:1")
    attr = {"kv_cache": "k", "v_cache": "v", "block_table": "block_table", "cache_seqlens": "seqlens"}[arg]
    setattr(case, attr, getattr(case, attr).to("cuda:0"))
    with pytest.raises(ValueError) as err:
        _call(family, case)
    msg = str(err.value)
    assert arg in msg, msg
    assert re.search(r"\b0\b", msg) and re.search(r"\b1\b", msg), f"both device indices should be named: {msg}"


@pytest.mark.parametrize("non_default", [False, True])
def test_launches_go_to_the_current_stream_of_the_tensors_device(non_default):
    """cuda:1's current stream (its default stream, or a user stream made current there) while
    cuda:0 is the current device: kvforge's launches must be ordered after work already queued
    there. A NaN poison of `out` queued behind a long spin would land after kvforge's write if
    kvforge used any other stream."""
    case = _on(_case("gqa_decode", seed=34), "cuda:1")
    stream = torch.cuda.Stream(device=1) if non_default else torch.cuda.default_stream(1)
    prev = torch.cuda.current_stream(1)
    torch.cuda.set_stream(stream)   # current stream of cuda:1 (this also makes cuda:1 current) ...
    torch.cuda.set_device(0)        # ... and back to cuda:0 as the current device
    try:
        assert torch.cuda.current_stream(1) == stream and torch.cuda.current_device() == 0
        out = torch.empty(case.q.shape, dtype=case.q.dtype, device="cuda:1")
        lse = torch.empty((3, 16, 1), dtype=torch.float32, device="cuda:1")
        torch.cuda.synchronize(1)
        with torch.cuda.device(1), torch.cuda.stream(stream):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on cuda:1's current stream
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        torch.cuda.set_device(0)
        _call("gqa_decode", case, out=out, lse=lse, check_inputs=False)
        stream.synchronize()
        _check("gqa_decode", case, out, lse)
    finally:
        torch.cuda.set_stream(prev)
        torch.cuda.set_device(0)


_WORKER = textwrap.dedent("""
    import os, sys, time
    import torch
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile
    from kvforge.runtime.select import select_decode_config

    device = int(sys.argv[1]); start = float(sys.argv[2])
    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 32, heads=8, head_dim=256, s_q=3)
    while time.time() < start:
        time.sleep(0.001)
    kernel = compile(Variant(cfg))
    assert kernel.cubin
    # and run it on this process's GPU through the public function
    import kvforge
    q = torch.randn(2, 3, 16, 256, device=f"cuda:{device}").bfloat16()
    k = torch.randn(8, 32, 2, 256, device=f"cuda:{device}").bfloat16()
    bt = torch.arange(8, dtype=torch.int32, device=f"cuda:{device}").reshape(2, 4)
    sl = torch.tensor([100, 7], dtype=torch.int32, device=f"cuda:{device}")
    out, lse = kvforge.gqa_decode(q, k, k, bt, sl, causal=True)
    torch.cuda.synchronize(device)
    assert torch.isfinite(out.float()).all()
    print("ok", Variant(cfg).name)
""")


def test_two_processes_share_one_cache_dir(tmp_path):
    import time

    from kvforge.runtime.cache import KernelCache

    env = {**os.environ, "KVFORGE_CACHE_DIR": str(tmp_path / "cache")}
    start = time.time() + 5  # both processes are past their imports by then: the compiles overlap
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(dev), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for dev in (0, 1)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and out.startswith("ok"), err[-3000:]
    name = results[0][0].split()[1]
    entries = [e for e in KernelCache(tmp_path / "cache").entries() if e.name.startswith(name)]
    assert len(entries) == 1, entries
