"""Summarise Nsight Compute's per-instruction source view of one kernel: where its warps stall and
which instructions it executes.

    ncu --clock-control none -k regex:kvforge --launch-count 1 --section SourceCounters \\
        --section WarpStateStats -o prof python3 bench/profile_case.py 3
    ncu --import prof.ncu-rep --page source --csv --print-source sass > prof.csv
    python bench/ncu_stalls.py prof.csv [--top 30] [--context 12]

Prints the stall reasons' shares of all warp-stall samples, the instructions holding the most
samples (each with its top reasons and, with --context, the instructions before it, to tell which
barrier a wait is on) and the executed-instruction mix by opcode. Plain text, no GPU needed.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_source_csv(path: str) -> tuple[list[str], list[dict]]:
    """(header, rows) of ncu's `--page source --csv` export: a 'Kernel Name' line, then the header."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    start = next(i for i, row in enumerate(lines) if row and row[0] == "Address")
    header = lines[start]
    return header, [dict(zip(header, row)) for row in lines[start + 1:] if len(row) == len(header)]


def stall_reasons(header: list[str], rows: list[dict]) -> dict[str, float]:
    """Each reason's share of all stall samples (the 'stall_*' columns, not-issued ones left out)."""
    cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(_num(r[SAMPLES]) for r in rows) or 1.0
    return {c[len("stall_"):]: sum(_num(r[c]) for r in rows) / total for c in cols}


def opcode(source: str) -> str:
    """The opcode of a SASS line, predicate dropped, with its first modifier for a few families
    whose variants cost differently (F2FP.F16, HMMA.16816, LDS.64, ...)."""
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    parts = text.split(" ")[0].split(".")
    keep_modifier = parts[0] in ("F2FP", "HMMA", "HGMMA", "LDS", "LDSM", "MUFU", "PRMT", "SYNCS")
    return ".".join(parts[:2]) if keep_modifier else parts[0]


def opcode_mix(rows: list[dict]) -> collections.Counter:
    mix: collections.Counter = collections.Counter()
    for r in rows:
        mix[opcode(r["Source"])] += _num(r.get(EXECUTED, "0"))
    return mix


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=25, help="instructions to list by stall samples")
    ap.add_argument("--context", type=int, default=0, help="instructions shown before each listed one")
    ap.add_argument("--mix", type=int, default=20, help="opcodes to list by executed count")
    args = ap.parse_args(argv)
    header, rows = read_source_csv(args.csv)
    total = sum(_num(r[SAMPLES]) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    reasons = sorted(stall_reasons(header, rows).items(), key=lambda kv: -kv[1])
    print("by reason: " + ", ".join(f"{k} {v:.1%}" for k, v in reasons if v >= 0.005))
    cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    top = sorted(range(len(rows)), key=lambda i: -_num(rows[i][SAMPLES]))[: args.top]
    for i in sorted(top):
        r = rows[i]
        why = sorted(((_num(r[c]), c[len("stall_"):]) for c in cols), reverse=True)[:3]
        for j in range(max(0, i - args.context), i):
            print(f"      {j:6d}        {rows[j]['Source'].strip()[:90]}")
        print(f"{i:6d} {_num(r[SAMPLES]) / total:6.1%}  {r['Source'].strip()[:70]:70s}  "
              + " ".join(f"{name} {v / total:.1%}" for v, name in why if v))
    mix = opcode_mix(rows)
    executed = sum(mix.values()) or 1.0
    print(f"executed warp instructions: {executed:.0f}")
    for name, count in mix.most_common(args.mix):
        print(f"  {name:20s} {count:14.0f} {count / executed:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
