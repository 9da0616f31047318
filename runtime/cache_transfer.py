"""Moving compile-cache entries between caches: `kvforge cache export DIR` / `import DIR`, so the
jobs of a build farm each compile a shard and their entries merge into one cache.

An exported folder is itself a cache root (`DIR/kernels/<name>-<key>.bin|.json`). Every entry is
checked before it is copied (its metadata parses, names the entry its file name says, and holds
the binary's SHA-256), written with the cache's own atomic put (binary first, metadata last,
under the entry's lock), and never written over a valid entry of the destination.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .cache import CacheEntry, KernelCache


@dataclass
class TransferReport:
    copied: int = 0
    present: int = 0  # already valid in the destination: left as it was
    rejected: list[Path] = field(default_factory=list)  # corrupt or misnamed in the source: not copied


def valid_entry(cache: KernelCache, meta_path: Path) -> tuple[str, str, CacheEntry] | None:
    """(name, key, entry) of the entry whose metadata file is `meta_path`, or None when it is
    corrupt: unreadable, misnamed, or failing its checksum."""
    try:
        meta = json.loads(meta_path.read_text())
        name, key = meta["name"], meta["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(name, str) and isinstance(key, str)):
        return None
    if cache._stem(name, key).with_suffix(".json") != meta_path:
        return None
    entry = cache.get(name, key)
    return None if entry is None else (name, key, entry)


def transfer(src: KernelCache, dst: KernelCache) -> TransferReport:
    """Copies every valid entry of `src` that `dst` lacks (or holds only a corrupt copy of)."""
    report = TransferReport()
    for meta_path in src.entries():
        found = valid_entry(src, meta_path)
        if found is None:
            report.rejected.append(meta_path)
            continue
        name, key, entry = found
        if dst.get(name, key) is not None:
            report.present += 1
            continue
        with dst.lock(name, key):
            if dst.get(name, key) is None:
                dst.put(name, key, entry.binary, entry.meta)
                report.copied += 1
            else:
                report.present += 1
    return report
