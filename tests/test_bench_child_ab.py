"""bench/child_ab.py (tree_ab's and guard_ab's child-process A/B) without a GPU: the child programs each tool
renders are valid Python that imports what it uses, and the rounds alternate the arms and keep medians."""
import ast
import builtins
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _names(tree: ast.AST) -> tuple[set, set]:
    """(names bound by imports, assignments and definitions, names loaded) in a program."""
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return bound, loaded


def test_every_child_program_parses_and_binds_what_it_uses(bench_tool):
    child_ab, tree_ab, guard_ab = bench_tool("child_ab"), bench_tool("tree_ab"), bench_tool("guard_ab")
    programs = [child_ab.CHILD.format(bench_dir=str(BENCH), prelude="", shapes=expr, fp8=tree_ab.FP8_LAYOUT.get(which, ""))
                for which, expr in tree_ab.SHAPES.items()]
    assert {tree_ab.FP8_LAYOUT[w] for w in ("fp8_16", "fp8_ds_mla_16", "fp8_block_16")} == {"per_tensor", "fp8_ds_mla",
                                                                                         "block:128"}
    stagger_ab = bench_tool("stagger_ab")
    programs += [child_ab.CHILD.format(bench_dir=str(BENCH), prelude=stagger_ab.STAGGER, shapes=expr, fp8=False)
                 for expr in stagger_ab.SHAPES.values()]
    programs.append(child_ab.CHILD.format(bench_dir=str(BENCH), prelude=guard_ab.UNGUARDED, shapes="SHORT_SHAPES",
                                          fp8=False))
    known = set(dir(builtins))
    for code in programs:
        bound, loaded = _names(ast.parse(code))
        assert loaded - bound - known == set(), (loaded - bound - known, code)
    assert "KVFORGE_STAGGER_START_FOR_MEASUREMENT" in programs[-2]
    assert "KVFORGE_UNGUARDED_FOR_MEASUREMENT" in programs[-1]


def test_l2_policy_arms_are_valid_child_programs(bench_tool):
    """bench/l2_policy_ab.py: every arm's prelude makes a child program that parses and binds what it uses; the
    promotion arms name real CUtensorMapL2promotion values and re-encode through tensor_map._enums, the evict_first
    arm defines the header's measurement-only macro."""
    child_ab, tool = bench_tool("child_ab"), bench_tool("l2_policy_ab")
    known = set(dir(builtins))
    for arm, prelude in tool.ARMS.items():
        code = child_ab.CHILD.format(bench_dir=str(BENCH), prelude=prelude, shapes=tool.SHAPES, fp8=False)
        bound, loaded = _names(ast.parse(code))
        assert loaded - bound - known == set(), (arm, loaded - bound - known)
    header = (BENCH.parent / "templates/cuda/include/kvforge/sm90_tile.cuh").read_text()
    assert "KVFORGE_TMA_EVICT_FIRST_FOR_MEASUREMENT" in tool.ARMS["evict_first"] and \
        "#ifdef KVFORGE_TMA_EVICT_FIRST_FOR_MEASUREMENT" in header
    assert "CU_TENSOR_MAP_L2_PROMOTION_L2_128B" in tool.ARMS["128B"] and "TM._enums = _patched" in tool.ARMS["128B"]
    from cuda.bindings import driver
    for value in ("CU_TENSOR_MAP_L2_PROMOTION_L2_128B", "CU_TENSOR_MAP_L2_PROMOTION_NONE"):
        assert hasattr(driver.CUtensorMapL2promotion, value)


def test_l2_policy_unknown_arm_is_a_clear_error(bench_tool, monkeypatch, capsys):
    """bench/l2_policy_ab.py --arms with a name it does not know stops before any child runs, naming the arm and
    the choices."""
    tool = bench_tool("l2_policy_ab")
    monkeypatch.setattr(sys, "argv", ["l2_policy_ab.py", "--arms", "128B,evict_last"])
    monkeypatch.setattr(tool, "alternate_rounds", lambda *a, **k: (_ for _ in ()).throw(AssertionError("a child ran")))
    try:
        tool.main()
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("no error")
    err = capsys.readouterr().err
    assert "--arms: unknown ['evict_last']" in err and "'128B', 'none', 'evict_first'" in err


def test_rounds_alternate_the_arms_and_report_medians(bench_tool, capsys):
    child_ab = bench_tool("child_ab")
    order, times = [], {"a": iter([1.0, 3.0, 2.0]), "b": iter([2.0, 2.0, 8.0])}

    def arm(name):
        def run():
            order.append(name)
            return {"shape": next(times[name])}
        return run

    medians = child_ab.medians_of(child_ab.alternate_rounds({"a": arm("a"), "b": arm("b")}, rounds=3))
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert medians == {"a": {"shape": 2.0}, "b": {"shape": 2.0}}
    child_ab.print_ratio_table(medians, "a", "b", "base", "this")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| shape | base ms | this ms | base / this |" and out[2] == "| shape | 2.0000 | 2.0000 | 1.000 |"


def test_the_ratio_table_gives_the_rounds_own_ratios_range(bench_tool, capsys):
    """Each round's two runs are paired: round r's a / b, and the table's last column their range."""
    child_ab = bench_tool("child_ab")
    times = {"a": iter([1.0, 3.0, 2.0]), "b": iter([2.0, 2.0, 8.0])}
    per_round = child_ab.alternate_rounds({n: (lambda n=n: {"shape": next(times[n])}) for n in "ab"}, rounds=3)
    assert per_round == {"a": {"shape": [1.0, 3.0, 2.0]}, "b": {"shape": [2.0, 2.0, 8.0]}}
    child_ab.print_ratio_table(child_ab.medians_of(per_round), "a", "b", "base", "this", per_round=per_round)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("| base / this | per round (min-max) |") and out[1].count("|") == 6
    assert out[2] == "| shape | 2.0000 | 2.0000 | 1.000 | 0.250-1.500 |"
    one = {"a": {"shape": [1.0]}, "b": {"shape": [2.0]}}  # one round: no range column
    child_ab.print_ratio_table(child_ab.medians_of(one), "a", "b", "base", "this", per_round=one)
    assert capsys.readouterr().out.splitlines()[2] == "| shape | 1.0000 | 2.0000 | 0.500 |"


def test_pdl_ab_settings_are_valid_child_programs(bench_tool):
    """bench/pdl_ab.py: every setting's child program parses and binds what it uses; the early-trigger setting runs
    with PDL on and compiles the sm90 kernels with the measurement-only define the template tests for."""
    tool = bench_tool("pdl_ab")
    known = set(dir(builtins))
    for name, (pdl, prelude) in tool.SETTINGS.items():
        code = tool.CHILD.format(bench=str(BENCH), prelude=prelude)
        bound, loaded = _names(ast.parse(code))
        assert loaded - bound - known == set(), (name, loaded - bound - known)
    assert tool.SETTINGS["early"][0] == "1" and "KVFORGE_PDL_EARLY_TRIGGER_FOR_MEASUREMENT" in tool.SETTINGS["early"][1]
    template = (BENCH.parent / "templates/cuda/decode_sm90.cu.j2").read_text()
    assert "#ifdef KVFORGE_PDL_EARLY_TRIGGER_FOR_MEASUREMENT" in template
    assert tool.SETTINGS["sm80_exit"][0] == "1"
    assert "KVFORGE_PDL_SM80_EXIT_TRIGGER_FOR_MEASUREMENT" in tool.SETTINGS["sm80_exit"][1]
    sm80 = (BENCH.parent / "templates/cuda/decode_sm80.cu.j2").read_text()
    assert "#ifndef KVFORGE_PDL_SM80_EXIT_TRIGGER_FOR_MEASUREMENT" in sm80
    assert set(tool.EXTRA) == set(tool.SETTINGS) - {"0", "1"}


def test_fp8_slot_parts_arms_define_what_the_slot_producer_reads(bench_tool, monkeypatch, capsys):
    """bench/fp8_slot_parts_ab.py: the fp8 arms time per-tensor caches, each switched-off arm's prelude defines the
    measurement-only macros the slot producer's template tests (both for "neither"), every child program parses and
    binds what it uses, and the table matches the fp8 children's labels (the layout appended) to the 16-bit ones."""
    child_ab, tool = bench_tool("child_ab"), bench_tool("fp8_slot_parts_ab")
    template = (BENCH.parent / "templates/cuda/sm90_producers.j2").read_text()
    for macro in (tool.NO_CONVERT, tool.NO_LOADS):
        assert f"#ifdef {macro}" in template
    arms = tool.ARMS
    assert "prelude" not in arms["16-bit"] and "fp8" not in arms["16-bit"]
    assert all(kw["fp8"] == "per_tensor" for name, kw in arms.items() if name != "16-bit")
    assert tool.NO_CONVERT in arms["fp8 no convert"]["prelude"] and tool.NO_LOADS not in arms["fp8 no convert"]["prelude"]
    assert tool.NO_LOADS in arms["fp8 no loads"]["prelude"] and tool.NO_CONVERT not in arms["fp8 no loads"]["prelude"]
    assert tool.NO_LOADS in arms["fp8 neither"]["prelude"] and tool.NO_CONVERT in arms["fp8 neither"]["prelude"]
    known = set(dir(builtins))
    for name, kw in arms.items():
        code = child_ab.CHILD.format(bench_dir=str(BENCH), prelude=kw.get("prelude", ""), shapes=tool.SHAPES,
                                     fp8=kw.get("fp8", ""))
        bound, loaded = _names(ast.parse(code))
        assert loaded - bound - known == set(), (name, loaded - bound - known)

    def fake(shapes, *, prelude="", fp8=""):
        slow = {"": 1.0, child_ab.define_prelude(tool.NO_CONVERT): 0.5}.get(prelude, 0.25)
        return {"MLA h=64" + (f" fp8 {fp8}" if fp8 else ""): (1.0 if not fp8 else 2.0 * slow)}

    monkeypatch.setattr(tool, "child_times", fake)
    monkeypatch.setattr(sys, "argv", ["fp8_slot_parts_ab.py", "--rounds", "1"])
    assert tool.main() == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| MLA h=64 |"))
    assert row == "| MLA h=64 | 1.0000 | 2.0000 | 1.0000 | 0.5000 | 0.5000 | 0.500 | 1.000 | 2.000 | 2.000 |"


def test_arms_table_gives_each_ratio_with_its_rounds_range(bench_tool, capsys):
    """child_ab.print_arms_table (l2_policy_ab, fp8_slot_parts_ab): every arm's median, then base / arm for the
    others, each followed by the range of the rounds' own ratios once there are two rounds."""
    child_ab = bench_tool("child_ab")
    per_round = {"shipped": {"S": [1.0, 1.2]}, "x": {"S": [0.5, 1.2]}}
    child_ab.print_arms_table(child_ab.medians_of(per_round), "shipped", per_round)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| shape | shipped ms | x ms | shipped / x |"
    assert out[2] == "| S | 1.1000 | 0.8500 | 1.294 (1.000-2.000) |"


def test_define_ab_times_both_builds_and_prints_the_titles(bench_tool, monkeypatch, capsys):
    """child_ab.define_ab: arm one without a prelude, arm two with the define's, alternating rounds, one table row
    per shape under the given titles with as-shipped / defined."""
    child_ab = bench_tool("child_ab")
    calls = []

    def fake(shapes, *, prelude=""):
        calls.append(prelude)
        return {"S": 2.0 if prelude else 1.0}

    monkeypatch.setattr(child_ab, "child_times", fake)
    child_ab.define_ab("SHAPES", child_ab.define_prelude("X_FOR_MEASUREMENT"), 2, ("as shipped", "with X"))
    out = capsys.readouterr().out
    assert calls[0] == "" and "X_FOR_MEASUREMENT" in calls[1] and calls[2] == calls[1] and calls[3] == ""
    assert "| shape | as shipped ms | with X ms | as shipped / with X |" in out and "| S | 1.0000 | 2.0000 | 0.500 |" in out


def test_read_ceiling_refuses_an_l2_buffer_with_row_copies(bench_tool, monkeypatch, capsys):
    """bench/read_ceiling.py: --l2-mib measures one copy per slot, so with --row-bytes it stops with a message naming
    both options before it touches a GPU (torch and bench are stand-ins here: nothing past the check may run)."""
    import types

    if importlib.util.find_spec("torch") is None:
        monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "bench", types.SimpleNamespace(ceilings=None, median_ms=None))
    tool = bench_tool("read_ceiling")
    monkeypatch.setattr(sys, "argv", ["read_ceiling.py", "--l2-mib", "32", "--row-bytes", "256"])
    try:
        tool.main()
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("read_ceiling.py ran with --l2-mib and --row-bytes")
    assert "--l2-mib measures one copy per slot; leave out --row-bytes" in capsys.readouterr().err


def test_fp8_staging_ab_slot_ahead_is_the_slot_config_with_loads_ahead(bench_tool, monkeypatch, capsys):
    """bench/fp8_staging_ab.py's 'slot_ahead' staging: the slot config as the built-in choice builds it per shape with
    fp8_slot_loads_ahead set and nothing else changed; slot stagings only for per-tensor layouts; an unknown
    --stagings entry is a clear error naming the choices (torch: the tool imports bench.py)."""
    pytest.importorskip("torch", reason="bench/ tools import torch (CI installs its CPU build)")
    tool = bench_tool("fp8_staging_ab")
    for sh in tool.SHAPES:
        slot = tool.staging_config(sh, "per_tensor", None, "slot")
        ahead = tool.staging_config(sh, "per_tensor", None, "slot_ahead")
        assert slot.converts_in_slot and slot.seesaw and not slot.fp8_slot_loads_ahead, sh.label
        assert ahead.fp8_slot_loads_ahead
        assert {k for k, v in slot.model_dump().items() if ahead.model_dump()[k] != v} == {"fp8_slot_loads_ahead"}
    assert tool.stagings("per_tensor", ("slot", "slot_ahead")) == ("slot", "slot_ahead")
    assert tool.stagings("block128") == ("fp8_ring", "registers")
    monkeypatch.setattr(sys, "argv", ["fp8_staging_ab.py", "--stagings", "slot,slot_later"])
    with pytest.raises(SystemExit):
        tool.main()
    err = capsys.readouterr().err
    assert "--stagings: unknown ['slot_later']" in err and "'slot_ahead'" in err
