"""Every HIP variant of the default matrix, run through the NumPy emulation of its exact tiling,
reproduces the float64 reference on fresh random inputs (ragged and zero lengths, shuffled pages,
the split path, causal s_q > 1 where the variant allows it). A broken layout map must fail."""
from __future__ import annotations

import numpy as np
import pytest

from kvforge.codegen.matrix import load_matrix
from kvforge.runtime import cdna_emulation
from kvforge.runtime.cdna_emulation import emulate_decode, round_to
from kvforge.runtime.reference import paged_decode_reference

HIP_VARIANTS = [v for v in load_matrix() if v.language == "hip"]


def _case(cfg, seed):
    rng = np.random.default_rng(seed)
    mla = cfg.family == "mla_decode"
    hkv = 1 if mla else 2
    hq = 20 if mla else hkv * cfg.heads_per_cta
    dqk, dtype, ps = cfg.head_dim_qk, cfg.q_dtype, cfg.page_size
    s_q = cfg.max_s_q
    lens = [0, 1, 3 * ps + 5, 600]
    need = [-(-n // ps) for n in lens]
    pages = sum(need) + 2
    perm = rng.permutation(pages)
    bt = np.full((len(lens), max(need) + 1), 10**6, np.int64)
    at = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[at:at + n]
        at += n
    k = round_to(rng.standard_normal((pages, ps, hkv, dqk)), dtype)
    v = k if mla else round_to(rng.standard_normal((pages, ps, hkv, dqk)), dtype)
    q = round_to(rng.standard_normal((len(lens), s_q, hq, dqk)), dtype)
    return q, k, v, bt, lens


def _check(cfg, q, k, v, bt, lens, causal, splits):
    scale = 1 / np.sqrt(cfg.head_dim_qk)
    out, lse = emulate_decode(cfg, q, k, v, bt, lens, scale=scale, causal=causal, num_splits=splits)
    ref_o, ref_l = paged_decode_reference(q, k, v, bt, lens, scale=scale, causal=causal,
                                          v_dim=512 if cfg.family == "mla_decode" else None)
    err = np.linalg.norm(out - ref_o) / np.linalg.norm(ref_o)
    return err, lse, ref_l


@pytest.mark.parametrize("variant", HIP_VARIANTS, ids=lambda v: v.name)
def test_emulated_hip_variant_matches_the_float64_reference(variant):
    cfg = variant.config
    q, k, v, bt, lens = _case(cfg, int(variant.config_hash[:6], 16))
    for causal, splits in ((False, 1), (cfg.max_s_q > 1, 3)):
        err, lse, ref_l = _check(cfg, q, k, v, bt, lens, causal, splits)
        assert err < 1e-2, f"relative L2 {err:.2e} (causal={causal}, splits={splits})"
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_l))
        fin = np.isfinite(ref_l)
        np.testing.assert_allclose(lse[fin], ref_l[fin], atol=1e-3)


def test_the_emulation_catches_a_wrong_operand_map(monkeypatch):
    """Swap the B operand's k and column roles: the result must be far from the reference (on a
    32x32x8 MFMA, where k and the column index differ in range)."""
    variant = next(v for v in HIP_VARIANTS if v.family == "gqa_decode" and v.config.kv_buffers[0].mfma == "32x32x8")
    cfg = variant.config
    q, k, v, bt, lens = _case(cfg, 5)
    real = cdna_emulation._Maps.__init__

    def broken(self, mf):
        real(self, mf)
        self.b_k, self.b_col = self.b_col % mf.k, self.b_k % mf.n

    monkeypatch.setattr(cdna_emulation._Maps, "__init__", broken)
    err, _, _ = _check(cfg, q, k, v, bt, lens, False, 1)
    assert not err < 1e-2


def test_the_emulation_catches_a_read_that_ignores_the_swizzle(monkeypatch):
    variant = next(v for v in HIP_VARIANTS if v.family == "mla_decode")
    cfg = variant.config
    q, k, v, bt, lens = _case(cfg, 6)
    real = cdna_emulation._lds_read
    monkeypatch.setattr(cdna_emulation, "_lds_read", lambda flat, r, c, e, p: real(flat, r, c, e, 1))
    err, _, _ = _check(cfg, q, k, v, bt, lens, False, 1)
    assert not err < 1e-2
