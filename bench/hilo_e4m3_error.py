"""The numerics behind schedule 'keys_m' (codegen/sm90_keys_m.py), emulated in float64 with numpy (no GPU): MLA decode
(16 heads, 4096 keys, 576/512 dims, an e4m3 cache) with q and/or p carried as one e4m3 value or as a hi/lo
pair of e4m3 values, against the exact result on the same cache (relative L2).

    python bench/hilo_e4m3_error.py

e4m3 (OCP e4m3fn): 3 mantissa bits, exponent bias 7, subnormals from 2^-9, max 448, rounded to nearest even.
q: per row c = 400 / max|q|, hi = e4m3(c q), lo = e4m3(16 (c q - hi)) (`q_lo_shift` 4, keys_m's; 0: lo = e4m3(c q -
hi) unscaled, which lets hi and lo accumulate into one wgmma accumulator); p (s p first rounded to fp16, as the kernel
splits it): hi = e4m3(s p), lo = e4m3(s p - hi),
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


def f16(x):
    """Round to IEEE fp16 (11 significant bits, nearest even; subnormals from 2^-24), as the kernel forms the scaled
    layouts' P (p_scale p and s_b / R_b as fp16, their product in fp16)."""
    a = np.abs(np.asarray(x, np.float64))
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-300))), -14)
    ulp = 2.0 ** (e - 10)
    return np.sign(x) * np.round(a / ulp) * ulp


def error(rng, qmode: str, pmode: str, q_sd: float, h=16, n=4096, dq=576, dv=512, p_scale=256.0, lag=0.0,
          q_lo_shift=4) -> float:
    """Relative L2 error of the output; p = 2^(x - m) with m `lag` (log2 units) below the row maximum; q's lo part
    scaled by 2^q_lo_shift before its rounding."""
    q = rng.standard_normal((h, dq)) * q_sd
    kv = e4m3(rng.standard_normal((n, dq)) * 2.0)
    k, v = kv, kv[:, :dv]
    scale = 1 / np.sqrt(dq)
    s = (q @ k.T) * scale
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p @ v) / p.sum(1, keepdims=True)
    c = 400 / np.abs(q).max(1, keepdims=True)
    qq = {"hilo": hilo(q * c, q_lo_shift) / c, "single": e4m3(q * c) / c, "exact": q}[qmode]
    s2 = (qq @ k.T) * scale
    p2 = np.exp(s2 - s2.max(1, keepdims=True) + lag * np.log(2))
    pq = {"hilo": hilo(f16(p2 * p_scale), 0) / p_scale, "single": e4m3(p2 * p_scale) / p_scale, "exact": p2}[pmode]
    out = (pq @ v) / pq.sum(1, keepdims=True)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def bf16(x):
    """Round to bfloat16 (8 significant bits, nearest even), as the kernel stores the packed token's rope and c q's."""
    a = np.abs(np.asarray(x, np.float64))
    e = np.floor(np.log2(np.maximum(a, 1e-300)))
    ulp = 2.0 ** (e - 7)
    return np.sign(x) * np.round(a / ulp) * ulp


def error_packed(rng, spread: float, q_sd: float = 1.0, h=16, n=4096, p_scale=128.0) -> float:
    """Relative L2 error of schedule keys_m on the packed fp8_ds_mla token (512 e4m3 latent values with one fp32 scale
    per 128 columns, 64 bf16 rope values), emulated: q's latent part as hi/lo e4m3 pairs, its rope as bf16 of c q,
    each latent block's product scaled per key; P^T per scale block as hi/lo e4m3 of p_scale p s_b / R_b (R_b the
    largest scale of block b; the product of fp16 p_scale p and fp16 s_b / R_b rounded to fp16), O's block rows multiplied back by R_b, the sums of p in full precision. The scales
    are log-normal with sd `spread` (natural-log units), against the exact result on the dequantized cache."""
    lat, blocks = 512, 4
    q = rng.standard_normal((h, lat + 64)) * q_sd
    k8 = e4m3(rng.standard_normal((n, lat)) * 2.0)
    sc = np.exp(rng.standard_normal((n, blocks)) * spread) / 64
    rope = bf16(rng.standard_normal((n, 64)) * 0.5)
    deq = k8 * np.repeat(sc, lat // blocks, axis=1)
    scale = 1 / np.sqrt(lat + 64)
    s_ref = (q @ np.concatenate([deq, rope], 1).T) * scale
    p_ref = np.exp(s_ref - s_ref.max(1, keepdims=True))
    ref = (p_ref @ deq) / p_ref.sum(1, keepdims=True)
    c = 400 / np.abs(q[:, :lat]).max(1, keepdims=True)
    q_lat = hilo(q[:, :lat] * c, 4) / c
    q_rope = bf16(q[:, lat:] * c) / c
    s = sum((q_lat[:, b * 128:(b + 1) * 128] @ k8[:, b * 128:(b + 1) * 128].T) * sc[:, b] for b in range(blocks))
    s = (s + q_rope @ rope.T) * scale
    p = np.exp(s - s.max(1, keepdims=True))
    out = np.zeros((h, lat))
    for b in range(blocks):
        r = sc[:, b].max()
        pb = hilo(f16(f16(p * p_scale) * f16(sc[:, b] / r)), 0) / p_scale
        out[:, b * 128:(b + 1) * 128] = (pb @ k8[:, b * 128:(b + 1) * 128]) * r
    out /= p.sum(1, keepdims=True)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def main() -> None:
    rng = np.random.default_rng(0)
    for qm, pm in (("hilo", "hilo"), ("hilo", "exact"), ("single", "exact"), ("exact", "single"), ("exact", "hilo")):
        print(f"q {qm:6s} p {pm:6s}: " + ", ".join(f"|q| sd {sd:g}: {error(rng, qm, pm, sd):.2e}" for sd in (1.0, 4.0)))
    print("packed fp8_ds_mla (keys_m), log-normal scales: " + ", ".join(
        f"sd {sd:g}: {error_packed(rng, sd):.2e}" for sd in (0.25, 1.0, 2.0)))
    print("q hilo   p hilo, p scale 128, max lagging by 1.5: " + ", ".join(
        f"|q| sd {sd:g}: {error(rng, 'hilo', 'hilo', sd, p_scale=128.0, lag=1.5):.2e}" for sd in (1.0, 4.0)))
    print("q hilo with lo unscaled (one accumulator), p hilo, 64 rows: " + ", ".join(
        f"|q| sd {sd:g}: {error(rng, 'hilo', 'hilo', sd, h=64, q_lo_shift=0):.2e}" for sd in (1.0, 4.0, 16.0)))
    print("q hilo (lo x 16),                           p hilo, 64 rows: " + ", ".join(
        f"|q| sd {sd:g}: {error(rng, 'hilo', 'hilo', sd, h=64):.2e}" for sd in (1.0, 4.0, 16.0)))


if __name__ == "__main__":
    main()
