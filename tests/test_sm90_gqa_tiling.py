"""codegen/sm90_gqa.py on every shape the sm90 GQA kernel accepts: the register split setmaxnreg performs fits the
launch's allocation (more makes setmaxnreg.inc wait forever: a hang, not an error), shared memory fits the CTAs per
SM it claims, and what it refuses it refuses with a reason."""
from __future__ import annotations

import itertools

import pytest

from kvforge.codegen.arch import arch_spec
from kvforge.codegen.sm90_gqa import REGISTER_FILE, Sm90GqaTiling, smem_limit_per_cta

SHAPES = list(itertools.product((64, 128, 256), (1, 4, 16, 32, 64, 96, 128), (16, 64, 128), (2, 3, 4), (False, True)))


@pytest.mark.parametrize("d,rows,page,stages,fp8", SHAPES)
def test_an_accepted_tiling_fits_its_registers_and_shared_memory(d, rows, page, stages, fp8):
    t = Sm90GqaTiling(head_dim=d, rows=rows, page_size=page, stages=stages, fp8=fp8)
    if t.problems():
        return
    per_thread = REGISTER_FILE // (t.threads * t.ctas_per_sm)
    assert t.producer_regs + t.math_warpgroups * t.math_regs <= (1 + t.math_warpgroups) * min(per_thread, 255)
    assert t.math_regs >= t.acc_regs + 72 and t.math_regs % 8 == t.producer_regs % 8 == 0
    assert t.smem_bytes <= smem_limit_per_cta(t.arch, t.ctas_per_sm)
    assert t.ctas_per_sm * (t.smem_bytes + 1024) <= arch_spec(t.arch).max_smem_per_block + 1024
    assert t.q_rows >= rows and t.q_rows - rows < 64 and t.boxes_per_tile * t.box_rows == 64


def test_what_cannot_be_built_is_refused_with_its_reason():
    assert "at most 128" in " ".join(Sm90GqaTiling(head_dim=128, rows=129, page_size=16, stages=2).problems())
    assert "shared memory" in " ".join(Sm90GqaTiling(head_dim=256, rows=128, page_size=16, stages=4).problems())
    assert "registers per math thread" in " ".join(
        Sm90GqaTiling(head_dim=256, rows=128, page_size=16, stages=2, fp8=True).problems())
