"""Every install combination degrades cleanly: a missing compiler piece (NVRTC, msgpack,
hip-python, clang, hiprtc) skips the variants that need it with one line per group, saying what
is missing and the command that installs it; it fails the command only when the user asked for
those variants (--arch naming them, or an explicit selection of which nothing can be built).

The states are simulated: probes are monkeypatched in-process, or imports are blocked in a
subprocess that runs the real command."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from toolchains import needs_clang, needs_nvrtc

from kvforge.codegen.matrix import load_matrix
from kvforge.runtime import availability, hip_toolchain
from kvforge.runtime import cli as runtime_cli
from kvforge.runtime.availability import AMD_FIX, CUDA_FIX, HIP_FIX, Missing, partition
from kvforge.runtime.hip_toolchain import HipToolchainError
from kvforge.runtime.resources import KernelResources

REPO = Path(__file__).resolve().parents[1]
VARIANTS = load_matrix()
N_CUDA = sum(v.language == "cuda" for v in VARIANTS)
CUDA_ARCHES = ", ".join(sorted({v.arch for v in VARIANTS if v.language == "cuda"}))
N_GFX90A = sum(v.arch == "gfx90a" for v in VARIANTS)
N_GFX942 = sum(v.arch == "gfx942" for v in VARIANTS)
NO_NVRTC = (Missing("NVRTC (cuda-core, cuda-bindings) is not installed", CUDA_FIX),)


@pytest.fixture
def state():
    """simulate(*absent): the named pieces are missing, every other piece is present."""
    monkeypatch = pytest.MonkeyPatch()
    availability.clear_probes()

    def simulate(*absent: str):
        hidden = {"msgpack": "msgpack", "hip-python": "hip"}
        monkeypatch.setattr(availability, "has_module",
                            lambda name: not any(name == hidden[a] for a in absent if a in hidden))
        monkeypatch.setattr(availability, "cuda_missing", lambda: NO_NVRTC if "nvrtc" in absent else ())

        def clang():
            if "clang" in absent:
                raise HipToolchainError("no clang")
            return "/usr/bin/clang-19"

        monkeypatch.setattr(hip_toolchain, "clang_path", clang)
        monkeypatch.setattr(hip_toolchain, "find_hiprtc", lambda: None if "hiprtc" in absent else ("/opt/rocm/lib", None))
        availability.hip_missing.cache_clear()

    yield simulate
    monkeypatch.undo()  # before clearing: the cached probes must not keep a simulated answer
    availability.clear_probes()


def _lines(variants):
    return [g.line() for g in partition(variants)[1]]


def test_everything_present_skips_nothing(state):
    state()
    assert partition(VARIANTS) == (VARIANTS, [])


def test_a_cuda_only_install_skips_hip_with_the_pip_and_apt_commands(state):
    state("msgpack", "hip-python", "clang", "hiprtc")
    assert _lines(VARIANTS) == [
        f"skipped {N_GFX90A} HIP variants (gfx90a): msgpack is not installed, hip-python is not installed, "
        f'no hiprtc library (ROCm); {HIP_FIX} && {AMD_FIX}',
        f"skipped {N_GFX942} HIP variants (gfx942): msgpack is not installed, no clang with the AMDGPU target "
        f'(clang-19); {HIP_FIX} && {AMD_FIX}',
    ]


def test_clang_without_hiprtc_builds_gfx942_and_skips_only_the_hiprtc_arch(state):
    state("hiprtc")
    buildable, skipped = partition(VARIANTS)
    assert sum(v.arch == "gfx942" for v in buildable) == N_GFX942
    assert [g.line() for g in skipped] == [f"skipped {N_GFX90A} HIP variants (gfx90a): no hiprtc library (ROCm); "
                                           f"{AMD_FIX}"]


def test_no_hip_python_and_no_clang_each_name_their_own_fix(state):
    state("hip-python")
    assert _lines(VARIANTS) == [f"skipped {N_GFX90A} HIP variants (gfx90a): hip-python is not installed; {HIP_FIX}"]
    state("clang")
    assert _lines(VARIANTS) == [f"skipped {N_GFX942} HIP variants (gfx942): no clang with the AMDGPU target "
                                f"(clang-19); {AMD_FIX}"]


def test_no_nvrtc_skips_every_cuda_variant_in_one_line(state):
    state("nvrtc")
    assert "sm_90a" in CUDA_ARCHES  # the sm90 backend's variants are grouped like the rest
    assert _lines(VARIANTS) == [f"skipped {N_CUDA} CUDA variants ({CUDA_ARCHES}): NVRTC (cuda-core, "
                                f'cuda-bindings) is not installed; {CUDA_FIX}']


def test_the_cuda_probe_reports_a_missing_wheel_without_importing_it(monkeypatch):
    availability.clear_probes()
    monkeypatch.setattr(availability, "has_module", lambda name: not name.startswith("cuda"))
    try:
        assert availability.cuda_missing() == NO_NVRTC
    finally:
        availability.clear_probes()


@pytest.fixture
def fake_builds(monkeypatch):
    """`kvforge compile` with every build a success that compiles nothing (threads, no NVRTC)."""
    built = []

    def build(config_json, debug):
        from kvforge.codegen.variant import variant_from_dict

        v = variant_from_dict(config_json)
        built.append(v.name)
        return v.name, v.arch, 0.0, True, KernelResources(32, 0, 0, 0, 0)

    monkeypatch.setattr(runtime_cli, "ProcessPoolExecutor", ThreadPoolExecutor)
    monkeypatch.setattr(runtime_cli, "_compile_one", build)
    return built


def test_compile_on_a_cuda_only_install_exits_0_saying_what_it_skipped(state, fake_builds, capsys):
    state("msgpack", "hip-python", "clang", "hiprtc")
    assert runtime_cli.main(["compile", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert len(fake_builds) == N_CUDA and f"{N_CUDA} variants compiled" in out
    assert f"skipped {N_GFX90A} HIP variants (gfx90a)" in out and f"skipped {N_GFX942} HIP variants (gfx942)" in out
    assert "Traceback" not in out and "FAILED" not in out


def test_compile_with_no_compiler_at_all_still_exits_0_on_the_default_matrix(state, fake_builds, capsys):
    state("nvrtc", "msgpack", "hip-python", "clang", "hiprtc")
    assert runtime_cli.main(["compile"]) == 0
    out = capsys.readouterr().out
    assert fake_builds == [] and out.count("skipped ") == 3


@pytest.mark.parametrize("argv,absent,code,skips", [
    (["--arch", "gfx90a"], ("hiprtc",), 1, True),             # asked for the arch whose compiler is missing
    (["--arch", "sm_90", "gfx942"], ("clang",), 1, True),     # one named arch cannot be built
    (["--arch", "sm_90", "gfx942"], ("hiprtc",), 0, False),   # gfx90a not selected: nothing skipped
    (["--filter", "cdna"], ("clang", "hiprtc"), 1, True),     # an explicit selection with nothing buildable
    (["--filter", "cdna"], ("hiprtc",), 0, True),             # part of it builds
    (["--filter", "gqa"], ("msgpack",), 0, True),             # CUDA gqa builds, HIP gqa is skipped
    ([], ("nvrtc", "clang", "hiprtc"), 0, True),              # nothing asked for explicitly
])
def test_a_missing_piece_fails_compile_only_when_asked_for(state, fake_builds, capsys, argv, absent, code, skips):
    state(*absent)
    assert runtime_cli.main(["compile", *argv]) == code
    out = capsys.readouterr().out
    assert ("skipped " in out) == skips
    assert ("FAILED: " in out) == bool(code)


def test_an_explicit_matrix_of_only_unbuildable_variants_fails(state, fake_builds, tmp_path, capsys):
    state("clang")
    m = tmp_path / "m.toml"
    m.write_text('[[variant]]\nfamily = "gqa_decode"\narch = "gfx942"\nhead_dim_qk = 64\nheads_per_cta = 4\n'
                 'page_size = 16\n')
    assert runtime_cli.main(["compile", str(m)]) == 1
    assert "none of the selected variants can be built here" in capsys.readouterr().out


def test_demo_skips_what_is_missing_and_passes_without_a_gpu(state, monkeypatch, tmp_path, capsys):
    from kvforge.runtime import demo

    state("hiprtc", "hip-python")
    built = []
    monkeypatch.setattr(demo, "build_variant", lambda v: built.append(v))
    monkeypatch.setattr(demo, "cuda_device_count", lambda: 0)
    assert demo.run_demo(None, tmp_path / "g") == 0
    out = capsys.readouterr().out
    assert len(built) == N_CUDA + N_GFX942 and f"compiled {N_GFX942} HIP variants" in out
    assert f"skipped {N_GFX90A} HIP variants (gfx90a): hip-python is not installed, no hiprtc library (ROCm)" in out
    assert "not run" in out


def test_demo_reports_a_broken_compiler_per_variant_instead_of_a_traceback(state, monkeypatch, tmp_path, capsys):
    from kvforge.runtime import demo

    state()

    def build(v):
        if v.arch == "gfx90a":
            raise HipToolchainError("hiprtc exploded")

    monkeypatch.setattr(demo, "build_variant", build)
    monkeypatch.setattr(demo, "cuda_device_count", lambda: 0)
    assert demo.run_demo(None, tmp_path / "g") == 1
    out = capsys.readouterr().out
    assert out.count("FAILED kvforge_") == N_GFX90A and "hiprtc exploded" in out


BLOCK = textwrap.dedent("""
    import sys
    BLOCKED = set(sys.argv[1].split(",")) - {""}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Block())
    if "hiprtc" in sys.argv[2].split(","):
        from kvforge.runtime import hip_toolchain
        hip_toolchain.find_hiprtc = lambda: None
    from kvforge.runtime.cli import main
    sys.exit(main(sys.argv[3:]))
""")


def _kvforge(blocked: str, *argv: str, hide: str = "") -> subprocess.CompletedProcess:
    """The real `kvforge` in a subprocess whose imports of `blocked` packages fail."""
    return subprocess.run([sys.executable, "-c", BLOCK, blocked, hide, *argv], capture_output=True, text=True)


def test_without_any_extra_generate_works_and_compile_exits_0_skipping_everything(tmp_path):
    r = _kvforge("cuda,hip,msgpack", "generate", "--out", str(tmp_path / "g"))
    assert r.returncode == 0 and (tmp_path / "g" / "manifest.json").exists(), r.stdout + r.stderr
    r = _kvforge("cuda,hip,msgpack", "compile")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f'skipped {N_CUDA} CUDA variants' in r.stdout and CUDA_FIX in r.stdout
    assert "Traceback" not in r.stdout + r.stderr and "No module named" not in r.stdout
    r = _kvforge("cuda,hip,msgpack", "compile", "--arch", "sm_90")
    assert r.returncode == 1 and "FAILED: --arch sm_90" in r.stdout


@needs_nvrtc
def test_a_cuda_dev_install_compiles_cuda_and_skips_hip_for_real():
    """The issue's fresh clone: pip install -e ".[cuda,dev]" (no msgpack, no hip-python)."""
    r = _kvforge("hip,msgpack", "compile", "--filter", "gqa_decode", "--jobs", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    n_cuda = sum(v.language == "cuda" and v.family == "gqa_decode" for v in VARIANTS)
    assert f"{n_cuda} variants compiled" in r.stdout
    assert "msgpack is not installed" in r.stdout and HIP_FIX in r.stdout
    assert "No module named" not in r.stdout + r.stderr


@needs_nvrtc
@needs_clang
def test_the_demo_passes_with_clang_but_no_hiprtc(tmp_path):
    r = _kvforge("", "demo", "--out", str(tmp_path / "g"), hide="hiprtc")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"compiled {N_GFX942} HIP variants" in r.stdout
    assert f"skipped {N_GFX90A} HIP variants (gfx90a): no hiprtc library (ROCm); {AMD_FIX}" in r.stdout


def test_the_nvcc_vendoring_check_skips_with_one_line_without_nvcc(monkeypatch, capsys):
    from kvforge.codegen import vendor_check

    monkeypatch.setattr(vendor_check.shutil, "which", lambda name: None)
    assert vendor_check.main([str(REPO / "generated")]) == 0
    assert capsys.readouterr().out.startswith("skipped the nvcc check of ")
