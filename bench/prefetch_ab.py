"""A/B of the sm90 MLA kernel's L2 prefetch (`l2_prefetch_tiles`): the built-in choice of each shape with the
prefetch off against the same config prefetching 1 and 2 tiles ahead, FlashInfer in the same captures ('built-in'
names the built-in's own prefetch: the fp8 'slot' staging prefetches policy.SM90_FP8_SLOT_L2_PREFETCH_TILES).

    python bench/prefetch_ab.py [--rounds 3] [--ahead 1 2] [--no-flashinfer] [--layout per_tensor]

The ring holds two 72 KB tiles, so a slot's refill is issued only when the slot frees; at 128 heads the
seesaw's warpgroup 1 then waits for it (the kernel's hottest stall in the seventeenth session's profile).
With the prefetch the refill should read L2, not DRAM. --layout per_tensor: an fp8 cache (the built-in fp8
staging: the seesaw's in-slot conversion where the grid fills the GPU, prefetching its fp8 columns; split
launches stage in registers by bulk copies, which take no prefetch: those rows are skipped).

Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies rotating past the L2),
every call of a shape captured together and timed in rounds of rotating order, the median per call; 'rel'
is the largest relative L2 difference of a prefetching output from the plain one.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, SHAPES, flashinfer_calls, interleaved_ms, make_inputs, run_kvforge  # noqa: E402
from fp8 import kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.runtime.decode import select_config  # noqa: E402
from kvforge.runtime.kv_format import KVFormat  # noqa: E402

MLA_SM90 = [SHAPES[i] for i in (1, 2, 3, 4, 5, 6)]  # b=128 h=32/64/128, s_q=2 h=64, b=32 h=128, b=1 h=128


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ahead", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--layout", choices=("per_tensor",), help="an fp8 cache in this layout")
    args = ap.parse_args()
    names = ["off"] + [f"pf{n}" for n in args.ahead]
    print(f"KV: {args.layout or 'bf16'}")
    print("| shape | built-in | " + " | ".join(f"{n} ms" for n in names) + " | "
          + " | ".join(f"off / {n}" for n in names[1:]) + " | FlashInfer ms | FlashInfer / best | rel |")
    print("|---" * (2 + 2 * len(names) + 2) + "|")
    for sh in MLA_SM90:
        kv_fmt = KVFormat("fp8_e4m3", args.layout, None) if args.layout else None
        base = select_config(sh.family, "bf16", sh.page, sh.hq, sh.d, sh.s_q, 0, kv=kv_fmt, batch=sh.b)
        if base.backend != "sm90" or (base.is_fp8 and not base.converts_in_slot):
            print(f"| {sh.label} | {base.backend} {getattr(base, 'fp8_staging', '')}: no TMA producer, skipped |")
            continue
        data = base.model_dump(mode="json")
        cfgs = {("off" if n == 0 else f"pf{n}"): build(DecodeConfig, {**data, "l2_prefetch_tiles": n})
                for n in (0, *args.ahead)}
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, args.layout, None))))
        q, kv, bt, lens = make_inputs(sh, copies)
        if args.layout is None:
            call = lambda i, c: run_kvforge(sh, q, *kv[i], bt, lens, c)  # noqa: E731
        else:
            qkv = quantized(sh, kv, args.layout, None)
            call = lambda i, c: run_fp8(sh, q, qkv[i], bt, lens, c)  # noqa: E731
        calls = {n: [lambda i=i, c=c: call(i, c) for i in range(copies)] for n, c in cfgs.items()}
        ref = calls["off"][0]().float()
        rel = max(float((calls[n][0]().float() - ref).norm() / ref.norm()) for n in names[1:])
        if not args.no_flashinfer and args.layout is None:
            calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
        t = interleaved_ms(calls, 20, args.rounds)
        best = min(t[n] for n in names)
        fi = t.get("FlashInfer", float("nan"))
        label = f"{base.schedule}" + (f" {base.fp8_staging}" if base.is_fp8 else "") + \
            (f" pf{base.l2_prefetch_tiles}" if base.l2_prefetch_tiles else "")
        print(f"| {sh.label} | {label} | " + " | ".join(f"{t[n]:.4f}" for n in names) + " | "
              + " | ".join(f"{t['off'] / t[n]:.3f}" for n in names[1:]) + f" | {fi:.4f} | {fi / best:.3f} | {rel:.1e} |",
              flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
