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
