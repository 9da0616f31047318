"""compile_hip(variant) -> CompiledKernel: render, then hiprtc (through hip-python, in a
subprocess) or clang (-nogpuinc -nogpulib) to an AMDGPU code object for the variant's arch,
through the same on-disk cache as the CUDA path."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import tempfile
import time

from kvforge.codegen.render import HEADER_DIRS, header_digest, render_variant
from kvforge.codegen.variant import Variant
from kvforge.codegen.version import VERSION

from .cache import KernelCache
from .compiler import CompiledKernel
from .errors import CompileError, JITDisabledError
from .hip_toolchain import clang_path, clang_version, default_compiler, hiprtc_env, python
from .amdgpu_notes import code_object_kernels
from .resources import KernelResources

COMMON_OPTS = ["-O3", "-std=c++17"]


def _key(source: str, arch: str, compiler: str, opts: list[str]) -> str:
    ident = clang_version() if compiler == "clang" else "hiprtc"
    blob = json.dumps({"format": 2, "source": hashlib.sha256(source.encode()).hexdigest(), "arch": arch,
                       "compiler": compiler,
                       "compiler_id": ident, "options": opts, "headers": header_digest("hip"), "kvforge": VERSION},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _run_clang(source_path: str, out_path: str, arch: str) -> subprocess.CompletedProcess:
    cmd = [clang_path(), "-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", *COMMON_OPTS,
           "-mcode-object-version=5", f"--offload-arch={arch}", "-nogpuinc", "-nogpulib",
           "-I", str(HEADER_DIRS["hip"]), source_path, "-o", out_path]
    return subprocess.run(cmd, capture_output=True, text=True)


def _run_hiprtc(source_path: str, out_path: str, arch: str) -> subprocess.CompletedProcess:
    cmd = [python(), "-m", "kvforge.runtime.hiprtc_worker", source_path, out_path, arch, *COMMON_OPTS,
           f"-I{HEADER_DIRS['hip']}"]
    return subprocess.run(cmd, capture_output=True, text=True, env=hiprtc_env(), timeout=600)


def compile_hip(variant: Variant, *, compiler: str | None = None, cache: KernelCache | None = None) -> CompiledKernel:
    """The variant's code object (cache first). Raises CompileError with the compiler's log and the
    offending source lines, also when hiprtc crashes on a target it does not know."""
    if variant.language != "hip":
        raise CompileError(variant.name, variant.arch, "CUDA variants compile through kvforge.runtime.compile")
    compiler = compiler or default_compiler(variant.arch)
    cache = cache or KernelCache()
    memo_key = (str(cache.root), variant.name, compiler)
    hit = _memo.get(memo_key)  # the in-process memo: no re-render, re-hash or disk read per call
    if hit is not None:
        return hit
    source = render_variant(variant)
    key = _key(source, variant.arch, compiler, COMMON_OPTS)
    entry = cache.get(variant.name, key)
    if entry is None:
        if os.environ.get("KVFORGE_DISABLE_JIT") == "1":
            raise JITDisabledError(variant.name, variant.arch, f"KVFORGE_DISABLE_JIT=1 and no cache entry under "
                                   f"{cache.root}")
        with cache.lock(variant.name, key):
            entry = cache.get(variant.name, key)
            if entry is None:
                entry = cache.put(variant.name, key, *_build(variant, source, compiler))
    meta = entry.meta
    kernel = CompiledKernel(variant.name, variant.arch, entry.binary, KernelResources(**meta["resources"]),
                            meta["compile_seconds"], False, False)
    _memo[memo_key] = kernel
    return kernel


_memo: dict[tuple, CompiledKernel] = {}  # (cache root, variant name, compiler): names carry the config hash


def _build(variant: Variant, source: str, compiler: str) -> tuple[bytes, dict]:
    filename = f"{variant.name}.hip"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, filename), os.path.join(tmp, "out.co")
        with open(src, "w") as f:
            f.write(source)
        t0 = time.perf_counter()
        run = _run_clang if compiler == "clang" else _run_hiprtc
        r = run(src, out, variant.arch)
        seconds = time.perf_counter() - t0
        if r.returncode < 0:
            sig = signal.Signals(-r.returncode).name
            raise CompileError(variant.name, variant.arch,
                               f"{compiler} crashed with {sig} compiling for {variant.arch} (ROCm 5.2's comgr aborts "
                               f"on targets it does not know, e.g. gfx94x; use compiler='clang')\n{r.stderr[-2000:]}")
        if r.returncode != 0 or not os.path.exists(out):
            raise CompileError(variant.name, variant.arch, f"{compiler}: {r.stdout}{r.stderr}", source, filename)
        binary = open(out, "rb").read()
    main = code_object_kernels(binary).get(variant.name)
    if main is None:
        raise CompileError(variant.name, variant.arch, f"{compiler} produced no kernel named {variant.name}")
    # gfx90a/gfx942 have one register file: .vgpr_count already counts the AGPRs in use
    res = KernelResources(main.vgprs, main.lds_bytes, 4 * main.vgpr_spills, 0, main.scratch_bytes)
    return binary, {"name": variant.name, "arch": variant.arch, "compiler": compiler, "compile_seconds": seconds,
                    "resources": res.to_json()}
