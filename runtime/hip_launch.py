"""The HIP runtime path behind kvforge.mla_decode / gqa_decode when a ROCm device is present:
module load and launch through hip-python, mirroring runtime/launch.py.

NEVER RUN: these machines have no AMD GPU. CI exercises the HIP path up to the compiled code
object (tests/test_hip_compile.py); this module's calls follow hip-python's documented API.
"""
from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass
from functools import lru_cache

from .compiler import CompiledKernel
from .launch import ArgSlots


class HipLaunchError(RuntimeError):
    """A HIP runtime call failed; the message names the call and the kernel."""


def _check(result, what: str):
    from hip import hip

    err = result[0] if isinstance(result, tuple) else result
    if err != hip.hipError_t.hipSuccess:
        raise HipLaunchError(f"{what} failed: {err}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


@lru_cache(maxsize=1)
def rocm_device_count() -> int:
    try:
        from hip import hip

        err, count = hip.hipGetDeviceCount()
    except Exception:  # noqa: BLE001 - no hip-python or no ROCm runtime here
        return 0
    return count if err == hip.hipError_t.hipSuccess else 0


@lru_cache(maxsize=None)
def rocm_arch(device_id: int = 0) -> str:
    from hip import hip

    props = hip.hipDeviceProp_t()
    _check(hip.hipGetDeviceProperties(props, device_id), "hipGetDeviceProperties")
    return props.gcnArchName.decode().split(":")[0]


@dataclass
class HipKernel:
    name: str
    function: object

    def launch(self, grid, block, stream, *args) -> None:
        """args: ints become int32, floats float32, ("ptr", value) pointers."""
        from hip import hip

        packed = tuple(ctypes.c_void_p(a[1]) if isinstance(a, tuple) else
                       ctypes.c_float(a) if isinstance(a, float) else ctypes.c_int(a) for a in args)
        _check(hip.hipModuleLaunchKernel(self.function, *grid, *block, sharedMemBytes=0, stream=stream,
                                         kernelParams=None, extra=packed), f"hipModuleLaunchKernel({self.name})")


_modules: dict[tuple, object] = {}
_functions: dict[tuple, "HipKernel"] = {}
_records: dict[int, int] = {}
_lock = threading.Lock()


def load_hip(compiled: CompiledKernel, symbol: str, device_id: int = 0) -> HipKernel:
    """Kernel `symbol` of the code object, loaded once per device (modules keyed by the code
    object's digest and the device, functions by symbol too)."""
    from hip import hip

    digest = hashlib.sha256(compiled.cubin).hexdigest()
    with _lock:
        fn = _functions.get((digest, symbol, device_id))
        if fn is not None:
            return fn
        _check(hip.hipSetDevice(device_id), f"hipSetDevice({device_id})")
        module = _modules.get((digest, device_id))
        if module is None:
            module = _check(hip.hipModuleLoadData(compiled.cubin), f"hipModuleLoadData({compiled.name})")
            _modules[(digest, device_id)] = module
        fn = HipKernel(symbol, _check(hip.hipModuleGetFunction(module, symbol.encode()),
                                      f"hipModuleGetFunction({symbol})"))
        _functions[(digest, symbol, device_id)] = fn
        return fn


@lru_cache(maxsize=None)
def cu_count(device_id: int = 0) -> int:
    from hip import hip

    props = hip.hipDeviceProp_t()
    _check(hip.hipGetDeviceProperties(props, device_id), "hipGetDeviceProperties")
    return int(props.multiProcessorCount)


def error_record_ptr(device_id: int) -> int:
    """The device's error record (ERROR_RECORD_INTS int32, zeroed once)."""
    from hip import hip

    from kvforge.codegen.policy import ERROR_RECORD_INTS

    with _lock:
        ptr = _records.get(device_id)
        if ptr is None:
            _check(hip.hipSetDevice(device_id), f"hipSetDevice({device_id})")
            ptr = int(_check(hip.hipMalloc(ERROR_RECORD_INTS * 4), "hipMalloc(error record)"))
            _check(hip.hipMemset(ptr, 0, ERROR_RECORD_INTS * 4), "hipMemset(error record)")
            _records[device_id] = ptr
        return ptr


class PackedHipLaunch(ArgSlots):
    """PackedLaunch's interface for HIP: the same argument slots, passed through hip-python."""

    def __init__(self, kernel: HipKernel, contract) -> None:
        super().__init__(contract)
        self.kernel = kernel

    def launch(self, grid, stream) -> None:
        args = tuple(("ptr", s.value) if k == "ptr" else (float(s.value) if k == "float" else int(s.value))
                     for s, k in zip(self.slots, self.kinds))
        self.kernel.launch(grid, self.contract.block, stream or None, *args)
