"""Sm90DecodeConfig: the Hopper backend (sm_90a) for MLA decode: KV tiles by TMA into the
mbarrier ring, wgmma with operands in shared memory, one producer warpgroup and two math
warpgroups; its checks and the shared-memory layout, tiling and register split the template places.

The CTA holds 64 query rows (heads x s_q; wgmma's M). Per KV tile of 64 keys (576 columns, V is
the first 512 of the same rows) math warpgroup g computes S for keys 32g..32g+31 over the full
depth, the two exchange row maxima, each writes its half of P to one swizzled P tile, and each
multiplies the whole P by its 256 columns of V. The producer warpgroup gives its registers to the
math warpgroups (setmaxnreg). That is schedule 'lockstep'; schedule 'seesaw' (16-bit KV) takes the
tiles in pairs: warpgroup g computes the whole S of tile 2i + g (m64n64, Q and K read once), the
two softmaxes are handed over through shared memory (row maxima, rescale factors, P in the tiles'
rope chunks; each hand-off an mbarrier every thread of the giving warpgroup arrives on), and each
ring stage has two sub-stages (warpgroup 0's V columns; the rest), each with its own producer
thread and barriers, so a tile's first half reloads while its second is read.

fp8 KV, three ways (`fp8_staging`). 'registers': the producer warpgroup's 128 threads load each
fp8 tile from global memory into registers (the next tile's loads issued as soon as the current one
is stored, so they fly while the producers wait for a free slot), dequantize it (scales included)
and store it, swizzled, into the same 2-stage 16-bit ring the TMA fills for 16-bit KV (every
producer thread arrives on the full barrier after `fence.proxy.async`); the math warpgroups run the
16-bit kernel unchanged. Shared-memory traffic is the 16-bit kernel's, and the conversion runs
beside the math instead of before it. 'fp8_ring': the ring holds fp8 tiles (cp.async.bulk of each
page's run of tokens and block scales), and the math warpgroups convert each into one 16-bit tile
(each the V columns its PV reads and half the rope rows) before their QK, in series with it.
'slot' (the seesaw, per-tensor scales): each sub-stage's fp8 columns land by TMA (uint8 tensor map,
128-column boxes) in the upper part of the very 16-bit slot they become, and that sub-stage's half of
the producer warpgroup converts them in place, front to back (box k's 16-bit output overwrites only
boxes up to k, read into registers before a barrier over the half), then arrives on the full barrier:
the HBM reads stay asynchronous and deep as for 16-bit KV, and no register holds a tile in flight.

GQA (family 'gqa_decode', 16-bit KV): its own kernel (templates/cuda/decode_sm90_gqa.cu.j2) whose tiling
codegen/sm90_gqa.py derives: one CTA per KV head, sequence and split, one math warpgroup per 64 of the
group x s_q query rows, K and V tiles by TMA; the MLA-only fields keep their defaults or are refused.
"""
from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from . import policy
from .decode import TMA_BOX_COLS, DecodeConfig, paged_map_geometry
from .pipeline import MBARRIER_BYTES, MAX_TX_BYTES
from .sm90_gqa import GQA_BLOCK_N, Sm90GqaTiling
from .sm90_keys_m import (KEYS_M_BLOCK_N, KEYS_M_MATH_REGS, KEYS_M_PRODUCER_REGS, KEYS_M_ROWS, KEYS_M_WARPGROUPS,
                          Sm90KeysMTiling)
from .smem import SmemLayout, SmemLayoutBuilder

WGMMA_M = 64
MATH_WARPGROUPS = 2
SWIZZLE_COLS = TMA_BOX_COLS  # 16-bit columns per 128-byte swizzle row (the TMA box's inner extent)
SWIZZLE_ATOM_BYTES = 1024  # 8 rows x 128 B: tiles start on this boundary
# setmaxnreg moves registers between warpgroups inside the CTA's allocation, which is fixed at launch:
# 384 threads get at most 168 registers each (65536 / 384, in units of 8), so one producer and two
# math warpgroups' counts must sum to at most 3 x 168 = 504. More (e.g. 80 + 2 x 216 = 512) makes the
# math warpgroups' setmaxnreg.inc wait forever for registers that never come free: a hang, not an error.
REGISTER_FILE = 65536
REG_UNIT = 8               # registers per thread are allocated (and setmaxnreg counts) in multiples of 8
PRODUCER_REGS = 40         # setmaxnreg: the producer warpgroup's registers per thread
MATH_REGS = 232            # ... and each math warpgroup's (40 + 2 x 232 = 504)
# fp8_staging='registers': the producers hold a whole fp8 tile (2 rows x 9 16-byte groups per thread,
# scales) across the wait for a free slot, so they get more of the register file
FP8_PRODUCER_REGS = 136
FP8_MATH_REGS = 184
# fp8_staging='slot' (the seesaw): the converters hold at most one 128-column box of their rows at a
# time; the seesaw's math needs the rest
FP8_SLOT_PRODUCER_REGS = 72
FP8_SLOT_MATH_REGS = 216
FP8_BOX_COLS = 128          # fp8 columns per TMA box (128 bytes, the swizzle span)
MAX_L2_PREFETCH_TILES = 4   # l2_prefetch_tiles: tiles ahead at most (each 72 KB of L2 per CTA)


def register_budget(warpgroups: int = 1 + MATH_WARPGROUPS) -> int:
    """Registers per thread-slot triple the CTA holds at launch (what the setmaxnreg counts share)."""
    return warpgroups * (REGISTER_FILE // (128 * warpgroups) // REG_UNIT * REG_UNIT)


for _p, _m in ((PRODUCER_REGS, MATH_REGS), (FP8_PRODUCER_REGS, FP8_MATH_REGS),
               (FP8_SLOT_PRODUCER_REGS, FP8_SLOT_MATH_REGS), (KEYS_M_PRODUCER_REGS, KEYS_M_MATH_REGS)):
    assert _p % REG_UNIT == 0 and _m % REG_UNIT == 0 and 24 <= _p <= 256 and 24 <= _m <= 256, (_p, _m)
    assert _p + MATH_WARPGROUPS * _m <= register_budget(), (_p, _m, register_budget())


class Sm90DecodeConfig(DecodeConfig):
    backend_name: ClassVar[str] = "sm90"
    backend: Literal["sm90"] = "sm90"
    num_kv_stages: int = Field(default=2, ge=1, le=4, description="KV tiles in flight in the ring (16-bit: TMA "
                               "tiles, at least 2; fp8: fp8 tiles, converted into one 16-bit tile)")
    qk_chains: int = Field(default=1, ge=1, le=2, description="QK accumulators per math warpgroup: 2 splits the "
                           "k16 steps into two independent wgmma chains (even/odd), summed after")
    schedule: Literal["lockstep", "seesaw", "keys_m"] = Field(
        default="lockstep", description="math warpgroup schedule: 'lockstep' (each tile's QK split by keys, both "
        "warpgroups in step), 'seesaw' (16-bit KV: tiles in pairs, warpgroup g runs QK over the whole tile 2i+g, "
        "the two softmaxes handed over so one warpgroup's wgmmas run while the other's softmax does) or 'keys_m' "
        "(per-tensor fp8 KV, at most 16 query rows: fp8 wgmma with the tile's keys as M, the cache never "
        "converted, two math warpgroups on alternate tiles; codegen/sm90_keys_m.py)")

    lazy_rescale: bool = Field(default=policy.SM90_LAZY_RESCALE, description="DecodeConfig.lazy_rescale, on by "
                               "default here (policy.SM90_LAZY_RESCALE has the measurement)")
    merge_in_kernel: bool = Field(default=policy.SM90_MERGE_IN_KERNEL, description="DecodeConfig.merge_in_kernel, "
                                  "on by default here (policy.SM90_MERGE_IN_KERNEL has the measurement)")

    partials_16bit: bool = Field(
        default=policy.SM90_PARTIALS_16BIT, description="split-KV: each split's normalized partial output rows in "
        "the output dtype (bf16/fp16, half the bytes the epilogue writes and the merge or combine reads) rather than "
        "fp32 (policy.SM90_PARTIALS_16BIT has the measurement; the built-in choice takes it for split launches)")

    l2_prefetch_tiles: int = Field(
        default=policy.SM90_L2_PREFETCH_TILES, ge=0, le=MAX_L2_PREFETCH_TILES,
        description="TMA producers (16-bit KV, fp8_staging='slot'): when a tile's loads are issued, also prefetch "
        "the tile this many ahead into L2 (cp.async.bulk.prefetch.tensor), so the load that refills a slot as soon "
        "as it frees finds its bytes in L2 rather than DRAM; 0: off")

    l2_evict_first: bool = Field(
        default=False, description="16-bit KV: the KV tiles' TMA loads carry an L2 evict_first cache policy "
        "(createpolicy.fractional.L2::evict_first), so the streamed tiles leave L2 before the lines a split launch "
        "reads back (Q, the partial rows its merge or combine reads); the built-in choice takes it for split "
        "launches (policy.SM90_L2_EVICT_FIRST_SPLIT has the measurement)")

    fp8_staging: Literal["fp8_ring", "registers", "slot"] = Field(
        default="registers", description="fp8 KV: 'registers' (the producer warpgroup loads fp8 tiles into "
        "registers, dequantizes and stores them into the 16-bit ring the math reads; beside the math), "
        "'fp8_ring' (an fp8 ring by bulk copies, converted by the math warpgroups into one 16-bit tile before "
        "each QK) or 'slot' (schedule 'seesaw', per-tensor scales: fp8 columns land by TMA in the 16-bit slot "
        "they become and are converted in place by the producer warpgroup)")

    fp8_slot_loads_ahead: bool = Field(
        default=False, description="fp8_staging='slot', opt-in (not yet measured on the H200, so off): while a "
        "sub-stage's producers wait for tile t's fp8 boxes to land, their first thread polls tile t + 1's slot "
        "and issues its boxes the moment the math releases it, instead of after converting tile t (the two "
        "otherwise run in series; bench/fp8_staging_ab.py's 'slot_ahead')")

    seesaw_b_first: bool = Field(
        default=False, description="schedule 'seesaw', 16-bit KV, opt-in (docs/seesaw-load-lead.md; correct on the "
        "H200 and measured 0.95-1.02x of the built-in order, so off): FlashMLA's pair order. Warpgroup 0 rescales P_A to warpgroup "
        "1's maxima into A's rope chunk (a third hand-off), P_B lives in its own 8 KB tile, warpgroup 1 multiplies "
        "its own P_B V_B[R] first, and each half-tile is released when its last reader is done, so every QK runs "
        "its early-loaded half while its late half loads")

    warps_field: ClassVar[str] = "heads_per_cta"
    stages_field: ClassVar[str] = "num_kv_stages"

    @model_validator(mode="before")
    @classmethod
    def _gqa_defaults(cls, data):
        """GQA takes the split sequences' combine kernel and fp32 partials: merge_in_kernel and partials_16bit
        default to off for it (the MLA defaults come from policy)."""
        if isinstance(data, dict) and data.get("family") == "gqa_decode":
            data = {"merge_in_kernel": False, "partials_16bit": False, **data}
        return data

    @property
    def is_gqa(self) -> bool:
        return self.family == "gqa_decode"

    @property
    def keys_m(self) -> bool:
        return self.schedule == "keys_m"

    @cached_property
    def keys_m_tiling(self) -> Sm90KeysMTiling:
        """Schedule 'keys_m''s tiling (its own kernel, templates/cuda/decode_sm90_keys_m.cu.j2)."""
        return Sm90KeysMTiling(head_dim_qk=self.head_dim_qk, head_dim_v=self.head_dim_v, page_size=self.page_size,
                               stages=self.num_kv_stages, rescale_slack_log2=self.rescale_slack_log2,
                               packed=self.scale_mode == "fp8_ds_mla",
                               scale_block=(self.scale_block_size or 0) if self.scale_mode == "block" else 0)

    @property
    def rescale_slack_log2(self) -> float:
        """DecodeConfig.rescale_slack_log2; schedule 'keys_m' takes a smaller slack with lazy_rescale
        (policy.KEYS_M_RESCALE_SLACK_LOG2: its P^T tiles are e4m3)."""
        if self.keys_m and self.lazy_rescale:
            return policy.KEYS_M_RESCALE_SLACK_LOG2
        return super().rescale_slack_log2

    @cached_property
    def gqa(self) -> Sm90GqaTiling:
        """The GQA kernel's tiling (family 'gqa_decode' only)."""
        return Sm90GqaTiling(head_dim=self.head_dim_qk, rows=self.heads_per_cta * self.max_s_q,
                             page_size=self.page_size, stages=self.num_kv_stages, arch=self.arch, fp8=self.is_fp8)

    @classmethod
    def foreign_hint(cls, name: str) -> str:
        return ("has fixed warpgroup roles (one TMA producer, two wgmma math warpgroups): set num_kv_stages "
                "and qk_chains")

    def _validate_backend(self, where: str) -> None:
        if self.backend != "sm90":
            raise ValueError(f"{where}.backend={self.backend!r}: expected 'sm90'")
        if self.is_gqa:
            self._validate_gqa(where)
            return
        if self.keys_m:
            self._validate_keys_m(where)
            return
        if not self.converts_in_math and self.num_kv_stages < 2:
            raise ValueError(f"{where}.num_kv_stages={self.num_kv_stages}: a 16-bit KV ring needs 2 to 4 stages "
                             "(1 is for fp8 KV with fp8_staging='fp8_ring', whose fp8 tiles are converted into a "
                             "separate 16-bit tile)")
        if not self.is_fp8 and self.fp8_staging != "registers":
            raise ValueError(f"{where}.fp8_staging={self.fp8_staging!r}: for fp8 KV only (kv_dtype='fp8_e4m3'); "
                             "remove it")
        if self.block_n != 64:
            raise ValueError(f"{where}.block_n={self.block_n}: the sm90 MLA kernel takes tiles of 64 keys "
                             "(two math warpgroups x 32)")
        if self.heads_per_cta * self.max_s_q > WGMMA_M:
            raise ValueError(f"{where}.heads_per_cta={self.heads_per_cta}: heads_per_cta * max_s_q = "
                             f"{self.heads_per_cta * self.max_s_q} query rows; the sm90 CTA holds {WGMMA_M}")
        if self.converts_in_slot and (self.schedule != "seesaw" or self.scale_mode != "per_tensor"):
            raise ValueError(f"{where}.fp8_staging='slot': for schedule='seesaw' with scale_mode='per_tensor' (got "
                             f"schedule={self.schedule!r}, scale_mode={self.scale_mode!r}); use fp8_staging="
                             "'registers' or 'fp8_ring' otherwise")
        if self.schedule == "seesaw":
            if self.is_fp8 and not self.converts_in_slot:
                raise ValueError(f"{where}.schedule='seesaw': fp8 KV only with fp8_staging='slot' (got "
                                 f"{self.fp8_staging!r}, whose producers fill whole stages); use "
                                 "schedule='lockstep'")
            if self.num_kv_stages != 2:
                raise ValueError(f"{where}.num_kv_stages={self.num_kv_stages}: schedule 'seesaw' runs tiles in "
                                 "pairs over exactly 2 stages (Q and two 72 KB tiles fill shared memory)")
        if self.fp8_slot_loads_ahead and not self.converts_in_slot:
            raise ValueError(f"{where}.fp8_slot_loads_ahead=True: for fp8_staging='slot' (fp8 KV, schedule 'seesaw', "
                             f"per-tensor scales; got kv_dtype={self.kv_dtype!r}, fp8_staging={self.fp8_staging!r}); "
                             "remove it")
        if self.seesaw_b_first and (not self.seesaw or self.is_fp8):
            raise ValueError(f"{where}.seesaw_b_first=True: for schedule='seesaw' with 16-bit KV (got schedule="
                             f"{self.schedule!r}, kv_dtype={self.kv_dtype!r}); remove it")
        if self.l2_prefetch_tiles and self.is_fp8 and not self.converts_in_slot:
            raise ValueError(f"{where}.l2_prefetch_tiles={self.l2_prefetch_tiles}: the L2 prefetch is for the TMA "
                             f"producers (16-bit KV, or fp8_staging='slot'); fp8_staging={self.fp8_staging!r} loads "
                             "by bulk copies: set it to 0")
        if self.l2_evict_first and self.is_fp8:
            raise ValueError(f"{where}.l2_evict_first=True: for 16-bit KV only, the hint is on its TMA tile loads "
                             f"(kv_dtype 'bf16' or 'fp16'; got kv_dtype={self.kv_dtype!r} with fp8_staging="
                             f"{self.fp8_staging!r}); remove it")
        if self.tile_tx_bytes > MAX_TX_BYTES:
            raise ValueError(f"{where}.block_n={self.block_n}: {self.tile_tx_bytes} B per tile exceed the "
                             f"mbarrier's transaction count ({MAX_TX_BYTES})")

    def _validate_keys_m(self, where: str) -> None:
        """Schedule 'keys_m': fp8 MLA (per-tensor, block scales of 64 or 128 columns, the packed token), at most 16
        query rows, tiles of 64 keys, a ring of 2 or 4 slots; the other schedules' fields keep their defaults (split
        sequences go to the combine kernel in fp32)."""
        if not self.is_fp8 or self.scale_mode not in ("per_tensor", "block", "fp8_ds_mla"):
            raise ValueError(f"{where}.schedule='keys_m': for fp8 caches with per-tensor scales, block scales or "
                             f"DeepSeek's packed token (kv_dtype='fp8_e4m3', scale_mode 'per_tensor', 'block' or "
                             f"'fp8_ds_mla'; got kv_dtype={self.kv_dtype!r}, scale_mode={self.scale_mode!r})")
        if self.scale_mode != "per_tensor" and self.qk_chains != 1:
            raise ValueError(f"{where}.qk_chains={self.qk_chains}: schedule 'keys_m' on {self.scale_mode} caches "
                             "accumulates the QK product per scale block (one chain); use 1")
        if self.block_n != KEYS_M_BLOCK_N:
            raise ValueError(f"{where}.block_n={self.block_n}: schedule 'keys_m' takes tiles of {KEYS_M_BLOCK_N} keys "
                             "(wgmma's M)")
        others = {"fp8_staging": ("registers", self.fp8_staging), "merge_in_kernel": (False, self.merge_in_kernel),
                  "partials_16bit": (False, self.partials_16bit), "l2_prefetch_tiles": (0, self.l2_prefetch_tiles),
                  "l2_evict_first": (False, self.l2_evict_first), "seesaw_b_first": (False, self.seesaw_b_first),
                  "fp8_slot_loads_ahead": (False, self.fp8_slot_loads_ahead)}
        for name, (allowed, got) in others.items():
            if got != allowed:
                raise ValueError(f"{where}.{name}={got!r}: schedule 'keys_m' reads the fp8 tiles as they land and "
                                 f"merges split sequences in the combine kernel; {name} must be {allowed!r}")
        problems = self.keys_m_tiling.problems(self.heads_per_cta * self.max_s_q)
        if problems:
            raise ValueError(f"{where}.num_kv_stages={self.num_kv_stages} / heads_per_cta={self.heads_per_cta} / "
                             f"max_s_q={self.max_s_q}: {'; '.join(problems)}")
        if self.keys_m_tiling.tile_tx_bytes > MAX_TX_BYTES:
            raise ValueError(f"{where}.page_size={self.page_size}: a tile's bytes exceed the mbarrier's transaction "
                             f"count ({MAX_TX_BYTES})")

    def _validate_gqa(self, where: str) -> None:
        """The GQA kernel's limits: 16-bit KV, tiles of 64 keys, at most 128 query rows, the lockstep-free
        single schedule (no MLA schedule fields), a ring that fits shared memory."""
        if self.is_fp8 and self.fp8_staging != "registers":
            raise ValueError(f"{where}.fp8_staging={self.fp8_staging!r}: the sm90 GQA kernel stages fp8 tiles in "
                             "the producer warpgroup's registers: 'registers'")
        if self.l2_evict_first and self.is_fp8:
            raise ValueError(f"{where}.l2_evict_first=True: for 16-bit KV only (its TMA loads carry the hint); "
                             "remove it")
        if self.block_n != GQA_BLOCK_N:
            raise ValueError(f"{where}.block_n={self.block_n}: the sm90 GQA kernel takes tiles of {GQA_BLOCK_N} "
                             "keys (wgmma N of its QK product)")
        mla_only = {"schedule": ("lockstep", self.schedule), "qk_chains": (1, self.qk_chains),
                    "merge_in_kernel": (False, self.merge_in_kernel), "partials_16bit": (False, self.partials_16bit),
                    "l2_prefetch_tiles": (0, self.l2_prefetch_tiles), "seesaw_b_first": (False, self.seesaw_b_first),
                    "fp8_slot_loads_ahead": (False, self.fp8_slot_loads_ahead)}
        for name, (allowed, got) in mla_only.items():
            if got != allowed:
                raise ValueError(f"{where}.{name}={got!r}: the sm90 GQA kernel has one schedule and merges split "
                                 f"sequences in the combine kernel; {name} must be {allowed!r} for gqa_decode")
        problems = self.gqa.problems()
        if problems:
            raise ValueError(f"{where}.num_kv_stages={self.num_kv_stages} / heads_per_cta={self.heads_per_cta} / "
                             f"max_s_q={self.max_s_q}: {'; '.join(problems)}")
        if 2 * self.gqa.boxes_per_tile * self.gqa.chunks * self.gqa.box_bytes > MAX_TX_BYTES:
            raise ValueError(f"{where}.head_dim_qk={self.head_dim_qk}: a stage's bytes exceed the mbarrier's "
                             f"transaction count ({MAX_TX_BYTES})")

    # ---- derived -----------------------------------------------------------------------------
    @property
    def num_consumer_warps(self) -> int:
        if self.keys_m:
            return 4 * KEYS_M_WARPGROUPS
        return 4 * (self.gqa.math_warpgroups if self.is_gqa else MATH_WARPGROUPS)

    @property
    def q_rows(self) -> int:
        if self.keys_m:
            return KEYS_M_ROWS
        return self.gqa.q_rows if self.is_gqa else WGMMA_M

    @property
    def threads(self) -> int:
        if self.keys_m:
            return self.keys_m_tiling.threads
        return self.gqa.threads if self.is_gqa else 128 * (1 + MATH_WARPGROUPS)

    @property
    def math_threads(self) -> int:
        if self.keys_m:
            return self.keys_m_tiling.math_threads
        return self.gqa.math_threads if self.is_gqa else 128 * MATH_WARPGROUPS

    @property
    def acc_regs_per_thread(self) -> int:
        if self.is_gqa:
            return self.gqa.acc_regs
        if self.keys_m:  # O^T: head_dim_v x 16 rows per warpgroup
            return self.head_dim_v * KEYS_M_ROWS // 128
        return WGMMA_M * self.head_dim_v // self.math_threads

    @property
    def ctas_per_sm(self) -> int:
        """GQA: the tiling's (two where a one-warpgroup CTA leaves room, for the register split it is built
        with); MLA: by shared memory (one); schedule 'keys_m': one (by registers)."""
        if self.keys_m:  # its 288 or 384 threads hold 168 registers each: one CTA per SM whatever the ring's depth
            return 1
        return self.gqa.ctas_per_sm if self.is_gqa else super().ctas_per_sm

    @property
    def keys_per_warpgroup(self) -> int:
        return self.block_n // MATH_WARPGROUPS

    @property
    def cols_per_warpgroup(self) -> int:
        return self.head_dim_v // MATH_WARPGROUPS

    @property
    def chunks_qk(self) -> int:
        """64-column swizzle chunks of a K (or Q) row."""
        return self.head_dim_qk // SWIZZLE_COLS

    @property
    def chunk_bytes(self) -> int:
        """One 64-column chunk of a tile of block_n (= 64 query rows) rows."""
        return self.block_n * 128

    @property
    def stage_bytes(self) -> int:
        return self.chunks_qk * self.chunk_bytes

    @property
    def box_rows(self) -> int:
        """Rows per TMA box: one page, or a 64-row half of a 128-key page."""
        return min(self.page_size, self.block_n)

    @property
    def boxes_per_tile(self) -> int:
        """Pages a tile spans (page_size < block_n), else 1."""
        return self.block_n // self.box_rows

    @property
    def box_bytes(self) -> int:
        return self.box_rows * 128

    @property
    def converts_in_math(self) -> bool:
        """fp8 KV through an fp8 ring, converted by the math warpgroups (fp8_staging='fp8_ring')."""
        return self.is_fp8 and self.fp8_staging == "fp8_ring"

    @property
    def converts_in_producer(self) -> bool:
        """fp8 KV loaded into the producers' registers and stored converted (fp8_staging='registers')."""
        return self.is_fp8 and self.fp8_staging == "registers"

    @property
    def converts_in_slot(self) -> bool:
        """fp8 KV landing by TMA in the 16-bit slot it becomes, converted there (fp8_staging='slot')."""
        return self.is_fp8 and self.fp8_staging == "slot"

    @property
    def seesaw_qk_first(self) -> bool:
        """The seesaw's warpgroup 1 issues tile B's QK before it takes warpgroup 0's hand-off (B's QK
        needs only B's tile, so it runs under warpgroup 0's softmax): 16-bit KV, 1.02-1.12x over taking
        the hand-off first. fp8 converted in its slot takes the hand-off first (there B's QK would wait
        for the producers' conversion, which that order hides under P_A V_A[R]: QK first measured 0.96x;
        bench/RESULTS.md, fourteenth session)."""
        return self.seesaw and not self.converts_in_slot

    @property
    def slot_subs(self) -> tuple[dict, ...]:
        """fp8_staging='slot': per sub-stage (L, R), its 16-bit chunks [first_chunk, first_chunk +
        chunks), its fp8 TMA boxes (`boxes` of FP8_BOX_COLS columns from column col0; R's last box runs
        past the row, the TMA fills zeros), the chunk the first box lands in and, per box, its 16-byte
        units that hold the row's columns. The boxes take the sub-stage's last chunks (an fp8 box is one
        16-bit chunk's bytes), so box k's output (chunks first_chunk + 2k, + 2k + 1) overwrites only
        boxes up to k, and box 0's none (it is converted without a barrier)."""
        if not self.converts_in_slot:
            return ()
        per_chunk = FP8_BOX_COLS // SWIZZLE_COLS  # 16-bit chunks one fp8 box becomes
        units = FP8_BOX_COLS // 16  # 16-byte fp8 units per box row
        subs = []
        for first, end in ((0, self.sub_split_chunk), (self.sub_split_chunk, self.chunks_qk)):
            chunks = end - first
            boxes = -(-chunks // per_chunk)
            box_chunk = end - boxes
            for k in range(boxes):
                last_out = min(first + per_chunk * k + per_chunk - 1, end - 1)
                assert last_out < box_chunk if k == 0 else last_out <= box_chunk + k, (first, end, k)
            subs.append({"first_chunk": first, "chunks": chunks, "boxes": boxes, "col0": first * SWIZZLE_COLS,
                         "box_chunk": box_chunk,
                         "box_units": [min(units, (chunks - per_chunk * k) * units // per_chunk)
                                       for k in range(boxes)]})
        return tuple(subs)

    @property
    def tile_tx_bytes(self) -> int:
        """Bytes a full tile brings into its ring slot (the full barrier's transaction count)."""
        if self.keys_m:
            return self.keys_m_tiling.tile_tx_bytes
        if self.is_fp8:
            return self.block_n * (self.kv_token_bytes + self.kv8_scale_row_bytes)
        return self.boxes_per_tile * self.chunks_qk * self.box_bytes

    # ---- fp8 KV: the fp8 ring, converted into one 16-bit tile -----------------------------------
    @property
    def kv16_tiles(self) -> int:
        """16-bit KV tiles in SMEM: the TMA ring's stages, or the single tile fp8 is converted into."""
        return 1 if self.converts_in_math else self.num_kv_stages

    @property
    def kv8_scale_row_bytes(self) -> int:
        """fp32 block scales per token (bulk-copied apart from the tokens); the packed token holds its own."""
        return 4 * self.scale_blocks if self.scale_mode == "block" else 0

    @property
    def kv8_scale_offset(self) -> int:
        """Where a fp8 stage's block scales start: after its block_n tokens."""
        return self.block_n * self.kv_token_bytes

    @property
    def kv8_stage_bytes(self) -> int:
        """One fp8 ring slot: block_n tokens, then their block scales, rounded to 128 bytes."""
        if not self.converts_in_math:
            return 0
        return -(-(self.kv8_scale_offset + self.block_n * self.kv8_scale_row_bytes) // 128) * 128

    @property
    def convert_units(self) -> int:
        """Units of 8 rows x 64 columns each math warpgroup converts per tile: its V columns' chunks
        over all rows, and half the rows of the rope chunk(s)."""
        latent = (self.cols_per_warpgroup // SWIZZLE_COLS) * (self.block_n // 8)
        rope = (self.chunks_qk - self.head_dim_v // SWIZZLE_COLS) * (self.block_n // 8) // MATH_WARPGROUPS
        return latent + rope

    @property
    def kv_map(self) -> dict:
        """The KV cache's TMA tensor map, as the runtime (runtime/tensor_map.py) and the C launchers
        encode it: a contiguous cache [num_pages][page_size][head_dim_qk] of 16-bit elements, dims
        {row_elems, page_size, num_pages} (num_pages at run time), byte strides {row_bytes,
        page_bytes}, boxes of {box_cols, box_rows, 1}, 128-byte swizzle."""
        return paged_map_geometry(self.kv_dtype, self.kv_token_bytes if self.is_fp8 else self.head_dim_qk,
                                  self.page_size, self.box_rows, per_kv_head=False)

    def tensor_maps(self) -> tuple[tuple[str, str, dict], ...]:
        if self.is_gqa and self.is_fp8:  # the producers load fp8 rows themselves
            return ()
        if self.is_gqa:  # K and V caches seen as [num_pages][page_size][num_kv_heads * head_dim]
            geometry = paged_map_geometry(self.kv_dtype, self.head_dim_qk, self.page_size, self.gqa.box_rows,
                                          per_kv_head=True)
            return (("k_map", "k_cache", geometry), ("v_map", "v_cache", geometry))
        return (("kv_map", "k_cache", self.kv_map),) if not self.is_fp8 or self.converts_in_slot or self.keys_m else ()

    @property
    def seesaw(self) -> bool:
        return self.schedule == "seesaw"

    @property
    def kv_subs(self) -> int:
        """Sub-stages (barrier pairs) per ring stage. seesaw: 2, the chunks of warpgroup 0's V columns
        (sub L) and the rest (sub R: warpgroup 1's V columns and the rope chunk), each filled by its own
        producer thread and released apart, so the next tile's sub L loads while sub R is still read."""
        return 2 if self.seesaw else 1

    @property
    def sub_split_chunk(self) -> int:
        """First chunk of sub R (seesaw): the chunks before it are warpgroup 0's V columns."""
        return self.cols_per_warpgroup // SWIZZLE_COLS

    @property
    def producer_rows(self) -> int:
        """fp8_staging='registers': tile rows each producer thread converts (a warp takes 8-row blocks
        w and w + 4, a lane one row of each and a 16-column group of every 64-column chunk)."""
        return self.block_n // 32

    @property
    def full_arrivals(self) -> int:
        # the producer thread's arrive.expect_tx (the TMA or bulk-copy bytes complete the phase), or
        # every producer thread once its share of the converted tile is stored ('slot': each sub-stage
        # has its own half of the producer warpgroup)
        if self.keys_m:  # packed: also each producer lane once its scale copies land (cp.async, noinc); block
            # scales are bulk copies the TMA thread's expect-tx counts
            return 1 + (32 if self.scale_mode == "fp8_ds_mla" else 0)
        if self.converts_in_slot:
            return 128 // self.kv_subs
        return 128 if self.converts_in_producer else 1

    @property
    def fp8_box_cols(self) -> int:
        """fp8_staging='slot': fp8 columns (bytes) per TMA box row, the swizzle span."""
        return FP8_BOX_COLS

    @property
    def landed_barriers(self) -> int:
        """fp8_staging='slot': an mbarrier per ring slot the TMA completes (the converters wait on it;
        one arrival, the expect-tx of the sub-stage's issuing thread)."""
        return self.num_kv_stages * self.kv_subs if self.converts_in_slot else 0

    @property
    def empty_arrivals(self) -> int:
        if self.keys_m:  # the four warps of the warpgroup that took the tile, once its V^T fragments are in registers
            # (block scales: its 128 threads, each releasing its own reads of the bulk-copied scales)
            return 128 if self.scale_mode == "block" else 4
        return self.math_threads  # every math thread releases each (sub-)stage once per tile (release_all)

    @property
    def handoffs(self) -> int:
        """seesaw: the mbarriers one math warpgroup hands a pair's softmax to the other through
        (warpgroup 0's row maxima, rescale factors and P_A; then warpgroup 1's for tile B; with
        seesaw_b_first a third, warpgroup 0's P_A rescaled to warpgroup 1's maxima)."""
        return (3 if self.seesaw_b_first else 2) if self.seesaw else 0

    @property
    def handoff_arrivals(self) -> int:
        """Arrivals completing a hand-off round: every thread of the giving warpgroup."""
        return self.math_threads // MATH_WARPGROUPS

    @property
    def register_budget(self) -> int:
        """producer_regs + 2 x math_regs may not exceed this (setmaxnreg within the launch's registers)."""
        return self.gqa.register_budget if self.is_gqa else register_budget()

    @property
    def producer_regs(self) -> int:
        if self.is_gqa:
            return self.gqa.producer_regs
        if self.keys_m:
            return KEYS_M_PRODUCER_REGS
        if self.converts_in_slot:
            return FP8_SLOT_PRODUCER_REGS
        return FP8_PRODUCER_REGS if self.converts_in_producer else PRODUCER_REGS

    @property
    def math_regs(self) -> int:
        if self.is_gqa:
            return self.gqa.math_regs
        if self.keys_m:
            return KEYS_M_MATH_REGS
        if self.converts_in_slot:
            return FP8_SLOT_MATH_REGS
        return FP8_MATH_REGS if self.converts_in_producer else MATH_REGS

    @cached_property
    def layout(self) -> SmemLayout:
        if self.is_gqa:
            return self.gqa.layout
        if self.keys_m:
            return self.keys_m_tiling.layout
        b = SmemLayoutBuilder()
        b.add("q", self.chunks_qk * WGMMA_M * 128, align=SWIZZLE_ATOM_BYTES)
        b.add("kv_stages", self.kv16_tiles * self.stage_bytes, align=SWIZZLE_ATOM_BYTES)
        if self.seesaw_b_first:  # P_B outside tile B (swizzled like a chunk)
            b.add("p_b", WGMMA_M * self.block_n * 2, align=SWIZZLE_ATOM_BYTES)
        if self.converts_in_math:
            b.add("kv8_stages", self.num_kv_stages * self.kv8_stage_bytes, align=128)
        if not self.seesaw:  # seesaw: P lives in the tiles' rope chunks (seesaw_b_first: P_B in p_b)
            b.add("p_tile", WGMMA_M * self.block_n * 2, align=SWIZZLE_ATOM_BYTES)
        b.add("red_max", MATH_WARPGROUPS * WGMMA_M * 4, align=16)
        b.add("red_sum", MATH_WARPGROUPS * WGMMA_M * 4, align=16)
        b.add("work", 16, align=16)  # the CTA's split index and split count, for the epilogue
        if self.seesaw:
            b.add("row_max", WGMMA_M * 4, align=16)  # the running row maxima both warpgroups update
        b.add("barriers", 2 * self.num_kv_stages * self.kv_subs * MBARRIER_BYTES, align=MBARRIER_BYTES)
        if self.seesaw:
            b.add("handoffs", self.handoffs * MBARRIER_BYTES, align=MBARRIER_BYTES)
        if self.converts_in_slot:
            b.add("landed", self.landed_barriers * MBARRIER_BYTES, align=MBARRIER_BYTES)
        # the kernel rounds the dynamic shared-memory base up to 1024 B: room for that
        b.add("align_slack", SWIZZLE_ATOM_BYTES - 16, align=16)
        # the epilogue's rows (and the merge's weights) over Q and the ring, dead once every tile is consumed
        b.overlay("epilogue", "q", self.epilogue_bytes)
        return b.build(aliases=(("epilogue", "q"), ("epilogue", "kv_stages")))

    @property
    def epilogue_out_row_bytes(self) -> int:
        """The epilogue stages each output row (head_dim_v 16-bit values) at this stride: 16 B of padding put
        the 8 rows a warp's 4-byte accumulator stores reach on distinct banks."""
        return self.head_dim_v * 2 + 16

    @property
    def epilogue_part_row_bytes(self) -> int:
        """The same for the partials of a split sequence: 16-bit rows as the output's (partials_16bit), or fp32
        rows with 32 B of padding for 8-byte stores (a half-warp's 4 rows on distinct banks)."""
        return self.epilogue_out_row_bytes if self.partials_16bit else self.head_dim_v * 4 + 32

    @property
    def epilogue_weights_offset(self) -> int:
        """merge_in_kernel: the merge's per-row split weights (fp32 [q_rows][merged_splits]) after the rows."""
        return WGMMA_M * self.epilogue_part_row_bytes

    @property
    def epilogue_bytes(self) -> int:
        return self.epilogue_weights_offset + WGMMA_M * self.merged_splits * 4

    def backend_name_fields(self) -> list[str]:
        if self.is_gqa:
            return [f"s{self.num_kv_stages}", f"wg{1 + self.gqa.math_warpgroups}"] + (["ef"] if self.l2_evict_first else [])
        if self.keys_m:
            return [f"s{self.num_kv_stages}", f"wg{KEYS_M_WARPGROUPS}", f"qc{self.qk_chains}", "keysm"]
        fields = [f"s{self.num_kv_stages}", f"wg{1 + MATH_WARPGROUPS}", f"qc{self.qk_chains}"]
        return (fields + (["seesaw"] if self.seesaw else []) + (["bf"] if self.seesaw_b_first else [])
                + (["f8reg"] if self.converts_in_producer else [])
                + (["f8slot"] if self.converts_in_slot else []) + (["la"] if self.fp8_slot_loads_ahead else [])
                + ([f"pf{self.l2_prefetch_tiles}"] if self.l2_prefetch_tiles else [])
                + (["ef"] if self.l2_evict_first else [])
                + (["po16"] if self.partials_16bit else []))

    def legacy_backend_name_fields(self) -> list[str]:
        return self.backend_name_fields()
