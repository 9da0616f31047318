"""A/B of the sm90 MLA kernel's math-warpgroup schedule: 'lockstep' (each tile's QK split by keys,
m64n32k16, both warpgroups in step through softmax and PV) against 'seesaw' (tiles in pairs, each
warpgroup the whole m64n64 QK of one, the softmaxes handed over so one warpgroup's wgmmas run while
the other's softmax does), on the benchmark's MLA shapes that run on sm90.

    python bench/schedule_ab.py [--rounds 3]

Each round times both variants (CUDA-graph replays, KV copies rotating past the L2), alternating
which goes first; prints the median per variant and the ratio.
"""
import argparse
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import config_ab  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.runtime.decode import select_config  # noqa: E402


def variants(sh):
    if sh.family != "mla_decode":
        return None
    cfg = select_config(sh.family, "bf16", sh.page, sh.hq, sh.d, sh.s_q, 0)
    if cfg.backend != "sm90":
        return None
    data = cfg.model_dump(mode="json")
    data["schedule"] = "seesaw"
    return {"lockstep": cfg, "seesaw": build(DecodeConfig, data)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    config_ab(variants, ("lockstep", "seesaw"), ("schedule=lockstep", "schedule=seesaw"), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
