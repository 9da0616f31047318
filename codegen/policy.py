"""Policy: what kvforge supports and how work is cut, in one place.

The supported ranges (heads, s_q, page sizes, head dims, groups), the dtype tables, the split
count and the per-sequence split plan, and the head blocks of the grid. Config validation, the
selector, the runtime and the C launcher use the Python functions; the device code and the C
launchers get the same formulas from `C_POLICY`, which sits beside them so the two forms are read
(and changed) together. tests/test_policy.py compiles `C_POLICY` with the host C++ compiler and
checks it against the Python functions over many inputs.
"""
from __future__ import annotations

# ---- supported ranges -------------------------------------------------------------------------
MLA_DIMS = (576, 512)          # (qk: 512 latent + 64 rope, v: 512)
MLA_MAX_HEADS = 128
GQA_HEAD_DIMS = (64, 128, 256)
GQA_GROUPS = (1, 2, 4, 8, 16)  # query heads per KV head
PAGE_SIZES = (16, 32, 64, 128)
MAX_S_Q = 8
MAX_Q_ROWS = 128               # query heads x s_q rows one CTA (MLA) or one KV head (GQA) may hold

# ---- dtypes -------------------------------------------------------------------------------------
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int32": 4, "fp8_e4m3": 1}
C_TYPES = {"bf16": "__nv_bfloat16", "fp16": "__half"}
# DeepSeek's packed fp8 MLA token (scale_mode 'fp8_ds_mla'): 512 e4m3 latent values, 4 fp32 scales
# (one per 128 latent channels), 64 bf16 rope values
DS_MLA_TOKEN_BYTES, DS_MLA_LATENT, DS_MLA_SCALES, DS_MLA_SCALE_BLOCK = 656, 512, 4, 128
SCALE_BLOCK_SIZES = (32, 64, 128)
HIP_ELEMENT_C_TYPE = "unsigned short"  # the HIP kernels take 16-bit storage and convert themselves

# ---- the device-side error record (kvforge.check_errors) -----------------------------------------
ERROR_RECORD_INTS = 8  # code, batch index, block-table index, value, sequence length, bound, 2 spare
ERR_SEQLEN = 1         # cache_seqlens[b] outside 0..max_pages * page_size
ERR_PAGE = 2           # block_table[b][i] outside 0..num_pages - 1 for a page the sequence reaches

# ---- split-KV -----------------------------------------------------------------------------------
MAX_SPLITS = 64  # chunks per sequence at most (sizes the fp32 workspace)
LOG2E = 1.4426950408889634

# ---- online softmax -------------------------------------------------------------------------------
# lazy_rescale: a row's running maximum moves only when a tile's exceeds it by more than this (log2 units;
# FA4's choice), so P < 2^8 (bf16/fp16 and the fp32 sums hold it) and most tiles skip the output rescale
RESCALE_SLACK_LOG2 = 8.0
# ... and which backends take it by default (bench/lazy_rescale_ab.py, H200, graph replays, 2 rounds, eager
# time / lazy time): the sm90 MLA kernel, whose output rescale sits on the seesaw's hand-off chain, gains
# 1.02-1.06x (16-bit h=64 1.062, h=128 1.041, s_q=2 1.047; per-tensor fp8 1.02-1.05; split b=1/b=32
# 1.00-1.03); the sm80 kernel gains nothing and the issue-bound 16-row fp8 kernel loses (h=16 per-tensor
# 0.948, GQA b=1 fp8 0.983; the vote costs more than the skipped multiplies there)
SM90_LAZY_RESCALE = True
# ... schedule 'keys_m' (P^T as e4m3 hi/lo tiles of KEYS_M_P_SCALE_MAX / 2^slack times p, below e4m3's 448):
# a smaller slack, 1.5, so that P's scale stays 128 (a tile's hi/lo pair keeps p's 8 leading bits down to
# p = 2^-8); 0 would rescale most tiles of a random sequence (every increase of any of 16 rows)
KEYS_M_RESCALE_SLACK_LOG2 = 1.5

# ---- the sm90 MLA kernel's schedule --------------------------------------------------------------
# The seesaw (tiles in pairs, one math warpgroup's wgmmas under the other's softmax) where the split plan
# cuts each sequence into at most this many chunks, the lockstep beyond (codegen/select.py::sm90_schedule):
# the seesaw needs long chunks (it loses 7-11% at 16 tiles per CTA, wins 2-6% from 32), and the plan's
# chunk count is what the host knows of their length (shapes only).
SEESAW_MAX_SPLITS = 1
# ... and split launches whose longest chunk is long, where the caller says so (`max_seq_len`, a host-side hint:
# the plan alone knows no lengths): the seesaw when the chunk of the longest sequence has at least
# SEESAW_SPLIT_MIN_TILES 64-key tiles and the grid has at least SEESAW_SPLIT_MIN_HEAD_BLOCKS head blocks (their
# CTAs read the same tiles). Measured (H200, graph replays; lockstep time / seesaw time, 16-bit): 128 heads,
# 32+ tiles per chunk 1.02-1.06x (b=32 s_k=8192 1.055 with both merging, b=24 s_k=4096 1.03, b=16 s_k=8192 1.022,
# b=4 s_k=32768 1.033, b=1 s_k=131072 1.030); 16 tiles 0.93-0.98x; 64 heads (one head block) 0.96-0.99x even at
# 32-43 tiles (bench/RESULTS.md, sixteenth and eighth sessions).
SEESAW_SPLIT_MIN_TILES = 32
SEESAW_SPLIT_MIN_HEAD_BLOCKS = 2
# The seesaw's pair order stays the built-in one (warpgroup 1 multiplies P_A V_A[R] first): FlashMLA's order,
# Sm90DecodeConfig.seesaw_b_first, is correct and measured no faster (bench/seesaw_b_first_ab.py, H200, graph
# replays, 3 rounds; built-in time / b_first time): h=32 0.971, h=64 0.946, h=128 1.020, s_q=2 h=64 0.977, b=32
# s_k=8192 0.988 (twenty-sixth session; docs/seesaw-load-lead.md), so select never sets it.

# ---- merging split sequences in the main kernel ---------------------------------------------------
# merge_in_kernel: a sequence cut into 2 .. MERGE_MAX_SPLITS chunks is merged by the last of its CTAs
# (per head block) to finish, found by an atomic count, instead of by the combine kernel (which keeps
# sequences cut into more). Measured (bench/merge_ab.py, H200, graph replays, 2 rounds; combine time /
# merged time, lockstep): 2 chunks 1.09-1.25x (b=32 s_k=8192 h=128 1.094, b=24 s_k=4096 h=128 1.102, b=32
# s_k=2048 h=128 1.249, b=48 s_k=4096 h=64 1.103: no 26 us combine launch of 4,096 small CTAs), 3 chunks
# 1.00-1.01x, 4 chunks 0.93-0.96x (the last CTA reads three partials in series at the tail), so 2. (That run
# merged from the accumulator; the kept merge reads every partial back from L2, which leaves the fp8 kernels
# no spills: two chunks 1.05-1.21x for 16-bit and 1.07-1.19x for per-tensor fp8, bench/RESULTS.md. The kept
# merge at MERGE_MAX_SPLITS 8, `merge_ab.py --max-splits 8`: 3 chunks 0.91-0.93x, 4 chunks 0.72-0.80x, 8 chunks
# 0.41-0.45x, so 2 stays.)
MERGE_MAX_SPLITS = 2
# The counts live at the start of every CUDA workspace (zeroed when it is allocated; each merging CTA
# resets its count, so they are zero between calls): one int per (sequence, head block) of a split
# launch. Split launches of a merging variant (wave_splits 1) have at most SMs x CTAs per SM / 2 such
# tiles, so 4096 covers GPUs of up to 8192 SMs; the runtime and the C launchers refuse a larger grid.
MERGE_COUNTER_INTS = 4096
# ... and its default on the sm90 MLA kernel (16-bit and fp8 KV)
SM90_MERGE_IN_KERNEL = True

# partials_16bit (sm90 MLA): a split's normalized partial rows in the output dtype rather than fp32. The epilogue's
# stores of every CTA at once are bound by their bytes (bench/phase_trace.py, H200: 128 KB of fp32 rows per CTA
# 3.6 us, 64 KB of 16-bit rows 2.2 us, 64 KB of 16-bit partials 1.85 us), and the merge and the combine read half as
# much. bench/tree_ab.py against fp32 partials (graph replays, 3 rounds, two calls): b=1 s_k=32768 h=128 1.076x /
# 1.077x, b=32 s_k=1024 and 2048 h=128 (two chunks merged in the kernel) 1.049-1.059x and 1.033-1.059x; the
# partials are rounded once more, to the precision the output is rounded to anyway (the GPU tests' tolerances
# hold). The built-in choice takes them for split launches only (select.sm90_partials_16bit: unsplit launches
# write no partials and keep the fp32 variant's SASS, the kernel as it was). (The ninth session's 16-bit partials
# were 3-13% slower: 4-byte stores from the accumulator and 8-byte combine loads; the staged epilogue stores
# 16-byte units either way.)
SM90_PARTIALS_16BIT = True

# l2_prefetch_tiles (sm90 MLA, TMA producers): the producer also prefetches the tile this many ahead into L2
# when it issues a tile's loads. The ring has two 72 KB stages, so a slot's refill is issued only when the slot
# frees, and the 128-head seesaw's warpgroup 1 then waits on it (its QK of the next B: the hottest stall,
# 14.5% of the kernel's samples, seventeenth session's profile). Off until measured (bench/prefetch_ab.py). (The
# eleventh session's bulk-copy prefetch of fp8 page runs for the 'slot' staging changed nothing beyond noise:
# there the conversion, not the load, held the slot.)
SM90_L2_PREFETCH_TILES = 0
# ... measured (bench/prefetch_ab.py, H200, graph replays, 2 rounds; off / on, eighteenth session): 16-bit seesaw
# 0.80-0.98x (h=32 0.83, h=64 0.80-0.85, h=128 0.96-0.98, s_q=2 0.94): the prefetch slows the 16-bit kernels, off;
# lockstep 0.98-1.00x. The fp8 'slot' staging (per-tensor, in-slot conversion) 2 ahead: 1.016-1.022x on every
# shape (h=32, h=64, h=128, s_q=2 h=64), 1 ahead 1.000-1.025x; a second run, 2 ahead, 4 rounds: 1.022, 1.005,
# 0.996, 1.013 (mean of the eight +1.4%, a small gain at the edge of the noise, one shape even): its default
# (codegen/select.py::sm90_choice).
SM90_FP8_SLOT_L2_PREFETCH_TILES = 2


# l2_evict_first (sm90 MLA, 16-bit KV): the KV tiles' TMA loads carry an L2 evict_first policy (FlashMLA's hint on its
# KV loads). Measured (bench/l2_policy_ab.py, H200, graph replays; shipped time / evict_first time; three runs, two
# sessions): the split launches gain every time, b=1 s_k=32768 h=128 1.021 / 1.022 / 1.010 and b=32 s_k=8192 h=128
# 1.004 / 1.017 / 1.014; the unsplit ones move inside the noise (h=32 0.996-0.998, h=64 0.997-1.022, h=128
# 0.995-1.000, s_q=2 h=64 0.984-1.049) and GQA's TMA loads lose a little (D=64 0.990 / 0.997). So split launches
# only (select.sm90_l2_evict_first), where the partial rows the merge or combine reads back share L2 with the stream.
SM90_L2_EVICT_FIRST_SPLIT = True


def min_keys_per_split(block_n: int) -> int:
    """The planner never cuts a sequence into chunks shorter than this."""
    return max(2 * block_n, 256)


WAVE_SPLITS = 4       # splits per sequence a GQA grid that already fills the GPU may take to even out its waves
SPLIT_COST_DIV = 20   # each split beyond the first costs 1/20 of a sequence's unsplit work (Q, fill, epilogue)
WAVE_SPLIT_SLOTS = 8  # split CTAs at most, in units of SMs x CTAs per SM (bounds the partials' workspace)


def num_splits(ctas: int, ctas_per_sm: int, num_sms: int, wave_splits: int = 1) -> int:
    """Splits per sequence: the k in 1 .. max(slots // ctas, wave_splits) (at most MAX_SPLITS) with
    the least modelled time, waves(k) / k x (1 + (k - 1) / SPLIT_COST_DIV), where waves(k) =
    ceil(ctas x k / slots) and slots = SMs x CTAs per SM; the smaller k on a tie; and never more
    than WAVE_SPLIT_SLOTS x slots CTAs in all (so split launches need a bounded workspace,
    `split_pairs_bound`). A grid up to half the slots gets slots // ctas (it fills one wave; more
    splits only add cost), as before; a grid past the slots gets a few splits when its last wave
    would run mostly empty (544 CTAs on 264 slots: 3 waves unsplit, 7 waves of thirds). Shapes and
    SM count only, never the lengths (so a captured graph replays with new lengths; the device plan
    gives short sequences fewer splits). Inside one wave the cost falls with k, so the search starts
    at the fill count min(MAX_SPLITS, slots // ctas) (at least 1). `wave_splits` 1 (MLA: a split's partial rows and Q reload
    cost far more than 1/20, measured: bench/RESULTS.md) leaves grids that fill the GPU unsplit and
    gives the others min(MAX_SPLITS, slots // ctas), the cost falling with k inside one wave; GQA
    takes WAVE_SPLITS (`DecodeConfig.wave_splits`)."""
    slots, ctas = num_sms * ctas_per_sm, max(ctas, 1)
    fill = max(1, min(MAX_SPLITS, slots // ctas))  # inside one wave the cost falls with k: only the fill count
    best, best_num, best_den = fill, 0, 1
    for k in range(fill, min(MAX_SPLITS, max(fill, wave_splits)) + 1):
        if k > fill and ctas * k > WAVE_SPLIT_SLOTS * slots:
            break
        num, den = -(-ctas * k // slots) * (SPLIT_COST_DIV - 1 + k), k  # cost x SPLIT_COST_DIV, as a fraction
        if k == fill or num * best_den < best_num * den:
            best, best_num, best_den = k, num, den
    return best


def split_plan(seqlen: int, splits: int, min_keys: int, block_n: int) -> tuple[int, int]:
    """(chunks, keys per chunk) for one sequence of `seqlen` keys (negative counts as 0)."""
    length = max(seqlen, 0)
    n = min(splits, max(1, -(-length // min_keys)))
    chunk = -(-(-(-length // n)) // block_n) * block_n
    return (-(-length // chunk) if length > 0 else 1), chunk


def head_blocks(family: str, num_q_heads: int, num_kv_heads: int, heads_per_cta: int) -> int:
    """Grid x of the main kernel: MLA's query heads in blocks of heads_per_cta, GQA's KV heads."""
    return -(-num_q_heads // heads_per_cta) if family == "mla_decode" else num_kv_heads


def split_pairs_bound(blocks: int, ctas_per_sm: int, num_sms: int, wave_splits: int = 1) -> int:
    """The most (sequence, split) pairs a split launch of any batch has: batch * num_splits(blocks *
    batch) over the batches that split (a launch that does not split needs no partials). Split
    launches have at most WAVE_SPLIT_SLOTS x slots CTAs, so the batches to try are finite."""
    slots, blocks = num_sms * ctas_per_sm, max(blocks, 1)
    most = 0
    for b in range(1, WAVE_SPLIT_SLOTS * slots // blocks + 1):
        k = num_splits(blocks * b, ctas_per_sm, num_sms, wave_splits)
        if k > 1:
            most = max(most, b * k)
    return max(most, 1)


def workspace_rows(max_batch: int, s_q: int, num_q_heads: int, blocks: int, ctas_per_sm: int, num_sms: int,
                   wave_splits: int = 1) -> int:
    """fp32 partial rows any call of at most `max_batch` sequences may need (batch * splits * s_q * H):
    the largest batch * num_splits(blocks * batch) over batch 1 .. max_batch (as the C launchers' loop)."""
    most = max(b * num_splits(blocks * b, ctas_per_sm, num_sms, wave_splits) for b in range(1, max(max_batch, 1) + 1))
    return most * s_q * num_q_heads


# ---- the same formulas for the device code and the C launchers ----------------------------------
# Placed verbatim into every generated source and launcher header (inside an anonymous namespace
# there); `KVFORGE_HD` is `__host__ __device__` under nvcc/hipcc and empty for a host compiler.
C_POLICY = f"""\
#ifndef KVFORGE_HD
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define KVFORGE_HD __host__ __device__
#else
#define KVFORGE_HD
#endif
#endif
constexpr int kMaxSplits = {MAX_SPLITS};
constexpr int kErrSeqlen = {ERR_SEQLEN}, kErrPage = {ERR_PAGE};
KVFORGE_HD inline int policy_min_keys_per_split(int block_n) {{ return 2 * block_n > 256 ? 2 * block_n : 256; }}
// Splits per sequence: num_splits() in codegen/policy.py (the least modelled time over k splits).
KVFORGE_HD inline int policy_num_splits(int ctas, int ctas_per_sm, int num_sms, int wave_splits) {{
  const long long slots = (long long)num_sms * ctas_per_sm, c = ctas > 1 ? ctas : 1;
  long long fill = slots / c;  // inside one wave the cost falls with k: only the fill count
  fill = fill < 1 ? 1 : (fill > kMaxSplits ? kMaxSplits : fill);
  long long kmax = fill > wave_splits ? fill : wave_splits;
  kmax = kmax < kMaxSplits ? kmax : kMaxSplits;
  int best = (int)fill;
  long long best_num = 0, best_den = 1;
  for (int k = (int)fill; k <= kmax; ++k) {{
    if (k > fill && c * k > {WAVE_SPLIT_SLOTS} * slots) break;
    const long long num = (c * k + slots - 1) / slots * ({SPLIT_COST_DIV} - 1 + k), den = k;
    if (k == fill || num * best_den < best_num * den) {{
      best = k;
      best_num = num;
      best_den = den;
    }}
  }}
  return best;
}}
// (chunks, keys per chunk) of one sequence: what split_plan() in codegen/policy.py computes.
KVFORGE_HD inline void policy_split_plan(int seqlen, int splits, int min_keys, int block_n, int* n_out,
                                         int* chunk_out) {{
  const int len = seqlen > 0 ? seqlen : 0;
  int n = (len + min_keys - 1) / min_keys;
  n = n < 1 ? 1 : (n > splits ? splits : n);
  const int chunk = ((len + n - 1) / n + block_n - 1) / block_n * block_n;
  *n_out = len > 0 ? (len + chunk - 1) / chunk : 1;
  *chunk_out = chunk;
}}"""
