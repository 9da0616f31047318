"""The CDNA (AMD) kernel's layout math, in one place: which lane holds which element of each MFMA
operand, the LDS XOR swizzle, the global -> register -> LDS distribution of KV tokens, and the
tile order. The HIP template places these constants; the NumPy emulation (runtime/cdna_emulation.py)
runs the kernel's exact tiling through the same functions.
"""
from __future__ import annotations

from dataclasses import dataclass

WAVE = 64
CHUNK_BYTES = 16  # one global load / LDS store per lane per step
ELEM_BYTES = 2


@dataclass(frozen=True)
class Mfma:
    """v_mfma_f32_{m}x{n}x{k}{bf16_1k,f16}: A m x k, B k x n, C/D m x n fp32, 4 A/B items per lane."""

    m: int
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def c_items(self) -> int:
        return self.m * self.n // WAVE

    def a_coords(self, lane: int, item: int) -> tuple[int, int]:
        """(row, k) of A held by `lane` as item 0..3."""
        return lane % self.m, (lane // self.m) * 4 + item

    def b_coords(self, lane: int, item: int) -> tuple[int, int]:
        """(k, col) of B held by `lane` as item 0..3."""
        return (lane // self.n) * 4 + item, lane % self.n

    def c_coords(self, lane: int, item: int) -> tuple[int, int]:
        """(row, col) of C/D held by `lane` as item 0..c_items-1."""
        return (item % 4) + 4 * (lane // self.n) + (256 // self.n) * (item // 4), lane % self.n

    @property
    def c_row_stride(self) -> int:
        """Row step between item groups of 4 in C (the `256 / n` of c_coords)."""
        return 256 // self.n


MFMA = {"16x16x16": Mfma(16, 16, 16), "32x32x8": Mfma(32, 32, 8)}


def swizzle_period(chunks_per_row: int) -> int:
    """XOR period of a tile's 16-byte chunks: 8 (a full 128-byte bank sweep) or the row's chunk count."""
    return min(8, chunks_per_row)


def lds_element_offset(row: int, col: int, row_elems: int, period: int) -> int:
    """Element offset of logical (row, col) in an LDS tile of `row_elems` per row whose 16-byte
    chunks are XOR-swizzled with `period` (1: no swizzle)."""
    per = CHUNK_BYTES // ELEM_BYTES
    return row * row_elems + ((col // per) ^ (row % period)) * per + col % per


def tile_swizzles(cfg) -> dict[str, int]:
    """The XOR period of each LDS tile of a cdna DecodeConfig (Q, K, V, P). MLA's V is read from
    the K tile, so it shares K's period."""
    k, v = cfg.kv_buffers
    per = CHUNK_BYTES // ELEM_BYTES
    k_period = swizzle_period(cfg.head_dim_qk // per) if k.swizzle else 1
    v_period = k_period if cfg.family == "mla_decode" else (swizzle_period(cfg.head_dim_v // per) if v.swizzle else 1)
    return {"q": swizzle_period(cfg.head_dim_qk // per), "k": k_period, "v": v_period,
            "p": swizzle_period(cfg.block_n // per)}


def token_chunk(thread: int, load: int, num_threads: int, chunks_per_row: int) -> tuple[int, int]:
    """(token, chunk) that `thread` moves at its `load`-th step (flat, coalesced distribution)."""
    flat = thread + load * num_threads
    return flat // chunks_per_row, flat % chunks_per_row
