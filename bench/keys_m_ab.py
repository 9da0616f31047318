"""A/B of schedule 'keys_m' (fp8 MLA by fp8 wgmma with keys as M, codegen/sm90_keys_m.py) against the
built-in fp8 call and the built-in 16-bit call, per shape (issue 9's target: per-tensor fp8 >= 1.8x kvforge's 16-bit
at b=128 s_k=4096 h=16).

    python bench/keys_m_ab.py [--rounds 3] [--stages 4] [--qk-chains 1] [--layout per_tensor|block|fp8_ds_mla]
                              [--block 64|128] [--shapes 0,4]

Same method as bench/bench.py (graph replays, KV copies rotating past the L2, the calls of a shape captured
together and timed in rounds of rotating order, the median per call); 'rel' is keys_m's relative L2 difference
from the built-in fp8 call's output.
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import kvforge  # noqa: E402
from bench import Shape, interleaved_ms, kv_copies, make_inputs  # noqa: E402
from fp8 import kv_bytes, quantized  # noqa: E402

from kvforge.codegen.select import SM90_KEYS_M_STAGES, select_decode_config, sm90_keys_m_choice  # noqa: E402

SHAPES = [Shape("mla_decode", 128, 4096, 16), Shape("mla_decode", 64, 8192, 16), Shape("mla_decode", 32, 8192, 16),
          Shape("mla_decode", 2, 16384, 16), Shape("mla_decode", 128, 4096, 8, s_q=2),
          Shape("mla_decode", 64, 4096, 32), Shape("mla_decode", 128, 1024, 16, page=16),
          Shape("mla_decode", 128, 4096, 32), Shape("mla_decode", 128, 4096, 64)]  # past 16 rows: several head blocks


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stages", type=int, default=SM90_KEYS_M_STAGES, help="keys_m's ring depth")
    ap.add_argument("--qk-chains", type=int, default=1)
    ap.add_argument("--shapes", default="", help="indices into SHAPES (comma-separated; default all)")
    ap.add_argument("--layout", choices=("per_tensor", "block", "fp8_ds_mla"), default="per_tensor",
                    help="the fp8 cache layout; past per_tensor 'fp8 built-in' is the sm80 kernel (the built-in before "
                         "keys_m took the layout)")
    ap.add_argument("--block", type=int, choices=(64, 128), default=None, help="scale block size of --layout block")
    args = ap.parse_args()
    if (args.layout == "block") != (args.block is not None):
        ap.error("--block goes with --layout block (and it needs one)")
    picked = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    print("| shape | 16-bit built-in ms | fp8 built-in ms (x 16-bit) | keys_m ms (x 16-bit) | keys_m / fp8 built-in | rel |")
    print("|---|---|---|---|---|---|")
    for sh in picked:
        cfg = sm90_keys_m_choice("bf16", sh.page, sh.s_q, stages=args.stages, qk_chains=args.qk_chains,
                                 scale_mode=args.layout, scale_block_size=args.block)
        base = None
        if args.layout != "per_tensor":
            base = select_decode_config("mla_decode", "sm_90", "bf16", sh.page, heads=sh.hq, head_dim=576, s_q=sh.s_q,
                                        backend="sm80", scale_mode=args.layout, scale_block_size=args.block)
        copies = kv_copies(kv_bytes(sh, args.layout, args.block))
        q, kv, bt, lens = make_inputs(sh, copies)
        qkv = quantized(sh, kv, args.layout, args.block)
        causal = sh.s_q > 1

        def call(entry, config=None):
            return kvforge.mla_decode(q, entry[0], bt, lens, kv_scale=entry[2], causal=causal, config=config,
                                      max_seq_len=sh.s_k)[0]

        variants = {
            "16-bit": [lambda k=k: kvforge.mla_decode(q, k, bt, lens, causal=causal, max_seq_len=sh.s_k) for k, _ in kv],
            "fp8": [lambda e=e: call(e, base) for e in qkv],
            "keys_m": [lambda e=e: call(e, cfg) for e in qkv],
        }
        ref = call(qkv[0], base).float()
        rel = float((call(qkv[0], cfg).float() - ref).norm() / ref.norm())
        ms = interleaved_ms(variants, rounds=args.rounds)
        b16 = ms["16-bit"]
        print(f"| {sh.label} p{sh.page} | {b16:.4f} | {ms['fp8']:.4f} ({b16 / ms['fp8']:.2f}x) | {ms['keys_m']:.4f} "
              f"({b16 / ms['keys_m']:.2f}x) | {ms['fp8'] / ms['keys_m']:.3f} | {rel:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
