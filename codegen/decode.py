"""DecodeConfig: one decode-attention kernel variant (MLA or GQA), one config class per backend.

`DecodeConfig` holds the family fields every backend shares and their checks; each backend is a
subclass (`decode_sm80.Sm80DecodeConfig`, `decode_sm90.Sm90DecodeConfig`,
`decode_cdna.CdnaDecodeConfig`) with its own fields
(the mbarrier ring, or the register-staged KV buffers), checks and derived layout, selected by the
`backend` field (`DecodeConfig.model_validate(data)` dispatches). A new backend adds a class here,
not a branch in every property. Every number a kernel needs is computed once and validated
against the target arch; a config that cannot work is rejected with the field, its value and what
would be allowed.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import policy
from .arch import BACKEND_ARCHS, ArchName, arch_spec
from .policy import DTYPE_BYTES, GQA_GROUPS, GQA_HEAD_DIMS, MAX_Q_ROWS, MAX_SPLITS, MLA_DIMS, split_plan  # noqa: F401

MAX_ACC_REGS = 128  # fp32 output accumulator registers per consumer thread we allow
WHERE = "DecodeConfig"

# backend name -> its config class (filled as the backend modules are imported, at the bottom)
BACKEND_CLASSES: dict[str, type["DecodeConfig"]] = {}
NOT_LANDED = {"sm100": "tcgen05"}


TMA_BOX_BYTES = 128  # a TMA box's inner extent: one 128-byte swizzle row
TMA_BOX_COLS = TMA_BOX_BYTES // 2  # 16-bit columns per box row


def tma_box_cols(dtype: str) -> int:
    """Elements per TMA box row of a `dtype` cache (64 16-bit, 128 fp8 values)."""
    return TMA_BOX_BYTES // DTYPE_BYTES[dtype]


def paged_map_geometry(dtype: str, row_elems: int, page_size: int, box_rows: int, per_kv_head: bool) -> dict:
    """A TMA tensor map's geometry over a contiguous paged cache [num_pages][page_size][row] of
    16-bit or fp8 elements (`DecodeConfig.tensor_maps`; runtime/tensor_map.py and the C launchers encode
    it): dims {row_elems, page_size, num_pages} (num_pages at run time; row_elems, row_bytes and
    page_bytes times num_kv_heads when `per_kv_head`), byte strides {row_bytes, page_bytes}, boxes
    of {box_cols, box_rows, 1}, 128-byte swizzle."""
    row_bytes = row_elems * DTYPE_BYTES[dtype]
    return {"dtype": dtype, "row_elems": row_elems, "page_size": page_size, "row_bytes": row_bytes,
            "page_bytes": row_bytes * page_size, "box_cols": tma_box_cols(dtype), "box_rows": box_rows,
            "per_kv_head": per_kv_head}


class DecodeConfig(BaseModel):
    """The fields and checks every backend shares. Construct through `DecodeConfig.model_validate`
    (or a backend class); the `backend` field picks the class."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backend_name: ClassVar[str] = ""

    family: Literal["mla_decode", "gqa_decode"]
    backend: str
    arch: ArchName
    head_dim_qk: int
    head_dim_v: int
    heads_per_cta: int = Field(ge=1, le=128, description="query heads (of one KV head) per CTA")
    page_size: Literal[16, 32, 64, 128]  # policy.PAGE_SIZES
    block_n: Literal[16, 32, 64, 128] = Field(description="keys per KV tile")
    q_dtype: Literal["bf16", "fp16"] = "bf16"
    kv_dtype: Literal["bf16", "fp16", "fp8_e4m3"] = "bf16"
    scale_mode: Literal["none", "per_tensor", "block", "fp8_ds_mla"] = Field(
        default="none", description="fp8 KV: one scale per tensor, block scales per token (and KV head), or "
        "DeepSeek's packed 656-byte MLA token")
    scale_block_size: Literal[32, 64, 128] | None = None
    max_s_q: int = Field(default=1, ge=1, le=8)
    lazy_rescale: bool = Field(default=False, description="online softmax (CUDA backends): move a row's running "
                               "maximum only when a tile's exceeds it by more than policy.RESCALE_SLACK_LOG2 "
                               "(P stays below 2^slack), and skip a warp's output rescale when none of its rows "
                               "moved")
    merge_in_kernel: bool = Field(default=False, description="split-KV (sm90): a sequence cut into 2 .. "
                                  "policy.MERGE_MAX_SPLITS chunks is merged by the last of its CTAs to finish "
                                  "(an atomic count per sequence and head block at the start of the workspace), "
                                  "not by the combine kernel, which then runs only for sequences cut into more")

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if cls.backend_name:
            BACKEND_CLASSES[cls.backend_name] = cls

    @classmethod
    def model_validate(cls, obj, *args, **kwargs):
        """On DecodeConfig itself: validate as the class of `obj['backend']`."""
        if cls is DecodeConfig:
            if isinstance(obj, DecodeConfig):
                return obj
            backend = obj.get("backend") if isinstance(obj, dict) else None
            target = BACKEND_CLASSES.get(backend)
            if target is None:
                raise ValueError(_unknown_backend(backend))
            return target.model_validate(obj, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)

    @model_validator(mode="before")
    @classmethod
    def _foreign_fields(cls, data):
        """A field of another backend gets a message naming the backend that uses it."""
        if isinstance(data, dict) and cls.backend_name:
            for other in BACKEND_CLASSES.values():
                for name in other.own_fields():
                    if name in data and name not in cls.model_fields:
                        if data[name] is None:  # older dumps carry the other backend's field as null
                            data = {k: v for k, v in data.items() if k != name}
                            continue
                        raise ValueError(f"{WHERE}.{name}: only the {other.backend_name} backend uses it; "
                                         f"backend {cls.backend_name!r} {cls.foreign_hint(name)}")
        return data

    @classmethod
    def own_fields(cls) -> tuple[str, ...]:
        return tuple(n for n in cls.model_fields if n not in DecodeConfig.model_fields)

    @classmethod
    def foreign_hint(cls, name: str) -> str:
        return f"takes {', '.join(cls.own_fields())}"

    @model_validator(mode="after")
    def _validate(self):
        if not self.backend_name:
            raise ValueError(f"{WHERE}: build it with DecodeConfig.model_validate(data) or a backend class "
                             f"({', '.join(sorted(BACKEND_CLASSES))})")
        where = WHERE
        if self.arch not in BACKEND_ARCHS[self.backend]:
            raise ValueError(f"{where}.arch={self.arch!r}: backend {self.backend!r} targets "
                             f"{', '.join(BACKEND_ARCHS[self.backend])}")
        if self.family == "mla_decode" and (self.head_dim_qk, self.head_dim_v) != MLA_DIMS:
            raise ValueError(f"{where}.head_dim_qk/head_dim_v={self.head_dim_qk}/{self.head_dim_v}: MLA decode "
                             "uses 576 (512 latent + 64 rope) / 512")
        if self.family == "gqa_decode":
            if self.head_dim_qk not in GQA_HEAD_DIMS:
                raise ValueError(f"{where}.head_dim_qk={self.head_dim_qk}: GQA decode supports "
                                 f"{', '.join(map(str, GQA_HEAD_DIMS))}")
            if self.head_dim_v != self.head_dim_qk:
                raise ValueError(f"{where}.head_dim_v={self.head_dim_v}: GQA needs head_dim_v == head_dim_qk "
                                 f"({self.head_dim_qk})")
            if self.heads_per_cta not in GQA_GROUPS:
                raise ValueError(f"{where}.heads_per_cta={self.heads_per_cta}: GQA packs one KV head's query "
                                 "group per CTA: 1, 2, 4, 8 or 16")
        if self.kv_dtype == "fp8_e4m3":
            if self.scale_mode == "none":
                raise ValueError(f"{where}.scale_mode='none': fp8_e4m3 KV needs 'per_tensor', 'block' or "
                                 "'fp8_ds_mla'")
            if self.scale_mode == "fp8_ds_mla" and self.family != "mla_decode":
                raise ValueError(f"{where}.scale_mode='fp8_ds_mla': DeepSeek's packed 656-byte token is an MLA "
                                 "cache layout; GQA takes 'per_tensor' or 'block'")
        elif self.scale_mode != "none":
            raise ValueError(f"{where}.scale_mode={self.scale_mode!r}: scales apply to fp8_e4m3 KV only; "
                             f"use 'none' for kv_dtype={self.kv_dtype!r}")
        elif self.kv_dtype != self.q_dtype:
            raise ValueError(f"{where}.kv_dtype={self.kv_dtype!r}: a 16-bit KV cache must match "
                             f"q_dtype={self.q_dtype!r} (the MMA takes one input type)")
        if (self.scale_mode == "block") != (self.scale_block_size is not None):
            raise ValueError(f"{where}.scale_block_size={self.scale_block_size}: required (32, 64 or 128) exactly "
                             "when scale_mode='block'")
        if self.max_s_q > 1 and self.family == "mla_decode" and self.q_rows > MAX_Q_ROWS:
            raise ValueError(f"{where}.max_s_q={self.max_s_q}: heads_per_cta * max_s_q = "
                             f"{self.heads_per_cta * self.max_s_q} query rows per CTA; at most {MAX_Q_ROWS}")
        if self.merge_in_kernel and self.backend != "sm90":
            raise ValueError(f"{where}.merge_in_kernel=True: implemented for backend 'sm90' only (got "
                             f"{self.backend!r}, whose split sequences the combine kernel merges); remove it")
        self._validate_backend(where)
        spec = arch_spec(self.arch)
        if self.threads > spec.max_threads_per_block:
            raise ValueError(f"{where}.{self.warps_field}={self.num_consumer_warps}: {self.threads} threads per "
                             f"block; {self.arch} allows {spec.max_threads_per_block}")
        if self.acc_regs_per_thread > MAX_ACC_REGS:
            raise ValueError(f"{where}.heads_per_cta={self.heads_per_cta}: the output accumulator needs "
                             f"{self.acc_regs_per_thread} fp32 registers per consumer thread (max {MAX_ACC_REGS}); "
                             "use fewer heads per CTA or more consumer warps")
        need = self.layout.total_bytes
        if need > spec.max_smem_per_block:
            raise ValueError(f"{where}.{self.stages_field}={self.num_kv_stages}: needs {need} B of shared "
                             f"memory but {self.arch} allows {spec.max_smem_per_block} B per block "
                             f"({self.layout.describe()}); use fewer stages or a smaller block_n")
        return self

    # ---- what each backend provides ----------------------------------------------------------
    warps_field: ClassVar[str] = "pipeline.num_consumer"
    stages_field: ClassVar[str] = "pipeline.num_kv_stages"

    def _validate_backend(self, where: str) -> None:
        raise NotImplementedError

    @property
    def q_rows(self) -> int:  # query rows a CTA holds (heads x s_q), padded to the MMA's M
        raise NotImplementedError

    # ---- derived, shared ---------------------------------------------------------------------
    @property
    def is_fp8(self) -> bool:
        return self.kv_dtype == "fp8_e4m3"

    @property
    def mma_dtype(self) -> str:
        """The MMA's input type. Per-tensor fp8 runs the MMAs in fp16 whatever q's dtype: e4m3 ->
        fp16 is one exact instruction per pair (the scales are folded, not multiplied), bf16 queries
        are converted once per CTA with a power-of-two scale (exact in fp16's normal range), and P
        is in [0, 1]. Everything else computes in q's dtype."""
        return "fp16" if self.scale_mode == "per_tensor" else self.q_dtype

    @property
    def scale_blocks(self) -> int:
        """fp32 scales per cached token (and KV head): ceil(D / scale_block_size) for block scales,
        the 4 latent-block scales of an fp8_ds_mla token, 0 otherwise."""
        if self.scale_mode == "block":
            return -(-self.head_dim_qk // self.scale_block_size)
        return policy.DS_MLA_SCALES if self.scale_mode == "fp8_ds_mla" else 0

    @property
    def kv_token_bytes(self) -> int:
        """Bytes of one token (of one KV head) in the cache: D elements, or the 656-byte packed token."""
        if self.scale_mode == "fp8_ds_mla":
            return policy.DS_MLA_TOKEN_BYTES
        return self.head_dim_qk * DTYPE_BYTES[self.kv_dtype]

    @property
    def min_keys_per_split(self) -> int:
        """The split planner never cuts a sequence into chunks shorter than this."""
        return policy.min_keys_per_split(self.block_n)

    def head_blocks(self, num_q_heads: int, num_kv_heads: int) -> int:
        return policy.head_blocks(self.family, num_q_heads, num_kv_heads, self.heads_per_cta)

    @property
    def wave_splits(self) -> int:
        """policy.num_splits' wave_splits: GQA grids that fill the GPU are split (up to WAVE_SPLITS
        ways) where that evens out their last wave; MLA's are not (a split's fp32 partial rows and Q
        reload cost more than the wave gains: bench/RESULTS.md)."""
        return policy.WAVE_SPLITS if self.family == "gqa_decode" else 1

    @property
    def ctas_per_sm(self) -> int:
        """CTAs that fit on one SM by shared memory (the launch-bounds hint and the split planner use it)."""
        spec = arch_spec(self.arch)
        per_sm = spec.max_smem_per_block + 1024  # the SM's carve-out: the per-block limit plus the reserve
        return max(1, min(4, per_sm // (self.layout.total_bytes + 1024)))

    def _family_fields(self, page: str) -> list[str]:
        fields = [self.family, self.backend, self.arch.replace("_", ""), f"h{self.heads_per_cta}",
                  f"{page}{self.page_size}", f"n{self.block_n}", f"q{self.q_dtype}",
                  f"kv{self.kv_dtype.replace('_e4m3', '')}"]
        fields += {"none": [], "per_tensor": ["pt"], "block": [f"sb{self.scale_block_size}"],
                   "fp8_ds_mla": ["dsmla"]}[self.scale_mode]
        if self.family == "gqa_decode":
            fields.append(f"d{self.head_dim_qk}")
        fields.append(f"sq{self.max_s_q}")
        return fields

    def name_fields(self) -> list[str]:
        """Every field that tells two variants apart, each with its own prefix: h heads per CTA,
        ps page size, n keys per tile, q/kv dtypes, pt/sb/dsmla fp8 scales, d head dim, sq max s_q; then
        the backend's own (sm80: s stages, pr/co producer/consumer warps; sm90: s stages, wg
        warpgroups, qc QK accumulator chains; cdna: MFMA, threads)."""
        return (self._family_fields("ps") + self.backend_name_fields() + (["lz"] if self.lazy_rescale else [])
                + (["mk"] if self.merge_in_kernel else []))

    @property
    def merged_splits(self) -> int:
        """Sequences cut into at most this many chunks need no combine (1: only unsplit ones; with
        merge_in_kernel, policy.MERGE_MAX_SPLITS: the main kernel merges them)."""
        return policy.MERGE_MAX_SPLITS if self.merge_in_kernel else 1

    @property
    def merge_batch(self) -> int:
        """merge_in_kernel: 16-byte units (4 fp32 columns) per split a merging thread loads at once (all splits'
        together: 8 in flight, at least 1 per split; 8 per split spills the fp8 lockstep kernel)."""
        return max(1, 8 // self.merged_splits)

    @property
    def rescale_slack_log2(self) -> float:
        """How far (log2 units) a tile's row maximum may exceed the running one before the running
        maximum moves and the output is rescaled: 0 (every increase) or, with lazy_rescale,
        policy.RESCALE_SLACK_LOG2 (P values stay below 2^slack: fine in bf16/fp16 and the fp32 sums)."""
        return policy.RESCALE_SLACK_LOG2 if self.lazy_rescale else 0.0

    def legacy_name_fields(self) -> list[str]:
        """The fields of names before kvforge 0.2 (page size as p16, ring as p4c4): still matched
        by `kvforge list/compile --filter`."""
        return self._family_fields("p") + self.legacy_backend_name_fields()

    def tensor_maps(self) -> tuple[tuple[str, str, dict], ...]:
        """The main kernel's TMA tensor-map arguments, last in its signature: (argument name, the
        cache it maps: 'k_cache' or 'v_cache', geometry) each; none by default. The geometry is
        what runtime/tensor_map.py and the C launchers encode: a contiguous cache
        [num_pages][page_size][row_elems] of 16-bit or fp8 elements (row_elems, row_bytes and page_bytes
        times num_kv_heads at run time when `per_kv_head`), boxes of {box_cols, box_rows, 1},
        128-byte swizzle."""
        return ()

    def backend_name_fields(self) -> list[str]:
        return []

    def legacy_backend_name_fields(self) -> list[str]:
        return []


def _unknown_backend(backend) -> str:
    if backend in NOT_LANDED:
        return (f"{WHERE}.backend={backend!r}: its kernels ({NOT_LANDED[backend]}) have not landed yet; use 'sm80' "
                "(mma.sync, runs on sm_80..sm_100a) or 'cdna' (AMD)")
    return f"{WHERE}.backend={backend!r}: supported backends are {', '.join(sorted(BACKEND_CLASSES))}"


from . import decode_cdna, decode_sm80, decode_sm90  # noqa: E402,F401  (each registers its backend class)
