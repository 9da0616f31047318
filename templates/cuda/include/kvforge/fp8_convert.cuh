// kvforge/fp8_convert.cuh: FP8 (OCP e4m3fn) KV dequantization for the load-and-convert stage.
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

}  // namespace fp8
}  // namespace kvforge
