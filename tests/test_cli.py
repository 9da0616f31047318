"""The kvforge CLI: list, compile (the whole default matrix, in parallel, on the CPU), cache, demo."""
from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvforge.runtime.cli import main
from kvforge.codegen.matrix import load_matrix
from kvforge.runtime.availability import partition
from toolchains import needs_nvrtc

REPO = Path(__file__).resolve().parents[1]


def test_list_prints_every_name_and_filters(capsys):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split() == [v.name for v in load_matrix()]
    assert main(["list", "--filter", "s6x3"]) == 0
    assert all("s6x3" in n for n in capsys.readouterr().out.split())


def test_compile_starts_the_longest_builds_first():
    """build_weight ranks the default matrix's sm90 seesaw kernels (the 6.5-10 s builds) above the other sm90 ones,
    and those above everything else, so `kvforge compile` submits them first."""
    from kvforge.runtime.build import build_weight

    weights = {}
    for v in load_matrix():
        cfg = v.config
        decode90 = v.family in ("mla_decode", "gqa_decode") and cfg.backend == "sm90"
        kind = ("seesaw" if cfg.schedule == "seesaw" else "sm90") if decode90 else "other"
        weights.setdefault(kind, set()).add(build_weight(v))
    assert set(weights) == {"seesaw", "sm90", "other"}
    assert min(weights["seesaw"]) > max(weights["sm90"]) > max(weights["other"])


@needs_nvrtc
def test_compile_builds_the_default_matrix_within_its_cpu_budget(tmp_path, monkeypatch):
    """The main job's compile stays short. 108 variants, 10 of them sm90 seesaw kernels of 5-9 s each (ptxas):
    155 s of CPU, 81 s on 2 cores with the longest builds started first (twenty-sixth session). The wall time on a
    shared runner moves with its load (a CI run took 94.7 s for the same build), the CPU time does not, so the bound
    that catches a variant whose build runs away (minutes) is on CPU time: 240 s, the compile and its worker
    processes together; the wall bound (150 s on 2 cores) only catches a build that stalls."""
    monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "kvforge.runtime.cli", "compile", "--jobs", "2"],
                       capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert r.returncode == 0, r.stdout + r.stderr
    buildable, skipped = partition(load_matrix())  # HIP variants skip, saying so, without the AMD compilers
    assert f"{len(buildable)} variants compiled" in r.stdout
    for group in skipped:
        assert group.line() in r.stdout
    for col in ("regs", "spills", "static smem", "dynamic smem"):
        assert col in r.stdout
    assert cpu > 10, f"{cpu:.1f} s of CPU: the workers' time was not counted"
    assert cpu < 240, f"{cpu:.1f} s of CPU ({elapsed:.1f} s wall)"
    assert elapsed < 150, f"{elapsed:.1f} s wall ({cpu:.1f} s of CPU)"


@needs_nvrtc
def test_compile_arch_filter_and_cache_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path))
    assert main(["compile", "--arch", "sm_80", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "sm_80" in out and "sm_90 " not in out
    assert main(["cache", "info"]) == 0
    assert f"entries: {sum(v.arch == 'sm_80' for v in load_matrix())}" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert main(["cache", "info"]) == 0
    assert "entries: 0" in capsys.readouterr().out


def test_compile_with_no_matching_variant_is_a_clear_error(capsys):
    assert main(["compile", "--filter", "no_such_variant"]) == 2
    assert "no variant matches" in capsys.readouterr().out


@needs_nvrtc
def test_demo_without_a_gpu_generates_and_compiles(tmp_path, monkeypatch, capsys):
    from kvforge.runtime.device import cuda_device_count

    if cuda_device_count():
        pytest.skip("this machine has a GPU: the demo also runs kernels (covered by the gpu suite)")
    assert main(["demo", "--out", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out
    cuda = sum(v.language == "cuda" for v in load_matrix())
    assert f"compiled {cuda} CUDA variants" in out and "not run" in out


def test_generated_sources_compile_with_plain_nvcc():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH here; the vendoring check needs the CUDA toolkit")
    from kvforge.codegen.vendor_check import check_tree

    failures = check_tree(REPO / "generated")
    assert failures == [], failures[0][1]


def test_plan_lists_what_a_plan_object_loads_on_the_named_device(capsys):
    from kvforge.codegen.select import plan_choices
    from kvforge.codegen.variant import Variant

    assert main(["plan", "mla", "--heads", "128", "--page-size", "64", "--max-batch", "256", "--arch", "sm_90",
                 "--sms", "132"]) == 0
    names = capsys.readouterr().out.split()
    want = [Variant(c).name for c in plan_choices("mla_decode", "sm_90", 132, "bf16", 64, num_q_heads=128,
                                                   num_kv_heads=1, head_dim=576, s_q=1, max_batch=256)]
    # both sm90 schedules; 16-bit partials where the launch splits (the lockstep, and the seesaw under the hint)
    assert names == want and len(names) == 3
    assert {("_seesaw_" in n, "_po16_" in n) for n in names} == {(True, False), (False, True), (True, True)}


def test_plan_out_writes_the_plans_sources_and_manifest(tmp_path, capsys):
    import json

    assert main(["plan", "mla", "--heads", "128", "--page-size", "64", "--max-batch", "256", "--arch", "sm_90",
                 "--sms", "132", "--out", str(tmp_path)]) == 0
    names = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kvforge_")]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert len(names) == 3 and sorted(v["name"] for v in manifest["variants"]) == sorted(names)
    assert all(list(tmp_path.rglob(f"{n}.cu")) for n in names)


@pytest.mark.parametrize("argv,message", [
    (["mla", "--heads", "128", "--page-size", "64", "--max-batch", "8", "--arch", "sm_90"], "--sms"),
    (["mla", "--heads", "16", "--page-size", "48", "--max-batch", "8", "--arch", "sm_90", "--sms", "132"],
     "--page-size=48: supported 16, 32, 64, 128"),
    (["gqa", "--heads", "32", "--page-size", "16", "--max-batch", "8", "--arch", "sm_90", "--sms", "132"],
     "--kv-heads and --head-dim are required"),
    (["gqa", "--heads", "32", "--kv-heads", "6", "--head-dim", "128", "--page-size", "16", "--max-batch", "8",
      "--arch", "sm_90", "--sms", "132"], "--kv-heads=6: must divide --heads=32"),
    (["gqa", "--heads", "32", "--kv-heads", "8", "--head-dim", "96", "--page-size", "16", "--max-batch", "8",
      "--arch", "sm_90", "--sms", "132"], "--head-dim=96: supported 64, 128, 256"),
    (["gqa", "--heads", "64", "--kv-heads", "2", "--head-dim", "128", "--page-size", "16", "--max-batch", "8",
      "--arch", "sm_90", "--sms", "132"], "--heads=64, --kv-heads=2: the group 32 must be one of 1, 2, 4, 8, 16"),
    (["mla", "--heads", "16", "--page-size", "64", "--max-batch", "0", "--arch", "sm_90", "--sms", "132"],
     "--max-batch=0: must be at least 1"),
    (["mla", "--heads", "16", "--page-size", "64", "--max-batch", "8", "--s-q", "9", "--arch", "sm_90", "--sms",
      "132"], "--s-q=9: supported 1..8"),
    (["mla", "--heads", "129", "--page-size", "64", "--max-batch", "8", "--arch", "sm_90", "--sms", "132"],
     "--heads=129: MLA decode supports 1..128"),
    (["mla", "--heads", "16", "--page-size", "64", "--max-batch", "8", "--arch", "sm_86", "--sms", "84",
      "--fp8", "per_tensor"], "--fp8: fp8 KV needs the hardware e4m3 conversion of sm_89 and newer (--arch sm_86)"),
    (["mla", "--heads", "16", "--page-size", "64", "--max-batch", "8", "--arch", "gfx942", "--fp8", "per_tensor"],
     "--fp8: fp8 KV caches are not supported on AMD GPUs (--arch gfx942"),
    (["mla", "--heads", "16", "--page-size", "64", "--max-batch", "8", "--arch", "sm_90", "--sms", "132",
      "--fp8", "block"], "scale_block_size"),
])
def test_plan_rejects_bad_arguments_naming_them(capsys, argv, message):
    assert main(["plan", *argv]) == 2
    assert message in capsys.readouterr().out


@needs_nvrtc
def test_plan_compile_fills_the_cache_a_no_jit_run_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path))
    argv = ["plan", "gqa", "--heads", "32", "--kv-heads", "8", "--head-dim", "128", "--page-size", "16",
            "--max-batch", "64", "--arch", "sm_90", "--sms", "132"]
    assert main([*argv, "--compile", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "variants compiled (the plan's variants)" in out
    from kvforge.codegen.select import plan_choices
    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    monkeypatch.setenv("KVFORGE_DISABLE_JIT", "1")
    for cfg in plan_choices("gqa_decode", "sm_90", 132, "bf16", 16, num_q_heads=32, num_kv_heads=8, head_dim=128,
                            s_q=1, max_batch=64):
        assert compile(Variant(cfg)).cache_hit  # served from the cache the plan command filled
