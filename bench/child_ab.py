"""Two-arm A/B in child processes, shared by bench/tree_ab.py (two source trees) and the measurement-only define
A/Bs (guard_ab, loads_off_ab, stagger_ab: `define_ab`; l2_policy_ab, pdl_ab: `define_prelude`). The runtime caches plans per config, so two builds of one config cannot share
a process: each arm's child runs once per round, rounds alternating which arm goes first. A child times its
shapes' built-in calls (bench.run_kvforge: with the max_seq_len hint, as bench.py calls them; or e4m3 caches of
the same values, per-tensor or DeepSeek's packed token) by CUDA-graph replays and prints one line, "RESULT <json [[label, ms], ...]>".
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

BENCH_DIR = Path(__file__).resolve().parent

CHILD = r'''
import json, sys
sys.path.insert(0, {bench_dir!r})
{prelude}
from bench import SHAPES, SHORT_SHAPES, Shape, graph_ms, kv_copies, make_inputs, run_kvforge
import kvforge, torch
out = []
for sh in {shapes}:
    copies = kv_copies(sh.bytes())
    q, kv, bt, lens = make_inputs(sh, copies)
    if {fp8!r}:  # e4m3 caches of the same values (MLA) in that layout: per_tensor, fp8_ds_mla, block:<size>
        layout, _, blk = {fp8!r}.partition(":")
        kv = [kvforge.quantize_kv(k, layout, int(blk) if blk else None) for k, _ in kv]
        calls = [lambda i=i: kvforge.mla_decode(q, kv[i][0], bt, lens, kv_scale=kv[i][1], max_seq_len=sh.s_k)
                 for i in range(copies)]
    else:
        calls = [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]
    out.append((sh.label + (" fp8 " + {fp8!r} if {fp8!r} else ""), graph_ms(calls, 20)))
    del q, kv, calls
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
'''


def define_prelude(*macros: str) -> str:
    """A child prelude that compiles every variant with `#define macro 1` for each of `macros` in front of its source
    (measurement-only defines: the kernel's other arm of an A/B in the same run)."""
    defines = "".join(f"#define {m} 1\\n" for m in macros)
    return ('import kvforge.runtime.compiler as C\n_render = C.render_variant\n'
            f'C.render_variant = lambda v: "{defines}" + _render(v)')


def child_times(shapes: str, *, prelude: str = "", fp8: str = "", pythonpath: Path | None = None,
                cwd: Path | None = None) -> dict[str, float]:
    """{label: ms} from one child process: `shapes` a Python expression over bench's names (SHAPES,
    SHORT_SHAPES, Shape), `prelude` code run before kvforge is imported (a render patch, an assertion on
    which tree is imported), `fp8` an MLA cache layout of kvforge.quantize_kv ("per_tensor", "fp8_ds_mla", "block:128") to time
    instead of the 16-bit cache, `pythonpath` put first on the child's path (another tree's root)."""
    code = CHILD.format(bench_dir=str(BENCH_DIR), prelude=prelude, shapes=shapes, fp8=fp8)
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd)
    if r.returncode != 0:
        raise SystemExit(f"child failed (rc {r.returncode})\n{r.stderr[-4000:]}")
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[7:]))


def alternate_rounds(arms: dict[str, Callable[[], dict[str, float]]], rounds: int) -> dict[str, dict[str, list]]:
    """{arm: {label: [ms of round 0, 1, ...]}} over `rounds` runs of each arm's child, the arms' order reversed every
    round (so round r's two runs stand next to each other in time: their ratio is a paired one)."""
    names = list(arms)
    times: dict[str, dict[str, list]] = {n: {} for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            for label, ms in arms[name]().items():
                times[name].setdefault(label, []).append(ms)
    return times


def medians_of(times: dict[str, dict[str, list]]) -> dict[str, dict[str, float]]:
    """{arm: {label: median ms}} of `alternate_rounds`' times."""
    return {n: {label: statistics.median(v) for label, v in t.items()} for n, t in times.items()}


def print_ratio_table(medians: dict[str, dict[str, float]], a: str, b: str, a_title: str, b_title: str,
                      per_round: dict[str, dict[str, list]] | None = None) -> None:
    """A markdown table of both arms' medians per shape and a / b (> 1: arm b is faster). With `per_round`
    (`alternate_rounds`' times, two rounds or more) a last column gives the range of the rounds' own a / b: how far
    one round wanders (two trees' ratio inside that range of 1.0 is not told apart from the machine's noise; an A/A
    run, both arms one tree, measures that noise)."""
    spread = per_round is not None and has_rounds(per_round)
    print(f"| shape | {a_title} ms | {b_title} ms | {a_title} / {b_title} |" + (" per round (min-max) |" if spread else ""))
    print("|---|---|---|---|" + ("---|" if spread else ""))
    for label, ta in medians[a].items():
        tb = medians[b][label]
        row = f"| {label} | {ta:.4f} | {tb:.4f} | {ta / tb:.3f} |"
        if spread:
            row += f" {round_ratio_range(per_round, a, b, label)} |"
        print(row)


def print_arms_table(medians: dict[str, dict[str, float]], base: str, per_round: dict[str, dict[str, list]] | None = None,
                     base_title: str | None = None) -> None:
    """A markdown table of every arm's median per shape, then base / arm for each other arm (> 1: that arm is
    faster), each with its rounds' own range in parentheses where `per_round` has two rounds or more. Arms in
    `medians`' order; shapes as the base arm labels them (every arm must use the same labels)."""
    arms, title = list(medians), base_title or base
    others = [a for a in arms if a != base]
    spread = per_round is not None and has_rounds(per_round)
    print("| shape | " + " | ".join(f"{a} ms" for a in arms) + " | " + " | ".join(f"{title} / {a}" for a in others) + " |")
    print("|---|" + "---|" * (len(arms) + len(others)))
    for label, t0 in medians[base].items():
        print(f"| {label} | " + " | ".join(f"{medians[a][label]:.4f}" for a in arms) + " | "
              + " | ".join(f"{t0 / medians[a][label]:.3f}"
                           + (f" ({round_ratio_range(per_round, base, a, label)})" if spread else "")
                           for a in others) + " |")


def has_rounds(per_round: dict[str, dict[str, list]]) -> bool:
    """Whether every arm and label has two rounds or more (a range to show)."""
    return min(len(v) for t in per_round.values() for v in t.values()) >= 2


def round_ratio_range(per_round: dict[str, dict[str, list]], a: str, b: str, label: str) -> str:
    """"min-max" of the rounds' own a / b for one label (each round's two runs paired)."""
    ratios = [x / y for x, y in zip(per_round[a][label], per_round[b][label])]
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def define_ab(shapes: str, prelude: str, rounds: int, titles: tuple[str, str]) -> None:
    """The built-in calls on `shapes` as shipped against the same variants built under `prelude` (a `define_prelude`),
    `rounds` alternating rounds, printed as `print_ratio_table` with `titles` (as shipped, with the define)."""
    times = alternate_rounds({"a": lambda: child_times(shapes), "b": lambda: child_times(shapes, prelude=prelude)},
                             rounds)
    print_ratio_table(medians_of(times), "a", "b", *titles, per_round=times)
