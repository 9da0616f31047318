"""GQA decode at many query rows per KV head (group x s_q up to 128: speculative decoding on GQA/MQA models):
kvforge's built-in call, its sm80 (mma.sync) and sm90 (wgmma) kernels pinned, against FlashInfer's paged prefill
kernel on the same pages (its decode wrapper takes one query token; backend 'fa2': its 'fa3' backend ran 3-16x slower
on these shapes in the first run, bench/RESULTS.md), causal for s_q > 1 (query i of a sequence of length L sees keys
0 .. L - s_q + i in both). Graph replays, KV copies rotating past the L2, medians of interleaved rounds; the read
ceiling of this run, so a row says whether the shape is memory- or math-bound. The sm90/sm80 column is what the
selector's threshold (codegen/sm90_gqa.py SM90_GQA_MIN_ROWS) rests on.

    python3 bench/gqa_rows.py [--rounds 3] [--quick] [--fa3] [--fp8 [--scale-block 32|64|128]] [--min-rows N]
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from bench import Shape, ceilings, interleaved_ms, kv_copies, make_inputs, run_torch

from kvforge.runtime.decode import select_config

# (b, s_k, Hq, Hkv, D, s_q, page): rows per KV head = Hq / Hkv * s_q from 4 to 128
SHAPES = [
    (64, 8192, 32, 8, 128, 1, 16), (64, 8192, 32, 8, 128, 2, 16), (64, 8192, 32, 8, 128, 4, 16),
    (64, 8192, 32, 8, 128, 8, 16), (64, 4096, 64, 4, 128, 1, 64), (64, 4096, 64, 4, 128, 2, 64),
    (64, 4096, 64, 4, 128, 4, 64), (64, 4096, 64, 4, 128, 8, 64), (64, 4096, 32, 8, 256, 4, 16),
    (64, 4096, 32, 8, 256, 8, 16), (32, 8192, 64, 8, 64, 4, 16), (32, 8192, 64, 8, 64, 8, 16),
    (32, 4096, 64, 8, 256, 8, 16), (1, 65536, 32, 8, 128, 8, 16),
]


def flashinfer_prefill(sh: Shape, q, kv, bt, backend: str):
    """FlashInfer's BatchPrefillWithPagedKVCacheWrapper on the same pages: one call per KV copy."""
    import flashinfer

    b, pages_per_seq = bt.shape
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
    qo_indptr = torch.arange(0, b + 1, dtype=torch.int32, device="cuda") * sh.s_q
    indptr = torch.arange(0, b + 1, dtype=torch.int32, device="cuda") * pages_per_seq
    last = torch.full((b,), sh.s_k - (pages_per_seq - 1) * sh.page, dtype=torch.int32, device="cuda")
    w.plan(qo_indptr, indptr, bt.reshape(-1).contiguous(), last, sh.hq, sh.hkv, sh.d, sh.page, causal=sh.s_q > 1,
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    qf = q.reshape(b * sh.s_q, sh.hq, sh.d)
    return [lambda i=i: w.run(qf, (kv[i][0], kv[i][1])).reshape(q.shape) for i in range(len(kv))]


def rel_l2(got, ref) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer replays per round")
    ap.add_argument("--fa3", action="store_true", help="also FlashInfer's fa3 backend")
    ap.add_argument("--fp8", action="store_true", help="kvforge on per-tensor fp8 copies of the caches (kvforge."
                    "quantize_kv; 'of ceiling' then counts the fp8 bytes), FlashInfer on the 16-bit ones; rel. L2 "
                    "against the 16-bit reference, so it includes the quantization error")
    ap.add_argument("--scale-block", type=int, choices=(32, 64, 128), default=None,
                    help="with --fp8: block-scaled caches (this many channels per scale) instead of per-tensor ones")
    ap.add_argument("--min-rows", type=int, default=1, help="only the shapes with at least this many query rows per "
                    "KV head (group x s_q)")
    args = ap.parse_args()
    if args.scale_block and not args.fp8:
        ap.error("--scale-block: takes --fp8 (block-scaled fp8 caches)")
    shapes = [row for row in SHAPES if row[2] // row[3] * row[5] >= args.min_rows]
    prewarm(shapes, args.fp8, args.scale_block)
    ceil = ceilings()["read"]
    peers = ("fa2", "fa3") if args.fa3 else ("fa2",)
    print(f"read ceiling {ceil:.0f} GB/s\n")
    print("| shape | rows / KV head | built-in | kvforge ms | of ceiling | sm80 ms | sm90 ms | sm80 / sm90 | FA2 ms "
          "| FA2 / kvforge | FA3 ms | FA3 / kvforge | kvforge rel. L2 | sm90 rel. L2 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for b, s_k, hq, hkv, d, s_q, page in shapes:
        sh = Shape("gqa_decode", b, s_k, hq, hkv, d, s_q=s_q, page=page)
        copies = kv_copies(sh.bytes())
        q, kv, bt, lens = make_inputs(sh, copies)
        mine = [fp8_caches(k, v, args.scale_block) for k, v in kv] if args.fp8 else kv
        pinned = {name: pinned_config(sh, name, args.fp8, args.scale_block) for name in ("sm80", "sm90")}
        calls = {"ours": [lambda i=i: kvforge_call(sh, q, mine[i], bt, lens) for i in range(copies)]}
        for name, cfg in pinned.items():
            if cfg is not None:
                calls[name] = [lambda i=i, c=cfg: kvforge_call(sh, q, mine[i], bt, lens, c) for i in range(copies)]
        errs = {}
        for backend in peers:
            try:
                calls[backend] = flashinfer_prefill(sh, q, kv, bt, backend)
                calls[backend][0]()
            except Exception as e:  # noqa: BLE001 - a backend that cannot run this shape leaves its column empty
                print(f"{sh.label}: FlashInfer {backend} failed: {type(e).__name__}: {str(e)[:300]}",
                      file=sys.stderr)
                calls.pop(backend, None)
        ref = torch_ref(sh, q, kv[0], bt, lens)
        for name in ("ours", "sm90"):
            if name in calls:
                errs[name] = rel_l2(calls[name][0](), ref)
        del ref
        t = interleaved_ms(calls, 5 if args.quick else 20, args.rounds)
        ours = t["ours"]
        fp8_bytes = sh.b * 2 * sh.s_k * sh.hkv * (sh.d - 4 * -(-sh.d // args.scale_block) if args.scale_block else sh.d)
        gbs = (sh.bytes() - (fp8_bytes if args.fp8 else 0)) / ours / 1e6
        fa2, fa3 = t.get("fa2", math.nan), t.get("fa3", math.nan)
        sm80, sm90 = t.get("sm80", math.nan), t.get("sm90", math.nan)
        builtin = select_config("gqa_decode", "bf16", page, hq // hkv, d, s_q, 0, kv=mine[0][2] if args.fp8 else None).backend
        print(f"| {sh.label} page={page} | {hq // hkv * s_q} | {builtin} | {ours:.4f} | {gbs / ceil:.0%} | "
              f"{sm80:.4f} | {sm90:.4f} | {sm80 / sm90:.2f}x | {fa2:.4f} | {fa2 / ours:.2f}x | {fa3:.4f} | "
              f"{fa3 / ours:.2f}x | {errs['ours']:.1e} | {errs.get('sm90', math.nan):.1e} |", flush=True)
        del q, kv, mine, calls
        torch.cuda.empty_cache()
    return 0


def prewarm(shapes, fp8: bool, block: int | None) -> None:
    """Compile every pinned and built-in kernel of the run in parallel before any timing (NVRTC releases the
    GIL), so a fresh machine spends seconds, not minutes, compiling them one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile
    from kvforge.runtime.kv_format import KVFormat

    kv = KVFormat("fp8_e4m3", "block" if block else "per_tensor", block) if fp8 else None
    configs = {}
    for b, s_k, hq, hkv, d, s_q, page in shapes:
        sh = Shape("gqa_decode", b, s_k, hq, hkv, d, s_q=s_q, page=page)
        found = [pinned_config(sh, name, fp8, block) for name in ("sm80", "sm90")]
        found.append(select_config("gqa_decode", "bf16", page, hq // hkv, d, s_q, 0, kv=kv))
        configs.update({c.model_dump_json(): c for c in found if c is not None})
    with ThreadPoolExecutor(12) as ex:
        list(ex.map(lambda c: compile(Variant(c)), configs.values()))


def kvforge_call(sh, q, kv, bt, lens, config=None):
    import kvforge

    scales = {"k_scale": kv[3], "v_scale": kv[4]} if len(kv) > 2 else {}
    return kvforge.gqa_decode(q, kv[0], kv[1], bt, lens, causal=sh.s_q > 1, config=config, **scales)[0]


def fp8_caches(k, v, block: int | None = None):
    """fp8 copies of the K and V caches, per-tensor or (`block`) block-scaled: (k8, v8, their KVFormat, k_scale,
    v_scale)."""
    import kvforge
    from kvforge.runtime.kv_format import KVFormat

    layout = "block" if block else "per_tensor"
    k8, ks = kvforge.quantize_kv(k, layout, block)
    v8, vs = kvforge.quantize_kv(v, layout, block)
    return k8, v8, KVFormat("fp8_e4m3", layout, block), ks, vs


def pinned_config(sh, backend: str, fp8: bool = False, block: int | None = None):
    """The backend's own choice for the shape (None where it has no kernel for it); fp8: per-tensor, or block
    scales of `block` channels."""
    from kvforge.codegen.errors import ConfigError
    from kvforge.codegen.select import select_decode_config
    from kvforge.runtime.device import device_arch

    try:
        return select_decode_config("gqa_decode", device_arch(0), "bf16", sh.page, heads=sh.hq // sh.hkv,
                                    head_dim=sh.d, s_q=sh.s_q, backend=backend,
                                    scale_mode=("block" if block else "per_tensor") if fp8 else "none",
                                    scale_block_size=block if fp8 else None)
    except ConfigError as e:
        print(f"{sh.label}: no {backend} variant: {e}", file=sys.stderr)
        return None


def torch_ref(sh, q, kv, bt, lens):
    """bench.run_torch with the causal rule for s_q > 1 (float32 scores)."""
    if sh.s_q == 1:
        return run_torch(sh, q, *kv, bt, lens)
    b, s_q, hq, d = q.shape
    idx = bt.long()
    keys = kv[0][idx].reshape(b, -1, *kv[0].shape[2:])[:, : sh.s_k]
    vals = kv[1][idx].reshape(b, -1, *kv[1].shape[2:])[:, : sh.s_k]
    g = hq // sh.hkv
    s = torch.einsum("bqngd,bknd->bngqk", q.reshape(b, s_q, sh.hkv, g, d), keys).float() / math.sqrt(d)
    mask = torch.arange(sh.s_k, device=q.device)[None, :] > (sh.s_k - s_q + torch.arange(s_q, device=q.device))[:, None]
    p = torch.softmax(s.masked_fill(mask[None, None, None], float("-inf")), -1).to(q.dtype)
    return torch.einsum("bngqk,bknd->bqngd", p, vals).reshape(b, s_q, hq, d)


if __name__ == "__main__":
    sys.exit(main())
