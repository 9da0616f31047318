"""Rendering: the Jinja2 environment over templates/, variant sources and the shared headers.

Output is deterministic (same config, same bytes): no timestamps, LF endings, one trailing
newline. Templates receive the validated config and Python-computed constants only.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import jinja2
import jinja2.meta

from . import policy
from .arch import arch_spec
from .variant import Variant
from .version import VERSION

TEMPLATES_DIR = Path(str(files("kvforge.templates")))
# Shared device headers shipped verbatim (behind a banner) into generated/include/.
HEADER_DIRS = {"cuda": TEMPLATES_DIR / "cuda" / "include", "hip": TEMPLATES_DIR / "hip" / "include"}


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def banner(origin: str) -> str:
    return environment().get_template("common/banner.j2").render(version=VERSION, origin=origin).rstrip("\n")


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").rstrip("\n") + "\n"


@lru_cache(maxsize=None)
@lru_cache(maxsize=None)
def template_sources(template: str) -> tuple[str, ...]:
    """The template and every template it includes or imports, transitively (sorted names)."""
    env, seen, todo = environment(), set(), [template]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            ast = env.parse((TEMPLATES_DIR / name).read_text())
            todo += [t for t in jinja2.meta.find_referenced_templates(ast) if t is not None]
    return tuple(sorted(seen))


def template_hash(template: str) -> str:
    """SHA-256 of the template and the templates it includes or imports (`template_sources`), the
    banner and the shared headers the sources include."""
    h = hashlib.sha256()
    for name in template_sources(template):
        h.update(name.encode() + b"\0" + (TEMPLATES_DIR / name).read_bytes())
    h.update((TEMPLATES_DIR / "common" / "banner.j2").read_bytes())
    h.update(header_digest(template.split("/")[0]).encode())
    return h.hexdigest()


def render_variant(variant: Variant) -> str:
    tpl = environment().get_template(variant.template)
    text = tpl.render(
        banner=banner(f"config {variant.config_hash}"),
        name=variant.name,
        cfg=variant.config,
        **variant.template_context(),
    )
    return _normalise(text)


# The C launchers' workspace: the error record (its first 256 bytes), the merge_in_kernel counts
# (policy.MERGE_COUNTER_INTS ints, every variant alike), then the fp32 partials. Zeroed once by the caller.
WORKSPACE_COUNTERS_OFFSET = 256
WORKSPACE_HEADER_BYTES = WORKSPACE_COUNTERS_OFFSET + 4 * policy.MERGE_COUNTER_INTS


# cuTensorMapEncodeTiled's data type per 16-bit KV dtype (the C launchers' tensor maps)
TMA_DATA_TYPES = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "fp16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
                  "fp8_e4m3": "CU_TENSOR_MAP_DATA_TYPE_UINT8"}


def tensor_map_encodings(cfg) -> list[dict]:
    """What a C launcher passes to cuTensorMapEncodeTiled for each of a main kernel's tensor maps
    (`DecodeConfig.tensor_maps`: the geometry the runtime encodes) with the argument's name, the
    cache it maps and the driver's data-type name."""
    return [{**geometry, "arg": arg, "cache": cache, "data_type": TMA_DATA_TYPES[geometry["dtype"]]}
            for arg, cache, geometry in cfg.tensor_maps()]


def render_launch_header(family: str, variants: list[Variant]) -> str:
    """The C host launcher header of one decode family over the given variants. A variant whose
    main kernel takes tensor maps (TMA loads) gets them encoded by its launcher."""

    tpl = environment().get_template("cuda/decode_launch.h.j2")
    digest = hashlib.sha256("".join(v.config_hash for v in variants).encode()).hexdigest()
    kv_maps = {v.name: maps for v in variants if (maps := tensor_map_encodings(v.config))}
    pdl = {v.name for v in variants if arch_spec(v.config.arch).has_pdl}  # combine launched programmatically
    text = tpl.render(banner=banner(f"configs {digest}"), family=family, variants=variants, kv_maps=kv_maps, pdl=pdl,
                      workspace_header_bytes=WORKSPACE_HEADER_BYTES, counters_offset=WORKSPACE_COUNTERS_OFFSET,
                      merge_counter_ints=policy.MERGE_COUNTER_INTS, log2e=repr(policy.LOG2E),
                      error_ints=policy.ERROR_RECORD_INTS, err_seqlen=policy.ERR_SEQLEN, err_page=policy.ERR_PAGE)
    return _normalise(text)


def render_policy_header() -> str:
    """include/kvforge/policy.h: codegen/policy.py's C formulas for the C launchers."""
    from .policy import C_POLICY

    digest = hashlib.sha256(C_POLICY.encode()).hexdigest()
    return _normalise("\n".join([
        banner(f"policy {digest}"),
        "// kvforge/policy.h: the split count and split plan (codegen/policy.py) for host launchers.",
        "#pragma once", "namespace kvforge_policy {", C_POLICY, "}  // namespace kvforge_policy"]))


def shared_headers(language: str = "cuda") -> dict[str, str]:
    """relpath under include/ -> header text with its banner."""
    root = HEADER_DIRS[language]
    out = {}
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        if path.is_file():
            body = path.read_text()
            digest = hashlib.sha256(body.encode()).hexdigest()
            out[path.relative_to(root).as_posix()] = _normalise(banner(f"template {digest}") + "\n" + body)
    return out


@lru_cache(maxsize=None)
def header_digest(language: str = "cuda") -> str:
    """SHA-256 over the shared headers (names and bytes): part of every cache key."""
    h = hashlib.sha256()
    for rel, text in shared_headers(language).items():
        h.update(rel.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()
