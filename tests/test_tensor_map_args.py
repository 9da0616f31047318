"""The KV tensor map the runtime encodes for an sm90 variant uses its config's `kv_map` geometry
(the one the C launchers encode too): checked against a recording stand-in for the driver, no GPU."""
from __future__ import annotations

import ctypes

import pytest


def test_encode_passes_the_config_geometry_to_the_driver(monkeypatch):
    bindings = pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed")
    from cuda.bindings import driver as real

    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime import tensor_map

    seen = {}
    blob = (ctypes.c_uint8 * 128)(*range(128))

    class FakeMap:
        def getPtr(self):
            return ctypes.addressof(blob)

    class FakeDriver:
        cuuint64_t = cuuint32_t = staticmethod(int)
        CUresult = real.CUresult
        CUtensorMapDataType, CUtensorMapInterleave = real.CUtensorMapDataType, real.CUtensorMapInterleave
        CUtensorMapSwizzle, CUtensorMapL2promotion = real.CUtensorMapSwizzle, real.CUtensorMapL2promotion
        CUtensorMapFloatOOBfill = real.CUtensorMapFloatOOBfill

        @staticmethod
        def cuTensorMapEncodeTiled(dtype, rank, ptr, dims, strides, box, elem, *modes):
            seen.update(dtype=dtype, rank=rank, ptr=ptr, dims=dims, strides=strides, box=box, elem=elem, modes=modes)
            return real.CUresult.CUDA_SUCCESS, FakeMap()

    monkeypatch.setattr(bindings, "driver", FakeDriver)
    cfg = sm90_choice("mla_decode", "bf16", 16, 1)
    maps = tensor_map.PagedKVMaps(cfg.kv_map)
    out = maps.get(0x10000, 300)
    assert out == bytes(range(128))
    assert seen["rank"] == 3 and seen["ptr"] == 0x10000
    assert seen["dims"] == [576, 16, 300] and seen["strides"] == [1152, 1152 * 16]
    assert seen["box"] == [64, cfg.box_rows, 1] == [64, 16, 1] and seen["elem"] == [1, 1, 1]
    assert seen["dtype"] == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert seen["modes"][1] == real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    seen.clear()
    assert maps.get(0x10000, 300) == out and not seen  # cached per (pointer, pages)
    with pytest.raises(tensor_map.TensorMapError, match="not 16-byte aligned"):
        maps.get(0x10008, 300)
