"""A/B of the device-side input guard's cost: the same variants built with and without it
(KVFORGE_UNGUARDED_FOR_MEASUREMENT, a measurement-only define), on the benchmark's shapes.

    python bench/guard_ab.py [--rounds 3] [--short]

--short: MLA shapes of few tiles per CTA instead of the benchmark's (b=64 h=128 and b=128 h=64 at s_k=512, one
wave unsplit; b=32 h=128 s_k=1024, two chunks; b=1 s_k=32768 h=128), where a launch's fixed cost weighs most
(bench/overhead_fit.py: kvforge's sm90 MLA launches cost ~10-15 us more than FlashInfer's whatever the length).

Each variant runs in its own process (the runtime caches plans per config, and the two builds
share a config); rounds alternate which goes first. Prints the median per build and the ratio.
"""
import argparse
import json
import math
import statistics
import subprocess
import sys

CHILD = r'''
import json, math, sys
sys.path.insert(0, {bench_dir!r})
import kvforge.runtime.compiler as C
if {unguarded!r}:
    render = C.render_variant
    C.render_variant = lambda v: "#define KVFORGE_UNGUARDED_FOR_MEASUREMENT 1\n" + render(v)
from bench import L2_BYTES, SHAPES, Shape, graph_ms, make_inputs
import kvforge, torch
SHORT = [Shape("mla_decode", 64, 512, 128), Shape("mla_decode", 128, 512, 64), Shape("mla_decode", 32, 1024, 128),
         Shape("mla_decode", 1, 32768, 128)]
out = []
for sh in (SHORT if {short!r} else SHAPES):
    copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
    q, kv, bt, lens = make_inputs(sh, copies)
    if sh.family == "mla_decode":
        calls = [lambda i=i: kvforge.mla_decode(q, kv[i][0], bt, lens, causal=sh.s_q > 1) for i in range(copies)]
    else:
        calls = [lambda i=i: kvforge.gqa_decode(q, kv[i][0], kv[i][1], bt, lens) for i in range(copies)]
    out.append((sh.label, graph_ms(calls, 20)))
    del q, kv
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
'''


def run(unguarded: bool, short: bool) -> dict:
    code = CHILD.format(bench_dir=__file__.rsplit("/", 1)[0], unguarded=unguarded, short=short)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[7:]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", action="store_true", help="MLA shapes of few tiles per CTA (fixed costs)")
    args = ap.parse_args()
    times: dict[str, dict[str, list]] = {"guarded": {}, "unguarded": {}}
    for r in range(args.rounds):
        for mode in (("guarded", "unguarded") if r % 2 == 0 else ("unguarded", "guarded")):
            for label, ms in run(mode == "unguarded", args.short).items():
                times[mode].setdefault(label, []).append(ms)
    print("| shape | guarded ms | unguarded ms | guarded / unguarded |")
    print("|---|---|---|---|")
    for label in times["guarded"]:
        g, u = statistics.median(times["guarded"][label]), statistics.median(times["unguarded"][label])
        print(f"| {label} | {g:.4f} | {u:.4f} | {g / u:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
