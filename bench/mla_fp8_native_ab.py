"""Prototype A/B (issue 9): 16-row MLA decode on per-tensor fp8 KV by fp8 wgmma with keys as M (no conversion of
the cache; bench/proto/mla_fp8_keys_m.cu) against kvforge's built-in fp8 call (the sm80 kernel, dequantizing in
registers) and its 16-bit call, on the same paged inputs.

    python bench/mla_fp8_native_ab.py [--rounds 3] [--stages 4] [--check-only]

Correctness first: the prototype's output against a float64 reference on the dequantized cache (ragged lengths,
pages shuffled) and against the built-in fp8 call; then bench.py's method (graph replays, KV copies rotating past
the L2, variants captured together and timed in rounds of rotating order, median per call).
The prototype covers s_q = 1, <= 16 heads, unsplit launches, per-tensor scales read on the host.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import pathlib
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import kvforge  # noqa: E402
from bench import Shape, interleaved_ms, kv_copies, make_inputs  # noqa: E402

from kvforge.codegen.decode import paged_map_geometry  # noqa: E402
from kvforge.runtime.compiler import compile_source  # noqa: E402
from kvforge.runtime.launch import load  # noqa: E402
from kvforge.runtime.tensor_map import encode_paged_kv  # noqa: E402

SOURCE = pathlib.Path(__file__).with_name("proto") / "mla_fp8_keys_m.cu"
SYMBOL = "mla_fp8_keys_m"
VARIANTS = ((2, 2, 4), (2, 1, 4), (1, 2, 4), (2, 2, 2))  # (math warpgroups, QK chains, ring stages) timed
ABLATIONS = ("KF_ABL_NO_LOADS", "KF_ABL_NO_PV", "KF_EAGER_RESCALE")  # 2 warpgroups, 2 chains, 4 stages


def smem_bytes(stages: int, wgs: int) -> int:
    """The kernel's layout: Q^T, per warpgroup P^T (4 KB) and reductions (1 KB), stats, scales, the ring, its
    barriers, 1 KB to align the base."""
    kv = (20480 + wgs * 5120 + 256 + 64 + 1023) // 1024 * 1024
    return kv + stages * 5 * 64 * 128 + 2 * stages * 8 + 1024


class Proto:
    def __init__(self, page: int, stages: int, heads: int, debug: bool = False, wgs: int = 2, qkc: int = 2,
                 defines: tuple[str, ...] = ()):
        src = ("".join(f"#define {d}\n" for d in defines) +f"#define KF_PAGE {page}\n#define KF_STAGES {stages}\n#define KF_HEADS {heads}\n#define KF_WGS {wgs}\n"
               f"#define KF_QKC {qkc}\n" + SOURCE.read_text())
        self.compiled = compile_source(SYMBOL, "sm_90a", src, debug=debug)
        self.smem = smem_bytes(stages, wgs)
        self.threads = 128 * wgs + 32
        self.kernel = load(self.compiled, SYMBOL, self.smem)
        self.page, self.heads = page, heads
        print(f"  prototype p{page} s{stages} h{heads} wg{wgs} qkc{qkc}: {self.compiled.resources}", flush=True)

    def call(self, q, kv8, kv_scale: float, bt, lens, out, softmax_scale: float):
        from cuda.bindings import driver

        geometry = paged_map_geometry("fp8_e4m3", 576, self.page, min(self.page, 64), per_kv_head=False)
        tmap = encode_paged_kv(kv8.data_ptr(), kv8.shape[0], geometry)
        slots = [(ctypes.c_uint8 * 128).from_buffer_copy(tmap), ctypes.c_uint64(q.data_ptr()),
                 ctypes.c_uint64(out.data_ptr()), ctypes.c_uint64(bt.data_ptr()), ctypes.c_uint64(lens.data_ptr()),
                 ctypes.c_int32(bt.shape[1]), ctypes.c_float(softmax_scale * kv_scale * math.log2(math.e)),
                 ctypes.c_float(kv_scale)]
        argv = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(s) for s in slots])
        stream = torch.cuda.current_stream().cuda_stream
        (err,) = driver.cuLaunchKernel(self.kernel.function, q.shape[0], 1, 1, self.threads, 1, 1, self.smem, stream,
                                       ctypes.addressof(argv), 0)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        self._keep = (slots, argv)  # the driver copies the parameters at the launch; keep them to be safe


def reference(q, kv, lens, bt, scale):
    """float64 MLA decode on a (dequantized) cache [pages, page, 576], s_q = 1."""
    b, _, h, _ = q.shape
    page = kv.shape[1]
    out = torch.empty((b, h, 512), dtype=torch.float64, device=q.device)
    for i in range(b):
        n = int(lens[i])
        pages = bt[i, : math.ceil(n / page)].long()
        keys = kv[pages].reshape(-1, 576)[:n].double()
        s = (q[i, 0].double() @ keys.T) * scale
        p = torch.softmax(s, dim=-1)
        out[i] = p @ keys[:, :512]
    return out


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def check(page: int, stages: int, heads: int, wgs: int = 2) -> bool:
    g = torch.Generator(device="cuda").manual_seed(1)
    b, max_len = 6, 1000
    lens = torch.tensor([1000, 1, 63, 64, 65, 517], dtype=torch.int32, device="cuda")
    pages_per = math.ceil(max_len / page)
    num_pages = b * pages_per + 3
    kv = torch.randn((num_pages, page, 576), device="cuda", dtype=torch.bfloat16, generator=g)
    kv8, ks = kvforge.quantize_kv(kv, "per_tensor")
    # NaN bytes in every page row past the lengths: masked keys must not reach the output
    bt = torch.randperm(num_pages, device="cuda", generator=g)[: b * pages_per].to(torch.int32).reshape(b, pages_per)
    kv8u = kv8.view(torch.uint8)
    for i in range(b):
        n = int(lens[i])
        if n % page:
            kv8u[int(bt[i, n // page]), n % page:] = 0x7F
    q = torch.randn((b, 1, heads, 576), device="cuda", dtype=torch.bfloat16, generator=g) * 2
    scale = 1 / math.sqrt(576)
    deq = kvforge.dequantize_kv(kv8, ks)
    deq = torch.nan_to_num(deq, nan=0.0)
    ref = reference(q, deq, lens, bt, scale)
    p = Proto(page, stages, heads, debug=True, wgs=wgs)
    out = torch.full((b, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    p.call(q, kv8, float(ks), bt, lens, out, scale)
    torch.cuda.synchronize()
    built = kvforge.mla_decode(q, kv8, bt, lens, kv_scale=ks)[0].reshape(b, heads, 512)
    ok = True
    for i in range(b):
        e = rel(out[i], ref[i])
        eb = rel(built[i], ref[i])
        good = e <= 1e-2 and torch.isfinite(out[i]).all().item()
        ok &= good
        print(f"  check p{page} h{heads} len {int(lens[i])}: prototype rel L2 {e:.2e}, built-in fp8 {eb:.2e}"
              f"{'' if good else '  FAIL'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stages", default="4", help="ring depth of the checked build")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--ablate", action="store_true", help="also time measurement-only builds: no KV loads, no PV "
                    "(outputs then wrong; times only), and the output rescaled every tile (KF_EAGER_RESCALE)")
    ap.add_argument("--one-call", action="store_true", help="one eager call of the built-in prototype at b=128 "
                    "s_k=4096 h=16 and nothing else (for Nsight Compute: -k regex:mla_fp8_keys_m)")
    args = ap.parse_args()
    stages = [int(s) for s in args.stages.split(",")]
    if args.one_call:
        sh = Shape("mla_decode", 128, 4096, 16)
        q, kv, bt, lens = make_inputs(sh, 1)
        k8, ks = kvforge.quantize_kv(kv[0][0], "per_tensor")
        out = torch.empty((sh.b, 16, 512), dtype=torch.bfloat16, device="cuda")
        Proto(64, 4, 16).call(q, k8, float(ks), bt, lens, out, 1 / math.sqrt(576))
        torch.cuda.synchronize()
        return 0
    ok = all(check(page, stages[0], h, w) for page, h in ((64, 16), (16, 16), (128, 8)) for w in (1, 2))
    print("checks:", "passed" if ok else "FAILED", flush=True)
    if not ok or args.check_only:
        return 0 if ok else 1
    for b, s_k in ((128, 4096),):
        sh = Shape("mla_decode", b, s_k, 16)
        copies = kv_copies(sh.b * sh.s_k * 576)
        q, kv, bt, lens = make_inputs(sh, copies)
        q8 = [kvforge.quantize_kv(k, "per_tensor") for k, _ in kv]
        q8 = [(k8, ks, float(ks)) for k8, ks in q8]  # the host scale read before any capture
        scale = 1 / math.sqrt(576)
        protos = {f"wg{w} qkc{c} s{s}": Proto(64, s, 16, wgs=w, qkc=c) for w, c, s in VARIANTS}
        if args.ablate:
            for d in ABLATIONS:
                protos[d] = Proto(64, 4, 16, defines=(d,))
        outs = {s: torch.empty((b, 16, 512), dtype=torch.bfloat16, device="cuda") for s in protos}
        variants = {
            "16-bit built-in": [lambda k=k: kvforge.mla_decode(q, k, bt, lens, max_seq_len=s_k) for k, _ in kv],
            "fp8 built-in": [lambda e=e: kvforge.mla_decode(q, e[0], bt, lens, kv_scale=e[1], max_seq_len=s_k)
                             for e in q8],
        }
        for s, p in protos.items():
            variants[f"fp8 keys-as-M {s}"] = [lambda e=e, p=p, s=s: p.call(q, e[0], e[2], bt, lens, outs[s], scale)
                                               for e in q8]
        built = kvforge.mla_decode(q, q8[0][0], bt, lens, kv_scale=q8[0][1])[0].reshape(b, 16, 512)
        for s, p in protos.items():
            if s in ABLATIONS:
                continue
            p.call(q, q8[0][0], q8[0][2], bt, lens, outs[s], scale)
            torch.cuda.synchronize()
            print(f"  {sh.label}: {s} vs built-in fp8 rel L2 {rel(outs[s], built):.2e}", flush=True)
        ms = interleaved_ms(variants, rounds=args.rounds)
        base16 = ms["16-bit built-in"]
        print(f"| {sh.label} | " + " | ".join(f"{n} {t:.4f} ms ({base16 / t:.2f}x of 16-bit)" for n, t in ms.items())
              + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
