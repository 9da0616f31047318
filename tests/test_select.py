"""The runtime's variant choice: valid for every supported shape, and the common shapes' choices
ship pre-generated in generated/ (vendoring users get the kernels the Python API runs)."""
from __future__ import annotations

import pytest

from kvforge.codegen.arch import arch_spec
from kvforge.codegen.matrix import load_matrix
from kvforge.codegen.variant import Variant
from kvforge.runtime.select import select_cdna_config, select_decode_config

DEFAULT_NAMES = {v.name for v in load_matrix()}


@pytest.mark.parametrize("heads", [1, 3, 16, 20, 64, 100, 128])
@pytest.mark.parametrize("s_q", [1, 2, 3, 8])
def test_mla_choice_fits_every_head_count_and_s_q(heads, s_q):
    cfg = select_decode_config("mla_decode", "sm_90", "bf16", 64, heads=heads, head_dim=576, s_q=s_q)
    assert cfg.heads_per_cta * cfg.max_s_q <= cfg.q_rows <= 128 and cfg.max_s_q >= s_q
    assert cfg.layout.total_bytes <= arch_spec("sm_90").max_smem_per_block


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("s_q", [1, 8])
def test_gqa_choice_fits_every_head_dim_group_and_s_q(d, group, s_q):
    cfg = select_decode_config("gqa_decode", "sm_90", "fp16", 16, heads=group, head_dim=d, s_q=s_q)
    assert cfg.heads_per_cta == group and cfg.head_dim_qk == d and cfg.max_s_q >= s_q


@pytest.mark.parametrize("family,heads,d,page,s_q", [
    ("mla_decode", 128, 576, 64, 1), ("mla_decode", 16, 576, 64, 1), ("mla_decode", 32, 576, 64, 1),
    ("mla_decode", 128, 576, 64, 2), ("gqa_decode", 4, 128, 16, 1), ("gqa_decode", 1, 64, 16, 1),
])
def test_common_shapes_choose_a_pregenerated_variant(family, heads, d, page, s_q):
    cfg = select_decode_config(family, "sm_90", "bf16", page, heads=heads, head_dim=d, s_q=s_q)
    assert Variant(cfg).name in DEFAULT_NAMES


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_cdna_choice_is_pregenerated(arch):
    assert Variant(select_cdna_config("mla_decode", arch, "bf16", 64, heads=128, head_dim=576,
                                      s_q=1)).name in DEFAULT_NAMES
    assert Variant(select_cdna_config("gqa_decode", arch, "bf16", 16, heads=4, head_dim=128,
                                      s_q=1)).name in DEFAULT_NAMES
