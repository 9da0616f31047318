"""A/B of the sm90 MLA seesaw's pair order: the built-in (warpgroup 1 multiplies P_A V_A[R] first, then P_B
V_B[R]; P_B in B's rope chunk, so both halves of tile B free at the pair's end and warpgroup 1's next QK waits for
their loads) against seesaw_b_first (FlashMLA's order: warpgroup 0 rescales P_A to M1 into A's rope chunk, P_B in
its own 8 KB tile, warpgroup 1 multiplies its own P_B first; each half-tile freed when its last reader is done,
docs/seesaw-load-lead.md), both the seesaw pinned, on the benchmark's MLA shapes that run on sm90 (and --sweep's).

    python bench/seesaw_b_first_ab.py [--rounds 3] [--sweep]

Each round times both variants (CUDA-graph replays, KV copies rotating past the L2), alternating which goes
first; prints the median per variant and the ratio.
"""
import argparse
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import SHAPES, config_ab  # noqa: E402
from schedule_ab import SWEEP  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.codegen.select import preferred_backend, sm90_choice  # noqa: E402


def variants(sh):
    if preferred_backend(sh.family, "sm_90", sh.hq, sh.s_q) != "sm90":
        return None
    data = {**sm90_choice(sh.family, "bf16", sh.page, sh.s_q).model_dump(mode="json"), "schedule": "seesaw"}
    return {name: build(DecodeConfig, {**data, "seesaw_b_first": bf}) for name, bf in (("seesaw", False),
                                                                                         ("b_first", True))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="batch x length shapes instead of the benchmark's")
    args = ap.parse_args()
    config_ab(variants, ("seesaw", "b_first"), ("seesaw", "seesaw_b_first"), args.rounds,
              SWEEP if args.sweep else SHAPES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
