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
    """Why some HIP variant (hiprtc for gfx90a, or clang for gfx942) cannot be compiled here, or
    None when every one can. `availability.missing_for` says it per variant."""
    from .availability import hip_missing

    missing = dict.fromkeys(m.what for arch in ("gfx90a", "gfx942") for m in hip_missing(arch))
    return ", ".join(missing) or None
