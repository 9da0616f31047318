"""PipelineConfig: the mbarrier KV ring's shape, and the barrier and arrive counts derived from it."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MBARRIER_BYTES = 8
MAX_TX_BYTES = (1 << 20) - 1  # an mbarrier phase's transaction count is a 20-bit field


class PipelineConfig(BaseModel):
    """The KV ring: `num_kv_stages` slots, each split into `num_qk_stages` sub-stages.

    `num_producer` / `num_consumer` count warps. The full barrier takes one arrival per producer
    warp (its elected lane); the empty barrier one per consumer thread (`consumer_arrive =
    "thread"`, release_all, the default) or one per consumer warp (`"warp"`: __syncwarp, then
    the elected lane arrives). Both are correct under the PTX memory model; compute-sanitizer's
    racecheck cannot see the per-warp form as ordering the other lanes' reads and reports WAR
    hazards once the ring wraps (docs/sanitizers.md), so kernels use the per-thread form.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_kv_stages: int = Field(ge=2, le=8)
    num_qk_stages: int = Field(default=1, ge=1, le=4)
    num_producer: int = Field(default=1, ge=1, le=8)
    num_consumer: int = Field(default=2, ge=1, le=16)
    consumer_arrive: Literal["warp", "thread"] = "thread"

    @model_validator(mode="after")
    def _ring_fits(self):
        if self.num_stages > 24:
            raise ValueError(
                f"num_kv_stages * num_qk_stages = {self.num_kv_stages} * {self.num_qk_stages} = "
                f"{self.num_stages} slots; at most 24 are allowed"
            )
        return self

    @property
    def num_stages(self) -> int:
        return self.num_kv_stages * self.num_qk_stages

    @property
    def num_barriers(self) -> int:
        """Full barriers first, then empty ones."""
        return 2 * self.num_stages

    @property
    def barrier_bytes(self) -> int:
        return self.num_barriers * MBARRIER_BYTES

    @property
    def full_arrive_count(self) -> int:
        return self.num_producer

    @property
    def empty_arrive_count(self) -> int:
        return self.num_consumer * (32 if self.consumer_arrive == "thread" else 1)

    def name_fields(self) -> list[str]:
        """s<kv stages>x<qk stages>, pr<producer warps>co<consumer warps>, t/w: per-thread/per-warp release."""
        arrive = "t" if self.consumer_arrive == "thread" else "w"
        return [f"s{self.num_kv_stages}x{self.num_qk_stages}", f"pr{self.num_producer}co{self.num_consumer}{arrive}"]


class ConvertConfig(BaseModel):
    """FP8 KV's load-and-convert stage (the seed's KVLoad2CvtProducer): a second ring in front of
    the MMA ring. The producer warps fill `num_load_stages` fp8 slots (cp.async); `num_convert`
    convert warps each wait on a filled fp8 slot and a free MMA slot, dequantize the tile into the
    16-bit layout the MMA reads, release the fp8 slot (every convert thread arrives) and fill the
    MMA slot (every convert thread arrives after its stores)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_load_stages: int = Field(default=3, ge=2, le=8)
    num_convert: int = Field(default=4, ge=1, le=8)

    @property
    def barrier_bytes(self) -> int:
        return 2 * self.num_load_stages * MBARRIER_BYTES

    @property
    def convert_threads(self) -> int:
        return 32 * self.num_convert

    def name_fields(self) -> list[str]:
        """ld<fp8 ring depth>cv<convert warps>."""
        return [f"ld{self.num_load_stages}cv{self.num_convert}"]
