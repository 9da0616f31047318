"""Tensors in: any object with DLPack or __cuda_array_interface__ (torch, cupy, ...), viewed
through cuda.core's StridedMemoryView, checked and never copied."""
from __future__ import annotations

import numpy as np


def device_view(obj, arg: str, *, dtype: str | None = None, ndim: int | None = None,
                device_id: int | None = None, contiguous: bool = True):
    """A StridedMemoryView of `obj`, after checking device, dtype, rank and layout.

    Raises TypeError (not a GPU array, wrong dtype) or ValueError (rank, device, strides) naming `arg`.
    """
    from cuda.core.utils import StridedMemoryView

    if not (hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")):
        raise TypeError(f"{arg}: expected a CUDA array (DLPack or __cuda_array_interface__), "
                        f"got {type(obj).__name__}")
    try:
        make = getattr(StridedMemoryView, "from_any_interface", None)  # cuda.core >= 1.2.x
        view = make(obj, stream_ptr=-1) if make else StridedMemoryView(obj, stream_ptr=-1)
    except Exception as err:  # noqa: BLE001 - the exporter's reason is kept
        raise TypeError(f"{arg}: cannot be viewed as a CUDA array: {err}") from None
    if not view.is_device_accessible or view.device_id < 0:
        raise ValueError(f"{arg}: must live on a CUDA device, found a host array")
    if device_id is not None and view.device_id != device_id:
        raise ValueError(f"{arg}: is on device {view.device_id}, expected device {device_id}")
    if dtype is not None and np.dtype(view.dtype) != np.dtype(dtype):
        raise TypeError(f"{arg}: dtype must be {dtype}, got {view.dtype}")
    if ndim is not None and len(view.shape) != ndim:
        raise ValueError(f"{arg}: expected {ndim} dimensions, got shape {tuple(view.shape)}")
    if contiguous and not is_c_contiguous(view.shape, view.strides):
        raise ValueError(f"{arg}: must be C-contiguous, got shape {tuple(view.shape)} strides {view.strides}")
    return view


def is_c_contiguous(shape, strides) -> bool:
    """`strides` in elements (None means C-contiguous, as DLPack allows)."""
    if strides is None:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
