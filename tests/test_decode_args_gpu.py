"""Bad decode arguments raise a clear error naming the argument, before any kernel launches."""
from __future__ import annotations

import pytest

from paged_inputs import make_case

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def mla():
    return make_case("mla_decode", batch=2, s_q=1, hq=16, hkv=1, d=576, page_size=64, lens=[10, 70], seed=0)


@pytest.fixture(scope="module")
def gqa():
    return make_case("gqa_decode", batch=2, s_q=1, hq=8, hkv=2, d=128, page_size=16, lens=[10, 70], seed=0)


def _mla(case, **over):
    import kvforge

    args = dict(q=case.q, kv_cache=case.k, block_table=case.block_table, cache_seqlens=case.seqlens)
    args.update(over)
    return kvforge.mla_decode(args.pop("q"), args.pop("kv_cache"), args.pop("block_table"),
                              args.pop("cache_seqlens"), **args)


def _gqa(case, **over):
    import kvforge

    args = dict(q=case.q, k_cache=case.k, v_cache=case.v, block_table=case.block_table, cache_seqlens=case.seqlens)
    args.update(over)
    return kvforge.gqa_decode(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("block_table"),
                              args.pop("cache_seqlens"), **args)


def test_mla_wrong_dtypes(mla):
    import torch

    with pytest.raises(TypeError, match=r"^q: dtype must be bf16 or fp16, got fp32"):
        _mla(mla, q=mla.q.float())
    with pytest.raises(TypeError, match=r"^kv_cache: dtype must be bf16 \(q's\) or float8_e4m3fn \(with scales\), "
                                        r"or uint8 \[.., 656\] \(MLA fp8_ds_mla\), got fp16"):
        _mla(mla, kv_cache=mla.k.half())
    with pytest.raises(TypeError, match=r"^block_table: dtype must be int32, got int64"):
        _mla(mla, block_table=mla.block_table.long())
    with pytest.raises(TypeError, match=r"^cache_seqlens: dtype must be int32"):
        _mla(mla, cache_seqlens=mla.seqlens.to(torch.int64))
    with pytest.raises(ValueError, match=r"^kv_scale: required for a float8_e4m3fn kv_cache: a float, a 1-element"):
        _mla(mla, kv_cache=mla.k.to(torch.float8_e4m3fn))


def test_q_and_out_must_start_on_16_bytes(mla):
    import torch

    def shifted(t):  # same shape and contents, storage 2 bytes past a 16-byte boundary
        flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
        view = flat[1:1 + t.numel()].view(t.shape)
        view.copy_(t)
        return view

    _mla(mla)  # the aligned call's signature is cached: the shifted views below must still be checked
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"^q: data pointer 0x[0-9a-f]+ is not 16-byte aligned"):
        _mla(mla, q=shifted(mla.q))
    with pytest.raises(ValueError, match=r"^out: data pointer 0x[0-9a-f]+ is not 16-byte aligned"):
        _mla(mla, out=shifted(torch.empty(*mla.q.shape[:-1], 512, dtype=mla.q.dtype, device=mla.q.device)))


def test_mla_wrong_shapes(mla):
    with pytest.raises(ValueError, match=r"^q: last dimension must be 576"):
        _mla(mla, q=mla.q[..., :512].contiguous())
    with pytest.raises(ValueError, match=r"^q: expected 4 dimensions"):
        _mla(mla, q=mla.q[:, 0])
    with pytest.raises(ValueError, match=r"^kv_cache: a 4-D MLA cache must have h_kv=1"):
        _mla(mla, kv_cache=mla.k.reshape(mla.k.shape[0], mla.k.shape[1] // 2, 2, 576))
    with pytest.raises(ValueError, match=r"^kv_cache: page_size=48"):
        _mla(mla, kv_cache=mla.k.reshape(-1, 576)[: 48 * 4].reshape(4, 48, 576))
    with pytest.raises(ValueError, match=r"^block_table: batch 1 does not match q's batch 2"):
        _mla(mla, block_table=mla.block_table[:1])
    with pytest.raises(ValueError, match=r"^cache_seqlens: batch 1 does not match"):
        _mla(mla, cache_seqlens=mla.seqlens[:1])
    with pytest.raises(ValueError, match=r"^q: s_q=9 is outside the supported 1..8"):
        _mla(mla, q=mla.q.expand(2, 9, 16, 576).contiguous())


def test_mla_device_strides_and_outputs(mla):
    import torch

    with pytest.raises(ValueError, match=r"^q: must live on a CUDA device"):
        _mla(mla, q=mla.q.cpu())
    strided = torch.empty(2, 1, 16, 1152, dtype=torch.bfloat16, device="cuda")[..., :576]
    with pytest.raises(ValueError, match=r"^q: must be C-contiguous"):
        _mla(mla, q=strided)
    with pytest.raises(ValueError, match=r"^out: shape must be \(2, 1, 16, 512\)"):
        _mla(mla, out=torch.empty(2, 1, 16, 576, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(TypeError, match=r"^lse: dtype must be fp32"):
        _mla(mla, lse=torch.empty(2, 16, 1, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match=r"^kv_scale: scales apply to float8_e4m3fn KV caches; pass None for a bf16"):
        _mla(mla, kv_scale=1.0)


def test_debug_mode_checks_lengths_and_pages_on_the_host(mla):
    """check_inputs=True (or KVFORGE_DEBUG=1) keeps the host-side range checks (they sync)."""
    import torch

    with pytest.raises(ValueError, match=r"^cache_seqlens\[1\]=9999: must be in 0..192 \(block_table has 3 pages of 64 tokens\)"):
        _mla(mla, cache_seqlens=torch.tensor([10, 9999], dtype=torch.int32, device="cuda"), check_inputs=True)
    with pytest.raises(ValueError, match=r"^cache_seqlens\[0\]=-1"):
        _mla(mla, cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32, device="cuda"), check_inputs=True)
    bad = mla.block_table.clone()
    bad[0, 0] = 10**6
    with pytest.raises(ValueError, match=r"^block_table\[0\]: pages used by its 10 tokens must be in 0\.\."):
        _mla(mla, block_table=bad, check_inputs=True)


def test_gqa_head_checks(gqa):
    with pytest.raises(ValueError, match=r"^q: 8 query heads is not a multiple of the 3 KV heads"):
        _gqa(gqa, k_cache=gqa.k[:, :, :1].expand(-1, -1, 3, -1).contiguous(),
             v_cache=gqa.v[:, :, :1].expand(-1, -1, 3, -1).contiguous())
    with pytest.raises(ValueError, match=r"^q: head dim 96; supported: 64, 128, 256"):
        _gqa(gqa, q=gqa.q[..., :96].contiguous())
    with pytest.raises(ValueError, match=r"^v_cache: shape .* must equal k_cache's"):
        _gqa(gqa, v_cache=gqa.v[:-1].contiguous())
    with pytest.raises(ValueError, match=r"^k_cache: head dim 64 does not match q's 128"):
        _gqa(gqa, k_cache=gqa.k[..., :64].contiguous(), v_cache=gqa.v[..., :64].contiguous())
    with pytest.raises(TypeError, match=r"^k_cache: expected a CUDA array"):
        _gqa(gqa, k_cache=[1, 2])


def test_a_pinned_config_must_fit_the_call(mla):
    from kvforge.runtime.device import device_arch
    from kvforge.runtime.select import select_decode_config

    other = select_decode_config("mla_decode", device_arch(0), "bf16", 16, heads=16, head_dim=576, s_q=1)
    with pytest.raises(ValueError, match=r"^config.page_size=16 does not fit this call, which needs 64"):
        _mla(mla, config=other)


def test_no_launch_happens_on_a_rejected_call(gqa):
    import torch

    out = torch.full((2, 1, 8, 128), 7.0, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError):
        _gqa(gqa, out=out, cache_seqlens=torch.tensor([10, 10**6], dtype=torch.int32, device="cuda"),
             check_inputs=True)
    with pytest.raises(ValueError):
        _gqa(gqa, out=out, q=gqa.q[..., :96].contiguous())
    torch.cuda.synchronize()
    assert bool((out == 7.0).all())


def test_fp8_scale_errors(mla, gqa):
    """Scales with the wrong shape, dtype or device, an fp8 cache without scales, a scale for a
    16-bit or a packed cache, a packed cache for GQA: each a clear error before any launch."""
    import torch

    import kvforge

    k8 = mla.k.to(torch.float8_e4m3fn)
    pages, ps, _ = k8.shape
    with pytest.raises(ValueError, match=r"^kv_scale: block scales of kv_cache \(\d+, 64, 576\) must have shape "
                                         r"\(\d+, 64, 18\) or \(\d+, 64, 9\) or \(\d+, 64, 5\).*got \(\d+, 64, 7\)"):
        _mla(mla, kv_cache=k8, kv_scale=torch.ones(pages, ps, 7, device="cuda"))
    flat = torch.ones(pages * ps * 5 + 1, device="cuda")  # block scales whose storage starts 4 bytes in
    with pytest.raises(ValueError, match=r"^kv_scale: data pointer 0x[0-9a-f]+ is not 16-byte aligned"):
        _mla(mla, kv_cache=k8, kv_scale=flat[1:].view(pages, ps, 5))
    with pytest.raises(TypeError, match=r"^kv_scale: dtype must be fp32, got bf16"):
        _mla(mla, kv_cache=k8, kv_scale=torch.ones(1, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match=r"^kv_scale: must live on a CUDA device"):
        _mla(mla, kv_cache=k8, kv_scale=torch.ones(1))
    with pytest.raises(ValueError, match=r"^kv_scale: a per-tensor scale must be finite and non-zero, got nan"):
        _mla(mla, kv_cache=k8, kv_scale=float("nan"))
    packed, _ = kvforge.quantize_kv(mla.k.nan_to_num(), "fp8_ds_mla")
    with pytest.raises(ValueError, match=r"^kv_scale: an fp8_ds_mla cache carries its scales in each token"):
        _mla(mla, kv_cache=packed, kv_scale=1.0)
    with pytest.raises(ValueError, match=r"^kv_cache: last dimension must be 576, got shape"):
        _mla(mla, kv_cache=k8[..., :512].contiguous(), kv_scale=1.0)

    g8k, g8v = gqa.k.to(torch.float8_e4m3fn), gqa.v.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"^v_scale: required for a float8_e4m3fn v_cache"):
        _gqa(gqa, k_cache=g8k, v_cache=g8v, k_scale=1.0)
    with pytest.raises(TypeError, match=r"^v_cache: dtype fp8_e4m3 differs from k_cache's bf16"):
        _gqa(gqa, v_cache=g8v, k_scale=1.0, v_scale=1.0)
    blocks = torch.ones(*g8k.shape[:-1], 2, device="cuda")
    with pytest.raises(ValueError, match=r"^k_scale, v_scale: must be the same kind .* got per-tensor and block "
                                         r"scales of 64"):
        _gqa(gqa, k_cache=g8k, v_cache=g8v, k_scale=1.0, v_scale=blocks)
    with pytest.raises(ValueError, match=r"^k_scale: scales apply to float8_e4m3fn KV caches"):
        _gqa(gqa, k_scale=1.0, v_scale=1.0)
    ds = torch.zeros(*gqa.k.shape[:-1], 656, dtype=torch.uint8, device="cuda")
    with pytest.raises(TypeError, match=r"^k_cache: a uint8 cache of 656-byte tokens is the fp8_ds_mla layout of MLA"):
        _gqa(gqa, k_cache=ds, v_cache=ds)
    with pytest.raises(ValueError, match=r"^fp8_layout='fp8_ds_mla': supported 'per_tensor', 'block'"):
        kvforge.GQADecode(8, 2, 128, 16, max_batch=2, fp8_layout="fp8_ds_mla")
    with pytest.raises(ValueError, match=r"^scale_block_size=None: required"):
        kvforge.MLADecode(16, 64, max_batch=2, fp8_layout="block")


def test_a_softmax_scale_that_is_not_a_finite_number_is_refused_by_name(mla, gqa):
    import torch

    out = torch.full((2, 1, 16, 512), 7.0, dtype=mla.q.dtype, device="cuda")
    with pytest.raises(ValueError, match="softmax_scale: must be finite, got nan"):
        _mla(mla, softmax_scale=float("nan"), out=out)
    with pytest.raises(TypeError, match="softmax_scale: must be a real number"):
        _gqa(gqa, softmax_scale="0.1")
    torch.cuda.synchronize()
    assert bool((out == 7.0).all()), "a refused call launched a kernel that wrote out"
