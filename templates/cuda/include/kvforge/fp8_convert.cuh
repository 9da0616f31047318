// kvforge/fp8_convert.cuh: FP8 (OCP e4m3fn) KV dequantization for the load-and-convert stage.
//
// Both backends' convert stages call `token16_to` (sixteen values of a cached token in any of the
// three layouts) and, for per-tensor scales with bf16 queries, `q_to_fp16` (the query tile in
// shared memory rescaled into fp16 in place).
//
// Eight e4m3 values (one 8-byte word, element 0 in the lowest byte) become eight 16-bit MMA
// inputs (one 16-byte word, element 0 first): cvt.rn.f16x2.e4m3x2 (sm_89+, exact: every e4m3 value
// is an fp16 normal or zero), then, for bf16 or a scale, through fp32 (also exact for bf16 without
// a scale; with a scale the product is rounded once, to nearest). Callers keep the scale at 1 when
// a per-tensor scale is folded elsewhere (into the softmax scale and the output).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kvforge {
namespace fp8 {

using u32 = unsigned int;

template <class T>
struct IsBf16 {
  static constexpr bool value = false;
};
template <>
struct IsBf16<__nv_bfloat16> {
  static constexpr bool value = true;
};

// Two e4m3 values (low byte = element 0) -> fp16x2 (low half = element 0).
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 two) {
  u32 out;
  const unsigned short in = static_cast<unsigned short>(two & 0xffffu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(in));
  return out;
}

// fp16x2 (low half = element 0) -> two e4m3 values (element 0 in the low byte), rounded to nearest, saturated.
__device__ __forceinline__ unsigned short f16x2_e4m3(u32 two) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(d) : "r"(two));
  return d;
}

// Two floats -> two e4m3 values (`lo` in the low byte), rounded to nearest, saturated to +-448.
__device__ __forceinline__ unsigned short f32x2_e4m3(float lo, float hi) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}
// Two e4m3 values (low byte = element 0) -> two floats (exact).
__device__ __forceinline__ float2 e4m3x2_f32(unsigned short two) {
  const u32 h = e4m3x2_to_f16x2(two);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}
// Bytes of {a, b} (a's bytes 0-3, b's 4-7) picked by the four nibbles of `sel`, lowest first.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

template <class T>
__device__ __forceinline__ u32 pack2(float lo, float hi);
template <>
__device__ __forceinline__ u32 pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const u32*>(&v);
}
template <>
__device__ __forceinline__ u32 pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const u32*>(&v);
}

// fp16x2 -> T x2, times `scale` when kScaled (fp16 without a scale passes through).
template <class T, bool kScaled>
__device__ __forceinline__ u32 from_f16x2(u32 h, float scale) {
  if constexpr (!kScaled && !IsBf16<T>::value) {
    return h;
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    return kScaled ? pack2<T>(f.x * scale, f.y * scale) : pack2<T>(f.x, f.y);
  }
}

// Eight e4m3 values -> eight T (times `scale` when kScaled).
template <class T, bool kScaled>
__device__ __forceinline__ uint4 e4m3x8_to(uint2 raw, float scale) {
  uint4 out;
  out.x = from_f16x2<T, kScaled>(e4m3x2_to_f16x2(raw.x), scale);
  out.y = from_f16x2<T, kScaled>(e4m3x2_to_f16x2(raw.x >> 16), scale);
  out.z = from_f16x2<T, kScaled>(e4m3x2_to_f16x2(raw.y), scale);
  out.w = from_f16x2<T, kScaled>(e4m3x2_to_f16x2(raw.y >> 16), scale);
  return out;
}

// Eight bf16 values -> eight T (DeepSeek's packed MLA token keeps its rope in bf16).
template <class T>
__device__ __forceinline__ uint4 bf16x8_to(uint4 raw) {
  if constexpr (IsBf16<T>::value) {
    return raw;
  } else {
    u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      w[i] = pack2<T>(f.x, f.y);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The cache layouts a convert stage reads.
enum class Layout { kPerTensor, kBlock, kPackedMLA };

// The bytes behind sixteen values of one cached token from column `col` (a multiple of 16): `raw` =
// 16 e4m3 bytes, or for kPackedMLA's rope (kRope: col >= kPackedLatent) 8 bf16 values in `raw` and 8
// in `raw2`; `scale` = the value's fp32 scale (kBlock: block_scales[col / kScaleBlock]; kPackedMLA:
// the token's own; kPerTensor: 1, folded elsewhere). kGlobal: `token` is in global memory and
// read-only for the kernel's lifetime (non-coherent loads).
template <Layout kLayout, int kScaleBlock, int kPackedLatent, bool kRope, bool kGlobal = false>
__device__ __forceinline__ void load16_raw(const unsigned char* token, const float* block_scales, int col, uint4& raw,
                                           uint4& raw2, float& scale) {
  static_assert(kScaleBlock % 16 == 0 && kPackedLatent % kScaleBlock == 0, "16-value groups and scale blocks");
  static_assert(!kRope || kLayout == Layout::kPackedMLA, "only the packed MLA token keeps a bf16 rope");
  const auto ld16 = [](const void* p) {
    if constexpr (kGlobal) return __ldg(reinterpret_cast<const uint4*>(p));
    else return *reinterpret_cast<const uint4*>(p);
  };
  const auto ld4 = [](const float* p) {
    if constexpr (kGlobal) return __ldg(p);
    else return *p;
  };
  if constexpr (kRope) {
    const unsigned char* rope = token + kPackedLatent + 4 * (kPackedLatent / kScaleBlock) + (col - kPackedLatent) * 2;
    raw = ld16(rope);
    raw2 = ld16(rope + 16);
    scale = 1.f;
  } else if constexpr (kLayout == Layout::kPackedMLA) {
    raw = ld16(token + col);
    scale = ld4(reinterpret_cast<const float*>(token + kPackedLatent) + col / kScaleBlock);
  } else {
    raw = ld16(token + col);
    scale = kLayout == Layout::kBlock ? ld4(block_scales + col / kScaleBlock) : 1.f;
  }
}

// load16_raw's bytes as sixteen MMA inputs T in two 16-byte words (lo: values 0..7, hi: 8..15):
// e4m3 values times `scale` (kPerTensor: unscaled), or the packed token's bf16 rope converted to T.
template <class T, Layout kLayout, bool kRope>
__device__ __forceinline__ void raw16_to(const uint4& raw, const uint4& raw2, float scale, uint4& lo, uint4& hi) {
  if constexpr (kRope) {
    lo = bf16x8_to<T>(raw);
    hi = bf16x8_to<T>(raw2);
  } else {
    constexpr bool kScaled = kLayout != Layout::kPerTensor;
    lo = e4m3x8_to<T, kScaled>(make_uint2(raw.x, raw.y), scale);
    hi = e4m3x8_to<T, kScaled>(make_uint2(raw.z, raw.w), scale);
  }
}

// Sixteen values of one cached token from column `col` (a multiple of 16) as MMA inputs T, in two
// 16-byte words. kPerTensor: e4m3 values, the scale folded elsewhere; kBlock: e4m3 values times
// block_scales[col / kScaleBlock] (fp32); kPackedMLA: DeepSeek's 656-byte token (kPackedLatent e4m3
// latent values, one fp32 scale per kScaleBlock of them, then the rope in bf16). kScaleBlock is a
// multiple of 16, so a group never straddles two scales.
template <class T, Layout kLayout, int kScaleBlock, int kPackedLatent>
__device__ __forceinline__ void token16_to(const unsigned char* token, const float* block_scales, int col, uint4& lo,
                                           uint4& hi) {
  uint4 raw, raw2 = make_uint4(0u, 0u, 0u, 0u);
  float scale;
  if constexpr (kLayout == Layout::kPackedMLA) {
    if (col >= kPackedLatent) {
      load16_raw<kLayout, kScaleBlock, kPackedLatent, true>(token, block_scales, col, raw, raw2, scale);
      raw16_to<T, kLayout, true>(raw, raw2, scale, lo, hi);
      return;
    }
  }
  load16_raw<kLayout, kScaleBlock, kPackedLatent, false>(token, block_scales, col, raw, raw2, scale);
  raw16_to<T, kLayout, false>(raw, raw2, scale, lo, hi);
}

// bf16 queries for fp16 MMAs (per-tensor scales): the bf16 words of a query tile in shared memory
// (`rows` rows of `row_words` 32-bit words, `row_stride` bytes apart; any swizzle, the conversion is
// element-wise) become fp16 times 2^e in place, e chosen so the largest |q| lands in [2^14, 2^15)
// (exact for every value fp16 holds as a normal; what falls below is under 2^-28 of the largest).
// Threads tid = 0..nthreads-1 call it together; `sync()` is a barrier over exactly them and
// `scratch` one float of shared memory free meanwhile. Returns 2^-e, the factor S must be scaled by.
template <class Sync>
__device__ __forceinline__ float q_to_fp16(unsigned char* q_smem, int rows, int row_stride, int row_words, int tid,
                                           int nthreads, float* scratch, Sync sync) {
  float amax = 0.f;
  for (int i = tid; i < rows * row_words; i += nthreads) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
        q_smem + (i / row_words) * row_stride + (i % row_words) * 4));
    amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  if (tid == 0) *scratch = 0.f;
  sync();
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (tid % 32 == 0) atomicMax(reinterpret_cast<int*>(scratch), __float_as_int(amax));  // >= 0: int order
  sync();
  const float top = *scratch;
  int e = 0;
  if (top > 0.f && top < 3.0e38f) {
    int ex;
    frexpf(top, &ex);  // top = m * 2^ex, m in [0.5, 1)
    e = min(max(15 - ex, -100), 100);
  }
  const float up = ldexpf(1.f, e);
  for (int i = tid; i < rows * row_words; i += nthreads) {
    u32* w = reinterpret_cast<u32*>(q_smem + (i / row_words) * row_stride + (i % row_words) * 4);
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(w));
    const __half2 h = __floats2half2_rn(f.x * up, f.y * up);
    *w = *reinterpret_cast<const u32*>(&h);
  }
  sync();  // also: scratch is free again
  return ldexpf(1.f, -e);
}

}  // namespace fp8
}  // namespace kvforge
