"""kvforge.runtime: compile (NVRTC, cache), load and launch generated kernels."""
from .cache import KernelCache, default_cache_dir
from .compiler import CompiledKernel, compile
from .errors import CompileError, JITDisabledError

__all__ = ["KernelCache", "default_cache_dir", "CompiledKernel", "compile", "CompileError", "JITDisabledError"]
