"""Float64 NumPy reference of paged decode attention (both families), for tests and the benchmark."""
from __future__ import annotations

import numpy as np


def paged_decode_reference(q, k_cache, v_cache, block_table, seqlens, *, scale: float, causal: bool,
                           v_dim: int | None = None):
    """q [B, s_q, Hq, Dqk]; k_cache/v_cache [num_pages, page_size, Hkv, D]; MLA passes the latent
    cache as both, with v_dim=512 (V = its first 512 columns). Returns out [B, s_q, Hq, Dv] and
    lse [B, Hq, s_q] (natural log; -inf and a zero output where a query sees no key)."""
    q = np.asarray(q, dtype=np.float64)
    batch, s_q, hq, _ = q.shape
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    dv = v_dim or v_cache.shape[-1]
    out = np.zeros((batch, s_q, hq, dv))
    lse = np.full((batch, hq, s_q), -np.inf)
    for b in range(batch):
        n = int(seqlens[b])
        if n == 0:
            continue
        idx = np.arange(n)
        pages = np.asarray(block_table[b])[idx // page_size]
        keys = np.asarray(k_cache[pages, idx % page_size], dtype=np.float64)           # [n, Hkv, Dqk]
        vals = np.asarray(v_cache[pages, idx % page_size], dtype=np.float64)[..., :dv]  # [n, Hkv, Dv]
        for qi in range(s_q):
            visible = n - s_q + qi + 1 if causal else n
            if visible <= 0:
                continue
            kq = keys[:visible].repeat(group, axis=1)                                  # [v, Hq, D]
            vq = vals[:visible].repeat(group, axis=1)
            s = np.einsum("hd,khd->hk", q[b, qi], kq) * scale                          # [Hq, v]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            denom = p.sum(axis=1, keepdims=True)
            out[b, qi] = np.einsum("hk,khd->hd", p / denom, vq)
            lse[b, :, qi] = (m + np.log(denom))[:, 0]
    return out, lse
