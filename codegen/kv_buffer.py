"""KVBufferConfig: the AMD (CDNA) DecodeKVBuffer's tiling for one role (K or V).

Global -> registers (`num_stages` load tiles deep) -> LDS (XOR-swizzled, double-buffered) ->
MFMA operand registers. Every count the HIP template needs is derived and validated here.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MFMA_SHAPES = {"32x32x8": (32, 32, 8), "16x16x16": (16, 16, 16)}
WAVEFRONT = 64
LOAD_VECTOR_BYTES = 16
ELEMENT_BYTES = 2  # bf16/fp16 in LDS (fp8 is converted in registers before the LDS store)
LDS_BYTES = 65536
MAX_STAGING_VGPRS = 128


class KVBufferConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["K", "V"]
    BN: int = Field(ge=16, le=256, description="tokens per tile")
    WN: int = Field(ge=16, le=256, description="tokens per wavefront's MFMA column block")
    BK: int = Field(ge=8, le=128, description="depth consumed per MFMA k step")
    depth: int = Field(description="head dim of this role (576 for MLA K, 512 for MLA V, D for GQA)")
    num_threads: int = Field(ge=64, le=1024)
    num_stages: int = Field(default=1, ge=1, le=2, description="register load tiles in flight")
    mfma: Literal["32x32x8", "16x16x16"] = "16x16x16"
    swizzle: bool = True

    @model_validator(mode="after")
    def _validate(self):
        m, n, k = MFMA_SHAPES[self.mfma]
        where = "KVBufferConfig"
        if self.depth not in (64, 128, 256, 512, 576):
            raise ValueError(f"{where}.depth={self.depth}: allowed 64, 128, 256 (GQA), 512, 576 (MLA)")
        if self.num_threads % WAVEFRONT:
            raise ValueError(f"{where}.num_threads={self.num_threads}: must be a multiple of the wavefront (64)")
        if self.BN % self.WN:
            raise ValueError(f"{where}.WN={self.WN}: must divide BN={self.BN}")
        if self.WN % n:
            raise ValueError(f"{where}.WN={self.WN}: must be a multiple of the MFMA {self.mfma} N={n}")
        if self.BK % k:
            raise ValueError(f"{where}.BK={self.BK}: must be a multiple of the MFMA {self.mfma} K={k}")
        if self.depth % self.BK:
            raise ValueError(f"{where}.BK={self.BK}: must divide depth={self.depth}")
        if (self.BN * self.chunks_per_token) % self.num_threads:
            raise ValueError(f"{where}.num_threads={self.num_threads}: the tile's {self.BN} tokens x "
                             f"{self.chunks_per_token} chunks of {LOAD_VECTOR_BYTES} B must split evenly over "
                             "the threads; use a count that divides "
                             f"{self.BN * self.chunks_per_token}")
        if self.lds_bytes > LDS_BYTES:
            raise ValueError(f"{where}.BN={self.BN}: the double-buffered LDS tile needs {self.lds_bytes} B, "
                             f"over the {LDS_BYTES} B of LDS; use a smaller BN")
        if self.staging_vgprs > MAX_STAGING_VGPRS:
            raise ValueError(f"{where}.num_stages={self.num_stages}: staging needs {self.staging_vgprs} VGPRs "
                             f"per thread, over the {MAX_STAGING_VGPRS} budget; use fewer stages or a smaller BN")
        return self

    @property
    def chunks_per_token(self) -> int:
        return self.depth * ELEMENT_BYTES // LOAD_VECTOR_BYTES

    @property
    def loads_per_thread(self) -> int:
        """16-byte global loads per thread per tile (flat distribution: see cdna_layout.token_chunk)."""
        return self.BN * self.chunks_per_token // self.num_threads

    @property
    def tile_bytes(self) -> int:
        return self.BN * self.depth * ELEMENT_BYTES

    @property
    def lds_bytes(self) -> int:
        return 2 * self.tile_bytes

    @property
    def staging_vgprs(self) -> int:
        return self.num_stages * self.loads_per_thread * LOAD_VECTOR_BYTES // 4
