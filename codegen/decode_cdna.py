"""CdnaDecodeConfig: the AMD backend (MFMA, KV staged global -> registers -> double-buffered LDS
through the DecodeKVBuffer): its K and V buffer configs, their checks, and the LDS layout."""
from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Literal

from pydantic import model_validator

from .decode import DecodeConfig
from .kv_buffer import KVBufferConfig
from .smem import SmemLayout, SmemLayoutBuilder


class CdnaDecodeConfig(DecodeConfig):
    backend_name: ClassVar[str] = "cdna"
    warps_field: ClassVar[str] = "kv_buffers[0].num_threads"
    stages_field: ClassVar[str] = "kv_buffers"
    backend: Literal["cdna"] = "cdna"
    kv_buffers: tuple[KVBufferConfig, KVBufferConfig]

    @model_validator(mode="before")
    @classmethod
    def _buffers_given(cls, data):
        if isinstance(data, dict) and "kv_buffers" in data and data["kv_buffers"] is None:
            raise ValueError("DecodeConfig.kv_buffers: required for backend 'cdna' (a K and a V KVBufferConfig)")
        return data

    @classmethod
    def foreign_hint(cls, name: str) -> str:
        return "stages KV through registers: set kv_buffers, not pipeline"

    def _validate_backend(self, where: str) -> None:
        k, v = self.kv_buffers
        if (k.role, v.role) != ("K", "V") or k.depth != self.head_dim_qk or v.depth != self.head_dim_v:
            raise ValueError(f"{where}.kv_buffers: expected (K with depth {self.head_dim_qk}, "
                             f"V with depth {self.head_dim_v}), got ({k.role} {k.depth}, {v.role} {v.depth})")
        if k.BN != self.block_n or v.BN != self.block_n:
            raise ValueError(f"{where}.kv_buffers: BN must equal block_n={self.block_n}")
        if (k.mfma, k.num_threads) != (v.mfma, v.num_threads):
            raise ValueError(f"{where}.kv_buffers: K and V must share mfma and num_threads, got "
                             f"({k.mfma}, {k.num_threads}) and ({v.mfma}, {v.num_threads})")
        if self.kv_dtype != self.q_dtype:
            raise ValueError(f"{where}.kv_dtype={self.kv_dtype!r}: the cdna backend reads {self.q_dtype} KV "
                             "(fp8 KV on cdna has not landed)")
        if self.lazy_rescale:
            raise ValueError(f"{where}.lazy_rescale=True: the cdna backend rescales every tile (its templates do "
                             "not implement the lazy rescale); remove it")
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

    # ---- derived -----------------------------------------------------------------------------
    @property
    def mfma(self):
        from .cdna_layout import MFMA

        return MFMA[self.kv_buffers[0].mfma]

    @property
    def threads(self) -> int:
        return self.kv_buffers[0].num_threads

    @property
    def waves(self) -> int:
        return self.threads // 64

    @property
    def num_consumer_warps(self) -> int:
        return self.waves

    @property
    def num_kv_stages(self) -> int:
        return 2  # the LDS tiles are double-buffered

    @property
    def qk_key_slices(self) -> int:
        """Wavefront w computes S for keys (w mod slices) * WN ..; with fewer slices than
        wavefronts the others repeat that QK (so each can own its V columns without a shuffle)."""
        return self.block_n // self.kv_buffers[0].WN

    @property
    def q_rows(self) -> int:
        """Query rows a workgroup holds (heads x s_q), padded to the MFMA's M."""
        m = self.mfma.m
        return -(-self.heads_per_cta * self.max_s_q // m) * m

    @property
    def acc_regs_per_thread(self) -> int:
        return self.q_rows * self.head_dim_v // (64 * self.waves)

    @cached_property
    def layout(self) -> SmemLayout:
        k, v = self.kv_buffers
        b = SmemLayoutBuilder()
        b.add("q", self.q_rows * self.head_dim_qk * 2)
        b.add("k_tiles", k.lds_bytes)
        b.add("v_tiles", v.lds_bytes if self.family == "gqa_decode" else 0)
        b.add("p_tile", self.q_rows * self.block_n * 2)
        b.add("red_max", self.waves * self.q_rows * 4, align=16)
        b.add("red_sum", self.waves * self.q_rows * 4, align=16)
        b.add("guard_flag", 4, align=4)  # the input guard's block-wide OR
        return b.build()

    def backend_name_fields(self) -> list[str]:
        k, v = self.kv_buffers
        return [f"mfma{k.mfma.replace('x', '_')}", f"t{k.num_threads}", f"kw{k.WN}vw{v.WN}"]
