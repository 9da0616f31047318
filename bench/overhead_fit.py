"""Fixed cost per launch vs cost per key: time one grid shape at several sequence lengths and fit
t = a + b * s_k (least squares), for kvforge's calls and FlashInfer on the same paged inputs.

    python bench/overhead_fit.py [--rounds 2] [--no-flashinfer] [--only mla|gqa]

Each family keeps its grid fixed while s_k grows (MLA 128 heads at b=64 and 64 heads at b=128: 128 CTAs, one
wave on 132 SMs, no split; MLA 128 heads at b=32: 128 CTAs of two chunks per sequence, merged by the last CTA;
GQA 32/8 heads at b=64: 512 CTAs), so the intercept `a` is what a launch costs
whatever its length (launch, prologue, the first tiles' latency, epilogue, tail) and the slope `b` the time per
1024 keys of every sequence (the steady state: per-tile math for MLA at 128 heads, the read rate for GQA). The
split launches where kvforge trails FlashInfer most have 8-32 tiles per CTA, where the intercept weighs.
MLA rows: the built-in choice (with the max_seq_len hint, as bench.py calls it) and both sm90 schedules pinned.

Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies rotating past the L2),
every call of a shape captured together and timed in rounds of rotating order, the median per call.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, Shape, flashinfer_calls, interleaved_ms, make_inputs, run_kvforge  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.codegen.select import sm90_long_chunks  # noqa: E402
from kvforge.runtime.decode import select_config  # noqa: E402
from kvforge.runtime.device import sm_count  # noqa: E402

FAMILIES = {
    "mla h=128 b=64": (lambda s_k: Shape("mla_decode", 64, s_k, 128), (512, 1024, 2048, 4096, 8192)),
    "mla h=64 b=128": (lambda s_k: Shape("mla_decode", 128, s_k, 64), (512, 1024, 2048, 4096, 8192)),
    "mla h=128 b=32 (2 chunks)": (lambda s_k: Shape("mla_decode", 32, s_k, 128), (1024, 2048, 4096, 8192)),
    "gqa 32/8 D=128 b=64": (lambda s_k: Shape("gqa_decode", 64, s_k, 32, 8, 128, page=16), (1024, 2048, 4096, 8192)),
}


def fit(xs, ys):
    """(intercept, slope, r2) of the least-squares line through (xs, ys)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - slope * mx
    ss = sum((y - my) ** 2 for y in ys)
    r2 = 1 - sum((y - a - slope * x) ** 2 for x, y in zip(xs, ys)) / ss if ss else 1.0
    return a, slope, r2


def variants(sh):
    """{name: config or None (the built-in call)} for one shape."""
    if sh.family != "mla_decode":
        return {"kvforge": None}
    long_chunks = sm90_long_chunks(sh.s_k, sh.b, sh.hq, sh.s_q, sm_count(0))
    base = select_config(sh.family, "bf16", sh.page, sh.hq, sh.d, sh.s_q, 0, batch=sh.b, long_chunks=long_chunks)
    if base.backend != "sm90":
        return {"kvforge": None}
    data = base.model_dump(mode="json")
    return {"kvforge": None, **{s: build(DecodeConfig, {**data, "schedule": s}) for s in ("lockstep", "seesaw")}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--only", choices=("mla", "gqa"))
    args = ap.parse_args()
    for family, (make, lengths) in FAMILIES.items():
        if args.only and not family.startswith(args.only):
            continue
        times: dict[str, list[float]] = {}
        print(f"\n{family}: ms per call")
        for s_k in lengths:
            sh = make(s_k)
            copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
            q, kv, bt, lens = make_inputs(sh, copies)
            calls = {n: [lambda i=i, c=c: run_kvforge(sh, q, *kv[i], bt, lens, c) for i in range(copies)]
                     for n, c in variants(sh).items()}
            if not args.no_flashinfer:
                calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
            t = interleaved_ms(calls, 20, args.rounds)
            for n, ms in t.items():
                times.setdefault(n, []).append(ms)
            print(f"  s_k={s_k}: " + ", ".join(f"{n} {ms:.4f}" for n, ms in t.items()), flush=True)
            del q, kv, calls
            torch.cuda.empty_cache()
        print(f"| {family} | intercept us | us per 1024 keys | r2 | " + " | ".join(f"s_k={s}" for s in lengths) + " |")
        print("|---" * (4 + len(lengths)) + "|")
        for n, ys in times.items():
            if len(ys) != len(lengths):
                continue
            a, slope, r2 = fit(lengths, ys)
            print(f"| {n} | {1000 * a:.1f} | {1000 * 1024 * slope:.2f} | {r2:.4f} | "
                  + " | ".join(f"{y:.4f}" for y in ys) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
