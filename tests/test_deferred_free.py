"""Dead device buffers are not freed from their finalizer (which can run inside a stream capture,
where cuMemFree invalidates it) but queued for `release_unused()`; no GPU needed."""
from __future__ import annotations

import gc

import pytest

from kvforge.runtime import memory


class _Owner:
    pass


def test_a_dead_buffer_is_queued_not_freed(monkeypatch):
    freed = []

    class FakeDriver:
        class CUcontext:
            def __init__(self, ctx):
                self.ctx = ctx

        @staticmethod
        def cuCtxPushCurrent(ctx):
            pass

        @staticmethod
        def cuCtxPopCurrent():
            pass

        @staticmethod
        def cuMemFree(ptr):
            freed.append(ptr)

    import weakref

    monkeypatch.setattr(memory, "_pending", [])
    owner = _Owner()
    weakref.finalize(owner, memory._defer_free, 0xABC000, 7)  # what DeviceBuffer registers
    del owner
    gc.collect()
    assert memory._pending == [(0xABC000, 7)] and freed == []  # nothing touched the driver

    cuda_bindings = pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed")

    monkeypatch.setattr(cuda_bindings, "driver", FakeDriver, raising=False)
    assert memory.release_unused() == 1
    assert freed == [0xABC000] and memory._pending == []
    assert memory.release_unused() == 0
