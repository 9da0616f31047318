"""NumPy emulation of the CDNA decode kernel's exact tiling: the global -> register -> LDS
distribution, the XOR-swizzled LDS tiles, every MFMA operand assembled lane by lane from the maps
in codegen/cdna_layout.py, the per-wavefront key split, the cross-wavefront softmax, P rounded to
bf16/fp16 in LDS, split-KV partials and the combine. This is the numerical check of the HIP
kernels available without AMD hardware: it validates the layout math the template uses, not the
compiled code object.
"""
from __future__ import annotations

import numpy as np

from kvforge.codegen.cdna_layout import WAVE, lds_element_offset, tile_swizzles, token_chunk
from kvforge.codegen.decode import DecodeConfig
from kvforge.codegen.policy import split_plan

LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 values to bf16 (nearest even) or fp16, returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def _lds_tile(values: np.ndarray, period: int) -> np.ndarray:
    """Logical [rows, cols] -> the swizzled flat LDS array the kernel writes."""
    rows, cols = values.shape
    flat = np.full(rows * cols, np.nan, dtype=np.float32)  # a read of an unwritten element shows
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    offs = np.vectorize(lambda a, b: lds_element_offset(a, b, cols, period))(r, c)
    flat[offs.ravel()] = values.ravel()
    return flat


def _lds_read(flat: np.ndarray, rows: np.ndarray, cols: np.ndarray, row_elems: int, period: int) -> np.ndarray:
    offs = np.vectorize(lambda a, b: lds_element_offset(int(a), int(b), row_elems, period))(rows, cols)
    return flat[offs]


class _Maps:
    """Per-lane operand coordinates of one MFMA shape, as index arrays [lane, item]."""

    def __init__(self, mf):
        lanes = np.arange(WAVE)[:, None]
        items4 = np.arange(4)[None, :]
        itemsc = np.arange(mf.c_items)[None, :]
        self.a_row, self.a_k = np.vectorize(mf.a_coords)(lanes, items4)
        self.b_k, self.b_col = np.vectorize(mf.b_coords)(lanes, items4)
        self.c_row, self.c_col = np.vectorize(mf.c_coords)(lanes, itemsc)
        self.mf = mf

    def mfma(self, a_regs, b_regs, acc):
        """acc[lane, item] += (A @ B)[c_row, c_col] with A, B assembled from the lanes' registers."""
        A = np.zeros((self.mf.m, self.mf.k), np.float32)
        B = np.zeros((self.mf.k, self.mf.n), np.float32)
        A[self.a_row, self.a_k] = a_regs
        B[self.b_k, self.b_col] = b_regs
        return acc + (A @ B)[self.c_row, self.c_col]


def _load_tile(cache, bt_row, kv_head, j0, key_end, page_size, depth, cfg: DecodeConfig, role: int, period: int):
    """The registers every thread holds after load_from_dram, copied to the swizzled LDS tile."""
    buf = cfg.kv_buffers[role]
    cpr = buf.chunks_per_token
    tile = np.zeros((cfg.block_n, depth), np.float32)
    for thread in range(cfg.threads):
        for load in range(buf.loads_per_thread):
            tok, chunk = token_chunk(thread, load, cfg.threads, cpr)
            j = j0 + tok
            if j < key_end:
                page = bt_row[j // page_size]
                tile[tok, chunk * 8:(chunk + 1) * 8] = cache[page, j % page_size, kv_head, chunk * 8:(chunk + 1) * 8]
    return _lds_tile(tile, period)


def emulate_workgroup(cfg: DecodeConfig, q, k_cache, v_cache, bt_row, seqlen, split, n_splits, chunk, head_block,
                      scale_log2, causal):
    """One workgroup (head block, sequence, split): returns ({(qi, head): o_row}, {(qi, head): lse})."""
    mf = cfg.mfma
    maps = _Maps(mf)
    sw = tile_swizzles(cfg)
    s_q, num_q_heads = q.shape[0], q.shape[1]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    dqk, dv, bn, waves = cfg.head_dim_qk, cfg.head_dim_v, cfg.block_n, cfg.waves
    hpc, rows = cfg.heads_per_cta, cfg.q_rows
    is_mla = cfg.family == "mla_decode"
    kv_head = 0 if is_mla else head_block
    head0 = head_block * hpc
    key_begin = split * chunk
    key_end = min(seqlen, key_begin + chunk)
    num_tiles = -(-(key_end - key_begin) // bn) if key_end > key_begin else 0

    def row_info(r):
        qi, head = r // hpc, head0 + r % hpc
        return qi, head, qi < s_q and head < num_q_heads

    qtile = np.zeros((rows, dqk), np.float32)
    for r in range(rows):
        qi, head, ok = row_info(r)
        if ok:
            qtile[r] = q[qi, head]
    q_lds = _lds_tile(qtile, sw["q"])
    last_key = np.array([min(key_end, seqlen - s_q + row_info(r)[0] + 1 if causal else key_end) - 1
                         for r in range(rows)])

    slices = cfg.qk_key_slices
    kpw, cpw = cfg.kv_buffers[0].WN, dv // waves
    m_run = np.full(rows, -np.inf, np.float32)   # per row (every lane holding the row keeps a copy)
    l_wave = np.zeros((waves, rows), np.float32)  # each wavefront's share of the row sums
    o = [np.zeros((cpw // mf.n, WAVE, mf.c_items), np.float32) for _ in range(waves)]
    for t in range(num_tiles):
        j0 = key_begin + t * bn
        k_lds = _load_tile(k_cache, bt_row, kv_head, j0, key_end, page_size, dqk, cfg, 0, sw["k"])
        v_lds = k_lds if is_mla else _load_tile(v_cache, bt_row, kv_head, j0, key_end, page_size, dv, cfg, 1, sw["v"])
        v_row_elems = dqk if is_mla else dv
        s_tiles = []
        for w in range(slices):  # QK: wavefront w takes key slice w (waves past the slices repeat it)
            per_wave = []
            for jn in range(kpw // mf.n):
                acc = np.zeros((WAVE, mf.c_items), np.float32)
                for k0 in range(0, dqk, mf.k):
                    a = _lds_read(q_lds, maps.a_row, k0 + maps.a_k, dqk, sw["q"])
                    b = _lds_read(k_lds, w * kpw + jn * mf.n + maps.b_col, k0 + maps.b_k, dqk, sw["k"])
                    acc = maps.mfma(a, b, acc)
                per_wave.append(acc)
            s_tiles.append(per_wave)
        # softmax: rows from C items, keys from lanes; row max within a wavefront, then across them
        s_mat = np.full((rows, bn), -np.inf, np.float32)
        for w in range(slices):
            for jn, acc in enumerate(s_tiles[w]):
                keys = w * kpw + jn * mf.n + maps.c_col
                vals = acc * np.float32(scale_log2)
                visible = (j0 + keys) <= last_key[maps.c_row]
                s_mat[maps.c_row, keys] = np.where(visible, vals, -np.inf)
        wave_max = np.stack([s_mat[:, w * kpw:(w + 1) * kpw].max(axis=1) for w in range(slices)])
        m_new = np.maximum(m_run, wave_max.max(axis=0))
        m_use = np.where(np.isneginf(m_new), 0, m_new).astype(np.float32)
        alpha = np.exp2(m_run - m_use).astype(np.float32)
        p = np.exp2(s_mat - m_use[:, None]).astype(np.float32)
        for w in range(slices):
            l_wave[w] = l_wave[w] * alpha + p[:, w * kpw:(w + 1) * kpw].sum(axis=1)
        m_run = m_new
        p_lds = _lds_tile(round_to(p, cfg.q_dtype), sw["p"])
        for w in range(waves):  # PV: wavefront w takes V columns w*cpw ..
            for jn in range(cpw // mf.n):
                acc = o[w][jn] * alpha[maps.c_row]
                for k0 in range(0, bn, mf.k):
                    a = _lds_read(p_lds, maps.a_row, k0 + maps.a_k, bn, sw["p"])
                    b = _lds_read(v_lds, k0 + maps.b_k, w * cpw + jn * mf.n + maps.b_col, v_row_elems, sw["v"])
                    acc = maps.mfma(a, b, acc)
                o[w][jn] = acc
    l_tot = l_wave.sum(axis=0)
    outs, lses = {}, {}
    for r in range(rows):
        qi, head, ok = row_info(r)
        if not ok:
            continue
        row = np.zeros(dv, np.float32)
        for w in range(waves):
            for jn in range(cpw // mf.n):
                sel = maps.c_row == r
                cols = w * cpw + jn * mf.n + maps.c_col[sel]
                row[cols] = o[w][jn][sel]
        inv = 1.0 / l_tot[r] if l_tot[r] > 0 else 0.0
        outs[(qi, head)] = row * np.float32(inv)
        lses[(qi, head)] = m_run[r] * LN2 + np.log(l_tot[r]) if l_tot[r] > 0 else -np.inf
    return outs, lses


def emulate_decode(cfg: DecodeConfig, q, k_cache, v_cache, block_table, seqlens, *, scale, causal, num_splits):
    """The whole call (plan, workgroups, combine) as the HIP kernels run it.

    q [B, s_q, Hq, Dqk]; caches [P, page, Hkv, D] (MLA: the latent cache as both, Hkv = 1)."""
    batch, s_q, hq, _ = q.shape
    dv = cfg.head_dim_v
    head_blocks = -(-hq // cfg.heads_per_cta) if cfg.family == "mla_decode" else k_cache.shape[2]
    out = np.zeros((batch, s_q, hq, dv), np.float32)
    lse = np.full((batch, hq, s_q), -np.inf, np.float32)
    for b in range(batch):
        n, chunk = split_plan(int(seqlens[b]), num_splits, cfg.min_keys_per_split, cfg.block_n)
        parts = []
        for split in range(n):
            merged_o, merged_l = {}, {}
            for hb in range(head_blocks):
                o, l = emulate_workgroup(cfg, q[b], k_cache, v_cache, block_table[b], int(seqlens[b]), split, n,
                                         chunk, hb, scale * LOG2E, causal)
                merged_o.update(o)
                merged_l.update(l)
            parts.append((merged_o, merged_l))
        for (qi, head) in parts[0][0]:
            lses_s = np.array([p[1][(qi, head)] for p in parts], np.float32)
            if n == 1:
                out[b, qi, head] = parts[0][0][(qi, head)]
                lse[b, head, qi] = lses_s[0]
                continue
            lmax = lses_s.max()
            base = 0.0 if np.isneginf(lmax) else lmax
            w = np.exp(lses_s - base)
            wsum = w.sum()
            acc = sum((wi / wsum if wsum > 0 else 0.0) * p[0][(qi, head)] for wi, p in zip(w, parts))
            out[b, qi, head] = acc
            lse[b, head, qi] = base + np.log(wsum) if wsum > 0 else -np.inf
    return round_to(out, cfg.q_dtype), lse
