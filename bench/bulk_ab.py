"""A/B of the sm80 kernel's producers on sm_90: one cp.async.bulk per K/V row (kv_load='bulk', the
runtime's choice for 16-bit GQA at D >= 128) against 16-byte cp.async per lane (kv_load='cp_async'),
same ring and warps, on every GQA shape of the benchmark and the MLA shapes the sm80 kernel runs
(16 query rows or fewer: 1152-byte rows, one copy each).

    python bench/bulk_ab.py [--rounds 3]

Each round times both variants (CUDA-graph replays, KV copies rotating past the L2), alternating
which goes first; prints the median per variant and the ratio (bulk time / cp.async time).
"""
import argparse
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import config_ab, sm80_config  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402


def variants(sh):
    if sh.family == "mla_decode" and sh.hq * sh.s_q > 16:  # the sm90 kernel's shapes
        return None
    data = sm80_config(sh).model_dump(mode="json")
    return {load: build(DecodeConfig, {**data, "kv_load": load}) for load in ("bulk", "cp_async")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    config_ab(variants, ("bulk", "cp_async"), ("kv_load=bulk", "kv_load=cp_async"), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
