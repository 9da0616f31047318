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

// Programmatic dependent launch (sm_90+): the main kernel lets the grid launched after it with the
// programmatic-serialization attribute (the combine) start early; that grid waits for the main
// kernel's completion, its memory visible, before reading what the main kernel wrote. Both are
// no-ops below sm_90 and when the dependent was launched plainly.
static __device__ __forceinline__ void kvforge_pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ void kvforge_pdl_wait_primary() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
