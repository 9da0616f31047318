"""kvforge.codegen: config models, variant matrices, the variant choice, rendering, the manifest and the
codegen commands of the CLI. Never imports kvforge.runtime."""
from .arch import ARCHS, BACKEND_ARCHS, ArchSpec
from .errors import ConfigError
from .matrix import DEFAULT_MATRIX, filter_variants, load_matrix
from .pipeline import PipelineConfig
from .render import render_variant
from .selftest import PipelineSelfTestConfig
from .variant import Variant, variant_from_dict

__all__ = ["ARCHS", "BACKEND_ARCHS", "ArchSpec", "ConfigError", "DEFAULT_MATRIX", "filter_variants",
           "load_matrix", "PipelineConfig", "render_variant", "PipelineSelfTestConfig", "Variant",
           "variant_from_dict"]
