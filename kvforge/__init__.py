"""kvforge: generated decode-attention kernels over a paged KV cache.

`kvforge.codegen` turns validated configs into CUDA/HIP sources; `kvforge.runtime` compiles,
caches and launches them.
"""
from kvforge.codegen.errors import ConfigError
from kvforge.codegen.version import VERSION as __version__
from kvforge.runtime.errors import CompileError

__all__ = ["ConfigError", "CompileError", "__version__"]
