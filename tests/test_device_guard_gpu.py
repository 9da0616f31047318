"""The default call's safety on the device: whatever cache_seqlens and block_table hold, no kernel
reads outside the KV cache; an offending sequence gets NaN out/lse rows, the others stay exact, and
kvforge.check_errors() raises the first offence with a precise message. The default call never
synchronises (checked under torch's sync debug mode)."""
from __future__ import annotations

import numpy as np
import pytest

from paged_inputs import make_case, rel_l2

pytestmark = pytest.mark.gpu


def _reference(family, case, causal, lens=None):
    """float64 out [B, s_q, H, Dv] and lse of the case (with `lens` in place of its lengths)."""
    import math

    from kvforge.runtime.reference import paged_decode_reference

    h = case.host
    kc = h["k"] if family != "mla_decode" else h["k"].reshape(h["k"].shape[0], h["k"].shape[1], 1, -1)
    vc = h["v"] if family != "mla_decode" else kc
    return paged_decode_reference(h["q"], kc, vc, h["bt"], h["lens"] if lens is None else lens,
                                  scale=1 / math.sqrt(h["q"].shape[-1]), causal=causal,
                                  v_dim=512 if family == "mla_decode" else None)


def _run(family, case, **kw):
    import kvforge

    if family == "mla_decode":
        return kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, **kw)
    return kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, **kw)


CASES = [  # family, heads, hkv, d, page size, lengths (the long ones split), s_q
    ("mla_decode", 16, 1, 576, 64, [700, 40, 3000, 1], 1),
    ("gqa_decode", 8, 2, 128, 16, [700, 40, 5000, 1], 1),
    ("gqa_decode", 32, 2, 128, 16, [700, 40, 5000, 4], 4),  # 64 rows per KV head: the sm90 wgmma kernel on sm_90
]


@pytest.mark.parametrize("family,hq,hkv,d,page,lens,s_q", CASES, ids=["mla_decode", "gqa_decode", "gqa_decode_64rows"])
@pytest.mark.parametrize("poison", ["page_id", "negative_page", "length_over_capacity", "negative_length"])
def test_a_poisoned_sequence_gets_nan_rows_and_an_error_record(family, hq, hkv, d, page, lens, s_q, poison):
    import torch

    import kvforge

    kvforge.check_errors()  # start clean
    case = make_case(family, batch=len(lens), s_q=s_q, hq=hq, hkv=hkv, d=d, page_size=page, lens=lens, seed=7)
    bad_b = 2  # the long sequence: split on the device
    if poison == "page_id":
        case.block_table[bad_b, 3] = case.k.shape[0] + 5
    elif poison == "negative_page":
        case.block_table[bad_b, 0] = -3
    elif poison == "length_over_capacity":
        case.seqlens[bad_b] = case.block_table.shape[1] * page + 1
    else:
        case.seqlens[bad_b] = -4
    out, lse = _run(family, case)
    torch.cuda.synchronize()
    with pytest.raises(kvforge.DeviceInputError) as err:
        kvforge.check_errors()
    msg = str(err.value)
    if poison in ("page_id", "negative_page"):
        idx = 3 if poison == "page_id" else 0
        assert f"block_table[{bad_b}][{idx}]=" in msg and f"must be in 0..{case.k.shape[0] - 1}" in msg, msg
    else:
        assert f"cache_seqlens[{bad_b}]=" in msg and "must be in 0.." in msg, msg
    kvforge.check_errors()  # cleared: a second check passes
    o = out.float().cpu().numpy()
    ls = lse.cpu().numpy()
    o = o.reshape(len(lens), -1)
    assert np.isnan(o[bad_b]).all() and np.isnan(ls[bad_b]).all()
    good = [b for b in range(len(lens)) if b != bad_b]
    ref_o, _ = _reference(family, case, False, lens=np.where(np.arange(len(lens)) == bad_b, 0, lens))
    got = out.float().cpu().numpy()
    assert not np.isnan(got[good]).any()
    assert rel_l2(got[good], ref_o[good]) < 1e-2


def test_the_default_call_never_synchronises():
    import torch

    import kvforge

    mla = make_case("mla_decode", batch=3, s_q=2, hq=16, hkv=1, d=576, page_size=64, lens=[300, 5, 2000], seed=2)
    gqa = make_case("gqa_decode", batch=3, s_q=1, hq=8, hkv=2, d=128, page_size=16, lens=[300, 5, 2000], seed=2)
    _run("mla_decode", mla, causal=True)  # compile and load outside the checked region
    _run("gqa_decode", gqa)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            mo, ml = _run("mla_decode", mla, causal=True)
            go, gl = _run("gqa_decode", gqa)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    ref_o, _ = _reference("mla_decode", mla, True)
    assert rel_l2(mo.float().cpu().numpy(), ref_o) < 1e-2
    ref_o, _ = _reference("gqa_decode", gqa, False)
    assert rel_l2(go.float().cpu().numpy(), ref_o) < 1e-2


def test_plan_objects_run_like_the_functions():
    import torch

    import kvforge

    case = make_case("mla_decode", batch=4, s_q=1, hq=32, hkv=1, d=576, page_size=64, lens=[1, 900, 64, 4000], seed=4)
    dec = kvforge.MLADecode(32, 64, "bf16", max_batch=8)
    out, lse = dec.run(case.q, case.k, case.block_table, case.seqlens)
    ref_o, ref_lse = _reference("mla_decode", case, False)
    assert rel_l2(out.float().cpu().numpy(), ref_o) < 1e-2
    # fewer sequences than planned, new lengths, the same object
    small = make_case("mla_decode", batch=2, s_q=1, hq=32, hkv=1, d=576, page_size=64, lens=[3000, 17], seed=5)
    out2 = torch.full((2, 1, 32, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    dec.run(small.q, small.k, small.block_table, small.seqlens, out=out2)
    ref2, _ = _reference("mla_decode", small, False)
    assert rel_l2(out2.float().cpu().numpy(), ref2) < 1e-2
    with pytest.raises(ValueError, match=r"batch 9 exceeds max_batch=8"):
        big = make_case("mla_decode", batch=9, s_q=1, hq=32, hkv=1, d=576, page_size=64, lens=[5] * 9, seed=6)
        dec.run(big.q, big.k, big.block_table, big.seqlens)
    g = make_case("gqa_decode", batch=2, s_q=1, hq=16, hkv=4, d=64, page_size=32, lens=[333, 2], seed=8)
    gdec = kvforge.GQADecode(16, 4, 64, 32, "bf16", max_batch=2)
    go, _ = gdec.run(g.q, g.k, g.v, g.block_table, g.seqlens)
    gref, _ = _reference("gqa_decode", g, False)
    assert rel_l2(go.float().cpu().numpy(), gref) < 1e-2
