"""The C host launcher headers in generated/ compile and link into a host program with plain nvcc
(it is not run here: CI has no GPU): an sm80 MLA and GQA variant for sm_90, an sm90 MLA variant
(whose launcher encodes the KV cache's TMA tensor map) for sm_90a, an FP8 GQA variant (byte caches
and the four scale arguments) and an sm90 FP8 MLA variant (byte caches and scales, no tensor map),
each source built for its arch."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GEN = REPO / "generated"

MAIN = """
#include "kvforge/mla_decode_launch.h"
#include "kvforge/gqa_decode_launch.h"
#include <cstdio>

int main() {
  int num_sms = 0;
  if (cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    std::printf("no GPU\\n");
    return 0;
  }
  void* ws = nullptr;
  const size_t mla_bytes = MLA_ws(1, 1, 128, 1, num_sms), sm90_bytes = SM90_ws(1, 1, 128, 1, num_sms);
  const size_t bytes = mla_bytes > sm90_bytes ? mla_bytes : sm90_bytes;
  cudaMalloc(&ws, bytes);
  cudaMemset(ws, 0, bytes);  // the error record starts clear
  cudaError_t e1 = MLA_run(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, ws, 1, 1, 128, 1, 16, 4,
                           num_sms, 0.04f, 0, 0);
  cudaError_t e2 = GQA_run(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, ws, 1, 1, 32, 8, 16, 4,
                           num_sms, 0.08f, 0, 0);
  cudaError_t e3 = SM90_run(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, ws, 1, 1, 128, 1, 16, 4,
                            num_sms, 0.04f, 0, 0);
  cudaError_t e4 = FP8_run(nullptr, (const unsigned char*)0, (const unsigned char*)0, nullptr, nullptr, nullptr,
                           nullptr, ws, 1, 1, 32, 8, 16, 4, num_sms, 0.08f, 0, (const float*)0, (const float*)0,
                           0.5f, 0.25f, 0);
  cudaError_t e5 = SM90FP8_run(nullptr, (const unsigned char*)0, (const unsigned char*)0, nullptr, nullptr, nullptr,
                               nullptr, ws, 1, 1, 128, 1, 16, 4, num_sms, 0.04f, 0, (const float*)0,
                               (const float*)0, 0.5f, 0.5f, 0);
  std::printf("%d %d %d %d %d\\n", (int)e1, (int)e2, (int)e3, (int)e4, (int)e5);
  return 0;
}
"""
NULL_ARGS = ("((const __nv_bfloat16*)0, (const __nv_bfloat16*)0, (const __nv_bfloat16*)0, (const int*)0, "
             "(const int*)0, (__nv_bfloat16*)0, (float*)0")


def pick(manifest: dict) -> dict:
    """A bf16 variant of each: 'mla_decode' and 'gqa_decode' (sm80 backend, sm_90), 'sm90' (MLA, sm_90a),
    'fp8' (GQA with a per-tensor fp8 cache, sm_90) and 'sm90_fp8' (MLA, per-tensor fp8, sm_90a)."""
    out = {}
    for e in manifest["variants"]:
        cfg = e["config"]
        if e["family"] not in ("mla_decode", "gqa_decode") or cfg["q_dtype"] != "bf16":
            continue
        if cfg["kv_dtype"] == "fp8_e4m3":
            if e["family"] == "gqa_decode" and cfg["scale_mode"] == "per_tensor" and e["arch"] == "sm_90":
                out.setdefault("fp8", e)
            elif e["backend"] == "sm90" and cfg["scale_mode"] == "per_tensor":
                out.setdefault("sm90_fp8", e)
        elif e["arch"] == "sm_90":
            out.setdefault(e["family"], e)
        elif e["backend"] == "sm90":
            out.setdefault("sm90", e)
    missing = sorted({"mla_decode", "gqa_decode", "sm90", "fp8", "sm90_fp8"} - set(out))
    assert not missing, f"no bf16 {', '.join(missing)} variant in the manifest; stale? run `kvforge generate`"
    return out


def host_source(picked: dict) -> str:
    """MAIN calling the launchers of `pick`'s variants."""
    mla, gqa, sm90, fp8 = picked["mla_decode"], picked["gqa_decode"], picked["sm90"], picked["fp8"]
    src = (MAIN.replace("MLA_ws", f"{mla['name']}_workspace_bytes").replace("MLA_run", f"{mla['name']}_run")
           .replace("GQA_run", f"{gqa['name']}_run").replace("SM90_ws", f"{sm90['name']}_workspace_bytes")
           .replace("SM90_run", f"{sm90['name']}_run").replace("SM90FP8_run", f"{picked['sm90_fp8']['name']}_run")
           .replace("FP8_run", f"{fp8['name']}_run"))
    return src.replace("(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr", NULL_ARGS)


def test_launch_headers_compile_and_link_with_nvcc(tmp_path):
    from kvforge.codegen.vendor_check import nvcc_arch_flags

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH here; the host-launcher check needs the CUDA toolkit")
    picked = pick(json.loads((GEN / "manifest.json").read_text()))
    main = tmp_path / "main.cu"
    main.write_text(host_source(picked))
    objects = []
    for key, e in picked.items():  # each source for its own arch (sm_90a needs the -gencode form)
        obj = tmp_path / f"{key}.o"
        r = subprocess.run([nvcc, "-c", "-std=c++17", *nvcc_arch_flags(e["arch"]), "-I", str(GEN / "include"),
                            str(GEN / next(iter(e["files"]))), "-o", str(obj)], capture_output=True, text=True)
        assert r.returncode == 0, f"{e['name']} ({e['arch']}):\n{r.stdout}{r.stderr}"
        objects.append(str(obj))
    r = subprocess.run([nvcc, "-std=c++17", *nvcc_arch_flags("sm_90"), "-I", str(GEN / "include"), str(main),
                        *objects, "-o", str(tmp_path / "host_demo")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "host_demo").stat().st_size > 0
    # -DKVFORGE_PDL: the sm_90+ launchers start the combine by cudaLaunchKernelEx (programmatic launch)
    r = subprocess.run([nvcc, "-c", "-std=c++17", "-DKVFORGE_PDL", *nvcc_arch_flags("sm_90"), "-I", str(GEN / "include"),
                        str(main), "-o", str(tmp_path / "main_pdl.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cudaLaunchKernelEx" in (GEN / "include" / "kvforge" / "gqa_decode_launch.h").read_text()


MERGE_MAIN = """
#include "kvforge/mla_decode_launch.h"
#include <cstdio>

int main() {
  void* ws = nullptr;
  const size_t bytes = V_workspace_bytes(64, 1, 128, 1, 132);
  cudaMalloc(&ws, bytes);
  cudaMemset(ws, 0, bytes);  // the error record and the merge counts start at zero
  cudaError_t e = V_run((const __nv_bfloat16*)0, (const __nv_bfloat16*)0, (const __nv_bfloat16*)0, (const int*)0,
                        (const int*)0, (__nv_bfloat16*)0, (float*)0, ws, 32, 1, 128, 1, 16, 4, 132, 0.04f, 0, 0);
  std::printf("%d %zu\\n", (int)e, bytes);
  return 0;
}
"""


def test_merge_in_kernel_launcher_compiles_and_links_with_nvcc(tmp_path):
    """An sm90 variant with merge_in_kernel (on or off in the default matrix): its launcher passes the
    counts at the workspace's fixed offset and skips the combine where the kernel merged; the rendered
    tree (variant source, shared headers, launcher) compiles and links with plain nvcc."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.manifest import render_tree, write_tree
    from kvforge.codegen.render import WORKSPACE_COUNTERS_OFFSET
    from kvforge.codegen.select import sm90_choice
    from kvforge.codegen.variant import Variant
    from kvforge.codegen.vendor_check import nvcc_arch_flags

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH here; the host-launcher check needs the CUDA toolkit")
    v = Variant(build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", 64, 1).model_dump(mode="json"),
                                     "merge_in_kernel": True}))
    tree = tmp_path / "gen"
    files = render_tree([v])
    write_tree(files, tree)
    header = (tree / "include" / "kvforge" / "mla_decode_launch.h").read_text()
    assert f"int* merge_counters = (int*)((char*)workspace + {WORKSPACE_COUNTERS_OFFSET});" in header
    assert f"if (num_splits > {v.config.merged_splits})" in header
    src = next(p for p in files if p.endswith(".cu") and v.name in p)
    obj = tmp_path / "v.o"
    r = subprocess.run([nvcc, "-c", "-std=c++17", *nvcc_arch_flags(v.arch), "-I", str(tree / "include"),
                        str(tree / src), "-o", str(obj)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    main = tmp_path / "main.cu"
    main.write_text(MERGE_MAIN.replace("V_workspace_bytes", f"{v.name}_workspace_bytes").replace("V_run", f"{v.name}_run"))
    r = subprocess.run([nvcc, "-std=c++17", *nvcc_arch_flags("sm_90"), "-I", str(tree / "include"), str(main), str(obj),
                        "-o", str(tmp_path / "demo")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
