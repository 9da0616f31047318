"""Plain device allocations the runtime owns (the error record, plan workspaces): cuMemAlloc in
the device's primary context, made under a relaxed capture mode so a first use inside a stream
capture does not invalidate it.

Frees are deferred. A buffer's owner (a plan object, a workspace) can be garbage-collected at any
moment, including while some thread captures a CUDA graph in torch's default global mode, and
cuMemFree is a synchronising call that invalidates such a capture. So a dead buffer only joins a
pending list; `release_unused()` frees the list at a point the caller knows to be outside any
capture, and the process's exit frees what is left.
"""
from __future__ import annotations

import atexit
import threading
import weakref

_pending: list[tuple[int, int]] = []  # (device pointer, primary context) of dead buffers
_pending_lock = threading.Lock()


def _defer_free(ptr: int, ctx: int) -> None:
    with _pending_lock:
        _pending.append((ptr, ctx))


def release_unused() -> int:
    """Free the device memory of every DeviceBuffer whose owner is gone; returns how many.
    Call it where no CUDA graph is being captured in the process (e.g. between engine steps)."""
    with _pending_lock:
        todo, _pending[:] = list(_pending), []
    if not todo:
        return 0
    try:
        from cuda.bindings import driver
    except Exception:  # noqa: BLE001 - interpreter shutdown
        return 0
    for ptr, ctx in todo:
        try:
            driver.cuCtxPushCurrent(driver.CUcontext(ctx))
            driver.cuMemFree(ptr)
            driver.cuCtxPopCurrent()
        except Exception:  # noqa: BLE001 - a context already gone
            pass
    return len(todo)


atexit.register(release_unused)


class DeviceBuffer:
    """`nbytes` of device memory on `device_id` (synchronous cuMemAlloc, not stream-ordered)."""

    def __init__(self, device_id: int, nbytes: int, zero_bytes: int = 0) -> None:
        """`zero_bytes` (a multiple of 4) at the start are zeroed before this returns, on a private
        non-blocking stream (no capturing stream is touched)."""
        from cuda.bindings import driver

        from .device import on_device, primary_context
        from .launch import _check, _relaxed_capture_mode

        self.device_id, self.nbytes = device_id, max(int(nbytes), 1)
        if zero_bytes % 4 or not 0 <= zero_bytes <= self.nbytes:
            raise ValueError(f"zero_bytes={zero_bytes}: a multiple of 4 up to nbytes={self.nbytes}")
        with on_device(device_id), _relaxed_capture_mode():
            (ptr,) = _check(driver.cuMemAlloc(self.nbytes), f"cuMemAlloc({self.nbytes})")
            if zero_bytes:
                flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
                (stream,) = _check(driver.cuStreamCreate(flags), "cuStreamCreate")
                try:
                    _check(driver.cuMemsetD32Async(ptr, 0, zero_bytes // 4, stream), "cuMemsetD32Async(workspace)")
                    _check(driver.cuStreamSynchronize(stream), "cuStreamSynchronize(workspace zeroing)")
                finally:
                    driver.cuStreamDestroy(stream)
        self.ptr = int(ptr)
        weakref.finalize(self, _defer_free, self.ptr, primary_context(device_id))
