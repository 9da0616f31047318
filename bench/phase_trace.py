"""Where a launch's fixed cost goes: per-CTA timestamps of the sm90 MLA kernel's phases
(templates/cuda/include/kvforge/phase_trace.cuh, compiled in by KVFORGE_PHASE_TRACE, a measurement-only
define), on short and long launches, L2 flushed before each traced call.

    python bench/phase_trace.py [--rounds 5] [--shape b,s_k,heads ...]

Per shape: the call's CUDA-event time, the CTAs' entry skew, then for each mark the median (p10, p90)
over CTAs of its time after the CTA's entry (SM cycles converted with the CTA's own global-timer span),
and the CTAs' exits after the first entry. bench/overhead_fit.py says how large the fixed cost is;
this says which phase holds it (guard, barrier setup, the first TMA's latency, Q, the first QK,
the epilogue's row-sum exchange and stores, the merge).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import kvforge.runtime.compiler as C  # noqa: E402

_render = C.render_variant
C.render_variant = lambda v: "#define KVFORGE_PHASE_TRACE 1\n" + _render(v)

from bench import Shape, make_inputs  # noqa: E402

import kvforge  # noqa: E402
from kvforge.runtime import launch  # noqa: E402

SLOTS, MAX_CTAS = 24, 8192
MARKS = {  # slot: what the mark follows (templates/cuda/decode_sm90.cu.j2, sm90_seesaw.j2, sm90_producers.j2)
    3: "plan + guard (thread 0)",
    4: "barriers initialized",
    5: "first tile's TMA issued (producer)",
    7: "Q in shared memory (math)",
    8: "first tile landed (math)",
    9: "first QK done (seesaw)",
    6: "last tile's TMA issued (producer)",
    10: "every tile consumed (warpgroup 0)",
    11: "every tile consumed (warpgroup 1)",
    12: "epilogue: row sums exchanged",
    16: "epilogue: rows staged (thread 128, before the barrier)",
    17: "epilogue: past the staged rows' barrier",
    13: "epilogue: out/lse or partials stored",
    18: "epilogue: stored (thread 383, the last math thread)",
    14: "exit (after the merge, if any)",
}
DEFAULT_SHAPES = ["64,512,128", "64,4096,128", "128,4096,64", "32,2048,128", "1,32768,128"]


def trace_globals() -> list[tuple[int, int]]:
    """(device pointer, bytes) of every loaded module's kvforge_phase_trace."""
    from cuda.bindings import driver
    found = []
    for module in launch.loaded_modules():
        err, ptr, size = driver.cuLibraryGetGlobal(module.handle, b"kvforge_phase_trace")
        if err == driver.CUresult.CUDA_SUCCESS:
            found.append((int(ptr), int(size)))
    return found


def read_traces() -> list[np.ndarray]:
    from cuda.bindings import driver
    out = []
    for ptr, size in trace_globals():
        host = np.zeros(size // 8, dtype=np.uint64)
        (err,) = driver.cuMemcpyDtoH(host.ctypes.data, ptr, size)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        rows = host.reshape(MAX_CTAS, SLOTS)
        rows = rows[rows[:, 0] != 0]
        if len(rows):
            out.append(rows)
    return out


def clear_traces() -> None:
    from cuda.bindings import driver
    for ptr, size in trace_globals():
        (err,) = driver.cuMemsetD8(ptr, 0, size)
        assert err == driver.CUresult.CUDA_SUCCESS, err


def analyse(rows: np.ndarray) -> dict:
    """Per slot: microseconds after each CTA's entry (the SM's cycles scaled by its global-timer span)."""
    rows = rows.astype(np.int64)
    t0 = rows[:, 0].min()
    cycles = rows[:, 14] - rows[:, 2]
    ns = rows[:, 15] - rows[:, 0]
    ok = (rows[:, 14] > 0) & (cycles > 0)
    ns_per_cycle = float(np.median(ns[ok] / cycles[ok])) if ok.any() else 1 / 1.98
    res = {"ctas": len(rows), "sms": len(set(rows[:, 1].tolist())), "ns_per_cycle": ns_per_cycle,
           "entry": (rows[:, 0] - t0) / 1e3, "exit": (rows[ok, 15] - t0) / 1e3, "marks": {}}
    for slot in MARKS:
        have = rows[:, slot] > 0
        if have.any():
            res["marks"][slot] = (rows[have, slot] - rows[have, 2]) * ns_per_cycle / 1e3
    return res


def pct(a, q) -> float:
    return float(np.percentile(a, q))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shape", nargs="*", default=DEFAULT_SHAPES, help="b,s_k,heads (MLA, page 64, s_q 1)")
    args = ap.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for spec in args.shape:
        b, s_k, heads = (int(x) for x in spec.split(","))
        sh = Shape("mla_decode", b, s_k, heads)
        q, kv, bt, lens = make_inputs(sh, 1)
        call = lambda: kvforge.mla_decode(q, kv[0][0], bt, lens)  # noqa: E731
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        per_round, times = [], []
        for _ in range(args.rounds):
            flush.zero_()
            clear_traces()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            call()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3)
            traces = read_traces()
            if len(traces) != 1:
                print(f"{spec}: {len(traces)} traced modules (expected one sm90 kernel); is it an sm90 variant?")
                break
            per_round.append(analyse(traces[0]))
        if not per_round:
            continue
        print(f"\n## MLA b={b} s_k={s_k} heads={heads}: {per_round[0]['ctas']} CTAs on {per_round[0]['sms']} SMs, "
              f"call {statistics.median(times):.1f} us (CUDA events, eager, L2 flushed), "
              f"{per_round[0]['ns_per_cycle']:.3f} ns/cycle")
        print("| mark | median us after the CTA's entry | p10 | p90 |\n|---|---|---|---|")
        for what, key in (("CTA entry after the first CTA's", "entry"),):
            vals = np.concatenate([r[key] for r in per_round])
            print(f"| {what} | {pct(vals, 50):.2f} | {pct(vals, 10):.2f} | {pct(vals, 90):.2f} |")
        for slot, label in MARKS.items():
            vals = [r["marks"][slot] for r in per_round if slot in r["marks"]]
            if vals:
                v = np.concatenate(vals)
                print(f"| {label} | {pct(v, 50):.2f} | {pct(v, 10):.2f} | {pct(v, 90):.2f} |")
        ex = np.concatenate([r["exit"] for r in per_round])
        print(f"| CTA exit after the first CTA's entry | {pct(ex, 50):.2f} | {pct(ex, 10):.2f} | {pct(ex, 90):.2f} "
              f"(max {ex.max():.2f}) |")
        del q, kv
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
