"""A/B of the consumer release on the sm80 kernels: per-thread arrivals (the default, clean under
racecheck) against one elected lane per warp after __syncwarp, on the benchmark's shapes.

    python bench/release_ab.py [--rounds 3]

Each round times both variants (CUDA-graph replays, KV copies rotating past the L2), alternating
which goes first; prints the median per variant and the ratio.
"""
import argparse
import math
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, SHAPES, graph_ms, make_inputs  # noqa: E402

import kvforge  # noqa: E402
from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402


def variants(sh):
    heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
    cfg = select_decode_config(sh.family, device_arch(0), "bf16", sh.page, heads=heads, head_dim=sh.d, s_q=sh.s_q)
    data = cfg.model_dump(mode="json")
    data["pipeline"]["consumer_arrive"] = "warp"
    return {"thread": cfg, "warp": build(DecodeConfig, data)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print("| shape | per-thread release ms | per-warp release ms | thread / warp |")
    print("|---|---|---|---|")
    for sh in SHAPES:
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
        q, kv, bt, lens = make_inputs(sh, copies)
        cfgs = variants(sh)

        def calls(cfg):
            if sh.family == "mla_decode":
                return [lambda i=i: kvforge.mla_decode(q, kv[i][0], bt, lens, causal=sh.s_q > 1, config=cfg)
                        for i in range(copies)]
            return [lambda i=i: kvforge.gqa_decode(q, kv[i][0], kv[i][1], bt, lens, config=cfg) for i in range(copies)]

        times = {"thread": [], "warp": []}
        for r in range(args.rounds):
            order = ("thread", "warp") if r % 2 == 0 else ("warp", "thread")
            for name in order:
                times[name].append(graph_ms(calls(cfgs[name]), 20))
        t, w = statistics.median(times["thread"]), statistics.median(times["warp"])
        print(f"| {sh.label} | {t:.4f} | {w:.4f} | {t / w:.3f} |", flush=True)
        del q, kv
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
