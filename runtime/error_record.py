"""The device-side error record: one small buffer per device that the decode kernels' input guard
writes the first offence of a call into (codegen/policy.py: ERROR_RECORD_INTS), and
`kvforge.check_errors()`, which reads it (a synchronising copy, on request only) and raises.

Nothing on the hot path reads it: a default call never waits for the device.
"""
from __future__ import annotations

import threading

import numpy as np

from kvforge.codegen.policy import ERR_PAGE, ERR_SEQLEN, ERROR_RECORD_INTS

_records: dict[int, object] = {}
_lock = threading.Lock()


class DeviceInputError(ValueError):
    """A decode call's cache_seqlens or block_table pointed outside the KV cache; the affected
    sequences got NaN rows and nothing was read out of bounds."""


def record_ptr(device_id: int) -> int:
    """Device address of the device's error record (allocated and zeroed on first use)."""
    buf = _records.get(device_id)
    if buf is None:
        with _lock:
            buf = _records.get(device_id)
            if buf is None:
                buf = _allocate(device_id)
                _records[device_id] = buf
    return buf.ptr


def _allocate(device_id: int) -> "DeviceBuffer":
    from .memory import DeviceBuffer

    return DeviceBuffer(device_id, ERROR_RECORD_INTS * 4, zero_bytes=ERROR_RECORD_INTS * 4)


def describe(record) -> str:
    code, b, index, value, seqlen, bound = (int(x) for x in record[:6])
    if code == ERR_SEQLEN:
        return (f"cache_seqlens[{b}]={value}: must be in 0..{bound} (the block table's capacity in tokens); "
                f"sequence {b}'s out and lse rows are NaN")
    if code == ERR_PAGE:
        return (f"block_table[{b}][{index}]={value}: pages used by its {seqlen} tokens must be in 0..{bound - 1}; "
                f"sequence {b}'s out and lse rows are NaN")
    return f"unknown device error code {code} (record {list(map(int, record))})"


def read_record(device_id: int, *, clear: bool = True) -> np.ndarray:
    """The record's ints (synchronises with the device); zeroed afterwards when `clear`."""
    from cuda.bindings import driver

    from .device import on_device
    from .launch import _check

    host = np.zeros(ERROR_RECORD_INTS, dtype=np.int32)
    if device_id not in _records:
        return host
    ptr = record_ptr(device_id)
    with on_device(device_id):
        _check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        _check(driver.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes), "cuMemcpyDtoH(error record)")
        if clear and host[0]:
            _check(driver.cuMemsetD32(ptr, 0, ERROR_RECORD_INTS), "cuMemsetD32(error record)")
            _check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
    return host


def check_errors(device: int | None = None) -> None:
    """Raise DeviceInputError for the first bad cache_seqlens / block_table entry any decode call
    on `device` (default: every device used so far) met since the last check; then clear it.
    Synchronises with the device: call it where a sync is acceptable (tests, debug, step ends)."""
    devices = [device] if device is not None else sorted(_records)
    for d in devices:
        rec = read_record(d)
        if rec[0]:
            raise DeviceInputError(f"cuda:{d}: {describe(rec)}")
