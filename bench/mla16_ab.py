"""A/B of the sm80 kernel's tiling for 16-bit MLA at 16 heads per CTA (the built-in choice on sm_90 up to
16 query rows): keys per tile x ring depth x producer and consumer warps, at one and two CTAs per SM,
all pinned, against the built-in choice and FlashInfer, on three 16-head shapes.

    python bench/mla16_ab.py [--rounds 3] [--no-flashinfer]

Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies rotating past the
L2), every call of a shape captured together and timed in rounds of rotating order, the median per
call; 'rel' is each pinned call's relative L2 difference from the built-in call's output.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import (L2_BYTES, Shape, ceilings, flashinfer_calls, interleaved_ms, make_inputs,  # noqa: E402
                   run_kvforge)

from kvforge.codegen.select import mla16_bulk_tilings, select_decode_config  # noqa: E402

SHAPES = [Shape("mla_decode", 128, 4096, 16), Shape("mla_decode", 64, 8192, 16), Shape("mla_decode", 2, 16384, 16)]


def candidates(page_size: int) -> dict:
    """{name: config}: the built-in choice first, then every tiling that builds (select.mla16_bulk_tilings)."""
    base = select_decode_config("mla_decode", "sm_90", "bf16", page_size, heads=16, head_dim=576, s_q=1)
    out = {f"built-in n{base.block_n} s{base.num_kv_stages} p{base.pipeline.num_producer} "
           f"c{base.pipeline.num_consumer} {base.ctas_per_sm}/SM": base}
    for (bn, st, pr, co), cfg in mla16_bulk_tilings(page_size).items():
        if cfg != base:
            out[f"n{bn} s{st} p{pr} c{co} {cfg.ctas_per_sm}/SM"] = cfg
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flashinfer", action="store_true")
    args = ap.parse_args()
    ceil = ceilings()
    print(f"Read ceiling in this run: {ceil['read']:.0f} GB/s")
    print("| shape | variant | ms | of read ceiling | built-in / variant | FlashInfer / variant | rel |")
    print("|---|---|---|---|---|---|---|")
    for sh in SHAPES:
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
        q, kv, bt, lens = make_inputs(sh, copies)
        cfgs = candidates(sh.page)
        calls = {n: [lambda i=i, c=c: run_kvforge(sh, q, *kv[i], bt, lens, c) for i in range(copies)]
                 for n, c in cfgs.items()}
        base = next(iter(cfgs))
        ref = calls[base][0]().float()
        rel = {n: float((calls[n][0]().float() - ref).norm() / ref.norm()) for n in cfgs}
        if not args.no_flashinfer:
            calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
        t = interleaved_ms(calls, 20, args.rounds)
        for n in sorted(calls, key=t.get):
            print(f"| {sh.label} | {n} | {t[n]:.4f} | {sh.bytes() / t[n] / 1e6 / ceil['read']:.0%} | "
                  f"{t[base] / t[n]:.3f} | {t.get('FlashInfer', float('nan')) / t[n]:.3f} | "
                  f"{rel.get(n, float('nan')):.1e} |", flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
