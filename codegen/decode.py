"""DecodeConfig: one decode-attention kernel variant (MLA or GQA), and its derived layout.

Every number the kernel needs (SMEM offsets, arrive counts, warp roles, register budget) is
computed here once and validated against the target arch; a config that cannot work is rejected
with the field, its value and what would be allowed.
"""
from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import policy
from .arch import BACKEND_ARCHS, ArchName, arch_spec
from .kv_buffer import KVBufferConfig
from .pipeline import MBARRIER_BYTES, PipelineConfig
from .policy import DTYPE_BYTES, GQA_GROUPS, GQA_HEAD_DIMS, MAX_Q_ROWS, MAX_SPLITS, MLA_DIMS, split_plan  # noqa: F401
from .smem import SmemLayout, SmemLayoutBuilder

MMA_M = 16
MAX_ACC_REGS = 128  # fp32 output accumulator registers per consumer thread we allow
ROW_PAD = 16  # bytes of padding per SMEM row: ldmatrix rows land in distinct banks


class DecodeConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    family: Literal["mla_decode", "gqa_decode"]
    backend: Literal["sm80", "sm90", "sm100", "cdna"]
    arch: ArchName
    head_dim_qk: int
    head_dim_v: int
    heads_per_cta: int = Field(ge=1, le=128, description="query heads (of one KV head) per CTA")
    page_size: Literal[16, 32, 64, 128]  # policy.PAGE_SIZES
    block_n: Literal[16, 32, 64, 128] = Field(description="keys per KV tile")
    q_dtype: Literal["bf16", "fp16"] = "bf16"
    kv_dtype: Literal["bf16", "fp16", "fp8_e4m3"] = "bf16"
    scale_mode: Literal["none", "per_tensor", "per_token_block"] = "none"
    scale_block_size: Literal[64, 128] | None = None
    max_s_q: int = Field(default=1, ge=1, le=8)
    pipeline: PipelineConfig | None = None
    kv_buffers: tuple[KVBufferConfig, KVBufferConfig] | None = None

    @model_validator(mode="after")
    def _validate(self):
        where = "DecodeConfig"
        spec = arch_spec(self.arch)
        if self.arch not in BACKEND_ARCHS[self.backend]:
            raise ValueError(f"{where}.arch={self.arch!r}: backend {self.backend!r} targets "
                             f"{', '.join(BACKEND_ARCHS[self.backend])}")
        if self.family == "mla_decode" and (self.head_dim_qk, self.head_dim_v) != MLA_DIMS:
            raise ValueError(f"{where}.head_dim_qk/head_dim_v={self.head_dim_qk}/{self.head_dim_v}: MLA decode "
                             "uses 576 (512 latent + 64 rope) / 512")
        if self.family == "gqa_decode":
            if self.head_dim_qk not in GQA_HEAD_DIMS:
                raise ValueError(f"{where}.head_dim_qk={self.head_dim_qk}: GQA decode supports "
                                 f"{', '.join(map(str, GQA_HEAD_DIMS))}")
            if self.head_dim_v != self.head_dim_qk:
                raise ValueError(f"{where}.head_dim_v={self.head_dim_v}: GQA needs head_dim_v == head_dim_qk "
                                 f"({self.head_dim_qk})")
            if self.heads_per_cta not in GQA_GROUPS:
                raise ValueError(f"{where}.heads_per_cta={self.heads_per_cta}: GQA packs one KV head's query "
                                 "group per CTA: 1, 2, 4, 8 or 16")
        if self.kv_dtype == "fp8_e4m3":
            if self.scale_mode == "none":
                raise ValueError(f"{where}.scale_mode='none': fp8_e4m3 KV needs 'per_tensor' or 'per_token_block'")
        elif self.scale_mode != "none":
            raise ValueError(f"{where}.scale_mode={self.scale_mode!r}: scales apply to fp8_e4m3 KV only; "
                             f"use 'none' for kv_dtype={self.kv_dtype!r}")
        elif self.kv_dtype != self.q_dtype:
            raise ValueError(f"{where}.kv_dtype={self.kv_dtype!r}: a 16-bit KV cache must match "
                             f"q_dtype={self.q_dtype!r} (the MMA takes one input type)")
        if (self.scale_mode == "per_token_block") != (self.scale_block_size is not None):
            raise ValueError(f"{where}.scale_block_size={self.scale_block_size}: required (64 or 128) exactly "
                             "when scale_mode='per_token_block'")
        if self.scale_block_size and self.head_dim_v % self.scale_block_size:
            raise ValueError(f"{where}.scale_block_size={self.scale_block_size}: must divide head_dim_v="
                             f"{self.head_dim_v}")
        if self.max_s_q > 1 and self.family == "mla_decode" and self.q_rows > MAX_Q_ROWS:
            raise ValueError(f"{where}.max_s_q={self.max_s_q}: heads_per_cta * max_s_q = "
                             f"{self.heads_per_cta * self.max_s_q} query rows per CTA; at most {MAX_Q_ROWS}")
        if self.backend in ("sm90", "sm100"):
            raise ValueError(f"{where}.backend={self.backend!r}: its kernels have not landed yet; use 'sm80' "
                             "(mma.sync, runs on sm_80..sm_100a) or 'cdna' (AMD)")
        if self.backend == "cdna":
            if self.pipeline is not None:
                raise ValueError(f"{where}.pipeline: the cdna backend stages KV through registers; "
                                 "set kv_buffers, not pipeline")
            if self.kv_buffers is None:
                raise ValueError(f"{where}.kv_buffers: required for backend 'cdna' (a K and a V KVBufferConfig)")
            k, v = self.kv_buffers
            if (k.role, v.role) != ("K", "V") or k.depth != self.head_dim_qk or v.depth != self.head_dim_v:
                raise ValueError(f"{where}.kv_buffers: expected (K with depth {self.head_dim_qk}, "
                                 f"V with depth {self.head_dim_v}), got ({k.role} {k.depth}, {v.role} {v.depth})")
            if k.BN != self.block_n or v.BN != self.block_n:
                raise ValueError(f"{where}.kv_buffers: BN must equal block_n={self.block_n}")
            self._validate_cdna(where, k, v)
        else:
            if self.pipeline is None:
                raise ValueError(f"{where}.pipeline: required for backend {self.backend!r}")
            if self.kv_buffers is not None:
                raise ValueError(f"{where}.kv_buffers: only the cdna backend uses KVBufferConfig")
            if self.head_dim_qk % (16 * self.pipeline.num_qk_stages):
                raise ValueError(f"{where}.pipeline.num_qk_stages={self.pipeline.num_qk_stages}: must split "
                                 f"head_dim_qk={self.head_dim_qk} into multiples of 16")
            if self.kv_dtype == "fp8_e4m3" and self.backend == "sm80":
                raise ValueError(f"{where}.kv_dtype='fp8_e4m3': the sm80 backend reads bf16/fp16 KV; "
                                 "fp8 KV needs backend 'sm90'")
            if self.backend == "sm80":
                self._validate_sm80_warps(where)
        if self.threads > spec.max_threads_per_block:
            raise ValueError(f"{where}.pipeline.num_consumer={self.num_consumer_warps}: {self.threads} threads per "
                             f"block; {self.arch} allows {spec.max_threads_per_block}")
        if self.acc_regs_per_thread > MAX_ACC_REGS:
            raise ValueError(f"{where}.heads_per_cta={self.heads_per_cta}: the output accumulator needs "
                             f"{self.acc_regs_per_thread} fp32 registers per consumer thread (max {MAX_ACC_REGS}); "
                             "use fewer heads per CTA or more consumer warps")
        need = self.layout.total_bytes
        if need > spec.max_smem_per_block:
            raise ValueError(f"{where}.pipeline.num_kv_stages={self.num_kv_stages}: needs {need} B of shared "
                             f"memory but {self.arch} allows {spec.max_smem_per_block} B per block "
                             f"({self.layout.describe()}); use fewer stages or a smaller block_n")
        return self

    def _validate_cdna(self, where: str, k: KVBufferConfig, v: KVBufferConfig) -> None:
        if (k.mfma, k.num_threads) != (v.mfma, v.num_threads):
            raise ValueError(f"{where}.kv_buffers: K and V must share mfma and num_threads, got "
                             f"({k.mfma}, {k.num_threads}) and ({v.mfma}, {v.num_threads})")
        if self.kv_dtype != self.q_dtype:
            raise ValueError(f"{where}.kv_dtype={self.kv_dtype!r}: the cdna backend reads {self.q_dtype} KV "
                             "(fp8 KV on cdna has not landed)")
        m = self.mfma
        if self.heads_per_cta * self.max_s_q > m.m:
            raise ValueError(f"{where}.heads_per_cta={self.heads_per_cta}: heads_per_cta * max_s_q = "
                             f"{self.heads_per_cta * self.max_s_q} query rows; one MFMA {m.name} tile holds {m.m}")
        if self.waves % self.qk_key_slices:
            raise ValueError(f"{where}.kv_buffers[0].WN={k.WN}: the tile's {self.block_n} keys make "
                             f"{self.qk_key_slices} slices of WN keys, which must divide the {self.waves} wavefronts "
                             "(wavefronts past the slices repeat QK)")
        if v.WN != self.block_n:
            raise ValueError(f"{where}.kv_buffers[1].WN={v.WN}: every wavefront reads all {self.block_n} keys of "
                             f"V for its columns; WN must be {self.block_n}")
        if k.num_stages != 1 or v.num_stages != 1:
            raise ValueError(f"{where}.kv_buffers: the HIP kernel prefetches one tile into registers; "
                             f"num_stages must be 1, got {k.num_stages} and {v.num_stages}")
        if self.head_dim_v % (self.waves * m.n):
            raise ValueError(f"{where}.kv_buffers: {self.waves} wavefronts split head_dim_v={self.head_dim_v} "
                             f"into MFMA N={m.n} column tiles; it does not divide")

    @property
    def mfma(self):
        from .cdna_layout import MFMA

        return MFMA[self.kv_buffers[0].mfma]

    @property
    def waves(self) -> int:
        return self.threads // 64

    @property
    def qk_key_slices(self) -> int:
        """cdna: wavefront w computes S for keys (w mod slices) * WN ..; with fewer slices than
        wavefronts the others repeat that QK (so each can own its V columns without a shuffle)."""
        return self.block_n // self.kv_buffers[0].WN

    def _validate_sm80_warps(self, where: str) -> None:
        p = self.pipeline
        if p.num_qk_stages != 1 or p.num_producer not in (1, 2, 4, 8):
            raise ValueError(f"{where}.pipeline: the sm80 kernel uses 1, 2, 4 or 8 cp.async producer warps and "
                             f"num_qk_stages=1; got num_producer={p.num_producer}, num_qk_stages={p.num_qk_stages}")
        rg = self.q_rows // MMA_M
        if p.num_consumer % rg:
            raise ValueError(f"{where}.pipeline.num_consumer={p.num_consumer}: consumer warps split into "
                             f"{rg} row groups of 16 query rows (heads_per_cta * max_s_q = "
                             f"{self.heads_per_cta * self.max_s_q}); use a multiple of {rg}")
        cg = p.num_consumer // rg
        rows_per_pass = 32 // min(32, self.head_dim_qk * 2 // 16)
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

    # ---- derived -----------------------------------------------------------------------------
    @property
    def num_kv_stages(self) -> int:
        return self.pipeline.num_kv_stages if self.pipeline else 2

    @property
    def num_consumer_warps(self) -> int:
        return self.pipeline.num_consumer if self.pipeline else self.kv_buffers[0].num_threads // 64

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
        return self.block_n * 2 + ROW_PAD

    @property
    def v_offset_in_stage(self) -> int:
        """MLA's V is the first 512 columns of the K rows; GQA's V tile follows the K tile."""
        return 0 if self.family == "mla_decode" else self.block_n * self.kv_row_stride

    @property
    def stage_bytes(self) -> int:
        tiles = 1 if self.family == "mla_decode" else 2
        return tiles * self.block_n * self.kv_row_stride

    @property
    def full_arrivals(self) -> int:
        """sm80: every producer lane arrives through cp.async.mbarrier.arrive.noinc."""
        return 32 * self.pipeline.num_producer if self.backend == "sm80" else self.pipeline.full_arrive_count

    @property
    def empty_arrivals(self) -> int:
        return self.pipeline.empty_arrive_count

    @property
    def q_rows(self) -> int:
        """Query rows a CTA holds (heads x s_q), padded to the MMA's M."""
        rows = self.heads_per_cta * self.max_s_q
        tile = self.mfma.m if self.backend == "cdna" and self.kv_buffers else MMA_M
        return -(-rows // tile) * tile

    @property
    def kv_row_bytes(self) -> int:
        """Bytes of one token in a KV slot (MLA: the 576-wide row; GQA: K row + V row)."""
        width = self.head_dim_qk if self.family == "mla_decode" else 2 * self.head_dim_qk
        return width * DTYPE_BYTES[self.kv_dtype]

    @property
    def threads(self) -> int:
        if self.backend == "cdna":
            return self.kv_buffers[0].num_threads
        producers = self.pipeline.num_producer
        convert = 4 if self.kv_dtype == "fp8_e4m3" else 0
        return 32 * (producers + convert + self.pipeline.num_consumer)

    @property
    def acc_regs_per_thread(self) -> int:
        consumer_threads = 64 * (self.threads // 64) if self.backend == "cdna" else 32 * self.num_consumer_warps
        return self.q_rows * self.head_dim_v // consumer_threads

    @cached_property
    def layout(self) -> SmemLayout:
        b = SmemLayoutBuilder()
        if self.backend == "cdna":
            k, v = self.kv_buffers
            b.add("q", self.q_rows * self.head_dim_qk * 2)
            b.add("k_tiles", k.lds_bytes)
            b.add("v_tiles", v.lds_bytes if self.family == "gqa_decode" else 0)
            b.add("p_tile", self.q_rows * self.block_n * 2)
            b.add("red_max", self.waves * self.q_rows * 4, align=16)
            b.add("red_sum", self.waves * self.q_rows * 4, align=16)
            b.add("guard_flag", 4, align=4)  # the input guard's block-wide OR
            return b.build()
        p = self.pipeline
        b.add("barriers", p.barrier_bytes, align=MBARRIER_BYTES)
        b.add("q", self.q_rows * self.q_row_stride)
        b.add("kv_stages", p.num_kv_stages * self.stage_bytes)
        if self.kv_dtype == "fp8_e4m3":
            width = self.head_dim_qk if self.family == "mla_decode" else 2 * self.head_dim_qk
            b.add("kv_converted", p.num_kv_stages * self.block_n * width * 2)
            if self.scale_mode == "per_token_block":
                b.add("kv_scales", p.num_kv_stages * self.block_n * (self.head_dim_v // self.scale_block_size) * 4,
                      align=16)
        b.add("p_tile", self.q_rows * self.p_row_stride)
        b.add("red_max", self.col_groups * self.q_rows * 4, align=16)
        b.add("red_sum", self.col_groups * self.q_rows * 4, align=16)
        b.add("row_offsets", self.block_n * 8, align=16)  # producers' per-row gather offsets
        # depth-split QK: each warp's fp32 partial S [q_rows][block_n] (rows padded by 16 B)
        b.add("s_part", self.col_groups * self.q_rows * self.s_part_stride * 4 if self.qk_depth_split else 0,
              align=16)
        return b.build()

    @property
    def qk_depth_split(self) -> bool:
        """sm80 MLA: a row group's warps split QK by depth, keeping their Q slice in registers
        (no Q reloads from SMEM per tile), when those registers fit beside the accumulators."""
        if self.backend != "sm80" or self.family != "mla_decode" or self.col_groups == 1:
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
    def min_keys_per_split(self) -> int:
        """The split planner never cuts a sequence into chunks shorter than this."""
        return policy.min_keys_per_split(self.block_n)

    def head_blocks(self, num_q_heads: int, num_kv_heads: int) -> int:
        return policy.head_blocks(self.family, num_q_heads, num_kv_heads, self.heads_per_cta)

    @property
    def rows_per_producer(self) -> int:
        return self.block_n // self.pipeline.num_producer

    @property
    def ctas_per_sm(self) -> int:
        """CTAs that fit on one SM by shared memory (the launch-bounds hint and the split planner use it)."""
        spec = arch_spec(self.arch)
        per_sm = spec.max_smem_per_block + 1024  # the SM's carve-out: the per-block limit plus the reserve
        return max(1, min(4, per_sm // (self.layout.total_bytes + 1024)))

    def name_fields(self) -> list[str]:
        """Every field that tells two variants apart, each with its own prefix: h heads per CTA,
        ps page size, n keys per tile, q/kv dtypes, sb scale block, d head dim, sq max s_q; then
        the sm80 ring (s stages, pr/co producer/consumer arrivals) or the cdna MFMA and threads."""
        fields = [self.family, self.backend, self.arch.replace("_", ""), f"h{self.heads_per_cta}",
                  f"ps{self.page_size}", f"n{self.block_n}", f"q{self.q_dtype}", f"kv{self.kv_dtype.replace('_e4m3', '')}"]
        if self.scale_mode == "per_token_block":
            fields.append(f"sb{self.scale_block_size}")
        if self.family == "gqa_decode":
            fields.append(f"d{self.head_dim_qk}")
        fields.append(f"sq{self.max_s_q}")
        if self.pipeline:
            fields += self.pipeline.name_fields()
        if self.kv_buffers:
            k, v = self.kv_buffers
            fields += [f"mfma{k.mfma.replace('x', '_')}", f"t{k.num_threads}", f"kw{k.WN}vw{v.WN}"]
        return fields

    def legacy_name_fields(self) -> list[str]:
        """The fields of names before kvforge 0.2 (page size as p16, ring as p4c4): still matched
        by `kvforge list/compile --filter`."""
        fields = [self.family, self.backend, self.arch.replace("_", ""), f"h{self.heads_per_cta}", f"p{self.page_size}",
                  f"n{self.block_n}", f"q{self.q_dtype}", f"kv{self.kv_dtype.replace('_e4m3', '')}"]
        if self.scale_mode == "per_token_block":
            fields.append(f"sb{self.scale_block_size}")
        if self.family == "gqa_decode":
            fields.append(f"d{self.head_dim_qk}")
        fields.append(f"sq{self.max_s_q}")
        if self.pipeline:
            p = self.pipeline
            fields += [f"s{p.num_kv_stages}x{p.num_qk_stages}",
                       f"p{p.num_producer}c{p.num_consumer}{'t' if p.consumer_arrive == 'thread' else ''}"]
        return fields
