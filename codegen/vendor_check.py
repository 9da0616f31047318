"""Checks that a generated tree is vendorable: every CUDA source compiles with plain `nvcc -c`
against nothing but the tree's include/ folder and the CUDA toolkit.

    python -m kvforge.codegen.vendor_check generated [--jobs N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def nvcc_arch_flags(arch: str) -> list[str]:
    """`sm_90a` needs the -gencode form: the -arch shorthand also runs a plain sm_90 pass."""
    num = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{num},code={arch}"]


def nvcc_compile(tree: Path, relpath: str, arch: str, nvcc: str) -> tuple[str, int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "-c", "-std=c++17", *nvcc_arch_flags(arch), "-I", str(tree / "include"),
               str(tree / relpath), "-o", os.path.join(tmp, "k.o")]
        r = subprocess.run(cmd, capture_output=True, text=True)
    return relpath, r.returncode, (r.stdout + r.stderr).strip()


def check_tree(tree: Path, jobs: int | None = None) -> list[tuple[str, str]]:
    """[(relpath, compiler output)] for every source that failed; raises if nvcc is missing."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    manifest = json.loads((tree / "manifest.json").read_text())
    work = [(rel, e["arch"]) for e in manifest["variants"] for rel in e["files"] if rel.endswith(".cu")]
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda w: nvcc_compile(tree, w[0], w[1], nvcc), work))
    return [(rel, out) for rel, rc, out in results if rc != 0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvforge.codegen.vendor_check")
    ap.add_argument("tree", nargs="?", default="generated")
    ap.add_argument("--jobs", type=int, default=0)
    args = ap.parse_args(argv)
    if shutil.which("nvcc") is None:
        n = sum(rel.endswith(".cu") for e in json.loads((Path(args.tree) / "manifest.json").read_text())["variants"]
                for rel in e["files"])
        print(f"skipped the nvcc check of {n} CUDA sources: nvcc is not on PATH; install the CUDA toolkit "
              "(https://developer.nvidia.com/cuda-downloads) or put its bin/ on PATH")
        return 0
    failures = check_tree(Path(args.tree), args.jobs or None)
    for rel, out in failures[:3]:
        print(f"FAILED nvcc -c {rel}:\n{out}\n")
    for rel, _ in failures[3:]:
        print(f"FAILED nvcc -c {rel}")
    print(f"nvcc: {'all sources compiled' if not failures else f'{len(failures)} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
