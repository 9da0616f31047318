"""A/B of the device-side input guard's cost: the same variants built with and without it
(KVFORGE_UNGUARDED_FOR_MEASUREMENT, a measurement-only define), on the benchmark's shapes.

    python bench/guard_ab.py [--rounds 3] [--short]

--short: bench.SHORT_SHAPES, MLA launches of few tiles per CTA instead of the benchmark's, where a launch's fixed
cost weighs most (bench/overhead_fit.py: kvforge's sm90 MLA launches cost ~10-15 us more than FlashInfer's
whatever the length).

Each build runs in its own process (bench/child_ab.py: the runtime caches plans per config, and the two builds
share a config); rounds alternate which goes first. Prints the median per build and the ratio.
"""
import argparse
import sys

from child_ab import define_ab, define_prelude

UNGUARDED = define_prelude("KVFORGE_UNGUARDED_FOR_MEASUREMENT")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", action="store_true", help="MLA shapes of few tiles per CTA (fixed costs)")
    args = ap.parse_args()
    shapes = "SHORT_SHAPES" if args.short else "SHAPES"
    define_ab(shapes, UNGUARDED, args.rounds, ("guarded", "unguarded"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
