"""FP8 KV benchmark: each fp8 layout against kvforge's own 16-bit call on the same shape and
against FlashInfer's FP8 decode, in one run with the read ceiling measured.

    python bench/fp8.py [--write PATH] [--quick] [--no-flashinfer] [--only mla|gqa]

Same method as bench/bench.py (CUDA-graph replays of one call per KV copy, copies rotating past
the L2, median of CUDA-event timings after warm-up; every variant of a shape, the 16-bit call and
FlashInfer captured together and timed in rounds of rotating order). Bytes per token: 576 (MLA) or 2 * Hkv * D
(GQA) for per-tensor fp8, plus 4 bytes per block scale, 656 for fp8_ds_mla. "target" is the
issue's bar: 0.9 x (16-bit bytes / fp8 bytes) as a speed-up over kvforge's 16-bit call.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import kvforge  # noqa: E402
from bench import L2_BYTES, Shape, ceilings, emit, interleaved_ms, make_inputs  # noqa: E402

LAYOUTS = (("per_tensor", None), ("block", 64), ("block", 128), ("fp8_ds_mla", None))
SHAPES = [Shape("mla_decode", 128, 4096, 16), Shape("mla_decode", 128, 4096, 64), Shape("mla_decode", 128, 4096, 128),
          Shape("gqa_decode", 64, 8192, 32, 8, 128, page=16), Shape("gqa_decode", 1, 65536, 32, 8, 128, page=16)]


def kv_bytes(sh: Shape, layout: str | None, block: int | None) -> int:
    """Bytes of KV a call reads (q and out included as bench.Shape.bytes counts them)."""
    q_out = sh.bytes() - (sh.b * sh.s_k * 576 * 2 if sh.family == "mla_decode" else sh.b * 2 * sh.s_k * sh.hkv * sh.d * 2)
    if layout is None:
        return sh.bytes()
    if layout == "fp8_ds_mla":
        token = 656
    else:
        token = sh.d + (4 * math.ceil(sh.d / block) if layout == "block" else 0)
    per_token = token if sh.family == "mla_decode" else 2 * sh.hkv * token
    return q_out + sh.b * sh.s_k * per_token


def quantized(sh: Shape, kv, layout: str, block: int | None):
    out = []
    for k, v in kv:
        qk, sk = kvforge.quantize_kv(k, layout, block)
        qv, sv = (None, None) if v is None else kvforge.quantize_kv(v, layout, block)
        out.append((qk, qv, sk, sv))
    return out


def run_fp8(sh: Shape, q, entry, bt, lens, config=None):
    k, v, ks, vs = entry
    if sh.family == "mla_decode":
        return kvforge.mla_decode(q, k, bt, lens, kv_scale=ks, causal=sh.s_q > 1, config=config)[0]
    return kvforge.gqa_decode(q, k, v, bt, lens, k_scale=ks, v_scale=vs, causal=sh.s_q > 1, config=config)[0]


def convert_path_config(sh: Shape, layout: str, block: int | None, path: str):
    """The sm80 fp8 config dequantizing through `path` ('ring': convert warps; 'registers': the
    consumers) for this shape on this device: an A/B row against the built-in choice."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    return select_decode_config(sh.family, device_arch(0), "bf16", sh.page, heads=sh.hq // sh.hkv, head_dim=sh.d,
                                s_q=sh.s_q, backend="sm80", scale_mode=layout, scale_block_size=block,
                                fp8_convert=path)


def backend_config(sh: Shape, layout: str, block: int | None, backend: str):
    """The fp8 config of `backend` for this shape on this device (an A/B row against the built-in choice)."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
    return select_decode_config(sh.family, device_arch(0), "bf16", sh.page, heads=heads, head_dim=sh.d, s_q=sh.s_q,
                                backend=backend, scale_mode=layout, scale_block_size=block)


def flashinfer_fp8(sh: Shape, q, qkv, bt, lens):
    """FlashInfer's FP8 decode on the same pages (per-tensor scales as floats)."""
    import flashinfer

    b, pages_per_seq = sh.b, bt.shape[1]
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    indptr = torch.arange(0, b + 1, dtype=torch.int32, device="cuda") * pages_per_seq
    indices = bt.reshape(-1).contiguous()
    last = torch.full((b,), sh.s_k - (pages_per_seq - 1) * sh.page, dtype=torch.int32, device="cuda")
    if sh.family == "mla_decode":
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
        qo_indptr = torch.arange(0, b + 1, dtype=torch.int32, device="cuda")
        w.plan(qo_indptr, indptr, indices, lens, sh.hq, 512, 64, sh.page, False, 1 / math.sqrt(576),
               torch.bfloat16, torch.float8_e4m3fn)
        qf = q.reshape(b, sh.hq, 576)
        q_nope, q_pe = qf[..., :512].contiguous(), qf[..., 512:].contiguous()
        split = [(k[..., :512].contiguous(), k[..., 512:].contiguous(), float(ks.item())) for k, _, ks, _ in qkv]
        return lambda i: w.run(q_nope, q_pe, split[i][0], split[i][1], ckv_scale=split[i][2], kpe_scale=split[i][2])
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, sh.hq, sh.hkv, sh.d, sh.page, q_data_type=torch.bfloat16,
           kv_data_type=torch.float8_e4m3fn)
    q3 = q[:, 0].contiguous()
    scales = [(float(ks.item()), float(vs.item())) for _, _, ks, vs in qkv]
    return lambda i: w.run(q3, (qkv[i][0], qkv[i][1]), k_scale=scales[i][0], v_scale=scales[i][1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--only", choices=("mla", "gqa"), help="one family's shapes")
    args = ap.parse_args()
    iters = 10 if args.quick else 30
    rounds = 2 if args.quick else 3
    ceil = ceilings()
    notes = []
    rows = []
    for sh in SHAPES:
        if args.only and not sh.family.startswith(args.only):
            continue
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, "per_tensor", None))))
        q, kv, bt, lens = make_inputs(sh, copies)
        calls = {"bf16": [lambda i=i: (kvforge.mla_decode(q, kv[i][0], bt, lens) if sh.family == "mla_decode"
                                       else kvforge.gqa_decode(q, kv[i][0], kv[i][1], bt, lens)) for i in range(copies)]}
        b16 = kv_bytes(sh, None, None)
        specs = []  # (key, row name, bytes, FlashInfer key or None)
        for layout, block in LAYOUTS:
            if layout == "fp8_ds_mla" and sh.family != "mla_decode":
                continue
            if layout == "block" and sh.family == "mla_decode" and block == 64 and sh.hq > 16:
                continue
            qkv = quantized(sh, kv, layout, block)
            nbytes = kv_bytes(sh, layout, block)
            name = layout if block is None else f"{layout} {block}"
            chosen_cfg = backend_config(sh, layout, block, None)
            chosen = chosen_cfg.backend
            key = f"{name} ({chosen}{', ' + chosen_cfg.fp8_convert if chosen == 'sm80' else ''})"
            fi_key = None
            if layout == "per_tensor" and not args.no_flashinfer:
                try:
                    fi = flashinfer_fp8(sh, q, qkv, bt, lens)
                    fi(0)
                    calls["flashinfer"] = [lambda i=i, fi=fi: fi(i) for i in range(copies)]
                    fi_key = "flashinfer"
                except Exception as e:  # noqa: BLE001
                    notes.append(f"- {sh.label}: FlashInfer FP8 failed: {type(e).__name__}: {str(e)[:160]}")
            calls[key] = [lambda i=i, e=qkv: run_fp8(sh, q, e[i], bt, lens) for i in range(copies)]
            specs.append((key, key, nbytes, fi_key))
            if sh.family == "mla_decode" and sh.hq * sh.s_q > 16:  # the other backend on the same inputs
                other = "sm80" if chosen == "sm90" else "sm90"
                cfg = backend_config(sh, layout, block, other)
                akey = f"{name} ({other}, A/B)"
            elif sh.family == "gqa_decode":  # the other dequantization path on the same inputs
                other = "ring" if chosen_cfg.fp8_convert == "registers" else "registers"
                cfg = convert_path_config(sh, layout, block, other)
                akey = f"{name} (sm80, {other}, A/B)"
            else:
                continue
            calls[akey] = [lambda i=i, e=qkv, c=cfg: run_fp8(sh, q, e[i], bt, lens, c) for i in range(copies)]
            specs.append((akey, akey, nbytes, fi_key))
        timed = interleaved_ms(calls, iters, rounds)
        base = timed["bf16"]
        rows.append((sh.label, "bf16", base, b16 / base / 1e6, 1.0, 1.0, float("nan"), float("nan"), float("nan")))
        for key, name, nbytes, fi_key in specs:
            ms, fi_ms = timed[key], timed[fi_key] if fi_key else float("nan")
            target = 0.9 * b16 / nbytes
            rows.append((sh.label, name, ms, nbytes / ms / 1e6, base / ms, target, fi_ms, fi_ms / ms, nbytes))
            print(f"{sh.label} {name}: {ms:.3f} ms ({base / ms:.2f}x bf16, target {target:.2f}x), "
                  f"FlashInfer fp8 {fi_ms:.3f}", file=sys.stderr, flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    lines = [f"Device: {torch.cuda.get_device_name()}. Streaming-read ceiling in this run: {ceil['read']:.0f} GB/s.",
             "", "| shape | KV | kvforge ms | GB/s | of read ceiling | speed-up over kvforge 16-bit | target "
             "| FlashInfer fp8 ms | FlashInfer/kvforge |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.0f} | {r[3] / ceil['read']:.0%} | {r[4]:.2f}x | "
                     f"{r[5]:.2f}x | {r[6]:.3f} | {r[7]:.2f}x |")
    lines += [""] + notes if notes else []
    emit("\n".join(lines), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
