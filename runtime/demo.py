"""`kvforge demo` / `make demo`: the main job on a matrix (default: the built-in one).

Generates the sources (into --out), compiles every variant whose compiler is installed (NVRTC for
CUDA, hiprtc or clang for HIP; the others are skipped, one line per group saying what to install),
and where a CUDA GPU is present runs every variant built for its arch against the NumPy reference
and times it.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvforge.codegen.manifest import render_tree, write_tree
from kvforge.codegen.matrix import load_matrix

from .availability import has_module, cuda_missing, partition, skips_fail
from .build import build_variant
from .device import cuda_device_count, device_arch, runs_on


def run_demo(matrix: str | None, out: Path) -> int:
    console = Console(width=200)
    variants = load_matrix(matrix)
    files = render_tree(variants)
    write_tree(files, out)
    console.print(f"generated {len(variants)} variants into {out}")

    buildable, skipped = partition(variants)
    failed = 0
    for language, label, how in (("cuda", "CUDA", "NVRTC, cached"),
                                 ("hip", "HIP", "hiprtc / clang, cached; no AMD GPU here: compile- and "
                                                "emulation-verified only")):
        todo = [v for v in buildable if v.language == language]
        if not todo:
            continue
        t0, bad = time.perf_counter(), 0
        for v in todo:
            try:
                build_variant(v)
            except Exception as err:  # noqa: BLE001 - a compile error or a broken toolchain, reported per variant
                bad += 1
                console.print(f"FAILED {v.name}:\n{err}", style="red", markup=False, highlight=False)
        console.print(f"compiled {len(todo) - bad} {label} variants in {time.perf_counter() - t0:.1f} s ({how})")
        failed += bad
    for group in skipped:
        console.print(group.line(), markup=False, highlight=False)
    why = skips_fail(skipped, built=len(buildable), explicit=matrix is not None, arches=None)
    if why:
        console.print(f"FAILED: {why}", style="red", markup=False, highlight=False)
        return 1

    if cuda_device_count() == 0:
        console.print("no CUDA GPU here: kernels were generated and compiled, not run")
        return 1 if failed else 0
    if cuda_missing():
        console.print("a CUDA GPU is here, but the CUDA variants were not compiled: nothing to run")
        return 1 if failed else 0
    from .selftest import check_pipeline_selftest

    arch = device_arch()
    table = Table(title=f"pipeline self-test on {arch}")
    for col in ("variant", "result", "tiles", "median ms", "GB/s read"):
        table.add_column(col)
    for v in variants:
        if v.family != "pipeline_selftest" or not runs_on(v.arch, arch):
            continue
        r = check_pipeline_selftest(v, mib=512, seed=hash(v.name) & 0xFFFF, repeats=20)
        failed += not r["ok"]
        table.add_row(v.name, "ok" if r["ok"] else f"FAIL ({r['mismatches']} sums)", str(r["tiles"]),
                      f"{r['median_ms']:.3f}", f"{r['gbps']:.0f}")
    console.print(table)
    if not has_module("torch"):
        console.print('skipped the decode demo: it feeds torch tensors and torch is not installed; pip install torch',
                      markup=False, highlight=False)
    else:
        failed += _decode_demo(console)
    return 1 if failed else 0


def _decode_demo(console) -> int:
    """MLA and GQA decode on random paged inputs: checked against the float64 reference, timed."""
    import math

    import numpy as np
    import torch

    import kvforge

    from .reference import paged_decode_reference

    table = Table(title="decode: kvforge vs the float64 reference")
    for col in ("case", "rel. L2 error", "median ms", "GB/s"):
        table.add_column(col)
    failed = 0
    g = torch.Generator(device="cuda").manual_seed(1)
    for family, b, s_q, hq, hkv, d, ps, n in (("mla_decode", 16, 1, 128, 1, 576, 64, 2048),
                                               ("mla_decode", 4, 2, 16, 1, 576, 64, 1500),
                                               ("gqa_decode", 16, 1, 32, 8, 128, 16, 4096),
                                               # 32 query rows per KV head: the sm90 wgmma GQA kernel on sm_90
                                               ("gqa_decode", 16, 4, 64, 8, 128, 16, 4096)):
        pages = b * math.ceil(n / ps)
        shape = (pages, ps, d) if family == "mla_decode" else (pages, ps, hkv, d)
        k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
        v = None if family == "mla_decode" else torch.randn_like(k)
        bt = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).reshape(b, -1)
        lens = torch.randint(1, n + 1, (b,), device="cuda", generator=g, dtype=torch.int32)
        q = torch.randn((b, s_q, hq, d), device="cuda", dtype=torch.bfloat16, generator=g)
        if family == "mla_decode":
            run = lambda: kvforge.mla_decode(q, k, bt, lens, causal=s_q > 1, check_inputs=False)  # noqa: E731
        else:
            run = lambda: kvforge.gqa_decode(q, k, v, bt, lens, causal=s_q > 1, check_inputs=False)  # noqa: E731
        out, _ = run()
        torch.cuda.synchronize()
        kc = k.double().cpu().numpy()
        kc = kc[:, :, None] if family == "mla_decode" else kc
        vc = kc if family == "mla_decode" else v.double().cpu().numpy()
        want, _ = paged_decode_reference(q.double().cpu().numpy(), kc, vc, bt.cpu().numpy(), lens.cpu().numpy(),
                                         scale=1 / math.sqrt(d), causal=s_q > 1,
                                         v_dim=512 if family == "mla_decode" else None)
        got = out.double().cpu().numpy()
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        times = []
        for _ in range(20):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        ms = float(np.median(times))
        kv_bytes = int(lens.sum()) * (576 if family == "mla_decode" else 2 * hkv * d) * 2
        ok = err < 1e-2
        failed += not ok
        table.add_row(f"{family} b={b} s_q={s_q} H={hq} Hkv={hkv} D={d} page={ps} len<={n}",
                      f"{err:.1e}" + ("" if ok else " FAIL"), f"{ms:.3f}", f"{kv_bytes / ms / 1e6:.0f}")
    console.print(table)
    console.print("(eager single calls, host overhead included; `make bench` has the graph-timed numbers and peers)")
    return failed
