"""`kvforge demo` / `make demo`: the main job on a matrix (default: the built-in one).

Generates the sources (into --out), compiles every CUDA variant with NVRTC, and where a CUDA GPU
is present runs every variant built for its arch against the NumPy reference and times it.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvforge.codegen.manifest import render_tree, write_tree
from kvforge.codegen.matrix import load_matrix

from .compiler import compile
from .device import cuda_device_count, device_arch


def runs_on(variant_arch: str, dev_arch: str) -> bool:
    """A cubin runs only on its own major.minor; sm_90a code runs on sm_90 devices."""
    return variant_arch.removesuffix("a") == dev_arch


def run_demo(matrix: str | None, out: Path) -> int:
    console = Console(width=200)
    variants = load_matrix(matrix)
    files = render_tree(variants)
    write_tree(files, out)
    console.print(f"generated {len(variants)} variants into {out}")

    t0 = time.perf_counter()
    cuda = [v for v in variants if v.language == "cuda"]
    for v in cuda:
        compile(v)
    console.print(f"compiled {len(cuda)} CUDA variants in {time.perf_counter() - t0:.1f} s (NVRTC, cached)")

    if cuda_device_count() == 0:
        console.print("no CUDA GPU here: kernels were generated and compiled, not run")
        return 0
    from .selftest import check_pipeline_selftest

    arch = device_arch()
    table = Table(title=f"pipeline self-test on {arch}")
    for col in ("variant", "result", "tiles", "median ms", "GB/s read"):
        table.add_column(col)
    failed = 0
    for v in variants:
        if v.family != "pipeline_selftest" or not runs_on(v.arch, arch):
            continue
        r = check_pipeline_selftest(v, mib=512, seed=hash(v.name) & 0xFFFF, repeats=20)
        failed += not r["ok"]
        table.add_row(v.name, "ok" if r["ok"] else f"FAIL ({r['mismatches']} sums)", str(r["tiles"]),
                      f"{r['median_ms']:.3f}", f"{r['gbps']:.0f}")
    console.print(table)
    return 1 if failed else 0
