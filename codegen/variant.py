"""Variant: one config plus everything derived from it that the emitters and the runtime share
(name, template, output path, template context, the kernels' launch contracts)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Union

from pydantic import Discriminator, Tag, TypeAdapter, ValidationError

from .decode import DecodeConfig
from .errors import ConfigError, describe_validation_error
from .naming import config_hash, variant_name
from .selftest import PipelineSelfTestConfig

C_TYPES = {"bf16": "__nv_bfloat16", "fp16": "__half"}


def _kind(data) -> str:
    if isinstance(data, dict):
        return "selftest" if data.get("kind") == "pipeline_selftest" else "decode"
    return "selftest" if isinstance(data, PipelineSelfTestConfig) else "decode"


AnyConfig = Annotated[
    Union[Annotated[PipelineSelfTestConfig, Tag("selftest")], Annotated[DecodeConfig, Tag("decode")]],
    Discriminator(_kind),
]
CONFIG_ADAPTER = TypeAdapter(AnyConfig)


@dataclass(frozen=True)
class KernelArg:
    name: str
    ctype: str


@dataclass(frozen=True)
class KernelContract:
    """One kernel of a variant: symbol, grid (expressions over run-time values), block, dynamic
    shared memory and the argument list with C types."""

    symbol: str
    grid: tuple[str, str, str]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    args: tuple[KernelArg, ...]

    def to_json(self) -> dict:
        return {
            "symbol": self.symbol,
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_smem_bytes": self.dynamic_smem_bytes,
            "args": [{"name": a.name, "ctype": a.ctype} for a in self.args],
        }


def _args(*pairs: str) -> tuple[KernelArg, ...]:
    return tuple(KernelArg(name=p.rsplit(" ", 1)[1], ctype=p.rsplit(" ", 1)[0]) for p in pairs)


def _selftest_kernels(name: str, cfg: PipelineSelfTestConfig) -> tuple[KernelContract, ...]:
    return (KernelContract(name, ("min(num_tiles, num_sms)", "1", "1"), (cfg.threads, 1, 1), cfg.layout.total_bytes,
                           _args("const uint4* src", "unsigned int* out", "int num_tiles")),)


def combine_threads(cfg: DecodeConfig) -> int:
    return min(256, max(32, cfg.head_dim_v // 2))


def _decode_kernels(name: str, cfg: DecodeConfig) -> tuple[KernelContract, ...]:
    t = "unsigned short" if cfg.backend == "cdna" else C_TYPES[cfg.q_dtype]
    heads = "num_q_heads / heads_per_cta (MLA: rounded up)" if cfg.family == "mla_decode" else "num_kv_heads"
    return (
        KernelContract(f"{name}_plan", ("ceil(batch / 256)", "1", "1"), (256, 1, 1), 0,
                       _args("const int* seqlens", "int* split_plan", "int batch", "int num_splits",
                             "int min_keys_per_split")),
        KernelContract(name, (heads, "batch", "num_splits"), (cfg.threads, 1, 1), cfg.layout.total_bytes,
                       _args(f"const {t}* q", f"const {t}* k_cache", f"const {t}* v_cache", "const int* block_table",
                             "const int* seqlens", "const int* split_plan", f"{t}* out", "float* lse",
                             "float* part_o", "float* part_lse", "int s_q", "int num_q_heads", "int num_kv_heads",
                             "int max_pages", "int num_splits", "float scale_log2", "int causal")),
        KernelContract(f"{name}_combine", ("num_q_heads", "s_q", "batch"), (combine_threads(cfg), 1, 1), 0,
                       _args("const float* part_o", "const float* part_lse", "const int* split_plan", f"{t}* out",
                             "float* lse", "int s_q", "int num_q_heads", "int num_splits")),
    )


@dataclass(frozen=True)
class Variant:
    config: PipelineSelfTestConfig | DecodeConfig

    @cached_property
    def name(self) -> str:
        return variant_name(self.config)

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
        return f"{self.language}/decode_{self.backend}.{'hip' if self.language == 'hip' else 'cu'}.j2"

    @property
    def relpath(self) -> str:
        """Path of the source under generated/."""
        return f"{self.backend}/{self.name}.{'hip' if self.language == 'hip' else 'cu'}"

    @cached_property
    def kernels(self) -> tuple[KernelContract, ...]:
        if isinstance(self.config, PipelineSelfTestConfig):
            return _selftest_kernels(self.name, self.config)
        return _decode_kernels(self.name, self.config)

    @property
    def main_kernel(self) -> KernelContract:
        return next(k for k in self.kernels if k.symbol == self.name)

    def template_context(self) -> dict:
        """Derived values the template places (computed here, never in the template)."""
        cfg = self.config
        if isinstance(cfg, PipelineSelfTestConfig):
            return {
                "producer_chunk_bytes": cfg.slot_bytes // cfg.pipeline.num_producer,
                "consumer_chunk_bytes": cfg.slot_bytes // cfg.pipeline.num_consumer,
            }
        if cfg.backend == "cdna":
            from .cdna_layout import tile_swizzles

            sw = tile_swizzles(cfg)
            return {"elem_type": "Bf16" if cfg.q_dtype == "bf16" else "Fp16",
                    "keys_per_wave": cfg.kv_buffers[0].WN, "key_slices": cfg.qk_key_slices,
                    "cols_per_wave": cfg.head_dim_v // cfg.waves,
                    "q_swizzle": sw["q"], "k_swizzle": sw["k"], "v_swizzle": sw["v"], "p_swizzle": sw["p"]}
        chunks = cfg.head_dim_qk * 2 // 16
        return {
            "c_type": C_TYPES[cfg.q_dtype],
            "chunks_per_row": chunks,
            "lanes_per_row": min(32, chunks),
            "col_iters": -(-chunks // 32),
            "combine_threads": combine_threads(cfg),
        }


def variant_from_dict(data: dict) -> Variant:
    try:
        return Variant(CONFIG_ADAPTER.validate_python(data))
    except ValidationError as err:
        kind = data.get("kind") or data.get("family") or "config"
        raise ConfigError(describe_validation_error(kind, err, skip_tags=("selftest", "decode"))) from None

