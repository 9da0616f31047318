"""The AMD toolchain as found at run time: hiprtc through hip-python (run in a subprocess: ROCm
5.2's comgr aborts the whole process on targets it does not know), and clang with
-nogpuinc -nogpulib for targets whose device libraries the installed ROCm lacks (gfx942)."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from .cache import default_cache_dir

HIPRTC_NAMES = ("libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5")
# ROCm 5.2 (Debian) ships hiprtc inside libamdhip64; hip-python dlopens libhiprtc.so.
AMDHIP_GLOBS = ("/opt/rocm*/lib/libamdhip64.so*", "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5*",
                "/usr/lib/libamdhip64.so.5*")


class HipToolchainError(RuntimeError):
    """No usable AMD compiler; the message says what to install."""


def _lib_dirs() -> list[str]:
    root = os.environ.get("ROCM_PATH")
    return [f"{root}/lib"] if root else []


HIPRTC_MISSING = ("no hiprtc found: install ROCm (Debian: libamdhip64-5 libhiprtc-builtins5 libamd-comgr2 "
                  "rocm-device-libs) or set ROCM_PATH")


def default_compiler(arch: str) -> str:
    """hiprtc is the runtime path; ROCm 5.2's comgr knows no gfx94x, so those go through clang."""
    return "clang" if arch.startswith("gfx94") else "hiprtc"


def find_hiprtc() -> tuple[str, str | None] | None:
    """Where hiprtc is, without creating anything: (folder of ROCm's libhiprtc.so, None), or
    ('', path of ROCm 5.2's libamdhip64.so.5, which carries hiprtc), or None when neither exists."""
    for d in _lib_dirs() + ["/opt/rocm/lib"]:
        for name in HIPRTC_NAMES:
            if Path(d, name).exists():
                return d, None
    hits = sorted(p for g in AMDHIP_GLOBS for p in glob.glob(g))
    return ("", hits[-1]) if hits else None


@lru_cache(maxsize=1)
def hiprtc_library_dir() -> str:
    """A folder holding a `libhiprtc.so` for hip-python: ROCm's own, or a symlink (in kvforge's
    cache dir) to libamdhip64.so.5, which carries hiprtc in ROCm 5.2."""
    found = find_hiprtc()
    if found is None:
        raise HipToolchainError(HIPRTC_MISSING)
    folder, amdhip = found
    if amdhip is None:
        return folder
    link_dir = default_cache_dir() / "hiprtc-lib"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "libhiprtc.so"
    if not link.exists() or os.path.realpath(link) != os.path.realpath(amdhip):
        tmp = link_dir / f".libhiprtc.so.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.realpath(amdhip))
        os.replace(tmp, link)
    return str(link_dir)


@lru_cache(maxsize=1)
def clang_path() -> str:
    """clang with the AMDGPU target: $KVFORGE_HIP_CLANG, else clang-19 .. clang-17 on PATH."""
    env = os.environ.get("KVFORGE_HIP_CLANG")
    if env:
        return env
    for name in ("clang-19", "clang-18", "clang-17"):
        found = shutil.which(name)
        if found:
            return found
    raise HipToolchainError("no clang with AMDGPU support found (Debian: clang-19 lld-19); "
                            "or set KVFORGE_HIP_CLANG")


@lru_cache(maxsize=1)
def clang_version() -> str:
    out = subprocess.run([clang_path(), "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "unknown"


def hiprtc_env() -> dict:
    env = dict(os.environ)
    libdir = hiprtc_library_dir()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p)
    return env


def python() -> str:
    return sys.executable
