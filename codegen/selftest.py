"""PipelineSelfTestConfig: the kernel that streams a buffer through the real mbarrier KV ring.

Producer warps fill each slot (plain stores then an arrive, or cp.async.bulk with expect-tx);
consumer warps reduce the slot (uint32 sums, exact and order-independent) and release it. The
result is checked against NumPy, so a stale read, an early overwrite or a lost arrive shows.
"""
from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .arch import ArchName, arch_spec
from .pipeline import MAX_TX_BYTES, MBARRIER_BYTES, PipelineConfig
from .smem import SmemLayout, SmemLayoutBuilder

VECTOR_BYTES = 16  # one uint4 per lane per access; also cp.async.bulk's size/alignment unit


class PipelineSelfTestConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["pipeline_selftest"] = "pipeline_selftest"
    arch: ArchName = "sm_90"
    fill: Literal["arrive", "expect_tx"] = "arrive"
    slot_bytes: int = Field(default=8192, ge=512, le=65536)
    pipeline: PipelineConfig

    @model_validator(mode="after")
    def _validate(self):
        spec = arch_spec(self.arch)
        p = self.pipeline
        if spec.vendor != "nvidia":
            raise ValueError(f"PipelineSelfTestConfig.arch={self.arch!r}: the mbarrier self-test is "
                             "CUDA only; use one of sm_80, sm_86, sm_89, sm_90, sm_90a, sm_100a")
        if self.fill == "expect_tx" and not spec.has_tma:
            raise ValueError(f"PipelineSelfTestConfig.fill='expect_tx' needs mbarrier expect-tx and "
                             f"cp.async.bulk (sm_90 or newer), not arch={self.arch!r}; use fill='arrive'")
        for who, n in (("num_producer", p.num_producer), ("num_consumer", p.num_consumer)):
            if self.slot_bytes % (VECTOR_BYTES * n):
                raise ValueError(f"PipelineSelfTestConfig.slot_bytes={self.slot_bytes}: must split into "
                                 f"{who}={n} chunks of a multiple of {VECTOR_BYTES} B; use a multiple "
                                 f"of {VECTOR_BYTES * n}")
        if self.fill == "expect_tx" and self.slot_bytes > MAX_TX_BYTES:
            raise ValueError(f"PipelineSelfTestConfig.slot_bytes={self.slot_bytes}: over the mbarrier "
                             f"transaction limit of {MAX_TX_BYTES} B")
        if self.threads > spec.max_threads_per_block:
            raise ValueError(f"PipelineSelfTestConfig.pipeline: {p.num_producer} producer + "
                             f"{p.num_consumer} consumer warps = {self.threads} threads; {self.arch} "
                             f"allows {spec.max_threads_per_block} per block")
        need = self.layout.total_bytes
        if need > spec.max_smem_per_block:
            max_stages = (spec.max_smem_per_block - 1024) // (self.slot_bytes * p.num_qk_stages)
            raise ValueError(f"PipelineSelfTestConfig.pipeline.num_kv_stages={p.num_kv_stages}: the ring "
                             f"needs {need} B of shared memory but {self.arch} allows "
                             f"{spec.max_smem_per_block} B per block; use at most {max_stages} stages "
                             "or a smaller slot_bytes")
        return self

    @property
    def family(self) -> str:
        return "pipeline_selftest"

    @property
    def backend(self) -> str:
        return "sm80" if self.fill == "arrive" else "sm90"

    @property
    def threads(self) -> int:
        return 32 * (self.pipeline.num_producer + self.pipeline.num_consumer)

    @cached_property
    def layout(self) -> SmemLayout:
        b = SmemLayoutBuilder()
        b.add("barriers", self.pipeline.barrier_bytes, align=MBARRIER_BYTES)
        b.add("slots", self.pipeline.num_stages * self.slot_bytes, align=128)
        return b.build()

    @property
    def tile_bytes(self) -> int:
        """Bytes of one KV stage (all its sub-stages): the unit the grid strides over."""
        return self.slot_bytes * self.pipeline.num_qk_stages

    def name_fields(self) -> list[str]:
        return [self.family, self.arch.replace("_", ""), *self.pipeline.name_fields(),
                "tx" if self.fill == "expect_tx" else "arrive", f"b{self.slot_bytes}"]
