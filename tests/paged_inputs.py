"""Random paged decode inputs for the GPU tests: shuffled pages, NaN in every page no sequence
owns, out-of-range block-table entries past each sequence, fresh random values every call."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BAD_PAGE = 2**30  # block-table filler past each sequence: any read of it faults


@dataclass
class PagedCase:
    q: object
    k: object      # MLA: the latent cache [P, ps, 576]; GQA: [P, ps, Hkv, D]
    v: object
    block_table: object
    seqlens: object
    host: dict


def make_case(family, *, batch, s_q, hq, hkv, d, page_size, lens, dtype="bf16", seed=0, extra_pages=3):
    import torch

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    rng = np.random.default_rng(seed)
    lens = list(lens)
    assert len(lens) == batch
    need = [-(-n // page_size) for n in lens]
    max_pages = max(max(need), 1) + 1
    num_pages = sum(need) + extra_pages
    perm = rng.permutation(num_pages)
    bt = np.full((batch, max_pages), BAD_PAGE, dtype=np.int32)
    at = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[at:at + n]
        at += n
    unused = perm[at:]
    dqk = 576 if family == "mla_decode" else d
    kshape = (num_pages, page_size, 1 if family == "mla_decode" else hkv, dqk)
    k = rng.standard_normal(kshape).astype(np.float32)
    v = k if family == "mla_decode" else rng.standard_normal(kshape).astype(np.float32)
    k[unused] = np.nan
    if family != "mla_decode":
        v[unused] = np.nan
    # tokens past the end of each sequence inside its last page: NaN too
    for b, n in enumerate(lens):
        if n % page_size:
            k[bt[b, n // page_size], n % page_size:] = np.nan
            if family != "mla_decode":
                v[bt[b, n // page_size], n % page_size:] = np.nan
    q = rng.standard_normal((batch, s_q, hq, dqk)).astype(np.float32)
    # round to the device dtype first, so the reference sees exactly what the kernel sees
    tq = torch.from_numpy(q).to(tdt)
    tk = torch.from_numpy(k).to(tdt)
    tv = tk if family == "mla_decode" else torch.from_numpy(v).to(tdt)
    host = {"q": tq.double().numpy(), "k": tk.double().numpy(), "v": tv.double().numpy(), "bt": bt,
            "lens": np.array(lens, dtype=np.int32)}
    dev = "cuda"
    k_dev = tk.to(dev)
    if family == "mla_decode":
        k_dev = k_dev.reshape(num_pages, page_size, dqk)
    return PagedCase(tq.to(dev), k_dev, None if family == "mla_decode" else tv.to(dev),
                     torch.from_numpy(bt).to(dev), torch.tensor(lens, dtype=torch.int32, device=dev), host)


def rel_l2(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def reference(family, host, *, causal, scale=None, k=None, v=None):
    """(out, lse) of the float64 reference for a case's host arrays; `k`/`v` replace its caches
    ([num_pages, page_size, Hkv, D], e.g. a dequantized fp8 cache); the scale defaults to 1/sqrt(D)."""
    import math

    from kvforge.runtime.reference import paged_decode_reference

    mla = family == "mla_decode"
    if k is None:
        k = host["k"] if not mla else host["k"].reshape(host["k"].shape[0], host["k"].shape[1], 1, -1)
        v = k if mla else host["v"]
    scale = 1 / math.sqrt(host["q"].shape[-1]) if scale is None else scale
    return paged_decode_reference(host["q"], k, v, host["bt"], host["lens"], scale=scale, causal=causal,
                                  v_dim=512 if mla else None)


def assert_matches(got_o, got_l, want_o, want_l, *, tol=1e-2, what="") -> float:
    """The kernel's out/lse (arrays or tensors) against the reference: no NaN, relative L2 of out
    under `tol`, -inf lse exactly where the reference has it (rows that see no key), finite lse
    within 2e-2. Returns the relative L2 error."""
    got_o = _host(got_o).reshape(want_o.shape)
    got_l = _host(got_l).reshape(want_l.shape)
    where = f"{what}: " if what else ""
    assert not np.isnan(got_o).any(), f"{where}output has NaN: an element was not written or a stray read leaked in"
    assert not np.isnan(got_l).any(), f"{where}lse has NaN"
    err = rel_l2(got_o, want_o)
    assert err < tol, f"{where}relative L2 error {err:.2e}"
    np.testing.assert_array_equal(np.isneginf(got_l), np.isneginf(want_l), err_msg=f"{where}-inf lse rows differ")
    fin = np.isfinite(want_l)
    np.testing.assert_allclose(got_l[fin], want_l[fin], rtol=0, atol=2e-2, err_msg=f"{where}lse")
    return err


def _host(x):
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)
