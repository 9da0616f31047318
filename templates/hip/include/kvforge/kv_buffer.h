// kvforge/kv_buffer.h: the DecodeKVBuffer of the CDNA kernels (docs/architecture.md).
//
// One implementation for the K and V roles: load_from_dram() moves a tile of kBN tokens from the
// paged cache into registers (16 B per lane per load, token = flat / chunks, chunk = flat % chunks
// with flat = thread + load * kThreads), copy_to_shared() writes them to an LDS tile whose 16-byte
// chunks are XOR-swizzled by (token mod kSwizzle), and the load_from_shared_* readers hand MFMA
// operands to a k step: K as the B operand of S = Q K^T (4 consecutive depth elements of one
// token), V as the B operand of O = P V (4 consecutive tokens of one column).
#pragma once

#include "kvforge/cdna_prelude.h"

namespace kvforge {
namespace cdna {

// Element offset of logical (row, col) in a swizzled LDS tile of kRowElems 16-bit elements per row.
template <int kRowElems, int kSwizzle>
__device__ inline int lds_offset(int row, int col) {
  return row * kRowElems + ((((col >> 3) ^ (row % kSwizzle))) << 3) + (col & 7);
}

template <class T, int kBN, int kDepth, int kThreads, int kSwizzle, int kPageSize>
struct DecodeKVBuffer {
  static constexpr int kChunks = kDepth * 2 / 16;
  static constexpr int kLoads = kBN * kChunks / kThreads;
  uint4_t regs[kLoads];

  // Tokens [j0, j0 + kBN) of one sequence; tokens at or past key_end read nothing (zeros).
  __device__ inline void load_from_dram(const u16* cache, const int* bt_row, long long token_stride, long long head_off,
                                        int j0, int key_end) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int flat = thread_id() + i * kThreads;
      const int tok = flat / kChunks, chunk = flat % kChunks;
      const int j = j0 + tok;
      uint4_t v = {0u, 0u, 0u, 0u};
      if (j < key_end) {
        const long long row = static_cast<long long>(bt_row[j / kPageSize]) * kPageSize + j % kPageSize;
        v = *reinterpret_cast<const uint4_t*>(cache + row * token_stride + head_off + chunk * 8);
      }
      regs[i] = v;
    }
  }

  __device__ inline void copy_to_shared(u16* tile) const {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int flat = thread_id() + i * kThreads;
      const int tok = flat / kChunks, chunk = flat % kChunks;
      *reinterpret_cast<uint4_t*>(tile + lds_offset<kDepth, kSwizzle>(tok, chunk * 8)) = regs[i];
    }
  }
};

// K role: depth elements k..k+3 of token `key` (8 bytes, inside one swizzled chunk).
template <class T, int kRowElems, int kSwizzle>
__device__ inline typename T::vec4 load_from_shared_k(const u16* tile, int key, int k) {
  const uint2_t raw = *reinterpret_cast<const uint2_t*>(tile + lds_offset<kRowElems, kSwizzle>(key, k));
  return __builtin_bit_cast(typename T::vec4, raw);
}

// V role: column `col` of tokens k..k+3.
template <class T, int kRowElems, int kSwizzle>
__device__ inline typename T::vec4 load_from_shared_v(const u16* tile, int k, int col) {
  u16 e[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) e[i] = tile[lds_offset<kRowElems, kSwizzle>(k + i, col)];
  uint2_t raw = {static_cast<unsigned>(e[0]) | (static_cast<unsigned>(e[1]) << 16),
                 static_cast<unsigned>(e[2]) | (static_cast<unsigned>(e[3]) << 16)};
  return __builtin_bit_cast(typename T::vec4, raw);
}

}  // namespace cdna
}  // namespace kvforge
