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
    """The cuda.core Device, made current (its primary context)."""
    from cuda.core import Device

    dev = Device(device_id)
    dev.set_current()
    return dev


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
