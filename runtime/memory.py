"""Plain device allocations the runtime owns (the error record, plan workspaces): cuMemAlloc in
the device's primary context, made under a relaxed capture mode so a first use inside a stream
capture does not invalidate it, freed when the owner goes away."""
from __future__ import annotations

import weakref


def _free(ptr: int, ctx: int) -> None:
    try:
        from cuda.bindings import driver

        driver.cuCtxPushCurrent(driver.CUcontext(ctx))
        driver.cuMemFree(ptr)
        driver.cuCtxPopCurrent()
    except Exception:  # noqa: BLE001 - interpreter shutdown or a context already gone
        pass


class DeviceBuffer:
    """`nbytes` of device memory on `device_id` (synchronous cuMemAlloc, not stream-ordered)."""

    def __init__(self, device_id: int, nbytes: int) -> None:
        from cuda.bindings import driver

        from .device import on_device, primary_context
        from .launch import _check, _relaxed_capture_mode

        self.device_id, self.nbytes = device_id, max(int(nbytes), 1)
        with on_device(device_id), _relaxed_capture_mode():
            (ptr,) = _check(driver.cuMemAlloc(self.nbytes), f"cuMemAlloc({self.nbytes})")
        self.ptr = int(ptr)
        weakref.finalize(self, _free, self.ptr, primary_context(device_id))
