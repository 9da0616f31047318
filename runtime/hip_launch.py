"""The HIP runtime path behind kvforge.mla_decode / gqa_decode when a ROCm device is present:
module load and launch through hip-python, mirroring runtime/launch.py.

NEVER RUN: these machines have no AMD GPU. CI exercises the HIP path up to the compiled code
object (tests/test_hip_compile.py); this module's calls follow hip-python's documented API.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from functools import lru_cache

from .compiler import CompiledKernel


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


_modules: dict[str, object] = {}
_lock = threading.Lock()


def load_hip(compiled: CompiledKernel, symbol: str) -> HipKernel:
    from hip import hip

    with _lock:
        module = _modules.get(compiled.name)
        if module is None:
            module = _check(hip.hipModuleLoadData(compiled.cubin), f"hipModuleLoadData({compiled.name})")
            _modules[compiled.name] = module
        return HipKernel(symbol, _check(hip.hipModuleGetFunction(module, symbol.encode()), f"hipModuleGetFunction({symbol})"))
