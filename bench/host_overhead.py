"""Host time per eager decode call, next to FlashInfer's run() on the same inputs, same process.

    python bench/host_overhead.py [--profile]

For each shape: kvforge's default functional call (kvforge.mla_decode / gqa_decode, no extra
arguments), the plan/run object (MLADecode / GQADecode .run) and FlashInfer's wrapper run(), each
timed over 300 back-to-back calls with no synchronisation inside the loop (host microseconds per
call; the shapes are small enough that the GPU keeps up, so the host is what is measured).
`--profile` adds a cProfile of the default call.
"""
import argparse
import cProfile
import pstats
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import Shape, flashinfer_runner, make_inputs  # noqa: E402

import kvforge  # noqa: E402

SHAPES = [  # (shape, note): one unsplit and one split call per family
    (Shape("mla_decode", 128, 256, 16), "unsplit"), (Shape("mla_decode", 1, 4096, 16), "split: +combine"),
    (Shape("gqa_decode", 64, 256, 32, 8, 128, page=16), "unsplit"),
    (Shape("gqa_decode", 1, 4096, 32, 8, 128, page=16), "split: +combine"),
]


def host_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    rows = []
    for sh, note in SHAPES:
        q, kv, bt, lens = make_inputs(sh, 1)
        k, v = kv[0]
        if sh.family == "mla_decode":
            default = lambda: kvforge.mla_decode(q, k, bt, lens)  # noqa: E731
            obj = kvforge.MLADecode(sh.hq, sh.page, "bf16", max_batch=sh.b)
            planned = lambda: obj.run(q, k, bt, lens)  # noqa: E731
        else:
            default = lambda: kvforge.gqa_decode(q, k, v, bt, lens)  # noqa: E731
            obj = kvforge.GQADecode(sh.hq, sh.hkv, sh.d, sh.page, "bf16", max_batch=sh.b)
            planned = lambda: obj.run(q, k, v, bt, lens)  # noqa: E731
        ours, plan_us = host_us(default), host_us(planned)
        try:
            fi = flashinfer_runner(sh, q, kv, bt, lens)
            fi_us = host_us(lambda: fi(0))
        except Exception as err:  # noqa: BLE001
            print(f"FlashInfer unavailable for {sh.label}: {type(err).__name__}: {err}", file=sys.stderr)
            fi_us = float("nan")
        rows.append((sh.label, note, ours, plan_us, fi_us))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                default()
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(10)
    print("| shape | path | kvforge default call, host us | kvforge plan .run(), host us | FlashInfer run(), host us |")
    print("|---|---|---|---|---|")
    for label, note, a, b, c in rows:
        print(f"| {label} | {note} | {a:.1f} | {b:.1f} | {c:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
