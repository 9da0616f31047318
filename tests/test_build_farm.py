"""Build farms: `--shard i/n` partitions a matrix by variant name (exactly once, stable as the
matrix grows), and `kvforge cache export|import` merge the jobs' cache entries, checked and atomic."""
from __future__ import annotations

import argparse
import json

import pytest
from toolchains import needs_nvrtc

from kvforge.codegen.matrix import load_matrix
from kvforge.codegen.shard import Shard, parse_shard, select_shard, shard_index
from kvforge.runtime.cache import KernelCache
from kvforge.runtime.cache_transfer import transfer
from kvforge.runtime.cli import main


def test_three_shards_of_the_default_matrix_cover_it_exactly_once():
    names = [v.name for v in load_matrix()]
    shards = [[v.name for v in select_shard(load_matrix(), Shard(i, 3))] for i in (1, 2, 3)]
    assert sorted(n for s in shards for n in s) == sorted(names)
    assert all(shards), "every shard of the default matrix should get work"


def test_adding_variants_never_moves_an_existing_one(tmp_path):
    base = 'kind = "pipeline_selftest"\narch = "sm_90"\nfill = "arrive"\npipeline = { num_kv_stages = %s }\n'
    small, big = tmp_path / "small.toml", tmp_path / "big.toml"
    small.write_text("[[variant]]\n" + base % "[2, 3]")
    big.write_text("[[variant]]\n" + base % "[2, 3, 4, 5, 6]" + "[[variant]]\n" + base.replace("sm_90", "sm_80") % 2)
    for n in (2, 3, 5):
        before = {v.name: shard_index(v.name, n) for v in load_matrix(small)}
        after = {v.name: shard_index(v.name, n) for v in load_matrix(big)}
        assert {k: after[k] for k in before} == before


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "x/3", "1", "1/2/3", "-1/3"])
def test_a_bad_shard_is_rejected_saying_what_is_allowed(text):
    with pytest.raises(argparse.ArgumentTypeError, match="i/n|1..n"):
        parse_shard(text)


def test_cli_shards_list_and_generate(tmp_path, capsys):
    assert main(["list", "--shard", "2/3"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == [v.name for v in select_shard(load_matrix(), Shard(2, 3))]
    assert main(["generate", "--shard", "2/3", "--out", str(tmp_path / "g")]) == 0
    manifest = json.loads((tmp_path / "g" / "manifest.json").read_text())
    assert [e["name"] for e in manifest["variants"]] == listed
    with pytest.raises(SystemExit) as exc:
        main(["compile", "--shard", "4/3"])
    assert exc.value.code == 2 and "--shard" in capsys.readouterr().err


def _fake_entries(cache: KernelCache, n: int) -> list[tuple[str, str]]:
    keys = []
    for i in range(n):
        name, key = f"kvforge_fake_{i}", f"{i:064x}"
        cache.put(name, key, bytes([i]) * 64, {"name": name, "arch": "sm_90"})
        keys.append((name, key))
    return keys


def test_export_then_import_reproduces_every_entry(tmp_path):
    a, farm, b = KernelCache(tmp_path / "a"), KernelCache(tmp_path / "farm"), KernelCache(tmp_path / "b")
    keys = _fake_entries(a, 3)
    assert transfer(a, farm).copied == 3
    report = transfer(farm, b)
    assert (report.copied, report.present, report.rejected) == (3, 0, [])
    assert all(b.get(n, k).binary == a.get(n, k).binary for n, k in keys)
    assert transfer(farm, b).present == 3  # idempotent


def test_import_rejects_corrupt_entries_and_never_overwrites_a_valid_one(tmp_path):
    farm, local = KernelCache(tmp_path / "farm"), KernelCache(tmp_path / "local")
    (n0, k0), (n1, k1), (n2, k2) = _fake_entries(farm, 3)
    _fake_entries(local, 1)  # local holds a valid copy of entry 0
    farm._stem(n0, k0).with_suffix(".bin").write_bytes(b"corrupt")   # corrupt copy of what local has
    farm._stem(n1, k1).with_suffix(".bin").write_bytes(b"\0" * 64)   # corrupt, local lacks it
    meta = farm._stem(n2, k2).with_suffix(".json")
    meta.rename(meta.with_name("kvforge_other-" + meta.name.split("-")[1]))  # misnamed
    report = transfer(farm, local)
    assert report.copied == 0 and len(report.rejected) == 3
    assert local.get(n0, k0).binary == bytes([0]) * 64 and local.get(n1, k1) is None
    assert [p.name for p in (tmp_path / "local" / "kernels").iterdir() if p.name.startswith(".")] == []


def test_cache_import_cli_exits_1_naming_rejected_entries(tmp_path, monkeypatch, capsys):
    farm = KernelCache(tmp_path / "farm")
    (name, key), _ = _fake_entries(farm, 2)
    farm._stem(name, key).with_suffix(".bin").write_bytes(b"x")
    monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path / "local"))
    assert main(["cache", "import", str(tmp_path / "farm")]) == 1
    out = capsys.readouterr().out
    assert "imported 1 entries" in out and "1 corrupt" in out and name in out
    assert main(["cache", "import", str(tmp_path / "nothing")]) == 1
    assert "holds no exported cache" in capsys.readouterr().out


@needs_nvrtc
def test_shards_compiled_in_separate_caches_merge_into_one_that_needs_no_jit(tmp_path, monkeypatch, capsys):
    pattern = "gqa_decode_sm80_sm8"  # the sm_80 and sm_86 GQA variants: a small real matrix
    for i in (1, 2):
        monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path / f"job{i}"))
        assert main(["compile", "--filter", pattern, "--shard", f"{i}/2", "--jobs", "1"]) == 0
        assert main(["cache", "export", str(tmp_path / "artifacts")]) == 0
    monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path / "merged"))
    assert main(["cache", "import", str(tmp_path / "artifacts")]) == 0
    monkeypatch.setenv("KVFORGE_DISABLE_JIT", "1")
    capsys.readouterr()
    assert main(["compile", "--filter", pattern, "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    n = sum(pattern in v.name for v in load_matrix())
    assert f"{n} variants compiled" in out and out.count("(cached)") == n
