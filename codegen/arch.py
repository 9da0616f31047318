"""Target architectures: the per-arch limits every config model validates against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ArchName = Literal["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "gfx90a", "gfx942"]


@dataclass(frozen=True)
class ArchSpec:
    name: str
    vendor: Literal["nvidia", "amd"]
    compute_capability: int  # 80, 90, ... for NVIDIA; 0 for AMD
    max_smem_per_block: int  # bytes a block may opt in to (LDS per workgroup on AMD)
    max_threads_per_block: int
    max_registers_per_thread: int
    warp_size: int

    @property
    def has_tma(self) -> bool:
        """mbarrier expect-tx, try_wait and cp.async.bulk exist from sm_90 on."""
        return self.vendor == "nvidia" and self.compute_capability >= 90

    @property
    def has_pdl(self) -> bool:
        """Programmatic dependent launch (griddepcontrol, launch attribute) exists from sm_90 on."""
        return self.vendor == "nvidia" and self.compute_capability >= 90


ARCHS: dict[str, ArchSpec] = {
    a.name: a
    for a in (
        ArchSpec("sm_80", "nvidia", 80, 166912, 1024, 255, 32),
        ArchSpec("sm_86", "nvidia", 86, 101376, 1024, 255, 32),
        ArchSpec("sm_89", "nvidia", 89, 101376, 1024, 255, 32),
        ArchSpec("sm_90", "nvidia", 90, 232448, 1024, 255, 32),
        ArchSpec("sm_90a", "nvidia", 90, 232448, 1024, 255, 32),
        ArchSpec("sm_100a", "nvidia", 100, 232448, 1024, 255, 32),
        ArchSpec("gfx90a", "amd", 0, 65536, 1024, 512, 64),
        ArchSpec("gfx942", "amd", 0, 65536, 1024, 512, 64),
    )
}

# Which arches each backend may target. sm80 cubins are built for the exact arch they run on,
# so sm_90 / sm_100a appear here: the portable mma.sync + cp.async code runs there too.
BACKEND_ARCHS: dict[str, tuple[str, ...]] = {
    "sm80": ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100a"),
    "sm90": ("sm_90a",),
    "sm100": ("sm_100a",),
    "cdna": ("gfx90a", "gfx942"),
}


def arch_spec(name: str) -> ArchSpec:
    return ARCHS[name]


def nvidia_arch_for_capability(major: int, minor: int) -> str:
    """The cubin arch for a device's compute capability (e.g. (9, 0) -> 'sm_90')."""
    name = f"sm_{major}{minor}"
    if name not in ARCHS:
        raise ValueError(f"compute capability {major}.{minor} is not a supported target; "
                         f"supported: {', '.join(a for a in ARCHS if a.startswith('sm_'))}")
    return name
