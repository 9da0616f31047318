"""The float64 reference agrees with a dense, page-free attention written out longhand."""
from __future__ import annotations

import numpy as np

from kvforge.runtime.reference import paged_decode_reference


def _dense(q, k, v, scale, causal):
    s_q, hq, _ = q.shape
    n, hkv, _ = k.shape
    out = np.zeros((s_q, hq, v.shape[-1]))
    lse = np.full((hq, s_q), -np.inf)
    for qi in range(s_q):
        for h in range(hq):
            g = h // (hq // hkv)
            lim = n - s_q + qi + 1 if causal else n
            if lim <= 0:
                continue
            logits = [float(q[qi, h] @ k[j, g]) * scale for j in range(lim)]
            mx = max(logits)
            w = [np.exp(x - mx) for x in logits]
            out[qi, h] = sum(wj * v[j, g] for j, wj in enumerate(w)) / sum(w)
            lse[h, qi] = mx + np.log(sum(w))
    return out, lse


def test_reference_matches_dense_attention_through_shuffled_pages():
    rng = np.random.default_rng(0)
    page, hkv, hq, d, s_q = 4, 2, 4, 8, 3
    lens = [0, 1, 2, 9]
    pages_needed = [-(-n // page) for n in lens]
    perm = rng.permutation(sum(pages_needed) + 3)
    bt = np.full((len(lens), 4), 10**6, dtype=np.int32)
    at = 0
    for b, n in enumerate(pages_needed):
        bt[b, :n] = perm[at:at + n]
        at += n
    k_cache = rng.standard_normal((len(perm), page, hkv, d))
    v_cache = rng.standard_normal((len(perm), page, hkv, d))
    q = rng.standard_normal((len(lens), s_q, hq, d))
    for causal in (False, True):
        out, lse = paged_decode_reference(q, k_cache, v_cache, bt, lens, scale=0.3, causal=causal)
        for b, n in enumerate(lens):
            idx = np.arange(n)
            k = k_cache[bt[b, idx // page], idx % page]
            v = v_cache[bt[b, idx // page], idx % page]
            want_o, want_l = _dense(q[b], k, v, 0.3, causal)
            np.testing.assert_allclose(out[b], want_o, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(np.isinf(lse[b]), np.isinf(want_l))
            fin = np.isfinite(want_l)
            np.testing.assert_allclose(lse[b][fin], want_l[fin], rtol=1e-12)


def test_the_gpu_tests_reference_check_passes_the_reference_and_catches_each_fault():
    """tests/paged_inputs.assert_matches (every GPU test's check): the reference itself passes; a
    NaN, an output off by more than the tolerance, a -inf lse row in the wrong place each fail."""
    import numpy as np
    import pytest

    from paged_inputs import assert_matches, reference

    rng = np.random.default_rng(5)
    pages, ps, d = 6, 16, 64
    host = {"q": rng.standard_normal((2, 1, 4, d)), "k": rng.standard_normal((pages, ps, 2, d)),
            "v": rng.standard_normal((pages, ps, 2, d)), "bt": np.array([[0, 1, 2], [3, 4, 5]], dtype=np.int32),
            "lens": np.array([40, 0], dtype=np.int32)}
    want_o, want_l = reference("gqa_decode", host, causal=False)
    assert assert_matches(want_o, want_l, want_o, want_l) == 0.0
    nan_o = want_o.copy()
    nan_o[0, 0, 0, 0] = np.nan
    with pytest.raises(AssertionError, match="output has NaN"):
        assert_matches(nan_o, want_l, want_o, want_l)
    with pytest.raises(AssertionError, match="relative L2 error"):
        assert_matches(want_o * 1.05, want_l, want_o, want_l)
    moved = want_l.copy()
    moved[1] = 0.0  # the empty sequence's rows must stay -inf
    with pytest.raises(AssertionError, match="-inf lse rows differ"):
        assert_matches(want_o, moved, want_o, want_l)
