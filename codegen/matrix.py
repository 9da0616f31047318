"""Variant matrices: a TOML file of config tables whose list values expand as a product.

    [[variant]]
    kind = "pipeline_selftest"
    arch = "sm_90"
    fill = ["arrive", "expect_tx"]          # a list: one variant per value
    pipeline = { num_kv_stages = [2, 3], num_qk_stages = 1 }

Lists may sit at any depth; every combination gets its family's implied and chosen defaults
(`defaults.py`), then is validated, named and deduplicated by name.
"""
from __future__ import annotations

import fnmatch
import itertools
import tomllib
from importlib.resources import files
from pathlib import Path

from .defaults import fill_decode_defaults
from .errors import ConfigError
from .variant import Variant, variant_from_dict

DEFAULT_MATRIX = Path(str(files("kvforge.codegen") / "default_matrix.toml"))


def _leaves(table: dict, prefix: tuple = ()):
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _assign(target: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


def expand(table: dict) -> list[dict]:
    """All combinations of the list-valued leaves of one matrix table, in file order."""
    leaves = list(_leaves(table))
    axes = [v if isinstance(v, list) else [v] for _, v in leaves]
    combos = []
    for values in itertools.product(*axes):
        out: dict = {}
        for (path, _), value in zip(leaves, values):
            _assign(out, path, value)
        combos.append(out)
    return combos


def load_matrix(path: str | Path | None = None) -> list[Variant]:
    """Parse, expand and validate a matrix; a bad entry raises ConfigError naming the table."""
    path = Path(path) if path else DEFAULT_MATRIX
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"matrix {path}: {err}") from None
    tables = doc.get("variant")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"matrix {path}: needs at least one [[variant]] table")
    variants: dict[str, Variant] = {}
    for i, table in enumerate(tables):
        for combo in expand(table):
            try:
                v = variant_from_dict(fill_decode_defaults(combo))
            except ConfigError as err:
                raise ConfigError(f"matrix {path}, [[variant]] #{i + 1}: {err}") from None
            variants.setdefault(v.name, v)
    return sorted(variants.values(), key=lambda v: v.name)


def filter_variants(variants: list[Variant], pattern: str | None) -> list[Variant]:
    """Glob on the variant name (a bare word matches as a substring). Names from before 0.2's
    naming (page size as p64, ring as p4c8) still match: the glob is tried on each variant's
    legacy name too."""
    if not pattern:
        return variants
    glob = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
    return [v for v in variants if fnmatch.fnmatchcase(v.name, glob) or fnmatch.fnmatchcase(v.legacy_name, glob)]
