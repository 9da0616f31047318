"""Tensors in: any object with DLPack or __cuda_array_interface__ (torch, cupy, ...), viewed
through cuda.core's StridedMemoryView, checked and never copied."""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_ALIASES = {
    "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "float32": "fp32", "float": "fp32", "int32": "int32", "int": "int32", "uint32": "uint32",
    "float8_e4m3fn": "fp8_e4m3", "float8_e4m3": "fp8_e4m3", "int64": "int64", "float64": "fp64",
}


def dtype_name(obj) -> str:
    """'bf16', 'fp16', 'fp32', 'int32', ... from the exporter's own dtype (torch, cupy, numpy)."""
    raw = str(getattr(obj, "dtype", "?")).removeprefix("torch.")
    return DTYPE_ALIASES.get(raw, raw)


@dataclass(frozen=True)
class TensorArg:
    name: str
    ptr: int
    shape: tuple[int, ...]
    dtype: str
    device_id: int
    obj: object


def device_view(obj, arg: str, *, dtype: str | tuple[str, ...] | None = None, ndim: int | tuple[int, ...] | None = None,
                device_id: int | None = None, contiguous: bool = True) -> TensorArg:
    """`obj` as a TensorArg after checking device, dtype, rank and layout.

    Raises TypeError (not a GPU array, wrong dtype) or ValueError (rank, device, strides) naming `arg`.
    """
    from cuda.core.utils import StridedMemoryView

    if not (hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")):
        raise TypeError(f"{arg}: expected a CUDA array (DLPack or __cuda_array_interface__), "
                        f"got {type(obj).__name__}")
    name = dtype_name(obj)
    allowed = (dtype,) if isinstance(dtype, str) else dtype
    if allowed is not None and name not in allowed:
        raise TypeError(f"{arg}: dtype must be {' or '.join(allowed)}, got {name}")
    if type(obj).__module__.startswith("torch"):  # fast path: the same facts, without a DLPack round trip
        if not obj.is_cuda:
            raise ValueError(f"{arg}: must live on a CUDA device, found a host array")
        shape, strides = tuple(obj.shape), tuple(obj.stride())
        return _checked(obj, arg, name, int(obj.data_ptr()), shape, strides, obj.device.index, ndim, device_id,
                        contiguous)
    try:
        make = getattr(StridedMemoryView, "from_any_interface", None)  # cuda.core >= 1.2.x
        view = make(obj, stream_ptr=-1) if make else StridedMemoryView(obj, stream_ptr=-1)
        shape, strides = tuple(view.shape), view.strides
    except Exception as err:  # noqa: BLE001 - the exporter's reason is kept
        raise TypeError(f"{arg}: cannot be viewed as a CUDA array: {err}") from None
    if not view.is_device_accessible or view.device_id < 0:
        raise ValueError(f"{arg}: must live on a CUDA device, found a host array")
    return _checked(obj, arg, name, int(view.ptr), shape, strides, int(view.device_id), ndim, device_id, contiguous)


def _checked(obj, arg, name, ptr, shape, strides, dev, ndim, device_id, contiguous) -> TensorArg:
    if device_id is not None and dev != device_id:
        raise ValueError(f"{arg}: is on device {dev}, expected device {device_id}")
    ranks = (ndim,) if isinstance(ndim, int) else ndim
    if ranks is not None and len(shape) not in ranks:
        raise ValueError(f"{arg}: expected {' or '.join(map(str, ranks))} dimensions, got shape {shape}")
    if contiguous and not is_c_contiguous(shape, strides):
        raise ValueError(f"{arg}: must be C-contiguous (kvforge never copies behind your back), got shape "
                         f"{shape} strides {strides}")
    return TensorArg(arg, ptr, shape, name, dev, obj)


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
