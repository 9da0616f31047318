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

    def overlay(self, name: str, over: str, size: int) -> Region:
        """A region placed at region `over`'s offset, sharing its bytes (and any after it) on purpose: build()
        must then declare it an alias of each region it reaches, and refuses it reaching any other."""
        region = Region(name, next(r.offset for r in self.regions if r.name == over), size)
        self.regions.append(region)
        return region

    def build(self, aliases: tuple[tuple[str, str], ...] = ()) -> "SmemLayout":
        layout = SmemLayout(tuple(self.regions), self.end, aliases)
        clash = layout.overlaps()
        if clash:
            raise ValueError(f"shared-memory layout: regions overlap without being declared aliases: {clash} "
                             f"({layout.describe()})")
        return layout


@dataclass(frozen=True)
class SmemLayout:
    regions: tuple[Region, ...]
    total_bytes: int
    aliases: tuple[tuple[str, str], ...] = ()  # region pairs that share bytes on purpose

    def overlaps(self) -> list[tuple[str, str]]:
        """Pairs of non-empty regions whose byte ranges intersect and are not declared aliases,
        plus any region reaching past total_bytes (paired with '<end>')."""
        bad = []
        allowed = {frozenset(p) for p in self.aliases}
        live = [r for r in self.regions if r.size > 0]
        for i, a in enumerate(live):
            if a.offset < 0 or a.offset + a.size > self.total_bytes:
                bad.append((a.name, "<end>"))
            for b in live[i + 1:]:
                if a.offset < b.offset + b.size and b.offset < a.offset + a.size and frozenset((a.name, b.name)) not in allowed:
                    bad.append((a.name, b.name))
        return bad

    def __getitem__(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    def describe(self) -> str:
        return ", ".join(f"{r.name} {r.size} B @ {r.offset}" for r in self.regions)
