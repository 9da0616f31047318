"""Resource use of an AMDGPU code object, read from its NT_AMDGPU_METADATA note (msgpack)."""
from __future__ import annotations

import io
from dataclasses import dataclass

import msgpack
from elftools.elf.elffile import ELFFile

NT_AMDGPU_METADATA = 32


@dataclass(frozen=True)
class AmdKernelResources:
    name: str
    vgprs: int
    agprs: int
    sgprs: int
    lds_bytes: int
    scratch_bytes: int
    vgpr_spills: int
    sgpr_spills: int


def code_object_kernels(binary: bytes) -> dict[str, AmdKernelResources]:
    """Kernel name -> resources, for every kernel in the code object."""
    elf = ELFFile(io.BytesIO(binary))
    out = {}
    for section in elf.iter_sections():
        if section.header.sh_type != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note["n_name"] != "AMDGPU" or note["n_type"] != NT_AMDGPU_METADATA:
                continue
            desc = note["n_desc"]
            meta = msgpack.unpackb(desc.encode("latin-1") if isinstance(desc, str) else bytes(desc), raw=False,
                                   strict_map_key=False)
            for k in meta.get("amdhsa.kernels", []):
                out[k[".name"]] = AmdKernelResources(
                    k[".name"], k[".vgpr_count"], k.get(".agpr_count", 0), k[".sgpr_count"],
                    k[".group_segment_fixed_size"], k[".private_segment_fixed_size"],
                    k.get(".vgpr_spill_count", 0), k.get(".sgpr_spill_count", 0))
    return out
