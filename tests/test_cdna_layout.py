"""The CDNA layout maps: every MFMA operand element is held by exactly one (lane, item), the
swizzle is a permutation that spreads an operand read over the banks, and the token distribution
covers a tile exactly once."""
from __future__ import annotations

import itertools

import pytest

from kvforge.codegen.cdna_layout import MFMA, WAVE, lds_element_offset, swizzle_period, token_chunk


@pytest.mark.parametrize("shape", sorted(MFMA))
def test_mfma_operand_maps_are_bijections(shape):
    mf = MFMA[shape]
    a = {mf.a_coords(lane, i) for lane in range(WAVE) for i in range(4)}
    b = {mf.b_coords(lane, i) for lane in range(WAVE) for i in range(4)}
    c = {mf.c_coords(lane, i) for lane in range(WAVE) for i in range(mf.c_items)}
    assert a == set(itertools.product(range(mf.m), range(mf.k)))
    assert b == set(itertools.product(range(mf.k), range(mf.n)))
    assert c == set(itertools.product(range(mf.m), range(mf.n)))


def test_c_rows_of_a_lane_group_are_shared():
    """Lanes with the same lane // n hold the same C rows: the softmax row reduction runs over them."""
    for mf in MFMA.values():
        for lane in range(WAVE):
            group = [g for g in range(WAVE) if g // mf.n == lane // mf.n]
            rows = {mf.c_coords(lane, i)[0] for i in range(mf.c_items)}
            assert all({mf.c_coords(g, i)[0] for i in range(mf.c_items)} == rows for g in group)


@pytest.mark.parametrize("row_elems", [64, 128, 576])
def test_swizzle_is_a_permutation_within_each_row(row_elems):
    period = swizzle_period(row_elems // 8)
    for row in range(16):
        offs = sorted(lds_element_offset(row, col, row_elems, period) for col in range(row_elems))
        assert offs == list(range(row * row_elems, (row + 1) * row_elems))


def test_swizzle_spreads_a_k_operand_read_over_distinct_chunks():
    """The B read of S = Q K^T: 16 lanes read 8 bytes of 16 different tokens at one depth. Unswizzled
    they all hit one 16-byte bank group; swizzled, each group of 8 tokens hits 8 distinct groups."""
    row_elems = 128
    for swz, want in ((1, 1), (swizzle_period(row_elems // 8), 8)):
        groups = {(lds_element_offset(tok, 16, row_elems, swz) * 2 // 16) % 8 for tok in range(8)}
        assert len(groups) == want


@pytest.mark.parametrize("tokens,chunks,threads", [(16, 72, 128), (32, 16, 128), (32, 16, 64), (32, 8, 128)])
def test_token_distribution_covers_the_tile_once(tokens, chunks, threads):
    loads = tokens * chunks // threads
    seen = [token_chunk(t, i, threads, chunks) for t in range(threads) for i in range(loads)]
    assert sorted(seen) == sorted(itertools.product(range(tokens), range(chunks)))
    # consecutive threads read consecutive 16-byte chunks of a token (coalesced)
    assert token_chunk(1, 0, threads, chunks) == (0, 1)
