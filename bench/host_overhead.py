"""Host time per eager decode call, next to FlashInfer's run() on the same inputs, same process.

    python bench/host_overhead.py [--profile]

For each shape: kvforge's default functional call (kvforge.mla_decode / gqa_decode, no extra
arguments), the plan/run object (MLADecode / GQADecode .run), MLA's call with the max_seq_len hint and
FlashInfer's wrapper run(), each
timed as 7 batches of 200 back-to-back calls with no synchronisation inside a batch (host
microseconds per call). Each batch is queued behind a ~25 ms GPU sleep kernel, so the calls only
enqueue while they are timed: what is measured is the host, never the GPU's speed on the shape. Reported: the median batch and, in brackets, the best batch; the paths are
interleaved batch by batch so a noisy neighbour on the host hits all of them alike.
`--profile` adds a cProfile of the default call.
"""
import argparse
import cProfile
import pstats
import statistics
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


def host_us(fns, n=200, batches=7):
    """(median, best) microseconds per call for each of `fns`, batches interleaved."""
    for fn in fns:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    per = [[] for _ in fns]
    for _ in range(batches):
        for i, fn in enumerate(fns):
            torch.cuda._sleep(50_000_000)  # the GPU is busy for the whole batch: calls only enqueue
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            per[i].append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
    return [(statistics.median(p), min(p)) for p in per]


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
        # MLA's call with the max_seq_len hint (what bench.py passes): its per-call cost is the threshold lookup
        hinted = (lambda: kvforge.mla_decode(q, k, bt, lens, max_seq_len=sh.s_k)) if sh.family == "mla_decode" else None
        fns = [default, planned] + ([hinted] if hinted else [])
        try:
            fi = flashinfer_runner(sh, q, kv, bt, lens)
            fns.append(lambda: fi(0))
        except Exception as err:  # noqa: BLE001
            print(f"FlashInfer unavailable for {sh.label}: {type(err).__name__}: {err}", file=sys.stderr)
            fns.append(None)
        times = host_us([f for f in fns if f is not None])
        it = iter(times)
        times = [next(it) if f is not None else (float("nan"), float("nan")) for f in fns]
        if hinted is None:
            times.insert(2, (float("nan"), float("nan")))
        rows.append((sh.label, note, *times))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                default()
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(10)
    print("| shape | path | kvforge default call, host us | kvforge plan .run(), host us | kvforge call with max_seq_len, "
          "host us | FlashInfer run(), host us |")
    print("|---|---|---|---|---|---|")
    for label, note, *cols in rows:
        print(f"| {label} | {note} | " + " | ".join(f"{m:.1f} ({b:.1f})" for m, b in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
