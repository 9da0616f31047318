"""TMA tensor maps for the sm90 kernels: the paged KV cache seen as a 3-D tensor
[num_pages][page_size][row] of 16-bit elements, 128-byte swizzle, with the geometry the config
defines (`Sm90DecodeConfig.kv_map`, which the C launchers encode too). Encoded once per
(pointer, page count) through cuTensorMapEncodeTiled and cached: engines pass the same cache
tensor every step, so the hot path compares one key.
"""
from __future__ import annotations

import ctypes
import threading
from functools import lru_cache

TENSOR_MAP_BYTES = 128


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


def encode_paged_kv(ptr: int, num_pages: int, geometry: dict) -> bytes:
    """The 128 bytes of a CUtensorMap over a contiguous cache of `num_pages` pages at `ptr`, with
    `geometry` = a config's `kv_map` (dtype, row_elems, page_size, row_bytes, page_bytes, box_cols,
    box_rows)."""
    from cuda.bindings import driver

    if ptr % 16:
        raise TensorMapError(f"kv_cache: address {ptr:#x} is not 16-byte aligned (TMA needs it)")
    e, g = _enums(), geometry
    dims = [driver.cuuint64_t(v) for v in (g["row_elems"], g["page_size"], num_pages)]
    strides = [driver.cuuint64_t(v) for v in (g["row_bytes"], g["page_bytes"])]
    box = [driver.cuuint32_t(v) for v in (g["box_cols"], g["box_rows"], 1)]
    ones = [driver.cuuint32_t(1)] * 3
    err, tmap = driver.cuTensorMapEncodeTiled(e[g["dtype"]], 3, ptr, dims, strides, box, ones, e["interleave"],
                                              e["swizzle"], e["l2"], e["oob"])
    if err != driver.CUresult.CUDA_SUCCESS:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed ({err.name}) for a kv_cache at {ptr:#x} of "
                             f"{num_pages} pages x {g['page_size']} rows x {g['row_elems']} {g['dtype']} elements")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


class PagedKVMaps:
    """Encoded maps of one variant (its config's `kv_map` geometry), keyed by (pointer, pages)."""

    MAX_ENTRIES = 64

    def __init__(self, geometry: dict) -> None:
        self.geometry = geometry
        self._maps: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()

    def get(self, ptr: int, num_pages: int) -> bytes:
        key = (ptr, num_pages)
        hit = self._maps.get(key)
        if hit is None:
            hit = encode_paged_kv(ptr, num_pages, self.geometry)
            with self._lock:
                if len(self._maps) >= self.MAX_ENTRIES:
                    self._maps.clear()
                self._maps[key] = hit
        return hit
