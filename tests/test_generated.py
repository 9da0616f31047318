"""generated/ holds the default matrix's output, fresh; --check catches any drift."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from kvforge.runtime.cli import main
from kvforge.codegen.manifest import render_tree
from kvforge.codegen.matrix import expand, filter_variants, load_matrix

REPO = Path(__file__).resolve().parents[1]


def test_checked_in_generated_tree_is_fresh(capsys):
    assert main(["generate", "--check", "--out", str(REPO / "generated")]) == 0, capsys.readouterr().out


def test_check_reports_a_diff_for_an_edited_a_missing_and_an_extra_file(tmp_path, capsys):
    out = tmp_path / "gen"
    assert main(["generate", "--out", str(out)]) == 0
    assert main(["generate", "--check", "--out", str(out)]) == 0
    victim = next((out / "sm90").glob("kvforge_pipeline_selftest_*.cu"))
    victim.write_text(victim.read_text().replace("kSlotBytes", "kSlotBytez", 1))
    (out / "include" / "kvforge" / "pipeline.cuh").unlink()
    (out / "stray.cu").write_text("// left over\n")
    capsys.readouterr()
    assert main(["generate", "--check", "--out", str(out)]) == 1
    diff = capsys.readouterr().out
    assert "-constexpr int kSlotBytez" in diff and "+constexpr int kSlotBytes" in diff
    assert "pipeline.cuh (expected)" in diff and "stray.cu" in diff
    assert main(["generate", "--out", str(out)]) == 0
    assert not (out / "stray.cu").exists()
    assert main(["generate", "--check", "--out", str(out)]) == 0


def test_manifest_lists_every_variant_with_its_launch_contract_and_file_hashes():
    files = render_tree(load_matrix())
    manifest = json.loads(files["manifest.json"])
    names = [e["name"] for e in manifest["variants"]]
    assert names == sorted(names) and len(names) == len(load_matrix())
    import hashlib

    for e in manifest["variants"]:
        assert set(e) >= {"name", "family", "backend", "arch", "config", "config_hash", "template_hash",
                          "generator_version", "files", "kernels"}
        for rel, sha in e["files"].items():
            assert hashlib.sha256(files[rel].encode()).hexdigest() == sha
        main = next(k for k in e["kernels"] if k["symbol"] == e["name"])
        assert main["block"][0] % 32 == 0
        # HIP kernels keep their LDS in a static array: they must not ask for dynamic shared memory
        assert (main["dynamic_smem_bytes"] == 0) == (e["backend"] == "cdna")
        assert all(a["ctype"] and a["name"].isidentifier() for k in e["kernels"] for a in k["args"])


def test_matrix_lists_expand_as_a_product_at_any_depth():
    combos = expand({"a": [1, 2], "b": "x", "p": {"c": [3, 4, 5]}})
    assert len(combos) == 6 and combos[0] == {"a": 1, "b": "x", "p": {"c": 3}}


def test_filter_matches_substrings_and_globs():
    vs = load_matrix()
    assert all("_tx_" in v.name for v in filter_variants(vs, "_tx_"))
    assert filter_variants(vs, "kvforge_pipeline_selftest_sm80_*") == [
        v for v in vs if v.arch == "sm_80" and v.family == "pipeline_selftest"]
    assert {v.family for v in filter_variants(vs, "mla")} == {"mla_decode"}


def test_a_user_matrix_file_generates_its_own_tree(tmp_path):
    m = tmp_path / "m.toml"
    m.write_text('[[variant]]\nkind = "pipeline_selftest"\narch = "sm_90"\nfill = ["arrive", "expect_tx"]\n'
                 'pipeline = { num_kv_stages = 2 }\n')
    assert main(["generate", str(m), "--out", str(tmp_path / "g")]) == 0
    assert len(list((tmp_path / "g").rglob("*.cu"))) == 2


def test_a_bad_matrix_exits_2_naming_the_entry(tmp_path, capsys):
    m = tmp_path / "bad.toml"
    m.write_text('[[variant]]\nkind = "pipeline_selftest"\npipeline = { num_kv_stages = [2, 9] }\n')
    assert main(["list", str(m)]) == 2
    out = capsys.readouterr().out
    assert "[[variant]] #1" in out and "num_kv_stages=9" in out
