"""A/B of two kvforge source trees on the same shapes: this checkout against another (a `git worktree` of
the base commit, its codegen/runtime/templates reachable as the package `kvforge`), each in its own process
(bench/child_ab.py: the runtime caches plans per config, and both trees share config names), rounds alternating
which goes first. Times the built-in call (as bench.py makes it: with the max_seq_len hint) by CUDA-graph replays.

    python bench/tree_ab.py --base /path/to/base/checkout [--rounds 3] [--shapes quick|short|all|fp8|fp8_16|fp8_ds_mla_16|fp8_block_16|fp8_block64_16|gqa|gqa_rows|mla_few_heads]

quick: bench.py's MLA shapes; short: bench.SHORT_SHAPES, launches of few tiles per CTA (where a launch's fixed cost
weighs: bench/overhead_fit.py, bench/phase_trace.py); all: both; fp8: three MLA shapes on per-tensor e4m3 caches; fp8_16: five
MLA shapes of 16 query rows on per-tensor e4m3 caches (schedule 'keys_m' on sm_90); fp8_ds_mla_16: four of them
on DeepSeek's packed 656-byte token (schedule 'keys_m'); fp8_block_16 / fp8_block64_16: three on 128- / 64-column block scales;
gqa: bench.py's GQA shapes; mla_few_heads: 16-bit MLA of 16 query rows or fewer at s_q 1-8 (the sm80
kernel's CTA size); gqa_rows: GQA with 32-128 query rows per KV head (causal s_q up to 8: the sm90 GQA kernel).
Prints the median per tree and base / this (> 1: this tree is faster), and with two rounds or more the range of
the rounds' own base / this: `--base` this very checkout (an A/A) shows how far the machine alone moves it (the
thirty-eighth session saw an unchanged kernel's 2-round ratio at 0.956).
"""
import argparse
import sys
from pathlib import Path

from child_ab import BENCH_DIR, alternate_rounds, child_times, medians_of, print_ratio_table

SHAPES = {
    "quick": "[sh for sh in SHAPES if sh.family == 'mla_decode']",
    "short": "SHORT_SHAPES",
    "all": "[sh for sh in SHAPES if sh.family == 'mla_decode'] + SHORT_SHAPES",
    "fp8": "[Shape('mla_decode', b, s_k, h) for b, s_k, h in ((128, 4096, 128), (128, 4096, 64), (32, 8192, 128))]",
    "gqa": "[sh for sh in SHAPES if sh.family == 'gqa_decode']",
    "fp8_16": "[Shape('mla_decode', b, s_k, h, s_q=s_q) for b, s_k, h, s_q in ((128, 4096, 16, 1), (64, 8192, 16, 1), "
              "(32, 8192, 16, 1), (2, 16384, 16, 1), (128, 4096, 8, 2))]",
    "fp8_ds_mla_16": "[Shape('mla_decode', b, s_k, h, s_q=s_q) for b, s_k, h, s_q in ((128, 4096, 16, 1), (64, 8192, 16, 1), "
                     "(2, 16384, 16, 1), (128, 4096, 8, 2))]",
    "fp8_block_16": "[Shape('mla_decode', b, s_k, h, s_q=s_q) for b, s_k, h, s_q in ((128, 4096, 16, 1), (64, 8192, 16, 1), "
                    "(128, 4096, 8, 2))]",
    "fp8_block64_16": "[Shape('mla_decode', b, s_k, h, s_q=s_q) for b, s_k, h, s_q in ((128, 4096, 16, 1), (64, 8192, 16, 1), "
                      "(128, 4096, 8, 2))]",
    "mla_few_heads": "[Shape('mla_decode', b, s_k, h, s_q=s_q) for b, s_k, h, s_q in ((128, 4096, 16, 1), (128, 4096, 8, 2), "
                     "(128, 4096, 4, 4), (128, 4096, 2, 8), (32, 8192, 4, 4))]",
    "gqa_rows": "[Shape('gqa_decode', b, s_k, hq, hkv, d, s_q=s_q, page=p) for b, s_k, hq, hkv, d, s_q, p in "
                "((64, 8192, 32, 8, 128, 8, 16), (64, 4096, 64, 4, 128, 4, 64), (64, 4096, 64, 4, 128, 8, 64), "
                "(32, 8192, 64, 8, 64, 8, 16))]",
}

FP8_LAYOUT = {"fp8": "per_tensor", "fp8_16": "per_tensor", "fp8_ds_mla_16": "fp8_ds_mla",  # the sets timed on e4m3
              "fp8_block_16": "block:128", "fp8_block64_16": "block:64"}                                                 # caches (layout[:block])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (its root holds kvforge/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", choices=tuple(SHAPES), default="all")
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "this": BENCH_DIR.parent}

    def arm(root: Path):
        check = f"import kvforge; assert kvforge.__file__.startswith({str(root)!r}), kvforge.__file__"
        return lambda: child_times(SHAPES[args.shapes], prelude=check, fp8=FP8_LAYOUT.get(args.shapes, ""), pythonpath=root,
                                   cwd=root)

    times = alternate_rounds({name: arm(root) for name, root in trees.items()}, args.rounds)
    print_ratio_table(medians_of(times), "base", "this", f"base ({trees['base']})", "this", per_round=times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
