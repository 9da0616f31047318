"""A/B of the online-softmax rescale: eager (the running maximum follows every increase, every warp
rescales its output each tile) against `lazy_rescale` (the maximum moves only past a slack of 2^8, a
warp skips its rescale when none of its rows moved), both on the built-in choice (sm90 MLA above 16
query rows, sm80 for 16-head MLA and GQA), on eight benchmark shapes, 16-bit and per-tensor fp8, with
FlashInfer (16-bit) in the same captures.

    python bench/lazy_rescale_ab.py [--rounds 3] [--no-flashinfer]

Same method as bench/bench.py: CUDA-graph replays of one call per KV copy (copies rotating past the
L2), every call of a shape captured together and timed in rounds of rotating order, the median per
call; 'rel' is the lazy output's relative L2 difference from the eager one.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, SHAPES, flashinfer_calls, interleaved_ms, make_inputs, run_kvforge  # noqa: E402

PICKED = [SHAPES[i] for i in (0, 2, 3, 4, 5, 6, 7, 8)]  # MLA h16, h64, h128, s_q2, b32, b1; GQA b64, b1
from fp8 import kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.runtime.decode import select_config  # noqa: E402
from kvforge.runtime.kv_format import KVFormat  # noqa: E402


def pair(sh, layout):
    """(eager, lazy) configs: the runtime's built-in choice for this launch with lazy_rescale off and on
    (the built-in choice has it on for sm90, off for sm80: codegen/policy.py::SM90_LAZY_RESCALE)."""
    kv = None if layout is None else KVFormat("fp8_e4m3", layout, None)
    heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
    base = select_config(sh.family, "bf16", sh.page, heads, sh.d, sh.s_q, 0, kv=kv, batch=sh.b)
    return tuple(build(DecodeConfig, {**base.model_dump(mode="json"), "lazy_rescale": lazy}) for lazy in (False, True))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flashinfer", action="store_true")
    args = ap.parse_args()
    print("| shape | KV | built-in | eager ms | lazy ms | eager / lazy | FlashInfer ms | FlashInfer / lazy | rel |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sh in PICKED:
        for layout in (None, "per_tensor"):
            eager, lazy = pair(sh, layout)
            copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, layout, None))))
            q, kv, bt, lens = make_inputs(sh, copies)
            if layout is None:
                call = lambda i, c: run_kvforge(sh, q, *kv[i], bt, lens, c)  # noqa: E731
            else:
                qkv = quantized(sh, kv, layout, None)
                call = lambda i, c: run_fp8(sh, q, qkv[i], bt, lens, c)  # noqa: E731
            calls = {n: [lambda i=i, c=c: call(i, c) for i in range(copies)] for n, c in (("eager", eager),
                                                                                        ("lazy", lazy))}
            ref = calls["eager"][0]().float()
            rel = float((calls["lazy"][0]().float() - ref).norm() / ref.norm())
            if layout is None and not args.no_flashinfer:
                calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
            t = interleaved_ms(calls, 20, args.rounds)
            fi = t.get("FlashInfer", float("nan"))
            name = eager.backend + (f" {eager.schedule}" if eager.backend == "sm90" else "") + (
                f" {eager.fp8_staging}" if layout and eager.backend == "sm90" else "")
            print(f"| {sh.label} | {layout or 'bf16'} | {name} | {t['eager']:.4f} | {t['lazy']:.4f} | "
                  f"{t['eager'] / t['lazy']:.3f} | {fi:.4f} | {fi / t['lazy']:.3f} | {rel:.1e} |", flush=True)
            del q, kv, calls
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
