"""A/B of the combine kernel's launch on sm_90: programmatic dependent launch (KVFORGE_PDL=1: its CTAs
may start while the main kernel drains and wait for it with griddepcontrol.wait) against the plain
launch (KVFORGE_PDL=0), on the shapes whose sequences are split.

    python bench/pdl_ab.py [--rounds 2] [--early-trigger] [--sm80-exit-trigger]

Each round runs one child process per setting, alternating which goes first; each child times
every shape (CUDA-graph replays, KV copies rotating past the L2) and checks its output against
the first setting's. Prints the median per setting and the ratio.

--early-trigger adds a third setting: PDL with the sm90 kernels built with a trigger after their main loop
(KVFORGE_PDL_EARLY_TRIGGER_FOR_MEASUREMENT, a measurement-only define), as the sm80 kernels have it; the shipped
sm90 kernels trigger the combine's launch only by exiting. Measured (bench/RESULTS.md, twenty-eighth session): with
the early trigger PDL made the sm90 b=1 and b=32 h=128 calls 3-5% slower than the plain launch, without it 1-3% faster.
--sm80-exit-trigger adds the converse: PDL with the sm80 kernels built without their trigger
(KVFORGE_PDL_SM80_EXIT_TRIGGER_FOR_MEASUREMENT), so they too trigger the combine by exiting.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from child_ab import define_prelude

CHILD = r'''
import json, math, sys
sys.path.insert(0, {bench!r})
{prelude}
import torch
from bench import L2_BYTES, Shape, graph_ms, make_inputs, run_kvforge
out = {{}}
for sh in (Shape("gqa_decode", 1, 65536, 32, 8, 128, page=16), Shape("gqa_decode", 4, 32768, 32, 8, 128, page=16),
           Shape("mla_decode", 1, 32768, 128), Shape("mla_decode", 32, 8192, 128), Shape("mla_decode", 4, 16384, 64),
           Shape("mla_decode", 16, 4096, 128), Shape("mla_decode", 2, 16384, 16)):
    copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
    q, kv, bt, lens = make_inputs(sh, copies)
    ms = graph_ms([lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)], 30)
    o = run_kvforge(sh, q, *kv[0], bt, lens).float()
    out[sh.label] = (ms, float(o.norm()), float(o.sum()))
    del q, kv
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
'''


# setting: (KVFORGE_PDL, child prelude)
SETTINGS = {"1": ("1", ""), "0": ("0", ""), "early": ("1", define_prelude("KVFORGE_PDL_EARLY_TRIGGER_FOR_MEASUREMENT")),
            "sm80_exit": ("1", define_prelude("KVFORGE_PDL_SM80_EXIT_TRIGGER_FOR_MEASUREMENT"))}
# the optional settings: (option, column title)
EXTRA = {"early": ("early_trigger", "early-trigger PDL (sm90)"),
         "sm80_exit": ("sm80_exit_trigger", "exit-trigger PDL (sm80)")}


def child(setting: str) -> dict:
    pdl, prelude = SETTINGS[setting]
    env = {**os.environ, "KVFORGE_PDL": pdl}
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), prelude=prelude)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"setting {setting!r} (KVFORGE_PDL={pdl}) child failed: {r.stderr[-2000:]}")
    return json.loads(line[0][7:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--early-trigger", action="store_true", help="also PDL with the sm90 kernels triggering the "
                    "combine after their main loop")
    ap.add_argument("--sm80-exit-trigger", action="store_true", help="also PDL with the sm80 kernels triggering the "
                    "combine by exiting")
    args = ap.parse_args()
    extra = [n for n, (opt, _) in EXTRA.items() if getattr(args, opt)]
    names = ["1", "0"] + extra
    runs = {n: [] for n in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            runs[name].append(child(name))
    ref = runs["0"][0]
    titles = "".join(f" | {EXTRA[n][1]} ms | plain / {EXTRA[n][1]}" for n in extra)
    print(f"| shape | PDL ms | plain ms | plain / PDL{titles} | same output |")
    print("|---|---|---|---|" + "---|---|" * len(extra) + "---|")
    for label in ref:
        med = {n: statistics.median(x[label][0] for x in runs[n]) for n in names}
        same = all(abs(x[label][1] - ref[label][1]) <= 1e-6 * abs(ref[label][1]) for n in names for x in runs[n])
        cols = f"| {label} | {med['1']:.4f} | {med['0']:.4f} | {med['0'] / med['1']:.3f}"
        cols += "".join(f" | {med[n]:.4f} | {med['0'] / med[n]:.3f}" for n in extra)
        print(f"{cols} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
