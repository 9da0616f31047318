"""A/B of the consumer release on the sm80 kernels: per-thread arrivals (the default, clean under
racecheck) against one elected lane per warp after __syncwarp, on the benchmark's shapes.

    python bench/release_ab.py [--rounds 3]

Each round times both variants (CUDA-graph replays, KV copies rotating past the L2), alternating
which goes first; prints the median per variant and the ratio.
"""
import argparse
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import config_ab  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402


def variants(sh):
    heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
    cfg = select_decode_config(sh.family, device_arch(0), "bf16", sh.page, heads=heads, head_dim=sh.d, s_q=sh.s_q,
                               backend="sm80")
    data = cfg.model_dump(mode="json")
    data["pipeline"]["consumer_arrive"] = "warp"
    return {"thread": cfg, "warp": build(DecodeConfig, data)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    config_ab(variants, ("thread", "warp"), ("per-thread release", "per-warp release"), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
