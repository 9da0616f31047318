"""Variant: one config plus everything derived from it that the emitters and the runtime share
(name, template, output path, template context, the kernels' launch contracts)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Union

from pydantic import Discriminator, Tag, TypeAdapter, ValidationError

from .contract import KernelContract, combine_groups, decode_kernels, selftest_kernels
from .decode import BACKEND_CLASSES, DecodeConfig, _unknown_backend
from .decode_cdna import CdnaDecodeConfig
from .decode_sm80 import Sm80DecodeConfig
from .decode_sm90 import Sm90DecodeConfig
from .errors import ConfigError, describe_validation_error
from .naming import config_hash, legacy_variant_name, variant_name
from .policy import C_POLICY, C_TYPES, DS_MLA_LATENT, ERROR_RECORD_INTS
from .selftest import PipelineSelfTestConfig


def _kind(data) -> str | None:
    """The union's tag: 'selftest', or the decode config's backend ('sm80', 'cdna')."""
    if isinstance(data, dict):
        return "selftest" if data.get("kind") == "pipeline_selftest" else data.get("backend")
    return "selftest" if isinstance(data, PipelineSelfTestConfig) else getattr(data, "backend", None)


AnyConfig = Annotated[
    Union[Annotated[PipelineSelfTestConfig, Tag("selftest")], Annotated[Sm80DecodeConfig, Tag("sm80")],
          Annotated[Sm90DecodeConfig, Tag("sm90")],
          Annotated[CdnaDecodeConfig, Tag("cdna")]],
    Discriminator(_kind),
]
CONFIG_ADAPTER = TypeAdapter(AnyConfig)


@dataclass(frozen=True)
class Variant:
    config: PipelineSelfTestConfig | DecodeConfig

    @cached_property
    def name(self) -> str:
        return variant_name(self.config)

    @cached_property
    def legacy_name(self) -> str:
        """The name this config had before 0.2's naming (matched by --filter too)."""
        return legacy_variant_name(self.config)

    @cached_property
    def config_hash(self) -> str:
        return config_hash(self.config)

    @property
    def family(self) -> str:
        return self.config.family

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def arch(self) -> str:
        return self.config.arch

    @property
    def language(self) -> str:
        return "hip" if self.arch.startswith("gfx") else "cuda"

    @property
    def template(self) -> str:
        if isinstance(self.config, PipelineSelfTestConfig):
            return "cuda/pipeline_selftest.cu.j2"
        if self.backend == "sm90" and self.family == "gqa_decode":
            return "cuda/decode_sm90_gqa.cu.j2"  # its own kernel (codegen/sm90_gqa.py)
        if self.backend == "sm90" and self.config.schedule == "keys_m":
            return "cuda/decode_sm90_keys_m.cu.j2"  # its own kernel (codegen/sm90_keys_m.py)
        return f"{self.language}/decode_{self.backend}.{'hip' if self.language == 'hip' else 'cu'}.j2"

    @property
    def relpath(self) -> str:
        """Path of the source under generated/."""
        return f"{self.backend}/{self.name}.{'hip' if self.language == 'hip' else 'cu'}"

    @cached_property
    def contracts(self) -> dict[str, KernelContract]:
        """role -> launch contract: 'main' and 'combine' (decode) or 'selftest'."""
        if isinstance(self.config, PipelineSelfTestConfig):
            return selftest_kernels(self.name, self.config)
        return decode_kernels(self.name, self.config)

    @property
    def kernels(self) -> tuple[KernelContract, ...]:
        return tuple(self.contracts.values())

    @property
    def main_kernel(self) -> KernelContract:
        return next(k for k in self.kernels if k.symbol == self.name)

    def template_context(self) -> dict:
        """Derived values the template places (computed here, never in the template)."""
        cfg = self.config
        if isinstance(cfg, PipelineSelfTestConfig):
            return {
                "kernel": self.contracts["selftest"],
                "producer_chunk_bytes": cfg.slot_bytes // cfg.pipeline.num_producer,
                "consumer_chunk_bytes": cfg.slot_bytes // cfg.pipeline.num_consumer,
            }
        common = {"kernels": self.contracts, "c_policy": C_POLICY, "error_ints": ERROR_RECORD_INTS}
        if cfg.backend == "cdna":
            from .cdna_layout import tile_swizzles

            sw = tile_swizzles(cfg)
            return {**common, "elem_type": "Bf16" if cfg.q_dtype == "bf16" else "Fp16",
                    "keys_per_wave": cfg.kv_buffers[0].WN, "key_slices": cfg.qk_key_slices,
                    "cols_per_wave": cfg.head_dim_v // cfg.waves,
                    "q_swizzle": sw["q"], "k_swizzle": sw["k"], "v_swizzle": sw["v"], "p_swizzle": sw["p"]}
        chunks = cfg.head_dim_qk * 2 // 16
        return {
            **common,
            "c_type": C_TYPES[cfg.q_dtype],
            "chunks_per_row": chunks,
            "lanes_per_row": min(32, chunks),
            "col_iters": -(-chunks // 32),
            "ds_mla_latent": DS_MLA_LATENT,
            "mma_c_type": C_TYPES[cfg.mma_dtype],
            "pv_c_type": C_TYPES[getattr(cfg, "pv_dtype", cfg.mma_dtype)],
            # P's factor in shared memory (kvforge::sm80::kRawBf16PBias where PV reads V as bf16 x 2^-120)
            "p_store_scale": "0x1p100f" if getattr(cfg, "raw_bf16_v", False) else "1.f",
            "q_to_fp16": cfg.mma_dtype == "fp16" and cfg.q_dtype == "bf16",
            "fp8_layout": FP8_LAYOUT_ENUM[cfg.scale_mode],
            "combine_groups": combine_groups(cfg),
        }


# kvforge::fp8::Layout (fp8_convert.cuh) per scale mode; 16-bit caches never read it
FP8_LAYOUT_ENUM = {"none": "kPerTensor", "per_tensor": "kPerTensor", "block": "kBlock", "fp8_ds_mla": "kPackedMLA"}


def variant_from_dict(data: dict) -> Variant:
    kind = data.get("kind") or data.get("family") or "config"
    tag = _kind(data)
    if tag != "selftest" and tag not in BACKEND_CLASSES:
        raise ConfigError(f"{kind}: {_unknown_backend(tag)}")
    try:
        return Variant(CONFIG_ADAPTER.validate_python(data))
    except ValidationError as err:
        raise ConfigError(describe_validation_error(kind, err, skip_tags=("selftest", *BACKEND_CLASSES))) from None

