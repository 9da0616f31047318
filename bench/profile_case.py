"""One bench shape, a few calls, for Nsight Compute (`ncu`): kvforge's built-in call (16-bit or an fp8
layout; MLA with the max_seq_len hint, as bench.py calls it) or the peer FlashInfer on the same paged inputs.

    python bench/profile_case.py INDEX [--layout per_tensor|block|fp8_ds_mla] [--block 64]
                                       [--peer flashinfer] [--calls 3] [--set FIELD=VALUE ...]
    python bench/profile_case.py --mla B S_K H [...]

INDEX is a position in bench.SHAPES; `--mla B S_K H` profiles an MLA shape outside it (s_q 1, page 64), e.g. the
split launches of seqlen_hint_ab.py. Profile it with, e.g.,

    ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:decode \\
        --section SpeedOfLight --section WarpStateStats python bench/profile_case.py 3

The calls run eagerly (no graph), so a kernel filter and --launch-skip pick one warm launch; a first call
(compiling, planning) runs before a profiler range that holds the --calls calls, so `ncu --profile-from-start off`
sees only those (every kernel of a call: the main kernel, a combine, a peer's own kernels).
`--set kv_load=tma` (repeatable; values parsed as JSON where they parse, else taken as strings) pins
the built-in config of the shape with those fields changed, e.g. to profile another producer.
"""
import argparse
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import SHAPES, Shape, flashinfer_runner, make_inputs, run_kvforge  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("index", type=int, nargs="?", help=f"position in bench.SHAPES (0..{len(SHAPES) - 1})")
    ap.add_argument("--mla", type=int, nargs=3, metavar=("B", "S_K", "H"), help="an MLA shape instead of INDEX")
    ap.add_argument("--layout", choices=("per_tensor", "block", "fp8_ds_mla"), help="an fp8 cache layout")
    ap.add_argument("--block", type=int, default=None, help="scale block size for --layout block")
    ap.add_argument("--peer", choices=("flashinfer",), help="run the peer instead of kvforge")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="pin the built-in config with this field changed (repeatable)")
    args = ap.parse_args()
    if (args.index is None) == (args.mla is None):
        ap.error("give INDEX or --mla B S_K H (one of them)")
    sh = Shape("mla_decode", *args.mla) if args.mla else SHAPES[args.index]
    config = pinned_config(sh, args.layout, args.block, args.set) if args.set else None
    q, kv, bt, lens = make_inputs(sh, 1)
    if args.layout:
        from fp8 import flashinfer_fp8, quantized, run_fp8

        qkv = quantized(sh, kv, args.layout, args.block)
        if args.peer:
            peer = flashinfer_fp8(sh, q, qkv, bt, lens)
            call = lambda: peer(0)  # noqa: E731
        else:
            call = lambda: run_fp8(sh, q, qkv[0], bt, lens, config=config)  # noqa: E731
    elif args.peer:
        peer = flashinfer_runner(sh, q, kv, bt, lens)
        call = lambda: peer(0)  # noqa: E731
    else:
        call = lambda: run_kvforge(sh, q, *kv[0], bt, lens, config=config)  # noqa: E731
    call()  # compiles and loads (kvforge) or plans (the peer) before the profiled range
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()  # `ncu --profile-from-start off` profiles only the calls below
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled", sh.label, args.layout or "16-bit", args.peer or "kvforge", config.name if config else "")
    return 0


def parse_sets(items: list[str]) -> dict:
    """FIELD=VALUE strings as a dict, each value JSON where it parses (numbers, true, null), else a string."""
    out = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise SystemExit(f"--set {item!r}: write FIELD=VALUE, e.g. --set kv_load=tma")
        try:
            out[field] = json.loads(value)
        except json.JSONDecodeError:
            out[field] = value
    return out


def pinned_config(sh, layout, block, items):
    """The runtime's built-in config for the shape (and fp8 layout) with the --set fields changed."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.decode import select_config
    from kvforge.runtime.kv_format import KVFormat

    kv = KVFormat("fp8_e4m3", layout, block) if layout else None
    heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
    base = select_config(sh.family, "bf16", sh.page, heads, sh.d, sh.s_q, 0, kv=kv, batch=sh.b)
    return build(DecodeConfig, {**base.model_dump(mode="json"), **parse_sets(items)})


if __name__ == "__main__":
    sys.exit(main())
