"""The CUDA toolchain as found at run time: NVRTC's version and the header folders it needs
(cudart's cuda_bf16.h / cuda_fp8.h and CCCL's cuda/ptx), located through cuda.pathfinder."""
from __future__ import annotations

from functools import lru_cache


class ToolchainError(RuntimeError):
    """The CUDA extra is missing or incomplete; the message says what to install."""


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
    except ImportError as err:
        raise ToolchainError("kvforge needs its CUDA extra to compile: pip install 'kvforge[cuda]'") from err
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"nvrtcVersion failed: {err}")
    return f"{major}.{minor}"


@lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError as err:
        raise ToolchainError("cuda.pathfinder is missing: pip install 'kvforge[cuda]'") from err
    dirs = []
    for lib in ("cudart", "cccl"):
        d = find_nvidia_header_directory(lib)
        if d is None:
            raise ToolchainError(f"the CUDA {lib} headers were not found; pip install 'kvforge[cuda]' "
                                 "(nvidia-cuda-runtime, nvidia-cuda-cccl) or set CUDA_HOME")
        dirs.append(str(d))
    return tuple(dirs)
