"""NVRTC compilation on the CPU: every accepted config compiles; errors carry the source lines."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvforge.codegen.errors import ConfigError
from kvforge.codegen.matrix import load_matrix
from kvforge.codegen.render import render_variant
from kvforge.codegen.variant import variant_from_dict
from kvforge.runtime import CompileError, KernelCache, compile
from kvforge.runtime.compiler import compile_source

from toolchains import needs_nvrtc

pytestmark = needs_nvrtc

selftest_dicts = st.fixed_dictionaries({
    "kind": st.just("pipeline_selftest"),
    "arch": st.sampled_from(["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a"]),
    "fill": st.sampled_from(["arrive", "expect_tx"]),
    "slot_bytes": st.sampled_from([512, 1024, 4096, 8192, 12288, 16384, 49152]),
    "pipeline": st.fixed_dictionaries({
        "num_kv_stages": st.integers(2, 8),
        "num_qk_stages": st.integers(1, 4),
        "num_producer": st.integers(1, 8),
        "num_consumer": st.integers(1, 16),
        "consumer_arrive": st.sampled_from(["warp", "thread"]),
    }),
})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(selftest_dicts)
def test_every_accepted_config_renders_and_compiles(tmp_path_factory, data):
    try:
        variant = variant_from_dict(data)
    except ConfigError:
        assume(False)
        return
    k = compile(variant, cache=KernelCache(tmp_path_factory.mktemp("c")))
    assert k.cubin[:4] == b"\x7fELF" and k.resources.registers > 0


def test_default_matrix_resources_are_read_from_the_cubin(tmp_path):
    v = next(v for v in load_matrix() if v.language == "cuda")
    k = compile(v, cache=KernelCache(tmp_path))
    assert 16 <= k.resources.registers <= 255
    assert k.resources.spill_store_bytes == 0


def test_a_cold_compile_takes_under_3_seconds(tmp_path):
    # the deepest mbarrier ring of the variants that have one (sm90 configs have no `pipeline` model)
    v = max((v for v in load_matrix() if v.language == "cuda" and getattr(v.config, "pipeline", None)),
            key=lambda v: v.config.pipeline.num_stages)
    t0 = time.perf_counter()
    k = compile(v, cache=KernelCache(tmp_path))
    elapsed = time.perf_counter() - t0
    assert not k.cache_hit and elapsed < 3.0, f"cold compile took {elapsed:.2f} s"


def test_a_compile_error_names_the_variant_arch_and_offending_lines(tmp_path):
    v = next(v for v in load_matrix() if v.family == "pipeline_selftest")
    broken = render_variant(v).replace("unsigned int acc = 0;", "unsigned int acc = undeclared_thing;")
    with pytest.raises(CompileError) as exc:
        compile_source(v.name, v.arch, broken, cache=KernelCache(tmp_path))
    err = exc.value
    assert err.variant == v.name and err.arch == v.arch
    assert "undeclared_thing" in err.log
    assert ">>" in err.source_lines and "undeclared_thing" in err.source_lines
    assert v.name in str(err) and "offending source lines" in str(err)


def test_debug_builds_are_separate_cache_entries_with_bounded_waits(tmp_path):
    v = next(v for v in load_matrix() if v.language == "cuda")
    cache = KernelCache(tmp_path)
    release, debug = compile(v, cache=cache), compile(v, debug=True, cache=cache)
    assert release.cubin != debug.cubin and len(cache.entries()) == 2


decode_dicts = st.fixed_dictionaries({
    "family": st.sampled_from(["mla_decode", "gqa_decode"]),
    "backend": st.just("sm80"),
    "arch": st.sampled_from(["sm_80", "sm_86", "sm_90"]),
    "head_dim": st.sampled_from([64, 128, 256]),
    "heads_per_cta": st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    "page_size": st.sampled_from([16, 32, 64, 128]),
    "block_n": st.sampled_from([16, 32, 64, 128]),
    "dtype": st.sampled_from(["bf16", "fp16"]),
    "max_s_q": st.integers(1, 8),
    "pipeline": st.fixed_dictionaries({
        "num_kv_stages": st.integers(2, 6),
        "num_producer": st.sampled_from([1, 2, 4]),
        "num_consumer": st.sampled_from([1, 2, 4, 8]),
    }),
})


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(decode_dicts)
def test_every_accepted_decode_config_renders_and_compiles(tmp_path_factory, data):
    d = dict(data)
    dim, dtype = d.pop("head_dim"), d.pop("dtype")
    dims = (576, 512) if d["family"] == "mla_decode" else (dim, dim)
    d.update(head_dim_qk=dims[0], head_dim_v=dims[1], q_dtype=dtype, kv_dtype=dtype)
    try:
        variant = variant_from_dict(d)
    except ConfigError:
        assume(False)
        return
    k = compile(variant, cache=KernelCache(tmp_path_factory.mktemp("c")))
    assert k.cubin[:4] == b"\x7fELF" and k.resources.registers > 0
