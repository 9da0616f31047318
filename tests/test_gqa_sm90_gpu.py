"""GQA/MHA/MQA decode on the sm90 backend's wgmma kernel (templates/cuda/decode_sm90_gqa.cu.j2) on the GPU,
against the float64 reference: head dims 64/128/256, groups 1..16, s_q 1..8 with the causal rule (one and two
math warpgroups: up to 128 query rows per KV head), page sizes 16..128 (boxes of whole pages and half pages),
both 16-bit dtypes, ragged lengths with 0, 1, tile-aligned and split long sequences, NaN in every cache byte the
kernel must not read and in the outputs beforehand, graph replays with new lengths, the built-in choice."""
from __future__ import annotations

import numpy as np
import pytest

from paged_inputs import assert_matches, make_case, reference

pytestmark = pytest.mark.gpu
TOL = 1e-2


def _sm90():
    from kvforge.runtime.device import device_arch

    if device_arch(0) != "sm_90":
        pytest.skip(f"the sm90 backend runs on sm_90 devices; this device is {device_arch(0)}")


def _pinned(dtype, page_size, group, d, s_q):
    from kvforge.codegen.select import select_decode_config

    cfg = select_decode_config("gqa_decode", "sm_90", dtype, page_size, heads=group, head_dim=d, s_q=s_q,
                               backend="sm90")
    assert cfg.backend == "sm90" and cfg.family == "gqa_decode"
    return cfg


def _poisoned(case):
    import torch

    b, s_q, hq, d = case.q.shape
    out = torch.full((b, s_q, hq, d), float("nan"), dtype=case.q.dtype, device="cuda")
    lse = torch.full((b, hq, s_q), float("nan"), dtype=torch.float32, device="cuda")
    return out, lse


def _run_and_check(case, cfg, causal, scale=None):
    import kvforge
    import torch

    out, lse = _poisoned(case)
    kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=causal, softmax_scale=scale,
                       out=out, lse=lse, config=cfg)
    torch.cuda.synchronize()
    want_o, want_l = reference("gqa_decode", case.host, causal=causal, scale=scale)
    return assert_matches(out, lse, want_o, want_l, tol=TOL, what=f"{cfg.backend} ")


@pytest.mark.parametrize("d,page_size,group,s_q,dtype", [
    (128, 16, 4, 8, "bf16"), (128, 64, 16, 4, "bf16"), (128, 64, 16, 8, "fp16"), (128, 32, 8, 8, "bf16"),
    (64, 16, 8, 8, "bf16"), (64, 128, 16, 8, "fp16"), (64, 32, 4, 1, "bf16"),
    (256, 16, 8, 4, "bf16"), (256, 128, 16, 8, "bf16"), (256, 64, 2, 3, "fp16"),
    (128, 128, 1, 1, "bf16"), (128, 16, 16, 1, "fp16"), (64, 64, 16, 5, "bf16")])
def test_gqa_sm90_tiles(d, page_size, group, s_q, dtype):
    """Every head dim with one and two math warpgroups, whole and half-page boxes, 1 to 128 rows per KV head:
    lengths 0 (or s_q) and 1, a tile-aligned length, a long one, ragged ones."""
    _sm90()
    cfg = _pinned(dtype, page_size, group, d, s_q)
    hkv = 3
    lens = [0 if s_q == 1 else s_q, 1, 4 * cfg.block_n, 2500, 77 + s_q, s_q + 64]
    case = make_case("gqa_decode", batch=6, s_q=s_q, hq=hkv * group, hkv=hkv, d=d, page_size=page_size,
                     lens=lens, dtype=dtype, seed=d + group + page_size + s_q)
    _run_and_check(case, cfg, causal=s_q > 1)


@pytest.mark.parametrize("s_q,causal", [(4, False), (8, True)])
def test_gqa_sm90_without_the_causal_rule_and_with_a_scale(s_q, causal):
    _sm90()
    cfg = _pinned("bf16", 16, 8, 128, s_q)
    case = make_case("gqa_decode", batch=3, s_q=s_q, hq=16, hkv=2, d=128, page_size=16, lens=[300, 9, 1000],
                     seed=40 + s_q)
    _run_and_check(case, cfg, causal=causal, scale=0.3)


@pytest.mark.parametrize("group,s_q", [(4, 8), (16, 8)])
def test_gqa_sm90_long_single_sequence_takes_the_split_path(group, s_q):
    """One 20000-key sequence: the split plan cuts it over the GPU and the combine kernel merges the chunks."""
    _sm90()
    cfg = _pinned("bf16", 16, group, 128, s_q)
    case = make_case("gqa_decode", batch=1, s_q=s_q, hq=2 * group, hkv=2, d=128, page_size=16, lens=[20000],
                     seed=group)
    _run_and_check(case, cfg, causal=True)


def test_gqa_sm90_is_the_built_in_choice_from_32_rows_per_kv_head():
    _sm90()
    from kvforge.codegen.sm90_gqa import SM90_GQA_MIN_ROWS
    from kvforge.runtime.decode import select_config

    assert select_config("gqa_decode", "bf16", 16, 8, 128, SM90_GQA_MIN_ROWS // 8, 0).backend == "sm90"
    assert select_config("gqa_decode", "bf16", 16, 4, 128, 1, 0).backend == "sm80"
    case = make_case("gqa_decode", batch=4, s_q=8, hq=32, hkv=4, d=128, page_size=16, lens=[1, 700, 64, 3000],
                     seed=5)
    import kvforge

    out, lse = _poisoned(case)
    kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=True, out=out, lse=lse)
    want_o, want_l = reference("gqa_decode", case.host, causal=True)
    assert_matches(out, lse, want_o, want_l, tol=TOL)


def test_gqa_sm90_graph_replay_with_new_lengths():
    import kvforge
    import torch

    _sm90()
    cfg = _pinned("bf16", 64, 8, 128, 4)
    case = make_case("gqa_decode", batch=2, s_q=4, hq=16, hkv=2, d=128, page_size=64, lens=[3000, 700], seed=11)
    out, lse = _poisoned(case)

    def call():
        kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens, causal=True, out=out, lse=lse,
                           config=cfg)

    call()  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for lens in ([3000, 700], [4, 650], [2999, 5], [64, 4]):  # within each sequence's pages
        new_q = torch.randn(case.q.shape, device="cuda").to(case.q.dtype)
        case.q.copy_(new_q)
        case.seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        case.host["q"] = new_q.double().cpu().numpy()
        case.host["lens"] = np.array(lens, dtype=np.int32)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_o, want_l = reference("gqa_decode", case.host, causal=True)
        assert_matches(out, lse, want_o, want_l, tol=TOL)
