// Prototype (bench/mla_fp8_native_ab.py only; not a shipped kernel): 16-row MLA decode on per-tensor fp8
// KV with fp8 wgmma and keys as wgmma's M (swap-AB), no conversion of the cache.
//
//   S^T = K Q^T   wgmma m64n32k32 e4m3 (A = the fp8 K tile from the TMA ring, K-major; B = Q^T as two
//                 e4m3 rows per query row: hi = e4m3(c q), lo = e4m3(16 (c q - hi)), c = 400 / max|q|)
//   O^T += V^T P^T  wgmma m64n16k32 e4m3, A = V^T from registers (ldmatrix.trans + byte permutes of the
//                 same ring slot), B = P^T as two e4m3 tiles (hi = e4m3(256 p), lo = e4m3(256 p - hi)),
//                 both accumulated into one O^T.
// Math warpgroups (warps 0-3, 4-7) and one producer warp after them (TMA). Compile-time constants by #define:
// KF_PAGE (page size), KF_STAGES (ring depth, a multiple of KF_WGS), KF_HEADS (<= 16), KF_WGS (math
// warpgroups, 1 or 2, taking alternate tiles), KF_QKC (QK accumulator chains, 1 or 2). Measurement-only defines:
// KF_ABL_NO_LOADS, KF_ABL_NO_PV, KF_ABL_PV_HI_ONLY (times only, wrong outputs), KF_EAGER_RESCALE.
// The numerics: bench/proto/hilo_e4m3_error.py; the measurements: bench/RESULTS.md (thirty-second session).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kvforge/pipeline.cuh"
#include "kvforge/fp8_convert.cuh"
#include "kvforge/sm90_tile.cuh"

namespace {
using kvforge::u32;
using kvforge::u64;
namespace wg = kvforge::sm90;

constexpr int kPage = KF_PAGE;
constexpr int kStages = KF_STAGES;
constexpr int kHeads = KF_HEADS;
constexpr int kBN = 64;
constexpr int kDqk = 576, kDv = 512;
constexpr int kChunks = 5;                  // 128-byte fp8 columns per row: 4.5, the last half zero-filled
constexpr int kChunkBytes = kBN * 128;      // one chunk of a 64-key tile
constexpr int kStageBytes = kChunks * kChunkBytes;
constexpr int kBoxRows = kPage < kBN ? kPage : kBN;
constexpr int kBoxes = kBN / kBoxRows;
constexpr int kBoxBytes = kBoxRows * 128;
constexpr int kQtChunkBytes = 32 * 128;     // Q^T: 32 rows (16 hi, 16 lo) per chunk
constexpr int kOffQt = 0;
#ifndef KF_WGS
#define KF_WGS 2
#endif
#ifndef KF_QKC
#define KF_QKC 2
#endif
constexpr int kWGs = KF_WGS;                // math warpgroups, taking alternate tiles
constexpr int kQKChains = KF_QKC;           // QK accumulators (even / odd k steps)
constexpr int kMathThreads = 128 * kWGs;
constexpr int kOffPhi = kOffQt + kChunks * kQtChunkBytes;  // per warpgroup: P^T hi, then lo (2 KB each)
constexpr int kOffRed = kOffPhi + kWGs * 4096;  // per warpgroup 1 KB: float[2][4][16] tile maxima, float[4][16] sums
constexpr int kOffStats = kOffRed + kWGs * 1024;  // float[kWGs][2][16]: each warpgroup's row max and sum
constexpr int kOffQScale = kOffStats + 256;  // float[16]
constexpr int kOffKV = (kOffQScale + 64 + 1023) / 1024 * 1024;
constexpr int kOffBars = kOffKV + kStages * kStageBytes;
static_assert(kOffKV % 1024 == 0 && kOffPhi % 1024 == 0, "layout");
// A slot's full barrier is waited by parity: every tile of a slot must go to one warpgroup (else a warpgroup two
// laps ahead sees the parity of an older phase and reads a slot still being filled; 3 stages for 2 warpgroups did).
static_assert(kStages % kWGs == 0, "ring stages: a multiple of the math warpgroups");
using Ring = kvforge::KVRing<kStages, 1, 1, 4>;  // empty: the 4 warps of the tile's warpgroup

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
using kvforge::fp8::e4m3x2_f32;
using kvforge::fp8::f32x2_e4m3;
using kvforge::fp8::prmt;
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// byte offset of (row, byte col) in a 128-byte-swizzle tile of `kRowsPerChunk`-row chunks
template <int kChunk>
__device__ __forceinline__ int sw(int row, int col) {
  return (col / 128) * kChunk + row * 128 + ((((col % 128) / 16) ^ (row % 8)) * 16) + (col % 16);
}
// k slot (0..31 in a k32 block) of key kappa (0..31): the order ldmatrix.trans + prmt gives V^T's fragment
__device__ __forceinline__ int key_slot(int kappa) {
  const int half = kappa / 16, kl = kappa % 16;
  const int s = kl < 8 ? 4 * (kl / 2) + (kl % 2) : 4 * ((kl - 8) / 2) + 2 + (kl % 2);
  return 16 * half + s;
}

__device__ void producer(const Ring& ring, unsigned char* smem, const wg::TensorMap* map, const int* bt_row,
                         int num_tiles, int seqlen) {
  kvforge::PipelineProducer<Ring> pipe{ring};
  for (int t = 0; t < num_tiles; ++t) {
    const int j0 = t * kBN;
    const int count = min(kBoxes, (seqlen - j0 + kBoxRows - 1) / kBoxRows);
    int page[kBoxes];
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) page[bx] = bx < count ? bt_row[(j0 + bx * kBoxRows) / kPage] : 0;
    pipe.producer_acquire();
#ifdef KF_ABL_NO_LOADS  // measurement only: the math on whatever the slots hold
    pipe.producer_commit_expect_tx(0u);
    pipe.advance();
    continue;
#endif
    u64* full = pipe.producer_commit_expect_tx(static_cast<u32>(count * kChunks * kBoxBytes));
    unsigned char* stage = smem + kOffKV + pipe.index() * kStageBytes;
#pragma unroll
    for (int bx = 0; bx < kBoxes; ++bx) {
      if (bx >= count) break;
      for (int c = 0; c < kChunks; ++c)
        wg::tma_load_3d(stage + c * kChunkBytes + bx * kBoxBytes, map, full, c * 128, (j0 + bx * kBoxRows) % kPage,
                        page[bx]);
    }
    pipe.advance();
  }
}

__device__ __forceinline__ float quad_max(float x) {  // over the lanes of one i (xor 4, 8, 16)
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

__device__ void math(const Ring& ring, unsigned char* smem, const __nv_bfloat16* q, __nv_bfloat16* out, int b,
                     int num_tiles, int seqlen, float scale_log2, float out_scale) {
  const int mg = threadIdx.x / 128, mt = threadIdx.x % 128, w = mt / 32, lane = mt % 32, g = lane / 4, i = lane % 4;
  float* red = reinterpret_cast<float*>(smem + kOffRed + mg * 1024);
  float* stats = reinterpret_cast<float*>(smem + kOffStats);
  const int bar = 1 + mg;  // this warpgroup's named barrier; 3: both
  float* qscale = reinterpret_cast<float*>(smem + kOffQScale);
  // ---- Q^T: hi and lo e4m3 rows, per query row scaled to max |c q| = 400 (warpgroup 0) ----
  if (mg == 0) {
    const int r = mt / 8, sub = mt % 8;
    float v[72];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 9; ++j) {
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      if (r < kHeads) raw = *reinterpret_cast<const uint4*>(q + (static_cast<long long>(b) * kHeads + r) * kDqk + 64 * j + 8 * sub);
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(h2[e]);
        v[8 * j + 2 * e] = f.x;
        v[8 * j + 2 * e + 1] = f.y;
        amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    const float c = amax > 0.f ? 400.f / amax : 1.f;
    if (sub == 0) qscale[r] = 1.f / c;
#pragma unroll
    for (int j = 0; j < 9; ++j) {
      u32 hi[2], lo[2];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x0 = c * v[8 * j + 2 * e], x1 = c * v[8 * j + 2 * e + 1];
        const unsigned short h = f32x2_e4m3(x0, x1);
        const float2 hf = e4m3x2_f32(h);
        const unsigned short l = f32x2_e4m3(16.f * (x0 - hf.x), 16.f * (x1 - hf.y));
        if (e % 2 == 0) {
          hi[e / 2] = h;
          lo[e / 2] = l;
        } else {
          hi[e / 2] |= static_cast<u32>(h) << 16;
          lo[e / 2] |= static_cast<u32>(l) << 16;
        }
      }
      const int col = 64 * j + 8 * sub;
      *reinterpret_cast<uint2*>(smem + kOffQt + sw<kQtChunkBytes>(r, col)) = make_uint2(hi[0], hi[1]);
      *reinterpret_cast<uint2*>(smem + kOffQt + sw<kQtChunkBytes>(16 + r, col)) = make_uint2(lo[0], lo[1]);
    }
  }
  wg::fence_proxy_async();
  wg::named_sync(3, kMathThreads);
  // this thread's S^T columns: heads h[j][e] = 8 j + 2 i + e
  float colscale[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) colscale[j][e] = scale_log2 * qscale[8 * j + 2 * i + e];

  float o[8][8];
#pragma unroll
  for (int d = 0; d < 8; ++d)
#pragma unroll
    for (int k = 0; k < 8; ++k) o[d][k] = 0.f;
  float m[2][2], l[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m[j][e] = neg_inf();
      l[j][e] = 0.f;
    }
  const u32 qt_addr = kvforge::smem_u32(smem + kOffQt);
  unsigned char* const p_smem = smem + kOffPhi + mg * 4096;
  // loop-invariant addresses: this thread's 8 bytes of P^T (row h, key slot), and its ldmatrix row in the slot
  // (key kb * 32 + lane, 16 bytes of dims d * 64 + 16 w: chunk d / 2, 16-byte unit 4 (d % 2) + w)
  int poff[2][2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int kr = 0; kr < 2; ++kr) {
        const int kappa = 16 * w + g + 8 * kr;
        poff[j][e][kr] = sw<2048>(8 * j + 2 * i + e, 32 * (kappa / 32) + key_slot(kappa % 32));
      }
  u32 lds_off[2];
#pragma unroll
  for (int par = 0; par < 2; ++par) lds_off[par] = lane * 128 + (((4 * par + w) ^ (lane % 8)) * 16);
  const u32 phi_addr = kvforge::smem_u32(p_smem), plo_addr = phi_addr + 2048;
  for (int t = mg; t < num_tiles; t += kWGs) {
    const int valid = min(kBN, seqlen - t * kBN);
    const int slot = t % kStages;
    kvforge::MBarrier::wait(ring.full(slot), static_cast<u32>(t / kStages) & 1u, "full", slot);
    unsigned char* stage = smem + kOffKV + slot * kStageBytes;
    const u32 st_addr = kvforge::smem_u32(stage);
    float s[16], s2[16];
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqk / 32; ++kk) {
      const u64 da = wg::desc_sw128(st_addr + (kk / 4) * kChunkBytes + (kk % 4) * 32, 16, 1024);
      const u64 db = wg::desc_sw128(qt_addr + (kk / 4) * kQtChunkBytes + (kk % 4) * 32, 16, 1024);
      if (kQKChains == 1 || kk % 2 == 0) wg::wgmma_m64n32k32_e4m3(s, da, db, kk >= kQKChains);
      else wg::wgmma_m64n32k32_e4m3(s2, da, db, kk > 1);
    }
    wg::wgmma_commit();
    wg::wgmma_wait<0>();
    wg::fence_operands(s);
    if constexpr (kQKChains == 2) {
      wg::fence_operands(s2);
#pragma unroll
      for (int k = 0; k < 16; ++k) s[k] += s2[k];
    }
#pragma unroll
    for (int d = 0; d < 8; ++d) wg::fence_operands(o[d]);
    // ---- softmax over keys (rows of S^T), per query row (column) ----
    float x[2][2][2];  // [j][e][kr]
    float tmax[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int kr = 0; kr < 2; ++kr) {
          const int key = 16 * w + g + 8 * kr;
          const float v = (s[4 * j + 2 * kr + e] + 0.0625f * s[4 * (j + 2) + 2 * kr + e]) * colscale[j][e];
          x[j][e][kr] = key < valid ? v : neg_inf();
        }
        tmax[j][e] = quad_max(fmaxf(x[j][e][0], x[j][e][1]));
      }
    float* rb = red + ((t / kWGs) & 1) * 64;
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) rb[w * 16 + 8 * j + 2 * i + e] = tmax[j][e];
    }
    wg::named_sync(bar, 128);
    float alpha[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * j + 2 * i + e;
        const float mx = fmaxf(fmaxf(rb[h], rb[16 + h]), fmaxf(rb[32 + h], rb[48 + h]));
        const float mn = fmaxf(m[j][e], mx);
        const float mu = mn == neg_inf() ? 0.f : mn;
        alpha[j][e] = exp2_ftz(m[j][e] - mu);
        m[j][e] = mn;
        float ps = 0.f;
#pragma unroll
        for (int kr = 0; kr < 2; ++kr) {
          const float p = exp2_ftz(x[j][e][kr] - mu);
          const unsigned short hv = f32x2_e4m3(256.f * p, 0.f);
          const float hf = e4m3x2_f32(hv).x;
          const unsigned short lv = f32x2_e4m3(256.f * p - hf, 0.f);
          ps += hf + e4m3x2_f32(lv).x;  // the sum of what PV multiplies
          p_smem[poff[j][e][kr]] = static_cast<unsigned char>(hv & 0xff);
          p_smem[2048 + poff[j][e][kr]] = static_cast<unsigned char>(lv & 0xff);
        }
        l[j][e] = l[j][e] * alpha[j][e] + ps;
      }
#ifndef KF_EAGER_RESCALE  // the output moves only when some row's maximum did (uniform over the warpgroup)
    if (__any_sync(0xffffffffu, alpha[0][0] != 1.f || alpha[0][1] != 1.f || alpha[1][0] != 1.f || alpha[1][1] != 1.f))
#endif
#pragma unroll
    for (int d = 0; d < 8; ++d)
#pragma unroll
      for (int k = 0; k < 8; ++k) o[d][k] *= alpha[k / 4][k % 2];
    // ---- V^T fragments from the slot (keys permuted as key_slot), then the slot is free ----
    u32 a[8][2][4];
#pragma unroll
    for (int d = 0; d < 8; ++d)
#pragma unroll
      for (int kb = 0; kb < 2; ++kb) {
        u32 R[4];
        wg::ldmatrix_x4_trans(st_addr + (d / 2) * kChunkBytes + kb * 32 * 128 + lds_off[d % 2], R);
        if (valid < kBN) {
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const int k0 = kb * 32 + 8 * jj + 2 * i;
            R[jj] &= (k0 < valid ? 0x0000ffffu : 0u) | (k0 + 1 < valid ? 0xffff0000u : 0u);
          }
        }
        a[d][kb][0] = prmt(R[0], R[1], 0x6420);
        a[d][kb][1] = prmt(R[0], R[1], 0x7531);
        a[d][kb][2] = prmt(R[2], R[3], 0x6420);
        a[d][kb][3] = prmt(R[2], R[3], 0x7531);
      }
    __syncwarp();
    if (lane == 0) kvforge::MBarrier::arrive(ring.empty(slot));
    wg::fence_proxy_async();  // P^T read by wgmma
    wg::named_sync(bar, 128);
    wg::wgmma_fence();
#pragma unroll
    for (int d = 0; d < 8; ++d)
#pragma unroll
      for (int kb = 0; kb < 2; ++kb) {
#ifndef KF_ABL_NO_PV  // measurement only: the fragments built, no PV product
        wg::wgmma_m64n16k32_e4m3_rs(o[d], a[d][kb], wg::desc_sw128(phi_addr + kb * 32, 16, 1024));
#endif
#if !defined(KF_ABL_NO_PV) && !defined(KF_ABL_PV_HI_ONLY)
        wg::wgmma_m64n16k32_e4m3_rs(o[d], a[d][kb], wg::desc_sw128(plo_addr + kb * 32, 16, 1024));
#endif
      }
    wg::wgmma_commit();
    wg::wgmma_wait<0>();  // (left in flight into the next tile's QK, ptxas serialises every wgmma: C7515)
#pragma unroll
    for (int d = 0; d < 8; ++d) wg::fence_operands(o[d]);
  }
  wg::wgmma_wait<0>();
#pragma unroll
  for (int d = 0; d < 8; ++d) wg::fence_operands(o[d]);
  // ---- row sums over the warpgroup; warpgroup 1 hands its rows to warpgroup 0, which merges and stores ----
  float* sums = red + 128;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float ls = quad_sum(l[j][e]);
      if (g == 0) sums[w * 16 + 8 * j + 2 * i + e] = ls;
    }
  wg::named_sync(bar, 128);
  if (g == 0 && w == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int h = 8 * j + 2 * i + e;
        stats[mg * 32 + h] = m[j][e];
        stats[mg * 32 + 16 + h] = sums[h] + sums[16 + h] + sums[32 + h] + sums[48 + h];
      }
  }
  float* o_xfer = reinterpret_cast<float*>(smem + kOffKV);  // the ring, free once every tile is consumed
  if constexpr (kWGs == 2) {
    wg::named_sync(3, kMathThreads);  // every tile consumed; both warpgroups' stats written
    if (mg == 1) {
#pragma unroll
      for (int d = 0; d < 8; ++d)
#pragma unroll
        for (int k = 0; k < 8; ++k) o_xfer[(d * 8 + k) * 128 + mt] = o[d][k];
    }
    wg::named_sync(3, kMathThreads);
    if (mg == 1) return;
  } else {
    wg::named_sync(bar, 128);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int h = 8 * j + 2 * i + e;
      float f0 = 1.f, f1 = 0.f, tot = stats[16 + h];
      if constexpr (kWGs == 2) {
        const float m0 = stats[h], m1 = stats[32 + h];
        const float mx = fmaxf(m0, m1), mu = mx == neg_inf() ? 0.f : mx;
        f0 = exp2_ftz(m0 - mu);
        f1 = exp2_ftz(m1 - mu);
        tot = stats[16 + h] * f0 + stats[48 + h] * f1;
      }
      const float inv = tot > 0.f ? out_scale / tot : 0.f;
      if (h < kHeads) {
#pragma unroll
        for (int d = 0; d < 8; ++d) {
          const int dim = d * 64 + 16 * w + 2 * g;
          float v0 = o[d][4 * j + e] * f0, v1 = o[d][4 * j + 2 + e] * f0;
          if constexpr (kWGs == 2) {
            v0 += o_xfer[(d * 8 + 4 * j + e) * 128 + mt] * f1;
            v1 += o_xfer[(d * 8 + 4 * j + 2 + e) * 128 + mt] * f1;
          }
          *reinterpret_cast<__nv_bfloat162*>(out + (static_cast<long long>(b) * kHeads + h) * kDv + dim) =
              __floats2bfloat162_rn(v0 * inv, v1 * inv);
        }
      }
    }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(kMathThreads + 32, 1)
mla_fp8_keys_m(const __grid_constant__ wg::TensorMap kv_map, const __nv_bfloat16* q, __nv_bfloat16* out,
               const int* block_table, const int* seqlens, int max_pages, float scale_log2, float out_scale) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (kvforge::smem_u32(smem_raw) & 1023)) & 1023);
  const int b = blockIdx.x;
  const int seqlen = seqlens[b];
  const int num_tiles = (seqlen + kBN - 1) / kBN;
  const Ring ring{reinterpret_cast<u64*>(smem + kOffBars)};
  if (threadIdx.x == kMathThreads) {
    ring.init();
    wg::prefetch_tensor_map(&kv_map);
  }
  __syncthreads();
  if (threadIdx.x >= kMathThreads) {
    if (threadIdx.x == kMathThreads) producer(ring, smem, &kv_map, block_table + static_cast<long long>(b) * max_pages, num_tiles, seqlen);
  } else {
    math(ring, smem, q, out, b, num_tiles, seqlen, scale_log2, out_scale);
  }
}
