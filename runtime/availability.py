"""What can be built on this machine: for each variant, the pieces its compiler needs that are
missing here (a Python package, clang, hiprtc, NVRTC), and one summary line per group of
skipped variants saying what is missing and the command that installs it.

Probes only look (imports of small packages, PATH, library files); nothing is compiled or loaded
onto a device. `compile`, `demo` and the tests use them to skip cleanly instead of failing.
"""
from __future__ import annotations

import importlib.util
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

from kvforge.codegen.variant import Variant

CUDA_FIX = 'pip install -e ".[cuda]"'
HIP_FIX = 'pip install -e ".[hip]"'
AMD_FIX = "make setup-amd"


@dataclass(frozen=True, order=True)
class Missing:
    """One missing piece: what it is, and the command that installs it."""

    what: str
    fix: str


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@lru_cache(maxsize=1)
def cuda_missing() -> tuple[Missing, ...]:
    """NVRTC through cuda-core, and the CUDA headers it compiles against."""
    from .toolchain import ToolchainError, cuda_include_dirs, nvrtc_version

    if not (has_module("cuda") and has_module("cuda.core") and has_module("cuda.bindings")):
        return (Missing("NVRTC (cuda-core, cuda-bindings) is not installed", CUDA_FIX),)
    try:
        nvrtc_version()
        cuda_include_dirs()
    except ToolchainError as err:
        return (Missing(str(err).split(";")[0].split(": pip")[0], CUDA_FIX),)
    except Exception as err:  # noqa: BLE001 - e.g. the NVRTC library itself fails to load
        return (Missing(f"NVRTC does not load ({type(err).__name__}: {err})", CUDA_FIX),)
    return ()


def _clang_missing() -> tuple[Missing, ...]:
    from .hip_toolchain import HipToolchainError, clang_path

    try:
        clang_path()
    except HipToolchainError:
        return (Missing("no clang with the AMDGPU target (clang-19)", AMD_FIX),)
    return ()


def _hiprtc_missing() -> tuple[Missing, ...]:
    from .hip_toolchain import find_hiprtc

    out = []
    if not has_module("hip"):
        out.append(Missing("hip-python is not installed", HIP_FIX))
    if find_hiprtc() is None:
        out.append(Missing("no hiprtc library (ROCm)", AMD_FIX))
    return tuple(out)


@lru_cache(maxsize=None)
def hip_missing(arch: str, compiler: str | None = None) -> tuple[Missing, ...]:
    """What compiling a HIP variant for `arch` with `compiler` (default: the one the runtime uses
    for that arch: hiprtc, or clang for gfx94x) lacks here."""
    from .hip_toolchain import default_compiler

    out = [] if has_module("msgpack") else [Missing("msgpack is not installed", HIP_FIX)]
    out += _clang_missing() if (compiler or default_compiler(arch)) == "clang" else _hiprtc_missing()
    return tuple(out)


def missing_for(variant: Variant) -> tuple[Missing, ...]:
    """The missing pieces that keep `variant` from compiling here; () when it can."""
    return hip_missing(variant.arch) if variant.language == "hip" else cuda_missing()


@dataclass(frozen=True)
class SkipGroup:
    """Variants of one language skipped for the same missing pieces."""

    language: str
    missing: tuple[Missing, ...]
    variants: tuple[Variant, ...]

    def line(self) -> str:
        """`skipped N HIP variants (gfx90a): what is missing; the command that installs it`."""
        what = ", ".join(m.what for m in self.missing)
        pip_first = sorted(self.missing, key=lambda m: m.fix not in (CUDA_FIX, HIP_FIX))
        fixes = " && ".join(dict.fromkeys(m.fix for m in pip_first))
        arches = ", ".join(sorted({v.arch for v in self.variants}))
        lang = "HIP" if self.language == "hip" else "CUDA"
        return f"skipped {len(self.variants)} {lang} variants ({arches}): {what}; {fixes}"


def partition(variants: list[Variant]) -> tuple[list[Variant], list[SkipGroup]]:
    """(the variants that can be built here, the others grouped by language and missing pieces)."""
    buildable, groups = [], defaultdict(list)
    for v in variants:
        missing = missing_for(v)
        if missing:
            groups[(v.language, missing)].append(v)
        else:
            buildable.append(v)
    skipped = [SkipGroup(lang, missing, tuple(vs)) for (lang, missing), vs in groups.items()]
    return buildable, sorted(skipped, key=lambda g: (g.language, sorted({v.arch for v in g.variants})))


def skips_fail(skipped: list[SkipGroup], *, built: int, explicit: bool, arches: list[str] | None) -> str | None:
    """Why the skips fail the command, or None. A missing piece fails it only where the user asked
    for what it builds: an `--arch` they named, or an explicit selection (a matrix file or a
    --filter) of which nothing could be built here."""
    named = sorted({v.arch for g in skipped for v in g.variants} & set(arches or ()))
    if named:
        return f"--arch {' '.join(named)} was asked for, and its variants cannot be built here"
    if skipped and explicit and built == 0:
        return "none of the selected variants can be built here"
    return None


def clear_probes() -> None:
    """Forget the probes' results (tests simulate install states)."""
    cuda_missing.cache_clear()
    hip_missing.cache_clear()
