"""The sm90 MLA kernel for fp8 caches (per-tensor, block scales of 64 or 128 columns, DeepSeek's packed fp8_ds_mla
token) and at most 16 query rows per CTA (schedule 'keys_m'), placed by templates/cuda/decode_sm90_keys_m.cu.j2: fp8
wgmma with the tile's keys as M, the cache never converted.

One CTA per (head block, sequence, split); two math warpgroups take alternate 64-key tiles, one producer warp (scaled
layouts: of a warpgroup that hands its registers to the math by setmaxnreg) loads each tile by TMA (five 128-column
fp8 boxes per page run, 128-byte swizzle) into a ring of `num_kv_stages` slots. Per tile a math warpgroup computes
S^T = K Q^T (wgmma m64n32k32 e4m3: the fp8 tile as A, Q^T as 32 e4m3 rows, each query row twice, hi = e4m3(c q) and
lo = e4m3(16 (c q - hi)), c = 400 / max|q| per row), the softmax over keys per query row (the tile maximum through
shared memory), P^T as hi and lo e4m3 halves of one tile's 128-byte rows (hi = e4m3(s p) in bytes 0-63, lo =
e4m3(s p - hi) in 64-127, s = 256 or, where the running maximum lags a tile's by up to the rescale slack, 128), and
O^T += V^T P^T (wgmma m64n16k32 e4m3, V^T's A fragments from the same slot by ldmatrix.trans and byte permutes, which
order each k32 block's keys (2i, 2i+1, 8+2i, 9+2i, ...): P^T is written in that order). The slot is released once the
fragments are in registers. At the end warpgroup 1 hands its O^T, maxima and sums to warpgroup 0 through the (then
idle) ring, which merges and writes the rows or the split partials.

Packed tokens (`packed`): the slot's fifth chunk is the rope's 64 bf16 values; the tile's scales land in the slot's
row of a scale ring beside the chunks (16 bytes a key, copied by the producer lanes); QK runs per 128-column scale
block plus a bf16 rope product, P^T is written once per scale block (docs/fp8.md). Block scales (`scale_block`): the
tokens load as per-tensor ones, the TMA thread bulk-copies each page run's rows of the scale tensor into the scale
ring (on the same full barrier), and QK and P^T run per scale block as for the packed token (the rope columns in
e4m3, their own block). bench/RESULTS.md, "fp8 MLA at 16 heads by fp8 wgmma with keys as M" and the thirty-third to
thirty-fifth sessions' sections, has the measurements and the numerics (bench/hilo_e4m3_error.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from .pipeline import MBARRIER_BYTES
from .policy import DS_MLA_LATENT, DS_MLA_SCALE_BLOCK, DS_MLA_SCALES
from .smem import SmemLayout, SmemLayoutBuilder

KEYS_M_ROWS = 16            # query rows per CTA: the wgmma N of the PV product (and half the QK product's)
KEYS_M_WARPGROUPS = 2       # math warpgroups, alternate tiles
KEYS_M_BLOCK_N = 64         # keys per tile: wgmma M
# Scaled layouts, setmaxnreg: a producer warpgroup (one warp of it works) keeps 40 registers a thread, each math
# warpgroup takes 232; 384 threads launch with 168 each (65536 / 384 in units of 8; 288 threads, a lone producer warp,
# get no more), and 40 + 2 x 232 = 3 x 168. Per-tensor keeps the lone producer warp: it fits 168 registers without
# spills, and the 384-thread build measured 0.965-0.987x of it (bench/RESULTS.md, thirty-fifth session).
KEYS_M_PRODUCER_REGS = 40
KEYS_M_MATH_REGS = 232
# Scaled layouts: the scale blocks' QK accumulators in flight; three (the 232 registers hold them) measured
# 1.004-1.031x of two with 64-column blocks (9 per row), 0.980-1.002x with 128 and 0.972-1.014x on the packed token (5
# and 4 blocks: bench/RESULTS.md, thirty-fifth session)
KEYS_M_QK_ACCUMULATORS = {9: 3}  # scale blocks per row -> accumulators (2 otherwise)
FP8_BOX_COLS = 128          # fp8 columns (bytes) per TMA box row, the swizzle span
QT_ROWS = 2 * KEYS_M_ROWS   # Q^T: hi rows, then lo rows
P_TILE_BYTES = KEYS_M_ROWS * 128  # one P^T tile: 16 rows of 128 bytes, a row's 64 keys' hi bytes then their lo bytes
P_LO_BYTES = 64             # where a P^T row's lo bytes start (the third and fourth k32 steps of the swizzled row)
ALIGN_SLACK = 1024 - 16
E4M3_MAX = 448.0            # the largest finite e4m3 value
KEYS_M_SCALE_BLOCKS = (64, 128)  # block scales' sizes schedule keys_m reads (32: nine-plus blocks of P^T per tile)
P_SCALE_MAX = 256           # P^T's scale when p <= 1: hi = e4m3(256 p) <= 256, lo = e4m3(256 p - hi) <= 8


@dataclass(frozen=True)
class Sm90KeysMTiling:
    head_dim_qk: int
    head_dim_v: int
    page_size: int
    stages: int
    rescale_slack_log2: float = 0.0  # P values reach 2^slack (DecodeConfig.rescale_slack_log2)
    packed: bool = False  # scale_mode 'fp8_ds_mla': 512 e4m3 latent columns, 4 fp32 scales, 64 bf16 rope values
    scale_block: int = 0  # scale_mode 'block': columns per fp32 scale (64 or 128; a separate tensor); 0 otherwise

    @property
    def p_scale(self) -> int:
        """P^T's e4m3 tiles hold p_scale * p: the largest power of two, at most P_SCALE_MAX, that keeps
        p_scale * 2^slack below e4m3's largest value."""
        scale = P_SCALE_MAX
        while scale * 2.0 ** self.rescale_slack_log2 > E4M3_MAX:
            scale //= 2
        return scale

    @property
    def math_threads(self) -> int:
        return 128 * KEYS_M_WARPGROUPS

    @property
    def producer_warpgroup(self) -> bool:
        """Whether the producer is a whole warpgroup (scaled layouts): its first warp loads, its other three only hand
        their registers to the math warpgroups (setmaxnreg) and exit; per-tensor: one producer warp."""
        return self.scaled

    @property
    def threads(self) -> int:
        """The math warpgroups, then the producer warp or warpgroup."""
        return self.math_threads + (128 if self.producer_warpgroup else 32)

    @property
    def chunks(self) -> int:
        """128-column fp8 chunks of a cached row (the last one zero-filled past head_dim_qk by the TMA); packed:
        the four latent chunks, then the 64 bf16 rope values (128 bytes) as a fifth."""
        if self.packed:
            return DS_MLA_LATENT // FP8_BOX_COLS + 1
        return -(-self.head_dim_qk // FP8_BOX_COLS)

    @property
    def latent_chunks(self) -> int:
        """Chunks the QK product reads as e4m3 (packed: the latent ones; the rope chunk is bf16)."""
        return DS_MLA_LATENT // FP8_BOX_COLS if self.packed else self.chunks

    @property
    def chunk_cols(self) -> tuple[int, ...]:
        """Each chunk's first byte in a cached token (the TMA box's column): packed, the rope chunk starts past the
        latent values and the scales."""
        if self.packed:
            return tuple(c * FP8_BOX_COLS for c in range(self.latent_chunks)) + (DS_MLA_LATENT + 4 * DS_MLA_SCALES,)
        return tuple(c * FP8_BOX_COLS for c in range(self.chunks))

    @property
    def scaled(self) -> bool:
        """Per-key scales per column block (the packed token's or a block-scale tensor's), read from the slot."""
        return self.packed or self.scale_block > 0

    @property
    def scale_cols(self) -> int:
        """Columns per scale (0 per-tensor)."""
        return DS_MLA_SCALE_BLOCK if self.packed else self.scale_block

    @property
    def scale_blocks(self) -> int:
        """Scales per token that the QK product applies (packed: the four latent blocks; block scales: every block of
        the row, the last one short where head_dim_qk is not a multiple); 0 per-tensor."""
        if self.packed:
            return DS_MLA_SCALES
        return -(-self.head_dim_qk // self.scale_block) if self.scale_block else 0

    @property
    def pv_scale_blocks(self) -> int:
        """Scale blocks of the value columns (the first head_dim_v): P^T is written once per block; 0 per-tensor."""
        return self.head_dim_v // self.scale_cols if self.scaled else 0

    @property
    def steps_per_scale(self) -> int:
        """e4m3 k32 steps of the QK product per scale block (all of them per-tensor)."""
        return self.scale_cols // 32 if self.scaled else self.qk_steps

    @property
    def qk_accumulators(self) -> int:
        """Scaled layouts: the QK product's per-scale-block accumulators, rotating, so that one block is added into S
        with its scales while the next ones' wgmmas run (1 per-tensor: one chain over the whole row)."""
        return KEYS_M_QK_ACCUMULATORS.get(self.scale_blocks, 2) if self.scaled else 1

    @property
    def scale_row_bytes(self) -> int:
        """One key's scales in a slot: packed, the token's 16 bytes (copied by the producer lanes, 16 bytes a lane);
        block scales, the tensor's row of scale_blocks floats (bulk-copied per page run with the tile's boxes)."""
        if self.packed:
            return 4 * DS_MLA_SCALES
        return 4 * self.scale_blocks

    @property
    def scale_bytes(self) -> int:
        """A tile's scales in its slot, past its chunks."""
        return KEYS_M_BLOCK_N * self.scale_row_bytes

    @property
    def scale_slot_bytes(self) -> int:
        """One slot of the scale ring (scaled; 16-byte aligned): a tile's scales, apart from the chunks so that the
        chunk slots stay whole 1 KB swizzle atoms with no padding."""
        return -(-self.scale_bytes // 16) * 16

    @property
    def red_stride(self) -> int:
        """Floats per tile parity of a warpgroup's reduction scratch: the four warps' 16 row maxima, and (scaled) their
        maxima of each value block's scales."""
        return 4 * KEYS_M_ROWS + 4 * self.pv_scale_blocks

    @property
    def p_tile_bytes(self) -> int:
        return P_TILE_BYTES

    @property
    def p_lo_bytes(self) -> int:
        """Where a P^T row's lo bytes start (its first 64 bytes hold the hi ones)."""
        return P_LO_BYTES

    @property
    def v_blocks_per_scale(self) -> int:
        """64-dim PV blocks per value scale block (per-tensor: all of them, one P^T tile)."""
        return self.scale_cols // 64 if self.scaled else self.dv_blocks

    @property
    def chunk_bytes(self) -> int:
        return KEYS_M_BLOCK_N * 128

    @property
    def stage_bytes(self) -> int:
        """A ring slot: the chunks (whole 1 KB swizzle atoms; the scales have their own ring)."""
        return self.chunks * self.chunk_bytes

    @property
    def qt_chunk_bytes(self) -> int:
        return QT_ROWS * 128

    @property
    def box_rows(self) -> int:
        return min(self.page_size, KEYS_M_BLOCK_N)

    @property
    def boxes_per_tile(self) -> int:
        return KEYS_M_BLOCK_N // self.box_rows

    @property
    def box_bytes(self) -> int:
        return self.box_rows * 128

    @property
    def qk_steps(self) -> int:
        """e4m3 k32 steps of the QK product (packed: the latent columns; the rope's bf16 k16 steps apart)."""
        return (DS_MLA_LATENT if self.packed else self.head_dim_qk) // 32

    @property
    def rope_steps(self) -> int:
        """Packed: bf16 k16 steps of the rope's QK product (64 values); 0 per-tensor."""
        return (self.head_dim_qk - DS_MLA_LATENT) // 16 if self.packed else 0

    @property
    def p_tiles(self) -> int:
        """P^T tiles per math warpgroup (each row: the hi bytes, then the lo bytes): scaled, one per value scale block
        (p times that block's per-key scale)."""
        return max(1, self.pv_scale_blocks)

    @property
    def dv_blocks(self) -> int:
        """64-dim blocks of the PV product's M."""
        return self.head_dim_v // 64

    @property
    def layout(self) -> SmemLayout:
        """Q^T (hi and lo rows), per math warpgroup its P^T tiles and reduction scratch, the warpgroups' row statistics
        and Q's row scales, the ring (scaled: and its scale ring), its barriers, room to round the base up to 1024 B;
        the epilogue's hand-over of warpgroup 1's O^T over the ring (idle by then)."""
        b = SmemLayoutBuilder()
        b.add("qt", self.latent_chunks * self.qt_chunk_bytes, align=1024)
        if self.packed:
            b.add("q_rope", KEYS_M_ROWS * 128, align=1024)  # 16 rows of 64 bf16 values, 128-byte swizzle
        b.add("p_tiles", KEYS_M_WARPGROUPS * self.p_tiles * P_TILE_BYTES, align=1024)
        # per warpgroup: [2] x (float[4][16] tile maxima, float[4][4] packed: the tile's scale maxima), float[4][16]
        # sums
        b.add("red", KEYS_M_WARPGROUPS * 1024, align=16)
        b.add("stats", KEYS_M_WARPGROUPS * 2 * KEYS_M_ROWS * 4, align=16)  # per warpgroup: row max, row sum
        b.add("q_scale", KEYS_M_ROWS * 4, align=16)
        b.add("kv_stages", self.stages * self.stage_bytes, align=1024)
        if self.scaled:
            b.add("kv_scales", self.stages * self.scale_slot_bytes, align=16)
        b.add("barriers", 2 * self.stages * MBARRIER_BYTES, align=MBARRIER_BYTES)
        b.add("align_slack", ALIGN_SLACK, align=16)
        b.overlay("o_xfer", "kv_stages", self.o_xfer_bytes)
        return b.build(aliases=(("o_xfer", "kv_stages"),))

    @property
    def o_xfer_bytes(self) -> int:
        """Warpgroup 1's O^T (fp32, thread-major) handed to warpgroup 0."""
        return 128 * (self.head_dim_v * KEYS_M_ROWS // 128) * 4

    @property
    def run_tx_bytes(self) -> int:
        """Bytes one page run of a tile brings by the TMA thread: its chunks' boxes and (block scales) its keys'
        scales, bulk-copied (the packed token's scales arrive by cp.async, counted as the producer lanes' arrivals)."""
        return self.chunks * self.box_bytes + (self.box_rows * self.scale_row_bytes if self.scale_block else 0)

    @property
    def tile_tx_bytes(self) -> int:
        return self.boxes_per_tile * self.run_tx_bytes

    def problems(self, rows: int) -> list[str]:
        out = []
        if rows > KEYS_M_ROWS:
            out.append(f"{rows} query rows (heads_per_cta x max_s_q): schedule 'keys_m' holds at most {KEYS_M_ROWS}")
        if self.stages % KEYS_M_WARPGROUPS or not 2 <= self.stages <= 4:
            out.append(f"num_kv_stages={self.stages}: schedule 'keys_m' takes 2 or 4 (a multiple of its "
                       f"{KEYS_M_WARPGROUPS} math warpgroups, which wait on their slots by parity)")
        if self.head_dim_qk % 32 or self.head_dim_v % 64 or self.head_dim_v > self.head_dim_qk:
            out.append(f"head dims {self.head_dim_qk}/{self.head_dim_v}: k32 steps and 64-dim blocks")
        if self.packed and (self.head_dim_qk, self.head_dim_v) != (DS_MLA_LATENT + 64, DS_MLA_LATENT):
            out.append(f"head dims {self.head_dim_qk}/{self.head_dim_v}: the packed fp8_ds_mla token holds 512 latent "
                       "and 64 rope values")
        if self.scale_block and (self.scale_block not in KEYS_M_SCALE_BLOCKS or self.head_dim_v % self.scale_block):
            out.append(f"scale_block_size={self.scale_block}: schedule 'keys_m' takes block scales of "
                       f"{' or '.join(map(str, KEYS_M_SCALE_BLOCKS))} columns (whole 64-dim PV blocks and k32 steps "
                       f"each, dividing head_dim_v={self.head_dim_v})")
        if self.scaled and 2 * self.red_stride + 4 * KEYS_M_ROWS > 256:
            out.append(f"{self.pv_scale_blocks} value scale blocks: the reduction scratch holds 1 KB per warpgroup")
        return out
