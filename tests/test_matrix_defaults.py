"""Matrix entries need only what matters: family-implied fields and the runtime's choice of
block_n / pipeline / kv_buffers fill what an entry leaves out; explicit values win and are
validated as before; the manifest carries the resolved values."""
from __future__ import annotations

import json

import pytest

from kvforge.codegen.errors import ConfigError
from kvforge.codegen.manifest import render_tree
from kvforge.codegen.matrix import load_matrix
from kvforge.codegen.select import select_cdna_config, select_decode_config
from toolchains import needs_nvrtc

DEFAULT_NAMES = {v.name for v in load_matrix()}


def _matrix(tmp_path, body: str):
    path = tmp_path / "m.toml"
    path.write_text("[[variant]]\n" + body)
    return load_matrix(path)


def test_a_three_field_mla_entry_resolves_to_the_runtime_choice(tmp_path):
    vs = _matrix(tmp_path, 'family = "mla_decode"\narch = "sm_90"\npage_size = [64, 16]\nheads_per_cta = 64\n')
    assert len(vs) == 2
    for v in vs:
        # arch sm_90 means the sm80 backend; the runtime prefers sm90 (sm_90a) there, so force sm80
        want = select_decode_config("mla_decode", "sm_90", "bf16", v.config.page_size, heads=128, head_dim=576, s_q=1,
                                    backend="sm80")
        assert v.config == want
        assert (v.config.backend, v.config.head_dim_qk, v.config.head_dim_v) == ("sm80", 576, 512)
        assert v.name in DEFAULT_NAMES  # the runtime's choice ships pre-generated


def test_gqa_one_head_dim_implies_the_other_and_the_selector_fills_the_rest(tmp_path):
    v, = _matrix(tmp_path, 'family = "gqa_decode"\narch = "sm_80"\nhead_dim_v = 128\nheads_per_cta = 8\n'
                           'page_size = 16\nq_dtype = "fp16"\nkv_dtype = "fp16"\nmax_s_q = 2\n')
    assert v.config == select_decode_config("gqa_decode", "sm_80", "fp16", 16, heads=8, head_dim=128, s_q=2)


def test_mla_heads_per_cta_the_runtime_never_picks_still_gets_a_fitting_tile_and_ring(tmp_path):
    v, = _matrix(tmp_path, 'family = "mla_decode"\narch = "sm_86"\npage_size = 32\nheads_per_cta = 8\n')
    assert v.config.heads_per_cta == 8 and v.config.block_n in (16, 32, 64, 128)
    assert v.config.pipeline.num_kv_stages >= 2


def test_explicit_block_n_and_pipeline_keys_win_over_the_choice(tmp_path):
    v, = _matrix(tmp_path, 'family = "gqa_decode"\narch = "sm_90"\nhead_dim_qk = 128\nheads_per_cta = 4\n'
                           'page_size = 16\nblock_n = 32\npipeline = { num_kv_stages = 2 }\n')
    assert v.config.block_n == 32 and v.config.pipeline.num_kv_stages == 2
    assert v.config.pipeline.num_consumer >= 1  # the rest of the ring from the choice


def test_an_explicit_value_no_candidate_fits_is_rejected_naming_its_field(tmp_path):
    with pytest.raises(ConfigError, match=r"\[\[variant\]\] #1: .*block_n=48"):
        _matrix(tmp_path, 'family = "mla_decode"\narch = "sm_90"\npage_size = 64\nheads_per_cta = 64\nblock_n = 48\n')
    with pytest.raises(ConfigError, match=r"num_kv_stages=6"):
        _matrix(tmp_path, 'family = "mla_decode"\narch = "sm_80"\npage_size = 64\nheads_per_cta = 64\n'
                          'pipeline = { num_kv_stages = 6 }\n')


def test_what_no_default_can_supply_is_still_field_required(tmp_path):
    with pytest.raises(ConfigError, match=r"mla_decode.heads_per_cta: Field required"):
        _matrix(tmp_path, 'family = "mla_decode"\narch = "sm_90"\npage_size = 64\n')
    with pytest.raises(ConfigError, match=r"head_dim_qk: Field required"):
        _matrix(tmp_path, 'family = "gqa_decode"\narch = "sm_90"\npage_size = 64\nheads_per_cta = 4\n')
    with pytest.raises(ConfigError, match=r"page_size"):
        _matrix(tmp_path, 'family = "gqa_decode"\narch = "sm_90"\npage_size = 48\nhead_dim_qk = 64\n'
                          'heads_per_cta = 4\n')


@pytest.mark.parametrize("family,dim,hpc,page", [("mla_decode", 576, 16, 64), ("gqa_decode", 128, 4, 16)])
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_a_cdna_entry_gets_the_runtime_cdna_choice(tmp_path, family, dim, hpc, page, arch):
    dims = "" if family == "mla_decode" else f"head_dim_qk = {dim}\n"
    v, = _matrix(tmp_path, f'family = "{family}"\narch = "{arch}"\n{dims}heads_per_cta = {hpc}\npage_size = {page}\n')
    assert v.config == select_cdna_config(family, arch, "bf16", page, heads=128 if family == "mla_decode" else hpc,
                                          head_dim=dim, s_q=1)
    assert v.name in DEFAULT_NAMES


def test_a_cdna_entry_with_its_own_block_n_gets_buffers_that_follow_it(tmp_path):
    v, = _matrix(tmp_path, 'family = "gqa_decode"\narch = "gfx942"\nhead_dim_qk = 64\nheads_per_cta = 4\n'
                           'page_size = 16\nblock_n = 64\n')
    assert v.config.block_n == 64 and all(b.BN == 64 for b in v.config.kv_buffers)


def test_the_default_matrix_is_written_out_in_full_so_defaults_never_rename_it():
    """Every default-matrix entry gives all fields: its names cannot move when a default changes."""
    import tomllib

    from kvforge.codegen.matrix import DEFAULT_MATRIX

    own = {"sm80": "pipeline", "cdna": "kv_buffers", "sm90": "num_kv_stages"}  # each backend's own fields
    for table in tomllib.loads(DEFAULT_MATRIX.read_text())["variant"]:
        if "family" in table:
            assert {"backend", "block_n", "head_dim_qk", "head_dim_v"} <= set(table), table
            assert own[table["backend"]] in table, table


def test_the_manifest_records_the_resolved_values(tmp_path):
    vs = _matrix(tmp_path, 'family = "mla_decode"\narch = "sm_90"\npage_size = 64\nheads_per_cta = 16\n')
    entry, = json.loads(render_tree(vs)["manifest.json"])["variants"]
    cfg = entry["config"]
    assert (cfg["backend"], cfg["head_dim_qk"], cfg["head_dim_v"]) == ("sm80", 576, 512)
    assert cfg["block_n"] == vs[0].config.block_n and cfg["pipeline"]["num_kv_stages"] >= 2


@needs_nvrtc
def test_the_three_field_mla_entry_generates_and_compiles(tmp_path, monkeypatch, capsys):
    from kvforge.runtime.cli import main

    monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path / "cache"))
    m = tmp_path / "mla.toml"
    m.write_text('[[variant]]\nfamily = "mla_decode"\narch = "sm_90"\npage_size = [64, 16]\nheads_per_cta = 64\n')
    assert main(["generate", str(m), "--out", str(tmp_path / "g")]) == 0
    assert len(list((tmp_path / "g" / "sm80").glob("*.cu"))) == 2
    assert main(["compile", str(m), "--jobs", "2"]) == 0
    assert "2 variants compiled" in capsys.readouterr().out
