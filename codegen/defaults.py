"""Matrix entries need only what matters: the fields a decode entry leaves out are filled before
validation, with what the family implies and what the runtime's variant choice would pick.

- `backend`: `cdna` for gfx arches, `sm90` for sm_90a, else `sm80`.
- MLA: `head_dim_qk = 576`, `head_dim_v = 512`; GQA: one head dim given implies the other.
- sm80: a missing `block_n`, `pipeline` or (fp8) `convert` comes from `select.sm80_choice` for the
  entry's arch, page size, heads per CTA, dtypes, fp8 layout and max_s_q (the function the
  runtime's choice calls). Every
  value the entry gives, pipeline keys included, wins over the choice.
- cdna: a missing `block_n` / `kv_buffers` comes from `select.cdna_fields` (`block_n` from the
  entry's kv_buffers when it gives those).

An entry that gives both `block_n` and `pipeline` (or `kv_buffers`) is validated as written.
The resolved values are what the variant, its name and manifest.json carry.
"""
from __future__ import annotations

from .arch import BACKEND_ARCHS
from .decode import MLA_DIMS, DecodeConfig
from .errors import ConfigError, build
from .select import cdna_fields, sm80_choice

DECODE_FAMILIES = ("mla_decode", "gqa_decode")


def default_backend(arch: str) -> str:
    return "cdna" if arch.startswith("gfx") else "sm90" if arch == "sm_90a" else "sm80"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def fill_decode_defaults(entry: dict) -> dict:
    """The entry with its implied and chosen fields filled in; anything else is left to validation."""
    if entry.get("kind") is not None or entry.get("family") not in DECODE_FAMILIES:
        return entry
    out = dict(entry)
    family, arch = out["family"], out.get("arch")
    if isinstance(arch, str) and "backend" not in out:
        out["backend"] = default_backend(arch)
    if family == "mla_decode":
        out.setdefault("head_dim_qk", MLA_DIMS[0])
        out.setdefault("head_dim_v", MLA_DIMS[1])
    elif "head_dim_qk" in out or "head_dim_v" in out:
        out.setdefault("head_dim_qk", out.get("head_dim_v"))
        out.setdefault("head_dim_v", out.get("head_dim_qk"))
    backend = out.get("backend")
    if backend == "sm80" and ("block_n" not in out or "pipeline" not in out):
        return _fill_sm80(out)
    if backend == "cdna" and ("block_n" not in out or "kv_buffers" not in out):
        return _fill_cdna(out)
    return out


def _fill_sm80(out: dict) -> dict:
    shape = [out.get(k) for k in ("heads_per_cta", "page_size", "head_dim_qk", "head_dim_v")]
    s_q, dtype = out.get("max_s_q", 1), out.get("q_dtype", "bf16")
    if (out.get("arch") not in BACKEND_ARCHS["sm80"] or not all(map(_is_int, shape)) or not _is_int(s_q)
            or not 1 <= s_q <= 8 or not 1 <= shape[0] <= 128 or dtype not in ("bf16", "fp16")):
        return out  # validation names the bad or missing field
    if not isinstance(out.get("pipeline", {}), dict):
        return out
    kv = {k: out[k] for k in ("kv_dtype", "scale_mode", "scale_block_size") if k in out}
    cfg = sm80_choice(out["family"], out["arch"], dtype, shape[1], shape[0], (shape[2], shape[3]), s_q, explicit=out,
                      kv=kv if kv.get("kv_dtype") == "fp8_e4m3" else None)
    return cfg.model_dump(mode="json")


def _fill_cdna(out: dict) -> dict:
    dims = (out.get("head_dim_qk"), out.get("head_dim_v"))
    if not all(map(_is_int, dims)):
        return out
    chosen = cdna_fields(out["family"], dims)
    buffers = out.get("kv_buffers")
    if buffers is not None:
        if isinstance(buffers, (list, tuple)) and buffers and isinstance(buffers[0], dict) and "BN" in buffers[0]:
            out.setdefault("block_n", buffers[0]["BN"])
        return out
    bn = out.setdefault("block_n", chosen["block_n"])
    out["kv_buffers"] = [dict(b) for b in chosen["kv_buffers"]]
    if _is_int(bn) and bn != chosen["block_n"]:
        out["kv_buffers"] = _buffers_for_tile(out, bn, chosen["kv_buffers"])
    return out


def _buffers_for_tile(out: dict, bn: int, chosen: tuple[dict, dict]) -> list[dict]:
    """The chosen K/V buffers re-cut for the entry's own block_n: the first (K WN, V WN) that
    validates, the chosen widths first; else the chosen ones, for validation to reject."""
    k, v = chosen
    widths = lambda first: [w for w in dict.fromkeys((first, bn // 2, bn, 16, 32)) if 1 <= w <= bn]  # noqa: E731
    for k_wn in widths(k["WN"]):
        for v_wn in widths(v["WN"]):
            buffers = [{**k, "BN": bn, "WN": k_wn}, {**v, "BN": bn, "WN": v_wn}]
            try:
                build(DecodeConfig, {**out, "kv_buffers": buffers})
            except ConfigError:
                continue
            return buffers
    return [{**k, "BN": bn}, {**v, "BN": bn}]
