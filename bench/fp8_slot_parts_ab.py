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

from child_ab import alternate_rounds, child_times, define_prelude, medians_of

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
    med = medians_of(times)
    base = med["16-bit"]
    print("| shape | " + " | ".join(f"{n} ms" for n in ARMS) + " | " +
          " | ".join(f"16-bit / {n}" for n in list(ARMS)[1:]) + " |")
    print("|---|" + "---|" * (2 * len(ARMS) - 1))
    for label, t16 in base.items():
        # the fp8 children label their shapes with the layout: match on the 16-bit label's prefix
        row = [t16] + [next(v for k, v in med[n].items() if k == label or k.startswith(label + " ")) for n in list(ARMS)[1:]]
        print(f"| {label} | " + " | ".join(f"{t:.4f}" for t in row) + " | " +
              " | ".join(f"{t16 / t:.3f}" for t in row[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
