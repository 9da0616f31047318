"""Shared fixtures: a private compile cache per test session, the `gpu` marker's skip, and GPU tests
starting with Python's cyclic garbage collected."""
from __future__ import annotations

import gc
import importlib.util
import sys
from pathlib import Path

import pytest

from kvforge.runtime.device import cuda_device_count

HAS_GPU = cuda_device_count() > 0
BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_tool(name: str):
    """bench/<name>.py as a module, with bench/ on sys.path while it loads (the tools import siblings such as
    child_ab as `python bench/x.py` does)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="session")
def bench_tool():
    """The loader of bench/ tools (`bench_tool("tree_ab")`), for tests of the benchmark scripts without a GPU."""
    return load_bench_tool


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine: GPU tests run on the device (make test-gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KVFORGE_CACHE_DIR", str(tmp_path_factory.mktemp("kvforge-cache")))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _collect_garbage_first(request):
    """A GPU test starts with the cyclic garbage collected. An earlier test's torch CUDAGraph left in a
    reference cycle and destroyed by the collector while a later test captures invalidates that capture
    (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED at its next launch): torch's hazard, met by any code that
    allocates Python objects inside a capture, as a first call that compiles does. Serving engines
    collect before capturing for the same reason (docs/runtime.md)."""
    if "gpu" in request.keywords:
        gc.collect()
    yield
