// kvforge/device_prelude.cuh: the few block-level primitives the shared decode-template macros
// (templates/common/decode_guard.j2) call, for CUDA. cdna_prelude.h defines the same for HIP.
#pragma once

// Atomically moves *p from 0 to `code`; returns the previous value (0 when this call won).
static __device__ __forceinline__ int kvforge_claim(int* p, int code) { return atomicCAS(p, 0, code); }
// Block-wide OR; every thread of the block must call it (no shared word needed on CUDA).
static __device__ __forceinline__ bool kvforge_block_any(bool pred, int* /*shared_word*/) {
  return __syncthreads_or(pred) != 0;
}
static __device__ __forceinline__ int thread_index() { return static_cast<int>(threadIdx.x); }
