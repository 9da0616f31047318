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


@lru_cache(maxsize=None)
def select_decode_config(family: str, arch: str, dtype: str, page_size: int, *, heads: int, head_dim: int,
                         s_q: int) -> DecodeConfig:
    """The sm80-backend config for these shapes. `heads` is H for MLA and Hq / Hkv for GQA.

    Picks heads per CTA, the consumer-warp grid, keys per tile and the deepest ring that fits.
    """
    if family == "mla_decode":
        hpc, dqk, dv = _mla_heads_per_cta(heads, s_q), 576, 512
    else:
        hpc, dqk, dv = heads, head_dim, head_dim
    rows = -(-hpc * s_q // 16) * 16
    row_groups = rows // 16
    col_groups = max(1, MAX_CONSUMER_WARPS // row_groups)
    while col_groups > 1 and (dv // (16 * col_groups) == 0 or dv % (16 * col_groups)):
        col_groups //= 2
    if family == "mla_decode":
        col_groups = min(col_groups, 4)  # 4 x 16 keys: a 64-key tile; wider would not fit two stages
    block_n = max(64 if family == "gqa_decode" else 32, 16 * col_groups)
    base = dict(family=family, backend="sm80", arch=arch, head_dim_qk=dqk, head_dim_v=dv, heads_per_cta=hpc,
                page_size=page_size, block_n=block_n, q_dtype=dtype, kv_dtype=dtype, max_s_q=s_q)
    last_err = None
    for stages in (6, 5, 4, 3, 2):
        try:
            return build(DecodeConfig, {**base, "pipeline": {"num_kv_stages": stages,
                                                            "num_consumer": row_groups * col_groups}})
        except ConfigError as err:
            last_err = err
    raise ConfigError(f"no sm80 variant fits {family} with heads={heads}, head_dim={head_dim}, s_q={s_q}, "
                      f"page_size={page_size} on {arch}: {last_err}")
