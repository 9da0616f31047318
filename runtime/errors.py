"""Errors of the runtime's compile and launch halves."""
from __future__ import annotations

import re


class CompileError(RuntimeError):
    """A variant failed to compile: carries the variant, the arch, the compiler log and the
    offending source lines."""

    def __init__(self, variant: str, arch: str, log: str, source: str = "", filename: str = ""):
        self.variant, self.arch, self.log = variant, arch, log
        self.source_lines = offending_lines(log, source, filename)
        msg = f"compiling {variant} for {arch} failed:\n{log.strip()}"
        if self.source_lines:
            msg += "\n\noffending source lines:\n" + self.source_lines
        super().__init__(msg)
        self._args = (variant, arch, log, source, filename)

    def __reduce__(self):  # picklable across process pools (kvforge compile runs NVRTC in workers)
        return (type(self), self._args)


class JITDisabledError(CompileError):
    """KVFORGE_DISABLE_JIT=1 and the kernel is not in the cache."""


def offending_lines(log: str, source: str, filename: str, context: int = 2) -> str:
    """The source lines the compiler log points at, with line numbers."""
    if not source:
        return ""
    lines = source.splitlines()
    name = re.escape(filename) if filename else r"[^(\s]+"
    # NVRTC writes `file(LINE): error`, clang `file:LINE:COL: error`
    pattern = re.compile(name + r"(?:\((\d+)\)|:(\d+):\d+): (?:fatal )?(?:error|catastrophic)")
    hits = sorted({int(m.group(1) or m.group(2)) for m in pattern.finditer(log)})
    shown: list[str] = []
    for n in hits:
        for i in range(max(1, n - context), min(len(lines), n + context) + 1):
            mark = ">>" if i == n else "  "
            shown.append(f"{mark} {i:5d} | {lines[i - 1]}")
        shown.append("   -----")
    return "\n".join(shown[:-1])
