"""The TMA tile loads' L2 behaviour, measured: kvforge's built-in calls with the KV tensor maps' L2 promotion as
shipped (CU_TENSOR_MAP_L2_PROMOTION_L2_256B) against 128 B (the default of CUTLASS's make_tma_copy, with which
FlashMLA's sm90 kernel builds its KV map) and none, and against the loads carrying an L2 evict_first policy (FlashMLA's hint; the
measurement-only define KVFORGE_TMA_EVICT_FIRST_FOR_MEASUREMENT in kvforge/sm90_tile.cuh), on the benchmark's shapes
whose kernels load by TMA (MLA on sm90, GQA at D = 64).

    python bench/l2_policy_ab.py [--rounds 3] [--arms 128B,none,evict_first]

Why (bench/RESULTS.md, twenty-sixth session): at 32-64 heads the sm90 MLA kernel asks L2 for 20% more read sectors
than FlashInfer's for the same DRAM bytes, with its L2 at 85% of peak. Each arm runs in its own process
(bench/child_ab.py; the runtime caches tensor maps and plans per process), rounds alternating the arms' order.
Prints each arm's median per shape and shipped / arm (> 1: the arm is faster).

Since the twenty-seventh session the built-in split launches (b=32, b=1 here) ship evict_first KV loads
(`l2_evict_first`, measured with this script's evict_first arm), so on those rows that arm compares a kernel with
itself; it still measures the unsplit launches and GQA's TMA loads, where no config sets it.
"""
import argparse
import sys

from child_ab import alternate_rounds, child_times, define_prelude, medians_of, print_arms_table

SHAPES = "[sh for sh in SHAPES if (sh.family == 'mla_decode' and sh.hq * sh.s_q > 16) or sh.d == 64]"


def promotion(value: str) -> str:
    """A child prelude re-encoding every KV tensor map with L2 promotion `value` (a CUtensorMapL2promotion name)."""
    return ("import kvforge.runtime.tensor_map as TM\n_enums = TM._enums\n"
            "def _patched():\n"
            "    from cuda.bindings import driver\n"
            f"    return {{**_enums(), 'l2': driver.CUtensorMapL2promotion.{value}}}\n"
            "TM._enums = _patched")


EVICT_FIRST = define_prelude("KVFORGE_TMA_EVICT_FIRST_FOR_MEASUREMENT")
ARMS = {"shipped": "", "128B": promotion("CU_TENSOR_MAP_L2_PROMOTION_L2_128B"),
        "none": promotion("CU_TENSOR_MAP_L2_PROMOTION_NONE"), "evict_first": EVICT_FIRST}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default="128B,none,evict_first", help=f"comma-separated, of {', '.join(list(ARMS)[1:])}")
    args = ap.parse_args()
    arms = ["shipped"] + [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown {unknown}; choose from {list(ARMS)[1:]}")
    per_round = alternate_rounds({a: (lambda a=a: child_times(SHAPES, prelude=ARMS[a])) for a in arms}, args.rounds)
    print_arms_table(medians_of(per_round), "shipped", per_round)  # each ratio with its rounds' range, as tree_ab
    return 0


if __name__ == "__main__":
    sys.exit(main())
