"""A/B of the GQA producers on sm_90: TMA boxes (kv_load='tma': one producer warp, boxes of page
rows x 64 columns into 128-byte-swizzled tiles) against the built-in choice (cp.async.bulk per row
at D >= 128, 16-byte cp.async at D = 64) and FlashInfer, on every GQA shape of the benchmark.

    python bench/tma_ab.py [--rounds 3] [--no-flashinfer] [--occupancy]

All variants of a shape are captured first (CUDA graphs, KV copies rotating past the L2), then
timed in rounds whose order rotates (bench.interleaved_ms); prints medians and ratios. Every
variant's output is compared with the built-in choice's first (relative L2).
"""
import argparse
import math
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import L2_BYTES, SHAPES, ceilings, flashinfer_calls, interleaved_ms, make_inputs, run_kvforge  # noqa: E402

from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import ConfigError, build  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402


def variants(sh, occupancy: bool = False) -> dict:
    """{name: config}: the built-in choice first, then kv_load='tma' at the selector's tile and at
    deeper rings; with `occupancy`, also smaller footprints (tile x ring depth) reaching 3 and 4
    CTAs per SM, for both TMA and the built-in load."""
    arch = device_arch(0)
    base = select_decode_config("gqa_decode", arch, "bf16", sh.page, heads=sh.hq // sh.hkv, head_dim=sh.d,
                                s_q=sh.s_q, backend="sm80")
    tma = select_decode_config("gqa_decode", arch, "bf16", sh.page, heads=sh.hq // sh.hkv, head_dim=sh.d,
                               s_q=sh.s_q, backend="sm80", kv_load="tma")
    out = {f"default ({base.kv_load}) n{base.block_n} s{base.num_kv_stages} {base.ctas_per_sm}/SM": base,
           f"tma n{tma.block_n} s{tma.num_kv_stages} {tma.ctas_per_sm}/SM": tma}

    def alt(cfg, **fields):
        data = cfg.model_dump(mode="json")
        pipe = {**data["pipeline"], **{k: v for k, v in fields.items() if k in ("num_kv_stages", "num_producer")}}
        try:
            return build(DecodeConfig, {**data, **{k: v for k, v in fields.items() if k == "block_n"},
                                        "pipeline": pipe})
        except ConfigError:
            return None

    for stages in () if occupancy else (tma.num_kv_stages + 1, tma.num_kv_stages + 2):
        cfg = alt(tma, num_kv_stages=stages)
        if cfg is not None:
            out[f"tma n{cfg.block_n} s{stages} {cfg.ctas_per_sm}/SM"] = cfg
    if occupancy:
        for kind, start in (("tma", tma), (base.kv_load, base)):
            for bn in (32, 64):
                best = {}  # CTAs per SM -> the deepest ring reaching it
                for stages in range(2, 9):
                    cfg = alt(start, block_n=bn, num_kv_stages=stages)
                    if cfg is not None and cfg.ctas_per_sm >= 3:
                        best[cfg.ctas_per_sm] = cfg
                for ctas, cfg in sorted(best.items()):
                    out[f"{kind} n{bn} s{cfg.num_kv_stages} {ctas}/SM"] = cfg
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--occupancy", action="store_true", help="also 3 and 4 CTAs per SM (smaller tiles or rings)")
    args = ap.parse_args()
    ceil = ceilings()
    print(f"Read ceiling in this run: {ceil['read']:.0f} GB/s")
    print("| shape | variant | ms | GB/s | of read ceiling | default / variant | FlashInfer / variant | rel. L2 vs default |")
    print("|---|---|---|---|---|---|---|---|")
    for sh in SHAPES:
        if sh.family != "gqa_decode":
            continue
        copies = max(1, min(8, math.ceil(3 * L2_BYTES / sh.bytes())))
        q, kv, bt, lens = make_inputs(sh, copies)
        cfgs = variants(sh, args.occupancy)
        calls = {name: [lambda i=i, c=c: run_kvforge(sh, q, *kv[i], bt, lens, c) for i in range(copies)]
                 for name, c in cfgs.items()}
        ref = run_kvforge(sh, q, *kv[0], bt, lens, next(iter(cfgs.values()))).float()
        errs = {name: float((run_kvforge(sh, q, *kv[0], bt, lens, c).float() - ref).norm() / ref.norm())
                for name, c in cfgs.items()}
        if not args.no_flashinfer:
            calls.update(flashinfer_calls(sh, q, kv, bt, lens, copies))
        t = interleaved_ms(calls, 20, args.rounds)
        base = next(iter(cfgs))
        for name in calls:
            gbs = sh.bytes() / t[name] / 1e6
            print(f"| {sh.label} | {name} | {t[name]:.4f} | {gbs:.0f} | {gbs / ceil['read']:.0%} | "
                  f"{t[base] / t[name]:.3f} | {t.get('FlashInfer', float('nan')) / t[name]:.3f} | "
                  f"{errs.get(name, float('nan')):.1e} |", flush=True)
        del q, kv, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
