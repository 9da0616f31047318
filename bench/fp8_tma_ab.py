"""A/B of the per-tensor fp8 GQA producers on sm_90: TMA boxes (kv_load='tma': one producer warp,
boxes of page rows x 128 bytes into 128-byte-swizzled fp8 tiles the consumers dequantize in
registers) at several tiles, ring depths and CTAs per SM, against the built-in choice (16-byte
cp.async per lane), kvforge's own 16-bit call and FlashInfer's FP8 decode.

    python bench/fp8_tma_ab.py [--rounds 3] [--no-flashinfer]

All variants of a shape are captured first (CUDA graphs, KV copies rotating past the L2), then
timed in rounds whose order rotates (bench.interleaved_ms); prints medians and ratios. Every fp8
variant's output is compared with the built-in fp8 choice's (relative L2).
"""
import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, Shape, ceilings, interleaved_ms, make_inputs, run_kvforge  # noqa: E402
from fp8 import flashinfer_fp8, kv_bytes, quantized, run_fp8  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import ConfigError, build  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402

SHAPES = [Shape("gqa_decode", 64, 8192, 32, 8, 128, page=16), Shape("gqa_decode", 1, 65536, 32, 8, 128, page=16),
          Shape("gqa_decode", 128, 4096, 64, 8, 128, page=64), Shape("gqa_decode", 64, 4096, 32, 8, 256, page=16)]


def variants(sh: Shape) -> dict:
    """{name: config}: the built-in fp8 choice first, then kv_load='tma' at each (keys per tile,
    column-group warps) with the deepest ring reaching 1, 2, 3 and 4 CTAs per SM."""
    arch = device_arch(0)
    kw = dict(heads=sh.hq // sh.hkv, head_dim=sh.d, s_q=sh.s_q, backend="sm80", scale_mode="per_tensor")
    base = select_decode_config("gqa_decode", arch, "bf16", sh.page, **kw)
    tma = select_decode_config("gqa_decode", arch, "bf16", sh.page, fp8_convert="registers", kv_load="tma", **kw)
    out = {f"built-in ({base.kv_load}) n{base.block_n} s{base.num_kv_stages} p{base.pipeline.num_producer} "
           f"c{base.pipeline.num_consumer} {base.ctas_per_sm}/SM": base}
    data = tma.model_dump(mode="json")
    for bn in (64, 128):
        for consumers in (2, 4):
            best = {}
            for stages in range(2, 9):
                try:
                    cfg = build(DecodeConfig, {**data, "block_n": bn,
                                               "pipeline": {**data["pipeline"], "num_kv_stages": stages,
                                                            "num_consumer": consumers}})
                except ConfigError:
                    continue
                best[cfg.ctas_per_sm] = cfg
            for ctas, cfg in sorted(best.items()):
                if ctas >= 2:  # one CTA per SM measured 10-40% slower at every shape (RESULTS.md)
                    out[f"tma n{bn} s{cfg.num_kv_stages} c{consumers} {ctas}/SM"] = cfg
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flashinfer", action="store_true")
    args = ap.parse_args()
    from concurrent.futures import ThreadPoolExecutor

    from kvforge.codegen.variant import Variant
    from kvforge.runtime import compile

    every = {c.model_dump_json(): c for sh in SHAPES for c in variants(sh).values()}
    with ThreadPoolExecutor(12) as ex:  # fill the compile cache in parallel before any timing
        list(ex.map(lambda c: compile(Variant(c)), every.values()))
    ceil = ceilings()
    print(f"Read ceiling in this run: {ceil['read']:.0f} GB/s")
    print("| shape | variant | ms | fp8 GB/s | of read ceiling | built-in / variant | 16-bit / variant | "
          "FlashInfer fp8 / variant | rel. L2 vs built-in |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sh in SHAPES:
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / kv_bytes(sh, "per_tensor", None))))
        q, kv, bt, lens = make_inputs(sh, copies)
        qkv = quantized(sh, kv, "per_tensor", None)
        cfgs = variants(sh)
        calls = {name: [lambda i=i, c=c: run_fp8(sh, q, qkv[i], bt, lens, c) for i in range(copies)]
                 for name, c in cfgs.items()}
        calls["16-bit (built-in)"] = [lambda i=i: run_kvforge(sh, q, *kv[i], bt, lens) for i in range(copies)]
        ref = run_fp8(sh, q, qkv[0], bt, lens, next(iter(cfgs.values()))).float()
        errs = {name: float((run_fp8(sh, q, qkv[0], bt, lens, c).float() - ref).norm() / ref.norm())
                for name, c in cfgs.items()}
        if not args.no_flashinfer:
            try:
                fi = flashinfer_fp8(sh, q, qkv, bt, lens)
                calls["FlashInfer fp8"] = [lambda i=i: fi(i) for i in range(copies)]
            except Exception as e:  # noqa: BLE001
                print(f"FlashInfer failed: {type(e).__name__}: {e}", file=sys.stderr)
        t = interleaved_ms(calls, 20, args.rounds)
        base = next(iter(cfgs))
        nbytes = kv_bytes(sh, "per_tensor", None)
        for name in calls:
            gbs = (sh.bytes() if name.startswith("16-bit") else nbytes) / t[name] / 1e6
            print(f"| {sh.label} | {name} | {t[name]:.4f} | {gbs:.0f} | {gbs / ceil['read']:.0%} | "
                  f"{t[base] / t[name]:.3f} | {t['16-bit (built-in)'] / t[name]:.3f} | "
                  f"{t.get('FlashInfer fp8', float('nan')) / t[name]:.3f} | {errs.get(name, float('nan')):.1e} |",
                  flush=True)
        del q, kv, qkv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
