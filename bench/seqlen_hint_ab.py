"""A/B of mla_decode's `max_seq_len` hint on split launches: the same built-in call with and without it
(with it, long split chunks at 128 heads take the seesaw schedule instead of the lockstep), FlashInfer in the
same captures.

    python bench/seqlen_hint_ab.py [--rounds 3] [--no-flashinfer]

Shapes: two-chunk launches (merged in the kernel) and more-chunk ones (combined), chunks of 16 to 64 tiles, 128
and 64 heads (at 64 heads and at 16-tile chunks the hint changes nothing: those rows check that the hint costs
nothing where it does not apply). Same method as bench/bench.py: CUDA-graph replays of one call per KV copy
(copies rotating past the L2), all calls of a shape captured together and timed in rounds of rotating order, the
median per call; 'rel' is the hinted output's relative L2 difference from the plain one; 'schedule' the hinted
call's.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, SHAPES, Shape, flashinfer_calls, interleaved_ms, make_inputs  # noqa: E402

import kvforge  # noqa: E402
from kvforge.runtime import decode  # noqa: E402

HINT_SHAPES = [SHAPES[5]] + [Shape("mla_decode", b, s_k, h) for b, s_k, h in (
    (24, 4096, 128), (16, 8192, 128), (4, 32768, 128), (32, 2048, 128), (32, 8192, 64))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flashinfer", action="store_true")
    args = ap.parse_args()
    print("| shape | hint applies | schedule | plain ms | hinted ms | plain / hinted | FlashInfer ms | "
          "FlashInfer / hinted | rel |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sh in HINT_SHAPES:
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
        q, kv, bt, lens = make_inputs(sh, copies)

        def call(i, hint):
            return kvforge.mla_decode(q, kv[i][0], bt, lens, max_seq_len=hint)[0]

        calls = {"plain": [lambda i=i: call(i, None) for i in range(copies)],
                 "hinted": [lambda i=i: call(i, sh.s_k) for i in range(copies)]}
        plain, hinted = calls["plain"][0]().float(), calls["hinted"][0]().float()
        rel = float((hinted - plain).norm() / plain.norm())
        applies = decode._long_chunks(q, sh.s_k)
        schedule = decode.select_config(sh.family, "bf16", sh.page, sh.hq, sh.d, sh.s_q, 0, None, sh.b,
                                        applies).schedule
        if not args.no_flashinfer:
            calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
        t = interleaved_ms(calls, 20, args.rounds)
        fi = t.get("FlashInfer", float("nan"))
        print(f"| {sh.label} | {'yes' if applies else 'no'} | {schedule} | {t['plain']:.4f} | {t['hinted']:.4f} | "
              f"{t['plain'] / t['hinted']:.3f} | {fi:.4f} | {fi / t['hinted']:.3f} | {rel:.1e} |", flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
