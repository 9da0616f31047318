"""A/B of how block-scaled fp8 GQA's P meets the V scales on the register path: P stored in fp32 and
multiplied by each key's V scale per V block inside PV, every k16 step (fp8_block_p='fp32', the built-in
choice until measured), against one 16-bit P tile per V scale block written by the softmax with each key's
V scale (over C) already applied, read by PV as the per-tensor path reads its P (fp8_block_p='scaled'),
for V converted by cvt (fp16 PV, the default) and (GQA) by bit moves; MLA at 16 heads (the sm80 register
path) for block scales and DeepSeek's packed token; next to kvforge's 16-bit call.

    python bench/fp8_block_p_ab.py [--rounds 3] [--shapes 0 1 2 3]

All variants of a shape are captured first (CUDA graphs, KV copies rotating past the L2), then timed in
rounds whose order rotates (bench.interleaved_ms); prints medians, ratios, and each variant's output
against the built-in one (relative L2).
"""
import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, Shape, ceilings, interleaved_ms, make_inputs, run_kvforge  # noqa: E402
from fp8 import kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import ConfigError, build  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402

SHAPES = [Shape("gqa_decode", 64, 8192, 32, 8, 128, page=16), Shape("gqa_decode", 1, 65536, 32, 8, 128, page=16),
          Shape("gqa_decode", 64, 4096, 32, 8, 256, page=16), Shape("mla_decode", 128, 4096, 16),
          Shape("gqa_decode", 64, 8192, 32, 8, 64, page=16)]
ARMS = {"gqa_decode": (("cvt", "fp32"), ("cvt", "scaled"), ("bits", "scaled")),
        "mla_decode": (("cvt", "fp32"), ("cvt", "scaled"))}
LAYOUTS = {"gqa_decode": (("block", 64), ("block", 128)),
           "mla_decode": (("block", 64), ("block", 128), ("fp8_ds_mla", None))}


def variants(sh: Shape, layout: str, block: int | None, tiles=()) -> dict:
    """The built-in register-path config of the shape (block scales) with fp8_v_convert / fp8_block_p set."""
    heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
    cfg = select_decode_config(sh.family, device_arch(0), "bf16", sh.page, heads=heads, head_dim=sh.d,
                               s_q=sh.s_q, backend="sm80", scale_mode=layout, scale_block_size=block,
                               fp8_convert="registers")
    data = cfg.model_dump(mode="json")
    tag = f"{layout} {block}" if block else layout
    out = {f"{tag} {vc} P {p}": build(DecodeConfig, {**data, "fp8_v_convert": vc, "fp8_block_p": p})
           for vc, p in ARMS[sh.family]}
    for bn, stages, producers in tiles:  # prescaled P (cvt V) on other tilings, where they fit
        pipe = {**data["pipeline"], "num_kv_stages": stages, "num_producer": producers}
        try:
            out[f"{tag} cvt P scaled n{bn} s{stages} p{producers}"] = build(
                DecodeConfig, {**data, "fp8_block_p": "scaled", "block_n": bn, "pipeline": pipe})
        except ConfigError as err:
            print(f"{tag} n{bn} s{stages} p{producers}: does not fit: {str(err)[:160]}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", type=int, nargs="+", default=list(range(len(SHAPES))), help="indices into SHAPES")
    ap.add_argument("--tile", action="append", default=[], metavar="BN:STAGES:PRODUCERS",
                    help="also time prescaled P on this tiling (repeatable)")
    ap.add_argument("--layouts", nargs="+", help="only these layout tags, e.g. 'block 128'")
    args = ap.parse_args()
    tiles = [tuple(int(x) for x in t.split(":")) for t in args.tile]
    ceil = ceilings()
    print(f"Read ceiling in this run: {ceil['read']:.0f} GB/s")
    print("| shape | variant | ms | fp8 GB/s | of read ceiling | 16-bit / variant | P fp32 / variant | rel. L2 vs P fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for sh in (SHAPES[i] for i in args.shapes):
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, "block", 64))))
        q, kv, bt, lens = make_inputs(sh, copies)
        calls = {"16-bit (built-in)": [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]}
        errs, nbytes, base_of = {}, {}, {}
        for layout, block in LAYOUTS[sh.family]:
            if args.layouts and (f"{layout} {block}" if block else layout) not in args.layouts:
                continue
            qkv = quantized(sh, kv, layout, block)
            cfgs = variants(sh, layout, block, tiles)
            base = next(iter(cfgs))
            ref = run_fp8(sh, q, qkv[0], bt, lens, cfgs[base]).float()
            for name, c in cfgs.items():
                calls[name] = [lambda i=i, c=c, qkv=qkv: run_fp8(sh, q, qkv[i], bt, lens, c) for i in range(copies)]
                errs[name] = float((run_fp8(sh, q, qkv[0], bt, lens, c).float() - ref).norm() / ref.norm())
                nbytes[name], base_of[name] = kv_bytes(sh, layout, block), base
        t = interleaved_ms(calls, 20, args.rounds)
        for name in calls:
            gbs = nbytes.get(name, sh.bytes()) / t[name] / 1e6
            base = t.get(base_of.get(name, ""), float("nan"))
            print(f"| {sh.label} | {name} | {t[name]:.4f} | {gbs:.0f} | {gbs / ceil['read']:.0%} | "
                  f"{t['16-bit (built-in)'] / t[name]:.3f} | {base / t[name]:.3f} | {errs.get(name, float('nan')):.1e} |",
                  flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
