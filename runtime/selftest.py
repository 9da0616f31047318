"""Launching and checking the pipeline self-test kernel (the default matrix's runnable kernel)."""
from __future__ import annotations

import numpy as np

from kvforge.codegen.variant import Variant

from .compiler import compile
from .device import sm_count
from .launch import load, resolve_stream
from .tensors import device_view


def launch_pipeline_selftest(variant: Variant, src, out, *, stream=None, debug: bool = False,
                             grid: int | None = None, device_id: int = 0) -> None:
    """src: uint32 [num_tiles * tile_words]; out: uint32 [num_tiles, num_qk_stages, num_consumer]."""
    cfg = variant.config
    tile_words = cfg.tile_bytes // 4
    s = device_view(src, "src", dtype="uint32", ndim=1, device_id=device_id)
    o = device_view(out, "out", dtype="uint32", ndim=3, device_id=device_id)
    n = s.shape[0]
    if n == 0 or n % tile_words:
        raise ValueError(f"src: length {n} must be a positive multiple of the tile ({tile_words} words)")
    num_tiles = n // tile_words
    want = (num_tiles, cfg.pipeline.num_qk_stages, cfg.pipeline.num_consumer)
    if tuple(o.shape) != want:
        raise ValueError(f"out: shape must be {want}, got {tuple(o.shape)}")
    contract = variant.main_kernel
    kernel = load(compile(variant, debug=debug), contract.symbol, contract.dynamic_smem_bytes, device_id)
    blocks = grid or min(num_tiles, sm_count(device_id))
    kernel.launch((blocks, 1, 1), contract.block, contract.dynamic_smem_bytes,
                  resolve_stream(stream, device_id), s.ptr, o.ptr, np.int32(num_tiles))


def reference_sums(data: np.ndarray, variant: Variant) -> np.ndarray:
    """What the consumers must write: wrapping uint32 sums per (tile, sub-stage, consumer)."""
    p = variant.config.pipeline
    parts = data.reshape(-1, p.num_qk_stages, p.num_consumer, variant.config.slot_bytes // 4 // p.num_consumer)
    return (parts.astype(np.uint64).sum(axis=-1) & 0xFFFFFFFF).astype(np.uint32)


def check_pipeline_selftest(variant: Variant, *, mib: int = 256, debug: bool = False, seed: int = 0,
                            repeats: int = 0) -> dict:
    """Streams `mib` MiB of fresh random words through the ring and compares with NumPy.

    Returns {'ok', 'mismatches', 'tiles', 'median_ms', 'gbps'} (timing only when repeats > 0).
    Uses torch for device buffers.
    """
    import torch

    tile_words = variant.config.tile_bytes // 4
    num_tiles = max(1, (mib << 20) // variant.config.tile_bytes)
    rng = np.random.default_rng(seed)
    host = rng.integers(0, 2**32, size=num_tiles * tile_words, dtype=np.uint32)
    src = torch.from_numpy(host.view(np.int32)).cuda().view(torch.uint32)
    p = variant.config.pipeline
    out = torch.full((num_tiles, p.num_qk_stages, p.num_consumer), -1, dtype=torch.int32, device="cuda")
    out = out.view(torch.uint32)
    stream = torch.cuda.current_stream().cuda_stream
    launch_pipeline_selftest(variant, src, out, debug=debug, stream=stream)
    torch.cuda.synchronize()
    got = out.view(torch.int32).cpu().numpy().view(np.uint32)
    want = reference_sums(host, variant)
    mismatches = int((got != want).sum())
    result = {"ok": mismatches == 0, "mismatches": mismatches, "tiles": num_tiles}
    if repeats:
        times = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            launch_pipeline_selftest(variant, src, out, debug=debug, stream=stream)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        ms = float(np.median(times))
        result.update(median_ms=ms, gbps=host.nbytes / ms / 1e6)
    return result
