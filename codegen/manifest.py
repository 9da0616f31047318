"""The generated tree: variant sources, shared headers and manifest.json, written or checked."""
from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path

from .cmake import cuda_decode, render_cmake, render_link_check
from .render import render_launch_header, render_policy_header, render_variant, shared_headers, template_hash
from .variant import Variant
from .version import VERSION


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render_tree(variants: list[Variant]) -> dict[str, str]:
    """relpath -> file text for the whole generated tree: sources, include/, CMakeLists.txt and
    manifest.json (deterministic, manifest last)."""
    files: dict[str, str] = {}
    languages = sorted({v.language for v in variants})
    for lang in languages:
        for rel, text in shared_headers(lang).items():
            files[f"include/{rel}"] = text
    launchers = {}
    for family in ("mla_decode", "gqa_decode"):
        fam = [v for v in variants if v.family == family and v.language == "cuda"]
        if fam:
            launchers[f"include/kvforge/{family}_launch.h"] = render_launch_header(family, fam)
    if launchers:
        files["include/kvforge/policy.h"] = render_policy_header()
        files.update(launchers)
    entries = []
    for v in variants:
        src = render_variant(v)
        files[v.relpath] = src
        entries.append({
            "name": v.name,
            "family": v.family,
            "backend": v.backend,
            "arch": v.arch,
            "config": v.config.model_dump(mode="json"),
            "config_hash": v.config_hash,
            "template": v.template,
            "template_hash": template_hash(v.template),
            "generator_version": VERSION,
            "files": {v.relpath: _sha(src)},
            "kernels": [k.to_json() for k in v.kernels],
        })
    files["CMakeLists.txt"] = render_cmake(variants)
    if cuda_decode(variants):
        files["link_check.cu"] = render_link_check(variants)
    headers = {rel: _sha(text) for rel, text in files.items() if rel.startswith("include/")}
    manifest = {"generator_version": VERSION, "headers": headers, "variants": entries}
    files["manifest.json"] = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    return files


def write_tree(files: dict[str, str], out: Path) -> list[str]:
    """Writes the tree and removes files a previous generation left that are no longer part of it."""
    out.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_bytes(text.encode())
    stale = [p for p in _existing(out) if p not in files]
    for rel in stale:
        (out / rel).unlink()
    return stale


def _existing(out: Path) -> list[str]:
    if not out.is_dir():
        return []
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def check_tree(files: dict[str, str], out: Path) -> str:
    """A unified diff between what is on disk and what generation would write ('' when fresh)."""
    chunks = []
    for rel in sorted(set(files) | set(_existing(out))):
        want = files.get(rel)
        path = out / rel
        have = path.read_text() if path.exists() else None
        if want == have:
            continue
        chunks.extend(difflib.unified_diff(
            (have or "").splitlines(keepends=True), (want or "").splitlines(keepends=True),
            fromfile=f"{out / rel}" if have is not None else "/dev/null",
            tofile=f"{out / rel} (expected)" if want is not None else "/dev/null"))
    return "".join(chunks)
