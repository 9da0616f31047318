"""Choosing a decode variant for the shapes at hand (the heuristics live here, nowhere else).

The runtime calls `select_decode_config` / `select_cdna_config` for the shapes of a call; the
matrix loader calls `sm80_choice` / `cdna_fields` to fill the fields a matrix entry leaves out
with the same choice (`codegen/defaults.py`).
"""
from __future__ import annotations

from functools import lru_cache

from . import policy
from .decode import MLA_DIMS, DecodeConfig
from .errors import ConfigError, build
from .sm90_gqa import GQA_BLOCK_N, Sm90GqaTiling, sm90_gqa_min_rows
from .sm90_keys_m import KEYS_M_ROWS, KEYS_M_SCALE_BLOCKS

MAX_CONSUMER_WARPS = 8


def _mla_heads_per_cta(num_heads: int, s_q: int) -> int:
    """Up to 64 query rows per CTA (64 x 512 fp32 accumulators over 8 warps), as few as hold the call's heads: halved
    while the CTA's rows (heads x s_q) exceed one 16-row mma tile and half the heads still hold `num_heads`. (Until
    the thirty-seventh session the floor was 16 heads, not 16 rows: 4 heads at s_q = 4 ran 64-row CTAs, 48 rows
    idle; `bench/builtin_resources.py` lists the choices.)"""
    hpc = max(1, 64 // s_q)
    hpc = 1 << (hpc.bit_length() - 1)  # a power of two
    while hpc * s_q > 16 and hpc // 2 >= num_heads:
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


def overlay(base: dict, explicit: dict) -> dict:
    """`base` with every value of `explicit` on top (nested tables merged key by key)."""
    out = dict(base)
    for key, value in explicit.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = overlay(out[key], value)
        else:
            out[key] = value
    return out


# fp8 KV on the sm80 backend: at most this many threads per CTA (producer, convert and consumer
# warps), so every thread keeps 170 registers at one CTA per SM
FP8_MAX_THREADS = 384


# fp8 layouts (per family) whose sm80 kernel dequantizes in the consumers' registers (fp8_convert =
# "registers": mma fragments read straight from the fp8 ring, no convert warps); the others go
# through the load-and-convert ring. bench/RESULTS.md, "FP8 KV", has the A/B.
FP8_REGISTER_LAYOUTS = {"gqa_decode": ("per_tensor", "block"), "mla_decode": ("per_tensor", "block", "fp8_ds_mla")}
FP8_REGISTER_MLA_MAX_ROWS = 16  # MLA: one row group of 16 query rows per CTA (the sm80 choice up to 16 heads)
# MLA with block scales of fewer than this many columns costs the register path more (a warp's V
# columns span several scale blocks, P re-scaled per block): with rows bulk-copied (sm_90) it is still
# 1.25-1.27x faster than the convert warps at b=64-128 (block 64), but on 16-byte cp.async rows 0.90-0.91x
# of them (bench/mla_fp8_blocks_ab.py, bench/RESULTS.md "Block-scaled and packed fp8 MLA in registers"):
# there the ring stays where it fits.
FP8_REGISTER_MLA_MIN_SPAN_CP_ASYNC = 128
# The register path's measured best per head dim (bench/RESULTS.md, "FP8 KV": H200 sweep over keys
# per tile, ring depth, producer and consumer warps at >= 2 CTAs per SM): (block_n, num_kv_stages,
# num_producer, column-group warps). 32 KB slots at D = 128 and 256, four CTAs per SM at D = 64.
FP8_REGISTER_TILES = {64: (64, 4, 4, 2), 128: (128, 3, 4, 4), 256: (64, 3, 4, 2), 576: (64, 3, 4, 4)}
# ... with block scales (slots also hold the scales, P is fp32, and the partial S per block needs
# registers): tiles that keep every thread's registers free of spills
FP8_REGISTER_TILES_BLOCK = {64: (128, 4, 4, 2), 128: (128, 2, 2, 4), 256: (64, 2, 2, 4), 576: (64, 3, 4, 4)}
# ... and how P takes the V block scales there (`fp8_block_p`): prescaled 16-bit P where one V scale covers a
# token's whole head (scale_block_size >= D: one P tile), measured 1.04-1.05x faster than fp32 P at D = 128
# (block 128; bench/fp8_block_p_ab.py, H200); with two or more V blocks per head the softmax's extra P tiles and
# running maxima cost more than PV saves (D = 128 block 64: 0.99-1.03x, D = 256: 0.86-0.98x; MLA at 16 heads,
# four to eight tiles: 0.49-0.73x), so those keep fp32 P.
def fp8_block_p(family: str, scale_mode: str, head_dim: int, scale_block_size: int | None) -> str:
    """'scaled' where a GQA block-scaled cache has one V scale per token and head, else 'fp32'."""
    one_block = scale_mode == "block" and scale_block_size is not None and scale_block_size >= head_dim
    return "scaled" if family == "gqa_decode" and one_block else "fp32"


RING_STAGES = (6, 5, 4, 3, 2)  # MMA-ring depths without convert warps, deepest first
PRODUCER_WARPS = (4, 2, 1)


def fp8_convert_path(family: str, scale_mode: str, rows: int = 0, scale_block_size: int | None = None,
                     bulk_rows: bool = True) -> str:
    """'registers' or 'ring': how the sm80 kernel dequantizes an fp8 cache of this layout for a CTA
    of `rows` query rows (heads x s_q); `bulk_rows`: whether its fp8 rows would arrive by bulk copies."""
    if family == "mla_decode" and rows > FP8_REGISTER_MLA_MAX_ROWS:
        return "ring"
    if (family == "mla_decode" and scale_mode == "block" and not bulk_rows
            and scale_block_size < FP8_REGISTER_MLA_MIN_SPAN_CP_ASYNC):
        return "ring"
    return "registers" if scale_mode in FP8_REGISTER_LAYOUTS.get(family, ()) else "ring"


def _ring_candidates(fp8: bool, family: str, head_dim: int = 0, preferred_tile: tuple | None = None):
    """(pipeline fields, convert fields or None) in order of preference. A measured tile
    (`preferred_tile` = (block_n, stages, producers, column groups): fp8 KV dequantized in
    registers, 16-bit KV loaded by TMA) comes first. Without convert warps (16-bit KV, fp8 in
    registers): the deepest MMA ring first, four producer warps (issue is per warp: four keep HBM
    busy). fp8 KV through the convert warps: the bytes in flight sit in the fp8 load ring, so it
    goes deep and the 16-bit MMA ring stays short; GQA (two CTAs per SM) takes two producer warps
    and six convert warps (bench/fp8_tune.py: the convert stage is GQA's limit; 6 warps 1.04x over
    4, 4 warps 1.5x over 2), four at D = 256, whose consumers need more than the 85 registers
    12 warps x 2 CTAs leave."""
    if preferred_tile:
        _, stages, producers, _ = preferred_tile
        yield {"num_kv_stages": stages, "num_producer": producers}, None
    if preferred_tile is not None or not fp8:  # no convert warps
        for stages in RING_STAGES:
            for producers in PRODUCER_WARPS:
                yield {"num_kv_stages": stages, "num_producer": producers}, None
        return
    for load_stages in (6, 5, 4, 3, 2):
        for stages in (2, 3):
            roles = ((4, 4), (2, 4), (4, 2), (2, 2), (1, 2), (1, 1))
            gqa_roles = ((2, 6), (2, 4), (2, 2), (1, 2), (1, 1))[1 if head_dim >= 256 else 0:]
            for producers, convert in (gqa_roles if family == "gqa_decode" else roles):
                yield ({"num_kv_stages": stages, "num_producer": producers},
                       {"num_load_stages": load_stages, "num_convert": convert})


# How the sm80 kernel's producers fill 16-bit rings on sm_90 (measured on the H200, bench/RESULTS.md
# "Bulk-copy producers", "TMA producers" and "Bulk copies for MLA"): GQA D >= 128 by cp.async.bulk,
# one copy per K/V row (1-4% faster than 16-byte cp.async; TMA boxes measured 1-5% slower there);
# GQA D = 64 by TMA boxes of page rows x 64 columns at four CTAs per SM (5% faster than cp.async,
# whose 128-byte rows leave bulk copies issue-bound); 16-bit MLA at 16 heads per CTA (where the
# runtime runs MLA on this kernel) by cp.async.bulk per 1152-byte row (1.2-10% faster than
# cp.async; 32 and 64 heads per CTA, the sm80 fallback: unmeasured, cp.async), and so per-tensor
# fp8 MLA on the register path, one copy per 576-byte token into padded rows (1.05-1.26x faster
# than its cp.async producers, which were its limit); fp8 rings with block scales keep cp.async.
BULK_MIN_HEAD_DIM = 128
MLA_BULK_MAX_HEADS = 16
TMA_HEAD_DIMS = (64,)
# kv_load='tma': the measured tile per head dim, (block_n, num_kv_stages, num_producer, column groups)
TMA_TILES = {64: (64, 3, 1, 4)}
# 16-bit MLA by bulk copies (16 heads per CTA, sm_90): (block_n, num_kv_stages, num_producer, column
# groups). bench/mla16_ab.py over every tiling that fits (H200, twelfth session): 32-key tiles in 3
# stages 1.03-1.05x faster than in the deepest ring (5 stages) at b=128 s_k=4096, b=64 s_k=8192 and
# b=2 s_k=16384, within 1% of the best tiling of each shape. CTAs of one 16-row group only (where measured).
MLA_BULK_TILE = (32, 3, 4, 4)


def mla16_bulk_tilings(page_size: int = 64) -> dict[tuple[int, int, int, int], DecodeConfig]:
    """{(block_n, num_kv_stages, num_producer, num_consumer): config} for every tiling of the sm80
    kernel's 16-bit MLA at 16 heads per CTA on sm_90 (bulk copies) that builds: the space
    bench/mla16_ab.py times and tests/test_decode_gpu.py runs (MLA_BULK_TILE is its measured best)."""
    data = select_decode_config("mla_decode", "sm_90", "bf16", page_size, heads=16, head_dim=576,
                                s_q=1).model_dump(mode="json")
    out = {}
    for bn in (32, 64):
        for stages in range(2, 9):
            for producers in (2, 4):
                for consumers in (4, 8):
                    pipe = {**data["pipeline"], "num_kv_stages": stages, "num_producer": producers,
                            "num_consumer": consumers}
                    try:
                        out[(bn, stages, producers, consumers)] = build(DecodeConfig, {**data, "block_n": bn,
                                                                                       "pipeline": pipe})
                    except ConfigError:
                        continue
    return out
# Per-tensor fp8 GQA dequantized in registers, on sm_90: TMA boxes of page rows x 128 bytes into
# 128-byte-swizzled fp8 tiles beat the 16-byte cp.async producers by 0.4-2.8% at D = 128 and 256
# (bench/fp8_tma_ab.py, bench/RESULTS.md "TMA for fp8 tiles"), with these tiles.
FP8_TMA_HEAD_DIMS = (128, 256)
FP8_TMA_TILES = {128: (64, 6, 1, 4), 256: (64, 3, 1, 4)}


def kv_load_choice(family: str, arch: str, head_dim: int, fp8: bool, scale_mode: str = "none",
                   fp8_convert: str = "registers", heads_per_cta: int = 16) -> str:
    """How the sm80 kernel's producers fill the ring for these shapes: 'cp_async', 'bulk' or 'tma'."""
    if arch != "sm_90":
        return "cp_async"
    if family == "mla_decode":  # measured where the runtime runs MLA on this kernel (16 heads per CTA)
        bulk_fp8 = fp8_convert == "registers"  # fp8 tokens (576 or packed 656 bytes) into unswizzled rows
        return "bulk" if (bulk_fp8 or not fp8) and heads_per_cta <= MLA_BULK_MAX_HEADS else "cp_async"
    if fp8:
        tma = scale_mode == "per_tensor" and fp8_convert == "registers" and head_dim in FP8_TMA_HEAD_DIMS
        return "tma" if tma else "cp_async"
    if head_dim in TMA_HEAD_DIMS:
        return "tma"
    return "bulk" if head_dim >= BULK_MIN_HEAD_DIM else "cp_async"


def _sm80_search(family: str, arch: str, dtype: str, page_size: int, hpc: int, head_dims: tuple[int, int],
                 s_q: int, explicit: dict | None, kv: dict | None = None
                 ) -> tuple[DecodeConfig | None, ConfigError | None, dict]:
    """(the first candidate that validates and reaches the wanted CTAs per SM or None, the last
    rejection, the first candidate's data). `kv` holds the fp8 fields (kv_dtype, scale_mode,
    scale_block_size) for an fp8 cache, whose dequantization paths (`_fp8_paths`) are tried in
    order; when none fits, the first path's rejection."""
    tried = []
    for path in _fp8_paths(family, arch, head_dims[0], hpc, s_q, kv, explicit or {}):
        found = _sm80_search_path(family, arch, dtype, page_size, hpc, head_dims, s_q, explicit, kv, path)
        if found[0] is not None:
            return found
        tried.append(found)
    return tried[0]


def _fp8_paths(family: str, arch: str, head_dim: int, hpc: int, s_q: int, kv: dict | None,
               explicit: dict) -> tuple[str | None, ...]:
    """The sm80 kernel's ways to dequantize the cache, in the order the search tries them: (None,)
    for a 16-bit cache; the one asked for (`fp8_convert`, or 'ring' where `convert` fields are
    given); else `fp8_convert_path`'s choice, then the register path where that choice is the ring
    only because the register path's rows would arrive by 16-byte cp.async
    (FP8_REGISTER_MLA_MIN_SPAN_CP_ASYNC; the ring may fit nowhere: sm_89)."""
    if not kv or kv.get("kv_dtype") != "fp8_e4m3":
        return (None,)
    if "fp8_convert" in explicit or "convert" in explicit:
        return (explicit.get("fp8_convert", "ring"),)
    mode, rows = kv.get("scale_mode", "none"), hpc * s_q
    register_rows = explicit.get("kv_load") or kv_load_choice(family, arch, head_dim, True, mode, "registers", hpc)
    chosen = fp8_convert_path(family, mode, rows, kv.get("scale_block_size"), register_rows == "bulk")
    either_rows = fp8_convert_path(family, mode, rows)
    return (chosen,) if either_rows == chosen else (chosen, either_rows)


def _sm80_search_path(family: str, arch: str, dtype: str, page_size: int, hpc: int, head_dims: tuple[int, int],
                      s_q: int, explicit: dict | None, kv: dict | None, path: str | None
                      ) -> tuple[DecodeConfig | None, ConfigError | None, dict]:
    """`_sm80_search` on one dequantization path (None: a 16-bit cache; 'ring' or 'registers')."""
    dqk, dv = head_dims
    row_groups = -(-hpc * s_q // 16)
    base = {**dict(family=family, backend="sm80", arch=arch, head_dim_qk=dqk, head_dim_v=dv, heads_per_cta=hpc,
                   page_size=page_size, q_dtype=dtype, kv_dtype=dtype, max_s_q=s_q), **(kv or {})}
    fp8 = path is not None
    registers = path == "registers"
    preferred_tile = None
    if registers:
        base["fp8_convert"] = "registers"
        if fp8_block_p(family, base.get("scale_mode", "none"), dqk, base.get("scale_block_size")) == "scaled":
            base["fp8_block_p"] = "scaled"
        tiles = FP8_REGISTER_TILES if base.get("scale_mode") == "per_tensor" else FP8_REGISTER_TILES_BLOCK
        preferred_tile = tiles.get(dqk, ())
    load = (explicit or {}).get("kv_load") or kv_load_choice(
        family, arch, dqk, fp8, base.get("scale_mode", "none"), "registers" if registers else "ring", hpc)
    if load != "cp_async":
        base["kv_load"] = load
    if load == "tma":  # the measured tile first, then the usual search
        preferred_tile = (FP8_TMA_TILES if fp8 else TMA_TILES).get(dqk, ())
    elif load == "bulk" and family == "mla_decode" and not fp8 and row_groups == 1:  # measured at 16 rows
        preferred_tile = MLA_BULK_TILE
    want_ctas = (2, 1) if family == "gqa_decode" else (1,)
    last_err, first = None, None
    for ctas in want_ctas:
        tiles = _candidates(family, row_groups, dv)
        if preferred_tile:
            bn, _, _, cg = preferred_tile
            tiles = [(cg, bn)] + tiles
        for cg, bn in tiles:
            warps = row_groups * cg
            for pipe, convert in _ring_candidates(fp8, family, dqk, preferred_tile):
                data = {**base, "block_n": bn, "pipeline": {**pipe, "num_consumer": warps}}
                if convert is not None:
                    data["convert"] = convert
                if explicit:
                    data = overlay(data, explicit)
                first = first or data
                try:
                    cfg = build(DecodeConfig, data)
                except ConfigError as err:
                    last_err = err
                    continue
                if fp8 and cfg.threads > FP8_MAX_THREADS and not {"pipeline", "convert"} & set(explicit or ()):
                    continue
                if cfg.ctas_per_sm >= ctas:
                    return cfg, None, first
    return None, last_err, first or base


def sm80_choice(family: str, arch: str, dtype: str, page_size: int, heads_per_cta: int, head_dims: tuple[int, int],
                s_q: int, explicit: dict | None = None, kv: dict | None = None) -> DecodeConfig:
    """The preferred sm80 config for a CTA of `heads_per_cta` query heads: the first candidate
    (keys per tile, warp grid, ring depth, producers) that validates and reaches the wanted CTAs
    per SM. GQA prefers two CTAs per SM (more independent loads in flight), MLA the deepest ring
    one CTA can hold. `explicit` fields (a matrix entry's own values) override every candidate.

    Raises ConfigError when none fits; with `explicit`, the rejection of the first candidate
    under the explicit values, which names the field to change."""
    cfg, last_err, first = _sm80_search(family, arch, dtype, page_size, heads_per_cta, head_dims, s_q, explicit, kv)
    if cfg is not None:
        return cfg
    if explicit:
        build(DecodeConfig, first)  # raises, naming the explicit field no candidate could satisfy
    raise ConfigError(f"no sm80 variant fits {family} with heads_per_cta={heads_per_cta}, s_q={s_q}, "
                      f"page_size={page_size} on {arch}: {last_err}")


# Programmatic dependent launch of the combine (runtime default where the arch has it): the combine
# waits for the main kernel (griddepcontrol). sm80-backend kernels trigger their dependents once every
# tile is consumed; sm90 kernels by exiting. Measured on the H200 (bench/pdl_ab.py, bench/RESULTS.md):
# sm80-backend kernels 1.004-1.066x faster on the split shapes; the sm90 MLA kernel 0.95-0.97x at
# h=128 b=1 and b=32 with a trigger after its main loop, 1.009-1.033x with its CTAs triggering by
# exiting (twenty-eighth session, three runs); the sm80 kernels by exit lose their gain (0.995x at MLA
# h=16 b=2 against 1.060x), so each backend keeps its own trigger.
# Unmeasured arches (sm_100a) keep the plain launch.
PDL_BACKENDS = ("sm80", "sm90")
PDL_ARCHS = ("sm_90", "sm_90a")


def combine_pdl(config: DecodeConfig) -> bool:
    """Whether the runtime launches this variant's combine programmatically by default."""
    return config.backend in PDL_BACKENDS and config.arch in PDL_ARCHS


# sm90 MLA on sm_90 from this many query rows per CTA (heads x s_q) up; below, the sm80 kernel's
# 16-row mma tiles beat wgmma's 64-row tiles, 3/4 of whose math is padding (bench/RESULTS.md).
SM90_MLA_MIN_ROWS = 17


def preferred_backend(family: str, arch: str, heads: int, s_q: int, fp8: bool = False, head_dim: int = 128,
                      scale_mode: str = "none", scale_block_size: int | None = None) -> str:
    """The backend whose kernel runs these shapes best on a device of `arch` (measured): sm90 for
    MLA on sm_90 with more than 16 query rows per CTA (16-bit and fp8 caches alike) or an fp8 cache schedule 'keys_m'
    reads (`uses_keys_m`: at 16 rows or fewer), and for GQA on sm_90 from
    `sm90_gqa.sm90_gqa_min_rows(head_dim, scale_mode)` query rows per KV head (group x s_q; 32 for 16-bit caches,
    more for some fp8 layouts), sm80 otherwise. `fp8` without a `scale_mode` counts as per-tensor."""
    if arch != "sm_90":
        return "sm80"
    if family == "mla_decode" and heads * s_q >= SM90_MLA_MIN_ROWS:
        return "sm90"
    if fp8 and scale_mode == "none":
        scale_mode = "per_tensor"
    if family == "mla_decode" and uses_keys_m(family, heads, s_q, scale_mode, scale_block_size):
        return "sm90"
    if family == "gqa_decode" and heads * s_q >= sm90_gqa_min_rows(head_dim, scale_mode):
        return "sm90"
    return "sm80"


SM90_GQA_STAGES = (4, 3, 2)  # ring depths tried, deepest first, at two CTAs per SM where the tiling allows


def sm90_gqa_choice(dtype: str, page_size: int, group: int, head_dim: int, s_q: int,
                    kv: dict | None = None) -> DecodeConfig:
    """The sm90 GQA config: the KV head's group x s_q query rows (one math warpgroup per 64), tiles of 64
    keys, the deepest ring that keeps the tiling's CTAs per SM (two for one math warpgroup where two fit,
    codegen/sm90_gqa.py), else the deepest that fits."""
    fields = dict(family="gqa_decode", backend="sm90", arch="sm_90a", head_dim_qk=head_dim, head_dim_v=head_dim,
                  heads_per_cta=group, page_size=page_size, block_n=GQA_BLOCK_N, q_dtype=dtype, kv_dtype=dtype,
                  max_s_q=s_q)
    fields.update(kv or {})
    fitting = []
    for stages in SM90_GQA_STAGES:
        tiling = Sm90GqaTiling(head_dim=head_dim, rows=group * s_q, page_size=page_size, stages=stages,
                               fp8=kv is not None)
        if not tiling.problems():
            fitting.append((tiling.ctas_per_sm, stages))
    if not fitting:
        return build(DecodeConfig, {**fields, "num_kv_stages": SM90_GQA_STAGES[-1]})  # raises, naming the field
    return build(DecodeConfig, {**fields, "num_kv_stages": max(fitting)[1]})


SM90_FP8_STAGES = (2, 1)  # ring depths tried, deepest first (fp8_staging='fp8_ring': the 16-bit tile, Q and
#                           the fp8 ring share 227 KB; 'registers': the 16-bit ring's 2 stages)
# How the sm90 MLA kernel stages fp8 tiles: 'registers' (the producer warpgroup loads, dequantizes and
# stores them into the 16-bit ring, beside the math) or 'fp8_ring' (converted by the math warpgroups
# before each QK). bench/fp8_staging_ab.py measures both (bench/RESULTS.md).
SM90_FP8_STAGING = "registers"
# ... except where the seesaw applies (the launch does not split sequences, `sm90_schedule`): per-tensor fp8
# lands by TMA in the 16-bit slot it becomes and is converted there (fp8_staging='slot', the seesaw's math).
# Measured (bench/fp8_staging_ab.py and its forerunner, four runs on H200s, graph replays, all pinned;
# registers-lockstep time / slot-seesaw time): b=128 s_k=4096 h=32 1.02-1.04x, h=64 1.01-1.08x, h=128
# 0.97-1.04x (three of four runs faster), s_q=2 h=64 1.00-1.03x; split launches lose (b=32 s_k=8192 h=128
# 0.99-1.01x, b=1 s_k=32768 h=128 0.83-0.87x), as the 16-bit seesaw does there.
SM90_FP8_SLOT_LAYOUTS = ("per_tensor",)


def sm90_fp8_staging(scale_mode: str, splits: int | None) -> tuple[str, str]:
    """(fp8_staging, schedule) of the sm90 MLA kernel for an fp8 cache in `scale_mode` on a launch whose
    plan cuts each sequence into `splits` chunks (None: unknown): 'slot' under the seesaw where
    `sm90_schedule` takes it and the layout has a slot conversion (per-tensor), SM90_FP8_STAGING under
    the lockstep otherwise."""
    if scale_mode in SM90_FP8_SLOT_LAYOUTS and sm90_schedule(splits) == "seesaw":
        return "slot", "seesaw"
    return SM90_FP8_STAGING, "lockstep"


def sm90_splits(batch: int, heads: int, s_q: int, num_sms: int) -> int:
    """Chunks the split planner cuts each of this launch's sequences into on the sm90 MLA kernel (64
    query rows, one CTA per SM): more than 1 where fewer (sequence, head block) CTAs than fill the GPU.
    Shapes only, like the plan (the device plan gives short sequences fewer)."""
    return policy.num_splits(batch * sm90_head_blocks(heads, s_q), 1, num_sms)


def sm90_head_blocks(heads: int, s_q: int) -> int:
    """The sm90 MLA kernel's head blocks per sequence: CTAs of 64 query rows, 64 // s_q heads each."""
    return -(-heads // (64 // s_q))


def select_for_launch(family: str, arch: str, num_sms: int, dtype: str, page_size: int, *, heads: int, head_dim: int,
                      s_q: int, batch: int | None, long_chunks: bool = False, scale_mode: str = "none",
                      scale_block_size: int | None = None, backend: str | None = None) -> DecodeConfig:
    """The built-in choice for a launch of `batch` sequences (None: unknown) on an NVIDIA device of `arch` with
    `num_sms` SMs: `select_decode_config` with the sm90 MLA kernel's chunk count (`sm90_splits`) and the caller's
    long-chunks hint (`sm90_long_chunks`; fp8 caches ignore it). The runtime's choice on a device (the runtime
    adds its facts: arch and SM count) and `plan_choices`' for a device named by the caller. `backend` forces one
    (`select_decode_config`)."""
    splits = None if batch is None else sm90_splits(batch, heads, s_q, num_sms)
    return select_decode_config(family, arch, dtype, page_size, heads=heads, head_dim=head_dim, s_q=s_q,
                                backend=backend, scale_mode=scale_mode, scale_block_size=scale_block_size,
                                splits=splits, long_chunks=long_chunks and scale_mode == "none")


def plan_launches(family: str, heads: int, num_q_heads: int, s_q: int, max_batch: int,
                  num_sms: int) -> list[tuple[int, bool]]:
    """The (batch, long-chunks hint) launches whose choices cover every run of a plan object (MLADecode /
    GQADecode) with batches 1 .. max_batch: max_batch, then the first batch of each sm90 schedule the split
    plan's chunk count picks (what the choice depends on the batch through; the count is not monotonic in the
    batch: a grid just past a full wave is split), each also with the hint where it may apply (MLA with
    policy.SEESAW_SPLIT_MIN_HEAD_BLOCKS head blocks or more). `heads` is the selector's (H for MLA, Hq / Hkv
    for GQA); `num_sms` 0 where the device has no such plan (ROCm): one batch."""
    first: dict[str, int] = {}
    for batch in range(1, max_batch + 1):
        first.setdefault(sm90_schedule(sm90_splits(batch, heads, s_q, num_sms)) if num_sms > 0 else "", batch)
        if len(first) == 2:
            break
    hinted = (family == "mla_decode"
              and sm90_head_blocks(num_q_heads, s_q) >= policy.SEESAW_SPLIT_MIN_HEAD_BLOCKS)
    return [(max_batch, False)] + [(b, long) for b in sorted(first.values()) for long in ((False, True) if hinted
                                                                                         else (False,))]


def plan_choices(family: str, arch: str, num_sms: int, dtype: str, page_size: int, *, num_q_heads: int,
                 num_kv_heads: int, head_dim: int, s_q: int, max_batch: int, scale_mode: str = "none",
                 scale_block_size: int | None = None) -> list[DecodeConfig]:
    """Every variant a plan object of these arguments loads on a device of `arch` with `num_sms` SMs (CUDA) or
    on a ROCm device of `arch` (gfx90a / gfx942; `num_sms` unused), in load order: what a build farm compiles
    ahead of time so that the serving machines never JIT (`kvforge plan`)."""
    heads = num_q_heads if family == "mla_decode" else num_q_heads // num_kv_heads
    if arch.startswith("gfx"):
        if scale_mode != "none":
            raise ConfigError("fp8 KV caches are not supported on AMD GPUs (the cdna backend reads bf16/fp16)")
        return [select_cdna_config(family, arch, dtype, page_size, heads=heads, head_dim=head_dim, s_q=s_q)]
    out: list[DecodeConfig] = []
    for batch, long_chunks in plan_launches(family, heads, num_q_heads, s_q, max_batch, num_sms):
        cfg = select_for_launch(family, arch, num_sms, dtype, page_size, heads=heads, head_dim=head_dim, s_q=s_q,
                                batch=batch, long_chunks=long_chunks, scale_mode=scale_mode,
                                scale_block_size=scale_block_size)
        if cfg not in out:
            out.append(cfg)
    return out


def sm90_sequences_split(batch: int, heads: int, s_q: int, num_sms: int) -> bool:
    """Whether the split planner cuts this launch's sequences on the sm90 MLA kernel."""
    return sm90_splits(batch, heads, s_q, num_sms) > 1


def sm90_schedule(splits: int | None, long_chunks: bool = False) -> str:
    """The sm90 MLA kernel's math schedule for 16-bit KV on a launch whose plan cuts each sequence
    into `splits` chunks (None: unknown, taken as many): 'seesaw' up to policy.SEESAW_MAX_SPLITS
    (1: where the grid fills the GPU without cutting sequences), 'lockstep' beyond. Measured (bench/
    schedule_ab.py, H200, graph replays, both pinned; lockstep time / seesaw time): unsplit, the
    seesaw is 1.00-1.06x at every length tried (b=66..256, s_k=512..4096, 64 and 128 heads, s_q=2)
    and 1.02-1.09x at b=128 s_k=4096; split, it loses 2-10% where each CTA's chunk is short (4-16
    tiles: b=1..32 at s_k=4096..32768) and wins 3% where it is long (32+ tiles: b=1 s_k=131072,
    b=16 s_k=8192, b=32 s_k=8192). A split chunk's length is known only on the device, so split
    launches keep the lockstep. (Both schedules in one kernel, each CTA choosing by its tile count,
    lost ~10 us in the bigger binary's first pass: bench/RESULTS.md.) Re-measured with the seesaw's
    second warpgroup taking its QK first (fourteenth session): long split chunks 1.02-1.06x, short ones
    still 0.89-0.93x, so the rule stands without a hint. `long_chunks` (`sm90_long_chunks`: the caller's
    max_seq_len says the longest chunk has policy.SEESAW_SPLIT_MIN_TILES tiles or more, two head blocks
    sharing them) takes the seesaw for split launches too."""
    if long_chunks or (splits is not None and splits <= policy.SEESAW_MAX_SPLITS):
        return "seesaw"
    return "lockstep"


def sm90_partials_16bit(splits: int | None) -> bool:
    """partials_16bit for a launch whose plan cuts each sequence into `splits` chunks (None: unknown):
    policy.SM90_PARTIALS_16BIT where sequences are split (or may be), off where the grid runs unsplit. An unsplit
    launch writes no partials, and its fp32-partials variant is the SASS the kernel had before the 16-bit
    partials (the 16-bit variant's unsplit epilogue, rescheduled by ptxas, measured 1.5-4% slower on short
    unsplit launches in two runs: bench/RESULTS.md, twenty-third session)."""
    return policy.SM90_PARTIALS_16BIT and _may_split(splits)


def _may_split(splits: int | None) -> bool:
    """Whether a launch whose plan cuts each sequence into `splits` chunks (None: unknown) splits or may."""
    return splits is None or splits > 1


def sm90_l2_evict_first(splits: int | None) -> bool:
    """l2_evict_first for a 16-bit launch whose plan cuts each sequence into `splits` chunks (None: unknown):
    policy.SM90_L2_EVICT_FIRST_SPLIT where sequences are split (or may be), off where the grid runs unsplit (measured
    no faster there; the unsplit variants keep their SASS)."""
    return policy.SM90_L2_EVICT_FIRST_SPLIT and _may_split(splits)


def sm90_long_chunks(max_seq_len: int, batch: int, heads: int, s_q: int, num_sms: int) -> bool:
    """Whether a launch of `batch` sequences, the longest `max_seq_len` keys, is split with long chunks on the
    sm90 MLA kernel: the split plan cuts its sequences (`sm90_splits` > 1), the grid has at least
    policy.SEESAW_SPLIT_MIN_HEAD_BLOCKS head blocks, and the longest sequence's chunk has at least
    policy.SEESAW_SPLIT_MIN_TILES 64-key tiles (the kernel's time is that chunk's)."""
    splits = sm90_splits(batch, heads, s_q, num_sms)
    if splits <= 1 or sm90_head_blocks(heads, s_q) < policy.SEESAW_SPLIT_MIN_HEAD_BLOCKS:
        return False
    _, chunk = policy.split_plan(max_seq_len, splits, policy.min_keys_per_split(64), 64)
    return chunk // 64 >= policy.SEESAW_SPLIT_MIN_TILES


def sm90_choice(family: str, dtype: str, page_size: int, s_q: int, kv: dict | None = None,
                splits: int | None = None, fp8_staging: str | None = None, long_chunks: bool = False) -> DecodeConfig:
    """The sm90 MLA config: 64 query rows per CTA (wgmma's M), as many heads as s_q leaves room
    for (one variant per s_q, page size and schedule). 16-bit KV: `sm90_schedule` picks the math
    schedule from the launch's `splits` per sequence (None: unknown) and `long_chunks` (a caller's hint:
    `sm90_long_chunks`; fp8 staging ignores it: measured even there, bench/RESULTS.md). fp8 caches (`kv`: kv_dtype,
    scale_mode, scale_block_size) get `fp8_staging` and its schedule (default `sm90_fp8_staging`: the
    seesaw with 'slot' for unsplit per-tensor launches, 'registers' and the lockstep otherwise; a pinned
    'slot' takes the seesaw, any other staging the lockstep; 'slot' prefetches
    policy.SM90_FP8_SLOT_L2_PREFETCH_TILES tiles ahead into L2) and the deepest ring that fits. Split launches
    (and unknown ones) get 16-bit partials (`sm90_partials_16bit`) and, with 16-bit KV, evict_first KV loads
    (`sm90_l2_evict_first`)."""
    fields = dict(family=family, backend="sm90", arch="sm_90a", head_dim_qk=MLA_DIMS[0], head_dim_v=MLA_DIMS[1],
                  heads_per_cta=64 // s_q, page_size=page_size, block_n=64, q_dtype=dtype, kv_dtype=dtype,
                  max_s_q=s_q, num_kv_stages=2, partials_16bit=sm90_partials_16bit(splits))
    if kv is None:
        return build(DecodeConfig, {**fields, "schedule": sm90_schedule(splits, long_chunks),
                                    "l2_evict_first": sm90_l2_evict_first(splits)})
    if fp8_staging is None:
        fp8_staging, schedule = sm90_fp8_staging(kv["scale_mode"], splits)
    else:
        schedule = "seesaw" if fp8_staging == "slot" else "lockstep"
    prefetch = policy.SM90_FP8_SLOT_L2_PREFETCH_TILES if fp8_staging == "slot" else 0
    err = None
    for stages in SM90_FP8_STAGES:
        try:
            return build(DecodeConfig, {**fields, **kv, "num_kv_stages": stages, "fp8_staging": fp8_staging,
                                        "schedule": schedule, "l2_prefetch_tiles": prefetch})
        except ConfigError as e:
            err = e
    raise err


# Schedule 'keys_m' (codegen/sm90_keys_m.py): fp8 MLA with at most 16 query rows per CTA by fp8 wgmma, keys as M.
# Ring depth and QK chains measured on its per-tensor prototype (bench/RESULTS.md, thirty-second session): 4 stages
# 0.094 ms against 0.100 for 2 at b=128 s_k=4096 h=16; one QK chain 0.0911 against 0.0938 for two.
SM90_KEYS_M_STAGES = 4
SM90_KEYS_M_QK_CHAINS = 1
KEYS_M_LAYOUTS = ("per_tensor", "block", "fp8_ds_mla")  # the cache layouts schedule keys_m reads (sm90_keys_m.py)


# Built in for fp8 MLA at KEYS_M_ROWS query rows or fewer (heads x s_q) on sm_90: bench/keys_m_ab.py (bench/RESULTS.md)
# measured it 1.08-2.61x the previous choice (the sm80 fp8 kernel) on every per-tensor shape it ran, b=1-128,
# s_k=1K-16K, 8-16 heads, s_q 1-2, pages 16 and 64; on the packed token 1.11x / 3.77x (b=128 h=16 / s_q=2 h=8); with
# block scales of 128 columns 1.28x / 3.0x, of 64 1.11x / 2.36x (32-column blocks stay on the sm80 kernel:
# KEYS_M_SCALE_BLOCKS).
def uses_keys_m(family: str, heads: int, s_q: int, scale_mode: str, scale_block_size: int | None = None) -> bool:
    """Whether the sm90 MLA kernel of schedule 'keys_m' takes these shapes (MLA, an fp8 cache with per-tensor scales,
    block scales of 64 or 128 columns or DeepSeek's packed fp8_ds_mla token, at most KEYS_M_ROWS query rows: `heads`
    x `s_q`)."""
    if scale_mode == "block" and scale_block_size not in KEYS_M_SCALE_BLOCKS:
        return False
    return family == "mla_decode" and scale_mode in KEYS_M_LAYOUTS and heads * s_q <= KEYS_M_ROWS


def sm90_keys_m_choice(dtype: str, page_size: int, s_q: int, stages: int = SM90_KEYS_M_STAGES,
                       qk_chains: int = SM90_KEYS_M_QK_CHAINS, scale_mode: str = "per_tensor",
                       scale_block_size: int | None = None) -> DecodeConfig:
    """The sm90 MLA config of schedule 'keys_m' for a per-tensor fp8 cache, block scales of 64 or 128 columns or the
    packed fp8_ds_mla token: 16 query rows per CTA (16 // s_q heads), a ring of `stages` slots (every layout fits
    SM90_KEYS_M_STAGES)."""
    return build(DecodeConfig, dict(
        family="mla_decode", backend="sm90", arch="sm_90a", head_dim_qk=MLA_DIMS[0], head_dim_v=MLA_DIMS[1],
        heads_per_cta=16 // s_q, page_size=page_size, block_n=64, q_dtype=dtype, kv_dtype="fp8_e4m3",
        scale_mode=scale_mode, scale_block_size=scale_block_size, max_s_q=s_q, num_kv_stages=stages, schedule="keys_m",
        qk_chains=qk_chains if scale_mode == "per_tensor" else 1, merge_in_kernel=False, partials_16bit=False))


def select_decode_config(family: str, arch: str, dtype: str, page_size: int, *, heads: int, head_dim: int,
                         s_q: int, backend: str | None = None, scale_mode: str = "none",
                         scale_block_size: int | None = None, fp8_convert: str | None = None,
                         kv_load: str | None = None, splits: int | None = None,
                         long_chunks: bool = False) -> DecodeConfig:
    """The config for these shapes on a device of `arch`. `heads` is H for MLA and Hq / Hkv for
    GQA. `backend` forces one backend ('sm80' or 'sm90'); by default `preferred_backend` picks
    (sm90 for MLA on sm_90 with more than 16 query rows and for 16-bit GQA on sm_90 with 32 or more query
    rows per KV head, falling back to sm80 where no sm90 GQA tiling holds the shape; sm80 otherwise).
    `scale_mode` other than 'none' means an fp8_e4m3 cache in that layout (with `scale_block_size` for 'block');
    `fp8_convert` ('ring' or 'registers') forces how the sm80 kernel dequantizes it (default:
    `fp8_convert_path`); `kv_load` ('cp_async', 'bulk' or 'tma') how the sm80 kernel's producers
    fill the ring (default: `kv_load_choice`); either one pins the sm80 backend (with backend='sm90': an error). `splits`: chunks the launch's split plan cuts each
    sequence into (`sm90_splits`; None: unknown), which picks the sm90 schedule; counts past
    policy.SEESAW_MAX_SPLITS choose alike and share one cached choice. `long_chunks`: the caller's hint that
    the split chunks are long (`sm90_long_chunks`), which takes the seesaw for 16-bit split launches.

    sm80 picks heads per CTA, the warp grid, keys per tile and the ring depth (see `sm80_choice`).
    """
    if splits is not None:
        splits = min(max(splits, 1), policy.SEESAW_MAX_SPLITS + 1)
    return _select_decode_config(family, arch, dtype, page_size, heads, head_dim, s_q, backend, scale_mode,
                                 scale_block_size, fp8_convert, kv_load, splits, bool(long_chunks))


@lru_cache(maxsize=None)
def _select_decode_config(family: str, arch: str, dtype: str, page_size: int, heads: int, head_dim: int, s_q: int,
                          backend: str | None, scale_mode: str, scale_block_size: int | None,
                          fp8_convert: str | None, kv_load: str | None, splits: int | None,
                          long_chunks: bool = False) -> DecodeConfig:
    kv = None
    if scale_mode != "none":
        kv = {"kv_dtype": "fp8_e4m3", "scale_mode": scale_mode, "scale_block_size": scale_block_size}
    sm80_fields = [f"{name}={value!r}" for name, value in (("fp8_convert", fp8_convert), ("kv_load", kv_load)) if value]
    if backend == "sm90" and sm80_fields:
        raise ConfigError(f"{', '.join(sm80_fields)}: the sm80 backend's fields; backend='sm90' takes neither "
                          "(leave them out, or choose backend='sm80')")
    # the sm80 kernel's own fields pin its backend
    choice = backend or ("sm80" if sm80_fields else preferred_backend(
        family, arch, heads, s_q, fp8=kv is not None, head_dim=head_dim, scale_mode=scale_mode,
        scale_block_size=scale_block_size))
    if choice == "sm90":
        if arch != "sm_90":
            raise ConfigError(f"backend='sm90': runs on sm_90 devices only; this is {family} on {arch}")
        if family == "gqa_decode":
            try:
                return sm90_gqa_choice(dtype, page_size, heads, head_dim, s_q, kv)
            except ConfigError:
                if backend is not None:
                    raise
                choice = "sm80"  # no sm90 GQA tiling holds this shape (fp8 at D = 256 with 65+ rows): the sm80 kernel
        elif uses_keys_m(family, heads, s_q, scale_mode, scale_block_size):
            return sm90_keys_m_choice(dtype, page_size, s_q, scale_mode=scale_mode, scale_block_size=scale_block_size)
        else:
            return sm90_choice(family, dtype, page_size, s_q, kv, splits, long_chunks=long_chunks)
    if choice != "sm80":
        raise ConfigError(f"backend={choice!r}: choose 'sm80' or 'sm90'")
    if family == "mla_decode":
        hpc, dims = _mla_heads_per_cta(heads, s_q), MLA_DIMS
    else:
        hpc, dims = heads, (head_dim, head_dim)
    if fp8_convert not in (None, "ring", "registers"):
        raise ConfigError(f"fp8_convert={fp8_convert!r}: choose 'ring' or 'registers'")
    if kv_load not in (None, "cp_async", "bulk", "tma"):
        raise ConfigError(f"kv_load={kv_load!r}: choose 'cp_async', 'bulk' or 'tma'")
    explicit = {**({"fp8_convert": fp8_convert} if fp8_convert and kv else {}),
                **({"kv_load": kv_load} if kv_load else {})} or None
    cfg, last_err, _ = _sm80_search(family, arch, dtype, page_size, hpc, dims, s_q, explicit, kv)
    # MLA where no CTA of hpc heads fits the arch (sm_86 and sm_89: 99 KB of shared memory hold the rings of 16 query
    # rows, not 32): fewer heads per CTA, down to one 16-row mma tile; each head block reads the cache
    while cfg is None and family == "mla_decode" and hpc > 1 and hpc * s_q > 16:
        hpc //= 2
        cfg, last_err, _ = _sm80_search(family, arch, dtype, page_size, hpc, dims, s_q, explicit, kv)
    if cfg is None:
        kv_text = f", an fp8 cache ({scale_mode})" if kv else ""
        raise ConfigError(f"no sm80 variant fits {family} with heads={heads}, head_dim={head_dim}, s_q={s_q}, "
                          f"page_size={page_size}{kv_text} on {arch}: {last_err}")
    return cfg


def cdna_fields(family: str, head_dims: tuple[int, int]) -> dict:
    """block_n and the K/V KVBufferConfigs of the cdna choice: MFMA 16x16x16, 128 threads."""
    dqk, dv = head_dims
    if family == "mla_decode":
        bn, threads, k_wn, v_wn = 16, 128, 16, 16
    else:
        bn, threads, k_wn, v_wn = 32, 128, 16, 32
    buffers = ({"role": "K", "BN": bn, "WN": k_wn, "BK": 16, "depth": dqk, "num_threads": threads},
               {"role": "V", "BN": bn, "WN": v_wn, "BK": 16, "depth": dv, "num_threads": threads})
    return {"block_n": bn, "kv_buffers": buffers}


@lru_cache(maxsize=None)
def select_cdna_config(family: str, arch: str, dtype: str, page_size: int, *, heads: int, head_dim: int,
                       s_q: int) -> DecodeConfig:
    """The cdna-backend config for these shapes: MFMA 16x16x16, one 16-row query tile per workgroup."""
    if family == "mla_decode":
        hpc, dims = max(1, 16 // s_q), MLA_DIMS
    else:
        hpc, dims = heads, (head_dim, head_dim)
    return build(DecodeConfig, dict(family=family, backend="cdna", arch=arch, head_dim_qk=dims[0],
                                    head_dim_v=dims[1], heads_per_cta=hpc, page_size=page_size, q_dtype=dtype,
                                    kv_dtype=dtype, max_s_q=s_q, **cdna_fields(family, dims)))
