"""How much of the sm90 MLA kernel's time is its KV loads' exposed latency: the built-in calls built as they ship
against the same variants built with KVFORGE_NO_KV_LOADS_FOR_MEASUREMENT (a measurement-only define: the 16-bit
TMA producers complete each slot's full barrier with no bytes and issue no loads, so the math runs at its own pace
on whatever the slots hold; outputs are garbage), on the benchmark's MLA shapes that run on sm90.

    python bench/loads_off_ab.py [--rounds 3]

Each build runs in its own process (bench/child_ab.py: the runtime caches plans per config, and the two builds
share a config); rounds alternate which goes first. The ratio is the speed-up a schedule that hid every load
(a ring with enough lead) would reach at most.
"""
import argparse
import sys

from child_ab import define_ab, define_prelude

NO_LOADS = define_prelude("KVFORGE_NO_KV_LOADS_FOR_MEASUREMENT")
SHAPES = "[sh for sh in SHAPES if sh.family == 'mla_decode' and sh.hq * sh.s_q > 16]"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    define_ab(SHAPES, NO_LOADS, args.rounds, ("as shipped", "loads switched off"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
