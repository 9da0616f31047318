"""The sm90 MLA kernel's start, measured: the built-in calls as they ship (each CTA's producers issue its first
two tiles at once) against the same variants built with KVFORGE_STAGGER_START_FOR_MEASUREMENT (a measurement-only
define in the TMA producers: the second tile's loads wait until the first tile has landed), on the benchmark's MLA
shapes that run on sm90 and the short launches (bench.SHORT_SHAPES) where a launch's start weighs most.

    python bench/stagger_ab.py [--rounds 3] [--shapes all|one-block]

Why (bench/RESULTS.md, twenty-second session): issuing the first tiles earlier moved nothing, because every CTA of a
launch asks for Q and two 72 KB tiles at once (~19 MB at b=64-128) and the first tile lands with the bytes of all of
them; asking for one tile first should let it land sooner, the second arriving under its math. Each build runs in
its own process (bench/child_ab.py); rounds alternate which goes first. Ratio > 1: the staggered start is faster.
"""
import argparse
import sys

from child_ab import define_ab, define_prelude

STAGGER = define_prelude("KVFORGE_STAGGER_START_FOR_MEASUREMENT")
SHAPES = {
    "all": "[sh for sh in SHAPES + SHORT_SHAPES if sh.family == 'mla_decode' and sh.hq * sh.s_q > 16]",
    # one head block per sequence (32 and 64 heads at s_q = 1: memory-bound), and 128 heads as the control
    "one-block": "[sh for sh in SHAPES if sh.family == 'mla_decode' and sh.s_q == 1 and sh.hq > 16 and sh.b == 128]",
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="all",
                    help="all: the sm90 MLA bench shapes and the short launches; one-block: b=128 s_k=4096 at 32, 64 "
                    "and 128 heads")
    args = ap.parse_args()
    define_ab(SHAPES[args.shapes], STAGGER, args.rounds, ("as shipped", "staggered start"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
