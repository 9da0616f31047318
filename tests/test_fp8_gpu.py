"""FP8 (e4m3) KV caches on the GPU, every layout against a float64 reference computed on the
dequantized cache: per-tensor scales (a float or a 1-element device tensor), block scales (32, 64,
128), and MLA's packed fp8_ds_mla token; both families, page sizes, lengths 0/1/ragged, s_q up to
4 with the causal rule, split and unsplit, NaN in every byte the kernel must not read (fp8 NaN
0x7f/0xff in unused pages and past each sequence's end, NaN block scales there), poisoned outputs,
and graph capture with a device-tensor scale changed between replays. Each check also reports
the error against the original 16-bit cache (what quantization costs)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest


from paged_inputs import assert_matches, make_case, reference, rel_l2

pytestmark = pytest.mark.gpu
TOL = 1e-2          # against the reference on the dequantized cache
QUANT_TOL = 0.15    # against the original 16-bit cache: e4m3 keeps 3 mantissa bits


@dataclass
class Fp8Case:
    base: object      # the PagedCase (q, block table, lengths; its k/v are the 16-bit originals)
    k: object         # device fp8 cache (MLA: the latent cache, float8_e4m3fn or packed uint8)
    v: object
    k_scale: object   # float, 1-element tensor, block-scale tensor, or None (fp8_ds_mla)
    v_scale: object
    deq_k: np.ndarray  # float64 dequantized caches as the reference reads them [P, ps, Hkv, D]
    deq_v: np.ndarray


def _quantize(t, layout, block):
    import torch

    import kvforge

    clean = torch.nan_to_num(t, nan=0.0)
    nan_tokens = torch.isnan(t.float()).any(dim=-1)  # unused pages and slots past each sequence's end
    data, scales = kvforge.quantize_kv(clean, layout, block)
    deq = kvforge.dequantize_kv(data, scales).double().cpu().numpy()
    if layout == "fp8_ds_mla":
        data[nan_tokens] = 0xFF  # NaN latent, NaN scales, NaN rope
    else:
        data.view(torch.uint8)[nan_tokens] = 0x7F  # e4m3fn NaN
        if layout == "block":
            scales[nan_tokens] = float("nan")
    return data, scales, deq


def make_fp8_case(family, layout, *, block=None, scale_as="tensor", **kw) -> Fp8Case:
    base = make_case(family, **kw)
    k, ks, deq_k = _quantize(base.k, layout, block)
    if family == "mla_decode":
        v, vs, deq_v = k, ks, deq_k
        deq_k = deq_k.reshape(deq_k.shape[0], deq_k.shape[1], 1, -1)
        deq_v = deq_k
    else:
        v, vs, deq_v = _quantize(base.v, layout, block)
    if layout == "per_tensor" and scale_as == "float":
        ks, vs = float(ks.item()), float(vs.item())
    return Fp8Case(base, k, v, ks, vs, deq_k, deq_v)


def _run(family, c: Fp8Case, *, causal=False, out=None, lse=None, config=None, scale=None):
    import kvforge

    b = c.base
    if family == "mla_decode":
        return kvforge.mla_decode(b.q, c.k, b.block_table, b.seqlens, causal=causal, kv_scale=c.k_scale, out=out,
                                  lse=lse, config=config, softmax_scale=scale)
    return kvforge.gqa_decode(b.q, c.k, c.v, b.block_table, b.seqlens, causal=causal, k_scale=c.k_scale,
                              v_scale=c.v_scale, out=out, lse=lse, config=config)


def _poisoned(c: Fp8Case, family):
    import torch

    bsz, s_q, hq, _ = c.base.q.shape
    dv = 512 if family == "mla_decode" else c.base.q.shape[-1]
    out = torch.full((bsz, s_q, hq, dv), float("nan"), dtype=c.base.q.dtype, device="cuda")
    lse = torch.full((bsz, hq, s_q), float("nan"), dtype=torch.float32, device="cuda")
    return out, lse


def _check(family, c: Fp8Case, out, lse, *, causal):
    import torch

    torch.cuda.synchronize()
    h = c.base.host
    want_o, want_l = reference(family, h, causal=causal, k=c.deq_k, v=c.deq_v)
    err = assert_matches(out, lse, want_o, want_l, tol=TOL, what="against the dequantized cache")
    orig_o, _ = reference(family, h, causal=causal)
    q_err = rel_l2(out.float().cpu().numpy(), orig_o)
    print(f"fp8 error: {err:.2e} vs the dequantized cache, {q_err:.2e} vs the original 16-bit cache")
    assert q_err < QUANT_TOL, f"relative L2 error {q_err:.2e} against the original cache: quantization broken"
    return err


LAYOUTS = [("per_tensor", None, "tensor"), ("per_tensor", None, "float"), ("block", 32, "tensor"),
           ("block", 64, "tensor"), ("block", 128, "tensor")]
LENS_RAGGED = [0, 1, 17, 64, 200, 1000, 333, 2]


@pytest.mark.parametrize("layout,block,scale_as", LAYOUTS + [("fp8_ds_mla", None, "tensor")])
@pytest.mark.parametrize("page_size", [16, 64])
def test_mla_fp8_layouts_ragged(layout, block, scale_as, page_size):
    c = make_fp8_case("mla_decode", layout, block=block, scale_as=scale_as, batch=8, s_q=1, hq=16, hkv=1, d=576,
                      page_size=page_size, lens=LENS_RAGGED, seed=page_size)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, out=out, lse=lse)
    _check("mla_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("backend", ["sm80", "sm90"])
@pytest.mark.parametrize("layout,block,scale_as", LAYOUTS + [("fp8_ds_mla", None, "tensor")])
@pytest.mark.parametrize("page_size", [16, 128])
def test_mla_fp8_64_heads_on_each_backend(backend, layout, block, scale_as, page_size):
    """The same 64-head cases pinned to each backend: sm80's convert warps and sm90's built-in fp8
    staging (sm_90 devices only)."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    arch = device_arch(0)
    if backend == "sm90" and arch != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this one is {arch}")
    cfg = select_decode_config("mla_decode", arch, "bf16", page_size, heads=64, head_dim=576, s_q=1, backend=backend,
                               scale_mode=layout, scale_block_size=block)
    assert cfg.backend == backend
    c = make_fp8_case("mla_decode", layout, block=block, scale_as=scale_as, batch=8, s_q=1, hq=64, hkv=1, d=576,
                      page_size=page_size, lens=LENS_RAGGED, seed=page_size + 1)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=False)


SM90_STAGINGS = [(staging, layout, block) for staging in ("registers", "fp8_ring")
                 for layout, block in (("per_tensor", None), ("block", 32), ("block", 128), ("fp8_ds_mla", None))]
SM90_STAGINGS += [("slot", "per_tensor", None)]  # the seesaw's in-slot conversion: per-tensor scales only


@pytest.mark.parametrize("staging,layout,block", SM90_STAGINGS)
@pytest.mark.parametrize("heads,s_q,page_size,lens", [
    (64, 1, 16, LENS_RAGGED),                       # ragged, lengths 0 and 1, tiles spanning 4 pages
    (32, 2, 128, [1, 130, 64, 5]),                  # causal s_q = 2, half-page tiles
    (128, 1, 64, [9000]),                           # one long sequence: split, two head blocks
    (64, 4, 32, [3, 300, 65, 128]),                 # causal s_q = 4, 16 heads per CTA
])
def test_mla_fp8_sm90_each_staging(staging, layout, block, heads, s_q, page_size, lens):
    """The sm90 MLA kernel pinned to each way of staging fp8 tiles: the producer warpgroup's
    registers into the 16-bit ring, the fp8 ring converted by the math warpgroups (both under the
    lockstep schedule), or TMA into the 16-bit slot converted there (the seesaw) (sm_90 only)."""
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this one is {device_arch(0)}")
    kv = {"kv_dtype": "fp8_e4m3", "scale_mode": layout, "scale_block_size": block}
    schedule = "seesaw" if staging == "slot" else "lockstep"
    cfg = sm90_choice("mla_decode", "bf16", page_size, s_q, kv, fp8_staging=staging)
    assert cfg.fp8_staging == staging and cfg.backend == "sm90" and cfg.schedule == schedule
    c = make_fp8_case("mla_decode", layout, block=block, batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=page_size, lens=lens, seed=heads + s_q + page_size)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("heads,lens", [(128, [0, 1, 333, 4100]), (64, [9000])])
def test_mla_fp8_sm90_slot_with_l2_prefetch(heads, lens):
    """The seesaw's in-slot fp8 conversion with l2_prefetch_tiles=2: each sub-stage producer also prefetches
    its fp8 columns of the tile two ahead into L2 (sm_90 only)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this one is {device_arch(0)}")
    kv = {"kv_dtype": "fp8_e4m3", "scale_mode": "per_tensor", "scale_block_size": None}
    base = sm90_choice("mla_decode", "bf16", 64, 1, kv, fp8_staging="slot")
    cfg = build(DecodeConfig, {**base.model_dump(mode="json"), "l2_prefetch_tiles": 2})
    c = make_fp8_case("mla_decode", "per_tensor", block=None, batch=len(lens), s_q=1, hq=heads, hkv=1, d=576,
                      page_size=64, lens=lens, seed=heads + 7)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=False, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("heads,s_q,page_size,lens", [
    (64, 1, 16, LENS_RAGGED),                       # ragged, lengths 0 and 1, tiles spanning 4 pages
    (128, 1, 64, [0, 1, 333, 4100, 65]),            # two head blocks, one- and many-tile sequences
    (32, 2, 128, [1, 130, 64, 5]),                  # causal s_q = 2, half-page boxes
    (64, 1, 64, [9000]),                            # one long sequence: split
])
def test_mla_fp8_sm90_slot_loads_ahead(heads, s_q, page_size, lens):
    """fp8_slot_loads_ahead: each sub-stage's first producer thread issues tile t + 1's boxes as soon as its slot
    frees while tile t is landing, and the next iteration skips that tile's wait and loads (sm_90 only)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this one is {device_arch(0)}")
    kv = {"kv_dtype": "fp8_e4m3", "scale_mode": "per_tensor", "scale_block_size": None}
    base = sm90_choice("mla_decode", "bf16", page_size, s_q, kv, fp8_staging="slot")
    cfg = build(DecodeConfig, {**base.model_dump(mode="json"), "fp8_slot_loads_ahead": True})
    assert cfg.converts_in_slot and cfg.seesaw
    c = make_fp8_case("mla_decode", "per_tensor", block=None, batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=page_size, lens=lens, seed=heads + s_q + page_size + 11)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize("staging", ["registers", "slot"])
@pytest.mark.parametrize("heads,s_q,lens", [(64, 1, LENS_RAGGED), (128, 1, [9000])])
def test_mla_fp8_sm90_lazy_rescale(lazy, staging, heads, s_q, lens):
    """lazy_rescale (the sm90 default) and the eager rescale on the per-tensor fp8 sm90 kernels (the
    lockstep with the producers' registers, the seesaw with the in-slot conversion): P up to 2^8 in fp16,
    a logit scale of 0.3 so maxima move by more and less than the slack (sm_90 only)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this one is {device_arch(0)}")
    import torch

    kv = {"kv_dtype": "fp8_e4m3", "scale_mode": "per_tensor", "scale_block_size": None}
    base = sm90_choice("mla_decode", "bf16", 64, s_q, kv, fp8_staging=staging)
    cfg = build(DecodeConfig, {**base.model_dump(mode="json"), "lazy_rescale": lazy})
    c = make_fp8_case("mla_decode", "per_tensor", block=None, batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=64, lens=lens, seed=heads + 7)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg, scale=0.3)
    torch.cuda.synchronize()
    # against the dequantized cache only: at 7x the default logits the quantization error itself grows
    want_o, want_l = reference("mla_decode", c.base.host, causal=s_q > 1, k=c.deq_k, v=c.deq_v, scale=0.3)
    assert_matches(out, lse, want_o, want_l, tol=TOL, what="against the dequantized cache")


@pytest.mark.parametrize("family,heads,d", [("mla_decode", 16, 576), ("gqa_decode", 4, 128)])
def test_fp8_sm80_register_path_lazy_rescale(family, heads, d):
    """lazy_rescale on the sm80 register path for per-tensor fp8 (P up to 2^8 in fp16), logits at a
    scale of 0.3 (maxima moving by more and less than the slack), ragged lengths, a split sequence."""
    import torch
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    arch = device_arch(0)
    base = select_decode_config(family, arch, "bf16", 64, heads=heads, head_dim=d, s_q=1, backend="sm80",
                                scale_mode="per_tensor", fp8_convert="registers")
    cfg = build(DecodeConfig, {**base.model_dump(mode="json"), "lazy_rescale": True})
    hkv = 1 if family == "mla_decode" else 2
    c = make_fp8_case(family, "per_tensor", block=None, batch=len(LENS_RAGGED) + 1, s_q=1, hq=heads * hkv, hkv=hkv,
                      d=d, page_size=64, lens=LENS_RAGGED + [9000], seed=heads + 9)
    out, lse = _poisoned(c, family)
    import kvforge

    b = c.base
    if family == "mla_decode":
        kvforge.mla_decode(b.q, c.k, b.block_table, b.seqlens, kv_scale=c.k_scale, softmax_scale=0.3, out=out,
                           lse=lse, config=cfg)
    else:
        kvforge.gqa_decode(b.q, c.k, c.v, b.block_table, b.seqlens, k_scale=c.k_scale, v_scale=c.v_scale,
                           softmax_scale=0.3, out=out, lse=lse, config=cfg)
    torch.cuda.synchronize()
    want_o, want_l = reference(family, b.host, causal=False, k=c.deq_k, v=c.deq_v, scale=0.3)
    assert_matches(out, lse, want_o, want_l, tol=TOL, what="against the dequantized cache")


def test_mla_fp8_sm90_staging_follows_the_split_plan():
    """On sm_90 a per-tensor fp8 MLA launch that fills the GPU without cutting sequences runs the seesaw
    with the in-slot conversion, a split launch the lockstep with the producers' registers: chosen per
    call (function API) and per run (plan object loads both); every result checked."""
    import kvforge
    from kvforge.runtime.decode import select_config
    from kvforge.runtime.device import device_arch, sm_count
    from kvforge.runtime.kv_format import KVFormat
    from kvforge.runtime.select import sm90_sequences_split

    if device_arch(0) != "sm_90":
        pytest.skip("the sm90 backend runs on sm_90 devices")
    fmt = KVFormat("fp8_e4m3", "per_tensor")
    big = next(b for b in range(1, 512) if not sm90_sequences_split(b, 64, 1, sm_count(0)))
    chosen = {b: select_config("mla_decode", "bf16", 16, 64, 576, 1, 0, fmt, b) for b in (big, big - 1)}
    assert {b: (c.schedule, c.fp8_staging) for b, c in chosen.items()} == {
        big: ("seesaw", "slot"), big - 1: ("lockstep", "registers")}
    dec = kvforge.MLADecode(64, 16, "bf16", max_batch=big, fp8_layout="per_tensor")
    for batch in (big, 5):
        lens = [(53 * i) % 900 + (i % 2) for i in range(batch)]  # 0 .. 900 keys, ragged, 16-key pages
        c = make_fp8_case("mla_decode", "per_tensor", batch=batch, s_q=1, hq=64, hkv=1, d=576, page_size=16,
                          lens=lens, seed=batch)
        out, lse = _poisoned(c, "mla_decode")
        _run("mla_decode", c, out=out, lse=lse)
        _check("mla_decode", c, out, lse, causal=False)
        out, lse = _poisoned(c, "mla_decode")
        dec.run(c.base.q, c.k, c.base.block_table, c.base.seqlens, kv_scale=c.k_scale, out=out, lse=lse)
        _check("mla_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("path", ["ring", "registers"])
@pytest.mark.parametrize("heads,s_q,page_size,dtype", [(16, 1, 64, "bf16"), (16, 2, 32, "bf16"), (8, 1, 16, "fp16"),
                                                       (16, 1, 128, "bf16"), (4, 4, 64, "bf16")])
def test_mla_fp8_per_tensor_on_each_dequantization_path(path, heads, s_q, page_size, dtype):
    """Per-tensor MLA on the sm80 backend pinned to each dequantization path: convert warps, or the
    consumers' registers (depth-split QK on the k-permuted fp8 K, PV on the first 512 columns)."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    cfg = select_decode_config("mla_decode", device_arch(0), dtype, page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80", scale_mode="per_tensor", fp8_convert=path)
    assert cfg.fp8_convert == path
    lens = LENS_RAGGED if s_q == 1 else [s_q, 300, 1, 77, s_q - 1]
    c = make_fp8_case("mla_decode", "per_tensor", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=page_size, lens=lens, dtype=dtype, seed=heads + s_q + page_size)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("heads,s_q,page_size,dtype,producers,stages", [
    (16, 1, 64, "bf16", 1, 3), (16, 2, 32, "bf16", 2, 2), (8, 1, 16, "fp16", 1, 4), (16, 1, 128, "bf16", 4, 3),
    (4, 4, 64, "bf16", 1, 2)])
def test_mla_fp8_per_tensor_rows_by_bulk_copy(heads, s_q, page_size, dtype, producers, stages):
    """kv_load='bulk' for per-tensor MLA on the register path (sm_90): one cp.async.bulk per 576-byte
    token into rows padded to 592 bytes, stale V rows past the end zeroed by the producers (the
    cache holds fp8 NaN there); ragged lengths, a split sequence, 1-4 producer warps, 2-4 stages."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    if device_arch(0) not in ("sm_90", "sm_100a"):
        pytest.skip(f"kv_load='bulk' needs sm_90 or newer; this device is {device_arch(0)}")
    cfg = select_decode_config("mla_decode", device_arch(0), dtype, page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80", scale_mode="per_tensor", fp8_convert="registers", kv_load="bulk")
    data = cfg.model_dump(mode="json")
    cfg = build(DecodeConfig, {**data, "pipeline": {**data["pipeline"], "num_producer": producers,
                                                    "num_kv_stages": stages}})
    assert cfg.kv_load == "bulk" and cfg.fp8_bulk_rows and cfg.kv8_row_stride == 592
    lens = LENS_RAGGED + [3000] if s_q == 1 else [s_q, 300, 1, 77, s_q - 1, 2500]
    c = make_fp8_case("mla_decode", "per_tensor", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=page_size, lens=lens, dtype=dtype, seed=heads + s_q + page_size + producers)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("layout,block", [("block", 32), ("block", 64), ("block", 128), ("fp8_ds_mla", None)])
@pytest.mark.parametrize("kv_load", ["bulk", "cp_async"])
@pytest.mark.parametrize("block_p", ["fp32", "scaled"])
@pytest.mark.parametrize("heads,s_q,page_size,dtype,factor", [(16, 1, 64, "bf16", 1.0), (8, 2, 16, "fp16", 50.0),
                                                              (4, 2, 128, "bf16", 1e-3)])
def test_mla_fp8_block_scales_dequantized_in_registers(layout, block, kv_load, block_p, heads, s_q, page_size, dtype,
                                                       factor):
    """Block-scaled and packed MLA on the sm80 register path (16 query rows): the depth-split QK's
    interleaved k16 steps, each scale block's partial S times its keys' scales, the packed token's
    bf16 rope added unscaled, P x V scale / C per V block. Rows by bulk copy (block scales through
    the producer lanes, zeros past the end) or 16-byte cp.async; ragged lengths with 0 and 1, a split
    sequence, NaN in every cache byte (and scale) past each end, the cache scaled by `factor` before
    quantizing (scales far from 1). P in fp32 scaled at PV, or one prescaled 16-bit P tile per V block
    (`fp8_block_p`)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import ConfigError, build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    arch = device_arch(0)
    if kv_load == "bulk" and arch not in ("sm_90", "sm_100a"):
        pytest.skip(f"kv_load='bulk' needs sm_90 or newer; this device is {arch}")
    cfg = select_decode_config("mla_decode", arch, dtype, page_size, heads=heads, head_dim=576, s_q=s_q,
                               backend="sm80", scale_mode=layout, scale_block_size=block, fp8_convert="registers")
    try:
        cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "kv_load": kv_load, "fp8_block_p": block_p})
    except ConfigError as err:  # one P tile per V block: 4-8 tiles of 32 query rows outgrow shared memory
        if block_p == "scaled" and "shared memory" in str(err):
            pytest.skip(f"prescaled P does not fit this CTA: {err}")
        raise
    assert cfg.register_block_scales and cfg.qk_steps_interleaved and cfg.v_scale_normalized
    assert cfg.p_prescaled == (block_p == "scaled")
    lens = [s_q, 1, 3000, 77 + s_q, 4 * cfg.block_n, 0 if s_q == 1 else s_q + 5]
    base = make_case("mla_decode", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576, page_size=page_size,
                     lens=lens, dtype=dtype, seed=heads + s_q + page_size + (block or 7))
    base.k.mul_(factor)
    k, ks, deq = _quantize(base.k, layout, block)
    deq = deq.reshape(deq.shape[0], deq.shape[1], 1, -1)
    c = Fp8Case(base, k, k, ks, ks, deq, deq)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    import torch

    torch.cuda.synchronize()
    want_o, want_l = reference("mla_decode", base.host, causal=s_q > 1, k=deq, v=deq)
    assert_matches(out, lse, want_o, want_l, tol=TOL, what=f"cache x {factor}, against the dequantized cache")


@pytest.mark.parametrize("layout,block", [("per_tensor", None), ("block", 64), ("fp8_ds_mla", None)])
@pytest.mark.parametrize("heads,s_q,page_size", [(16, 2, 32), (64, 1, 128), (32, 4, 16), (128, 1, 64)])
def test_mla_fp8_heads_and_causal_queries(layout, block, heads, s_q, page_size):
    c = make_fp8_case("mla_decode", layout, block=block, batch=4, s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=page_size, lens=[s_q - 1, 40, 1, 257], seed=heads + s_q)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("layout,block", [("per_tensor", None), ("block", 128), ("fp8_ds_mla", None)])
def test_mla_fp8_one_long_sequence_is_split(layout, block):
    c = make_fp8_case("mla_decode", layout, block=block, batch=1, s_q=1, hq=16, hkv=1, d=576, page_size=64,
                      lens=[9000], seed=3)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, out=out, lse=lse)
    _check("mla_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("layout,block,scale_as", LAYOUTS)
@pytest.mark.parametrize("d,hq,hkv,page_size", [(128, 32, 8, 16), (64, 8, 8, 32), (256, 16, 2, 64),
                                                (128, 16, 1, 128)])
def test_gqa_fp8_layouts(layout, block, scale_as, d, hq, hkv, page_size):
    c = make_fp8_case("gqa_decode", layout, block=block, scale_as=scale_as, batch=8, s_q=1, hq=hq, hkv=hkv, d=d,
                      page_size=page_size, lens=LENS_RAGGED, seed=d + hq)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, out=out, lse=lse)
    _check("gqa_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("path", ["ring", "registers"])
@pytest.mark.parametrize("layout,block", [("per_tensor", None), ("block", 32), ("block", 128)])
@pytest.mark.parametrize("d,hq,hkv,page_size,s_q,dtype", [(128, 32, 8, 16, 1, "bf16"), (64, 8, 8, 32, 1, "bf16"),
                                                          (256, 16, 2, 64, 1, "bf16"), (128, 16, 4, 32, 2, "fp16"),
                                                          (128, 64, 4, 128, 1, "bf16"), (64, 32, 2, 16, 4, "bf16")])
def test_gqa_fp8_on_each_dequantization_path(path, layout, block, d, hq, hkv, page_size, s_q, dtype):
    """GQA pinned to each sm80 dequantization path: the convert warps' ring, and the consumers'
    registers (mma fragments read from the swizzled fp8 tile, k-permuted Q and P; block scales
    applied to S per block and to fp32 P per V block, V moved bit-wise into bf16)."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    cfg = select_decode_config("gqa_decode", device_arch(0), dtype, page_size, heads=hq // hkv, head_dim=d,
                               s_q=s_q, scale_mode=layout, scale_block_size=block, fp8_convert=path)
    assert cfg.fp8_convert == path
    lens = LENS_RAGGED if s_q == 1 else [s_q, 300, 1, 77, s_q - 1]
    c = make_fp8_case("gqa_decode", layout, block=block, batch=len(lens), s_q=s_q, hq=hq, hkv=hkv, d=d,
                      page_size=page_size, lens=lens, dtype=dtype, seed=d + hq + s_q)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("gqa_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("d,page_size,group,s_q,dtype,scale_as", [
    (128, 16, 4, 1, "bf16", "tensor"), (128, 64, 16, 2, "fp16", "float"), (256, 16, 1, 1, "bf16", "tensor"),
    (256, 128, 8, 4, "bf16", "tensor"), (128, 128, 2, 8, "bf16", "float"), (128, 32, 8, 1, "fp16", "tensor")])
def test_gqa_fp8_tma_tiles(d, page_size, group, s_q, dtype, scale_as):
    """kv_load='tma' for per-tensor fp8 (boxes of page rows x 128 bytes into 128-byte-swizzled fp8
    tiles read in registers, V's keys in the PTX order): lengths 0 and 1, a tile-aligned length,
    a split long sequence and ragged ones, fp8 NaN in every unused cache byte, NaN outputs before."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    if device_arch(0) not in ("sm_90", "sm_100a"):
        pytest.skip(f"TMA needs sm_90 or newer; this device is {device_arch(0)}")
    cfg = select_decode_config("gqa_decode", device_arch(0), dtype, page_size, heads=group, head_dim=d, s_q=s_q,
                               backend="sm80", scale_mode="per_tensor", fp8_convert="registers", kv_load="tma")
    assert cfg.kv_load == "tma" and cfg.fp8_registers
    hkv = 3
    lens = [0 if s_q == 1 else s_q, 1, 4 * cfg.block_n, 2500, 77 + s_q, s_q]
    c = make_fp8_case("gqa_decode", "per_tensor", scale_as=scale_as, batch=len(lens), s_q=s_q, hq=hkv * group,
                      hkv=hkv, d=d, page_size=page_size, lens=lens, dtype=dtype, seed=d + group + page_size)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("gqa_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("factor", [1.0, 1e-4, 300.0])
@pytest.mark.parametrize("d,block,page_size,group,s_q", [(128, 64, 16, 4, 1), (128, 128, 32, 8, 2), (256, 128, 64, 2, 1),
                                                         (64, 32, 16, 16, 4), (128, 32, 128, 4, 1)])
def test_gqa_fp8_block_scales_with_v_converted_by_cvt(factor, d, block, page_size, group, s_q):
    """fp8_v_convert='cvt' with block scales: V through the conversion unit into fp16, P carrying each
    key's V scale over C (the running maximum of the V scales per scale block; the output rescaled
    when C grows, times C at the end). V scaled by 1e-4 and 300 before quantizing puts its scales far
    from 1, where an unnormalized fp16 P x scale would lose precision or overflow."""
    cfg = _gqa_block_config(d, block, page_size, group, s_q, fp8_v_convert="cvt")
    assert cfg.v_scale_normalized and cfg.pv_dtype == "fp16"
    _check_gqa_block_with_v_scaled(cfg, d, block, page_size, group, s_q, factor, seed=d + block + group,
                                   what=f"V x {factor}, against the dequantized cache")


def _gqa_block_config(d, block, page_size, group, s_q, **fields):
    """The sm80 register-path config for block-scaled GQA on this device, with `fields` changed."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", page_size, heads=group, head_dim=d, s_q=s_q,
                               backend="sm80", scale_mode="block", scale_block_size=block, fp8_convert="registers")
    return build(DecodeConfig, {**cfg.model_dump(mode="json"), **fields})


def _check_gqa_block_with_v_scaled(cfg, d, block, page_size, group, s_q, factor, *, seed, what):
    """Block-scaled GQA on `cfg` over ragged lengths (0/1, a split 3000-key sequence, s_q causal), V
    multiplied by `factor` before quantizing, against the float64 reference on the dequantized cache."""
    import torch

    hkv = 2
    lens = [s_q, 1, 3000, 77 + s_q, 4 * cfg.block_n, 0 if s_q == 1 else s_q]
    base = make_case("gqa_decode", batch=len(lens), s_q=s_q, hq=hkv * group, hkv=hkv, d=d, page_size=page_size,
                     lens=lens, seed=seed)
    base.v.mul_(factor)
    k, ks, deq_k = _quantize(base.k, "block", block)
    v, vs, deq_v = _quantize(base.v, "block", block)
    c = Fp8Case(base, k, v, ks, vs, deq_k, deq_v)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    torch.cuda.synchronize()
    want_o, want_l = reference("gqa_decode", base.host, causal=s_q > 1, k=deq_k, v=deq_v)
    assert_matches(out, lse, want_o, want_l, tol=TOL, what=what)


@pytest.mark.parametrize("v_convert,factor", [("cvt", 1e-4), ("cvt", 300.0), ("bits", 1.0)])
@pytest.mark.parametrize("d,block,page_size,group,s_q", [(128, 64, 16, 4, 1), (128, 128, 32, 8, 2), (256, 32, 64, 2, 1),
                                                         (64, 32, 16, 16, 4), (128, 32, 128, 4, 3)])
def test_gqa_fp8_block_scales_with_prescaled_p(v_convert, factor, d, block, page_size, group, s_q):
    """fp8_block_p='scaled': the softmax writes one 16-bit P tile per V scale block, each key's P times its
    V scale (over C, the running maximum per block, for cvt V; times the raw bf16 V's bias for bit moves),
    and PV reads the tile of its columns' block. Warps whose columns span two blocks (D = 256, block 32),
    C growing across tiles (V scaled by 1e-4 / 300 before quantizing, a 3000-key sequence), causal s_q."""
    cfg = _gqa_block_config(d, block, page_size, group, s_q, fp8_v_convert=v_convert, fp8_block_p="scaled")
    assert cfg.p_prescaled and cfg.p_copies == d // min(block, d)
    _check_gqa_block_with_v_scaled(cfg, d, block, page_size, group, s_q, factor, seed=d + block + group + 7,
                                   what=f"prescaled P, {v_convert} V x {factor}")


@pytest.mark.parametrize("block", [64, 128])
@pytest.mark.parametrize("block_n,stages,producers", [(128, 3, 2), (64, 6, 2), (64, 5, 4)])
def test_gqa_fp8_prescaled_p_on_other_rings(block, block_n, stages, producers):
    """Prescaled P on the deeper rings its smaller P tile leaves room for (bench/fp8_block_p_ab.py --tile):
    the ring's laps, tiles of 64 keys, four producer warps; a split sequence and lengths 0 and 1."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", 16, heads=4, head_dim=128, s_q=1,
                               backend="sm80", scale_mode="block", scale_block_size=block, fp8_convert="registers")
    data = cfg.model_dump(mode="json")
    cfg = build(DecodeConfig, {**data, "fp8_block_p": "scaled", "block_n": block_n,
                               "pipeline": {**data["pipeline"], "num_kv_stages": stages, "num_producer": producers}})
    hkv = 2
    lens = [0, 1, 5000, 77, 4 * block_n, 333]
    c = make_fp8_case("gqa_decode", "block", block=block, batch=len(lens), s_q=1, hq=4 * hkv, hkv=hkv, d=128,
                      page_size=16, lens=lens, seed=block + block_n + stages)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, out=out, lse=lse, config=cfg)
    _check("gqa_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("family,heads,d,page_size,dtype", [("gqa_decode", 4, 128, 16, "bf16"),
                                                         ("gqa_decode", 8, 64, 32, "fp16"),
                                                         ("mla_decode", 16, 576, 64, "bf16")])
def test_fp8_per_tensor_v_moved_bitwise_into_bf16(family, heads, d, page_size, dtype):
    """The register path's other V conversion pinned for per-tensor scales (`fp8_v_convert='bits'`:
    V bit-moved into bf16 x 2^-120, P and the output carrying the 2^120; the default for block scales)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    cfg = select_decode_config(family, device_arch(0), dtype, page_size, heads=heads, head_dim=d, s_q=1,
                               backend="sm80", scale_mode="per_tensor", fp8_convert="registers")
    cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "fp8_v_convert": "bits"})
    assert cfg.raw_bf16_v and cfg.pv_dtype == "bf16"
    hq, hkv = (heads, 1) if family == "mla_decode" else (heads * 4, 4)
    c = make_fp8_case(family, "per_tensor", batch=len(LENS_RAGGED), s_q=1, hq=hq, hkv=hkv, d=d,
                      page_size=page_size, lens=LENS_RAGGED, dtype=dtype, seed=d + heads)
    out, lse = _poisoned(c, family)
    _run(family, c, out=out, lse=lse, config=cfg)
    _check(family, c, out, lse, causal=False)


@pytest.mark.parametrize("layout,block", [("per_tensor", None), ("block", 64)])
@pytest.mark.parametrize("s_q", [2, 4])
def test_gqa_fp8_causal_queries_and_fp16(layout, block, s_q):
    c = make_fp8_case("gqa_decode", layout, block=block, batch=3, s_q=s_q, hq=16, hkv=4, d=128, page_size=32,
                      lens=[s_q, 300, 1], dtype="fp16", seed=s_q)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, causal=True, out=out, lse=lse)
    _check("gqa_decode", c, out, lse, causal=True)


@pytest.mark.parametrize("layout,block", [("per_tensor", None), ("block", 32)])
def test_gqa_fp8_one_long_sequence_is_split(layout, block):
    c = make_fp8_case("gqa_decode", layout, block=block, batch=1, s_q=1, hq=32, hkv=8, d=128, page_size=16,
                      lens=[20000], seed=4)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, out=out, lse=lse)
    _check("gqa_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("family,hq", [("mla_decode", 16), ("mla_decode", 64), ("gqa_decode", 16)])
def test_fp8_graph_replay_reads_the_device_scale(family, hq):
    """A per-tensor scale passed as a 1-element device tensor is read at replay: changing it
    between replays changes the result as the reference says (MLA 64 heads: the sm90 kernel on
    sm_90 devices)."""
    import torch

    hkv, d = (1, 576) if family == "mla_decode" else (4, 128)
    c = make_fp8_case(family, "per_tensor", batch=2, s_q=1, hq=hq, hkv=hkv, d=d, page_size=64, lens=[3000, 700],
                      seed=11)
    out, lse = _poisoned(c, family)
    _run(family, c, out=out, lse=lse)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(family, c, out=out, lse=lse)
    k0, v0 = c.k_scale.clone(), c.v_scale.clone()
    for factor_k, factor_v in ((1.0, 1.0), (0.5, 2.0), (3.0, 0.25)):
        c.k_scale.copy_(k0 * factor_k)
        if family != "mla_decode":
            c.v_scale.copy_(v0 * factor_v)
        fk, fv = factor_k, (factor_k if family == "mla_decode" else factor_v)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_o, want_l = reference(family, c.base.host, causal=False, k=c.deq_k * fk, v=c.deq_v * fv)
        assert_matches(out, lse, want_o, want_l, tol=TOL, what=f"scale x({fk}, {fv})")


def test_fp8_plan_objects_run_their_layout():
    import kvforge

    c = make_fp8_case("mla_decode", "block", block=64, batch=3, s_q=1, hq=16, hkv=1, d=576, page_size=64,
                      lens=[100, 0, 2000], seed=9)
    dec = kvforge.MLADecode(16, 64, "bf16", max_batch=4, fp8_layout="block", scale_block_size=64)
    out, lse = _poisoned(c, "mla_decode")
    dec.run(c.base.q, c.k, c.base.block_table, c.base.seqlens, kv_scale=c.k_scale, out=out, lse=lse)
    _check("mla_decode", c, out, lse, causal=False)
    g = make_fp8_case("gqa_decode", "per_tensor", batch=2, s_q=1, hq=32, hkv=8, d=128, page_size=16,
                      lens=[500, 7], seed=10)
    gdec = kvforge.GQADecode(32, 8, 128, 16, "bf16", max_batch=2, fp8_layout="per_tensor")
    out, lse = _poisoned(g, "gqa_decode")
    gdec.run(g.base.q, g.k, g.v, g.base.block_table, g.base.seqlens, k_scale=g.k_scale, v_scale=g.v_scale,
             out=out, lse=lse)
    _check("gqa_decode", g, out, lse, causal=False)
    with pytest.raises(ValueError, match=r"kv_format"):
        dec.run(c.base.q, c.k.view(c.k.shape), c.base.block_table, c.base.seqlens, kv_scale=1.0)


MERGE_STAGINGS = [("registers", "per_tensor", None), ("registers", "block", 64), ("fp8_ring", "fp8_ds_mla", None),
                  ("slot", "per_tensor", None)]


@pytest.mark.parametrize("staging,layout,block", MERGE_STAGINGS)
@pytest.mark.parametrize("batch", [32, 20])
def test_mla_fp8_sm90_merge_in_kernel(staging, layout, block, batch):
    """merge_in_kernel on fp8 caches (each staging; 128 heads, so b=32 cuts sequences into 2 chunks and b=20
    into 3 on 132 SMs): ragged lengths give sequences of 1 .. 3 chunks, merged by their last CTA up to
    policy.MERGE_MAX_SPLITS and by the combine beyond; a second call on new lengths checks the counts were
    reset (sm_90 only)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this one is {device_arch(0)}")
    kv = {"kv_dtype": "fp8_e4m3", "scale_mode": layout, "scale_block_size": block}
    cfg = build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", 64, 1, kv, fp8_staging=staging).model_dump(
        mode="json"), "merge_in_kernel": True})
    rng = np.random.default_rng(batch)
    for step in range(2):
        base = [0, 1, 256, 257, 700, 1500, 513, 2000]
        lens = [base[i % 8] for i in range(batch)] if step == 0 else [int(x) for x in rng.integers(1, 2100, batch)]
        c = make_fp8_case("mla_decode", layout, block=block, batch=batch, s_q=1, hq=128, hkv=1, d=576, page_size=64,
                          lens=lens, seed=batch + step)
        out, lse = _poisoned(c, "mla_decode")
        _run("mla_decode", c, out=out, lse=lse, config=cfg)
        _check("mla_decode", c, out, lse, causal=False)


@pytest.mark.parametrize("layout,block,d,page_size,group,s_q,dtype,scale_as", [
    ("per_tensor", None, 128, 16, 4, 8, "bf16", "tensor"), ("per_tensor", None, 128, 64, 16, 8, "fp16", "float"),
    ("per_tensor", None, 64, 128, 8, 8, "bf16", "tensor"), ("per_tensor", None, 256, 16, 8, 4, "bf16", "float"),
    ("block", 64, 128, 16, 8, 4, "bf16", None), ("block", 128, 128, 128, 16, 8, "fp16", None),
    ("block", 32, 64, 32, 16, 4, "bf16", None), ("block", 128, 256, 64, 4, 8, "bf16", None)])
def test_gqa_fp8_on_the_sm90_kernel(layout, block, d, page_size, group, s_q, dtype, scale_as):
    """fp8 GQA on the sm90 wgmma kernel (the producer warpgroup loads each fp8 K and V tile into registers,
    dequantizes and stores it into the 16-bit ring): one and two math warpgroups, per-tensor (a float or a
    device scale; bf16 q converted to fp16 for fp16 wgmma) and block scales, lengths 0 (or s_q) and 1, a
    tile-aligned length, a split long sequence, ragged ones; fp8 NaN in every unused cache byte."""
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this device is {device_arch(0)}")
    cfg = select_decode_config("gqa_decode", device_arch(0), dtype, page_size, heads=group, head_dim=d, s_q=s_q,
                               backend="sm90", scale_mode=layout, scale_block_size=block)
    assert cfg.backend == "sm90" and cfg.is_fp8
    hkv = 2
    lens = [s_q, 1 if s_q == 1 else s_q + 1, 4 * cfg.block_n, 2500, 77 + s_q, 9000]
    c = make_fp8_case("gqa_decode", layout, block=block, scale_as=scale_as or "tensor", batch=len(lens), s_q=s_q,
                      hq=hkv * group, hkv=hkv, d=d, page_size=page_size, lens=lens, dtype=dtype,
                      seed=d + group + page_size + s_q)
    out, lse = _poisoned(c, "gqa_decode")
    _run("gqa_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("gqa_decode", c, out, lse, causal=s_q > 1)


def _keys_m(page_size, s_q, dtype="bf16", **kw):
    from kvforge.codegen.select import sm90_keys_m_choice
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this one is {device_arch(0)}")
    return sm90_keys_m_choice(dtype, page_size, s_q, **kw)


@pytest.mark.parametrize("heads,s_q,page_size,lens,dtype,stages,qk_chains,scale_as", [
    (16, 1, 64, LENS_RAGGED, "bf16", 4, 1, "tensor"),      # ragged, lengths 0 and 1, partial tiles
    (16, 1, 16, [1, 130, 64, 5, 1000], "fp16", 2, 2, "float"),  # tiles over 4 pages, two chains, host scale
    (8, 2, 128, [1, 130, 64, 5], "bf16", 4, 1, "tensor"),  # causal s_q = 2, half-page tiles, 8 heads
    (4, 4, 32, [3, 300, 65, 128], "bf16", 2, 1, "tensor"),  # causal s_q = 4
    (16, 1, 64, [9000], "bf16", 4, 1, "tensor"),             # one long sequence: split, the combine kernel
    (32, 1, 64, [700, 2], "bf16", 4, 1, "tensor"),           # two head blocks
])
def test_mla_fp8_keys_m(heads, s_q, page_size, lens, dtype, stages, qk_chains, scale_as):
    """Schedule 'keys_m' pinned (per-tensor fp8, <= 16 query rows per CTA, fp8 wgmma with keys as M): ragged,
    causal, split, fp16 queries, both ring depths and QK chain counts, the scale as a float and as a device
    tensor; NaN bytes in unused pages and past every length (sm_90 only)."""
    cfg = _keys_m(page_size, s_q, dtype, stages=stages, qk_chains=qk_chains)
    assert cfg.schedule == "keys_m" and cfg.backend == "sm90"
    c = make_fp8_case("mla_decode", "per_tensor", scale_as=scale_as, batch=len(lens), s_q=s_q, hq=heads, hkv=1,
                      d=576, page_size=page_size, lens=lens, seed=heads + s_q + page_size, dtype=dtype)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("heads,s_q,page_size,lens,dtype", [
    (16, 1, 64, LENS_RAGGED, "bf16"),          # ragged, lengths 0 and 1, partial tiles
    (16, 1, 16, [1, 130, 64, 5, 1000], "fp16"),  # tiles over 4 pages, fp16 queries (the rope product stays bf16)
    (8, 2, 128, [1, 130, 64, 5], "bf16"),      # causal s_q = 2, half-page tiles
    (16, 1, 64, [9000], "bf16"),               # one long sequence: split, the combine kernel
    (32, 1, 32, [700, 2], "bf16"),             # two head blocks
])
def test_mla_fp8_ds_mla_keys_m(heads, s_q, page_size, lens, dtype):
    """Schedule 'keys_m' on DeepSeek's packed fp8_ds_mla token: the latent product per scale block, the rope's bf16
    product, P^T per scale block against the running scale maxima; NaN bytes in unused pages and past every length
    (sm_90 only)."""
    cfg = _keys_m(page_size, s_q, dtype, scale_mode="fp8_ds_mla")
    assert cfg.schedule == "keys_m" and cfg.scale_mode == "fp8_ds_mla"
    c = make_fp8_case("mla_decode", "fp8_ds_mla", batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=page_size, lens=lens, seed=3 * heads + s_q + page_size, dtype=dtype)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


@pytest.mark.parametrize("block,heads,s_q,page_size,lens,dtype", [
    (128, 16, 1, 64, LENS_RAGGED, "bf16"),          # ragged, lengths 0 and 1, partial tiles
    (128, 16, 1, 16, [1, 130, 64, 5, 1000], "fp16"),  # tiles over 4 pages (4 bulk copies of scale rows a tile)
    (128, 8, 2, 128, [1, 130, 64, 5], "bf16"),      # causal s_q = 2, half-page tiles
    (128, 16, 1, 64, [9000], "bf16"),               # one long sequence: split, the combine kernel
    (64, 16, 1, 64, LENS_RAGGED, "bf16"),           # 64-column blocks: nine QK blocks, eight of P^T
    (64, 4, 4, 32, [3, 300, 65, 128], "bf16"),      # causal s_q = 4
    (64, 32, 1, 16, [700, 2], "fp16"),              # two head blocks
])
def test_mla_fp8_block_scales_keys_m(block, heads, s_q, page_size, lens, dtype):
    """Schedule 'keys_m' on block-scaled caches (a scale per 64 or 128 columns per token, bulk-copied with each page
    run): the QK product per scale block (the rope's 64 columns a block of their own), P^T per value block against
    the running scale maxima; NaN bytes in unused pages and past every length, NaN scales past every length (sm_90
    only)."""
    cfg = _keys_m(page_size, s_q, dtype, scale_mode="block", scale_block_size=block)
    assert cfg.schedule == "keys_m" and cfg.keys_m_tiling.scale_block == block
    c = make_fp8_case("mla_decode", "block", block=block, batch=len(lens), s_q=s_q, hq=heads, hkv=1, d=576,
                      page_size=page_size, lens=lens, seed=5 * heads + s_q + page_size + block, dtype=dtype)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, causal=s_q > 1, out=out, lse=lse, config=cfg)
    _check("mla_decode", c, out, lse, causal=s_q > 1)


def test_mla_fp8_ds_mla_keys_m_with_scales_spanning_30x():
    """Packed keys_m with the cache's magnitude growing 30x over the pages (the block table is random, so a tile's
    scale maxima jump up and down along each sequence): the running scale maxima move past the first tiles and
    rescale O^T's rows of their block."""
    import torch

    cfg = _keys_m(64, 1, scale_mode="fp8_ds_mla")
    lens = [3000, 1700, 4100, 64]
    base = make_case("mla_decode", batch=len(lens), s_q=1, hq=16, hkv=1, d=576, page_size=64, lens=lens, seed=31)
    pages = base.k.shape[0]
    ramp = 1 + 30 * (torch.arange(pages, device=base.k.device, dtype=torch.float32) / pages) ** 2
    base.k.mul_(ramp.view(-1, *([1] * (base.k.dim() - 1))).to(base.k.dtype))
    k, ks, deq = _quantize(base.k, "fp8_ds_mla", None)
    deq = deq.reshape(deq.shape[0], deq.shape[1], 1, -1)
    c = Fp8Case(base, k, k, ks, ks, deq, deq)
    # a softmax scale 16x below 1/sqrt(576) keeps the scores near their usual size (at 1/sqrt(576) they reach ~100
    # and the lse's absolute tolerance would measure the queries' hi/lo rounding, ~2^-8 relative, at that size)
    scale = 1 / (16 * 576 ** 0.5)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, out=out, lse=lse, config=cfg, scale=scale)
    torch.cuda.synchronize()
    want_o, want_l = reference("mla_decode", base.host, causal=False, scale=scale, k=deq, v=deq)
    assert_matches(out, lse, want_o, want_l, tol=TOL, what="pages x 1..31, against the dequantized cache")


def test_mla_fp8_keys_m_graph_replay_reads_the_device_scale():
    import torch

    cfg = _keys_m(64, 1)
    c = make_fp8_case("mla_decode", "per_tensor", batch=2, s_q=1, hq=16, hkv=1, d=576, page_size=64,
                      lens=[3000, 700], seed=12)
    out, lse = _poisoned(c, "mla_decode")
    _run("mla_decode", c, out=out, lse=lse, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run("mla_decode", c, out=out, lse=lse, config=cfg)
    k0 = c.k_scale.clone()
    for factor in (1.0, 0.5, 3.0):
        c.k_scale.copy_(k0 * factor)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_o, want_l = reference("mla_decode", c.base.host, causal=False, k=c.deq_k * factor, v=c.deq_v * factor)
        assert_matches(out, lse, want_o, want_l, tol=TOL, what=f"scale x{factor}")
