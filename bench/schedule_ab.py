"""A/B of the sm90 MLA kernel's math-warpgroup schedule: 'lockstep' (each tile's QK split by keys,
m64n32k16, both warpgroups in step through softmax and PV) against 'seesaw' (tiles in pairs, each
warpgroup the whole m64n64 QK of one, the softmaxes handed over so one warpgroup's wgmmas run while
the other's softmax does), both pinned, on the benchmark's MLA shapes that run on sm90.

    python bench/schedule_ab.py [--rounds 3] [--sweep]

--sweep: instead, batch x length shapes at 32-128 heads (few sequences, long or short), the data
behind codegen/select.py::sm90_schedule. Each round times both variants (CUDA-graph replays, KV
copies rotating past the L2), alternating which goes first; prints the median per variant and the ratio.
"""
import argparse
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import SHAPES, Shape, config_ab  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.codegen.select import preferred_backend, sm90_choice  # noqa: E402

SWEEP = [Shape("mla_decode", b, s_k, h) for b, s_k, h in (
    (1, 32768, 128), (1, 131072, 128), (2, 16384, 128), (4, 8192, 128), (4, 32768, 128), (8, 4096, 128),
    (16, 4096, 128), (16, 8192, 128), (1, 32768, 64), (4, 16384, 64), (16, 8192, 64), (32, 4096, 64),
    # two splits per sequence (batch x head blocks in 34..66 CTAs on 132 SMs): long chunks, where the seesaw
    # may pay even though the launch splits sequences
    (24, 4096, 128), (32, 2048, 128), (32, 8192, 128), (48, 4096, 64), (64, 2048, 64), (40, 8192, 64))]


def variants(sh):
    if preferred_backend(sh.family, "sm_90", sh.hq, sh.s_q) != "sm90":
        return None
    data = sm90_choice(sh.family, "bf16", sh.page, sh.s_q).model_dump(mode="json")
    return {name: build(DecodeConfig, {**data, "schedule": name}) for name in ("lockstep", "seesaw")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="batch x length shapes instead of the benchmark's")
    args = ap.parse_args()
    config_ab(variants, ("lockstep", "seesaw"), ("schedule=lockstep", "schedule=seesaw"), args.rounds,
              SWEEP if args.sweep else SHAPES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
