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
