"""A/B of the GQA sm80 kernel's producer warps on sm_90: the built-in choice (four warps issuing one
cp.async.bulk per K and V row) against eight warps (the same ring; 2 and 3 stages) and against 16-byte
cp.async, on bench.py's GQA shapes, FlashInfer in the same captures (branch `exp-bulk-k` adds K by bulk
copies with V by cp.async). Why: bench/read_ceiling.py --row-bytes 256 --producers N shows
per-row bulk copies issue-bound per warp (about one copy per 70 SM cycles per warp): into a ring of 32 KB
slots, 2 CTAs per SM, 2 warps read 3.9 TB/s, 4 warps 4.4-4.5, where whole-slot copies read 4.65.

    python bench/producers_ab.py [--rounds 3] [--no-flashinfer] [--shapes 7,8,9,10,12]

Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies rotating past the L2),
every call of a shape captured together and timed in rounds of rotating order, the median per call;
'rel' is each variant's relative L2 difference from the built-in's output.
"""
from __future__ import annotations

import argparse
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import SHAPES, flashinfer_calls, interleaved_ms, kv_copies, make_inputs, run_kvforge  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import ConfigError, build  # noqa: E402


def variants(sh) -> dict:
    """{name: config}: the built-in choice, eight producer warps at 3 and 2 stages, 16-byte cp.async."""
    from kvforge.codegen.select import select_for_launch
    from kvforge.runtime.device import device_arch, sm_count

    base = select_for_launch("gqa_decode", device_arch(0), sm_count(0), "bf16", sh.page, heads=sh.hq // sh.hkv,
                             head_dim=sh.d, s_q=sh.s_q, batch=sh.b)
    data = base.model_dump(mode="json")
    out = {f"built-in {base.kv_load} pr{base.pipeline.num_producer} s{base.pipeline.num_kv_stages}": base}
    others = {f"pr8 s{stages}": {"pipeline": {**data["pipeline"], "num_producer": 8, "num_kv_stages": stages}}
              for stages in (3, 2)}
    others["cp_async"] = {"kv_load": "cp_async"}
    for name, over in others.items():
        try:
            out[name] = build(DecodeConfig, {**data, **over})
        except ConfigError:  # e.g. the TMA tile at D = 64 has one producer warp
            continue
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--shapes", default="7,8,9,10,12", help="indices into bench.SHAPES (GQA ones)")
    args = ap.parse_args()
    for idx in (int(x) for x in args.shapes.split(",")):
        sh = SHAPES[idx]
        cfgs = variants(sh)
        copies = kv_copies(sh.bytes())
        q, kv, bt, lens = make_inputs(sh, copies)
        calls = {n: [lambda i=i, c=c: run_kvforge(sh, q, *kv[i], bt, lens, c) for i in range(copies)]
                 for n, c in cfgs.items()}
        names = list(cfgs)
        ref = calls[names[0]][0]().float()
        rel = max(float((calls[n][0]().float() - ref).norm() / ref.norm()) for n in names[1:])
        if not args.no_flashinfer:
            calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
        t = interleaved_ms(calls, 20, args.rounds)
        fi = t.get("FlashInfer", float("nan"))
        row = " | ".join(f"{n} {t[n]:.4f} ({t[names[0]] / t[n]:.3f}x)" for n in names)
        print(f"| {sh.label} | {row} | FlashInfer {fi:.4f} | rel {rel:.1e} |", flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
