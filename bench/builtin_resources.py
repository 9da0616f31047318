"""Registers, spills and stack of every variant the built-in choice picks on a shape grid (no GPU: NVRTC only).

    python bench/builtin_resources.py [--arch sm_90] [--dtype bf16] [--jobs 2] [--all] [--json out.json]

tests/test_sass.py checks the default matrix's builds for local memory; the built-in choice (`codegen/select.py`)
reaches many more variants (every family x page size x s_q 1..8 x heads x head dim x KV format x split count the
runtime may pass). This compiles each distinct one through the cache and lists those whose main kernel spills or
keeps a stack frame, with the shapes that choose it, so that a spilling built-in choice is seen before it is timed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from concurrent.futures import ThreadPoolExecutor

FORMATS = (("none", None), ("per_tensor", None), ("block", 32), ("block", 64), ("block", 128), ("fp8_ds_mla", None))
MLA_HEADS = (1, 8, 16, 32, 64, 128)
GQA_GROUPS = (1, 4, 8, 16)
GQA_DIMS = (64, 128, 256)
S_Q = (1, 2, 4, 8)
PAGES = (16, 64)
SPLITS = (None, 1, 2, 8)  # the split counts that pick different sm90 schedules (select.sm90_schedule)


def builtin_choices(arch: str, dtype: str = "bf16") -> dict[str, tuple[object, list[str]]]:
    """Variant name -> (its config, the shapes whose built-in choice it is) over the grid above."""
    from kvforge.codegen.errors import ConfigError
    from kvforge.codegen.select import select_decode_config
    from kvforge.codegen.variant import Variant

    out: dict[str, tuple[object, list[str]]] = {}
    for family, page, s_q, (mode, block) in itertools.product(("mla_decode", "gqa_decode"), PAGES, S_Q, FORMATS):
        mla = family == "mla_decode"
        if not mla and mode == "fp8_ds_mla":
            continue
        for heads, dim in itertools.product(MLA_HEADS if mla else GQA_GROUPS, (576,) if mla else GQA_DIMS):
            for splits in SPLITS:
                try:
                    cfg = select_decode_config(family, arch, dtype, page, heads=heads, head_dim=dim, s_q=s_q,
                                               scale_mode=mode, scale_block_size=block, splits=splits)
                except ConfigError:  # a format this arch or family does not take
                    continue
                shape = (f"{'MLA h' if mla else f'GQA D={dim} group '}{heads} s_q={s_q} page={page} "
                         f"{mode if block is None else f'{mode}:{block}'} splits={splits}")
                out.setdefault(Variant(cfg).name, (cfg, []))[1].append(shape)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="q (and 16-bit caches) dtype")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="list every variant, not only those with local memory")
    ap.add_argument("--json", help="write {variant: {registers, spill_store_bytes, stack_frame_bytes, shapes}} here")
    args = ap.parse_args()
    from cuda.core import Program  # noqa: F401  (imported before the threads)

    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    choices = builtin_choices(args.arch, args.dtype)

    def one(item):
        name, (cfg, shapes) = item
        r = compile(Variant(cfg)).resources
        return name, {"registers": r.registers, "spill_store_bytes": r.spill_store_bytes,
                      "stack_frame_bytes": r.stack_frame_bytes, "shapes": shapes}

    with ThreadPoolExecutor(args.jobs) as ex:
        results = dict(ex.map(one, sorted(choices.items())))
    local = {n: r for n, r in results.items() if r["spill_store_bytes"] or r["stack_frame_bytes"]}
    print(f"{len(results)} built-in {args.dtype} variants on {args.arch}; {len(local)} with spills or a stack frame")
    for name, r in sorted(results.items() if args.all else local.items(),
                          key=lambda kv: (-kv[1]["spill_store_bytes"], kv[0])):
        print(f"{name}: {r['registers']} registers, {r['spill_store_bytes']} B spilled, "
              f"{r['stack_frame_bytes']} B stack; e.g. {r['shapes'][0]} ({len(r['shapes'])} shapes)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
