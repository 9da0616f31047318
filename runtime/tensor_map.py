"""TMA tensor maps for the sm90 kernels: the paged KV cache seen as a 3-D tensor
[num_pages][page_size][row] of 16-bit elements, 128-byte swizzle, boxes of 64 columns x box_rows
rows. Encoded once per (pointer, shape) through cuTensorMapEncodeTiled and cached: engines pass
the same cache tensor every step, so the hot path compares one key.
"""
from __future__ import annotations

import threading
from functools import lru_cache

TENSOR_MAP_BYTES = 128
SWIZZLE_COLS = 64  # 16-bit columns per 128-byte swizzle row: the box's inner extent


class TensorMapError(RuntimeError):
    """cuTensorMapEncodeTiled refused the cache (alignment, strides); the message names the values."""


@lru_cache(maxsize=None)
def _enums():
    from cuda.bindings import driver

    return {
        "bf16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        "fp16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        "interleave": driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        "swizzle": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        "l2": driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        "oob": driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    }


def encode_paged_kv(ptr: int, dtype: str, num_pages: int, page_size: int, row_elems: int, box_rows: int) -> bytes:
    """The 128 bytes of a CUtensorMap over a contiguous cache [num_pages, page_size, row_elems]."""
    from cuda.bindings import driver

    if ptr % 16:
        raise TensorMapError(f"kv_cache: address {ptr:#x} is not 16-byte aligned (TMA needs it)")
    e = _enums()
    row_bytes = row_elems * 2
    dims = [driver.cuuint64_t(v) for v in (row_elems, page_size, num_pages)]
    strides = [driver.cuuint64_t(v) for v in (row_bytes, row_bytes * page_size)]
    box = [driver.cuuint32_t(v) for v in (SWIZZLE_COLS, box_rows, 1)]
    ones = [driver.cuuint32_t(1)] * 3
    err, tmap = driver.cuTensorMapEncodeTiled(e[dtype], 3, ptr, dims, strides, box, ones, e["interleave"],
                                              e["swizzle"], e["l2"], e["oob"])
    if err != driver.CUresult.CUDA_SUCCESS:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed ({err.name}) for a kv_cache at {ptr:#x} of "
                             f"{num_pages} pages x {page_size} rows x {row_elems} {dtype} elements")
    import ctypes

    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


class PagedKVMaps:
    """Encoded maps of one variant (dtype, page size, row, box rows), keyed by (pointer, pages)."""

    MAX_ENTRIES = 64

    def __init__(self, dtype: str, page_size: int, row_elems: int, box_rows: int) -> None:
        self.dtype, self.page_size, self.row_elems, self.box_rows = dtype, page_size, row_elems, box_rows
        self._maps: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()

    def get(self, ptr: int, num_pages: int) -> bytes:
        key = (ptr, num_pages)
        hit = self._maps.get(key)
        if hit is None:
            hit = encode_paged_kv(ptr, self.dtype, num_pages, self.page_size, self.row_elems, self.box_rows)
            with self._lock:
                if len(self._maps) >= self.MAX_ENTRIES:
                    self._maps.clear()
                self._maps[key] = hit
        return hit
