"""bench/ncu_stalls.py on a small export shaped like ncu's `--page source --csv --print-source sass`."""
import importlib.util
from pathlib import Path

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]
ROWS = [
    ["0x10", "      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1+URZ], R2", "10", "9", "100", "2", "8", "1"],
    ["0x20", " @!P0  BRA 0x10", "70", "69", "100", "70", "0", "69"],
    ["0x30", "      F2FP.F16.E4M3.UNPACK_B R4, R4", "20", "10", "300", "0", "20", "0"],
]


def _tool():
    path = Path(__file__).resolve().parents[1] / "bench" / "ncu_stalls.py"
    spec = importlib.util.spec_from_file_location("ncu_stalls", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(tmp_path):
    lines = ['"Kernel Name","kvforge_x",', ",".join(f'"{h}"' for h in HEADER)]
    lines += [",".join(f'"{c}"' for c in row) for row in ROWS]
    p = tmp_path / "src.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_stall_reasons_are_shares_of_all_samples_without_the_not_issued_columns(tmp_path):
    tool = _tool()
    header, rows = tool.read_source_csv(str(_write(tmp_path)))
    assert [r["Address"] for r in rows] == ["0x10", "0x20", "0x30"]
    assert tool.stall_reasons(header, rows) == {"long_sb": 0.72, "wait": 0.28}


def test_opcode_mix_keeps_the_modifier_of_conversions_and_drops_predicates(tmp_path):
    tool = _tool()
    _, rows = tool.read_source_csv(str(_write(tmp_path)))
    mix = tool.opcode_mix(rows)
    assert mix == {"SYNCS.PHASECHK": 100, "BRA": 100, "F2FP.F16": 300}


def test_the_report_names_the_hottest_instruction_with_its_reason(tmp_path, capsys):
    tool = _tool()
    assert tool.main([str(_write(tmp_path)), "--top", "1", "--context", "1"]) == 0
    out = capsys.readouterr().out
    assert "100 stall samples" in out and "by reason: long_sb 72.0%, wait 28.0%" in out
    hot = [ln for ln in out.splitlines() if "70.0%" in ln]
    assert len(hot) == 1 and "BRA" in hot[0] and "long_sb 70.0%" in hot[0]
    assert "TRYWAIT" in out  # the context line before it: which barrier the branch waits on
