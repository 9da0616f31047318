// kvforge/sm80_tile.cuh: the warp-level tile primitives of the sm80 backend.
//
// mma.sync m16n8k16 (bf16 or fp16 in, fp32 accumulate), ldmatrix fragments from padded
// shared-memory tiles, and cp.async 16-byte copies with zero fill. Fragment layouts follow the
// PTX ISA (g = lane / 4, t = lane % 4): A holds rows g and g+8, columns 2t.. and 2t+8..; B holds
// k rows 2t.. and 2t+8.. of column g; C holds rows g and g+8, columns 2t and 2t+1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kvforge {
namespace sm80 {

using u32 = unsigned int;

__device__ __forceinline__ u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// 16-byte global -> shared copy; `valid == false` writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// 4-byte global -> shared copy (fp8 block scales beside their row); zero fill as above.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}
// N-byte (4, 8 or 16) global -> shared copy; zero fill as above.
template <int N>
__device__ __forceinline__ void cp_async_n(void* smem, const void* gmem, bool valid) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (N == 16) {
    cp_async_16(smem, gmem, valid);
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(smem_addr(smem)), "l"(gmem), "n"(N),
                 "r"(valid ? N : 0));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
}

template <class T>
struct MmaType;
template <>
struct MmaType<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ float2 unpack(u32 w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  }
  static __device__ __forceinline__ float4 unpack4(uint2 w) {  // four values (8 bytes) as fp32
    const float2 lo = unpack(w.x), hi = unpack(w.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
};
template <>
struct MmaType<__half> {
  static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float2 unpack(u32 w) { return __half22float2(*reinterpret_cast<__half2*>(&w)); }
  static __device__ __forceinline__ float4 unpack4(uint2 w) {  // four values (8 bytes) as fp32
    const float2 lo = unpack(w.x), hi = unpack(w.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
};

// ---- fragments typed by role --------------------------------------------------------------
// QK multiplies an A fragment (Q) by K^T fragments; PV multiplies an A fragment (P) by V
// fragments. The loaders return distinct types and qk_mma / pv_mma accept only their own, so
// feeding a V fragment to QK (or K to PV) fails to compile instead of computing garbage.
struct FragA { u32 r[4]; };    // 16 x 16 of a row-major tile (ldmatrix x4)
struct FragKt { u32 r[4]; };   // K^T for two n8 tiles: keys n0..n0+7 in r[0..1], n0+8..n0+15 in r[2..3]
struct FragKt8 { u32 r[2]; };  // K^T for one n8 tile
struct FragV { u32 r[4]; };    // V for two n8 tiles: dims n0..n0+7 in r[0..1], n0+8..n0+15 in r[2..3]

// ---- tile layouts -------------------------------------------------------------------------
// Where element (row, col) of a row-major tile lives (col the first element of a 16-byte unit).
// PaddedTile: rows `stride` bytes apart (16 bytes of padding put ldmatrix's 8 rows in distinct
// banks). Swizzle128Tile<kRows, kElemBytes>: the TMA's 128-byte-swizzle layout, the tile
// cut into 128-byte column chunks (64 16-bit or 128 fp8 columns) of kRows rows x 128 bytes, 16-byte
// unit u of row r stored at unit u ^ (r % 8) (the chunks based at 1024-byte boundaries); 8 rows of
// one unit again hit distinct banks.
struct PaddedTile {
  const unsigned char* base;
  int stride;
  __device__ __forceinline__ const unsigned char* at(int row, int col) const { return base + row * stride + col * 2; }
};
template <int kRows, int kElemBytes = 2>
struct Swizzle128Tile {
  const unsigned char* base;
  __device__ __forceinline__ const unsigned char* at(int row, int col) const {
    const int b = col * kElemBytes;
    return base + (b >> 7) * (kRows * 128) + row * 128 + ((((b >> 4) & 7) ^ (row & 7)) << 4);
  }
  // 16-byte unit u of row `row` (the fp8 register path's loaders)
  __device__ __forceinline__ const unsigned char* unit_at(int row, int u) const {
    return base + (u >> 3) * (kRows * 128) + row * 128 + (((u & 7) ^ (row & 7)) << 4);
  }
};

// A fragment (16 x 16) of a row-major tile, at (row0, col0 elements).
template <class Tile>
__device__ __forceinline__ FragA load_a(const Tile& tile, int row0, int col0) {
  const int lane = threadIdx.x & 31;
  FragA a;
  ldmatrix_x4(a.r, tile.at(row0 + (lane & 15), col0 + (lane >> 4) * 8));
  return a;
}
__device__ __forceinline__ FragA load_a(const unsigned char* tile, int stride, int row0, int col0) {
  return load_a(PaddedTile{tile, stride}, row0, col0);
}

// K^T fragments for S = A * K^T, K row-major [key][dim]: keys n0..n0+15, dims k0..k0+15.
template <class Tile>
__device__ __forceinline__ FragKt load_kt(const Tile& tile, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  FragKt b;
  ldmatrix_x4(b.r, tile.at(n0 + (lane & 7) + (lane >> 4) * 8, k0 + ((lane >> 3) & 1) * 8));
  return b;
}
__device__ __forceinline__ FragKt load_kt(const unsigned char* tile, int stride, int n0, int k0) {
  return load_kt(PaddedTile{tile, stride}, n0, k0);
}

__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(smem)));
}
// K^T fragment of one n8 tile: keys n0..n0+7, dims k0..k0+15.
template <class Tile>
__device__ __forceinline__ FragKt8 load_kt8(const Tile& tile, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  FragKt8 b;
  ldmatrix_x2(b.r, tile.at(n0 + (lane & 7), k0 + ((lane >> 3) & 1) * 8));
  return b;
}
__device__ __forceinline__ FragKt8 load_kt8(const unsigned char* tile, int stride, int n0, int k0) {
  return load_kt8(PaddedTile{tile, stride}, n0, k0);
}

// V fragments for O = P * V, V row-major [key][dim]: keys k0..k0+15, dims n0..n0+15.
template <class Tile>
__device__ __forceinline__ FragV load_v(const Tile& tile, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  FragV b;
  ldmatrix_x4_trans(b.r, tile.at(k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8));
  return b;
}
__device__ __forceinline__ FragV load_v(const unsigned char* tile, int stride, int k0, int n0) {
  return load_v(PaddedTile{tile, stride}, k0, n0);
}

// S[n8 tile pair] += Q K^T; O[n8 tile pair] += P V.
template <class T>
__device__ __forceinline__ void qk_mma(float (&s0)[4], float (&s1)[4], const FragA& q, const FragKt& k) {
  MmaType<T>::mma(s0, q.r, k.r[0], k.r[1]);
  MmaType<T>::mma(s1, q.r, k.r[2], k.r[3]);
}
template <class T>
__device__ __forceinline__ void qk_mma(float (&s)[4], const FragA& q, const FragKt8& k) {
  MmaType<T>::mma(s, q.r, k.r[0], k.r[1]);
}
template <class T>
__device__ __forceinline__ void pv_mma(float (&o0)[4], float (&o1)[4], const FragA& p, const FragV& v) {
  MmaType<T>::mma(o0, p.r, v.r[0], v.r[1]);
  MmaType<T>::mma(o1, p.r, v.r[2], v.r[3]);
}

// Named barrier over `threads` threads (ids 1.. ; 0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sm80
}  // namespace kvforge
