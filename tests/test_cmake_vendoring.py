"""Vendoring with CMake: generated/CMakeLists.txt gives kvforge::kernels (CUDA) per the manifest's
arches; `cmake -S generated` builds a host program that links the launchers, and a C++ project
links kvforge::kernels through add_subdirectory. Builds pick three variants (KVFORGE_VARIANTS: an
sm80 MLA and GQA one for sm_90, an sm90 MLA one for sm_90a) to keep CI short;
`python -m kvforge.codegen.vendor_check` compiles every source with nvcc."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GEN = REPO / "generated"
MANIFEST = json.loads((GEN / "manifest.json").read_text())


def _cmake() -> str:
    found = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("cmake is not on PATH: pip install 'cmake>=3.24' (CI does where the machine lacks it)")
    return found


def _needs_nvcc() -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH here; building the CUDA tree with CMake needs the CUDA toolkit")


def _pick() -> dict:
    """What tests/test_host_launcher.py links: bf16 sm80 MLA and GQA variants for sm_90, an sm90 one."""
    from test_host_launcher import pick

    return pick(MANIFEST)


def _build(cmake: str, src: Path, build: Path, *defs: str) -> subprocess.CompletedProcess:
    r = subprocess.run([cmake, "-S", str(src), "-B", str(build), *defs], capture_output=True, text=True)
    if r.returncode == 0:
        r = subprocess.run([cmake, "--build", str(build), "-j", "2"], capture_output=True, text=True)
    return r


def test_cmakelists_builds_every_source_once_for_its_manifest_arch():
    text = (GEN / "CMakeLists.txt").read_text()
    arch_of = {}
    for block in re.findall(r"_kvforge_objects\((\w+) (\w+) (\w+) (\w+)\n((?:    \S+\n?)+)\)", text):
        target, _, _, arch, sources = block
        for rel in sources.split():
            assert rel not in arch_of, rel
            arch_of[rel] = (target, arch)
    want = {rel: ("kvforge_kernels" if e["arch"].startswith("sm_") else "kvforge_hip_kernels",
                  e["arch"].removeprefix("sm_")) for e in MANIFEST["variants"] for rel in e["files"]}
    assert arch_of == want


def test_cmake_on_the_generated_tree_alone_builds_a_host_program_that_links_the_launchers(tmp_path):
    cmake = _cmake()
    _needs_nvcc()
    names = ";".join(e["name"] for e in _pick().values())
    r = _build(cmake, GEN, tmp_path / "build", f"-DKVFORGE_VARIANTS={names}", "-DKVFORGE_HIP=OFF")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = subprocess.run([str(tmp_path / "build" / "kvforge_link_check")], capture_output=True, text=True)
    assert run.returncode == 0 and f"{len(_pick())} decode launchers linked" in run.stdout, run.stdout


def test_a_cpp_project_links_kvforge_kernels_through_add_subdirectory(tmp_path):
    from test_host_launcher import host_source

    cmake = _cmake()
    _needs_nvcc()
    picked = _pick()
    app = tmp_path / "app"
    app.mkdir()
    (app / "main.cu").write_text(host_source(picked))
    (app / "CMakeLists.txt").write_text(f"""cmake_minimum_required(VERSION 3.24)
project(host_app LANGUAGES CXX CUDA)
set(KVFORGE_VARIANTS "{';'.join(e['name'] for e in picked.values())}")
set(KVFORGE_HIP OFF)
add_subdirectory("{GEN.as_posix()}" kvforge)
add_executable(host_app main.cu)
set_target_properties(host_app PROPERTIES CUDA_ARCHITECTURES 90 CUDA_STANDARD 17)
target_link_libraries(host_app PRIVATE kvforge::kernels)
""")
    r = _build(cmake, app, tmp_path / "build")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "build" / "host_app").stat().st_size > 0
    assert not (tmp_path / "build" / "kvforge" / "kvforge_link_check").exists()  # only when top-level


def test_the_hip_tree_builds_with_cmakes_hip_language_where_cmake_finds_one(tmp_path):
    cmake = _cmake()
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.24)\nproject(p LANGUAGES NONE)\n"
                                          "include(CheckLanguage)\ncheck_language(HIP)\n"
                                          "if(NOT CMAKE_HIP_COMPILER)\n  message(FATAL_ERROR \"no HIP\")\nendif()\n")
    if subprocess.run([cmake, "-S", str(probe), "-B", str(probe / "b")], capture_output=True).returncode:
        pytest.skip("CMake finds no HIP compiler here (its HIP language needs clang and ROCm's hip-lang CMake "
                    "package under <rocm>/lib/cmake); the HIP sources are compile-checked by test_hip_compile.py")
    hip = next(e["name"] for e in MANIFEST["variants"] if e["arch"] == "gfx90a")
    r = _build(cmake, GEN, tmp_path / "build", f"-DKVFORGE_VARIANTS={hip}", "-DKVFORGE_CUDA=OFF")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "build" / "libkvforge_hip_kernels.a").exists()
