"""Where per-tensor fp8 MLA on the sm90 seesaw ('slot' staging: fp8 columns by TMA into the 16-bit slot they become,
converted there in place) loses against kvforge's own 16-bit call: the built-in fp8 calls as shipped against the same
variants built with the conversion switched off (KVFORGE_NO_FP8_CONVERT_FOR_MEASUREMENT), with the loads switched off
(KVFORGE_NO_KV_LOADS_FOR_MEASUREMENT) and with both, beside the 16-bit call, on the benchmark's unsplit MLA shapes of
64 rows per CTA or more (the ones that take the slot staging). Measurement-only defines: their outputs are garbage.

    python bench/fp8_slot_parts_ab.py [--rounds 2]

Each arm runs in its own process per round (bench/child_ab.py), the arms' order reversed every round. Read a column
against the 16-bit one: "no convert" near it says the conversion on each refill's critical path is the gap; "no loads"
near it says the fp8 loads' latency is.
"""
import argparse
import sys

from child_ab import alternate_rounds, child_times, define_prelude, medians_of, print_arms_table

SHAPES = "[sh for sh in SHAPES if sh.family == 'mla_decode' and sh.hq * sh.s_q >= 64 and sh.b >= 64]"
NO_CONVERT = "KVFORGE_NO_FP8_CONVERT_FOR_MEASUREMENT"
NO_LOADS = "KVFORGE_NO_KV_LOADS_FOR_MEASUREMENT"
ARMS = {
    "16-bit": {},
    "fp8 as shipped": {"fp8": "per_tensor"},
    "fp8 no convert": {"fp8": "per_tensor", "prelude": define_prelude(NO_CONVERT)},
    "fp8 no loads": {"fp8": "per_tensor", "prelude": define_prelude(NO_LOADS)},
    "fp8 neither": {"fp8": "per_tensor", "prelude": define_prelude(NO_CONVERT, NO_LOADS)},
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    times = alternate_rounds({name: (lambda kw=kw: child_times(SHAPES, **kw)) for name, kw in ARMS.items()},
                             args.rounds)
    # the fp8 children label their shapes with the layout appended: the 16-bit labels for all arms
    times = {arm: {label.removesuffix(f" fp8 {kw['fp8']}") if "fp8" in kw else label: v for label, v in times[arm].items()}
             for arm, kw in ARMS.items()}
    print_arms_table(medians_of(times), "16-bit", times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
