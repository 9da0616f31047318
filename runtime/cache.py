"""The on-disk compile cache: entries keyed by SHA-256, written atomically under a file lock.

An entry is `<name>-<key>.bin` (the code object) plus `<name>-<key>.json` (metadata holding the
binary's SHA-256), written to a staging file and renamed into place, metadata last. A missing or
corrupt entry is not an error: `get` returns None so the caller rebuilds.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from platformdirs import user_cache_dir


def default_cache_dir() -> Path:
    env = os.environ.get("KVFORGE_CACHE_DIR")
    return Path(env) if env else Path(user_cache_dir("kvforge"))


@dataclass(frozen=True)
class CacheEntry:
    binary: bytes
    meta: dict


class KernelCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_cache_dir()

    def _stem(self, name: str, key: str) -> Path:
        return self.root / "kernels" / f"{name}-{key[:24]}"

    def lock(self, name: str, key: str) -> FileLock:
        """Held by a builder while it compiles and writes one entry."""
        stem = self._stem(name, key)
        stem.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(stem) + ".lock")

    def get(self, name: str, key: str) -> CacheEntry | None:
        """The entry for (name, key), or None when it is missing or fails its checksum."""
        stem = self._stem(name, key)
        try:
            meta = json.loads(stem.with_suffix(".json").read_text())
            binary = stem.with_suffix(".bin").read_bytes()
        except (OSError, ValueError):
            return None
        if meta.get("key") != key or meta.get("sha256") != hashlib.sha256(binary).hexdigest():
            return None
        return CacheEntry(binary, meta)

    def put(self, name: str, key: str, binary: bytes, meta: dict) -> CacheEntry:
        """Writes the entry atomically (binary first, metadata last); call with the lock held."""
        stem = self._stem(name, key)
        stem.parent.mkdir(parents=True, exist_ok=True)
        meta = {**meta, "key": key, "sha256": hashlib.sha256(binary).hexdigest()}
        self._atomic_write(stem.with_suffix(".bin"), binary)
        self._atomic_write(stem.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True).encode())
        return CacheEntry(binary, meta)

    @staticmethod
    def _atomic_write(path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def entries(self) -> list[Path]:
        d = self.root / "kernels"
        return sorted(d.glob("*.json")) if d.is_dir() else []

    def size_bytes(self) -> int:
        d = self.root / "kernels"
        return sum(p.stat().st_size for p in d.iterdir() if p.is_file()) if d.is_dir() else 0

    def clear(self) -> int:
        n = len(self.entries())
        shutil.rmtree(self.root / "kernels", ignore_errors=True)
        return n
