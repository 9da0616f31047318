"""Resource use of a compiled kernel: registers and static shared memory read from the cubin's
ELF (.nv.info attributes and the .nv.shared section), spills and stack from ptxas's report."""
from __future__ import annotations

import io
import re
import struct
from dataclasses import asdict, dataclass

from elftools.elf.elffile import ELFFile

EIATTR_REGCOUNT = 0x2F
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4


@dataclass(frozen=True)
class KernelResources:
    registers: int
    static_smem_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_frame_bytes: int

    def to_json(self) -> dict:
        return asdict(self)


def _nv_info_attrs(data: bytes):
    pos = 0
    while pos + 2 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        pos += 2
        if fmt == EIFMT_NVAL:
            yield attr, b""
        elif fmt == EIFMT_BVAL:
            yield attr, data[pos:pos + 1]
            pos += 1
        elif fmt == EIFMT_HVAL:
            yield attr, data[pos:pos + 2]
            pos += 2
        elif fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, pos)
            yield attr, data[pos + 2:pos + 2 + size]
            pos += 2 + size
        else:
            return


def cubin_resources(cubin: bytes, kernel: str) -> tuple[int, int]:
    """(registers, static shared bytes) of `kernel`, read from the cubin."""
    elf = ELFFile(io.BytesIO(cubin))
    symtab = elf.get_section_by_name(".symtab")
    sym_index = next((i for i, s in enumerate(symtab.iter_symbols()) if s.name == kernel), None)
    if sym_index is None:
        raise ValueError(f"kernel {kernel!r} is not in the cubin")
    registers = static_smem = 0
    for section in elf.iter_sections():
        if section.name == ".nv.info":  # per-function attributes: (symbol index, value)
            for attr, value in _nv_info_attrs(section.data()):
                if attr == EIATTR_REGCOUNT and len(value) >= 8:
                    sym, count = struct.unpack_from("<II", value)
                    if sym == sym_index:
                        registers = count
        elif section.name == f".nv.shared.{kernel}":
            # On sm_90+ this includes the 1 KB the system reserves per block.
            static_smem = section["sh_size"]
    return registers, static_smem


# ptxas -v: "Function properties for <kernel>" then its stack and spill line, per kernel of the module
_SPILLS = re.compile(r"Function properties for (\S+)\s*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                     r"(\d+) bytes spill loads")


def ptxas_spills(ptxas_log: str, kernel: str) -> tuple[int, int, int]:
    """(stack frame, spill store, spill load bytes) of `kernel` from its own ptxas line, not another
    kernel's of the same module (a decode module holds the main and the combine kernel); zeros
    when the log has none for it."""
    found = {m.group(1): m.groups()[1:] for m in _SPILLS.finditer(ptxas_log)}
    stack, stores, loads = (int(g) for g in found.get(kernel, (0, 0, 0)))
    return stack, stores, loads


def kernel_resources(cubin: bytes, kernel: str, ptxas_log: str) -> KernelResources:
    registers, static_smem = cubin_resources(cubin, kernel)
    stack, stores, loads = ptxas_spills(ptxas_log, kernel)
    return KernelResources(registers, static_smem, stores, loads, stack)
