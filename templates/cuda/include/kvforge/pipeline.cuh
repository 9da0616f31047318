// kvforge/pipeline.cuh: the mbarrier KV pipeline shared by every kvforge CUDA kernel.
//
// A ring of kNumKVStages slots, each cut into kNumQKStages sub-stages (so kNumKVStages *
// kNumQKStages barrier pairs). Barrier layout in shared memory: all full barriers, then all
// empty barriers. full[s] counts kFullArrivals producer arrivals (plus transaction bytes when a
// bulk copy fills the slot); empty[s] counts kEmptyArrivals consumer arrivals. PipelineState
// walks the kv stages: past the last one the index wraps and the phase flips. Producers start at
// phase 1, so their first acquire of each fresh slot passes at once.
//
// Define KVFORGE_DEBUG_BARRIERS to bound every wait: a wait that spins past
// KVFORGE_BARRIER_TIMEOUT_CYCLES prints the barrier, slot and phase, then traps.
#pragma once

// sm_90 features (expect-tx, try_wait, bulk copies). nvcc's host pass parses kernel bodies too, so
// it must see the declarations; only device passes for older arches leave them out.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define KVFORGE_HAS_TMA 1
#else
#define KVFORGE_HAS_TMA 0
#endif

namespace kvforge {

using u32 = unsigned int;
using u64 = unsigned long long;

#ifndef KVFORGE_BARRIER_TIMEOUT_CYCLES
#define KVFORGE_BARRIER_TIMEOUT_CYCLES (1ull << 33)
#endif

__device__ __forceinline__ u32 smem_u32(const void* ptr) {
  return static_cast<u32>(__cvta_generic_to_shared(ptr));
}

// ---- raw mbarrier operations --------------------------------------------------------------
struct MBarrier {
  static __device__ __forceinline__ void init(u64* bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
  }

  // Makes the initialised barriers visible to the other threads and to the async proxy.
  static __device__ __forceinline__ void fence_init() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    __threadfence_block();
  }

  // Returns the barrier state token (callers may ignore it).
  static __device__ __forceinline__ u64 arrive(u64* bar) {
    u64 state;
    asm volatile("mbarrier.arrive.shared.b64 %0, [%1];" : "=l"(state) : "r"(smem_u32(bar)) : "memory");
    return state;
  }

#if KVFORGE_HAS_TMA
  static __device__ __forceinline__ void arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
  }
#endif

  static __device__ __forceinline__ bool test_parity(u64* bar, u32 phase) {
    u32 done;
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(smem_u32(bar)), "r"(phase) : "memory");
#else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(smem_u32(bar)), "r"(phase) : "memory");
#endif
    return done != 0;
  }

  // The debug build's bound on a wait begun at `start` (debug_start()): past it, print the barrier, slot and
  // phase, then trap. Both are no-ops in other builds.
  static __device__ __forceinline__ u64 debug_start() {
#ifdef KVFORGE_DEBUG_BARRIERS
    return clock64();
#else
    return 0;
#endif
  }
  static __device__ __forceinline__ void trap_if_timed_out(u64 start, const char* what, int slot, u32 phase) {
#ifdef KVFORGE_DEBUG_BARRIERS
    if (clock64() - start > KVFORGE_BARRIER_TIMEOUT_CYCLES) {
      printf("kvforge: %s barrier of slot %d timed out at phase %u (block %d, thread %d)\n", what, slot, phase,
             blockIdx.x, threadIdx.x);
      __trap();
    }
#else
    (void)start;
    (void)what;
    (void)slot;
    (void)phase;
#endif
  }

  // Waits until the phase with parity `phase` of `bar` has completed.
  static __device__ __forceinline__ void wait(u64* bar, u32 phase, const char* what, int slot) {
    const u64 start = debug_start();
    while (!test_parity(bar, phase)) trap_if_timed_out(start, what, slot, phase);
  }
};

// ---- bulk copy global -> shared completing on an mbarrier (sm_90+) ------------------------
#if KVFORGE_HAS_TMA
__device__ __forceinline__ void bulk_copy_g2s(void* smem_dst, const void* gmem_src, u32 bytes, u64* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(smem_dst)),
      "l"(gmem_src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
#endif

// ---- pipeline state -------------------------------------------------------------------------
template <int kNumKVStages>
struct PipelineState {
  int index;
  u32 phase;

  __device__ __forceinline__ void advance() {
    if (++index == kNumKVStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// ---- the ring and its two roles ---------------------------------------------------------------
template <int kNumKVStages_, int kNumQKStages_, int kFullArrivals_, int kEmptyArrivals_>
struct KVRing {
  static constexpr int kNumKVStages = kNumKVStages_;
  static constexpr int kNumQKStages = kNumQKStages_;
  static constexpr int kNumSlots = kNumKVStages * kNumQKStages;
  static constexpr int kFullArrivals = kFullArrivals_;
  static constexpr int kEmptyArrivals = kEmptyArrivals_;

  u64* bars;  // kNumSlots full barriers, then kNumSlots empty barriers

  __device__ __forceinline__ u64* full(int slot) const { return bars + slot; }
  __device__ __forceinline__ u64* empty(int slot) const { return bars + kNumSlots + slot; }
  static __device__ __forceinline__ int slot(int index, int sub) { return index * kNumQKStages + sub; }

  // One thread initialises every barrier; the whole block must sync before first use.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < kNumSlots; ++s) {
      MBarrier::init(full(s), kFullArrivals);
      MBarrier::init(empty(s), kEmptyArrivals);
    }
    MBarrier::fence_init();
  }
};

template <class Ring>
struct PipelineProducer {
  Ring ring;
  PipelineState<Ring::kNumKVStages> state{0, 1u};

  __device__ __forceinline__ int index() const { return state.index; }
  __device__ __forceinline__ int slot(int sub = 0) const { return Ring::slot(state.index, sub); }

  // Waits until the consumers have released this sub-stage's slot.
  __device__ __forceinline__ void producer_acquire(int sub = 0) const {
    MBarrier::wait(ring.empty(slot(sub)), state.phase, "empty", slot(sub));
  }
  // Whether the consumers have released this sub-stage's slot (producer_acquire without the wait).
  __device__ __forceinline__ bool producer_try_acquire(int sub = 0) const {
    return MBarrier::test_parity(ring.empty(slot(sub)), state.phase);
  }
  // Plain fill: the calling warp's stores are done; its elected lane arrives once.
  __device__ __forceinline__ void producer_commit(int sub = 0) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) MBarrier::arrive(ring.full(slot(sub)));
  }
  // Fill by plain stores from every calling thread: each arrives once after its own stores (the
  // full barrier counts one arrival per producing thread; the arrive releases, the wait acquires).
  __device__ __forceinline__ void producer_commit_all(int sub = 0) const { MBarrier::arrive(ring.full(slot(sub))); }
  // cp.async fill (sm_80+), called by every producer lane after issuing its cp.async copies:
  // the barrier gets this lane's arrival once all of them have landed (full counts 32 per warp).
  __device__ __forceinline__ void producer_commit_cp_async(int sub = 0) const {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_u32(ring.full(slot(sub))))
                 : "memory");
  }
#if KVFORGE_HAS_TMA
  // Bulk fill, called by one thread: arrive once announcing `bytes` of transactions, then the
  // copies issued against the returned barrier complete the phase.
  __device__ __forceinline__ u64* producer_commit_expect_tx(u32 bytes, int sub = 0) const {
    u64* bar = ring.full(slot(sub));
    MBarrier::arrive_expect_tx(bar, bytes);
    return bar;
  }
#endif
  __device__ __forceinline__ void advance() { state.advance(); }
};

template <class Ring>
struct PipelineConsumer {
  Ring ring;
  PipelineState<Ring::kNumKVStages> state{0, 0u};

  __device__ __forceinline__ int index() const { return state.index; }
  __device__ __forceinline__ int slot(int sub = 0) const { return Ring::slot(state.index, sub); }

  // Waits until the producers have filled this sub-stage's slot.
  __device__ __forceinline__ void consumer_wait(int sub = 0) const {
    MBarrier::wait(ring.full(slot(sub)), state.phase, "full", slot(sub));
  }
  // The calling warp is done reading the slot; its elected lane arrives once.
  __device__ __forceinline__ void consumer_release(int sub = 0) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) MBarrier::arrive(ring.empty(slot(sub)));
  }
  // Every calling thread arrives (empty barrier counts one arrival per thread).
  __device__ __forceinline__ void release_all(int sub = 0) const { MBarrier::arrive(ring.empty(slot(sub))); }
  __device__ __forceinline__ void advance() { state.advance(); }
};

// ---- a one-way hand-off between two thread groups ----------------------------------------------
// Round r: every thread of the giving group arrives once after its shared-memory stores (release;
// the barrier counts the group's threads), the taking group waits for the phase of parity r & 1
// (acquire). The schedule using it must keep the giver at most one round ahead of the taker (it
// may not give round r + 1 before the taker has taken round r), so a phase is never skipped.
struct Handoff {
  u64* bar;

  // One thread initialises; the whole block must sync before first use.
  __device__ __forceinline__ void init(u32 givers) const { MBarrier::init(bar, givers); }
  __device__ __forceinline__ void give() const { MBarrier::arrive(bar); }
  __device__ __forceinline__ void take(int round) const {
    MBarrier::wait(bar, static_cast<u32>(round) & 1u, "handoff", round);
  }
};

}  // namespace kvforge
