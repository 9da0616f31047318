"""FP8 ring and role sweep: the built-in per-tensor FP8 choice against pinned alternatives (tile
size, MMA-ring and fp8-ring depths, producer and convert warps) on the FP8 benchmark shapes.

    python bench/fp8_tune.py [--rounds 2]

Same method as bench/bench.py (graph replays, KV copies rotating past the L2); each round times
every candidate, in rotating order; prints the median per candidate, its registers per thread
and spill bytes (ptxas), and its speed relative to the built-in choice.
"""
import argparse
import math
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import kvforge  # noqa: E402
from bench import L2_BYTES, Shape, graph_ms, make_inputs  # noqa: E402
from fp8 import kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import ConfigError, build  # noqa: E402
from kvforge.runtime.decode import select_config  # noqa: E402
from kvforge.runtime.kv_format import KVFormat  # noqa: E402

# (block_n, MMA-ring stages, fp8-ring stages, producer warps, convert warps)
CANDIDATES = {
    "mla_decode": [(32, 3, 4, 4, 4), (32, 2, 6, 2, 6), (32, 2, 5, 4, 4), (32, 2, 6, 4, 2)],
    "gqa_decode": [(32, 3, 4, 2, 4), (32, 2, 6, 2, 4), (64, 2, 2, 1, 4), (64, 2, 2, 2, 6), (32, 3, 6, 2, 4)],
}
SHAPES = [Shape("mla_decode", 128, 4096, 16), Shape("gqa_decode", 64, 8192, 32, 8, 128, page=16)]


def pinned(base: DecodeConfig, bn, mma, ld, pr, cv):
    data = base.model_dump(mode="json")
    data["block_n"] = bn
    data["pipeline"].update(num_kv_stages=mma, num_producer=pr)
    data["convert"] = {"num_load_stages": ld, "num_convert": cv}
    return build(DecodeConfig, data)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    print("| shape | candidate (bn, mma, ld, pr, cv) | CTAs/SM | regs | spill B | rel. L2 vs built-in | ms | built-in / candidate |")
    print("|---|---|---|---|---|---|---|---|")
    for sh in SHAPES:
        base = select_config(sh.family, "bf16", sh.page, sh.hq // sh.hkv, sh.d, 1, 0, KVFormat("fp8_e4m3", "per_tensor"))
        cands = {"built-in": base}
        for c in CANDIDATES[sh.family]:
            try:
                cands[str(c)] = pinned(base, *c)
            except ConfigError as err:
                print(f"| {sh.label} | {c} | - | - | - | - | rejected: {str(err)[:80]} | |")
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, "per_tensor", None))))
        q, kv, bt, lens = make_inputs(sh, copies)
        qkv = quantized(sh, kv, "per_tensor", None)
        want = run_fp8(sh, q, qkv[0], bt, lens, base).float()
        agree = {}
        for name, cfg in cands.items():  # every candidate must give the built-in's answer (verified by the GPU suite)
            got = run_fp8(sh, q, qkv[0], bt, lens, cfg).float()
            agree[name] = float((got - want).norm() / want.norm())
        times = {name: [] for name in cands}
        names = list(cands)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                cfg = cands[name]
                times[name].append(graph_ms([lambda i=i, c=cfg: run_fp8(sh, q, qkv[i], bt, lens, c)
                                             for i in range(copies)], 20))
        ref = statistics.median(times["built-in"])
        for name in names:
            cfg = cands[name]
            res = compile(Variant(cfg)).resources
            t = statistics.median(times[name])
            print(f"| {sh.label} | {name} | {cfg.ctas_per_sm} | {res.registers} | {res.spill_store_bytes} | "
                  f"{agree[name]:.1e} | {t:.4f} | "
                  f"{ref / t:.3f} |", flush=True)
        del q, kv, qkv
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
