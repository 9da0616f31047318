"""kvforge: generated decode-attention kernels over a paged KV cache.

`kvforge.mla_decode` / `kvforge.gqa_decode` are the stable surface; `kvforge.codegen` turns
validated configs into CUDA/HIP sources and `kvforge.runtime` compiles, caches and launches them.
"""
from kvforge.codegen.errors import ConfigError
from kvforge.codegen.version import VERSION as __version__
from kvforge.runtime.decode import GQADecode, MLADecode, gqa_decode, mla_decode
from kvforge.runtime.error_record import DeviceInputError, check_errors
from kvforge.runtime.errors import CompileError
from kvforge.runtime.quantize import dequantize_kv, quantize_kv

__all__ = ["ConfigError", "CompileError", "DeviceInputError", "GQADecode", "MLADecode", "check_errors", "dequantize_kv",
           "gqa_decode", "mla_decode", "quantize_kv", "__version__"]
