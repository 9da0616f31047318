"""The numerics behind schedule 'keys_m' (codegen/sm90_keys_m.py), emulated in float64 with numpy (no GPU): MLA decode
(16 heads, 4096 keys, 576/512 dims, an e4m3 cache) with q and/or p carried as one e4m3 value or as a hi/lo
pair of e4m3 values, against the exact result on the same cache (relative L2).

    python bench/hilo_e4m3_error.py

e4m3 (OCP e4m3fn): 3 mantissa bits, exponent bias 7, subnormals from 2^-9, max 448, rounded to nearest even.
q: per row c = 400 / max|q|, hi = e4m3(c q), lo = e4m3(16 (c q - hi)); p: hi = e4m3(s p), lo = e4m3(s p - hi),
s = 256 with p <= 1, or s = 128 with p <= 2^1.5 (the kernel's lazy rescale: the running maximum used for p may lag the
true one by up to policy.KEYS_M_RESCALE_SLACK_LOG2, 1.5).
"""
from __future__ import annotations

import numpy as np


def e4m3(x):
    a = np.abs(np.asarray(x, np.float64))
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-300))), -6)  # subnormals share exponent -6
    ulp = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / ulp) * ulp, 448.0)


def hilo(x, m):
    hi = e4m3(x)
    return hi + e4m3((x - hi) * 2.0**m) * 2.0**-m


def error(rng, qmode: str, pmode: str, q_sd: float, h=16, n=4096, dq=576, dv=512, p_scale=256.0, lag=0.0) -> float:
    """Relative L2 error of the output; p = 2^(x - m) with m `lag` (log2 units) below the row maximum."""
    q = rng.standard_normal((h, dq)) * q_sd
    kv = e4m3(rng.standard_normal((n, dq)) * 2.0)
    k, v = kv, kv[:, :dv]
    scale = 1 / np.sqrt(dq)
    s = (q @ k.T) * scale
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p @ v) / p.sum(1, keepdims=True)
    c = 400 / np.abs(q).max(1, keepdims=True)
    qq = {"hilo": hilo(q * c, 4) / c, "single": e4m3(q * c) / c, "exact": q}[qmode]
    s2 = (qq @ k.T) * scale
    p2 = np.exp(s2 - s2.max(1, keepdims=True) + lag * np.log(2))
    pq = {"hilo": hilo(p2 * p_scale, 0) / p_scale, "single": e4m3(p2 * p_scale) / p_scale, "exact": p2}[pmode]
    out = (pq @ v) / pq.sum(1, keepdims=True)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def main() -> None:
    rng = np.random.default_rng(0)
    for qm, pm in (("hilo", "hilo"), ("hilo", "exact"), ("single", "exact"), ("exact", "single"), ("exact", "hilo")):
        print(f"q {qm:6s} p {pm:6s}: " + ", ".join(f"|q| sd {sd:g}: {error(rng, qm, pm, sd):.2e}" for sd in (1.0, 4.0)))
    print("q hilo   p hilo, p scale 128, max lagging by 1.5: " + ", ".join(
        f"|q| sd {sd:g}: {error(rng, 'hilo', 'hilo', sd, p_scale=128.0, lag=1.5):.2e}" for sd in (1.0, 4.0)))


if __name__ == "__main__":
    main()
