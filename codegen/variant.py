"""Variant: one config plus everything derived from it that the emitters and the runtime share
(name, template, output path, launch contract)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pydantic import TypeAdapter

from .naming import config_hash, variant_name
from .selftest import PipelineSelfTestConfig

# Every config kind that has a template. Decode families join when their kernels land.
AnyConfig = PipelineSelfTestConfig
CONFIG_ADAPTER = TypeAdapter(AnyConfig)


@dataclass(frozen=True)
class KernelArg:
    name: str
    ctype: str


@dataclass(frozen=True)
class LaunchContract:
    """What a host launcher needs: grid (an expression over the named run-time values), block,
    dynamic shared memory and the argument list with C types."""

    grid: tuple[str, str, str]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    args: tuple[KernelArg, ...]

    def to_json(self) -> dict:
        return {
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_smem_bytes": self.dynamic_smem_bytes,
            "args": [{"name": a.name, "ctype": a.ctype} for a in self.args],
        }


def _selftest_contract(cfg: PipelineSelfTestConfig) -> LaunchContract:
    return LaunchContract(
        grid=("min(num_tiles, num_sms)", "1", "1"),
        block=(cfg.threads, 1, 1),
        dynamic_smem_bytes=cfg.layout.total_bytes,
        args=(KernelArg("src", "const uint4*"), KernelArg("out", "unsigned int*"), KernelArg("num_tiles", "int")),
    )


def _selftest_context(cfg: PipelineSelfTestConfig) -> dict:
    return {
        "producer_chunk_bytes": cfg.slot_bytes // cfg.pipeline.num_producer,
        "consumer_chunk_bytes": cfg.slot_bytes // cfg.pipeline.num_consumer,
    }


@dataclass(frozen=True)
class Variant:
    config: AnyConfig

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
        return f"{self.language}/{self.family}.{'hip' if self.language == 'hip' else 'cu'}.j2"

    @property
    def relpath(self) -> str:
        """Path of the source under generated/."""
        return f"{self.backend}/{self.name}.{'hip' if self.language == 'hip' else 'cu'}"

    @cached_property
    def launch(self) -> LaunchContract:
        return _selftest_contract(self.config)

    def template_context(self) -> dict:
        """Derived values the template places (computed here, never in the template)."""
        return _selftest_context(self.config)


def variant_from_dict(data: dict) -> Variant:
    from .errors import ConfigError, describe_validation_error
    from pydantic import ValidationError

    try:
        return Variant(CONFIG_ADAPTER.validate_python(data))
    except ValidationError as err:
        kind = data.get("kind", "config")
        raise ConfigError(describe_validation_error(kind, err)) from None
