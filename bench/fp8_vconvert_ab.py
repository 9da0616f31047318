"""A/B of V's conversion for block-scaled fp8 GQA on the register path: bit moves into bf16 x 2^-120
with P carrying each key's V scale (fp8_v_convert='bits', the built-in choice until measured) against
the conversion unit into fp16 with P carrying V scale / C, C the running maximum of the V scales per
scale block (fp8_v_convert='cvt'), next to kvforge's 16-bit call on the same shapes.

    python bench/fp8_vconvert_ab.py [--rounds 3]

All variants of a shape are captured first (CUDA graphs, KV copies rotating past the L2), then
timed in rounds whose order rotates (bench.interleaved_ms); prints medians and ratios, and each
variant's output against the 'bits' one (relative L2).
"""
import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, Shape, ceilings, interleaved_ms, make_inputs, run_kvforge  # noqa: E402
from fp8 import kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402

SHAPES = [Shape("gqa_decode", 64, 8192, 32, 8, 128, page=16), Shape("gqa_decode", 1, 65536, 32, 8, 128, page=16),
          Shape("gqa_decode", 64, 4096, 32, 8, 256, page=16)]
BLOCKS = (64, 128)


def variants(sh: Shape, block: int) -> dict:
    cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", sh.page, heads=sh.hq // sh.hkv, head_dim=sh.d,
                               s_q=sh.s_q, backend="sm80", scale_mode="block", scale_block_size=block,
                               fp8_convert="registers")
    data = cfg.model_dump(mode="json")
    return {f"block {block} {vc}": build(DecodeConfig, {**data, "fp8_v_convert": vc}) for vc in ("bits", "cvt")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ceil = ceilings()
    print(f"Read ceiling in this run: {ceil['read']:.0f} GB/s")
    print("| shape | variant | ms | fp8 GB/s | of read ceiling | 16-bit / variant | bits / variant | rel. L2 vs bits |")
    print("|---|---|---|---|---|---|---|---|")
    for sh in SHAPES:
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, "block", 64))))
        q, kv, bt, lens = make_inputs(sh, copies)
        calls = {"16-bit (built-in)": [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]}
        errs, nbytes = {}, {}
        for block in BLOCKS:
            qkv = quantized(sh, kv, "block", block)
            cfgs = variants(sh, block)
            ref = run_fp8(sh, q, qkv[0], bt, lens, cfgs[f"block {block} bits"]).float()
            for name, c in cfgs.items():
                calls[name] = [lambda i=i, c=c, qkv=qkv: run_fp8(sh, q, qkv[i], bt, lens, c) for i in range(copies)]
                errs[name] = float((run_fp8(sh, q, qkv[0], bt, lens, c).float() - ref).norm() / ref.norm())
                nbytes[name] = kv_bytes(sh, "block", block)
        t = interleaved_ms(calls, 20, args.rounds)
        for name in calls:
            gbs = nbytes.get(name, sh.bytes()) / t[name] / 1e6
            bits = t.get(name.replace("cvt", "bits"), float("nan"))
            print(f"| {sh.label} | {name} | {t[name]:.4f} | {gbs:.0f} | {gbs / ceil['read']:.0%} | "
                  f"{t['16-bit (built-in)'] / t[name]:.3f} | {bits / t[name]:.3f} | {errs.get(name, float('nan')):.1e} |",
                  flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
