"""Shards of a variant matrix for build farms: `--shard i/n` (1-based) keeps the variants whose
name hashes to shard i of n. The hash is SHA-256 of the name alone, so adding variants to a
matrix never moves the existing ones to another shard, and every job of a CI matrix computes
the same partition without talking to the others."""
from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    index: int  # 1..count
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, name: str) -> bool:
        return shard_index(name, self.count) == self.index


def shard_index(name: str, count: int) -> int:
    """The 1-based shard of `count` that the variant `name` belongs to."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % count + 1


def parse_shard(text: str) -> Shard:
    """`i/n` with 1 <= i <= n; anything else raises argparse.ArgumentTypeError saying what is allowed."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected i/n, two integers (e.g. 1/3)") from None
    if n < 1 or not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"{text!r}: i must be in 1..n and n >= 1 (shards are numbered 1..{max(n, 1)})")
    return Shard(i, n)


def select_shard(variants: list, shard: Shard | None) -> list:
    """The variants of `shard` (all of them when shard is None), in their order."""
    return variants if shard is None else [v for v in variants if shard.holds(v.name)]
