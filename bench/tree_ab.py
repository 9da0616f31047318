"""A/B of two kvforge source trees on the same shapes: this checkout against another (a `git worktree` of
the base commit, its codegen/runtime/templates reachable as the package `kvforge`), each in its own process
(the runtime caches plans per config, and both trees share config names), rounds alternating which goes
first. Times the built-in call (as bench.py makes it: with the max_seq_len hint) by CUDA-graph replays.

    python bench/tree_ab.py --base /path/to/base/checkout [--rounds 3] [--shapes quick|short|all]

quick: bench.py's MLA shapes; short: launches of few tiles per CTA (where a launch's fixed cost weighs:
bench/overhead_fit.py, bench/phase_trace.py); all: both; fp8: three of them on per-tensor e4m3 caches. Prints the median per tree and base / this (> 1: this
tree is faster).
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r'''
import json, math, sys
sys.path.insert(0, {bench_dir!r})
from bench import L2_BYTES, SHAPES, Shape, graph_ms, make_inputs
import kvforge, torch
assert kvforge.__file__.startswith({root!r}), (kvforge.__file__, {root!r})
SHORT = [Shape("mla_decode", 64, 512, 128), Shape("mla_decode", 128, 512, 64), Shape("mla_decode", 32, 1024, 128),
         Shape("mla_decode", 32, 2048, 128), Shape("mla_decode", 1, 32768, 128), Shape("mla_decode", 64, 4096, 128)]
QUICK = [sh for sh in SHAPES if sh.family == "mla_decode"]
FP8 = [Shape("mla_decode", 128, 4096, 128), Shape("mla_decode", 128, 4096, 64), Shape("mla_decode", 32, 8192, 128)]
shapes = {{"quick": QUICK, "short": SHORT, "all": QUICK + SHORT, "fp8": FP8}}[{which!r}]
out = []
for sh in shapes:
    copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
    q, kv, bt, lens = make_inputs(sh, copies)
    if {which!r} == "fp8":  # per-tensor e4m3 caches of the same values
        kv = [kvforge.quantize_kv(k, "per_tensor") for k, _ in kv]
        calls = [lambda i=i: kvforge.mla_decode(q, kv[i][0], bt, lens, kv_scale=kv[i][1], max_seq_len=sh.s_k)
                 for i in range(copies)]
    else:
        calls = [lambda i=i: kvforge.mla_decode(q, kv[i][0], bt, lens, causal=sh.s_q > 1, max_seq_len=sh.s_k)
                 for i in range(copies)]
    out.append((sh.label + (" fp8 per-tensor" if {which!r} == "fp8" else ""), graph_ms(calls, 20)))
    del q, kv
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
'''


def run(root: Path, which: str) -> dict:
    code = CHILD.format(bench_dir=str(HERE), root=str(root), which=which)
    env = {**__import__("os").environ, "PYTHONPATH": f"{root}:{__import__('os').environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
    if r.returncode != 0:
        raise SystemExit(f"{root}: child failed (rc {r.returncode})\n{r.stderr[-4000:]}")
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[7:]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (its root holds kvforge/)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", choices=("quick", "short", "all", "fp8"), default="all")
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE.parent}
    times: dict[str, dict[str, list]] = {"base": {}, "this": {}}
    for r in range(args.rounds):
        for name in (("base", "this") if r % 2 == 0 else ("this", "base")):
            for label, ms in run(trees[name], args.shapes).items():
                times[name].setdefault(label, []).append(ms)
    print(f"| shape | base ms ({trees['base']}) | this ms | base / this |")
    print("|---|---|---|---|")
    for label in times["base"]:
        b, t = statistics.median(times["base"][label]), statistics.median(times["this"][label])
        print(f"| {label} | {b:.4f} | {t:.4f} | {b / t:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
