"""kvforge decode benchmark: the issue's shapes, with the ceilings and the peers measured in the
same run. Prints a markdown table (and writes it with --write PATH).

    python bench/bench.py [--write bench/RESULTS.md] [--quick] [--no-flashinfer]

Time per call = median over CUDA-graph replays (CUDA-event timed, after at least 50 ms of warm-up
replays) of a graph that makes one call per KV copy; kvforge, its sm80 backend and FlashInfer are
captured together and timed in rounds whose order rotates (median over rounds); the copies rotate so the KV read exceeds the L2 several times. Decode
steps run as graphs in serving engines; the eager column shows kvforge's time per call without a
graph (Python overhead included). Bytes and FLOPs use FlashMLA's conventions.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

import kvforge
from kvforge.runtime.decode import select_config

L2_BYTES = 60 << 20


WARM_MS = 50.0  # replays before timing last at least this long: clocks ramp up after a compile's idle gap


def median_ms(fn, iters: int = 40, warmup: int = 8, warm_ms: float = WARM_MS) -> float:
    """Median CUDA-event time of `fn` over `iters` calls, after at least `warmup` calls and
    `warm_ms` milliseconds of calls (a GPU idle during a compile runs its first calls slower)."""
    t0, n = time.perf_counter(), 0
    while n < warmup or (time.perf_counter() - t0) * 1e3 < warm_ms:
        fn()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def capture(calls) -> "torch.cuda.CUDAGraph":
    """One CUDA graph making each of `calls` (zero-argument callables) once; each runs eagerly
    first (compile, load, plan outside the capture)."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for c in calls:
                c()
    torch.cuda.synchronize()
    return g


def graph_ms(calls, replays: int = 20) -> float:
    """Median time per call of `calls` (zero-argument callables) captured into one CUDA graph."""
    return median_ms(capture(calls).replay, iters=replays, warmup=3) / len(calls)


def interleaved_ms(variants: dict, replays: int = 20, rounds: int = 3) -> dict:
    """{name: ms per call} for {name: calls}: every variant captured first, then timed once per
    round with the order rotating each round (no variant always first after an idle gap or
    always after a given neighbour); the median over rounds."""
    graphs = {name: (capture(calls), len(calls)) for name, calls in variants.items()}
    names = list(graphs)
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in (order if r % 2 == 0 else order[::-1]):
            g, n = graphs[name]
            times[name].append(median_ms(g.replay, iters=replays, warmup=3) / n)
    return {name: statistics.median(t) for name, t in times.items()}


def ceilings() -> dict:
    n = 4 << 30
    src = torch.empty(n // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), iters=20)
    read_ms = median_ms(lambda: torch.sum(src), iters=20)
    del dst
    return {"copy": 2 * n / copy_ms / 1e6, "read": n / read_ms / 1e6}  # GB/s


class Shape:
    def __init__(self, family, b, s_k, hq, hkv=1, d=576, s_q=1, page=64):
        self.family, self.b, self.s_k, self.hq, self.hkv, self.d, self.s_q, self.page = family, b, s_k, hq, hkv, d, s_q, page

    @property
    def label(self):
        if self.family == "mla_decode":
            return f"MLA b={self.b} s_k={self.s_k} s_q={self.s_q} h={self.hq}"
        return f"GQA b={self.b} s_k={self.s_k} Hq={self.hq} Hkv={self.hkv} D={self.d}" + (
            f" s_q={self.s_q}" if self.s_q > 1 else "")

    def bytes(self):
        if self.family == "mla_decode":
            return self.b * (self.s_q * self.hq * 576 * 2 + self.s_k * 576 * 2 + self.s_q * self.hq * 512 * 2)
        return self.b * (2 * self.s_q * self.hq * self.d * 2 + 2 * self.s_k * self.hkv * self.d * 2)

    def flops(self):
        dv = 512 if self.family == "mla_decode" else self.d
        return 2 * self.b * self.s_q * self.hq * self.s_k * (self.d + dv)


def make_inputs(sh: Shape, copies: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    pages_per_seq = math.ceil(sh.s_k / sh.page)
    num_pages = sh.b * pages_per_seq
    row = (1, sh.d) if sh.family == "mla_decode" else (sh.hkv, sh.d)
    kv = []
    for _ in range(copies):
        k = torch.randn((num_pages, sh.page, *row), device="cuda", dtype=torch.bfloat16, generator=g)
        v = None if sh.family == "mla_decode" else torch.randn(k.shape, device="cuda", dtype=k.dtype, generator=g)
        kv.append((k.reshape(num_pages, sh.page, sh.d) if sh.family == "mla_decode" else k, v))
    bt = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32).reshape(sh.b, pages_per_seq)
    lens = torch.full((sh.b,), sh.s_k, dtype=torch.int32, device="cuda")
    q = torch.randn((sh.b, sh.s_q, sh.hq, sh.d), device="cuda", dtype=torch.bfloat16, generator=g)
    return q, kv, bt, lens


def run_kvforge(sh, q, k, v, bt, lens, config=None):
    """kvforge's call; MLA passes the longest length as the max_seq_len hint (what an engine's metadata holds on
    the host, as FlashInfer's plan() gets the lengths): it picks the schedule of long split chunks."""
    if sh.family == "mla_decode":
        return kvforge.mla_decode(q, k, bt, lens, causal=sh.s_q > 1, config=config, max_seq_len=sh.s_k)[0]
    return kvforge.gqa_decode(q, k, v, bt, lens, causal=sh.s_q > 1, config=config)[0]


def sm80_config(sh):
    """The sm80 backend's choice for the shape (the baseline the sm90 kernels must beat)."""
    from kvforge.codegen.select import select_decode_config
    from kvforge.runtime.device import device_arch

    heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
    return select_decode_config(sh.family, device_arch(0), "bf16", sh.page, heads=heads, head_dim=sh.d, s_q=sh.s_q,
                                backend="sm80")


def run_torch(sh, q, k, v, bt, lens):
    """Plain PyTorch on the same paged inputs: gather the pages, then matmul-softmax-matmul."""
    b, s_q, hq, d = q.shape
    idx = bt.long()
    keys = k[idx].reshape(b, -1, *k.shape[2:])[:, : sh.s_k]           # [B, s_k, (Hkv,) D]
    scale = 1 / math.sqrt(d)
    if sh.family == "mla_decode":
        vals = keys[..., :512]
        s = torch.einsum("bqhd,bkd->bhqk", q, keys).float() * scale
        if s_q > 1:
            mask = torch.arange(sh.s_k, device=q.device)[None, :] > (sh.s_k - s_q + torch.arange(s_q, device=q.device))[:, None]
            s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s, -1).to(q.dtype)
        return torch.einsum("bhqk,bkd->bqhd", p, vals)
    vals = v[idx].reshape(b, -1, *v.shape[2:])[:, : sh.s_k]
    g = hq // sh.hkv
    qg = q.reshape(b, s_q, sh.hkv, g, d)
    s = torch.einsum("bqngd,bknd->bngqk", qg, keys).float() * scale
    p = torch.softmax(s, -1).to(q.dtype)
    return torch.einsum("bngqk,bknd->bqngd", p, vals).reshape(b, s_q, hq, d)


def flashinfer_runner(sh, q, kv, bt, lens):
    """FlashInfer 0.6 on the same pages (MLA: BatchMLAPagedAttentionWrapper; GQA: tensor-core decode)."""
    import flashinfer

    b = sh.b
    pages_per_seq = bt.shape[1]
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    indptr = torch.arange(0, b + 1, dtype=torch.int32, device="cuda") * pages_per_seq
    indices = bt.reshape(-1).contiguous()
    last = torch.full((b,), sh.s_k - (pages_per_seq - 1) * sh.page, dtype=torch.int32, device="cuda")
    if sh.family == "mla_decode":
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
        qo_indptr = torch.arange(0, b + 1, dtype=torch.int32, device="cuda") * sh.s_q
        w.plan(qo_indptr, indptr, indices, lens, sh.hq, 512, 64, sh.page, sh.s_q > 1, 1 / math.sqrt(576),
               torch.bfloat16, torch.bfloat16)
        qf = q.reshape(b * sh.s_q, sh.hq, 576)
        q_nope, q_pe = qf[..., :512].contiguous(), qf[..., 512:].contiguous()
        split = [(k[..., :512].contiguous(), k[..., 512:].contiguous()) for k, _ in kv]
        return lambda i: w.run(q_nope, q_pe, *split[i])
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, sh.hq, sh.hkv, sh.d, sh.page, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16)
    q3 = q[:, 0].contiguous()
    return lambda i: w.run(q3, (kv[i][0], kv[i][1]))


def flashinfer_calls(sh, q, kv, bt, lens, copies: int) -> dict:
    """{"FlashInfer": one call per KV copy} to add to an A/B script's timed calls, or {} where FlashInfer
    cannot run this shape (the reason on stderr)."""
    try:
        fi = flashinfer_runner(sh, q, kv, bt, lens)
    except Exception as e:  # noqa: BLE001 - a missing peer leaves its column empty, not the run
        print(f"FlashInfer failed: {type(e).__name__}: {e}", file=sys.stderr)
        return {}
    return {"FlashInfer": [lambda i=i: fi(i) for i in range(copies)]}


def kv_copies(nbytes: int) -> int:
    """KV copies a timed call rotates through, so that consecutive replays read past the L2: enough to cover
    three L2s with `nbytes` each, 1 to 8."""
    return max(1, min(8, math.ceil(3 * L2_BYTES / nbytes)))


def config_ab(variants, names: tuple[str, str], headers: tuple[str, str], rounds: int, shapes=None) -> None:
    """Print a table timing two pinned configs per benchmark shape: `variants(shape)` gives
    {name: config} for `names` (or None to skip the shape). Each round times both (graph
    replays, KV copies rotating past the L2), alternating which goes first; medians and a/b."""
    a, b = names
    print(f"| shape | {headers[0]} ms | {headers[1]} ms | {a} / {b} |")
    print("|---|---|---|---|")
    for sh in shapes or SHAPES:
        cfgs = variants(sh)
        if cfgs is None:
            continue
        copies = kv_copies(sh.bytes())
        q, kv, bt, lens = make_inputs(sh, copies)
        got = interleaved_ms({name: [lambda i=i, c=cfgs[name]: run_kvforge(sh, q, *kv[i], bt, lens, c)
                                     for i in range(copies)] for name in (a, b)}, 20, rounds)
        ta, tb = got[a], got[b]
        print(f"| {sh.label} | {ta:.4f} | {tb:.4f} | {ta / tb:.3f} |", flush=True)
        del q, kv
        torch.cuda.empty_cache()


SHAPES = [
    Shape("mla_decode", 128, 4096, 16), Shape("mla_decode", 128, 4096, 32), Shape("mla_decode", 128, 4096, 64),
    Shape("mla_decode", 128, 4096, 128), Shape("mla_decode", 128, 4096, 64, s_q=2),
    Shape("mla_decode", 32, 8192, 128), Shape("mla_decode", 1, 32768, 128),
    Shape("gqa_decode", 64, 8192, 32, 8, 128, page=16), Shape("gqa_decode", 1, 65536, 32, 8, 128, page=16),
    Shape("gqa_decode", 128, 4096, 64, 8, 128, page=64), Shape("gqa_decode", 32, 4096, 32, 32, 128, page=16),
    Shape("gqa_decode", 64, 8192, 32, 8, 64, page=16), Shape("gqa_decode", 64, 4096, 32, 8, 256, page=16),
]
# MLA launches of few tiles per CTA, where a launch's fixed cost weighs most (bench/overhead_fit.py,
# bench/phase_trace.py): one wave unsplit (b=64 h=128 and b=128 h=64 at s_k=512), two chunks (b=32 h=128 at
# s_k=1024 and 2048), one long sequence, and a two-wave launch (b=64 s_k=4096 h=128)
SHORT_SHAPES = [Shape("mla_decode", b, s_k, h) for b, s_k, h in ((64, 512, 128), (128, 512, 64), (32, 1024, 128),
                                                                   (32, 2048, 128), (1, 32768, 128), (64, 4096, 128))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", help="also write the markdown table to this file")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer timed iterations")
    args = ap.parse_args()
    iters = 10 if args.quick else 40
    rounds = 2 if args.quick else 3
    ceil = ceilings()
    fi_note = ""
    if not args.no_flashinfer:
        try:
            import flashinfer  # noqa: F401
        except Exception as err:  # noqa: BLE001
            fi_note = f"FlashInfer unavailable: {type(err).__name__}: {err}"
            args.no_flashinfer = True
    rows = []
    for sh in SHAPES:
        kv_bytes = sh.bytes()
        copies = kv_copies(kv_bytes)
        q, kv, bt, lens = make_inputs(sh, copies)
        calls = {"ours": [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]}
        base_cfg = sm80_config(sh)
        same = select_config(sh.family, "bf16", sh.page, sh.hq // sh.hkv, sh.d, sh.s_q, 0) == base_cfg
        if not same:
            calls["sm80"] = [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens, base_cfg) for i in range(copies)]
        fi = None
        if not args.no_flashinfer:
            try:
                fi = flashinfer_runner(sh, q, kv, bt, lens)
                fi(0)
                capture([lambda: fi(0)])
                calls["flashinfer"] = [lambda i=i: fi(i) for i in range(copies)]
            except Exception as e:  # noqa: BLE001 - reported in the table's notes, timed eagerly below if it runs
                fi_note += f"\n- {sh.label}: FlashInfer not graph-captured: {type(e).__name__}: {str(e)[:200]}"
        timed = interleaved_ms(calls, iters, rounds)
        ours = timed["ours"]
        sm80_ms = ours if same else timed["sm80"]
        it = iter(range(10**9))
        eager = median_ms(lambda: run_kvforge(sh, q, *kv[next(it) % copies], bt, lens), iters)
        ref = run_torch(sh, q, *kv[0], bt, lens)
        got = run_kvforge(sh, q, *kv[0], bt, lens)
        err = float((got.float() - ref.float()).norm() / ref.float().norm())
        del ref, got
        try:
            torch_ms = graph_ms([lambda i=i: run_torch(sh, q, *kv[i], bt, lens) for i in range(copies)], 5)
        except torch.OutOfMemoryError:
            torch_ms = float("nan")
        torch.cuda.empty_cache()
        fi_ms = timed.get("flashinfer", float("nan"))
        if fi is not None and "flashinfer" not in timed:
            try:
                it3 = iter(range(10**9))
                fi_ms = median_ms(lambda: fi(next(it3) % copies), iters)
            except Exception as e:  # noqa: BLE001
                fi_note += f"\n- {sh.label}: FlashInfer failed: {type(e).__name__}: {str(e)[:200]}"
        gbs = kv_bytes / ours / 1e6
        rows.append((sh.label, ours, gbs, sh.flops() / ours / 1e9, gbs / ceil["read"], gbs / ceil["copy"],
                     torch_ms, torch_ms / ours, fi_ms, fi_ms / ours, err, eager, sm80_ms))
        del q, kv
        torch.cuda.empty_cache()
        print(f"{sh.label}: {ours:.3f} ms ({eager:.3f} eager, sm80 {sm80_ms:.3f}), {gbs:.0f} GB/s, "
              f"torch {torch_ms:.3f} ms, "
              f"flashinfer {fi_ms:.3f} ms",
              file=sys.stderr)
    dev = torch.cuda.get_device_name()
    lines = [f"Device: {dev}. Ceilings measured in this run: streaming read {ceil['read']:.0f} GB/s, "
             f"device copy {ceil['copy']:.0f} GB/s (read+write counted).", "",
             "| shape | kvforge ms | GB/s | TFLOPS | of read ceiling | of copy ceiling | torch ms | torch/kvforge "
             "| FlashInfer ms | FlashInfer/kvforge | rel. L2 vs torch | kvforge eager ms | sm80 backend ms "
             "| sm80/kvforge |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]:.3f} | {r[2]:.0f} | {r[3]:.1f} | {r[4]:.0%} | {r[5]:.0%} | {r[6]:.3f} | "
                     f"{r[7]:.2f}x | {r[8]:.3f} | {r[9]:.2f}x | {r[10]:.1e} | {r[11]:.3f} | {r[12]:.3f} | {r[1] and r[12] / r[1]:.2f}x |")
    if fi_note:
        lines += ["", fi_note.strip()]
    emit("\n".join(lines), args.write)
    return 0


def emit(table: str, path: str | None) -> None:
    """Print a result table, and write it to `path` (--write) when given."""
    print(table)
    if path:
        with open(path, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    sys.exit(main())
