"""compile(variant) -> CompiledKernel: render, NVRTC (through cuda.core) to a cubin for the
variant's exact arch, through the on-disk cache and an in-process memo."""
from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
from dataclasses import dataclass

from kvforge.codegen.render import HEADER_DIRS, header_digest, render_variant
from kvforge.codegen.variant import Variant
from kvforge.codegen.version import VERSION

from .cache import KernelCache
from .errors import CompileError, JITDisabledError
from .resources import KernelResources, kernel_resources
from .toolchain import cuda_include_dirs, nvrtc_version


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    arch: str
    cubin: bytes
    resources: KernelResources
    compile_seconds: float  # of the build that produced the cached entry
    cache_hit: bool
    debug: bool
    log: str = ""  # the compiler's log of the build that produced the cached entry (ptxas -v and infos)


_memo: dict[str, CompiledKernel] = {}
_memo_lock = threading.Lock()


def compile_options(arch: str, debug: bool) -> list[str]:
    """The NVRTC options, as strings: part of the cache key."""
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v"]
    if debug:
        opts.append("-DKVFORGE_DEBUG_BARRIERS")
    return opts


def cache_key(source: str, options: list[str]) -> str:
    blob = json.dumps({
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "options": options,
        "nvrtc": nvrtc_version(),
        "headers": header_digest("cuda"),
        "kvforge": VERSION,
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _nvrtc_compile(name: str, arch: str, source: str, debug: bool) -> tuple[bytes, str, float]:
    from cuda.core import Program, ProgramOptions

    filename = f"{name}.cu"
    opts = ProgramOptions(
        name=filename, arch=arch, std="c++17", ptxas_options=["-v"],
        include_path=[str(HEADER_DIRS["cuda"]), *cuda_include_dirs()],
        define_macro=["KVFORGE_DEBUG_BARRIERS"] if debug else None,
    )
    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        obj = Program(source, "c++", options=opts).compile("cubin", logs=log)
    except Exception as err:  # NVRTCError carries the compilation log in its message
        raise CompileError(name, arch, f"{err}\n{log.getvalue()}", source, filename) from None
    return bytes(obj.code), log.getvalue(), time.perf_counter() - t0


def compile(variant: Variant, *, debug: bool = False, cache: KernelCache | None = None) -> CompiledKernel:
    """Compiled cubin for `variant` (from the memo, the disk cache, or NVRTC, in that order).

    Raises CompileError (with the offending source lines) when NVRTC rejects the source, and
    JITDisabledError when KVFORGE_DISABLE_JIT=1 and the cache has no entry.
    """
    if variant.language != "cuda":
        raise CompileError(variant.name, variant.arch, "HIP variants compile through the hip backend")
    return compile_source(variant.name, variant.arch, render_variant(variant), debug=debug, cache=cache)


def compile_source(name: str, arch: str, source: str, *, debug: bool = False,
                   cache: KernelCache | None = None) -> CompiledKernel:
    """compile() for an already rendered source whose `extern "C"` kernel is `name`."""
    cache = cache or KernelCache()
    options = compile_options(arch, debug)
    key = cache_key(source, options)
    memo_key = f"{cache.root}:{key}"
    with _memo_lock:
        hit = _memo.get(memo_key)
    if hit is not None:
        return hit

    entry = cache.get(name, key)
    cache_hit = entry is not None
    if entry is None:
        if os.environ.get("KVFORGE_DISABLE_JIT") == "1":
            raise JITDisabledError(name, arch,
                                   f"KVFORGE_DISABLE_JIT=1 and no cache entry under {cache.root} "
                                   f"(key {key[:16]}); unset it or pre-build with `kvforge compile`")
        with cache.lock(name, key):
            entry = cache.get(name, key)  # another process may have built it meanwhile
            cache_hit = entry is not None
            if entry is None:
                cubin, log, seconds = _nvrtc_compile(name, arch, source, debug)
                res = kernel_resources(cubin, name, log)
                entry = cache.put(name, key, cubin, {
                    "name": name, "arch": arch, "options": options,
                    "compile_seconds": seconds, "ptxas_log": log, "resources": res.to_json(),
                })
    meta = entry.meta
    kernel = CompiledKernel(name, arch, entry.binary, KernelResources(**meta["resources"]),
                            meta["compile_seconds"], cache_hit, debug, meta.get("ptxas_log", ""))
    with _memo_lock:
        _memo[memo_key] = kernel
    return kernel


def clear_memo() -> None:
    with _memo_lock:
        _memo.clear()
