"""Calls run under compute-sanitizer by test_sanitizer_gpu.py (one process per case).

    python sanitize_case.py mla_decode|mla_decode_sm90[_lockstep|_seesaw]|gqa_decode|gqa_decode_tma|gqa_decode_sm90|fp8_gqa_tma|fp8_gqa_sm90|fp8_gqa_prescaled|fp8_mla_sm90_slot[_la]|fp8_mla_sm90_keys_m|poisoned_<family>|
                            poisoned_mla_decode_sm90|fp8_<per_tensor|block|fp8_ds_mla>|
                            selftest_<arrive|expect_tx>_<thread|warp>

Decode cases pin a variant whose ring has 2 slots, so every CTA's chunk (8+ tiles) laps the ring
several times, in a batch whose long sequences are split on the device, next to lengths 1 and
40; one more call takes the built-in choice with s_q = 2 and the causal rule. The self-test cases
stream 48 slots through a 2-slot ring in one CTA."""
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from paged_inputs import make_case  # noqa: E402

import kvforge  # noqa: E402
from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.codegen.errors import build  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402


def two_slot_ring(family, page_size, heads, head_dim, s_q=1):
    cfg = select_decode_config(family, device_arch(0), "bf16", page_size, heads=heads, head_dim=head_dim, s_q=s_q)
    data = cfg.model_dump(mode="json")
    data["pipeline"]["num_kv_stages"] = 2
    return build(DecodeConfig, data)


def decode_case(family):
    lens = [1500, 40, 1]
    if family == "mla_decode":
        case = make_case(family, batch=3, s_q=1, hq=16, hkv=1, d=576, page_size=64, lens=lens, seed=1)
        kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, config=two_slot_ring(family, 64, 16, 576))
        case = make_case(family, batch=2, s_q=2, hq=16, hkv=1, d=576, page_size=32, lens=[700, 5], seed=2)
        kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=True)
    else:
        case = make_case(family, batch=3, s_q=1, hq=8, hkv=2, d=128, page_size=16, lens=lens, seed=1)
        kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens,
                           config=two_slot_ring(family, 16, 4, 128))
        case = make_case(family, batch=2, s_q=2, hq=8, hkv=1, d=64, page_size=64, lens=[700, 5], seed=2)
        kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=True)


def gqa_tma_case():
    """GQA with kv_load='tma' (sm_90): a 2-slot ring, boxes of whole 16-row pages with a split
    sequence and partial last tiles; then D 64 on 128-row pages (half-page boxes), s_q 2 causal."""
    for page_size, group, d, s_q, lens in ((16, 4, 128, 1, [1500, 40, 1]), (128, 4, 64, 2, [700, 5])):
        cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", page_size, heads=group, head_dim=d,
                                   s_q=s_q, backend="sm80", kv_load="tma")
        data = cfg.model_dump(mode="json")
        data["pipeline"]["num_kv_stages"] = 2
        case = make_case("gqa_decode", batch=len(lens), s_q=s_q, hq=2 * group, hkv=2, d=d, page_size=page_size,
                         lens=lens, seed=d)
        out, _ = kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=s_q > 1,
                                    config=build(DecodeConfig, data))
        torch.cuda.synchronize()
        assert not bool(torch.isnan(out).any())


def gqa_sm90_case():
    """GQA on the sm90 wgmma kernel: a 2-slot ring, one math warpgroup (32 rows) on 16-row pages with a split
    sequence and partial last tiles, then two math warpgroups (128 rows, D 64) on 128-row pages (half-page boxes),
    both causal."""
    for page_size, group, d, s_q, lens in ((16, 4, 128, 8, [1500, 40, 8]), (128, 16, 64, 8, [700, 9])):
        cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", page_size, heads=group, head_dim=d,
                                   s_q=s_q, backend="sm90")
        cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "num_kv_stages": 2})
        case = make_case("gqa_decode", batch=len(lens), s_q=s_q, hq=2 * group, hkv=2, d=d, page_size=page_size,
                         lens=lens, seed=d)
        out, _ = kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=True, config=cfg)
        torch.cuda.synchronize()
        assert not bool(torch.isnan(out).any())


def fp8_gqa_tma_case():
    """Per-tensor fp8 GQA with kv_load='tma' (sm_90): a 2-slot ring of 128-byte-swizzled fp8 tiles,
    whole 16-row pages with a split sequence and partial last tiles (D 128), then D 256 on 128-row
    pages (two boxes per row, half-page boxes) with s_q 2 causal."""
    for page_size, group, d, s_q, lens in ((16, 4, 128, 1, [1500, 40, 1]), (128, 4, 256, 2, [700, 5])):
        cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", page_size, heads=group, head_dim=d,
                                   s_q=s_q, backend="sm80", scale_mode="per_tensor", fp8_convert="registers",
                                   kv_load="tma")
        data = cfg.model_dump(mode="json")
        data["pipeline"]["num_kv_stages"] = 2
        case = make_case("gqa_decode", batch=len(lens), s_q=s_q, hq=2 * group, hkv=2, d=d, page_size=page_size,
                         lens=lens, seed=d)
        k8, ks = kvforge.quantize_kv(torch.nan_to_num(case.k), "per_tensor")
        v8, vs = kvforge.quantize_kv(torch.nan_to_num(case.v), "per_tensor")
        out, _ = kvforge.gqa_decode(case.q, k8, v8, case.block_table, case.seqlens, causal=s_q > 1, k_scale=ks,
                                    v_scale=vs, config=build(DecodeConfig, data))
        torch.cuda.synchronize()
        assert not bool(torch.isnan(out).any())


def fp8_gqa_sm90_case():
    """fp8 GQA on the sm90 wgmma kernel (the producer warpgroup dequantizes each fp8 tile into the 16-bit ring):
    per-tensor with one math warpgroup (32 rows, 16-row pages, a split sequence) and block scales (32-wide) with
    two (128 rows, D 64, 128-row pages: half-page tiles), both causal on a 2-slot ring."""
    for layout, block, page_size, group, d, s_q, lens in (("per_tensor", None, 16, 4, 128, 8, [1500, 40, 8]),
                                                          ("block", 32, 128, 16, 64, 8, [700, 9])):
        cfg = select_decode_config("gqa_decode", device_arch(0), "bf16", page_size, heads=group, head_dim=d,
                                   s_q=s_q, backend="sm90", scale_mode=layout, scale_block_size=block)
        cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "num_kv_stages": 2})
        case = make_case("gqa_decode", batch=len(lens), s_q=s_q, hq=2 * group, hkv=2, d=d, page_size=page_size,
                         lens=lens, seed=d)
        k8, ks = kvforge.quantize_kv(torch.nan_to_num(case.k), layout, block)
        v8, vs = kvforge.quantize_kv(torch.nan_to_num(case.v), layout, block)
        out, _ = kvforge.gqa_decode(case.q, k8, v8, case.block_table, case.seqlens, causal=True, k_scale=ks,
                                    v_scale=vs, config=cfg)
        torch.cuda.synchronize()
        assert not bool(torch.isnan(out).any())


def sm90_case(schedule=None):
    """The sm90 MLA kernel (chosen above 16 query rows on sm_90): 64 heads (one 64-row CTA per
    sequence) with split sequences (one merged by its last CTA, one by the combine), 128 heads (two head blocks), s_q=2 causal on page 32. With
    `schedule`, every call pins the sm90 config of its page size and s_q with that math schedule
    (the built-in choice otherwise)."""
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.decode import select_config

    assert select_config("mla_decode", "bf16", 64, 64, 576, 1, 0).backend == "sm90", "sm90 is not the choice here"

    def pinned(page_size, s_q):
        if schedule is None:
            return None
        data = sm90_choice("mla_decode", "bf16", page_size, s_q).model_dump(mode="json")
        return build(DecodeConfig, {**data, "schedule": schedule})

    lens = [1500, 400, 1]  # 400 keys: two chunks, merged in the kernel (merge_in_kernel, the 16-bit default)
    case = make_case("mla_decode", batch=3, s_q=1, hq=64, hkv=1, d=576, page_size=64, lens=lens, seed=4)
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, config=pinned(64, 1))
    case = make_case("mla_decode", batch=2, s_q=1, hq=128, hkv=1, d=576, page_size=16, lens=[900, 3], seed=5)
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, config=pinned(16, 1))
    case = make_case("mla_decode", batch=2, s_q=2, hq=32, hkv=1, d=576, page_size=32, lens=[700, 5], seed=6)
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=True, config=pinned(32, 2))
    torch.cuda.synchronize()


def poisoned_case(family, heads=16):
    """Used block-table entries and lengths that point outside the cache: the kernels must not
    read there (memcheck), the error record must say so."""
    lens = [1500, 40, 300]
    if family == "mla_decode":
        case = make_case(family, batch=3, s_q=1, hq=heads, hkv=1, d=576, page_size=64, lens=lens, seed=3)
    else:
        case = make_case(family, batch=3, s_q=1, hq=8, hkv=2, d=128, page_size=16, lens=lens, seed=3)
    case.block_table[0, 5] = 1 << 29      # a used page far outside the pool
    case.block_table[2, 0] = -7           # a negative page
    case.seqlens[1] = case.block_table.shape[1] * case.k.shape[1] + 50  # longer than the table holds
    if family == "mla_decode":
        out, lse = kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens)
    else:
        out, lse = kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens)
    torch.cuda.synchronize()
    assert bool(torch.isnan(out).all()) and bool(torch.isnan(lse).all()), "poisoned rows must be NaN"
    try:
        kvforge.check_errors()
    except kvforge.DeviceInputError:
        pass
    else:
        raise AssertionError("the error record stayed empty")


def fp8_case(layout):
    """fp8 caches: MLA at 16 heads (sm80, the register path; on sm_90 its rows by bulk copies, block
    scales stored beside them by the producer lanes; on sm_90 per-tensor and the packed token take schedule keys_m) and 64 heads (on sm_90 the sm90 kernel,
    page 16: four bulk copies per tile) and GQA (group 4 D 128 s_q 2, group 1 D 64: the consumers
    dequantize in registers) in `layout` (block: 64-wide scales, and 128-wide for GQA D = 128), with a
    split sequence whose tiles lap the rings many times."""
    lens = [1500, 40, 1]
    block = 64 if layout == "block" else None
    for hq, page_size in ((16, 64), (64, 16)):
        case = make_case("mla_decode", batch=3, s_q=1, hq=hq, hkv=1, d=576, page_size=page_size, lens=lens, seed=7)
        k8, ks = kvforge.quantize_kv(torch.nan_to_num(case.k), layout, block)
        out, _ = kvforge.mla_decode(case.q, k8, case.block_table, case.seqlens, kv_scale=ks)
        assert not bool(torch.isnan(out).any())
    if layout == "fp8_ds_mla":
        return
    # (block scales: also 128-wide at D = 128, one V scale per token: P prescaled per V block by the softmax)
    gqa = ((128, 16, 4, 2, block), (64, 8, 8, 1, block)) + (((128, 16, 4, 1, 128),) if layout == "block" else ())
    for d, hq, hkv, s_q, gqa_block in gqa:
        gqa_fp8_call(d, hq, hkv, s_q, layout, gqa_block, lens, seed=8)


def gqa_fp8_call(d, hq, hkv, s_q, layout, block, lens, *, seed, config=None):
    """One fp8 GQA call over 16-key pages (s_q > 1 causal), the caches quantized from a bf16 case."""
    case = make_case("gqa_decode", batch=len(lens), s_q=s_q, hq=hq, hkv=hkv, d=d, page_size=16, lens=lens, seed=seed)
    k8, ks = kvforge.quantize_kv(torch.nan_to_num(case.k), layout, block)
    v8, vs = kvforge.quantize_kv(torch.nan_to_num(case.v), layout, block)
    out, _ = kvforge.gqa_decode(case.q, k8, v8, case.block_table, case.seqlens, causal=s_q > 1, k_scale=ks,
                                v_scale=vs, config=config)
    assert not bool(torch.isnan(out).any())


def fp8_gqa_prescaled_case():
    """Block-scaled fp8 GQA with P prescaled per V block by the softmax (fp8_block_p='scaled'): the built-in
    choice at D = 128 with 128-wide blocks (s_q 1 and 2 causal) and D = 64 with 64-wide ones, and a pinned
    two-tile config (D = 128, 64-wide blocks), each with a split sequence whose tiles lap the ring."""
    lens = [1500, 40, 1]
    for d, hq, hkv, s_q, block, pin in ((128, 16, 4, 1, 128, False), (128, 16, 4, 2, 128, False),
                                        (64, 8, 2, 1, 64, False), (128, 8, 2, 1, 64, True)):
        cfg = None
        if pin:
            base = select_decode_config("gqa_decode", device_arch(0), "bf16", 16, heads=hq // hkv, head_dim=d, s_q=s_q,
                                        scale_mode="block", scale_block_size=block)
            cfg = build(DecodeConfig, {**base.model_dump(mode="json"), "fp8_block_p": "scaled"})
        gqa_fp8_call(d, hq, hkv, s_q, "block", block, lens, seed=10, config=cfg)


def mla_per_tensor_fp8_call(cfg, hq, s_q, page_size, lens, layout="per_tensor", block=None):
    """One fp8 MLA call (per-tensor, or `layout` with `block`) pinned to `cfg` (causal where s_q > 1); its output must
    be finite."""
    case = make_case("mla_decode", batch=len(lens), s_q=s_q, hq=hq, hkv=1, d=576, page_size=page_size, lens=lens, seed=9)
    k8, ks = kvforge.quantize_kv(torch.nan_to_num(case.k), layout, block)
    out, _ = kvforge.mla_decode(case.q, k8, case.block_table, case.seqlens, kv_scale=ks, causal=s_q > 1, config=cfg)
    assert not bool(torch.isnan(out).any())


def fp8_slot_case(loads_ahead=False):
    """Per-tensor fp8 MLA on the sm90 seesaw with fp8_staging='slot' (TMA of fp8 boxes into the 16-bit
    slot, converted in place; `loads_ahead`: with fp8_slot_loads_ahead): 64 heads over 16-key pages with a split
    sequence, 128 heads over 64-key pages, s_q = 2 causal over 128-key pages (half-page tiles)."""
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice

    for hq, s_q, page_size, lens in ((64, 1, 16, [1500, 40, 1]), (128, 1, 64, [900, 3]), (32, 2, 128, [700, 5])):
        kv = {"kv_dtype": "fp8_e4m3", "scale_mode": "per_tensor", "scale_block_size": None}
        cfg = sm90_choice("mla_decode", "bf16", page_size, s_q, kv, fp8_staging="slot")
        assert cfg.schedule == "seesaw"
        if loads_ahead:
            cfg = build(DecodeConfig, {**cfg.model_dump(mode="json"), "fp8_slot_loads_ahead": True})
        mla_per_tensor_fp8_call(cfg, hq, s_q, page_size, lens)


def fp8_keys_m_case():
    """fp8 MLA on schedule 'keys_m' (fp8 wgmma, keys as M), per-tensor: 16 heads over 16-key pages with a split
    sequence on a 2-slot ring, 8 heads with s_q = 2 causal over 128-key pages (half-page tiles) on 4 slots; block
    scales (bulk-copied scale rows): 128-wide over 16-key pages with the split sequence, 64-wide with s_q = 2 over
    128-key pages."""
    from kvforge.codegen.select import sm90_keys_m_choice

    for hq, s_q, page_size, stages, lens in ((16, 1, 16, 2, [1500, 40, 1]), (8, 2, 128, 4, [700, 5])):
        cfg = sm90_keys_m_choice("bf16", page_size, s_q, stages=stages)
        mla_per_tensor_fp8_call(cfg, hq, s_q, page_size, lens)
    for hq, s_q, page_size, block, lens in ((16, 1, 16, 128, [1500, 40, 1]), (8, 2, 128, 64, [700, 5])):
        cfg = sm90_keys_m_choice("bf16", page_size, s_q, scale_mode="block", scale_block_size=block)
        mla_per_tensor_fp8_call(cfg, hq, s_q, page_size, lens, "block", block)


def selftest_case(fill, arrive):
    from kvforge.codegen.variant import variant_from_dict
    from kvforge.runtime.selftest import launch_pipeline_selftest, reference_sums

    v = variant_from_dict({"kind": "pipeline_selftest", "arch": device_arch(0), "fill": fill, "slot_bytes": 4096,
                           "pipeline": {"num_kv_stages": 2, "num_qk_stages": 1, "num_producer": 1,
                                        "num_consumer": 2, "consumer_arrive": arrive}})
    words = v.config.tile_bytes // 4 * 48
    host = np.random.default_rng(0).integers(0, 2**32, size=words, dtype=np.uint32)
    src = torch.from_numpy(host.view(np.int32)).cuda().view(torch.uint32)
    out = torch.full((48, 1, 2), -1, dtype=torch.int32, device="cuda").view(torch.uint32)
    launch_pipeline_selftest(v, src, out, grid=1)
    torch.cuda.synchronize()
    got = out.view(torch.int32).cpu().numpy().view(np.uint32)
    assert (got == reference_sums(host, v)).all(), "self-test sums differ"


what = sys.argv[1]
if what.startswith("selftest_"):
    selftest_case(*what.removeprefix("selftest_").rsplit("_", 1))
elif what == "fp8_gqa_tma":
    fp8_gqa_tma_case()
elif what == "fp8_gqa_sm90":
    fp8_gqa_sm90_case()
elif what == "fp8_gqa_prescaled":
    fp8_gqa_prescaled_case()
elif what == "fp8_mla_sm90_slot":
    fp8_slot_case()
elif what == "fp8_mla_sm90_slot_la":
    fp8_slot_case(loads_ahead=True)
elif what == "fp8_mla_sm90_keys_m":
    fp8_keys_m_case()
elif what.startswith("fp8_"):
    fp8_case(what.removeprefix("fp8_"))
elif what == "mla_decode_sm90":
    sm90_case()
elif what.startswith("mla_decode_sm90_"):
    sm90_case(schedule=what.removeprefix("mla_decode_sm90_"))
elif what == "gqa_decode_tma":
    gqa_tma_case()
elif what == "gqa_decode_sm90":
    gqa_sm90_case()
elif what == "poisoned_mla_decode_sm90":
    poisoned_case("mla_decode", heads=64)
elif what.startswith("poisoned_"):
    poisoned_case(what.removeprefix("poisoned_"))
else:
    decode_case(what)
torch.cuda.synchronize()
kvforge.check_errors()
print("sanitized run done")
