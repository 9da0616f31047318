// kvforge/cdna_prelude.h: the little of HIP the CDNA kernels use, written with clang builtins so the
// same source compiles with hiprtc (which brings the HIP headers), hipcc, and plain clang with
// -nogpuinc -nogpulib (no ROCm device libraries: gfx942 has none in ROCm 5.2).
#pragma once

#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif

namespace kvforge {
namespace cdna {

typedef unsigned short u16;
typedef short short4_t __attribute__((ext_vector_type(4)));
typedef _Float16 half4_t __attribute__((ext_vector_type(4)));
typedef float float4_t __attribute__((ext_vector_type(4)));
typedef float float16_t __attribute__((ext_vector_type(16)));
typedef unsigned int uint4_t __attribute__((ext_vector_type(4)));
typedef unsigned int uint2_t __attribute__((ext_vector_type(2)));

__device__ inline int thread_id() { return __builtin_amdgcn_workitem_id_x(); }
__device__ inline int block_x() { return __builtin_amdgcn_workgroup_id_x(); }
__device__ inline int block_y() { return __builtin_amdgcn_workgroup_id_y(); }
__device__ inline int block_z() { return __builtin_amdgcn_workgroup_id_z(); }
__device__ inline int lane_id() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }

// Workgroup barrier that also orders LDS traffic (release before, acquire after).
__device__ inline void barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// Atomically moves *p from 0 to `code`; returns the previous value (0 when this call won).
__device__ inline int kvforge_claim(int* p, int code) {
  int expected = 0;
  __atomic_compare_exchange_n(p, &expected, code, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
__device__ inline int thread_index() { return thread_id(); }
// Block-wide OR through one LDS word (a region of the kernel's layout); every thread of the
// workgroup must call it.
__device__ inline bool kvforge_block_any(bool pred, int* flag) {
  if (thread_id() == 0) *flag = 0;
  barrier();
  if (pred) *flag = 1;
  barrier();
  const bool any = *flag != 0;
  barrier();
  return any;
}

__device__ inline float xor_shuffle(float v, int mask) {
  const int src = (lane_id() ^ mask) << 2;
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src, __builtin_bit_cast(int, v)));
}

__device__ inline float neg_inf() { return -__builtin_huge_valf(); }
__device__ inline float fast_exp2(float x) { return __builtin_exp2f(x); }
__device__ inline float fast_log(float x) { return __builtin_logf(x); }
__device__ inline float fast_exp(float x) { return __builtin_exp2f(x * 1.4426950408889634f); }

// 16-bit storage <-> float. bf16 rounds to nearest even.
struct Bf16 {
  typedef short4_t vec4;
  static __device__ inline u16 from_float(float f) {
    unsigned u = __builtin_bit_cast(unsigned, f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<u16>(u >> 16);
  }
  static __device__ inline float to_float(u16 h) { return __builtin_bit_cast(float, static_cast<unsigned>(h) << 16); }
};
struct Fp16 {
  typedef half4_t vec4;
  static __device__ inline u16 from_float(float f) { return __builtin_bit_cast(u16, static_cast<_Float16>(f)); }
  static __device__ inline float to_float(u16 h) { return static_cast<float>(__builtin_bit_cast(_Float16, h)); }
};

// MFMA with fp32 accumulation: (type, M x N x K) -> the builtin.
template <class T, int M>
struct Mfma;
template <>
struct Mfma<Bf16, 16> {
  typedef float4_t acc;
  static __device__ inline acc run(short4_t a, short4_t b, acc c) {
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
  }
};
template <>
struct Mfma<Bf16, 32> {
  typedef float16_t acc;
  static __device__ inline acc run(short4_t a, short4_t b, acc c) {
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, c, 0, 0, 0);
  }
};
template <>
struct Mfma<Fp16, 16> {
  typedef float4_t acc;
  static __device__ inline acc run(half4_t a, half4_t b, acc c) {
    return __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, 0, 0, 0);
  }
};
template <>
struct Mfma<Fp16, 32> {
  typedef float16_t acc;
  static __device__ inline acc run(half4_t a, half4_t b, acc c) {
    return __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, 0, 0, 0);
  }
};

}  // namespace cdna
}  // namespace kvforge
