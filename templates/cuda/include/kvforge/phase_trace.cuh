// kvforge/phase_trace.cuh: per-CTA timestamps of a kernel's phases, for measurement only
// (bench/phase_trace.py). Compiled in by defining KVFORGE_PHASE_TRACE before the includes; otherwise
// every mark is empty and the kernel is byte-for-byte the shipped one.
//
// kvforge_phase_trace[cta * 24 + slot]: slot 0 the CTA's entry on the global timer (ns), 1 its SM,
// 2.. the SM's cycle counter at each mark (kvforge::trace::mark(slot, thread): recorded by that one
// thread; 3-13 and 16-23), 14 the cycle counter and 15 the global timer at the CTA's exit mark (trace::exit).
#pragma once

#ifdef KVFORGE_PHASE_TRACE
__device__ unsigned long long kvforge_phase_trace[8192 * 24];  // [kMaxCTAs][kSlots]
namespace kvforge {
namespace trace {
constexpr int kSlots = 24;
constexpr int kMaxCTAs = 8192;
__device__ __forceinline__ unsigned long long* row() {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return cta < kMaxCTAs ? kvforge_phase_trace + cta * kSlots : nullptr;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void entry() {
  if (threadIdx.x != 0) return;
  unsigned long long* r = row();
  if (r == nullptr) return;
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  r[0] = global_ns();
  r[1] = smid;
  r[2] = clock64();
}
__device__ __forceinline__ void mark(int slot, unsigned thread) {
  if (threadIdx.x != thread) return;
  unsigned long long* r = row();
  if (r != nullptr) r[slot] = clock64();
}
__device__ __forceinline__ void exit(unsigned thread) {
  if (threadIdx.x != thread) return;
  unsigned long long* r = row();
  if (r == nullptr) return;
  r[14] = clock64();
  r[15] = global_ns();
}
}  // namespace trace
}  // namespace kvforge
#define KVFORGE_TRACE_ENTRY() kvforge::trace::entry()
#define KVFORGE_TRACE(slot, thread) kvforge::trace::mark(slot, thread)
#define KVFORGE_TRACE_EXIT(thread) kvforge::trace::exit(thread)
#else
#define KVFORGE_TRACE_ENTRY() ((void)0)
#define KVFORGE_TRACE(slot, thread) ((void)0)
#define KVFORGE_TRACE_EXIT(thread) ((void)0)
#endif
