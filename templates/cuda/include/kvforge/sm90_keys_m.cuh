// kvforge/sm90_keys_m.cuh: the device pieces of the sm90 MLA kernels of schedule 'keys_m' (fp8 wgmma with a tile's
// 64 keys as M; codegen/sm90_keys_m.py) that do not depend on a kernel's tiling: the hi/lo e4m3 splits of Q and P,
// P^T's key order and stores, the reductions over an accumulator column, and V^T's A fragments read from a slot.
//
// Fragment layout (wgmma's m64nN accumulator with keys as rows): thread (warp w, lane: g = lane / 4, i = lane % 4)
// of a warpgroup holds, of S^T, keys 16 w + g (+8) and query columns 8 j + 2 i (+1); of O^T, dims 64 d + 16 w +
// 2 g (+1) of the same query columns, the order V^T's fragments below give.
#pragma once

#include "kvforge/fp8_convert.cuh"
#include "kvforge/sm90_tile.cuh"

namespace kvforge {
namespace keys_m {

using u32 = unsigned int;

// A float pair's hi/lo e4m3 pairs at `unit` (x ~ hi + lo / unit): hi = e4m3(x), lo = e4m3(unit (x - hi)).
__device__ __forceinline__ void split_e4m3(float x0, float x1, float unit, unsigned short& hi, unsigned short& lo) {
  hi = fp8::f32x2_e4m3(x0, x1);
  const float2 h = fp8::e4m3x2_f32(hi);
  lo = fp8::f32x2_e4m3(unit * (x0 - h.x), unit * (x1 - h.y));
}

// The same split in fp16 (x a pair of fp16 values, as P is formed): hi = e4m3(x), lo = e4m3(x - hi), the difference
// exact in fp16 (x has 11 significant bits, hi 4 of its leading ones).
__device__ __forceinline__ void split_e4m3_f16(u32 x, unsigned short& hi, unsigned short& lo) {
  hi = fp8::f16x2_e4m3(x);
  const u32 h = fp8::e4m3x2_to_f16x2(hi);
  const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&x), *reinterpret_cast<const __half2*>(&h));
  lo = fp8::f16x2_e4m3(*reinterpret_cast<const u32*>(&d));
}

// The k slot (0..31 of a k32 block) of key kappa (0..31): the order ldmatrix.trans + prmt give V^T's fragments.
__host__ __device__ constexpr int key_slot(int kappa) {
  return 16 * (kappa / 16) + (kappa % 16 < 8 ? 4 * (kappa % 16 / 2) + kappa % 2 : 4 * ((kappa % 16 - 8) / 2) + 2 + kappa % 2);
}
// store_p_words relies on it: a lane pair's keys g, g + 1 (g even) and g + 8, g + 9 fill key slots 4 (g / 2) .. +3
__host__ __device__ constexpr bool lane_pairs_fill_words() {
  for (int h = 0; h < 2; ++h)
    for (int g = 0; g < 8; g += 2) {
      const int base = 16 * h + 4 * (g / 2);
      if (key_slot(16 * h + g) != base || key_slot(16 * h + g + 1) != base + 1 || key_slot(16 * h + g + 8) != base + 2 ||
          key_slot(16 * h + g + 9) != base + 3)
        return false;
    }
  return true;
}
static_assert(lane_pairs_fill_words(), "P^T's key slots: a lane pair's four keys make one 32-bit word");

// A lane pair's (g even and odd: lanes l, l ^ 4) P^T bytes of two query rows (rows 0, 1) as 32-bit words: the pair's
// four keys (even's kr 0, odd's kr 0, even's kr 1, odd's kr 1) sit in four consecutive key slots (key_slot). After one
// exchange the even lane stores both rows' hi words in `tile`, the odd lane both rows' lo words LoBytes on in the same
// rows (in a 128-byte swizzled row, column c + 64 is at c's address xor 64).
template <int LoBytes>
__device__ __forceinline__ void store_p_words(unsigned char* tile, int off0, int off1, int odd, unsigned short hv0,
                                              unsigned short hv1, unsigned short lv0, unsigned short lv1) {
  static_assert(LoBytes == 64, "a P^T row: its 64 keys' hi bytes, then their lo bytes");
  const u32 hv2 = hv0 | (static_cast<u32>(hv1) << 16), lv2 = lv0 | (static_cast<u32>(lv1) << 16);
  const u32 recv = __shfl_xor_sync(0xffffffffu, odd ? hv2 : lv2, 4);
  const u32 a = odd ? recv : hv2, b = odd ? lv2 : recv;  // the even lane's bytes, the odd lane's
  const int lo = odd ? LoBytes : 0;
  *reinterpret_cast<u32*>(tile + (off0 ^ lo)) = fp8::prmt(a, b, 0x5140);  // row 0: bytes a0 b0 a1 b1
  *reinterpret_cast<u32*>(tile + (off1 ^ lo)) = fp8::prmt(a, b, 0x7362);  // row 1: bytes a2 b2 a3 b3
}

// Reductions over the lanes holding one column of the accumulator (lane % 4 fixed: xor 4, 8, 16).
__device__ __forceinline__ float col_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float col_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

// The warp's maximum of x clamped at 0, in one redux.sync: non-negative floats order as their bit patterns (negative
// values count as 0, as a maximum with 0 would take them; a NaN in one lane only is dropped by the caller's fmaxf).
__device__ __forceinline__ float warp_max_nonneg(float x) {
  const unsigned u = static_cast<unsigned>(max(static_cast<int>(__float_as_uint(x)), 0));
  return __uint_as_float(__reduce_max_sync(0xffffffffu, u));
}

// This lane's ldmatrix row in a 128-byte-swizzled fp8 slot chunk (key 32 kb + lane, 16 bytes of dims 64 par + 16 wp
// of the chunk: 16-byte unit 4 par + wp, swizzled by the row's phase lane % 8), for both 64-dim halves par.
__device__ __forceinline__ void vt_row_offsets(u32 (&off)[2], int lane, int wp) {
#pragma unroll
  for (int par = 0; par < 2; ++par) off[par] = lane * 128 + (((4 * par + wp) ^ (lane % 8)) * 16);
}

// V^T's A fragments (wgmma m64nNk32 e4m3, registers) of `Blocks` 64-dim blocks from a slot: block d is half d % 2 of
// chunk d / 2 from `chunks` (each chunk 64 keys x 128 bytes, `ChunkBytes` apart); per block two k32 blocks of keys.
// Every ldmatrix first (all in flight: one load latency), then keys `valid` and past zeroed (one branch, short tiles
// only: their slot rows are stale or another page's), then the byte permutes that put each k32 block's keys in
// key_slot order.
template <int Blocks, int ChunkBytes>
__device__ __forceinline__ void vt_fragments(u32 (&a)[Blocks][2][4], u32 chunks, const u32 (&off)[2], int valid,
                                             int i) {
#pragma unroll
  for (int d = 0; d < Blocks; ++d)
#pragma unroll
    for (int kb = 0; kb < 2; ++kb)
      sm90::ldmatrix_x4_trans(chunks + (d / 2) * ChunkBytes + kb * 32 * 128 + off[d % 2], a[d][kb]);
  if (valid < 64) {
#pragma unroll
    for (int kb = 0; kb < 2; ++kb)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int k0 = kb * 32 + 8 * jj + 2 * i;  // R[jj]: keys k0 (low half), k0 + 1 (high half)
        const u32 mask = (k0 < valid ? 0x0000ffffu : 0u) | (k0 + 1 < valid ? 0xffff0000u : 0u);
#pragma unroll
        for (int d = 0; d < Blocks; ++d) a[d][kb][jj] &= mask;
      }
  }
#pragma unroll
  for (int d = 0; d < Blocks; ++d)
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
      const u32 r0 = a[d][kb][0], r1 = a[d][kb][1], r2 = a[d][kb][2], r3 = a[d][kb][3];
      a[d][kb][0] = fp8::prmt(r0, r1, 0x6420);
      a[d][kb][1] = fp8::prmt(r0, r1, 0x7531);
      a[d][kb][2] = fp8::prmt(r2, r3, 0x6420);
      a[d][kb][3] = fp8::prmt(r2, r3, 0x7531);
    }
}

}  // namespace keys_m
}  // namespace kvforge
