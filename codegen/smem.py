"""A shared-memory (LDS) layout: named regions placed at aligned offsets, computed once in Python."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    size: int


@dataclass
class SmemLayoutBuilder:
    regions: list[Region] = field(default_factory=list)
    end: int = 0

    def add(self, name: str, size: int, align: int = 128) -> Region:
        offset = -(-self.end // align) * align
        region = Region(name, offset, size)
        self.regions.append(region)
        self.end = offset + size
        return region

    def build(self) -> "SmemLayout":
        return SmemLayout(tuple(self.regions), self.end)


@dataclass(frozen=True)
class SmemLayout:
    regions: tuple[Region, ...]
    total_bytes: int

    def __getitem__(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    def describe(self) -> str:
        return ", ".join(f"{r.name} {r.size} B @ {r.offset}" for r in self.regions)
