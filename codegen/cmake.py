"""The generated tree's CMakeLists.txt: `add_subdirectory(generated)` in a C++ project gives
`kvforge::kernels` (the CUDA variants) and `kvforge::hip_kernels` (the HIP variants), each a
static library of the tree's sources, built per variant arch as manifest.json gives it, with
`include/` as its public include folder. Deterministic, like every generated file."""
from __future__ import annotations

import hashlib
from collections import defaultdict

from .render import banner
from .variant import Variant

HEAD = """\
{banner}
#
# Vendoring: add_subdirectory(<this folder>) from a CMake project, then
#   target_link_libraries(app PRIVATE kvforge::kernels)       # the CUDA variants (needs CUDA enabled)
#   target_link_libraries(app PRIVATE kvforge::hip_kernels)   # the HIP variants (needs CMake's HIP language)
# and include "kvforge/<family>_launch.h". Each variant is compiled for the arch the manifest gives it.
# Options:
#   KVFORGE_VARIANTS   variant names to build (a ;-list; default: every variant of this tree)
#   KVFORGE_CUDA       build kvforge::kernels     (default: ON where a CUDA compiler is found)
#   KVFORGE_HIP        build kvforge::hip_kernels (default: ON where CMake finds a HIP compiler)
cmake_minimum_required(VERSION 3.24)
project(kvforge_generated LANGUAGES CXX)

set(KVFORGE_VARIANTS "" CACHE STRING "variant names to build (;-list; empty: all)")
include(CheckLanguage)

# The sources of this tree whose variant is selected, as absolute paths.
function(_kvforge_pick out)
  set(picked)
  foreach(src IN LISTS ARGN)
    get_filename_component(name "${{src}}" NAME_WE)
    if(NOT KVFORGE_VARIANTS OR name IN_LIST KVFORGE_VARIANTS)
      list(APPEND picked "${{CMAKE_CURRENT_SOURCE_DIR}}/${{src}}")
      set_property(GLOBAL APPEND PROPERTY KVFORGE_PICKED_VARIANTS ${{name}})
    endif()
  endforeach()
  set(${{out}} "${{picked}}" PARENT_SCOPE)
endfunction()

# An object library `target`_<arch> of the selected sources (ARGN) for one arch (`arch_property`,
# e.g. CUDA_ARCHITECTURES 90), recorded for _kvforge_library.
function(_kvforge_objects target lang arch_property arch)
  _kvforge_pick(picked ${{ARGN}})
  if(picked)
    add_library(${{target}}_${{arch}} OBJECT ${{picked}})
    set_target_properties(${{target}}_${{arch}} PROPERTIES ${{arch_property}} "${{arch}}" ${{lang}}_STANDARD 17
                          ${{lang}}_STANDARD_REQUIRED ON POSITION_INDEPENDENT_CODE ON)
    target_include_directories(${{target}}_${{arch}} PRIVATE "${{CMAKE_CURRENT_SOURCE_DIR}}/include")
    set_property(GLOBAL APPEND PROPERTY ${{target}}_OBJECT_LIBRARIES ${{target}}_${{arch}})
  endif()
endfunction()

# The static library `target` of every object library recorded for it, with include/ public; an
# interface library (include/ only) when no variant of it is selected.
function(_kvforge_library target lang)
  get_property(libraries GLOBAL PROPERTY ${{target}}_OBJECT_LIBRARIES)
  set(objects)
  foreach(lib IN LISTS libraries)
    list(APPEND objects $<TARGET_OBJECTS:${{lib}}>)
  endforeach()
  if(objects)
    add_library(${{target}} STATIC ${{objects}})
    set_target_properties(${{target}} PROPERTIES LINKER_LANGUAGE ${{lang}})
    target_include_directories(${{target}} PUBLIC "${{CMAKE_CURRENT_SOURCE_DIR}}/include")
  else()
    add_library(${{target}} INTERFACE)
    target_include_directories(${{target}} INTERFACE "${{CMAKE_CURRENT_SOURCE_DIR}}/include")
  endif()
endfunction()
"""

CUDA = """
# ---- CUDA: kvforge::kernels ----
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_kvforge_cuda_default ON)
else()
  set(_kvforge_cuda_default OFF)
endif()
option(KVFORGE_CUDA "build kvforge::kernels (the CUDA variants)" ${{_kvforge_cuda_default}})
if(KVFORGE_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
{groups}
  _kvforge_library(kvforge_kernels CUDA)
  if(TARGET kvforge_kernels)
    get_target_property(_kvforge_type kvforge_kernels TYPE)
    if(_kvforge_type STREQUAL "INTERFACE_LIBRARY")
      target_link_libraries(kvforge_kernels INTERFACE CUDA::cudart)
    else()
      target_link_libraries(kvforge_kernels PUBLIC CUDA::cudart)
    endif()
  endif()
  add_library(kvforge::kernels ALIAS kvforge_kernels)
  if(PROJECT_IS_TOP_LEVEL AND EXISTS "${{CMAKE_CURRENT_SOURCE_DIR}}/link_check.cu")
    # `cmake -S <this folder>` alone: a host program that links every selected decode launcher.
    add_executable(kvforge_link_check link_check.cu)
    set_target_properties(kvforge_link_check PROPERTIES CUDA_ARCHITECTURES 80 CUDA_STANDARD 17)
    target_link_libraries(kvforge_link_check PRIVATE kvforge::kernels)
    get_property(_kvforge_picked GLOBAL PROPERTY KVFORGE_PICKED_VARIANTS)
    list(TRANSFORM _kvforge_picked PREPEND KVFORGE_HAS_)
    target_compile_definitions(kvforge_link_check PRIVATE ${{_kvforge_picked}})
  endif()
endif()
"""

HIP = """
# ---- HIP: kvforge::hip_kernels (CMake's HIP language: clang and ROCm's hip-lang package) ----
check_language(HIP)
if(CMAKE_HIP_COMPILER)
  set(_kvforge_hip_default ON)
else()
  set(_kvforge_hip_default OFF)
endif()
option(KVFORGE_HIP "build kvforge::hip_kernels (the HIP variants)" ${{_kvforge_hip_default}})
if(KVFORGE_HIP)
  enable_language(HIP)
{groups}
  _kvforge_library(kvforge_hip_kernels HIP)
  add_library(kvforge::hip_kernels ALIAS kvforge_hip_kernels)
endif()
"""


def cmake_arch(arch: str) -> str:
    """CMake's *_ARCHITECTURES value for a variant arch: sm_90 -> 90, sm_100a -> 100a, gfx942 -> gfx942."""
    return arch.removeprefix("sm_")


def _groups(variants: list[Variant], head: str) -> str:
    """One `_kvforge_objects(<head> <arch> <sources>)` call per arch."""
    by_arch: dict[str, list[str]] = defaultdict(list)
    for v in variants:
        by_arch[cmake_arch(v.arch)].append(v.relpath)
    calls = []
    for arch in sorted(by_arch):
        calls.append(f"  _kvforge_objects({head} {arch}\n" + "\n".join(f"    {rel}" for rel in sorted(by_arch[arch]))
                     + ")")
    return "\n".join(calls)


LINK_CHECK_HEAD = """\
{banner}
// A host program that takes the address of every decode launcher whose variant CMakeLists.txt
// built (KVFORGE_HAS_<variant>), so it links only if the sources, headers and launchers agree.
// Built as `kvforge_link_check` when this folder is CMake's top-level project.
{includes}#include <cstdio>

int main() {{
  int linked = 0;
"""


def cuda_decode(variants: list[Variant]) -> list[Variant]:
    """The variants with C launchers (CUDA decode), which link_check.cu references."""
    return [v for v in variants if v.language == "cuda" and v.family in ("mla_decode", "gqa_decode")]


def render_link_check(variants: list[Variant]) -> str:
    """link_check.cu: references every CUDA decode variant's `<variant>_run` under KVFORGE_HAS_<variant>."""
    decode = cuda_decode(variants)
    digest = hashlib.sha256("".join(sorted(v.config_hash for v in decode)).encode()).hexdigest()
    families = sorted({v.family for v in decode})
    text = LINK_CHECK_HEAD.format(banner=banner(f"configs {digest}"),
                                  includes="".join(f'#include "kvforge/{f}_launch.h"\n' for f in families))
    for v in decode:
        text += (f"#ifdef KVFORGE_HAS_{v.name}\n  linked += &{v.name}_run != nullptr;\n#endif\n")
    return text + '  std::printf("kvforge: %d decode launchers linked\\n", linked);\n  return 0;\n}\n'


def render_cmake(variants: list[Variant]) -> str:
    """CMakeLists.txt text for a tree of `variants`."""
    digest = hashlib.sha256("".join(sorted(v.config_hash for v in variants)).encode()).hexdigest()
    text = HEAD.format(banner=banner(f"configs {digest}").replace("// ", "# "))
    cuda = [v for v in variants if v.language == "cuda"]
    hip = [v for v in variants if v.language == "hip"]
    if cuda:
        text += CUDA.format(groups=_groups(cuda, "kvforge_kernels CUDA CUDA_ARCHITECTURES"))
    if hip:
        text += HIP.format(groups=_groups(hip, "kvforge_hip_kernels HIP HIP_ARCHITECTURES"))
    return text
