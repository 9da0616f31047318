"""TMA tensor maps for the kernels that load KV tiles by TMA: a paged cache seen as a 3-D tensor
[num_pages][page_size][row] of 16-bit or fp8 elements, 128-byte swizzle, with the geometry the config
defines (`DecodeConfig.tensor_maps`: the sm90 MLA kernel's `kv_map`, the GQA kernels' `k_map` and
`v_map` whose rows hold every KV head; the C launchers encode the same). Encoded once per
(pointer, page count, KV heads) through cuTensorMapEncodeTiled and cached: engines pass the same
cache tensors every step, so the hot path compares one key.
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
        "fp8_e4m3": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,  # bytes: the kernel converts
        "interleave": driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        "swizzle": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        "l2": driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        "oob": driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    }


def encode_paged_kv(ptr: int, num_pages: int, geometry: dict, num_kv_heads: int = 1, what: str = "kv_cache") -> bytes:
    """The 128 bytes of a CUtensorMap over a contiguous cache of `num_pages` pages at `ptr`, with
    `geometry` = one of a config's `tensor_maps` (dtype, row_elems, page_size, row_bytes,
    page_bytes, box_cols, box_rows, per_kv_head: rows of num_kv_heads heads)."""
    from cuda.bindings import driver

    if ptr % 16:
        raise TensorMapError(f"{what}: address {ptr:#x} is not 16-byte aligned (TMA needs it)")
    e, g = _enums(), geometry
    heads = num_kv_heads if g.get("per_kv_head") else 1
    dims = [driver.cuuint64_t(v) for v in (g["row_elems"] * heads, g["page_size"], num_pages)]
    strides = [driver.cuuint64_t(v) for v in (g["row_bytes"] * heads, g["page_bytes"] * heads)]
    box = [driver.cuuint32_t(v) for v in (g["box_cols"], g["box_rows"], 1)]
    ones = [driver.cuuint32_t(1)] * 3
    err, tmap = driver.cuTensorMapEncodeTiled(e[g["dtype"]], 3, ptr, dims, strides, box, ones, e["interleave"],
                                              e["swizzle"], e["l2"], e["oob"])
    if err != driver.CUresult.CUDA_SUCCESS:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed ({err.name}) for a {what} at {ptr:#x} of "
                             f"{num_pages} pages x {g['page_size']} rows x {g['row_elems'] * heads} {g['dtype']} "
                             "elements")
    return ctypes.string_at(tmap.getPtr(), TENSOR_MAP_BYTES)


class PagedKVMaps:
    """Encoded maps of one tensor-map argument of a variant (its geometry), keyed by (pointer,
    pages, KV heads)."""

    MAX_ENTRIES = 64

    def __init__(self, geometry: dict, what: str = "kv_cache") -> None:
        self.geometry = geometry
        self.what = what
        self._maps: dict[tuple[int, int, int], bytes] = {}
        self._lock = threading.Lock()

    def get(self, ptr: int, num_pages: int, num_kv_heads: int = 1) -> bytes:
        key = (ptr, num_pages, num_kv_heads)
        hit = self._maps.get(key)
        if hit is None:
            hit = encode_paged_kv(ptr, num_pages, self.geometry, num_kv_heads, self.what)
            with self._lock:
                if len(self._maps) >= self.MAX_ENTRIES:
                    self._maps.clear()
                self._maps[key] = hit
        return hit
