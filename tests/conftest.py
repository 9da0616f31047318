"""Shared fixtures: a private compile cache per test session, the `gpu` marker's skip, and GPU tests
starting with Python's cyclic garbage collected."""
from __future__ import annotations

import gc

import pytest

from kvforge.runtime.device import cuda_device_count

HAS_GPU = cuda_device_count() > 0


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
