"""A/B of block-scaled and packed fp8 MLA at 16 heads (sm80 kernel): the load-and-convert ring (convert
warps writing 16-bit tiles) against the register path (fragments read straight from the fp8 tile,
each scale block's partial S times its keys' scales, P x V scale per V block) with rows by bulk copy
or 16-byte cp.async, over a few ring tilings; per-tensor fp8 and the 16-bit call as references.

    python bench/mla_fp8_blocks_ab.py [--rounds 2] [--quick] [--built-in-tiling]

All variants of a shape are captured first (CUDA graphs, KV copies rotating past the L2), then
timed in rounds whose order rotates (bench.interleaved_ms). Prints ms, fp8 GB/s (scales included),
the speed-up over kvforge's 16-bit call with issue 9's target (0.9 x 16-bit bytes / fp8 bytes),
and each variant's output against the ring's (relative L2).
"""
import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, Shape, ceilings, interleaved_ms, make_inputs, run_kvforge  # noqa: E402
from fp8 import convert_path_config, kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import ConfigError, build  # noqa: E402

SHAPES = [Shape("mla_decode", 128, 4096, 16), Shape("mla_decode", 64, 8192, 16), Shape("mla_decode", 2, 16384, 16)]
LAYOUTS = (("block", 64), ("block", 128), ("fp8_ds_mla", None))
# register-path tilings: (kv_load, block_n, num_kv_stages)
TILINGS = (("bulk", 64, 3), ("bulk", 64, 2), ("bulk", 64, 4), ("bulk", 32, 6), ("cp_async", 64, 3))


def variants(sh: Shape, layout: str, block, tilings=TILINGS) -> dict:
    out = {"ring": convert_path_config(sh, layout, block, "ring")}
    reg = convert_path_config(sh, layout, block, "registers").model_dump(mode="json")
    for load, bn, stages in tilings:
        try:
            out[f"registers {load} n{bn} s{stages}"] = build(DecodeConfig, {
                **reg, "kv_load": load, "block_n": bn, "pipeline": {**reg["pipeline"], "num_kv_stages": stages}})
        except ConfigError as err:
            print(f"(skipped {layout} {block} {load} n{bn} s{stages}: {str(err)[:120]})", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    ap.add_argument("--built-in-tiling", action="store_true", help="the register path's built-in tiling only")
    args = ap.parse_args()
    ceil = ceilings()
    print(f"Read ceiling in this run: {ceil['read']:.0f} GB/s")
    print("| shape | KV | variant | ms | fp8 GB/s | of read ceiling | over 16-bit | target | rel. L2 vs ring |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sh in SHAPES[:1] if args.quick else SHAPES:
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, "block", 64))))
        q, kv, bt, lens = make_inputs(sh, copies)
        calls = {("bf16", "built-in"): [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]}
        nbytes, errs = {("bf16", "built-in"): sh.bytes()}, {}
        pt = quantized(sh, kv, "per_tensor", None)
        calls[("per_tensor", "built-in")] = [lambda i=i: run_fp8(sh, q, pt[i], bt, lens) for i in range(copies)]
        nbytes[("per_tensor", "built-in")] = kv_bytes(sh, "per_tensor", None)
        for layout, block in LAYOUTS:
            kv_name = f"block {block}" if layout == "block" else layout
            qkv = quantized(sh, kv, layout, block)
            cfgs = variants(sh, layout, block, TILINGS[:1] if args.built_in_tiling else TILINGS)
            ref = run_fp8(sh, q, qkv[0], bt, lens, cfgs["ring"]).float()
            for name, c in cfgs.items():
                key = (kv_name, name)
                calls[key] = [lambda i=i, c=c, qkv=qkv: run_fp8(sh, q, qkv[i], bt, lens, c) for i in range(copies)]
                errs[key] = float((run_fp8(sh, q, qkv[0], bt, lens, c).float() - ref).norm() / ref.norm())
                nbytes[key] = kv_bytes(sh, layout, block)
        t = interleaved_ms(calls, 20, args.rounds)
        base = t[("bf16", "built-in")]
        for key in calls:
            gbs = nbytes[key] / t[key] / 1e6
            target = 0.9 * sh.bytes() / nbytes[key]
            print(f"| {sh.label} | {key[0]} | {key[1]} | {t[key]:.4f} | {gbs:.0f} | {gbs / ceil['read']:.0%} | "
                  f"{base / t[key]:.2f}x | {target:.2f}x | {errs.get(key, float('nan')):.1e} |", flush=True)
        del q, kv, calls, pt
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
