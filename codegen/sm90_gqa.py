"""The sm90 backend's GQA/MHA/MQA tiling (sm_90a), placed by templates/cuda/decode_sm90_gqa.cu.j2.

One CTA per (KV head, sequence, split) holds that KV head's group x s_q query rows in one or two
wgmma M tiles of 64 rows. Warpgroup 0 is the producer: one thread walks the block table and loads
each tile of 64 keys by TMA (K then V, head_dim columns each, as 128-byte-swizzle chunks of 64
columns, a box per page or 64-row half page) into the mbarrier ring. Math warpgroup g owns query
rows 64g .. 64g + 63 and takes every tile: S = Q K^T (wgmma m64n64k16, Q and K from shared memory),
the online softmax in registers (its rows are its own: nothing is exchanged), then O += P V (wgmma
m64nDk16, P from registers in the accumulator's own layout, V MN-major from shared memory), and
releases the stage. Everything the template needs is derived here, once, from the config's head
dim, rows, page size and ring depth.
"""
from __future__ import annotations

from dataclasses import dataclass

from .arch import arch_spec
from .pipeline import MBARRIER_BYTES
from .smem import SmemLayout, SmemLayoutBuilder

GQA_BLOCK_N = 64        # keys per tile: wgmma N of the QK product, four k16 steps of the PV product
WGMMA_M = 64
SWIZZLE_COLS = 64       # 16-bit columns per 128-byte swizzle row
CHUNK_BYTES = GQA_BLOCK_N * 128  # one 64-column chunk of a 64-row tile
REGISTER_FILE = 65536
REG_UNIT = 8
PRODUCER_REGS = 40      # setmaxnreg: the producer warpgroup (one thread issues the TMA loads)
# fp8 KV: every producer thread holds its share of the next K and V tiles (2 rows x 16 bytes per 64-column chunk
# each, and their block scales) while it waits for a free slot
FP8_PRODUCER_REGS = {64: 72, 128: 88, 256: 120}
ALIGN_SLACK = 1024 - 16  # the kernel rounds its dynamic shared-memory base up to 1024 B
# Rows (group x s_q) from which the built-in choice on sm_90 takes this kernel over the sm80 one
# (bench/gqa_rows.py measures both; bench/RESULTS.md "GQA on the sm90 backend").
SM90_GQA_MIN_ROWS = 32
# ... for fp8 caches, per layout (bench/gqa_rows.py --fp8 [--scale-block N], bench/RESULTS.md "fp8 GQA on the sm90
# kernel, built in"): per-tensor from 32 rows (1.06-1.32x the sm80 fp8 kernel there) except D = 256, where the sm80
# kernel is 1.09x faster at 32 rows and 2.15x slower at 64; block scales from 64 rows (0.76-0.95x at 32 rows
# with 128-wide blocks, 1.58-3.48x at 64 and more).
SM90_GQA_FP8_MIN_ROWS = {"per_tensor": 32, "block": 64}
SM90_GQA_FP8_D256_MIN_ROWS = 64


def sm90_gqa_min_rows(head_dim: int, scale_mode: str = "none") -> int:
    """Query rows per KV head from which the built-in choice takes the sm90 GQA kernel, for a cache of
    `scale_mode` ('none': 16-bit)."""
    if scale_mode == "none":
        return SM90_GQA_MIN_ROWS
    rows = SM90_GQA_FP8_MIN_ROWS[scale_mode]
    return max(rows, SM90_GQA_FP8_D256_MIN_ROWS) if head_dim == 256 else rows


def smem_limit_per_cta(arch: str, ctas_per_sm: int) -> int:
    """Dynamic shared memory one of `ctas_per_sm` CTAs may take on an SM of `arch` (each CTA also
    costs the SM a 1 KB reserve)."""
    spec = arch_spec(arch)
    return min(spec.max_smem_per_block, (spec.max_smem_per_block + 1024) // ctas_per_sm - 1024)


@dataclass(frozen=True)
class Sm90GqaTiling:
    head_dim: int
    rows: int        # query rows per CTA: group x max_s_q
    page_size: int
    stages: int      # KV tiles (K and V) in the ring
    arch: str = "sm_90a"
    fp8: bool = False  # fp8 caches: the producer warpgroup loads, dequantizes and stores the tiles

    @property
    def math_warpgroups(self) -> int:
        return -(-self.rows // WGMMA_M)

    @property
    def q_rows(self) -> int:
        return WGMMA_M * self.math_warpgroups

    @property
    def threads(self) -> int:
        return 128 * (1 + self.math_warpgroups)

    @property
    def math_threads(self) -> int:
        return 128 * self.math_warpgroups

    @property
    def chunks(self) -> int:
        """64-column chunks of a row of Q, K or V."""
        return self.head_dim // SWIZZLE_COLS

    @property
    def q_block_bytes(self) -> int:
        """One math warpgroup's 64 query rows."""
        return self.chunks * WGMMA_M * 128

    @property
    def chunk_bytes(self) -> int:
        """One 64-column chunk of a K or V tile (or of a warpgroup's 64 query rows)."""
        return CHUNK_BYTES

    @property
    def tile_bytes(self) -> int:
        """A K (or V) tile: 64 keys x head_dim."""
        return self.chunks * CHUNK_BYTES

    @property
    def stage_bytes(self) -> int:
        """A ring stage: the K tile, then the V tile."""
        return 2 * self.tile_bytes

    @property
    def box_rows(self) -> int:
        """Rows per TMA box: a page, or a 64-row half of a 128-key page."""
        return min(self.page_size, GQA_BLOCK_N)

    @property
    def boxes_per_tile(self) -> int:
        return GQA_BLOCK_N // self.box_rows

    @property
    def box_bytes(self) -> int:
        return self.box_rows * 128

    @property
    def layout(self) -> SmemLayout:
        """Q (a 64-row block per math warpgroup), the ring of K-then-V stages, its barriers, a scratch word
        (per-tensor fp8: q_to_fp16's), and room to round the dynamic base up to 1024 B."""
        b = SmemLayoutBuilder()
        b.add("q", self.math_warpgroups * self.q_block_bytes, align=1024)
        b.add("kv_stages", self.stages * self.stage_bytes, align=1024)
        b.add("barriers", 2 * self.stages * MBARRIER_BYTES, align=MBARRIER_BYTES)
        b.add("scratch", 16, align=16)
        b.add("align_slack", ALIGN_SLACK, align=16)
        return b.build()

    @property
    def smem_bytes(self) -> int:
        return self.layout.total_bytes

    @property
    def ctas_per_sm(self) -> int:
        """Two CTAs per SM where one math warpgroup's CTA leaves room for it (the other CTA's wgmmas
        run under this one's softmax), else one."""
        if self.math_warpgroups == 1 and self.smem_bytes <= smem_limit_per_cta(self.arch, 2):
            return 2
        return 1

    @property
    def register_budget(self) -> int:
        """Registers per thread-slot tuple (producer + math warpgroups) the launch holds per CTA:
        setmaxnreg moves registers only within it."""
        per_thread = REGISTER_FILE // (self.threads * self.ctas_per_sm) // REG_UNIT * REG_UNIT
        return (1 + self.math_warpgroups) * min(per_thread, 255 // REG_UNIT * REG_UNIT)

    @property
    def producer_regs(self) -> int:
        return FP8_PRODUCER_REGS[self.head_dim] if self.fp8 else PRODUCER_REGS

    @property
    def producer_rows(self) -> int:
        """fp8: tile rows each producer thread converts (warp w takes 8-row blocks w and w + 4, a lane one row of
        each and a 16-column group of every 64-column chunk)."""
        return GQA_BLOCK_N // 32

    @property
    def math_regs(self) -> int:
        """Each math warpgroup's registers after setmaxnreg: the rest of the budget, at most 240."""
        return min(240, (self.register_budget - self.producer_regs) // self.math_warpgroups // REG_UNIT * REG_UNIT)

    @property
    def acc_regs(self) -> int:
        """fp32 output accumulators per math thread (64 rows x head_dim over 128 threads)."""
        return WGMMA_M * self.head_dim // 128

    def problems(self) -> list[str]:
        """What makes this tiling unbuildable (empty when it fits)."""
        out = []
        if self.rows > 2 * WGMMA_M:
            out.append(f"{self.rows} query rows (group x max_s_q): the sm90 GQA CTA holds at most {2 * WGMMA_M}")
        if self.head_dim % SWIZZLE_COLS:
            out.append(f"head_dim {self.head_dim} is not a multiple of {SWIZZLE_COLS}")
        limit = smem_limit_per_cta(self.arch, 1)
        if self.smem_bytes > limit:
            out.append(f"{self.stages} stages of {self.stage_bytes} B and {self.math_warpgroups} x "
                       f"{self.q_block_bytes} B of Q take {self.smem_bytes} B of shared memory; {self.arch} "
                       f"allows {limit}")
        if self.math_regs < self.acc_regs + 72:
            out.append(f"{self.math_regs} registers per math thread cannot hold {self.acc_regs} output "
                       "accumulators, S and P")
        return out
