"""The compile cache never lies: concurrent builders, corrupt entries, fast hits, no-JIT mode."""
from __future__ import annotations

import json
import multiprocessing as mp
import time

import pytest

from kvforge.codegen.matrix import load_matrix
from kvforge.runtime import JITDisabledError, KernelCache, compile
from kvforge.runtime.compiler import clear_memo

from toolchains import needs_nvrtc

pytestmark = needs_nvrtc


def _cuda(index: int):
    return [v for v in load_matrix() if v.language == "cuda"][index]


def _build(root: str, index: int) -> tuple[bool, str]:
    import hashlib

    from kvforge.runtime import KernelCache, compile

    k = compile(_cuda(index), cache=KernelCache(root))
    return k.cache_hit, hashlib.sha256(k.cubin).hexdigest()


def test_eight_processes_compiling_one_variant_leave_one_good_entry(tmp_path):
    with mp.get_context("spawn").Pool(8) as pool:
        results = pool.starmap(_build, [(str(tmp_path), 3)] * 8)
    assert len({sha for _, sha in results}) == 1
    assert sum(not hit for hit, _ in results) == 1, "exactly one process should have built it"
    cache = KernelCache(tmp_path)
    entries = cache.entries()
    assert len(entries) == 1
    leftovers = [p for p in (tmp_path / "kernels").iterdir() if p.name.startswith(".")]
    assert leftovers == []
    meta = json.loads(entries[0].read_text())
    assert cache.get(meta["name"], meta["key"]) is not None


def test_a_corrupted_entry_is_detected_and_rebuilt(tmp_path):
    v = _cuda(1)
    cache = KernelCache(tmp_path)
    good = compile(v, cache=cache).cubin
    clear_memo()
    binary = next((tmp_path / "kernels").glob("*.bin"))
    binary.write_bytes(good[:100] + b"\0garbage" + good[108:])
    k = compile(v, cache=cache)
    assert not k.cache_hit and k.cubin == good
    clear_memo()
    assert compile(v, cache=cache).cache_hit


def test_a_truncated_metadata_file_is_a_miss_not_a_crash(tmp_path):
    v = _cuda(1)
    cache = KernelCache(tmp_path)
    compile(v, cache=cache)
    clear_memo()
    meta = next((tmp_path / "kernels").glob("*.json"))
    meta.write_text(meta.read_text()[:20])
    assert not compile(v, cache=cache).cache_hit


def test_a_disk_cache_hit_costs_under_5_ms(tmp_path):
    v = _cuda(2)
    cache = KernelCache(tmp_path)
    compile(v, cache=cache)
    times = []
    for _ in range(5):
        clear_memo()
        t0 = time.perf_counter()
        k = compile(v, cache=cache)
        times.append(time.perf_counter() - t0)
        assert k.cache_hit
    assert min(times) < 0.005, f"cache hits took {[f'{t*1e3:.2f} ms' for t in times]}"


def test_disable_jit_turns_a_miss_into_a_clear_error(tmp_path, monkeypatch):
    v = _cuda(4)
    monkeypatch.setenv("KVFORGE_DISABLE_JIT", "1")
    with pytest.raises(JITDisabledError, match="KVFORGE_DISABLE_JIT=1 and no cache entry"):
        compile(v, cache=KernelCache(tmp_path))
    monkeypatch.delenv("KVFORGE_DISABLE_JIT")
    compile(v, cache=KernelCache(tmp_path))
    clear_memo()
    monkeypatch.setenv("KVFORGE_DISABLE_JIT", "1")
    assert compile(v, cache=KernelCache(tmp_path)).cache_hit


def test_cache_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFORGE_CACHE_DIR", str(tmp_path / "x"))
    assert KernelCache().root == tmp_path / "x"


def test_the_key_changes_with_source_options_and_headers():
    from kvforge.runtime.compiler import cache_key, compile_options

    a = cache_key("src", compile_options("sm_90", False))
    assert a != cache_key("src2", compile_options("sm_90", False))
    assert a != cache_key("src", compile_options("sm_90", True))
    assert a != cache_key("src", compile_options("sm_80", False))
