"""A/B of where split sequences are merged on the sm90 MLA kernel: the combine kernel (a second launch)
against `merge_in_kernel` (the last CTA of each (sequence, head block) merges up to
policy.MERGE_MAX_SPLITS chunks, counted by an atomic), under both schedules, on launches that split
sequences (2, 3, 4, 8 and 64 chunks on 132 SMs), with FlashInfer in the same captures.

    python bench/merge_ab.py [--rounds 3] [--no-flashinfer] [--quick] [--layout per_tensor|block|fp8_ds_mla]
                             [--max-splits N]

--quick: the lockstep only, with and without the merge, on the two-chunk shapes. --layout: an fp8 cache in that
layout (the built-in fp8 staging of split launches, 'registers' under the lockstep; block scales of 64), with and
without the merge (no FlashInfer column). --max-splits N: policy.MERGE_MAX_SPLITS set to N for this process (the
kernels render and cache by source, so nothing collides), the lockstep with and without the merge on launches
cutting sequences into 3, 4 and 8 chunks: whether the merge (every partial read back from L2, the chunks' loads in
flight together) now beats the combine there too.

Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies rotating past the
L2), every call of a shape captured together and timed in rounds of rotating order, the median per
call; 'rel' is the merged output's relative L2 difference from the combine's (same schedule).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, SHAPES, Shape, flashinfer_calls, interleaved_ms, make_inputs, run_kvforge  # noqa: E402
from fp8 import kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.codegen.select import sm90_choice  # noqa: E402

SPLIT_SHAPES = [SHAPES[5], SHAPES[6]] + [Shape("mla_decode", b, s_k, h) for b, s_k, h in (
    (24, 4096, 128), (32, 2048, 128), (16, 8192, 128), (20, 8192, 128), (8, 4096, 128), (32, 4096, 64),
    (48, 4096, 64), (40, 8192, 64))]
NAMES = ("lockstep", "lockstep+merge", "seesaw", "seesaw+merge")


TWO_CHUNKS = [SHAPES[5]] + [Shape("mla_decode", b, s_k, h) for b, s_k, h in ((24, 4096, 128), (32, 2048, 128),
                                                                               (48, 4096, 64))]
BLOCK = 64  # --layout block: the scale block size
THREE_FOUR = [Shape("mla_decode", b, s_k, h) for b, s_k, h in ((16, 8192, 128), (20, 8192, 128), (32, 4096, 64),
                                                               (40, 8192, 64), (16, 4096, 128), (8, 4096, 128),
                                                               (16, 4096, 64))]  # 4, 3, 4, 3, 4, 8, 8 chunks


def configs(sh, names, layout=None) -> dict:
    kv = None if layout is None else {"kv_dtype": "fp8_e4m3", "scale_mode": layout,
                                      "scale_block_size": BLOCK if layout == "block" else None}
    data = sm90_choice(sh.family, "bf16", sh.page, sh.s_q, kv, splits=2).model_dump(mode="json")
    return {name: build(DecodeConfig, {**data, "schedule": name.split("+")[0], "merge_in_kernel": "+" in name})
            for name in names}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the lockstep only, two-chunk shapes")
    ap.add_argument("--layout", choices=("per_tensor", "block", "fp8_ds_mla"), help="an fp8 cache in this layout")
    ap.add_argument("--max-splits", type=int, help="policy.MERGE_MAX_SPLITS for this process; 3-4 chunk launches")
    args = ap.parse_args()
    if args.max_splits:
        from kvforge.codegen import policy

        policy.MERGE_MAX_SPLITS = args.max_splits
    names = NAMES[:2] if args.quick or args.layout or args.max_splits else NAMES
    shapes = THREE_FOUR if args.max_splits else TWO_CHUNKS if args.quick or args.layout else SPLIT_SHAPES
    print(f"KV: {args.layout or 'bf16'}")
    print("| shape | " + " | ".join(f"{n} ms" for n in names) + " | lockstep / lockstep+merge | "
          + ("lockstep / seesaw+merge | " if len(names) > 2 else "") + "FlashInfer ms | FlashInfer / best | rel |")
    print("|---" * (len(names) + 5 + (len(names) > 2)) + "|")
    for sh in shapes:
        cfgs = configs(sh, names, args.layout)
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, args.layout, BLOCK))))
        q, kv, bt, lens = make_inputs(sh, copies)
        if args.layout is None:
            call = lambda i, c: run_kvforge(sh, q, *kv[i], bt, lens, c)  # noqa: E731
        else:
            qkv = quantized(sh, kv, args.layout, BLOCK if args.layout == "block" else None)
            call = lambda i, c: run_fp8(sh, q, qkv[i], bt, lens, c)  # noqa: E731
        calls = {n: [lambda i=i, c=c: call(i, c) for i in range(copies)] for n, c in cfgs.items()}
        rel = 0.0
        for sched in {n.split("+")[0] for n in names}:
            ref = calls[sched][0]().float()
            rel = max(rel, float((calls[sched + "+merge"][0]().float() - ref).norm() / ref.norm()))
        if not args.no_flashinfer and args.layout is None:
            calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
        t = interleaved_ms(calls, 20, args.rounds)
        best = min(t[n] for n in names)
        fi = t.get("FlashInfer", float("nan"))
        print(f"| {sh.label} | " + " | ".join(f"{t[n]:.4f}" for n in names) +
              f" | {t['lockstep'] / t['lockstep+merge']:.3f} | " +
              (f"{t['lockstep'] / t['seesaw+merge']:.3f} | " if len(names) > 2 else "") +
              f"{fi:.4f} | {fi / best:.3f} | {rel:.1e} |", flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
