"""The runtime's variant choice: valid for every supported shape, and the common shapes' choices
ship pre-generated in generated/ (vendoring users get the kernels the Python API runs)."""
from __future__ import annotations

import pytest

from kvforge.codegen.arch import arch_spec
from kvforge.codegen.matrix import load_matrix
from kvforge.codegen.select import sm90_choice
from kvforge.codegen.variant import Variant
from kvforge.codegen.errors import ConfigError
from kvforge.runtime.select import select_cdna_config, select_decode_config

DEFAULT_NAMES = {v.name for v in load_matrix()}


@pytest.mark.parametrize("heads", [1, 3, 16, 20, 64, 100, 128])
@pytest.mark.parametrize("s_q", [1, 2, 3, 8])
def test_mla_choice_fits_every_head_count_and_s_q(heads, s_q):
    cfg = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=heads, head_dim=576, s_q=s_q)
    assert cfg.heads_per_cta * cfg.max_s_q <= cfg.q_rows <= 128 and cfg.max_s_q >= s_q
    assert cfg.layout.total_bytes <= arch_spec("sm_90").max_smem_per_block


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("s_q", [1, 8])
def test_gqa_choice_fits_every_head_dim_group_and_s_q(d, group, s_q):
    cfg = select_decode_config("gqa_decode", "sm_90", "fp16", 16, heads=group, head_dim=d, s_q=s_q)
    assert cfg.heads_per_cta == group and cfg.head_dim_qk == d and cfg.max_s_q >= s_q


@pytest.mark.parametrize("family,heads,d,page,s_q", [
    ("mla_decode", 128, 576, 64, 1), ("mla_decode", 16, 576, 64, 1), ("mla_decode", 32, 576, 64, 1),
    ("mla_decode", 128, 576, 64, 2), ("gqa_decode", 4, 128, 16, 1), ("gqa_decode", 1, 64, 16, 1),
])
def test_common_shapes_choose_a_pregenerated_variant(family, heads, d, page, s_q):
    cfg = select_decode_config(family, "sm_90", "bf16", page, heads=heads, head_dim=d, s_q=s_q)
    assert Variant(cfg).name in DEFAULT_NAMES


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("split", [True, False])
def test_sm90_fp8_per_tensor_choices_are_pregenerated(page, split):
    """Both sm90 per-tensor fp8 choices (lockstep + registers where the plan splits, seesaw + slot where
    it does not) are in the default matrix, so vendored users get the kernels the runtime runs."""
    cfg = select_decode_config("mla_decode", "sm_90", "bf16", page, heads=64, head_dim=576, s_q=1,
                               scale_mode="per_tensor", splits=2 if split else 1)
    assert cfg.fp8_staging == ("registers" if split else "slot") and Variant(cfg).name in DEFAULT_NAMES


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_cdna_choice_is_pregenerated(arch):
    assert Variant(select_cdna_config("mla_decode", arch, "bf16", 64, heads=128, head_dim=576,
                                      s_q=1)).name in DEFAULT_NAMES
    assert Variant(select_cdna_config("gqa_decode", arch, "bf16", 16, heads=4, head_dim=128,
                                      s_q=1)).name in DEFAULT_NAMES


# ---- the backend: sm90 (wgmma + TMA) for MLA on sm_90 from SM90_MLA_MIN_ROWS query rows, else sm80 ----
@pytest.mark.parametrize("heads,s_q", [(128, 1), (64, 1), (32, 1), (128, 2), (16, 2), (16, 4)])
@pytest.mark.parametrize("page", [16, 64, 128])
def test_mla_on_sm_90_chooses_sm90_with_enough_query_rows(heads, s_q, page):
    from kvforge.codegen.select import sm90_choice, SM90_MLA_MIN_ROWS

    assert heads * s_q >= SM90_MLA_MIN_ROWS
    cfg = select_decode_config("mla_decode", "sm_90", "bf16", page, heads=heads, head_dim=576, s_q=s_q)
    assert (cfg.backend, cfg.arch, cfg.page_size, cfg.block_n) == ("sm90", "sm_90a", page, 64)
    assert cfg.heads_per_cta * cfg.max_s_q <= cfg.q_rows == 64 and cfg.max_s_q >= s_q


def test_few_mla_query_rows_gqa_and_other_arches_choose_sm80():
    from kvforge.codegen.select import SM90_MLA_MIN_ROWS

    few = SM90_MLA_MIN_ROWS - 1
    assert select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=few, head_dim=576, s_q=1).backend == "sm80"
    for d in (64, 128, 256):
        cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=8, head_dim=d, s_q=1)
        assert (cfg.backend, cfg.arch) == ("sm80", "sm_90")
    for arch in ("sm_80", "sm_100a"):
        cfg = select_decode_config("mla_decode", arch, "bf16", 64, heads=128, head_dim=576, s_q=1)
        assert (cfg.backend, cfg.arch) == ("sm80", arch)


def test_backend_sm80_forces_sm80_for_mla_on_sm_90():
    cfg = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=128, head_dim=576, s_q=1, backend="sm80")
    assert (cfg.backend, cfg.arch) == ("sm80", "sm_90")
    assert Variant(cfg).name in DEFAULT_NAMES  # the sm80 kernel of this shape still ships pre-generated


def test_backend_sm90_where_it_has_no_kernels_and_unknown_backends_are_rejected():
    from kvforge.codegen.errors import ConfigError

    with pytest.raises(ConfigError, match=r"backend='sm90'.*gqa_decode on sm_80"):
        select_decode_config("gqa_decode", "sm_80", "bf16", 16, heads=8, head_dim=128, s_q=1, backend="sm90")
    with pytest.raises(ConfigError, match=r"backend='sm90'.*mla_decode on sm_80"):
        select_decode_config("mla_decode", "sm_80", "bf16", 64, heads=128, head_dim=576, s_q=1, backend="sm90")
    with pytest.raises(ConfigError, match=r"backend='sm100'.*'sm80' or 'sm90'"):
        select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=128, head_dim=576, s_q=1, backend="sm100")


@pytest.mark.parametrize("dtype,page,s_q", [("bf16", 16, 1), ("bf16", 32, 1), ("bf16", 64, 1), ("bf16", 128, 1),
                                             ("fp16", 64, 1), ("bf16", 64, 2), ("bf16", 64, 4)])
def test_the_common_sm90_choices_are_pregenerated(dtype, page, s_q):
    for split in (True, False):
        cfg = select_decode_config("mla_decode", "sm_90", dtype, page, heads=128, head_dim=576, s_q=s_q,
                                   splits=2 if split else 1)
        assert cfg.backend == "sm90" and Variant(cfg).name in DEFAULT_NAMES


@pytest.mark.parametrize("heads,s_q", [(1, 1), (16, 1), (64, 1), (128, 1), (16, 4), (32, 2)])
@pytest.mark.parametrize("mode,block", [("per_tensor", None), ("block", 32), ("block", 64), ("block", 128),
                                        ("fp8_ds_mla", None)])
def test_fp8_mla_takes_the_backend_16_bit_mla_takes(heads, s_q, mode, block):
    """fp8 caches follow the 16-bit rule: the sm90 kernel (fp8 tiles staged in the producers' registers
    into the 2-stage 16-bit ring) above 16 query rows per CTA, else sm80 (every layout dequantized in
    the consumers' registers from bulk-copied rows, fp16 MMAs); in the arch's shared memory, fp16
    MMAs for per-tensor scales on sm90. Except per-tensor, 64- and 128-column block-scaled and packed (fp8_ds_mla) fp8
    at 16 rows or fewer: the sm90 kernel of schedule 'keys_m' (fp8 wgmma, keys as M; the fp8 tiles by TMA, 4 stages
    in every layout, the scales in a ring of their own; the packed token's scales by the producer lanes' cp.async, 32
    more arrivals on the full barrier; block scales bulk-copied by the TMA thread, counted in its transaction bytes;
    one P^T tile per value scale block, hi and lo bytes in each row)."""
    cfg = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=heads, head_dim=576, s_q=s_q,
                               scale_mode=mode, scale_block_size=block)
    rows = heads * s_q
    keys_m = rows <= 16 and (mode in ("per_tensor", "fp8_ds_mla") or block in (64, 128))
    assert cfg.backend == ("sm90" if rows > 16 or keys_m else "sm80") and cfg.is_fp8 and cfg.scale_mode == mode
    assert (cfg.backend == "sm90" and cfg.schedule == "keys_m") == keys_m
    if keys_m:
        assert cfg.num_kv_stages == 4 and cfg.threads == (288 if mode == "per_tensor" else 384) and cfg.ctas_per_sm == 1
        assert cfg.full_arrivals == (33 if mode == "fp8_ds_mla" else 1)
        t = cfg.keys_m_tiling
        assert t.scale_block == (block or 0) and t.stage_bytes == 5 * 64 * 128
        assert ("kv_scales" in {r.name for r in cfg.layout.regions}) == (mode != "per_tensor")
        assert cfg.layout.total_bytes <= 232448
        assert t.tile_tx_bytes == 5 * 64 * 128 + (64 * 4 * -(-576 // block) if block else 0)
        assert t.p_tiles == {None: 1 if mode == "per_tensor" else 4, 64: 8, 128: 4}[block] and t.p_lo_bytes == 64
        assert t.producer_warpgroup == (mode != "per_tensor") and cfg.producer_regs + 2 * cfg.math_regs <= 504
        assert t.qk_accumulators == (1 if mode == "per_tensor" else 3 if block == 64 else 2)
        assert cfg.heads_per_cta * cfg.max_s_q == 16 and cfg.max_s_q == s_q
        assert any(a.name == "kv_map" for a in Variant(cfg).contracts["main"].args)
    elif cfg.backend == "sm80":
        assert cfg.threads <= 384 and cfg.max_s_q >= s_q
        assert cfg.fp8_convert == "registers" and cfg.convert is None and cfg.kv_load == "bulk"
        assert cfg.register_block_scales == (mode != "per_tensor")
    else:
        assert cfg.fp8_staging == "registers" and cfg.num_kv_stages == 2 and cfg.kv16_tiles == 2
        assert cfg.kv8_stage_bytes == 0 and "kv8_stages" not in {r.name for r in cfg.layout.regions}
        assert cfg.full_arrivals == 128 and cfg.producer_regs + 2 * cfg.math_regs <= 504
        assert all(a.name != "kv_map" for a in Variant(cfg).contracts["main"].args)
        ring = sm90_choice("mla_decode", "bf16", 64, s_q, {"kv_dtype": "fp8_e4m3", "scale_mode": mode,
                                                          "scale_block_size": block}, fp8_staging="fp8_ring")
        assert ring.num_kv_stages == (2 if mode == "per_tensor" else 1) and ring.kv16_tiles == 1
        assert ring.kv8_stage_bytes >= 64 * ring.kv_token_bytes and ring.full_arrivals == 1
    assert cfg.layout.total_bytes <= arch_spec("sm_90").max_smem_per_block
    assert cfg.mma_dtype == ("fp16" if mode == "per_tensor" or cfg.backend == "sm80" else "bf16")


@pytest.mark.parametrize("arch,mode,block,path,load", [
    ("sm_90", "block", 32, "registers", "bulk"), ("sm_90", "block", 64, "registers", "bulk"),
    ("sm_90", "block", 128, "registers", "bulk"), ("sm_90", "fp8_ds_mla", None, "registers", "bulk"),
    ("sm_100a", "block", 32, "ring", "cp_async"), ("sm_100a", "block", 64, "ring", "cp_async"),
    ("sm_89", "block", 64, "registers", "cp_async"),  # the ring's 16-bit tiles do not fit sm_89's 99 KB
    ("sm_100a", "block", 128, "registers", "cp_async"), ("sm_89", "fp8_ds_mla", None, "registers", "cp_async")])
def test_block_scaled_fp8_mla_at_16_rows_is_dequantized_in_registers_where_measured_faster(arch, mode, block, path,
                                                                                          load):
    """bench/mla_fp8_blocks_ab.py (H200): block-scaled and packed fp8 MLA at 16 query rows on the register
    path with bulk-copied rows 1.25-1.85x faster than the convert warps at b >= 64; on 16-byte cp.async
    rows block 64 (P re-scaled for two V scale blocks per warp) 0.90-0.91x of them (kept on the ring where
    it fits), block 128 and the packed token 1.15-1.61x. The packed token's 656-byte rows stay unswizzled
    (16 mod 128 bytes), 576-byte bulk rows padded to 592."""
    # (pinned to sm80: on sm_90 the packed token at 16 rows is schedule keys_m's since the thirty-third session)
    cfg = select_decode_config("mla_decode", arch, "bf16", 64, heads=16, head_dim=576, s_q=1, scale_mode=mode,
                               scale_block_size=block, backend="sm80")
    assert cfg.backend == "sm80" and cfg.fp8_convert == path and cfg.kv_load == load
    if path == "registers":
        assert cfg.qk_steps_interleaved and cfg.v_scale_normalized and cfg.fp8_swizzle == (
            0 if mode == "fp8_ds_mla" or load == "bulk" else cfg.fp8_swizzle)
        assert cfg.kv8_row_stride == (656 if mode == "fp8_ds_mla" else 592 if load == "bulk" else 576)
        assert cfg.kv8_stage_bytes == cfg.block_n * cfg.kv8_row_stride + (
            4 * cfg.scale_blocks * cfg.block_n if mode == "block" else 0)
        assert cfg.v_scale_offset == cfg.k_scale_offset == (512 if mode == "fp8_ds_mla" else cfg.kv8_scale_offset)


@pytest.mark.parametrize("d,convert", [(64, 6), (128, 6), (256, 4)])
def test_fp8_gqa_takes_six_convert_warps_but_four_at_d256(d, convert):
    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=d, s_q=1,
                               scale_mode="per_tensor", fp8_convert="ring")
    assert cfg.convert.num_convert == convert and cfg.pipeline.num_producer == 2 and cfg.ctas_per_sm == 2


def test_fp8_is_refused_where_it_cannot_run():
    from kvforge.codegen.errors import ConfigError

    with pytest.raises(ConfigError, match=r"registers per math thread cannot hold 128 output accumulators"):
        select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=16, head_dim=256, s_q=8, backend="sm90",
                             scale_mode="per_tensor")
    with pytest.raises(ConfigError, match=r"arch='sm_86': fp8_e4m3 KV is converted with the hardware e4m3"):
        select_decode_config("gqa_decode", "sm_86", "bf16", 16, heads=4, head_dim=128, s_q=1,
                             scale_mode="per_tensor")


@pytest.mark.parametrize("family,heads,d,page,mode,block", [
    ("mla_decode", 16, 576, 64, "per_tensor", None), ("mla_decode", 16, 576, 64, "fp8_ds_mla", None),
    ("mla_decode", 16, 576, 64, "block", 64), ("gqa_decode", 4, 128, 16, "per_tensor", None),
    ("gqa_decode", 8, 128, 16, "per_tensor", None),
])
def test_common_fp8_shapes_choose_a_pregenerated_variant(family, heads, d, page, mode, block):
    cfg = select_decode_config(family, "sm_90", "bf16", page, heads=heads, head_dim=d, s_q=1, scale_mode=mode,
                               scale_block_size=block)
    assert Variant(cfg).name in DEFAULT_NAMES


@pytest.mark.parametrize("d,arch,dtype,load", [
    (128, "sm_90", "bf16", "bulk"), (256, "sm_90", "fp16", "bulk"), (64, "sm_90", "bf16", "tma"),
    (128, "sm_89", "bf16", "cp_async"), (64, "sm_100a", "bf16", "cp_async"), (128, "sm_100a", "bf16", "cp_async"),
])
def test_gqa_on_sm_90_loads_rows_by_bulk_copy_from_d128_and_by_tma_at_d64(d, arch, dtype, load):
    """Measured on the H200 (bench/RESULTS.md): cp.async.bulk per row beats 16-byte cp.async (and
    TMA boxes) at D = 128 and 256; at D = 64 TMA boxes at four CTAs per SM beat both; unmeasured
    arches keep cp.async."""
    cfg = select_decode_config("gqa_decode", arch, dtype, 16, heads=4, head_dim=d, s_q=1)
    assert cfg.kv_load == load and cfg.pipeline.num_producer == (1 if load == "tma" else 4)
    if load == "tma":
        assert (cfg.block_n, cfg.num_kv_stages, cfg.ctas_per_sm) == (64, 3, 4)
        assert [a for a, _, _ in cfg.tensor_maps()] == ["k_map", "v_map"]


@pytest.mark.parametrize("page_size,heads,s_q,arch,load", [
    (64, 16, 1, "sm_90", "bulk"), (16, 8, 2, "sm_90", "bulk"), (128, 4, 4, "sm_90", "bulk"), (32, 16, 1, "sm_90", "bulk"),
    (64, 16, 1, "sm_89", "cp_async"), (64, 16, 1, "sm_100a", "cp_async")])
def test_mla_on_the_sm80_kernel_loads_rows_by_bulk_copy_on_sm_90(page_size, heads, s_q, arch, load):
    """Measured on the H200 (bench/RESULTS.md "Bulk copies for MLA"): one cp.async.bulk per
    1152-byte row is 1.2-10% faster than 16-byte cp.async for MLA's 16-row CTAs, and one per
    576-byte fp8 token (register path, rows padded to 592 bytes) 1.05-1.26x; other arches keep
    cp.async, and so do CTAs of more rows with fp8 (their load-and-convert ring)."""
    cfg = select_decode_config("mla_decode", arch, "bf16", page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80")
    assert cfg.kv_load == load
    fp8 = select_decode_config("mla_decode", arch, "bf16", page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80", scale_mode="per_tensor")
    # fp8: the register path (16 query rows or fewer) by bulk copies, the load-and-convert ring by cp.async
    assert fp8.kv_load == (load if fp8.fp8_registers else "cp_async")
    if fp8.kv_load == "bulk":
        assert fp8.fp8_bulk_rows and fp8.kv8_row_stride == 592 and fp8.fp8_swizzle == 0
    blk = select_decode_config("mla_decode", arch, "bf16", page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80", scale_mode="block", scale_block_size=64)
    if arch == "sm_90":  # bulk rows: the register path wherever per-tensor takes it
        assert blk.fp8_registers == fp8.fp8_registers and blk.kv_load == (load if blk.fp8_registers else "cp_async")
    else:  # cp.async rows: the ring where it fits (sm_100a), else the register path (sm_89's 99 KB)
        assert blk.kv_load == "cp_async" and blk.fp8_registers == (arch == "sm_89")


@pytest.mark.parametrize("page_size,heads,s_q,tile", [
    (64, 16, 1, (32, 3, 4, 4)), (16, 1, 1, (32, 3, 4, 4)), (128, 8, 2, (32, 3, 4, 4)), (32, 2, 8, (32, 3, 4, 4)),
    (64, 4, 4, (32, 3, 4, 4)), (128, 16, 2, (32, 4, 4, 8))])
def test_16_bit_mla_of_one_row_group_takes_the_measured_bulk_tile(page_size, heads, s_q, tile):
    """bench/mla16_ab.py (H200, twelfth session): 16-bit MLA at 16 query rows per CTA on sm_90 runs
    32-key tiles in 3 stages (1.03-1.05x over the deepest ring that fits); CTAs of two row groups
    (unmeasured) keep the deepest ring. Calls of 16 rows or fewer (8 heads at s_q = 2, 2 at s_q = 8) take 16-row
    CTAs (before the thirty-seventh session: 16 heads per CTA at least, 32 and 64 rows)."""
    from kvforge.codegen.select import MLA_BULK_TILE

    assert MLA_BULK_TILE == (32, 3, 4, 4)
    cfg = select_decode_config("mla_decode", "sm_90", "bf16", page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80")
    assert cfg.kv_load == "bulk"
    assert (cfg.block_n, cfg.num_kv_stages, cfg.pipeline.num_producer, cfg.pipeline.num_consumer) == tile


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("page_size", [16, 128])
def test_kv_load_pins_tma_for_every_gqa_head_dim(d, page_size):
    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", page_size, heads=8, head_dim=d, s_q=2, kv_load="tma")
    assert cfg.kv_load == "tma" and cfg.pipeline.num_producer == 1 and cfg.ctas_per_sm >= 2
    assert cfg.stage_bytes == 2 * cfg.block_n * d * 2 and cfg.layout["kv_stages"].offset % 1024 == 0
    assert cfg.tma_box_rows == min(page_size, cfg.block_n)


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("page_size", [16, 64, 128])
def test_kv_load_pins_tma_for_per_tensor_fp8_gqa(d, page_size):
    """fp8 tiles by TMA: one producer warp, dense fp8 tiles on 1024-byte boundaries, boxes of 128
    fp8 columns through uint8 tensor maps, P read by ldmatrix (16 bytes of row padding)."""
    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", page_size, heads=4, head_dim=d, s_q=1,
                               scale_mode="per_tensor", fp8_convert="registers", kv_load="tma")
    assert cfg.kv_load == "tma" and cfg.fp8_registers and cfg.pipeline.num_producer == 1 and cfg.ctas_per_sm >= 2
    assert cfg.stage_bytes == 2 * cfg.block_n * d and cfg.layout["kv_stages"].offset % 1024 == 0
    assert cfg.fp8_swizzle == 0 and cfg.p_row_stride == 2 * cfg.block_n + 16
    (_, _, k_geom), (_, _, v_geom) = cfg.tensor_maps()
    assert k_geom == v_geom and k_geom["dtype"] == "fp8_e4m3" and k_geom["box_cols"] == 128
    assert k_geom["row_bytes"] == d and k_geom["box_rows"] == min(page_size, cfg.block_n)


def test_kv_load_rejects_unknown_values():
    with pytest.raises(ConfigError, match="kv_load='dma': choose 'cp_async', 'bulk' or 'tma'"):
        select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=128, s_q=1, kv_load="dma")


@pytest.mark.parametrize("d,scale_mode,block,arch,load", [
    (128, "per_tensor", None, "sm_90", "tma"), (256, "per_tensor", None, "sm_90", "tma"),
    (64, "per_tensor", None, "sm_90", "cp_async"), (128, "block", 64, "sm_90", "cp_async"),
    (128, "per_tensor", None, "sm_89", "cp_async")])
def test_fp8_gqa_takes_tma_for_per_tensor_tiles_of_128_byte_rows_on_sm_90(d, scale_mode, block, arch, load):
    """Measured on the H200 (bench/fp8_tma_ab.py): TMA boxes 0.4-2.8% faster than 16-byte cp.async
    for per-tensor fp8 at D = 128 and 256, with 64-key tiles and four consumer warps; block scales,
    D = 64 (64-byte rows) and other arches keep cp.async; never bulk copies."""
    cfg = select_decode_config("gqa_decode", arch, "bf16", 16, heads=4, head_dim=d, s_q=1, scale_mode=scale_mode,
                               scale_block_size=block)
    assert cfg.kv_load == load and cfg.fp8_registers
    if load == "tma":
        assert (cfg.block_n, cfg.pipeline.num_producer, cfg.pipeline.num_consumer, cfg.ctas_per_sm) == (64, 1, 4, 2)
        assert cfg.num_kv_stages == (6 if d == 128 else 3)
    mla = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=16, head_dim=576, s_q=1, backend="sm80",
                               scale_mode=scale_mode, scale_block_size=block)
    assert mla.kv_load == "bulk" and mla.fp8_registers  # MLA on the sm80 backend here: every layout in registers


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_gqa_per_tensor_dequantizes_in_registers(d):
    """GQA (per-tensor and block scales): no convert warps, the MMA ring holds fp8 tiles (block
    scales apart, [block][key] per K and V); MLA keeps the load-and-convert ring."""
    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=d, s_q=1, scale_mode="per_tensor")
    assert cfg.fp8_convert == "registers" and cfg.convert is None and cfg.ctas_per_sm >= 2
    assert cfg.threads == 32 * (cfg.pipeline.num_producer + cfg.pipeline.num_consumer)
    assert cfg.stage_bytes == 2 * cfg.block_n * d and cfg.cols_per_warp % 32 == 0
    blk = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=d, s_q=1, scale_mode="block",
                               scale_block_size=32)
    assert blk.fp8_convert == "registers" and blk.convert is None and blk.pv_dtype == "fp16" and blk.v_scale_normalized
    assert blk.stage_bytes == 2 * blk.block_n * d + 2 * (d // 32) * blk.block_n * 4
    mla = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=16, head_dim=576, s_q=1, backend="sm80",
                               scale_mode="per_tensor")
    assert mla.fp8_convert == "registers" and mla.qk_depth_split and mla.cols_per_warp == 128
    mla2 = select_decode_config("mla_decode", "sm_90", "bf16", 32, heads=16, head_dim=576, s_q=2, backend="sm80",
                                scale_mode="per_tensor")
    assert mla2.fp8_convert == "ring" and mla2.convert is not None  # 32 query rows: the ring


def test_fp8_convert_choice_is_checked():
    with pytest.raises(ConfigError, match="fp8_convert='sideways'"):
        select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=128, s_q=1,
                             scale_mode="per_tensor", fp8_convert="sideways")


def test_the_combine_is_launched_programmatically_by_default_on_sm_90(monkeypatch):
    """Measured (bench/pdl_ab.py): sm80-backend kernels gain from PDL, and the sm90 MLA kernel too now
    that its CTAs trigger the combine by exiting; an arch without PDL keeps the plain launch;
    KVFORGE_PDL=1/0 overrides the default wherever the arch has PDL."""
    from kvforge.codegen.select import combine_pdl
    from kvforge.runtime import plan

    gqa = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=128, s_q=1)
    mla = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=128, head_dim=576, s_q=1)
    old = select_decode_config("gqa_decode", "sm_89", "bf16", 16, heads=4, head_dim=128, s_q=1)
    assert (combine_pdl(gqa), combine_pdl(mla), combine_pdl(old)) == (True, True, False)
    for env, want in ((None, (True, True, False)), ("1", (True, True, False)), ("0", (False, False, False))):
        monkeypatch.setattr(plan, "PDL", env)
        assert tuple(plan.uses_pdl(c) for c in (gqa, mla, old)) == want, env


@pytest.mark.parametrize("v_convert,normalized,pv", [(None, True, "fp16"), ("bits", False, "bf16"), ("cvt", True, "fp16")])
def test_block_scales_take_v_by_cvt_with_normalized_scales_or_by_bit_moves(v_convert, normalized, pv):
    """Block-scaled fp8 on the register path: V converted into fp16 with P carrying V scale / C
    (`v_scale_normalized`; the default, measured 1.3-6.3% faster) or, with fp8_v_convert='bits',
    bit-moved into bf16."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build

    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=4, head_dim=128, s_q=1, scale_mode="block",
                               scale_block_size=64)
    if v_convert:
        cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "fp8_v_convert": v_convert})
    assert (cfg.v_scale_normalized, cfg.pv_dtype, cfg.raw_bf16_v) == (normalized, pv, not normalized)


def test_sm90_schedule_rule():
    """16-bit MLA on sm_90: the seesaw where the split plan cuts each sequence into at most
    policy.SEESAW_MAX_SPLITS chunks (1: the grid fills the GPU without cutting them), the lockstep beyond
    (or where the batch is unknown); per-tensor fp8 caches the seesaw with the in-slot conversion where
    16-bit ones take the seesaw, every other fp8 launch the lockstep with the fp8 tiles staged in the
    producers' registers."""
    from kvforge.codegen import policy, select

    assert policy.SEESAW_MAX_SPLITS == 1
    assert select.sm90_schedule(1) == "seesaw" and select.sm90_schedule(2) == "lockstep"
    assert select.sm90_schedule(None) == "lockstep" and select.sm90_schedule(64) == "lockstep"
    assert sm90_choice_schedule(128) == "lockstep"  # no batch: counted as split
    assert sm90_choice_schedule(128, splits=1) == "seesaw" and sm90_choice_schedule(128, splits=3) == "lockstep"
    per_tensor = {"kv_dtype": "fp8_e4m3", "scale_mode": "per_tensor"}
    for split, layout, block, want in ((False, "per_tensor", None, ("seesaw", "slot")),
                                       (True, "per_tensor", None, ("lockstep", "registers")),
                                       (False, "block", 128, ("lockstep", "registers")),
                                       (False, "fp8_ds_mla", None, ("lockstep", "registers"))):
        kv = {"kv_dtype": "fp8_e4m3", "scale_mode": layout, "scale_block_size": block}
        cfg = select.sm90_choice("mla_decode", "bf16", 64, 1, kv=kv, splits=2 if split else 1)
        assert (cfg.schedule, cfg.fp8_staging) == want, (split, layout)
    slot = select.sm90_choice("mla_decode", "bf16", 16, 1, kv=per_tensor, splits=1)
    assert slot.full_arrivals == 64 and slot.landed_barriers == 4 and slot.producer_regs + 2 * slot.math_regs <= 504
    assert [a.name for a in Variant(slot).contracts["main"].args][-1] == "kv_map"  # the fp8 boxes come by TMA
    assert [(s["first_chunk"], s["chunks"], s["boxes"], s["box_chunk"], s["col0"]) for s in slot.slot_subs] == [
        (0, 4, 2, 2, 0), (4, 5, 3, 6, 256)]
    assert select.sm90_choice("mla_decode", "bf16", 64, 1, kv=per_tensor, fp8_staging="slot").schedule == "seesaw"
    # 132 SMs: the planner splits while 2 x CTAs <= 132; 128 heads are 2 head blocks per sequence
    assert not select.sm90_sequences_split(34, 128, 1, 132) and select.sm90_sequences_split(33, 128, 1, 132)
    assert not select.sm90_sequences_split(67, 64, 1, 132) and select.sm90_sequences_split(66, 64, 1, 132)
    assert not select.sm90_sequences_split(67, 32, 2, 132) and select.sm90_sequences_split(1, 128, 1, 132)
    assert [select.sm90_splits(b, 128, 1, 132) for b in (1, 16, 17, 22, 23, 33, 34)] == [64, 4, 3, 3, 2, 2, 1]


def test_the_seesaw_split_limit_moves_the_choice(monkeypatch):
    """policy.SEESAW_MAX_SPLITS is the one place the rule's limit lives: raised to 2, the two-chunk
    launches (128 heads: 23..33 sequences on 132 SMs) take the seesaw and three chunks keep the lockstep."""
    from kvforge.codegen import policy, select

    select._select_decode_config.cache_clear()
    monkeypatch.setattr(policy, "SEESAW_MAX_SPLITS", 2)
    try:
        got = {b: sm90_choice_schedule(128, splits=select.sm90_splits(b, 128, 1, 132)) for b in (1, 22, 23, 33, 34)}
        assert got == {1: "lockstep", 22: "lockstep", 23: "seesaw", 33: "seesaw", 34: "seesaw"}
    finally:
        select._select_decode_config.cache_clear()


def sm90_choice_schedule(heads, **kw):
    return select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=heads, head_dim=576, s_q=1, **kw).schedule


@pytest.mark.parametrize("heads,s_q", [(17, 1), (32, 2), (64, 1), (100, 1), (128, 1), (64, 2), (16, 4), (128, 8)])
def test_the_schedule_rule_predicts_the_split_plan_of_the_variant_it_picks(heads, s_q):
    """sm90_splits (and sm90_sequences_split) restate the plan's formula (policy.num_splits over batch x
    head blocks at the sm90 CTA's occupancy); they must agree with what the chosen variant's plan computes."""
    from kvforge.codegen import policy
    from kvforge.codegen.select import sm90_sequences_split, sm90_splits

    for sms in (78, 114, 132):
        for batch in (1, 2, 7, 16, 33, 34, 66, 67, 128, 300):
            split = sm90_sequences_split(batch, heads, s_q, sms)
            splits = sm90_splits(batch, heads, s_q, sms)
            cfg = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=heads, head_dim=576, s_q=s_q,
                                       splits=splits)
            plan_splits = policy.num_splits(batch * cfg.head_blocks(heads, 1), cfg.ctas_per_sm, sms)
            assert split == (plan_splits > 1) and splits == plan_splits, (sms, batch, cfg.schedule)


def test_long_chunks_hint_takes_the_seesaw_for_16_bit_split_launches_only():
    """sm90_schedule(splits, long_chunks): the caller's max_seq_len hint (sm90_long_chunks) takes the seesaw on
    a split launch; fp8 staging keeps its own rule; the hinted and plain choices are cached apart."""
    from kvforge.codegen.select import select_decode_config, sm90_long_chunks, sm90_schedule

    assert sm90_schedule(2) == "lockstep" and sm90_schedule(2, True) == "seesaw" and sm90_schedule(1) == "seesaw"
    plain = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=128, head_dim=576, s_q=1, splits=2)
    hinted = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=128, head_dim=576, s_q=1, splits=2,
                                  long_chunks=True)
    assert (plain.schedule, hinted.schedule) == ("lockstep", "seesaw")
    fp8 = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=128, head_dim=576, s_q=1, splits=2,
                               scale_mode="per_tensor", long_chunks=True)
    assert fp8.schedule == "lockstep"  # the select_config caller passes long_chunks for 16-bit caches only;
    # (sm90_choice's fp8 branch has its own rule, sm90_fp8_staging, which the hint does not reach)
    assert sm90_long_chunks(8192, 32, 128, 1, 132) and not sm90_long_chunks(2048, 32, 128, 1, 132)
    assert not sm90_long_chunks(8192, 32, 64, 1, 132) and not sm90_long_chunks(8192, 128, 128, 1, 132)


@pytest.mark.parametrize("family,hq,hkv,d,s_q,scale", [
    ("mla_decode", 128, 1, 576, 1, "none"), ("mla_decode", 64, 1, 576, 1, "none"),
    ("mla_decode", 32, 1, 576, 2, "none"), ("mla_decode", 16, 1, 576, 1, "none"), ("mla_decode", 128, 1, 576, 1, "per_tensor"),
    ("gqa_decode", 32, 8, 128, 1, "none"), ("gqa_decode", 64, 8, 128, 1, "per_tensor")])
@pytest.mark.parametrize("arch,sms", [("sm_90", 132), ("sm_80", 108)])
def test_plan_choices_are_every_choice_of_every_batch_and_hint(monkeypatch, family, hq, hkv, d, s_q, scale, arch, sms):
    """`plan_choices` (what `kvforge plan` lists and a plan object loads) holds the runtime's choice for every batch
    1 .. max_batch, with and without a max_seq_len hint, and nothing else: no run of the plan object compiles."""
    from kvforge.codegen.select import plan_choices, sm90_long_chunks
    from kvforge.runtime import decode
    from kvforge.runtime.kv_format import KVFormat

    if scale != "none" and arch == "sm_80":
        pytest.skip("fp8 needs sm_89+")
    monkeypatch.setattr(decode, "_on_rocm", lambda: False)
    monkeypatch.setattr(decode, "device_arch", lambda device_id=0: arch)
    monkeypatch.setattr(decode, "sm_count", lambda device_id=0: sms)
    kv = KVFormat("fp8_e4m3", scale, None) if scale != "none" else None
    group = hq if family == "mla_decode" else hq // hkv
    max_batch = 300
    # the hint as the runtime can pass it: mla_decode's max_seq_len gives long chunks only where sm90_long_chunks
    # says some length does (split launches of two head blocks or more)
    every = {decode.select_config(family, "bf16", 64, group, d, s_q, 0, kv, b, long)
             for b in range(1, max_batch + 1)
             for long in ((False, True) if sm90_long_chunks(1 << 31, b, group, s_q, sms) else (False,))}
    planned = plan_choices(family, arch, sms, "bf16", 64, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, s_q=s_q,
                           max_batch=max_batch, scale_mode=scale)
    assert len(planned) == len(set(planned)) and set(planned) == every
    assert planned[0] == decode.select_config(family, "bf16", 64, group, d, s_q, 0, kv, max_batch)


def test_plan_choices_on_rocm_is_the_cdna_choice_and_refuses_fp8():
    from kvforge.codegen.select import plan_choices

    cfg, = plan_choices("gqa_decode", "gfx942", 0, "bf16", 16, num_q_heads=32, num_kv_heads=8, head_dim=128, s_q=1,
                        max_batch=64)
    assert cfg == select_cdna_config("gqa_decode", "gfx942", "bf16", 16, heads=4, head_dim=128, s_q=1)
    with pytest.raises(ConfigError, match="fp8"):
        plan_choices("mla_decode", "gfx942", 0, "bf16", 64, num_q_heads=16, num_kv_heads=1, head_dim=576, s_q=1,
                     max_batch=8, scale_mode="per_tensor")


@pytest.mark.parametrize("heads,s_q,fp8", [(128, 1, None), (64, 1, None), (32, 2, None), (128, 1, "per_tensor")])
def test_a_plan_object_loads_exactly_the_plan_choices(monkeypatch, heads, s_q, fp8):
    """MLADecode's constructor (device facts and the loader stubbed: no GPU here) loads `plan_choices`' variants,
    the choice at max_batch first."""
    from types import SimpleNamespace

    from kvforge.codegen.select import plan_choices
    from kvforge.runtime import decode

    monkeypatch.setattr(decode, "_on_rocm", lambda: False)
    monkeypatch.setattr(decode, "device_arch", lambda device_id=0: "sm_90")
    monkeypatch.setattr(decode, "sm_count", lambda device_id=0: 132)
    loaded = []
    monkeypatch.setattr(decode, "plan_for", lambda cfg, dev: loaded.append(cfg) or SimpleNamespace(num_sms=132))
    dec = decode.MLADecode(num_heads=heads, page_size=64, max_batch=300, s_q=s_q, fp8_layout=fp8)
    assert loaded == plan_choices("mla_decode", "sm_90", 132, "bf16", 64, num_q_heads=heads, num_kv_heads=1,
                                  head_dim=576, s_q=s_q, max_batch=300,
                                  scale_mode=fp8 or "none") == list(dec._plans)


@pytest.mark.parametrize("group,s_q,d,backend", [(4, 1, 128, "sm80"), (16, 1, 128, "sm80"), (4, 8, 128, "sm90"),
                                                (16, 4, 64, "sm90"), (8, 8, 256, "sm90"), (16, 8, 128, "sm90"),
                                                (16, 8, 256, "sm90")])
def test_gqa_on_sm_90_takes_the_wgmma_kernel_from_32_rows_per_kv_head(group, s_q, d, backend):
    """sm90_gqa.SM90_GQA_MIN_ROWS query rows per KV head (group x s_q) and more run the sm90 GQA kernel (bench/
    gqa_rows.py); fewer the sm80 kernel; its ring is the deepest that keeps its CTAs per SM."""
    from kvforge.codegen.sm90_gqa import SM90_GQA_MIN_ROWS

    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=group, head_dim=d, s_q=s_q)
    assert cfg.backend == backend and (group * s_q >= SM90_GQA_MIN_ROWS) == (backend == "sm90")
    if backend == "sm90":
        assert cfg.arch == "sm_90a" and cfg.q_rows == 64 * -(-group * s_q // 64)
        assert cfg.layout.total_bytes <= 232448
        deeper = cfg.num_kv_stages + 1
        if deeper <= 4:  # one more stage would lose a CTA per SM or not fit
            from kvforge.codegen.sm90_gqa import Sm90GqaTiling

            t = Sm90GqaTiling(head_dim=d, rows=group * s_q, page_size=16, stages=deeper)
            assert t.problems() or t.ctas_per_sm < cfg.ctas_per_sm
    # fp8 (test below): pinned, the sm90 kernel dequantizes in the producers (no tensor maps), where a tiling holds
    # the shape
    if not (d == 256 and group * s_q > 64):  # there the accumulators and the producers' registers do not fit
        pinned = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=group, head_dim=d, s_q=s_q,
                                      scale_mode="per_tensor", backend="sm90")
        assert pinned.is_fp8 and pinned.converts_in_producer and not pinned.tensor_maps()


@pytest.mark.parametrize("layout,block,group,s_q,d,backend", [
    ("per_tensor", None, 4, 4, 128, "sm80"), ("per_tensor", None, 4, 8, 128, "sm90"),
    ("per_tensor", None, 8, 4, 64, "sm90"), ("per_tensor", None, 4, 8, 256, "sm80"),
    ("per_tensor", None, 8, 8, 256, "sm90"), ("per_tensor", None, 16, 8, 256, "sm80"),
    ("block", 128, 4, 8, 128, "sm80"), ("block", 128, 16, 4, 128, "sm90"), ("block", 32, 8, 4, 64, "sm80"),
    ("block", 64, 16, 8, 64, "sm90"), ("block", 128, 8, 8, 256, "sm90")])
def test_fp8_gqa_on_sm_90_takes_the_wgmma_kernel_from_its_layouts_row_count(layout, block, group, s_q, d, backend):
    """fp8 GQA on sm_90 runs the sm90 kernel from sm90_gqa.sm90_gqa_min_rows(head_dim, layout) query rows per KV
    head (per-tensor 32, at D = 256 64; block scales 64: bench/gqa_rows.py --fp8), the sm80 kernel below, and
    where no sm90 tiling holds the shape (fp8 at D = 256 with more than 64 rows)."""
    from kvforge.codegen.sm90_gqa import sm90_gqa_min_rows

    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 16, heads=group, head_dim=d, s_q=s_q,
                               scale_mode=layout, scale_block_size=block)
    assert cfg.backend == backend and cfg.is_fp8
    if group * s_q <= 64:
        assert (group * s_q >= sm90_gqa_min_rows(d, layout)) == (backend == "sm90")
        assert select_decode_config("gqa_decode", "sm_89", "bf16", 16, heads=group, head_dim=d, s_q=s_q,
                                    scale_mode=layout, scale_block_size=block).backend == "sm80"


def test_the_sm80_kernels_fields_pin_its_backend():
    """fp8_convert and kv_load belong to the sm80 kernel: given without a backend they choose it (where the built-in
    choice would be the sm90 kernel, which has neither), and with backend='sm90' they are refused by name."""
    from kvforge.codegen.errors import ConfigError

    kw = dict(heads=16, head_dim=64, s_q=4, scale_mode="per_tensor")
    assert select_decode_config("gqa_decode", "sm_90", "bf16", 32, **kw).backend == "sm90"
    cfg = select_decode_config("gqa_decode", "sm_90", "bf16", 32, fp8_convert="ring", **kw)
    assert cfg.backend == "sm80" and cfg.fp8_convert == "ring"
    assert select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=64, head_dim=576, s_q=1,
                                kv_load="cp_async").backend == "sm80"
    with pytest.raises(ConfigError, match=r"fp8_convert='ring'.*backend='sm90' takes neither"):
        select_decode_config("gqa_decode", "sm_90", "bf16", 32, fp8_convert="ring", backend="sm90", **kw)



@pytest.mark.parametrize("arch,fmt", [("sm_86", ("none", None)), ("sm_89", ("none", None)),
                                      ("sm_89", ("per_tensor", None)), ("sm_89", ("block", 64)),
                                      ("sm_89", ("fp8_ds_mla", None))])
def test_mla_past_16_rows_on_99_kb_arches_takes_several_16_row_head_blocks(arch, fmt):
    """sm_86 and sm_89 (99 KB of shared memory) hold the sm80 MLA kernel's rings for 16 query rows, not 32: there
    every head count and s_q still has a config (before the thirty-seventh session 32+ rows raised 'no sm80 variant
    fits'), with 16 rows per CTA and the heads over several head blocks; on sm_90 the choice is unchanged."""
    for heads in (1, 8, 16, 32, 64, 128):
        for s_q in (1, 2, 4, 8):
            cfg = select_decode_config("mla_decode", arch, "bf16", 64, heads=heads, head_dim=576, s_q=s_q,
                                       scale_mode=fmt[0], scale_block_size=fmt[1])
            assert cfg.backend == "sm80" and cfg.heads_per_cta * cfg.max_s_q <= 16
            assert cfg.head_blocks(heads, 1) == -(-heads // cfg.heads_per_cta)
            if heads * s_q <= 16:  # one head block where 16 rows hold the call
                assert cfg.head_blocks(heads, 1) == 1
    big = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=32, head_dim=576, s_q=1, backend="sm80")
    assert big.heads_per_cta == 32  # 227 KB: one 32-row CTA, as before


def test_gqa_d256_past_the_99_kb_arches_rows_is_refused_by_name():
    """GQA packs a KV head's whole query group into one CTA: at D = 256 with 64 query rows (group x s_q) the sm80
    kernel's accumulators and ring fit no sm_86/sm_89 CTA (README says so); the refusal names the shape and arch."""
    for arch in ("sm_86", "sm_89"):
        assert select_decode_config("gqa_decode", arch, "bf16", 16, heads=4, head_dim=256, s_q=8)  # 32 rows fit
        with pytest.raises(ConfigError, match=rf"no sm80 variant fits gqa_decode with heads=8, head_dim=256, "
                                              rf"s_q=8.*{arch}"):
            select_decode_config("gqa_decode", arch, "bf16", 16, heads=8, head_dim=256, s_q=8)
    assert select_decode_config("gqa_decode", "sm_89", "bf16", 16, heads=8, head_dim=256, s_q=8,
                                scale_mode="per_tensor")  # 64 rows of fp8 fit sm_89


@pytest.mark.parametrize("arch", ["sm_90", "sm_100a"])
@pytest.mark.parametrize("heads,s_q", [(1, 1), (16, 1), (1, 2), (8, 2), (1, 4), (3, 4), (4, 4), (1, 8), (2, 8),
                                       (16, 2), (5, 4), (32, 1), (20, 2), (128, 8)])
def test_mla_ctas_hold_as_few_rows_as_the_heads_need(arch, heads, s_q):
    """The sm80 MLA kernel's CTA (heads_per_cta x s_q rows) is the smallest power-of-two head count, down to one
    16-row mma tile, that holds the call's heads (up to 64 rows): no CTA of 4 heads at s_q = 4 computes 64 rows."""
    cfg = select_decode_config("mla_decode", arch, "bf16", 64, heads=heads, head_dim=576, s_q=s_q, backend="sm80")
    rows = cfg.heads_per_cta * cfg.max_s_q
    assert rows <= 64 and (rows <= 16 or cfg.heads_per_cta // 2 < heads)
    assert cfg.heads_per_cta >= min(heads, 64 // s_q)  # one head block where 64 rows hold the heads
