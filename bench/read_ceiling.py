"""How fast can this GPU stream a buffer into shared memory? A read ceiling measured the way the decode kernels
read (bulk copies into an mbarrier ring, `kvforge/pipeline.cuh`), next to bench.py's (a torch reduction over
4 GB) and the device copy.

    python bench/read_ceiling.py [--gib 4] [--chunks 8192,16384,32768] [--stages 2,4,8] [--ctas-per-sm 1,2,4]
                                 [--row-bytes 256 --heads 8 --producers 1,4 --random-pages] [--l2-mib 32]

Each CTA is producer warps (the first lane of the first issues `cp.async.bulk` of `chunk` bytes into the next free
slot of a `stages`-deep ring) and one consumer warp (waits for each slot, reads one 16-byte word of it into a
checksum, releases it); chunks are dealt round-robin to the CTAs, `ctas-per-sm` CTAs per SM. `--row-bytes R`: the
slot is filled instead by one bulk copy per R-byte row, issued by the lanes of `--producers` warps, the rows
`--heads` rows apart in memory (how the GQA kernel's bulk producers fill a tile from a paged [pages][page][heads][D]
cache), the pages in memory order or (`--random-pages`) shuffled as a block table scatters them: whether row-sized
copies cap the rate (issue 8). Measured (twenty-second session, bench/RESULTS.md): one copy per slot reads 4.65
TB/s; 256-byte rows about one copy per 70 SM cycles per warp, 4.40-4.49 TB/s from four warps x 2 CTAs per SM and
no more from eight: the SM's bulk-copy unit caps row-sized copies.

Median of CUDA-event timings after warm-up, the buffer (default 4 GiB) far beyond the L2. Prints GB/s per
configuration and the best, with torch's reduction and copy in the same run: whether a decode kernel reading at X%
of bench.py's ceiling has headroom is what this says (kvforge's GQA reads ~4.1-4.2 TB/s, FlashInfer ~4.4, above the
torch reduction's ~4.3). `--l2-mib M`: the chunks are read from an M-MiB buffer over and over (the total stays
`--gib`), so every copy after the first lap hits the L2: the L2-to-shared-memory ceiling, which bounds a kernel whose
CTAs read the same bytes twice (MLA at 128 heads: two 64-head CTAs per sequence move twice the DRAM bytes out of L2).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import ceilings, median_ms  # noqa: E402

SOURCE = r"""
#include "kvforge/pipeline.cuh"
namespace {
constexpr int kStages = %(stages)d;
constexpr int kChunk = %(chunk)d;
constexpr int kRow = %(row)d;      // 0: one copy per slot; else kChunk / kRow copies of kRow bytes by the warps' lanes
constexpr int kHeads = %(heads)d;  // rows copies: a slot's rows are every kHeads-th row (one head of a paged cache)
constexpr int kProducers = %(producers)d;  // rows copies: producer warps sharing a slot's rows
using Ring = kvforge::KVRing<kStages, 1, 1, 1>;
static_assert(kRow == 0 || (kChunk %% kRow == 0 && kRow %% 16 == 0), "rows");
static_assert(kRow > 0 || kProducers == 1, "one copy per slot: one producer");
}
extern "C" __global__ void __launch_bounds__(32 * (kProducers + 1)) kvforge_read_ceiling(
    const unsigned char* src, long long chunks, long long wrap, const int* pages, unsigned long long* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Ring ring{reinterpret_cast<kvforge::u64*>(smem + kStages * kChunk)};
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  if (threadIdx.x < 32 * kProducers) {
    if (kRow == 0 && threadIdx.x != 0) return;
    kvforge::PipelineProducer<Ring> pipe{ring};
    for (long long c = blockIdx.x; c < chunks; c += gridDim.x) {
      pipe.producer_acquire();
      if constexpr (kRow == 0) {
        kvforge::u64* full = pipe.producer_commit_expect_tx(kChunk);
        kvforge::bulk_copy_g2s(smem + pipe.index() * kChunk, src + (c %% wrap) * kChunk, kChunk, full);
      } else {  // chunk c: head c %% kHeads of page pages[c / kHeads], its rows kHeads rows apart, one copy per row
        kvforge::u64* full = ring.full(pipe.index());
        if (threadIdx.x == 0) pipe.producer_commit_expect_tx(kChunk);  // the others' bytes may land first (tx < 0)
        __syncwarp();
        constexpr int kRows = kChunk / (kRow > 0 ? kRow : 1);
        const long long row0 = static_cast<long long>(pages[c / kHeads]) * kRows * kHeads + c %% kHeads;
        for (int j = threadIdx.x; j < kRows; j += 32 * kProducers)
          kvforge::bulk_copy_g2s(smem + pipe.index() * kChunk + j * kRow, src + (row0 + j * kHeads) * kRow, kRow, full);
      }
      pipe.advance();
    }
  } else {
    kvforge::PipelineConsumer<Ring> pipe{ring};
    const int lead = 32 * kProducers;
    unsigned long long sum = 0;
    for (long long c = blockIdx.x; c < chunks; c += gridDim.x) {
      pipe.consumer_wait();
      if (threadIdx.x == lead) sum += *reinterpret_cast<const unsigned long long*>(smem + pipe.index() * kChunk);
      __syncwarp();
      if (threadIdx.x == lead) pipe.release_all();
      pipe.advance();
    }
    if (threadIdx.x == lead) atomicAdd(sink, sum);  // keeps the reads
  }
}
"""


def build(stages: int, chunk: int, row: int = 0, heads: int = 8, producers: int = 1):
    from kvforge.runtime.compiler import compile_source
    from kvforge.runtime.launch import load

    k = compile_source("kvforge_read_ceiling", "sm_90a",
                       SOURCE % {"stages": stages, "chunk": chunk, "row": row, "heads": heads,
                                 "producers": producers})
    smem = stages * chunk + 2 * stages * 8
    return load(k, "kvforge_read_ceiling", smem), smem


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--chunks", default="8192,16384,32768")
    ap.add_argument("--stages", default="2,4,8")
    ap.add_argument("--ctas-per-sm", default="1,2,4")
    ap.add_argument("--row-bytes", type=int, default=0, help="fill each slot by one bulk copy per row of this many "
                    "bytes, issued by the producer warps' lanes, the rows --heads rows apart (a paged GQA cache's "
                    "per-head rows: 256 = D 128 in 16 bits); 0: one copy per slot")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--producers", default="1", help="--row-bytes: producer warps per CTA sharing each slot's rows "
                    "(comma-separated values to try; the GQA kernel has 4)")
    ap.add_argument("--random-pages", action="store_true", help="--row-bytes: the pages (chunk x heads bytes each) "
                    "in a random order, as a block table scatters them, instead of in memory order")
    ap.add_argument("--l2-mib", type=float, default=0.0, help="one copy per slot: read the --gib bytes from a buffer "
                    "of this many MiB, lap after lap (it stays in the L2: the L2-to-shared-memory ceiling); 0: one "
                    "pass over a --gib buffer (the DRAM ceiling)")
    args = ap.parse_args()
    if args.l2_mib and args.row_bytes:
        ap.error("--l2-mib measures one copy per slot; leave out --row-bytes")
    nbytes = int(args.gib * (1 << 30)) // 65536 * 65536
    if args.row_bytes:
        nbytes = nbytes // (65536 * args.heads) * 65536 * args.heads  # whole chunks per head
    src_bytes = int(args.l2_mib * (1 << 20)) // 65536 * 65536 if args.l2_mib else nbytes
    src = torch.empty(src_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    sink = torch.zeros(1, dtype=torch.int64, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    import numpy as np

    from kvforge.runtime.launch import resolve_stream

    stream = resolve_stream(torch.cuda.current_stream(), 0)  # the stream the CUDA events time
    results = []
    for chunk in (int(x) for x in args.chunks.split(",")):
        if args.row_bytes and chunk % args.row_bytes:
            continue
        pages = None  # row copies: the pages' order in memory (chunk x heads bytes each)
        if args.row_bytes:
            num_pages = nbytes // (chunk * args.heads)
            pages = (torch.randperm(num_pages, device="cuda") if args.random_pages
                     else torch.arange(num_pages, device="cuda")).to(torch.int32)
        for stages in (int(x) for x in args.stages.split(",")):
            if stages * chunk > 220 * 1024:
                continue
            for producers in (int(x) for x in args.producers.split(",")) if args.row_bytes else (1,):
                kernel, smem = build(stages, chunk, args.row_bytes, args.heads, producers)
                for per_sm in (int(x) for x in args.ctas_per_sm.split(",")):
                    if per_sm * (smem + 1024) > 228 * 1024:
                        continue
                    argv = (src.data_ptr(), np.int64(nbytes // chunk), np.int64(src_bytes // chunk),
                            pages.data_ptr() if pages is not None else 0,
                            sink.data_ptr())

                    def run():
                        kernel.launch((sms * per_sm, 1, 1), (32 * (producers + 1), 1, 1), smem, stream, *argv)

                    ms = median_ms(run, iters=20)
                    results.append((nbytes / ms / 1e6, chunk, stages, per_sm))
                    rows = (f" in {args.row_bytes}-byte rows ({producers} producer warps"
                            f"{', random pages' if args.random_pages else ''})" if args.row_bytes else "")
                    print(f"chunk {chunk:6d} B{rows}, {stages} stages, {per_sm} CTAs/SM: {results[-1][0]:7.0f} GB/s",
                          flush=True)
    ref = ceilings()
    best = max(results)
    where = f" from an L2-resident {src_bytes >> 20} MiB buffer" if args.l2_mib else ""
    print(f"\nbest bulk-copy read{where}: {best[0]:.0f} GB/s (chunk {best[1]} B, {best[2]} stages, {best[3]} CTAs/SM); "
          f"torch reduction {ref['read']:.0f} GB/s, device copy {ref['copy']:.0f} GB/s (read+write), "
          f"median of the bulk configurations {statistics.median(r[0] for r in results):.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
