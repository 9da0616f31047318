"""The CUDA device as cuda.core sees it: presence, current device, its arch and SM count."""
from __future__ import annotations

from functools import lru_cache

from kvforge.codegen.arch import nvidia_arch_for_capability


def cuda_device_count() -> int:
    """Number of visible CUDA devices; 0 when there is no driver or no GPU."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
    except Exception:  # noqa: BLE001 - no bindings, or no driver library on this machine
        return 0
    if err != driver.CUresult.CUDA_SUCCESS:
        return 0
    err, count = driver.cuDeviceGetCount()
    return count if err == driver.CUresult.CUDA_SUCCESS else 0


@lru_cache(maxsize=None)
def device(device_id: int = 0):
    """The cuda.core Device with its primary context initialised. The calling thread's current
    context is left as it was (a first use of cuda:1 must not move the caller off cuda:0); when
    there was none, the device's primary context stays current."""
    from cuda.bindings import driver
    from cuda.core import Device

    err, prev = driver.cuCtxGetCurrent()
    dev = Device(device_id)
    dev.set_current()
    if err == driver.CUresult.CUDA_SUCCESS and int(prev) != 0 and int(prev) != int(dev.context.handle):
        driver.cuCtxSetCurrent(prev)
    return dev


@lru_cache(maxsize=None)
def primary_context(device_id: int = 0) -> int:
    """The device's primary context handle, as an int (for cheap comparisons on the hot path)."""
    return int(device(device_id).context.handle)


class on_device:
    """Makes the device's primary context current for a block, restoring the previous one; a
    no-op when it is already current (the common case costs one cuCtxGetCurrent)."""

    __slots__ = ("ctx", "pushed")

    def __init__(self, device_id: int) -> None:
        self.ctx = primary_context(device_id)
        self.pushed = False

    def __enter__(self):
        from cuda.bindings import driver

        err, cur = driver.cuCtxGetCurrent()
        if int(cur) != self.ctx:
            driver.cuCtxPushCurrent(driver.CUcontext(self.ctx))
            self.pushed = True
        return self

    def __exit__(self, *exc) -> None:
        if self.pushed:
            from cuda.bindings import driver

            driver.cuCtxPopCurrent()


@lru_cache(maxsize=None)
def device_arch(device_id: int = 0) -> str:
    major, minor = device(device_id).compute_capability
    return nvidia_arch_for_capability(major, minor)


@lru_cache(maxsize=None)
def sm_count(device_id: int = 0) -> int:
    return device(device_id).properties.multiprocessor_count


def runs_on(variant_arch: str, dev_arch: str) -> bool:
    """A cubin runs only on its own major.minor; sm_90a code runs on sm_90 devices."""
    return variant_arch.removesuffix("a") == dev_arch
