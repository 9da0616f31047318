"""Every HIP variant of the default matrix compiles with real AMD compilers: clang-19 for gfx90a
and gfx942 (-nogpuinc -nogpulib) and hiprtc through hip-python for gfx90a. The code objects hold
MFMA and LDS instructions, and their register and LDS use (from the AMDGPU metadata note) fits
the arch. Nothing here runs on an AMD GPU: none exists on these machines."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from toolchains import needs_clang, needs_hiprtc

from kvforge.codegen.matrix import load_matrix
from kvforge.codegen.render import render_variant
from kvforge.runtime.cache import KernelCache
from kvforge.runtime.errors import CompileError

HIP_VARIANTS = [v for v in load_matrix() if v.language == "hip"]
MAX_VGPRS, MAX_AGPRS, MAX_LDS = 512, 256, 65536


def _objdump(binary: bytes, arch: str, tmp_path) -> str:
    tool = shutil.which("llvm-objdump-19") or shutil.which("llvm-objdump")
    if tool is None:
        pytest.skip("llvm-objdump is not installed")
    path = tmp_path / "k.co"
    path.write_bytes(binary)
    return subprocess.run([tool, "-d", f"--mcpu={arch}", str(path)], capture_output=True, text=True, check=True).stdout


def code_object_kernels(binary: bytes):
    from kvforge.runtime.amdgpu_notes import code_object_kernels as read  # needs msgpack (the hip extra)

    return read(binary)


def _check_code_object(variant, binary, tmp_path):
    asm = _objdump(binary, variant.arch, tmp_path)
    assert "v_mfma_f32_" in asm and variant.config.mfma.name.split("x")[0] in asm, "no MFMA instruction"
    assert "ds_read" in asm or "ds_load" in asm, "no LDS read"
    assert "ds_write" in asm or "ds_store" in asm, "no LDS write"
    if variant.config.waves > 1:  # a one-wavefront workgroup needs (and gets) no barrier
        assert "s_barrier" in asm
    res = code_object_kernels(binary)
    assert {k.symbol for k in variant.kernels} <= set(res)
    main = res[variant.name]
    assert main.vgprs <= MAX_VGPRS and main.agprs <= MAX_AGPRS, main
    assert main.lds_bytes == variant.config.layout.total_bytes <= MAX_LDS, main
    assert main.scratch_bytes == 0 and main.vgpr_spills == 0 and main.sgpr_spills == 0, main


@needs_clang
@pytest.mark.parametrize("variant", HIP_VARIANTS, ids=lambda v: v.name)
def test_clang_compiles_every_hip_variant_for_its_arch(variant, tmp_path):
    from kvforge.runtime.hip_compiler import compile_hip

    k = compile_hip(variant, compiler="clang", cache=KernelCache(tmp_path / "c"))
    _check_code_object(variant, k.cubin, tmp_path)


@needs_hiprtc
@pytest.mark.parametrize("variant", [v for v in HIP_VARIANTS if v.arch == "gfx90a"], ids=lambda v: v.name)
def test_hiprtc_compiles_every_gfx90a_variant(variant, tmp_path):
    from kvforge.runtime.hip_compiler import compile_hip

    k = compile_hip(variant, compiler="hiprtc", cache=KernelCache(tmp_path / "c"))
    _check_code_object(variant, k.cubin, tmp_path)


@needs_hiprtc
def test_a_hiprtc_crash_on_an_unknown_target_is_a_clear_error(tmp_path):
    """ROCm 5.2's comgr aborts on gfx942; the worker process dies, the caller gets a CompileError."""
    from kvforge.runtime.hip_compiler import compile_hip

    variant = next(v for v in HIP_VARIANTS if v.arch == "gfx942")
    try:
        k = compile_hip(variant, compiler="hiprtc", cache=KernelCache(tmp_path / "c"))
    except CompileError as err:
        assert err.variant == variant.name and err.arch == "gfx942"
        assert "hiprtc" in str(err)
    else:  # a newer ROCm knows gfx942: then the code object must be right
        _check_code_object(variant, k.cubin, tmp_path)


@needs_clang
def test_a_hip_compile_error_shows_the_offending_lines(tmp_path, monkeypatch):
    from kvforge.runtime import hip_compiler

    variant = HIP_VARIANTS[0]
    broken = render_variant(variant).replace("const bool more = t + 1 < num_tiles;", "const bool more = t + nope;")
    monkeypatch.setattr(hip_compiler, "render_variant", lambda v: broken)
    with pytest.raises(CompileError) as exc:
        hip_compiler.compile_hip(variant, compiler="clang", cache=KernelCache(tmp_path / "c"))
    assert "nope" in exc.value.log and ">>" in exc.value.source_lines and "nope" in exc.value.source_lines


def _cdna_strategy():
    from hypothesis import strategies as st

    return st.fixed_dictionaries({
        "family": st.sampled_from(["mla_decode", "gqa_decode"]),
        "arch": st.sampled_from(["gfx90a", "gfx942"]),
        "dtype": st.sampled_from(["bf16", "fp16"]),
        "d": st.sampled_from([64, 128, 256]),
        "heads_per_cta": st.sampled_from([1, 2, 4, 8, 16]),
        "page_size": st.sampled_from([16, 32, 64, 128]),
        "block_n": st.sampled_from([16, 32, 64]),
        "threads": st.sampled_from([64, 128, 256]),
        "mfma": st.sampled_from(["16x16x16", "32x32x8"]),
        "k_wn": st.sampled_from([16, 32, 64]),
    })


@needs_clang
def test_every_accepted_cdna_config_compiles_with_clang(tmp_path_factory):
    from hypothesis import HealthCheck, assume, given, settings

    from kvforge.codegen.errors import ConfigError
    from kvforge.codegen.variant import variant_from_dict
    from kvforge.runtime.hip_compiler import compile_hip

    compiled = []

    @settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(_cdna_strategy())
    def check(x):
        mla = x["family"] == "mla_decode"
        dqk, dv = (576, 512) if mla else (x["d"], x["d"])
        kk = 16 if x["mfma"] == "16x16x16" else 8
        bufs = ({"role": "K", "BN": x["block_n"], "WN": x["k_wn"], "BK": kk, "depth": dqk,
                 "num_threads": x["threads"], "mfma": x["mfma"]},
                {"role": "V", "BN": x["block_n"], "WN": x["block_n"], "BK": kk, "depth": dv,
                 "num_threads": x["threads"], "mfma": x["mfma"]})
        data = dict(family=x["family"], backend="cdna", arch=x["arch"], head_dim_qk=dqk, head_dim_v=dv,
                    heads_per_cta=x["heads_per_cta"], page_size=x["page_size"], block_n=x["block_n"],
                    q_dtype=x["dtype"], kv_dtype=x["dtype"], kv_buffers=bufs)
        try:
            variant = variant_from_dict(data)
        except ConfigError:
            assume(False)
            return
        k = compile_hip(variant, compiler="clang", cache=KernelCache(tmp_path_factory.mktemp("c")))
        main = code_object_kernels(k.cubin)[variant.name]
        assert main.lds_bytes == variant.config.layout.total_bytes <= MAX_LDS
        compiled.append(variant.name)

    check()
    assert compiled, "hypothesis found no accepted cdna config to compile"
