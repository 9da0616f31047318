"""Skip markers for tests that need a compiler this machine may lack; each says what is missing
and the command that installs it (the same lines `kvforge compile` prints)."""
from __future__ import annotations

import pytest

from kvforge.runtime.availability import cuda_missing, hip_missing


def _reason(missing) -> str:
    return "; ".join(f"{m.what} ({m.fix})" for m in missing)


needs_nvrtc = pytest.mark.skipif(bool(cuda_missing()), reason=f"compiling CUDA needs: {_reason(cuda_missing())}")
needs_clang = pytest.mark.skipif(bool(hip_missing("gfx942", "clang")),
                                 reason=f"compiling HIP with clang needs: {_reason(hip_missing('gfx942', 'clang'))}")
needs_hiprtc = pytest.mark.skipif(bool(hip_missing("gfx90a", "hiprtc")),
                                  reason=f"compiling HIP with hiprtc needs: {_reason(hip_missing('gfx90a', 'hiprtc'))}")
