"""fp8 MLA on the sm90 kernel: the ways of staging fp8 tiles, against kvforge's 16-bit call.

    python bench/fp8_staging_ab.py [--rounds N] [--layouts per_tensor,block128,fp8_ds_mla] [--stagings slot,slot_ahead]

'registers' (the producer warpgroup loads each fp8 tile into registers, dequantizes it and stores it
into the 16-bit ring, beside the math) vs 'fp8_ring' (bulk copies into an fp8 ring, converted by the
math warpgroups into one 16-bit tile before each QK), both under the lockstep schedule, and for
per-tensor scales 'slot' (the seesaw: TMA of the fp8 columns into the 16-bit slot they become,
converted there by the producer warpgroup; 'slot_ahead': the same with fp8_slot_loads_ahead, each half's first
thread issuing tile t + 1's boxes as soon as its slot frees while tile t lands), all pinned, on the sm90 MLA shapes of
bench/bench.py. Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies
rotating past the L2), every call of a shape captured together and timed in rounds of rotating
order, the median per call. 'x 16-bit' is the 16-bit call's time over the fp8 call's.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, Shape, interleaved_ms, make_inputs, run_kvforge  # noqa: E402
from fp8 import quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.codegen.select import sm90_choice  # noqa: E402

SHAPES = [Shape("mla_decode", 128, 4096, 32), Shape("mla_decode", 128, 4096, 64), Shape("mla_decode", 128, 4096, 128),
          Shape("mla_decode", 128, 4096, 64, s_q=2), Shape("mla_decode", 32, 8192, 128),
          Shape("mla_decode", 1, 32768, 128)]
LAYOUTS = {"per_tensor": ("per_tensor", None), "block64": ("block", 64), "block128": ("block", 128),
           "fp8_ds_mla": ("fp8_ds_mla", None)}
STAGINGS = ("fp8_ring", "registers", "slot", "slot_ahead")  # slot_ahead: 'slot' with fp8_slot_loads_ahead
SLOT_LAYOUTS = ("per_tensor",)  # the layouts fp8_staging='slot' takes (codegen/select.py)


def stagings(name: str, wanted: tuple[str, ...] = STAGINGS) -> tuple[str, ...]:
    return tuple(s for s in wanted if LAYOUTS[name][0] in SLOT_LAYOUTS or not s.startswith("slot"))


def staging_config(sh: Shape, layout: str, block: int | None, staging: str) -> DecodeConfig:
    """The sm90 MLA config pinned to `staging` for this shape (as the built-in choice builds it)."""
    cfg = sm90_choice("mla_decode", "bf16", sh.page, sh.s_q,
                      {"kv_dtype": "fp8_e4m3", "scale_mode": layout, "scale_block_size": block},
                      fp8_staging=staging.removesuffix("_ahead"))
    if staging == "slot_ahead":
        cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "fp8_slot_loads_ahead": True})
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layouts", default="per_tensor,block128,fp8_ds_mla")
    ap.add_argument("--stagings", default=",".join(STAGINGS), help=f"a subset of {','.join(STAGINGS)}")
    args = ap.parse_args()
    layouts = [name for name in args.layouts.split(",") if name]
    wanted = tuple(s for s in args.stagings.split(",") if s)
    unknown = [s for s in wanted if s not in STAGINGS]
    if unknown:
        ap.error(f"--stagings: unknown {unknown}; choose from {list(STAGINGS)}")
    cols = [(n, s) for n in layouts for s in stagings(n, wanted)]
    head = " | ".join(f"{n} {s} ms | x 16-bit" for n, s in cols)
    print(f"| shape | 16-bit ms | {head} |")
    print("|---|---|" + "---|---|" * len(cols))
    for sh in SHAPES:
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
        q, kv, bt, lens = make_inputs(sh, copies)
        calls = {"16-bit": [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]}
        for name in layouts:
            layout, block = LAYOUTS[name]
            qkv = quantized(sh, kv, layout, block)
            for staging in stagings(name, wanted):
                cfg = staging_config(sh, layout, block, staging)
                calls[f"{name} {staging}"] = [lambda i=i, c=cfg, e=qkv: run_fp8(sh, q, e[i], bt, lens, c)
                                              for i in range(copies)]
        got = interleaved_ms(calls, 20, args.rounds)
        base = got["16-bit"]
        cells = " | ".join(f"{got[f'{n} {s}']:.4f} | {base / got[f'{n} {s}']:.3f}x" for n, s in cols)
        print(f"| {sh.label} | {base:.4f} | {cells} |", flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
