"""Shared fixtures: a private compile cache per test session, and the `gpu` marker's skip."""
from __future__ import annotations

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
