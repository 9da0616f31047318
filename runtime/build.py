"""One entry point for building any variant: NVRTC for CUDA, hiprtc/clang for HIP."""
from __future__ import annotations

from kvforge.codegen.variant import Variant

from .compiler import CompiledKernel, compile


def build_variant(variant: Variant, *, debug: bool = False) -> CompiledKernel:
    if variant.language == "hip":
        from .hip_compiler import compile_hip

        return compile_hip(variant)
    return compile(variant, debug=debug)


def amd_toolchain_missing() -> str | None:
    """Why HIP variants cannot be compiled here, or None when they can."""
    from .hip_toolchain import HipToolchainError, clang_path

    try:
        clang_path()
        import hip  # noqa: F401
        import msgpack  # noqa: F401
    except (HipToolchainError, ImportError) as err:
        return str(err)
    return None
