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


def min_keys_per_split(block_n: int) -> int:
    """The planner never cuts a sequence into chunks shorter than this."""
    return max(2 * block_n, 256)


def num_splits(ctas: int, ctas_per_sm: int, num_sms: int) -> int:
    """Splits per sequence so the grid fills the SMs: shapes and SM count only, never the lengths
    (so a captured graph replays with new lengths)."""
    return max(1, min(MAX_SPLITS, (num_sms * ctas_per_sm) // max(ctas, 1)))


def split_plan(seqlen: int, splits: int, min_keys: int, block_n: int) -> tuple[int, int]:
    """(chunks, keys per chunk) for one sequence of `seqlen` keys (negative counts as 0)."""
    length = max(seqlen, 0)
    n = min(splits, max(1, -(-length // min_keys)))
    chunk = -(-(-(-length // n)) // block_n) * block_n
    return (-(-length // chunk) if length > 0 else 1), chunk


def head_blocks(family: str, num_q_heads: int, num_kv_heads: int, heads_per_cta: int) -> int:
    """Grid x of the main kernel: MLA's query heads in blocks of heads_per_cta, GQA's KV heads."""
    return -(-num_q_heads // heads_per_cta) if family == "mla_decode" else num_kv_heads


def workspace_rows(max_batch: int, s_q: int, num_q_heads: int, blocks: int, ctas_per_sm: int, num_sms: int) -> int:
    """fp32 partial rows any call of at most `max_batch` sequences may need (batch * splits * s_q * H):
    batch * num_splits(blocks * batch) <= max(max_batch, SMs * ctas_per_sm // blocks) for every batch."""
    return max(max_batch, (num_sms * ctas_per_sm) // max(blocks, 1)) * s_q * num_q_heads


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
KVFORGE_HD inline int policy_num_splits(int ctas, int ctas_per_sm, int num_sms) {{
  const int s = num_sms * ctas_per_sm / (ctas > 1 ? ctas : 1);
  return s < 1 ? 1 : (s > kMaxSplits ? kMaxSplits : s);
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
