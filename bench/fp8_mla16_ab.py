"""A/B of the 16-row fp8 MLA kernel's tiling (sm80 kernel, per-tensor fp8 dequantized in the consumers'
registers, bulk-copied tokens, on sm_90): the built-in (64-key tiles, 3 stages, 4 producer and 4 consumer warps,
one CTA per SM: one math warp per SM sub-partition, which Nsight Compute found issue/latency-bound) against eight
consumer warps and two CTAs per SM (two stages; the split plan then cuts b=128 into two chunks), next to the
built-in 16-bit call (issue 9's target: per-tensor fp8 >= 1.8x kvforge's 16-bit at b=128 s_k=4096 h=16).

    python bench/fp8_mla16_ab.py [--rounds 3] [--batches 128,64,32]

Same method as bench/bench.py (graph replays, KV copies rotating past the L2, every call of a shape captured
together and timed in rounds of rotating order, the median per call); 'rel' is each tiling's relative L2
difference from the built-in fp8 call's output.
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import Shape, interleaved_ms, kv_copies, make_inputs, run_kvforge  # noqa: E402
from fp8 import kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402

# (block_n, stages, producer warps, consumer warps); registers per thread (ptxas, H200 build) in the comment
TILINGS = [(64, 3, 4, 8),   # 1 CTA/SM, 102 registers
           (64, 2, 2, 8),   # 2 CTAs/SM, 93
           (64, 2, 4, 8),   # 2 CTAs/SM, 80
           (64, 2, 2, 4),   # 2 CTAs/SM, 168
           (32, 3, 2, 4)]   # 2 CTAs/SM, 168


def tilings(sh) -> dict:
    from kvforge.codegen.select import select_for_launch
    from kvforge.runtime.device import device_arch, sm_count

    base = select_for_launch("mla_decode", device_arch(0), sm_count(0), "bf16", sh.page, heads=sh.hq,
                             head_dim=576, s_q=sh.s_q, batch=sh.b, scale_mode="per_tensor")
    data = base.model_dump(mode="json")
    p = base.pipeline
    out = {f"built-in {base.block_n}x{p.num_kv_stages} pr{p.num_producer} co{p.num_consumer}": base}
    for bn, st, pr, co in TILINGS:
        pipe = {**data["pipeline"], "num_kv_stages": st, "num_producer": pr, "num_consumer": co}
        out[f"{bn}x{st} pr{pr} co{co}"] = build(DecodeConfig, {**data, "block_n": bn, "pipeline": pipe})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="128,64")
    args = ap.parse_args()
    for b in (int(x) for x in args.batches.split(",")):
        sh = Shape("mla_decode", b, 4096 * 128 // b, 16)
        cfgs = tilings(sh)
        copies = kv_copies(kv_bytes(sh, "per_tensor", None))
        q, kv, bt, lens = make_inputs(sh, copies)
        qkv = quantized(sh, kv, "per_tensor", None)
        calls = {n: [lambda i=i, c=c: run_fp8(sh, q, qkv[i], bt, lens, c) for i in range(copies)]
                 for n, c in cfgs.items()}
        names = list(cfgs)
        ref = calls[names[0]][0]().float()
        rel = max(float((calls[n][0]().float() - ref).norm() / ref.norm()) for n in names[1:])
        calls["16-bit"] = [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]
        t = interleaved_ms(calls, 20, args.rounds)
        print(f"{sh.label}: 16-bit {t['16-bit']:.4f} ms; rel {rel:.1e}")
        for n in names:
            print(f"  {n}: {t[n]:.4f} ms, {t[names[0]] / t[n]:.3f}x the built-in, {t['16-bit'] / t[n]:.2f}x 16-bit",
                  flush=True)
        del q, kv, qkv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
