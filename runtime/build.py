"""One entry point for building any variant: NVRTC for CUDA, hiprtc/clang for HIP."""
from __future__ import annotations

from kvforge.codegen.variant import Variant

from .compiler import CompiledKernel, compile


def build_variant(variant: Variant, *, debug: bool = False) -> CompiledKernel:
    if variant.language == "hip":
        from .hip_compiler import compile_hip

        return compile_hip(variant)
    return compile(variant, debug=debug)


def build_weight(variant: Variant) -> float:
    """A variant's build time relative to an sm80 one, to start the longest builds first when several run in
    parallel (so no long one is left alone at the end). Measured (NVRTC 13.0, 2 cores, `kvforge compile`'s
    'compile s' column): the sm90 seesaw kernels 6.5-10 s, the other sm90 kernels 1.3-2 s, sm80 and the
    pipeline self-tests 0.1-1.2 s."""
    cfg = variant.config
    if variant.family not in ("mla_decode", "gqa_decode") or cfg.backend != "sm90":
        return 1.0
    return 10.0 if cfg.schedule == "seesaw" else 2.0


def amd_toolchain_missing() -> str | None:
    """Why some HIP variant (hiprtc for gfx90a, or clang for gfx942) cannot be compiled here, or
    None when every one can. `availability.missing_for` says it per variant."""
    from .availability import hip_missing

    missing = dict.fromkeys(m.what for arch in ("gfx90a", "gfx942") for m in hip_missing(arch))
    return ", ".join(missing) or None
