"""A/B of the sm90 MLA kernel's QK accumulator chains: one 36-deep dependent wgmma chain per math
warpgroup (qk_chains=1, the default) against even/odd k16 steps in two chains (qk_chains=2), on the
benchmark's MLA shapes that run on sm90.

    python bench/qk_chains_ab.py [--rounds 3]

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
from kvforge.runtime.decode import select_config  # noqa: E402


def variants(sh):
    cfg = select_config(sh.family, "bf16", sh.page, sh.hq, sh.d, sh.s_q, 0)
    if cfg.backend != "sm90":
        return None
    data = cfg.model_dump(mode="json")
    data["qk_chains"] = 2
    return {"1": cfg, "2": build(DecodeConfig, data)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print("| shape | qk_chains=1 ms | qk_chains=2 ms | 1 / 2 |")
    print("|---|---|---|---|")
    for sh in SHAPES:
        if sh.family != "mla_decode":
            continue
        cfgs = variants(sh)
        if cfgs is None:
            continue
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
        q, kv, bt, lens = make_inputs(sh, copies)

        def calls(cfg):
            return [lambda i=i: kvforge.mla_decode(q, kv[i][0], bt, lens, causal=sh.s_q > 1, config=cfg)
                    for i in range(copies)]

        times = {"1": [], "2": []}
        for r in range(args.rounds):
            for name in (("1", "2") if r % 2 == 0 else ("2", "1")):
                times[name].append(graph_ms(calls(cfgs[name]), 20))
        one, two = statistics.median(times["1"]), statistics.median(times["2"])
        print(f"| {sh.label} | {one:.4f} | {two:.4f} | {one / two:.3f} |", flush=True)
        del q, kv
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
