"""The fp8 register path's shared-memory swizzle (codegen/decode_sm80.py `fp8_row_swizzle`):
stores stay inside the row, and the consumers' 32-bit reads of K and V (the lane patterns of
kvforge/sm80_fp8_frag.cuh) hit every bank at most once per warp (V of 64-byte rows: at most twice,
which the docstring states)."""
from __future__ import annotations

import pytest

from kvforge.codegen.decode_sm80 import FP8_SWIZZLE_CHUNKS, fp8_row_swizzle


def _position(swz, row, chunk):
    return chunk ^ swz[row % 16]


def _conflict_degree(addresses):
    """Most distinct 4-byte words one bank serves for a warp's 32 reads (1 = conflict-free)."""
    words_per_bank = {}
    for a in addresses:
        words_per_bank.setdefault((a // 4) % 32, set()).add(a // 4)
    return max(len(w) for w in words_per_bank.values())


@pytest.mark.parametrize("chunks", FP8_SWIZZLE_CHUNKS)
def test_swizzle_permutes_each_row(chunks):
    swz = fp8_row_swizzle(chunks)
    for row in range(64):
        assert sorted(_position(swz, row, c) for c in range(chunks)) == list(range(chunks))


@pytest.mark.parametrize("chunks", FP8_SWIZZLE_CHUNKS)
def test_k_reads_are_conflict_free(chunks):
    """load_kt8_e4m3: lane (g, t) reads key n0 + g, depth bytes k0 + 4t of the k16 step."""
    swz, stride = fp8_row_swizzle(chunks), 16 * chunks
    for n0 in range(0, 64, 8):
        for kc in range(chunks):
            addrs = [(n0 + lane // 4) * stride + _position(swz, n0 + lane // 4, kc) * 16 + 4 * (lane % 4)
                     for lane in range(32)]
            assert _conflict_degree(addrs) == 1, (chunks, n0, kc)


@pytest.mark.parametrize("chunks", FP8_SWIZZLE_CHUNKS)
def test_v_reads_are_conflict_free(chunks):
    """load_v32_e4m3: for r = 0..3, lane (g, t) reads row k0 + 4t + r, byte c0 + 4g."""
    swz, stride = fp8_row_swizzle(chunks), 16 * chunks
    worst = 0
    for k0 in range(0, 64, 16):
        for c0 in range(0, 16 * chunks, 32):
            for r in range(4):
                addrs = []
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    row, col = k0 + 4 * t + r, c0 + 4 * g
                    addrs.append(row * stride + _position(swz, row, col // 16) * 16 + col % 16)
                worst = max(worst, _conflict_degree(addrs))
    assert worst == (1 if chunks % 8 == 0 else 2)


def _tma_offset(rows, row, byte):
    """Swizzle128Tile<rows, 1>: the TMA's 128-byte swizzle over 128-byte column chunks stacked
    [chunk][row][128 B], 16-byte unit u of row r at u ^ (r % 8)."""
    return (byte // 128) * rows * 128 + row * 128 + (((byte // 16) % 8) ^ (row % 8)) * 16 + byte % 16


@pytest.mark.parametrize("d", [128, 256])
def test_tma_filled_tiles_are_read_without_conflicts_in_the_ptx_key_order(d):
    """kv_load='tma' fp8 tiles: K^T reads (keys n0 + g, bytes k0 + 4t) are conflict-free under the
    TMA's swizzle, and V's reads are when each thread's keys keep the PTX order (2t, 2t+1, 2t+8,
    2t+9: `kNaturalKeys`); the register path's k-permuted order (4t + r) would be 2-way conflicted."""
    rows = 64
    for n0 in range(0, rows, 8):
        for k0 in range(0, d, 16):
            addrs = [_tma_offset(rows, n0 + lane // 4, k0 + 4 * (lane % 4)) for lane in range(32)]
            assert _conflict_degree(addrs) == 1, (n0, k0)
    worst = {"natural": 0, "k4": 0}
    for k0 in range(0, rows, 16):
        for c0 in range(0, d, 32):
            for r in range(4):
                for order in worst:
                    addrs = []
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        row = k0 + (2 * t + (r & 1) + 8 * (r >> 1) if order == "natural" else 4 * t + r)
                        addrs.append(_tma_offset(rows, row, c0 + 16 * (g // 4) + 4 * (g % 4)))
                    worst[order] = max(worst[order], _conflict_degree(addrs))
    assert worst == {"natural": 1, "k4": 2}


def test_bulk_copied_mla_rows_padded_to_592_bytes_read_like_the_swizzled_ones():
    """MLA fp8 with kv_load='bulk' (no swizzle: a bulk copy lands contiguously; rows 576 + 16 bytes
    apart): K's reads stay conflict-free and V's at most 2-way, as with the swizzle."""
    stride, chunks = 592, 36
    k_worst = max(_conflict_degree([(n0 + lane // 4) * stride + kc * 16 + 4 * (lane % 4) for lane in range(32)])
                  for n0 in range(0, 64, 8) for kc in range(chunks))
    assert k_worst == 1
    v_worst = 0
    for k0 in range(0, 64, 16):
        for c0 in range(0, 512, 32):
            for r in range(4):
                addrs = [(k0 + 4 * (lane % 4) + r) * stride + ((c0 >> 4) + ((lane >> 2) >> 2)) * 16 + 4 * ((lane >> 2) & 3)
                         for lane in range(32)]
                v_worst = max(v_worst, _conflict_degree(addrs))
    swz = fp8_row_swizzle(chunks)
    v_swizzled = max(_conflict_degree([(k0 + 4 * (lane % 4) + r) * 576
                                       + _position(swz, k0 + 4 * (lane % 4) + r, (c0 >> 4) + (lane >> 4)) * 16
                                       + 4 * ((lane >> 2) & 3) for lane in range(32)])
                     for k0 in range(0, 64, 16) for c0 in range(0, 512, 32) for r in range(4))
    assert v_worst == 2 and v_swizzled == 2
