"""The C host launcher headers in generated/ compile and link into a host program with plain nvcc
(it is not run here: CI has no GPU)."""
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
  const size_t bytes = MLA_ws(1, 1, 128, 1, num_sms);
  cudaMalloc(&ws, bytes);
  cudaMemset(ws, 0, bytes);  // the error record starts clear
  cudaError_t e1 = MLA_run(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, ws, 1, 1, 128, 1, 16, 4,
                           num_sms, 0.04f, 0, 0);
  cudaError_t e2 = GQA_run(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, ws, 1, 1, 32, 8, 16, 4,
                           num_sms, 0.08f, 0, 0);
  std::printf("%d %d\\n", (int)e1, (int)e2);
  return 0;
}
"""


def test_launch_headers_compile_and_link_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH here; the host-launcher check needs the CUDA toolkit")
    manifest = json.loads((GEN / "manifest.json").read_text())
    pick = {}
    for e in manifest["variants"]:
        if e["arch"] == "sm_90" and e["family"] in ("mla_decode", "gqa_decode") and e["config"]["q_dtype"] == "bf16":
            pick.setdefault(e["family"], e)
    mla, gqa = pick["mla_decode"], pick["gqa_decode"]
    src = (MAIN.replace("MLA_ws", f"{mla['name']}_workspace_bytes").replace("MLA_run", f"{mla['name']}_run")
           .replace("GQA_run", f"{gqa['name']}_run"))
    main = tmp_path / "main.cu"
    main.write_text(src.replace("(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr",
                                "((const __nv_bfloat16*)0, (const __nv_bfloat16*)0, (const __nv_bfloat16*)0, "
                                "(const int*)0, (const int*)0, (__nv_bfloat16*)0, (float*)0"))
    sources = [str(GEN / next(iter(e["files"]))) for e in (mla, gqa)]
    cmd = [nvcc, "-std=c++17", "-gencode=arch=compute_90,code=sm_90", "-I", str(GEN / "include"), str(main),
           *sources, "-o", str(tmp_path / "host_demo")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "host_demo").stat().st_size > 0
