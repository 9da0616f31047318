"""Sm80DecodeConfig: the portable NVIDIA backend (mma.sync m16n8k16, cp.async into the mbarrier
KV ring): its ring and warp roles, their checks, and the shared-memory layout and tiling the
template places."""
from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from .decode import TMA_BOX_BYTES, DecodeConfig, paged_map_geometry, tma_box_cols
from .pipeline import MBARRIER_BYTES, ConvertConfig, PipelineConfig
from .policy import DS_MLA_LATENT, DS_MLA_SCALE_BLOCK, DTYPE_BYTES
from .smem import SmemLayout, SmemLayoutBuilder

MMA_M = 16
ROW_PAD = 16  # bytes of padding per SMEM row: ldmatrix rows land in distinct banks
BULK_ARCHS = ("sm_90", "sm_100a")  # cp.async.bulk (and .tensor: TMA) with mbarrier complete_tx
SWIZZLE_ATOM_BYTES = 1024  # 8 rows x 128 B: swizzled tiles start on this boundary
FP8_ARCHS = ("sm_89", "sm_90", "sm_100a")  # cvt.rn.f16x2.e4m3x2 (hardware e4m3 conversion) exists from sm_89


FP8_SWIZZLE_CHUNKS = (4, 8, 16, 36)  # 16-byte chunks per fp8 row the register path swizzles (D = 64, 128, 256, 576)


def fp8_row_swizzle(chunks: int) -> list[int]:
    """f(r) for rows r = 0..15 (it repeats every 16 rows): the fp8 register path stores chunk c of
    row r at c ^ f(r), so both of its 32-bit shared-memory reads are free of bank conflicts (bits
    r0..r3 of the row; tests/test_fp8_swizzle.py checks every lane's bank):
    - K (QK's B): lanes read the same chunk of 8 consecutive rows: f must be one-to-one on r0..r2
      (rows a multiple of 128 bytes); rows of 64 bytes mod 128 (D = 64, MLA's 576) put consecutive
      rows in opposite halves of the banks, so f must be one-to-one on r1, r2 for each r0 (and
      stay below 4: chunks move inside their aligned group of four);
    - V (PV's B): lanes read 32 bytes (chunks 2b, 2b+1) of rows 4t + r, t = 0..3: f >> 1 must be
      one-to-one on r2, r3 (128-byte rows). Rows of 64 bytes mod 128 cannot have that (the four
      rows share r0, hence one half of the banks): 2-way conflicts there."""
    out = []
    for r in range(16):
        b = [(r >> i) & 1 for i in range(4)]
        if chunks % 8 == 0:
            out.append(b[0] | (b[2] ^ b[0]) << 1 | (b[3] ^ b[1]) << 2)
        else:
            out.append((b[1] ^ b[3]) | b[2] << 1)
    return out


class Sm80DecodeConfig(DecodeConfig):
    backend_name: ClassVar[str] = "sm80"
    backend: Literal["sm80"] = "sm80"
    pipeline: PipelineConfig
    convert: ConvertConfig | None = None  # fp8 KV: the load-and-convert ring in front of the MMA ring
    fp8_convert: Literal["ring", "registers"] = Field(
        default="ring", description="fp8 KV: dequantize through the load-and-convert ring (convert warps write "
        "16-bit tiles the MMA reads), or in the consumers' registers (mma fragments read straight from the fp8 "
        "tile: no 16-bit tile, no convert warps)")
    fp8_v_convert: Literal["cvt", "bits"] | None = Field(
        default=None, description="fp8 register path: V to the PV input by the conversion unit (cvt.rn.f16x2.e4m3x2, "
        "fp16 PV; block scales ride on P as V scale over their running maximum) or by bit moves into bf16 "
        "(integer units, bf16 PV); default: cvt (measured faster for every layout)")
    fp8_block_p: Literal["fp32", "scaled"] = Field(
        default="fp32", description="fp8 register path with block scales (GQA): how P meets each key's V scale. "
        "'fp32': the softmax stores P in fp32 and PV multiplies it by the keys' scales per V scale block and "
        "rounds it, every tile; 'scaled': the softmax stores, per V scale block, P already times each key's V "
        "scale (over C, where normalized) in the PV input type, which PV reads as the per-tensor path does")
    kv_load: Literal["cp_async", "bulk", "tma"] = Field(
        default="cp_async", description="how producer warps fill a KV slot: 16-byte cp.async per lane, one "
        "cp.async.bulk per row completing on the full barrier's transaction count (sm_90 and newer), or (GQA; "
        "16-bit, or fp8 per-tensor dequantized in registers) TMA boxes of page rows x 128 bytes through tensor "
        "maps over the caches into 128-byte-swizzled tiles, one producer warp (sm_90 and newer)")

    @model_validator(mode="before")
    @classmethod
    def _pipeline_given(cls, data):
        if isinstance(data, dict) and "pipeline" in data and data["pipeline"] is None:
            raise ValueError("DecodeConfig.pipeline: required for backend 'sm80' (a PipelineConfig: num_kv_stages, "
                             "num_producer, num_consumer)")
        return data

    @classmethod
    def foreign_hint(cls, name: str) -> str:
        return "stages KV through the mbarrier ring: set pipeline"

    def _validate_backend(self, where: str) -> None:
        p = self.pipeline
        if self.head_dim_qk % (16 * p.num_qk_stages):
            raise ValueError(f"{where}.pipeline.num_qk_stages={p.num_qk_stages}: must split "
                             f"head_dim_qk={self.head_dim_qk} into multiples of 16")
        if self.is_fp8:
            if self.arch not in FP8_ARCHS:
                raise ValueError(f"{where}.arch={self.arch!r}: fp8_e4m3 KV is converted with the hardware e4m3 "
                                 f"instructions of {', '.join(FP8_ARCHS)}; {self.arch} has none (use a bf16/fp16 cache)")
            if self.fp8_registers:
                self._validate_fp8_registers(where)
            elif self.fp8_v_convert is not None:
                raise ValueError(f"{where}.fp8_v_convert={self.fp8_v_convert!r}: chooses V's conversion on the fp8 "
                                 "register path; set fp8_convert='registers' or remove it")
            elif self.convert is None:
                raise ValueError(f"{where}.convert: required for kv_dtype='fp8_e4m3' with fp8_convert='ring' (a "
                                 "ConvertConfig: num_load_stages, num_convert); or set fp8_convert='registers'")
            if self.fp8_block_p != "fp32" and not self.register_block_scales:
                raise ValueError(f"{where}.fp8_block_p={self.fp8_block_p!r}: chooses how P takes the V block scales "
                                 "on the fp8 register path (scale_mode 'block' or 'fp8_ds_mla' with "
                                 "fp8_convert='registers'); remove it (or use 'fp32') for this config "
                                 f"({self.family}, scale_mode={self.scale_mode!r}, fp8_convert={self.fp8_convert!r})")
        elif self.fp8_v_convert is not None:
            raise ValueError(f"{where}.fp8_v_convert={self.fp8_v_convert!r}: chooses V's conversion on the fp8 "
                             f"register path; remove it for kv_dtype={self.kv_dtype!r}")
        elif self.fp8_block_p != "fp32":
            raise ValueError(f"{where}.fp8_block_p={self.fp8_block_p!r}: chooses how P takes fp8 V block scales; "
                             f"remove it for kv_dtype={self.kv_dtype!r}")
        elif self.fp8_convert != "ring":
            raise ValueError(f"{where}.fp8_convert={self.fp8_convert!r}: register dequantization is for "
                             f"kv_dtype='fp8_e4m3'; remove it for kv_dtype={self.kv_dtype!r}")
        elif self.convert is not None:
            raise ValueError(f"{where}.convert: the load-and-convert ring is for kv_dtype='fp8_e4m3' only; "
                             f"remove it for kv_dtype={self.kv_dtype!r}")
        if self.kv_load in ("bulk", "tma"):
            what = "cp.async.bulk" if self.kv_load == "bulk" else "TMA (cp.async.bulk.tensor)"
            if self.arch not in BULK_ARCHS:
                raise ValueError(f"{where}.kv_load={self.kv_load!r}: {what} exists on {', '.join(BULK_ARCHS)}; "
                                 f"{self.arch} has none (use 'cp_async')")
            if self.is_fp8 and self.kv_load == "bulk" and not self.fp8_bulk_rows:
                raise ValueError(f"{where}.kv_load='bulk': fp8 tiles are bulk-copied for mla_decode with "
                                 "fp8_convert='registers' only; otherwise they are filled by cp.async or (GQA, "
                                 "per-tensor scales, fp8_convert='registers') TMA; use 'cp_async' or 'tma'")
        if self.kv_load == "tma":
            self._validate_tma(where)
        if p.num_qk_stages != 1 or p.num_producer not in (1, 2, 4, 8):
            raise ValueError(f"{where}.pipeline: the sm80 kernel uses 1, 2, 4 or 8 cp.async producer warps and "
                             f"num_qk_stages=1; got num_producer={p.num_producer}, num_qk_stages={p.num_qk_stages}")
        rg = self.q_rows // MMA_M
        if p.num_consumer % rg:
            raise ValueError(f"{where}.pipeline.num_consumer={p.num_consumer}: consumer warps split into "
                             f"{rg} row groups of 16 query rows (heads_per_cta * max_s_q = "
                             f"{self.heads_per_cta * self.max_s_q}); use a multiple of {rg}")
        cg = p.num_consumer // rg
        rows_per_pass = 1 if self.is_fp8 else 32 // min(32, self.head_dim_qk * 2 // 16)
        if self.block_n % (p.num_producer * rows_per_pass):
            raise ValueError(f"{where}.block_n={self.block_n}: {p.num_producer} producer warps each load rows in "
                             f"passes of {rows_per_pass}; use a multiple of {p.num_producer * rows_per_pass} or "
                             "fewer producers")
        if self.block_n % (8 * cg) or (self.block_n // cg > 8 and self.block_n // cg % 16):
            raise ValueError(f"{where}.block_n={self.block_n}: {cg} column-group warps each take 8 keys or a "
                             f"multiple of 16; use a multiple of {16 * cg} or exactly {8 * cg}")
        if self.head_dim_v % (16 * cg):
            raise ValueError(f"{where}.pipeline.num_consumer={p.num_consumer}: {cg} column groups must split "
                             f"head_dim_v={self.head_dim_v} into multiples of 16")

    def _validate_tma(self, where: str) -> None:
        if self.family != "gqa_decode":
            raise ValueError(f"{where}.kv_load='tma': implemented for gqa_decode (MLA's TMA kernel is backend "
                             "'sm90'); use 'cp_async'")
        if self.is_fp8 and not (self.fp8_registers and self.scale_mode == "per_tensor"):
            raise ValueError(f"{where}.kv_load='tma': fp8 tiles arrive by TMA for scale_mode='per_tensor' with "
                             f"fp8_convert='registers'; got scale_mode={self.scale_mode!r}, "
                             f"fp8_convert={self.fp8_convert!r} (use kv_load='cp_async')")
        if self.head_dim_qk % self.tma_box_cols:
            raise ValueError(f"{where}.head_dim_qk={self.head_dim_qk}: kv_load='tma' loads boxes of "
                             f"{TMA_BOX_BYTES} bytes ({self.tma_box_cols} {self.kv_dtype} columns); use a multiple "
                             f"of {self.tma_box_cols} or kv_load='cp_async'")
        if self.pipeline.num_producer != 1:
            raise ValueError(f"{where}.pipeline.num_producer={self.pipeline.num_producer}: kv_load='tma' has one "
                             "producer warp (lane 0 issues the boxes); use 1")

    def _validate_fp8_registers(self, where: str) -> None:
        if self.scale_mode not in ("per_tensor", "block", "fp8_ds_mla"):
            raise ValueError(f"{where}.fp8_convert='registers': implemented for scale_mode 'per_tensor', "
                             f"'block' and 'fp8_ds_mla'; {self.scale_mode!r} uses fp8_convert='ring'")
        if self.convert is not None:
            raise ValueError(f"{where}.convert: fp8_convert='registers' has no convert warps; remove convert")
        if self.family == "mla_decode" and self.scale_mode != "per_tensor" and not self.qk_steps_interleaved:
            raise ValueError(f"{where}.pipeline.num_consumer={self.pipeline.num_consumer}: MLA's block-scaled fp8 "
                             "(scale_mode 'block' or 'fp8_ds_mla') is dequantized in registers by the depth-split QK, "
                             "4 consumer warps per row group of 16 query rows; got "
                             f"{self.row_groups} row group(s) x {self.col_groups} warps (use "
                             f"num_consumer={4 * self.row_groups} or fp8_convert='ring')")
        # (the packed 656-byte rows need no swizzle: 16 mod 128 bytes keeps K's reads conflict-free)
        if self.scale_mode != "fp8_ds_mla" and self.kv_token_bytes // 16 not in FP8_SWIZZLE_CHUNKS:
            raise ValueError(f"{where}.head_dim_qk={self.head_dim_qk}: fp8 register dequantization swizzles "
                             "rows of 64, 128, 256 or 576 bytes")
        if self.cols_per_warp % 32:
            raise ValueError(f"{where}.pipeline.num_consumer={self.pipeline.num_consumer}: with "
                             f"fp8_convert='registers' each warp takes V columns in groups of 32; "
                             f"{self.col_groups} column groups leave {self.cols_per_warp}; use fewer consumer warps")

    # ---- derived -----------------------------------------------------------------------------
    @property
    def fp8_registers(self) -> bool:
        """fp8 KV dequantized in the consumers' registers: the MMA ring holds fp8 tiles."""
        return self.is_fp8 and self.fp8_convert == "registers"

    @property
    def fp8_bulk_rows(self) -> bool:
        """fp8 MLA on the register path with kv_load='bulk': one cp.async.bulk per token (576 bytes,
        or the 656-byte packed token) into rows `kv8_row_stride` apart (no swizzle: a bulk copy lands
        contiguously; the stride keeps K's reads conflict-free, V's 2-way, as the swizzle does).
        Block scales apart from the rows are read by the producer lanes before they wait for the slot
        and stored beside the tile."""
        return self.fp8_registers and self.kv_load == "bulk" and self.family == "mla_decode"

    @property
    def bulk_lane_scales(self) -> int:
        """Bulk-copied fp8 MLA rows with block scales apart: the scales each producer lane reads per
        row (into registers, before it waits for the slot) and stores beside the tile; 0 otherwise."""
        return self.scale_blocks if self.fp8_bulk_rows and self.scale_mode == "block" else 0

    @property
    def register_block_scales(self) -> bool:
        """Register path with per-token block scales (scale_mode 'block', or the packed token's four
        latent scales): partial S per scale block times its keys' scales; P kept in fp32 and scaled per
        V block at PV, or stored prescaled per V block by the softmax (`fp8_block_p`)."""
        return self.fp8_registers and self.scale_mode in ("block", "fp8_ds_mla")

    @property
    def qk_steps_interleaved(self) -> bool:
        """MLA's depth-split QK on block-scaled fp8: warp cg of G takes k16 steps cg, cg + G, ...
        (instead of a contiguous slice), so every warp meets each scale block at the same steps and
        the packed token's bf16 rope at its last step (each block's scaling placed at compile time)."""
        if not (self.register_block_scales and self.family == "mla_decode" and self.qk_depth_split):
            return False
        steps, g = self.head_dim_qk // 16, self.col_groups
        span = self.scale_span // 16
        rope = (self.head_dim_qk - DS_MLA_LATENT) // 16
        return (steps % g == 0 and (span % g == 0 or g % span == 0)
                and (self.scale_mode != "fp8_ds_mla" or rope % g == 0))

    @property
    def scale_key_stride(self) -> int:
        """Register path, block scales: bytes between consecutive keys' scales of one block in a stage:
        the packed token's own scales in its row; [key][block] fp32 apart from the rows where cp.async
        copies each token's run of scales; [block][key] where the producer lanes store them from
        registers (bulk-copied MLA rows), so four keys' scales of a block are one 16-byte read."""
        if not self.register_block_scales:
            return 0
        if self.scale_mode == "fp8_ds_mla":
            return self.kv8_row_stride
        return 4 if self.bulk_lane_scales else 4 * self.scale_blocks

    @property
    def scale_block_stride(self) -> int:
        """... and between one key's scales of consecutive blocks."""
        if not self.register_block_scales:
            return 0
        return 4 * self.block_n if self.bulk_lane_scales else 4

    @property
    def k_scale_offset(self) -> int:
        """Register path, block scales: where key 0's block-0 K scale sits in a stage."""
        if not self.register_block_scales:
            return 0
        return DS_MLA_LATENT if self.scale_mode == "fp8_ds_mla" else self.kv8_scale_offset

    @property
    def v_scale_offset(self) -> int:
        """... and its V scale: MLA's V is the first 512 columns of the same token (its K scales);
        GQA's V scales follow the K scales."""
        if not self.register_block_scales:
            return 0
        if self.family == "mla_decode":
            return self.k_scale_offset
        return self.kv8_scale_offset + self.scale_blocks * self.block_n * 4

    @property
    def bulk_row_stride(self) -> int:
        """kv_load='bulk': bytes between rows in a slot (the row and its padding: ROW_PAD, or kv8_row_pad)."""
        return self.kv8_row_stride if self.is_fp8 else self.kv_row_stride

    @property
    def bulk_row_bytes(self) -> int:
        """kv_load='bulk': bytes of one cache row (one K or V row of one KV head; an fp8 token)."""
        return self.kv_token_bytes if self.is_fp8 else self.head_dim_qk * DTYPE_BYTES[self.kv_dtype]

    @property
    def bulk_v_zero_bytes(self) -> int:
        """kv_load='bulk': bytes of a row zeroed for rows past the sequence end: V (the packed token's
        scales too, which P x scale reads), whose stale bytes may be NaN that P = 0 does not cancel."""
        if self.scale_mode == "fp8_ds_mla":
            return DS_MLA_LATENT + 4 * self.scale_blocks
        return self.head_dim_v * DTYPE_BYTES[self.kv_dtype]

    @property
    def fp8_swizzle(self) -> int:
        """fp8 register path: the XOR applied to each row's 16-byte chunk index (chunk c of row r
        lands at c ^ f(r)), f for r % 16 packed in 3-bit fields; 0 (no swizzle, or the TMA's own
        128-byte swizzle: kv_load='tma', or padded bulk-copied rows) otherwise."""
        if not self.fp8_registers or self.kv_load in ("tma", "bulk") or self.scale_mode == "fp8_ds_mla":
            return 0
        return sum(f << (3 * r) for r, f in enumerate(fp8_row_swizzle(self.kv_token_bytes // 16)))

    @property
    def num_kv_stages(self) -> int:
        return self.pipeline.num_kv_stages

    @property
    def num_consumer_warps(self) -> int:
        return self.pipeline.num_consumer

    @property
    def q_rows(self) -> int:
        """Query rows a CTA holds (heads x s_q), padded to the MMA's M."""
        return -(-self.heads_per_cta * self.max_s_q // MMA_M) * MMA_M

    @property
    def row_groups(self) -> int:
        """Consumer warps per column group: each owns 16 query rows."""
        return self.q_rows // MMA_M

    @property
    def col_groups(self) -> int:
        """Warps sharing one row group: they split the tile's keys (QK) and V's columns (PV)."""
        return max(1, self.num_consumer_warps // self.row_groups)

    @property
    def keys_per_warp(self) -> int:
        return self.block_n // self.col_groups

    @property
    def cols_per_warp(self) -> int:
        return self.head_dim_v // self.col_groups

    @property
    def q_row_stride(self) -> int:
        """Bytes per Q row in SMEM, padded by 16 B so ldmatrix's 8 rows hit distinct banks."""
        return self.head_dim_qk * DTYPE_BYTES[self.q_dtype] + ROW_PAD

    @property
    def kv_row_stride(self) -> int:
        return self.head_dim_qk * 2 + ROW_PAD

    @property
    def p_row_stride(self) -> int:
        """P rows: ldmatrix reads 16-byte row pieces (pad 16 B); the fp8 register path reads 8 bytes at
        4t of rows g (pad 32 B: four rows of a half warp land on distinct 32-byte bank groups), except
        on TMA-filled tiles, whose V keys keep the PTX order (P through ldmatrix)."""
        if self.register_block_scales and not self.p_prescaled:
            return self.block_n * 4 + 4 * ROW_PAD  # fp32 P (scaled per V block at PV): 16-byte reads of 2 rows
        k4_reads = self.fp8_registers and self.kv_load != "tma"
        return self.block_n * 2 + (2 * ROW_PAD if k4_reads else ROW_PAD)

    @property
    def p_prescaled(self) -> bool:
        """fp8_block_p='scaled': the softmax stores one 16-bit P tile per V scale block, each key's P
        already times its V scale (over C where `v_scale_normalized`)."""
        return self.register_block_scales and self.fp8_block_p == "scaled"

    @property
    def p_copies(self) -> int:
        """P tiles in shared memory: one per V scale block (`p_prescaled`), else one."""
        return self.head_dim_v // self.scale_span if self.p_prescaled else 1

    @property
    def v_norm_slots(self) -> int:
        """`v_scale_normalized`: the running maxima C a consumer thread keeps: one per V scale block of
        its warp's columns, or (`p_prescaled`: the softmax scales every block's P) one per V scale block."""
        if not self.v_scale_normalized:
            return 0
        return self.p_copies if self.p_prescaled else self.v_blocks_per_warp

    @property
    def kv_tile_bytes(self) -> int:
        """One K (or V) tile in the MMA ring: 16-bit padded rows, or (kv_load='tma') dense
        128-byte-swizzled ones of the cache's element (fp8 tiles: `kv8_row_stride`)."""
        if self.kv_load == "tma":
            return self.block_n * self.head_dim_qk * DTYPE_BYTES[self.kv_dtype]
        return self.block_n * self.kv_row_stride

    @property
    def v_offset_in_stage(self) -> int:
        """MLA's V is the first 512 columns of the K rows; GQA's V tile follows the K tile."""
        if self.fp8_registers:
            return self.kv8_v_offset
        return 0 if self.family == "mla_decode" else self.kv_tile_bytes

    @property
    def stage_bytes(self) -> int:
        """One MMA-ring slot: 16-bit K (and V) tiles, or fp8 ones when the consumers dequantize."""
        if self.fp8_registers:
            return self.kv8_stage_bytes
        tiles = 1 if self.family == "mla_decode" else 2
        return tiles * self.kv_tile_bytes

    @property
    def tma_box_cols(self) -> int:
        """kv_load='tma': cache elements per box row (128 bytes)."""
        return tma_box_cols(self.kv_dtype)

    @property
    def tma_box_rows(self) -> int:
        """kv_load='tma': rows per box, a whole page or the tile's share of one (block_n and page_size
        are powers of two, so one divides the other; boxes never straddle a page)."""
        return min(self.page_size, self.block_n)

    def tensor_maps(self) -> tuple[tuple[str, str, dict], ...]:
        """kv_load='tma': tensor maps over the K and the V cache, each seen as [num_pages][page_size]
        [num_kv_heads * head_dim] (a box: box_rows rows of one page x 128 bytes of one KV head)."""
        if self.kv_load != "tma":
            return ()
        geometry = paged_map_geometry(self.kv_dtype, self.head_dim_qk, self.page_size, self.tma_box_rows,
                                      per_kv_head=True)
        return (("k_map", "k_cache", geometry), ("v_map", "v_cache", geometry))

    @property
    def full_arrivals(self) -> int:
        """The MMA ring's full barrier: every producer lane arrives through
        cp.async.mbarrier.arrive.noinc; with fp8 KV every convert thread after its stores."""
        return self.convert.convert_threads if self.convert is not None else 32 * self.pipeline.num_producer

    # ---- fp8 KV: the load ring the producers fill and the convert warps drain -------------------
    @property
    def load_full_arrivals(self) -> int:
        return 32 * self.pipeline.num_producer

    @property
    def load_empty_arrivals(self) -> int:
        return self.convert.convert_threads if self.convert is not None else 0

    @property
    def load_chunks_per_row(self) -> int:
        """16-byte cp.async chunks of one cached fp8 token (the 656-byte packed token whole)."""
        return self.kv_token_bytes // 16

    @property
    def load_scale_words(self) -> int:
        """fp32 block scales per token, copied beside its row (4-byte cp.async); the packed token
        carries its own."""
        return self.scale_blocks if self.scale_mode == "block" and not self.fp8_registers else 0

    @property
    def scale_copy_bytes(self) -> int:
        """Register path, block scales by cp.async: bytes per copy of a token's scales (they sit apart,
        [key][block], so one token's scales are one contiguous run): the largest of 16, 8, 4 that
        divides the run (so every copy stays aligned in the scale tensor). Bulk-copied MLA rows take
        their scales through the producer lanes' registers instead."""
        if not (self.fp8_registers and self.scale_mode == "block") or self.fp8_bulk_rows:
            return 0
        run = 4 * self.scale_blocks
        return next(n for n in (16, 8, 4) if run % n == 0)

    @property
    def scale_copies(self) -> int:
        return 4 * self.scale_blocks // self.scale_copy_bytes if self.scale_copy_bytes else 0

    @property
    def kv8_row_stride(self) -> int:
        """Bytes per fp8 row in SMEM: the token, then its block scales, 16-byte aligned (the register
        path keeps rows at the token's size, swizzled, and the scales apart)."""
        if self.fp8_registers:
            return self.kv_token_bytes + self.kv8_row_pad
        return -(-(self.kv_token_bytes + 4 * self.load_scale_words) // 16) * 16

    @property
    def kv8_row_pad(self) -> int:
        """Register path: bytes after each fp8 row. Bulk-copied rows cannot be swizzled: their stride is
        made an odd multiple of 16 bytes mod 128 (576 + 16; the packed 656 already is), so K's reads
        of one chunk of eight consecutive rows hit distinct banks."""
        if not (self.fp8_registers and self.kv_load == "bulk"):
            return 0
        return next(pad for pad in range(0, 128, 16) if (self.kv_token_bytes + pad) % 128 // 16 % 2 == 1)

    @property
    def kv8_scale_offset(self) -> int:
        """Register path, block scales: where a stage's scales start (after its K and V tiles; MLA's one
        tile), fp32 [key][block] for K, then (GQA) the same for V (each token's scales one run)."""
        tiles = 1 if self.family == "mla_decode" else 2
        return tiles * self.block_n * self.kv8_row_stride if self.fp8_registers else 0

    @property
    def kv8_stage_bytes(self) -> int:
        if not self.is_fp8:
            return 0
        tiles = 1 if self.family == "mla_decode" else 2
        apart = tiles * self.scale_blocks * self.block_n * 4 if self.fp8_registers and self.scale_mode == "block" else 0
        return tiles * self.block_n * self.kv8_row_stride + apart

    @property
    def scale_span(self) -> int:
        """Columns one block scale covers (scale_block_size, the packed token's 128, or all of D when
        that is shorter)."""
        size = DS_MLA_SCALE_BLOCK if self.scale_mode == "fp8_ds_mla" else self.scale_block_size
        return min(size or self.head_dim_qk, self.head_dim_qk)

    @property
    def mma_dtype(self) -> str:
        """The register path's QK runs in fp16 (e4m3 -> fp16 exact, block scales applied to S in fp32)."""
        return "fp16" if self.fp8_registers else super().mma_dtype

    @property
    def pv_dtype(self) -> str:
        """PV's input type: the QK type, or bf16 where the register path moves V bit-wise into bf16
        x 2^-120 (`raw_bf16_v`; with block scales P also carries each key's V scale, rounded once)."""
        return "bf16" if self.raw_bf16_v else self.mma_dtype

    @property
    def raw_bf16_v(self) -> bool:
        """Register path, fp8_v_convert='bits': V moved bit-wise into bf16 (value x 2^-120, no
        conversion unit) for PV, with P carrying 2^100 (and each key's block scale) and the output
        2^20. The default converts V with cvt into fp16 (block scales keep P x scale in fp16's range
        by a running normalizer, `v_scale_normalized`): measured faster than the bit moves at every
        shape and layout, MLA included (bench/RESULTS.md)."""
        return self.fp8_registers and self.fp8_v_convert == "bits"

    @property
    def v_scale_normalized(self) -> bool:
        """Block scales with V converted by cvt (fp16 PV): P carries each key's V scale divided by C,
        the running maximum of the V scales seen per scale block (so P x scale stays <= 1 in fp16);
        the output is rescaled when C grows and multiplied by C at the end."""
        return self.register_block_scales and not self.raw_bf16_v

    @property
    def v_block_tiles(self) -> int:
        """`v_scale_normalized`: a warp's output n8 tiles per V scale block it spans (a warp's
        columns cover whole scale blocks, or lie inside one)."""
        return min(self.scale_span, self.cols_per_warp) // 8 if self.v_scale_normalized else 0

    @property
    def v_blocks_per_warp(self) -> int:
        """`v_scale_normalized`: the V scale blocks one warp's columns span (each has its own C)."""
        return self.cols_per_warp // 8 // self.v_block_tiles if self.v_scale_normalized else 0

    @property
    def kv8_v_offset(self) -> int:
        return 0 if self.family == "mla_decode" else self.block_n * self.kv8_row_stride

    @property
    def empty_arrivals(self) -> int:
        return self.pipeline.empty_arrive_count

    @property
    def threads(self) -> int:
        convert = self.convert.num_convert if self.convert is not None else 0
        return 32 * (self.pipeline.num_producer + self.pipeline.num_consumer + convert)

    @property
    def acc_regs_per_thread(self) -> int:
        return self.q_rows * self.head_dim_v // (32 * self.num_consumer_warps)

    @cached_property
    def layout(self) -> SmemLayout:
        p = self.pipeline
        b = SmemLayoutBuilder()
        b.add("barriers", p.barrier_bytes, align=MBARRIER_BYTES)
        if self.convert is not None:
            b.add("load_barriers", self.convert.barrier_bytes, align=MBARRIER_BYTES)
        b.add("q", self.q_rows * self.q_row_stride)
        b.add("kv_stages", p.num_kv_stages * self.stage_bytes,
              align=SWIZZLE_ATOM_BYTES if self.kv_load == "tma" else 128)
        if self.convert is not None:
            b.add("kv8_stages", self.convert.num_load_stages * self.kv8_stage_bytes)
        b.add("p_tile", self.p_copies * self.q_rows * self.p_row_stride)
        b.add("red_max", self.col_groups * self.q_rows * 4, align=16)
        b.add("red_sum", self.col_groups * self.q_rows * 4, align=16)
        b.add("row_offsets", self.block_n * 8, align=16)  # producers' per-row gather offsets
        # depth-split QK: each warp's fp32 partial S [q_rows][block_n] (rows padded by 16 B)
        b.add("s_part", self.col_groups * self.q_rows * self.s_part_stride * 4 if self.qk_depth_split else 0,
              align=16)
        if self.kv_load == "tma":  # the kernel rounds the dynamic shared-memory base up to 1024 B
            b.add("align_slack", SWIZZLE_ATOM_BYTES - 16, align=16)
        return b.build()

    @property
    def qk_depth_split(self) -> bool:
        """MLA: a row group's warps split QK by depth, keeping their Q slice in registers (no Q
        reloads from SMEM per tile), when those registers fit beside the accumulators."""
        if self.family != "mla_decode" or self.col_groups == 1:
            return False
        q_regs = self.head_dim_qk // self.col_groups // 16 * 4
        return self.head_dim_qk % (16 * self.col_groups) == 0 and q_regs + self.acc_regs_per_thread <= 112

    @property
    def depth_per_warp(self) -> int:
        return self.head_dim_qk // self.col_groups if self.qk_depth_split else self.head_dim_qk

    @property
    def s_part_stride(self) -> int:
        return self.block_n + 4

    @property
    def rows_per_producer(self) -> int:
        return self.block_n // self.pipeline.num_producer

    def backend_name_fields(self) -> list[str]:
        return (self.pipeline.name_fields() + (self.convert.name_fields() if self.convert else [])
                + ([self.kv_load] if self.kv_load != "cp_async" else []) + (["rcv"] if self.fp8_registers else [])
                + ([f"v{self.fp8_v_convert}"] if self.fp8_v_convert else [])
                + (["psc"] if self.fp8_block_p == "scaled" else []))

    def legacy_backend_name_fields(self) -> list[str]:
        p = self.pipeline
        return [f"s{p.num_kv_stages}x{p.num_qk_stages}",
                f"p{p.num_producer}c{p.num_consumer}{'t' if p.consumer_arrive == 'thread' else ''}"]
