"""Kernel launch contracts: each kernel's symbol, arguments (with C types), grid, block and
dynamic shared memory, defined once.

Every emitted form is printed from these objects: the kernel signatures in the templates
(`params`), the declarations and launches in the C host launchers (`declaration`, `grid_c`),
manifest.json (`to_json`) and the Python launch (`grid_for`, the argument order). A test parses
each rendered kernel's signature back and compares it with its contract.
"""
from __future__ import annotations

from dataclasses import dataclass

from .decode import DecodeConfig
from .policy import C_TYPES, HIP_ELEMENT_C_TYPE
from .selftest import PipelineSelfTestConfig


TENSOR_MAP_CTYPE = "const __grid_constant__ kvforge::sm90::TensorMap"  # kvforge/sm90_tile.cuh
FP8_CACHE_CTYPE = "unsigned char"  # fp8 caches are bytes: e4m3 values (and the packed token's scales and rope)
FP8_SCALE_ARGS = ("const float* k_scale", "const float* v_scale", "float k_scale_value", "float v_scale_value")


@dataclass(frozen=True)
class KernelArg:
    name: str
    ctype: str

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def scalar_kind(self) -> str:
        """'ptr', 'int' (32-bit), 'float' (32-bit) or 'tmap' (a 128-byte CUtensorMap passed by value):
        how the runtime packs the value."""
        if self.is_pointer:
            return "ptr"
        if self.ctype == TENSOR_MAP_CTYPE:
            return "tmap"
        return {"int": "int", "float": "float"}[self.ctype]


@dataclass(frozen=True)
class GridDim:
    """One grid dimension: ceil(`var` / `div`) over a run-time value, or a constant when var is None."""

    var: str | None = None
    div: int = 1
    const: int = 1

    def c(self) -> str:
        if self.var is None:
            return str(self.const)
        return self.var if self.div == 1 else f"({self.var} + {self.div - 1}) / {self.div}"

    def value(self, values: dict[str, int]) -> int:
        if self.var is None:
            return self.const
        return -(-values[self.var] // self.div)


@dataclass(frozen=True)
class KernelContract:
    role: str  # "main", "combine", "selftest"
    symbol: str
    grid: tuple[GridDim, GridDim, GridDim]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    args: tuple[KernelArg, ...]

    @property
    def params(self) -> str:
        """The parameter list of the kernel's definition (pointers `__restrict__`)."""
        return ", ".join(f"{a.ctype} __restrict__ {a.name}" if a.is_pointer else f"{a.ctype} {a.name}"
                         for a in self.args)

    @property
    def declaration(self) -> str:
        return f'extern "C" __global__ void {self.symbol}({", ".join(a.ctype for a in self.args)});'

    @property
    def grid_c(self) -> str:
        return f"dim3({', '.join(d.c() for d in self.grid)})"

    def grid_for(self, values: dict[str, int]) -> tuple[int, int, int]:
        return tuple(d.value(values) for d in self.grid)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def to_json(self) -> dict:
        return {
            "role": self.role,
            "symbol": self.symbol,
            "grid": [d.c() for d in self.grid],
            "block": list(self.block),
            "dynamic_smem_bytes": self.dynamic_smem_bytes,
            "args": [{"name": a.name, "ctype": a.ctype} for a in self.args],
        }


def _args(*pairs: str) -> tuple[KernelArg, ...]:
    return tuple(KernelArg(name=p.rsplit(" ", 1)[1], ctype=p.rsplit(" ", 1)[0]) for p in pairs)


# Measured on the H200 (docs/architecture.md): 512 threads win at b=1 (64 splits) by 7% and lose
# 9% at b=32 (2 splits), 128 the reverse; 256 is the compromise.
CUDA_COMBINE_THREADS = 256


def combine_threads(cfg: DecodeConfig) -> int:
    """Threads of the combine kernel. CUDA: 256, in groups of head_dim_v / 4 threads (four output
    columns each) that each add a share of the splits (`combine_groups`); HIP: one output column
    per thread, 32..256."""
    if cfg.backend == "cdna":
        return min(256, max(32, cfg.head_dim_v // 2))
    return CUDA_COMBINE_THREADS


def combine_groups(cfg: DecodeConfig) -> int:
    """The CUDA combine kernel's thread groups: each adds every combine_groups-th split."""
    return CUDA_COMBINE_THREADS // (cfg.head_dim_v // 4)


def selftest_kernels(name: str, cfg: PipelineSelfTestConfig) -> dict[str, KernelContract]:
    return {"selftest": KernelContract("selftest", name, (GridDim("num_ctas"), GridDim(), GridDim()),
                                       (cfg.threads, 1, 1), cfg.layout.total_bytes,
                                       _args("const uint4* src", "unsigned int* out", "int num_tiles"))}


MERGE_ARGS = ("int* merge_counters",)  # merge_in_kernel variants: the per-(sequence, head block) counts


def decode_kernels(name: str, cfg: DecodeConfig) -> dict[str, KernelContract]:
    """The main kernel (split-KV planned inside it from cache_seqlens) and the combine kernel.
    fp8 main kernels take the caches as bytes and four more arguments: `k_scale`/`v_scale` (the
    block-scale tensors, or a 1-element device scale per tensor, or null: then `k_scale_value`/
    `v_scale_value`). Variants with merge_in_kernel take `merge_counters` next (the zeroed counts at
    the workspace's start, `policy.MERGE_COUNTER_INTS`). Main kernels loading tiles by TMA take their tensor maps last
    (`DecodeConfig.tensor_maps`): sm90 MLA of 16-bit caches `kv_map` (fp8 tiles are bulk-copied
    from `k_cache`), sm80-kernel GQA with kv_load='tma' `k_map` and `v_map`."""
    t = HIP_ELEMENT_C_TYPE if cfg.backend == "cdna" else C_TYPES[cfg.q_dtype]
    kv_t = FP8_CACHE_CTYPE if cfg.is_fp8 else t
    scales = FP8_SCALE_ARGS if cfg.is_fp8 else ()
    heads = GridDim("num_q_heads", cfg.heads_per_cta) if cfg.family == "mla_decode" else GridDim("num_kv_heads")
    # The HIP kernels hold their LDS in a static array: no dynamic shared memory to request.
    smem = 0 if cfg.backend == "cdna" else cfg.layout.total_bytes
    main = KernelContract(
        "main", name, (heads, GridDim("batch"), GridDim("num_splits")), (cfg.threads, 1, 1), smem,
        _args(f"const {t}* q", f"const {kv_t}* k_cache", f"const {kv_t}* v_cache", "const int* block_table",
              "const int* seqlens", f"{t}* out", "float* lse", "float* part_o", "float* part_lse", "int* error_word",
              "int s_q", "int num_q_heads", "int num_kv_heads", "int num_pages", "int max_pages", "int num_splits",
              "float scale_log2", "int causal", *scales, *(MERGE_ARGS if cfg.merge_in_kernel else ()),
              *(f"{TENSOR_MAP_CTYPE} {arg}" for arg, _, _ in cfg.tensor_maps())))
    combine = KernelContract(
        "combine", f"{name}_combine", (GridDim("num_q_heads"), GridDim("s_q"), GridDim("batch")),
        (combine_threads(cfg), 1, 1), 0,
        _args("const float* part_o", "const float* part_lse", "const int* seqlens", f"{t}* out", "float* lse",
              "int s_q", "int num_q_heads", "int num_splits"))
    return {"main": main, "combine": combine}
