"""A/B of fp8_slot_loads_ahead on per-tensor fp8 MLA on the sm90 seesaw ('slot' staging), beside kvforge's 16-bit
call: the built-in slot kernel (each sub-stage half's first thread issues tile t + 1's boxes only after its half has
converted tile t) against the same kernel with the loads issued ahead (that thread polls tile t + 1's slot while tile
t lands and issues its boxes the moment it frees), both pinned, on the unsplit MLA shapes of 64+ query rows per CTA
(the ones the slot staging serves) and a longer-sequence one.

    python bench/fp8_slot_loads_ahead_ab.py [--rounds 3]

Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies rotating past the L2), every call
of a shape captured together and timed in rounds of rotating order, the median per call. 'slot / ahead' above 1:
the loads issued ahead are faster; 'x 16-bit': the 16-bit call's time over the fp8 call's (the issue-9 target at
128 heads is >= 1).
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import Shape, interleaved_ms, kv_copies, make_inputs, run_kvforge  # noqa: E402
from fp8 import quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.codegen.select import sm90_choice  # noqa: E402

SHAPES = [Shape("mla_decode", 128, 4096, 64), Shape("mla_decode", 128, 4096, 128),
          Shape("mla_decode", 128, 4096, 64, s_q=2), Shape("mla_decode", 64, 8192, 128)]
PER_TENSOR = {"kv_dtype": "fp8_e4m3", "scale_mode": "per_tensor", "scale_block_size": None}


def slot_configs(sh: Shape) -> dict[str, DecodeConfig]:
    """{'slot': the slot kernel as the built-in choice builds it, 'ahead': the same with fp8_slot_loads_ahead}."""
    slot = sm90_choice("mla_decode", "bf16", sh.page, sh.s_q, PER_TENSOR, fp8_staging="slot")
    return {"slot": slot, "ahead": build(DecodeConfig, {**slot.model_dump(mode="json"), "fp8_slot_loads_ahead": True})}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print("| shape | 16-bit ms | fp8 slot ms | fp8 slot, loads ahead ms | slot / ahead | slot x 16-bit | "
          "ahead x 16-bit |")
    print("|---|---|---|---|---|---|---|")
    for sh in SHAPES:
        copies = kv_copies(sh.bytes())
        q, kv, bt, lens = make_inputs(sh, copies)
        qkv = quantized(sh, kv, "per_tensor", None)
        calls = {"16-bit": [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]}
        for name, cfg in slot_configs(sh).items():
            calls[name] = [lambda i=i, c=cfg: run_fp8(sh, q, qkv[i], bt, lens, c) for i in range(copies)]
        got = interleaved_ms(calls, 20, args.rounds)
        base, slot, ahead = got["16-bit"], got["slot"], got["ahead"]
        print(f"| {sh.label} | {base:.4f} | {slot:.4f} | {ahead:.4f} | {slot / ahead:.3f} | {base / slot:.3f}x | "
              f"{base / ahead:.3f}x |", flush=True)
        del q, kv, qkv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
