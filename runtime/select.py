"""Choosing a decode variant for the shapes at hand (the heuristics live here, nowhere else)."""
from __future__ import annotations

from functools import lru_cache

from kvforge.codegen.decode import DecodeConfig
from kvforge.codegen.errors import ConfigError, build

MAX_CONSUMER_WARPS = 8


def _mla_heads_per_cta(num_heads: int, s_q: int) -> int:
    """Up to 64 query rows per CTA (64 x 512 fp32 accumulators over 8 warps)."""
    hpc = max(1, 64 // s_q)
    hpc = 1 << (hpc.bit_length() - 1)  # a power of two
    while hpc > 16 and hpc // 2 >= num_heads:
        hpc //= 2
    return hpc


def _candidates(family: str, row_groups: int, dv: int):
    """(col_groups, block_n) in order of preference: more column-group warps first."""
    cg = max(1, min(4, MAX_CONSUMER_WARPS // row_groups))
    out = []
    sizes = (32, 64) if family == "mla_decode" else (64, 32, 128)
    while cg >= 1:
        if dv % (16 * cg) == 0:
            # each warp takes 8 keys of the tile, or a multiple of 16
            out += [(cg, bn) for bn in sizes if bn % (8 * cg) == 0 and (bn // cg == 8 or bn // cg % 16 == 0)]
        cg //= 2
    return out


@lru_cache(maxsize=None)
def select_decode_config(family: str, arch: str, dtype: str, page_size: int, *, heads: int, head_dim: int,
                         s_q: int) -> DecodeConfig:
    """The sm80-backend config for these shapes. `heads` is H for MLA and Hq / Hkv for GQA.

    Picks heads per CTA, the warp grid, keys per tile and the ring depth: GQA prefers two CTAs per
    SM (more independent loads in flight), MLA the deepest ring one CTA can hold.
    """
    if family == "mla_decode":
        hpc, dqk, dv = _mla_heads_per_cta(heads, s_q), 576, 512
    else:
        hpc, dqk, dv = heads, head_dim, head_dim
    row_groups = -(-hpc * s_q // 16)
    base = dict(family=family, backend="sm80", arch=arch, head_dim_qk=dqk, head_dim_v=dv, heads_per_cta=hpc,
                page_size=page_size, q_dtype=dtype, kv_dtype=dtype, max_s_q=s_q)
    want_ctas = (2, 1) if family == "gqa_decode" else (1,)
    last_err = None
    for ctas in want_ctas:
        for cg, bn in _candidates(family, row_groups, dv):
            warps = row_groups * cg
            for stages in (6, 5, 4, 3, 2):
                for producers in (4, 2, 1):  # cp.async issue is per warp: four producers keep HBM busy
                    try:
                        cfg = build(DecodeConfig, {**base, "block_n": bn, "pipeline": {
                            "num_kv_stages": stages, "num_consumer": warps, "num_producer": producers}})
                    except ConfigError as err:
                        last_err = err
                        continue
                    if cfg.ctas_per_sm >= ctas:
                        return cfg
    raise ConfigError(f"no sm80 variant fits {family} with heads={heads}, head_dim={head_dim}, s_q={s_q}, "
                      f"page_size={page_size} on {arch}: {last_err}")


@lru_cache(maxsize=None)
def select_cdna_config(family: str, arch: str, dtype: str, page_size: int, *, heads: int, head_dim: int,
                       s_q: int) -> DecodeConfig:
    """The cdna-backend config for these shapes: MFMA 16x16x16, one 16-row query tile per workgroup."""
    if family == "mla_decode":
        hpc, dqk, dv, bn, threads = max(1, 16 // s_q), 576, 512, 16, 128
        k_wn, v_wn = 16, 16
    else:
        hpc, dqk, dv, bn, threads = heads, head_dim, head_dim, 32, 128
        k_wn, v_wn = 16, 32
    buffers = ({"role": "K", "BN": bn, "WN": k_wn, "BK": 16, "depth": dqk, "num_threads": threads},
               {"role": "V", "BN": bn, "WN": v_wn, "BK": 16, "depth": dv, "num_threads": threads})
    return build(DecodeConfig, dict(family=family, backend="cdna", arch=arch, head_dim_qk=dqk, head_dim_v=dv,
                                    heads_per_cta=hpc, page_size=page_size, block_n=bn, q_dtype=dtype,
                                    kv_dtype=dtype, max_s_q=s_q, kv_buffers=buffers))
