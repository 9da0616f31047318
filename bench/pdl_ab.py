"""A/B of the combine kernel's launch on sm_90: programmatic dependent launch (KVFORGE_PDL=1: its CTAs
may start while the main kernel drains and wait for it with griddepcontrol.wait) against the plain
launch (KVFORGE_PDL=0), on the shapes whose sequences are split.

    python bench/pdl_ab.py [--rounds 2]

Each round runs one child process per setting, alternating which goes first; each child times
every shape (CUDA-graph replays, KV copies rotating past the L2) and checks its output against
the first setting's. Prints the median per setting and the ratio.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import json, math, sys
sys.path.insert(0, {bench!r})
import torch
from bench import L2_BYTES, Shape, graph_ms, make_inputs, run_kvforge
out = {{}}
for sh in (Shape("gqa_decode", 1, 65536, 32, 8, 128, page=16), Shape("gqa_decode", 4, 32768, 32, 8, 128, page=16),
           Shape("mla_decode", 1, 32768, 128), Shape("mla_decode", 32, 8192, 128), Shape("mla_decode", 2, 16384, 16)):
    copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
    q, kv, bt, lens = make_inputs(sh, copies)
    ms = graph_ms([lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)], 30)
    o = run_kvforge(sh, q, *kv[0], bt, lens).float()
    out[sh.label] = (ms, float(o.norm()), float(o.sum()))
    del q, kv
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
'''


def child(pdl: str) -> dict:
    env = {**os.environ, "KVFORGE_PDL": pdl}
    r = subprocess.run([sys.executable, "-c", CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)))],
                       capture_output=True, text=True, env=env)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"KVFORGE_PDL={pdl} child failed: {r.stderr[-2000:]}")
    return json.loads(line[0][7:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    runs = {"1": [], "0": []}
    for r in range(args.rounds):
        for pdl in (("1", "0") if r % 2 == 0 else ("0", "1")):
            runs[pdl].append(child(pdl))
    ref = runs["0"][0]
    print("| shape | PDL ms | plain ms | plain / PDL | same output |")
    print("|---|---|---|---|---|")
    for label in ref:
        a = statistics.median(x[label][0] for x in runs["1"])
        b = statistics.median(x[label][0] for x in runs["0"])
        same = all(abs(x[label][1] - ref[label][1]) <= 1e-6 * abs(ref[label][1]) for x in runs["1"])
        print(f"| {label} | {a:.4f} | {b:.4f} | {b / a:.3f} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
