"""One bench shape, a few calls, for Nsight Compute (`ncu`): kvforge's built-in call (16-bit or an fp8
layout) or the peer FlashInfer on the same paged inputs.

    python bench/profile_case.py INDEX [--layout per_tensor|block|fp8_ds_mla] [--block 64]
                                       [--peer flashinfer] [--calls 3]

INDEX is a position in bench.SHAPES. Profile it with, e.g.,

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:decode \\
        --section SpeedOfLight --section WarpStateStats python bench/profile_case.py 3

The calls run eagerly (no graph), so a kernel filter and --launch-skip pick one warm launch.
"""
import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import SHAPES, flashinfer_runner, make_inputs, run_kvforge  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("index", type=int, help=f"position in bench.SHAPES (0..{len(SHAPES) - 1})")
    ap.add_argument("--layout", choices=("per_tensor", "block", "fp8_ds_mla"), help="an fp8 cache layout")
    ap.add_argument("--block", type=int, default=None, help="scale block size for --layout block")
    ap.add_argument("--peer", choices=("flashinfer",), help="run the peer instead of kvforge")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    sh = SHAPES[args.index]
    q, kv, bt, lens = make_inputs(sh, 1)
    if args.layout:
        from fp8 import flashinfer_fp8, quantized, run_fp8

        qkv = quantized(sh, kv, args.layout, args.block)
        if args.peer:
            peer = flashinfer_fp8(sh, q, qkv, bt, lens)
            call = lambda: peer(0)  # noqa: E731
        else:
            call = lambda: run_fp8(sh, q, qkv[0], bt, lens)  # noqa: E731
    elif args.peer:
        peer = flashinfer_runner(sh, q, kv, bt, lens)
        call = lambda: peer(0)  # noqa: E731
    else:
        call = lambda: run_kvforge(sh, q, *kv[0], bt, lens)  # noqa: E731
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print("profiled", sh.label, args.layout or "16-bit", args.peer or "kvforge")
    return 0


if __name__ == "__main__":
    sys.exit(main())
