"""Loading cubins and launching kernels: modules through cuda.core, loaded once per device into
its primary context with the max-dynamic-SMEM attribute raised once per kernel; launches either
through cuda.core (`LoadedKernel.launch`, general) or through `PackedLaunch` (the hot path: the
arguments of a kernel contract packed once, one cuLaunchKernel per call)."""
from __future__ import annotations

import ctypes
import hashlib
import threading
from contextlib import contextmanager
from functools import lru_cache
from dataclasses import dataclass

from .compiler import CompiledKernel
from .device import device


class LaunchError(RuntimeError):
    """A CUDA driver call around a launch failed; the message names the call and the kernel."""


def _check(result, what: str):
    from cuda.bindings import driver

    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorString(err)
        raise LaunchError(f"{what} failed: {err.name} ({text.decode() if text else ''})")
    return result[1:] if isinstance(result, tuple) and len(result) > 1 else None


def _set_max_dynamic_smem(kernel, nbytes: int, device_id: int, name: str) -> None:
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        (dev,) = _check(driver.cuDeviceGet(device_id), "cuDeviceGet")
        _check(driver.cuKernelSetAttribute(attr, nbytes, handle, dev), f"cuKernelSetAttribute({name})")
    else:
        _check(driver.cuFuncSetAttribute(handle, attr, nbytes), f"cuFuncSetAttribute({name})")


@dataclass
class LoadedKernel:
    name: str
    kernel: object  # cuda.core Kernel
    max_dynamic_smem: int
    device_id: int
    function: object = None  # CUfunction in the device's primary context (cuLaunchKernel takes it)

    def launch(self, grid, block, smem: int, stream, *args) -> None:
        from cuda.core import launch

        if smem > self.max_dynamic_smem:
            raise LaunchError(f"{self.name}: {smem} B of dynamic shared memory requested, "
                              f"the kernel was loaded for at most {self.max_dynamic_smem} B")
        launch(stream, _launch_config(tuple(grid), tuple(block), smem), self.kernel, *args)


@lru_cache(maxsize=1024)
def _launch_config(grid: tuple, block: tuple, smem: int):
    from cuda.core import LaunchConfig

    return LaunchConfig(grid=grid, block=block, shmem_size=smem)


_modules: dict[tuple, object] = {}
_loaded: dict[tuple, LoadedKernel] = {}
_lock = threading.Lock()


def loaded_modules() -> list:
    """The cuda.core modules (ObjectCode) loaded so far, one per cubin and device: for measurement tools
    that read a module's globals (bench/phase_trace.py's trace buffer)."""
    with _lock:
        return list(_modules.values())


@contextmanager
def _relaxed_capture_mode():
    """Loading a module is a "potentially unsafe" call for a global-mode stream capture (torch's
    default): made during a capture on any thread, it fails and invalidates that capture
    (cudaErrorStreamCaptureInvalidated). Like torch's allocator around cudaMalloc, the loading
    thread relaxes its capture mode for the duration of the load."""
    from cuda.bindings import driver

    relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    (prev,) = _check(driver.cuThreadExchangeStreamCaptureMode(relaxed), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        driver.cuThreadExchangeStreamCaptureMode(prev)


def _load_into_context(kernel, device_id: int, name: str):
    """Load the kernel into the device's primary context now and return its CUfunction there.
    With lazy loading (CUDA_MODULE_LOADING=LAZY, the default) a library kernel is otherwise loaded
    into a context at its first launch, which may be inside a stream capture, on whichever thread
    launches."""
    from cuda.bindings import driver

    handle = kernel.handle
    if not isinstance(handle, driver.CUkernel):
        return handle  # a module function is already bound to a context
    ctx = device(device_id).context.handle
    _check(driver.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        (function,) = _check(driver.cuKernelGetFunction(handle), f"cuKernelGetFunction({name})")
    finally:
        driver.cuCtxPopCurrent()
    return function


def load(compiled: CompiledKernel, symbol: str, dynamic_smem: int, device_id: int = 0) -> LoadedKernel:
    """Kernel `symbol` of the cubin, loaded once per device into its primary context, with its
    dynamic-SMEM limit raised (once per kernel). Safe to call while a stream is being captured."""
    digest = hashlib.sha256(compiled.cubin).hexdigest()
    key = (digest, symbol, device_id)
    with _lock:
        hit = _loaded.get(key)
        if hit is not None and hit.max_dynamic_smem >= dynamic_smem:
            return hit
        with _relaxed_capture_mode():
            loaded = _load_locked(compiled, digest, symbol, dynamic_smem, device_id)
        _loaded[key] = loaded
        return loaded


def _load_locked(compiled: CompiledKernel, digest: str, symbol: str, dynamic_smem: int,
                 device_id: int) -> LoadedKernel:
    from cuda.core import ObjectCode

    device(device_id)
    module = _modules.get((digest, device_id))
    if module is None:
        module = ObjectCode.from_cubin(compiled.cubin, name=compiled.name)
        _modules[(digest, device_id)] = module
    kernel = module.get_kernel(symbol)
    if dynamic_smem > 48 * 1024:
        _set_max_dynamic_smem(kernel, dynamic_smem, device_id, symbol)
    function = _load_into_context(kernel, device_id, symbol)
    return LoadedKernel(symbol, kernel, max(dynamic_smem, 48 * 1024), device_id, function)


_C_SLOTS = {"ptr": ctypes.c_uint64, "int": ctypes.c_int32, "float": ctypes.c_float,
            "tmap": ctypes.c_uint8 * 128}  # a CUtensorMap passed by value (sm90)


class ArgSlots:
    """A kernel contract's arguments as ctypes slots, in its order, plus the array of their
    addresses a launch passes as kernelParams (CUDA and HIP launches share it)."""

    def __init__(self, contract) -> None:
        self.contract = contract
        self.index = {a.name: i for i, a in enumerate(contract.args)}
        self.kinds = [a.scalar_kind for a in contract.args]
        self.slots = [_C_SLOTS[k]() for k in self.kinds]
        self._argv = (ctypes.c_void_p * len(self.slots))(*[ctypes.addressof(v) for v in self.slots])
        self.argv_addr = ctypes.addressof(self._argv)

    def set(self, name: str, value) -> None:
        self.slots[self.index[name]].value = value


class PackedLaunch(ArgSlots):
    """One kernel's launch with its arguments packed once, in its contract's order.

    Each argument has a ctypes slot; `kernelParams` is an array of the slots' addresses, built
    once. A call writes the slots whose values changed (`set`) and launches with one
    cuLaunchKernel; the driver copies the parameters at the launch (and into a graph node under
    capture), so the slots may be rewritten as soon as `launch` returns. Not thread-safe: the
    plan that owns it serialises set + launch.
    """

    def __init__(self, kernel: LoadedKernel, contract, programmatic: bool = False) -> None:
        if contract.dynamic_smem_bytes > kernel.max_dynamic_smem:
            raise LaunchError(f"{contract.symbol}: {contract.dynamic_smem_bytes} B of dynamic shared memory "
                              f"requested, the kernel was loaded for at most {kernel.max_dynamic_smem} B")
        super().__init__(contract)
        self.name = contract.symbol
        self._function = kernel.function
        self._block = contract.block
        if _cuLaunchKernel is None:
            _bind_driver()
        self._smem = contract.dynamic_smem_bytes
        # programmatic dependent launch (sm_90+): cuLaunchKernelEx with programmatic stream
        # serialization, so the kernel may start before the previous one in the stream completes
        # (it waits for it with griddepcontrol.wait before reading its results)
        self.programmatic = programmatic
        self._config = _programmatic_config(contract.block, self._smem) if programmatic else None

    def launch(self, grid: tuple[int, int, int], stream_handle: int) -> None:
        if self._config is not None:
            cfg = self._config
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
            cfg.hStream = _stream_object(stream_handle)
            (err,) = _cuLaunchKernelEx(cfg, self._function, self.argv_addr, 0)
            if err != _SUCCESS:
                _check(err, f"cuLaunchKernelEx({self.name}, grid={tuple(grid)}, programmatic)")
            return
        bx, by, bz = self._block
        (err,) = _cuLaunchKernel(self._function, grid[0], grid[1], grid[2], bx, by, bz, self._smem,
                                 _stream_object(stream_handle), self.argv_addr, 0)
        if err != _SUCCESS:
            _check(err, f"cuLaunchKernel({self.name}, grid={tuple(grid)})")


def _programmatic_config(block: tuple[int, int, int], smem: int):
    """A CUlaunchConfig carrying the programmatic-stream-serialization attribute (grid and stream
    are filled per launch)."""
    from cuda.bindings import driver

    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg = driver.CUlaunchConfig()
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = smem
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


_cuLaunchKernel = _cuLaunchKernelEx = _SUCCESS = None


def _bind_driver() -> None:
    """The launch entry points and success code, bound once (no attribute lookups per launch)."""
    global _cuLaunchKernel, _cuLaunchKernelEx, _SUCCESS
    from cuda.bindings import driver

    _cuLaunchKernel, _cuLaunchKernelEx = driver.cuLaunchKernel, driver.cuLaunchKernelEx
    _SUCCESS = driver.CUresult.CUDA_SUCCESS


_streams: dict[int, object] = {}


def _stream_object(handle: int):
    """A CUstream for a raw handle, made once per handle (engines use a handful of streams)."""
    s = _streams.get(handle)
    if s is None:
        from cuda.bindings import driver

        s = driver.CUstream(handle)
        if len(_streams) < 1024:
            _streams[handle] = s
    return s


@lru_cache(maxsize=64)
def _stream_from_handle(handle: int):
    from cuda.core import Stream

    return Stream.from_handle(handle)


def resolve_stream(stream, device_id: int = 0):
    """A cuda.core Stream for `stream`: None (the device's default stream), a cuda.core Stream,
    anything with `__cuda_stream__` (torch.cuda.Stream, cupy), or a raw handle as an int."""
    from cuda.core import Stream

    dev = device(device_id)
    if stream is None:
        return dev.default_stream
    if isinstance(stream, Stream):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return dev.create_stream(stream)
    if isinstance(stream, int):
        return _stream_from_handle(stream)
    raise TypeError(f"stream: expected None, a cuda.core Stream, an object with __cuda_stream__ or an "
                    f"int handle, got {type(stream).__name__}")
