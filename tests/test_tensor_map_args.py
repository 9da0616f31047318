"""The KV tensor maps the runtime encodes use the config's geometry (`DecodeConfig.tensor_maps`, the
one the C launchers encode too): the sm90 MLA `kv_map`, the GQA kv_load='tma' `k_map`/`v_map` over
rows of every KV head; checked against a recording stand-in for the driver, no GPU."""
from __future__ import annotations

import ctypes

import pytest


def _recording_driver(monkeypatch, seen):
    bindings = pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed")
    from cuda.bindings import driver as real

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
            seen.append(dict(dtype=dtype, rank=rank, ptr=ptr, dims=dims, strides=strides, box=box, elem=elem,
                             modes=modes))
            return real.CUresult.CUDA_SUCCESS, FakeMap()

    monkeypatch.setattr(bindings, "driver", FakeDriver)


def test_gqa_tma_maps_cover_every_kv_head_and_re_encode_when_the_head_count_changes(monkeypatch):
    from kvforge.runtime import tensor_map
    from kvforge.runtime.select import select_decode_config

    seen = []
    _recording_driver(monkeypatch, seen)
    cfg = select_decode_config("gqa_decode", "sm_90", "fp16", 128, heads=4, head_dim=64, s_q=1, kv_load="tma")
    (k_arg, k_cache, geometry), (v_arg, v_cache, _) = cfg.tensor_maps()
    assert (k_arg, k_cache, v_arg, v_cache) == ("k_map", "k_cache", "v_map", "v_cache")
    maps = tensor_map.PagedKVMaps(geometry, "k_cache")
    maps.get(0x20000, 50, 8)
    assert seen[-1]["dims"] == [64 * 8, 128, 50] and seen[-1]["strides"] == [128 * 8, 128 * 8 * 128]
    assert seen[-1]["box"] == [64, 64, 1]  # half a 128-row page per box: block_n = 64
    maps.get(0x20000, 50, 8)
    assert len(seen) == 1  # cached per (pointer, pages, KV heads)
    maps.get(0x20000, 50, 2)
    assert len(seen) == 2 and seen[-1]["dims"] == [64 * 2, 128, 50]
    with pytest.raises(tensor_map.TensorMapError, match="k_cache: address"):
        maps.get(0x20008, 50, 2)


def test_encode_passes_the_config_geometry_to_the_driver(monkeypatch):
    from cuda.bindings import driver as real  # importorskip'd by _recording_driver first

    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime import tensor_map

    calls = []
    _recording_driver(monkeypatch, calls)
    cfg = sm90_choice("mla_decode", "bf16", 16, 1)
    maps = tensor_map.PagedKVMaps(cfg.kv_map)
    out = maps.get(0x10000, 300)
    assert out == bytes(range(128))
    seen = calls[-1]
    assert seen["rank"] == 3 and seen["ptr"] == 0x10000
    assert seen["dims"] == [576, 16, 300] and seen["strides"] == [1152, 1152 * 16]
    assert seen["box"] == [64, cfg.box_rows, 1] == [64, 16, 1] and seen["elem"] == [1, 1, 1]
    assert seen["dtype"] == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert seen["modes"][1] == real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert maps.get(0x10000, 300) == out and len(calls) == 1  # cached per (pointer, pages)
    with pytest.raises(tensor_map.TensorMapError, match="not 16-byte aligned"):
        maps.get(0x10008, 300)


def test_fp8_gqa_tma_maps_are_byte_maps_with_128_column_boxes(monkeypatch):
    """Per-tensor fp8 GQA by TMA: the caches are seen as uint8 rows of every KV head, boxes of 128
    fp8 columns (128 bytes, the swizzle's row) by the tile's share of a page."""
    from cuda.bindings import driver as real  # importorskip'd by _recording_driver first

    from kvforge.runtime import tensor_map
    from kvforge.runtime.select import select_decode_config

    seen = []
    _recording_driver(monkeypatch, seen)
    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=256, s_q=1,
                               scale_mode="per_tensor", fp8_convert="registers", kv_load="tma")
    (_, _, geometry), _ = cfg.tensor_maps()
    tensor_map.PagedKVMaps(geometry, "k_cache").get(0x40000, 70, 2)
    assert seen[-1]["dtype"] == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8
    assert seen[-1]["dims"] == [256 * 2, 16, 70] and seen[-1]["strides"] == [256 * 2, 256 * 2 * 16]
    assert seen[-1]["box"] == [128, 16, 1]
