// kvforge/sm80_fp8_frag.cuh: mma.sync m16n8k16 fragments read straight from fp8 (e4m3) tiles in
// shared memory and dequantized in registers: no 16-bit tile in between, no convert warps.
//
// The k-permutation. In the PTX layout thread t = lane % 4 holds k = 2t, 2t+1 (b0) and 2t+8, 2t+9
// (b1) of a k16 step. Here those four logical k are the physical indices 4t .. 4t+3, so each
// thread's four values of one B column are contiguous; a product over k is unchanged when A uses
// the same permutation, which `load_a_k4` applies to a row-major 16-bit tile (Q or P).
// - K^T (QK's B, `load_kt8_e4m3`): key n = g's depths 4t .. 4t+3 are one 32-bit word of its row.
// - V (PV's B, `load_v32_e4m3`): keys 4t .. 4t+3 of a column are four rows. A thread reads four
//   32-bit words (four columns of each of its four keys), and byte permutes pair each column's
//   keys, so one load feeds four n8 tiles of a 32-column group: tile j's column n = g is physical
//   column 4g + j. Its accumulator's columns 2t, 2t+1 are then physical 8t + j and 8t + 4 + j:
//   each thread owns 8 consecutive output columns per group (`o_cols_e4m3`).
// fp8 rows are stored with their 16-byte chunks XOR-swizzled (chunk c of row r at c ^ f(r), f
// packed for r % 16 in 3-bit fields of kSwizzle, computed by codegen: `Fp8SwizzledRows`) so both
// reads are free of bank conflicts. Tiles a TMA filled (`Swizzle128Tile<rows, 1>`: f(r) = r % 8 in
// 128-byte column chunks) keep V's keys in the PTX order instead (thread t: keys 2t, 2t+1, 2t+8,
// 2t+9, `kNaturalKeys`), the order in which that swizzle's four rows of a read land apart; P is then
// an ordinary A fragment. e4m3 -> fp16 is exact (cvt.rn.f16x2.e4m3x2), so QK runs in fp16; PV too, or,
// with block scales, in bf16 on V moved bit-wise into bf16 as value x 2^-120 (`e4m3x2_to_bf16x2_raw`;
// the caller folds 2^120 into P and the output).
#pragma once

#include "kvforge/fp8_convert.cuh"
#include "kvforge/sm80_tile.cuh"

namespace kvforge {
namespace sm80 {

// The swizzled chunk position of chunk `c` in row `row`.
template <unsigned long long kSwizzle>
__device__ __forceinline__ int fp8_chunk(int row, int c) {
  return c ^ static_cast<int>((kSwizzle >> (3 * (row & 15))) & 7ull);
}

// A (16 x 16 of a row-major 16-bit tile, `stride` bytes per row) at (row0, k0), k-permuted: two
// 8-byte reads per thread instead of ldmatrix.
__device__ __forceinline__ FragA load_a_k4(const unsigned char* tile, int stride, int row0, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint2 lo = *reinterpret_cast<const uint2*>(tile + (row0 + g) * stride + (k0 + 4 * t) * 2);
  const uint2 hi = *reinterpret_cast<const uint2*>(tile + (row0 + g + 8) * stride + (k0 + 4 * t) * 2);
  FragA a;
  a.r[0] = lo.x;
  a.r[1] = hi.x;
  a.r[2] = lo.y;
  a.r[3] = hi.y;
  return a;
}

// An fp8 tile of rows kStride bytes apart, chunk c of row r stored at c ^ f(r) (kSwizzle).
template <int kStride, unsigned long long kSwizzle>
struct Fp8SwizzledRows {
  const unsigned char* base;
  // 16-byte unit (chunk) u of row `row`
  __device__ __forceinline__ const unsigned char* unit_at(int row, int u) const {
    return base + row * kStride + fp8_chunk<kSwizzle>(row, u) * 16;
  }
};

// K^T fragment of one n8 tile (keys n0..n0+7, depths k0..k0+15, k-permuted) from an fp8 K tile
// (Fp8SwizzledRows or Swizzle128Tile<rows, 1>).
template <class Tile>
__device__ __forceinline__ FragKt8 load_kt8_e4m3(const Tile& tile, int n0, int k0) {
  const int lane = threadIdx.x & 31, key = n0 + (lane >> 2);
  const u32 w = *reinterpret_cast<const u32*>(tile.unit_at(key, k0 >> 4) + 4 * (lane & 3));
  FragKt8 b;
  b.r[0] = fp8::e4m3x2_to_f16x2(w);
  b.r[1] = fp8::e4m3x2_to_f16x2(w >> 16);
  return b;
}

// Two bf16 values -> fp16x2 (through fp32, rounded to nearest; fp16's range).
__device__ __forceinline__ u32 bf16x2_to_f16x2(u32 w) {
  const __half2 h = __floats2half2_rn(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  return *reinterpret_cast<const u32*>(&h);
}

// K^T fragment of one n8 tile (keys n0..n0+7, four depths per thread k-permuted) from bf16 values at
// byte `byte0` of each row of an unswizzled fp8 tile (the packed MLA token's rope), as fp16 for the
// fp16 QK (the convert stage's rope conversion, kvforge/fp8_convert.cuh, rounds the same way).
template <class Tile>
__device__ __forceinline__ FragKt8 load_kt8_bf16_as_f16(const Tile& tile, int n0, int byte0) {
  const int lane = threadIdx.x & 31, key = n0 + (lane >> 2);
  const uint2 w = *reinterpret_cast<const uint2*>(tile.unit_at(key, 0) + byte0 + 8 * (lane & 3));
  FragKt8 b;
  b.r[0] = bf16x2_to_f16x2(w.x);
  b.r[1] = bf16x2_to_f16x2(w.y);
  return b;
}

// Two e4m3 values (bytes kLo and kLo + 1 of `w`) -> bf16x2 holding value x 2^-120, by bit moves only
// (no conversion unit): sign to bit 15, exponent and mantissa (bits 6..0) to bits 10..4. Exact for
// every normal e4m3 value (bf16 exponent field = e4m3's, >= 1); e4m3 subnormals (below 2^-6 of the
// block scale) become bf16 subnormals, which the tensor cores may flush.
constexpr float kRawBf16Scale = 0x1p-120f;
// Callers fold the 2^120 back: P x kRawBf16PBias (P <= 1 times a scale stays far below bf16's max)
// and the output x kRawBf16OutBias (the fp32 accumulator holds P V x 2^-20, far above its min).
constexpr float kRawBf16PBias = 0x1p100f, kRawBf16OutBias = 0x1p20f;
static_assert(kRawBf16PBias * kRawBf16OutBias * kRawBf16Scale == 1.f, "the bias is folded back exactly");
template <int kLo>
__device__ __forceinline__ u32 e4m3x2_to_bf16x2_raw(u32 w) {
  const u32 y = __byte_perm(w, 0u, kLo == 0 ? 0x1404 : 0x3424);  // byte kLo -> bits 15..8, kLo + 1 -> 31..24
  return (y & 0x80008000u) | ((y >> 4) & 0x07F007F0u);
}

// Two e4m3 values (bytes kLo, kLo + 1 of `w`) as the PV MMA's input type: fp16 (exact), or bf16 x 2^-120.
template <class TV, int kLo>
__device__ __forceinline__ u32 e4m3x2_to(u32 w) {
  if constexpr (fp8::IsBf16<TV>::value) {
    return e4m3x2_to_bf16x2_raw<kLo>(w);
  } else {
    return fp8::e4m3x2_to_f16x2(kLo == 0 ? w : w >> 16);
  }
}

// V fragments of the four n8 tiles of columns c0..c0+31 (c0 a multiple of 32) for keys k0..k0+15
// from an fp8 V tile, as TV (fp16, or bf16 x 2^-120): b[j] feeds tile j (column n = g is physical
// column c0 + 4g + j). Keys k-permuted (thread t: 4t..4t+3), or with kNaturalKeys in the PTX order
// (2t, 2t+1 in b[j][0], 2t+8, 2t+9 in b[j][1]).
template <bool kNaturalKeys, class TV, class Tile>
__device__ __forceinline__ void load_v32_e4m3(u32 (&b)[4][2], const Tile& tile, int k0, int c0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int chunk = (c0 >> 4) + (g >> 2), byte = 4 * (g & 3);
  u32 w[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = kNaturalKeys ? k0 + 2 * t + (r & 1) + 8 * (r >> 1) : k0 + 4 * t + r;
    w[r] = *reinterpret_cast<const u32*>(tile.unit_at(row, chunk) + byte);
  }
  // (key 4t, key 4t+1) of columns 0,1 | 2,3, then (4t+2, 4t+3): byte j of each word is column j
  // (natural order: keys 2t, 2t+1, then 2t+8, 2t+9)
  const u32 k01_c01 = __byte_perm(w[0], w[1], 0x5140), k01_c23 = __byte_perm(w[0], w[1], 0x7362);
  const u32 k23_c01 = __byte_perm(w[2], w[3], 0x5140), k23_c23 = __byte_perm(w[2], w[3], 0x7362);
  b[0][0] = e4m3x2_to<TV, 0>(k01_c01);
  b[1][0] = e4m3x2_to<TV, 2>(k01_c01);
  b[2][0] = e4m3x2_to<TV, 0>(k01_c23);
  b[3][0] = e4m3x2_to<TV, 2>(k01_c23);
  b[0][1] = e4m3x2_to<TV, 0>(k23_c01);
  b[1][1] = e4m3x2_to<TV, 2>(k23_c01);
  b[2][1] = e4m3x2_to<TV, 0>(k23_c23);
  b[3][1] = e4m3x2_to<TV, 2>(k23_c23);
}

// The output columns a thread owns in a 32-column group after load_v32_e4m3's PV: tile j's
// accumulator elements (e = 0, 1 per row) are physical columns 8t + j + 4e; this gathers one row's
// eight values (h = 0: row g, h = 1: row g + 8), consecutive from column 8t.
__device__ __forceinline__ void o_cols_e4m3(float (&v)[8], const float (*o)[4], int h) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = o[j][2 * h];
    v[4 + j] = o[j][2 * h + 1];
  }
}

}  // namespace sm80
}  // namespace kvforge
