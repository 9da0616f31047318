"""Variant names and config hashes: the one place a kernel name is formatted."""
from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel


def canonical_json(config: BaseModel) -> str:
    """Sorted keys, no whitespace: the bytes the config hash is taken over."""
    return json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def config_hash(config: BaseModel) -> str:
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def variant_name(config) -> str:
    """`kvforge_<family>_<backend/arch>_<fields...>_<8 hex of the config hash>`; a C identifier."""
    name = "_".join(["kvforge", *config.name_fields(), config_hash(config)[:8]])
    assert name.isidentifier(), name
    return name


def legacy_variant_name(config) -> str:
    """The pre-0.2 name of a config (fields without their distinguishing prefixes)."""
    fields = config.legacy_name_fields() if hasattr(config, "legacy_name_fields") else config.name_fields()
    return "_".join(["kvforge", *fields, config_hash(config)[:8]])
