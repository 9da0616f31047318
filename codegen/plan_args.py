"""The arguments a decode plan is made for, checked in one place: the head layout, page size, s_q, max_batch
and dtype that the runtime's plan objects (MLADecode, GQADecode) and `kvforge plan` take, and whether an arch
reads fp8 caches (the runtime's device, `kvforge plan --arch`). Each error names
the argument as its caller spells it (`num_q_heads=` in Python, `--heads=` on the command line) and the
allowed values, before anything is selected, compiled or launched."""
from __future__ import annotations

from . import policy

# How each caller spells the arguments: the plan objects' keyword arguments, the command's flags.
PYTHON_NAMES = {"heads": "num_q_heads", "kv_heads": "num_kv_heads", "head_dim": "head_dim", "page_size": "page_size",
                "s_q": "s_q", "max_batch": "max_batch", "dtype": "dtype"}
MLA_PYTHON_NAMES = {**PYTHON_NAMES, "heads": "num_heads"}
CLI_NAMES = {"heads": "--heads", "kv_heads": "--kv-heads", "head_dim": "--head-dim", "page_size": "--page-size",
             "s_q": "--s-q", "max_batch": "--max-batch", "dtype": "--dtype"}


def _listed(values) -> str:
    return ", ".join(map(str, values))


def check_plan_args(family: str, names: dict[str, str], *, heads: int, page_size: int, s_q: int, max_batch: int,
                    dtype: str, kv_heads: int = 1, head_dim: int = policy.MLA_DIMS[0]) -> None:
    """Raise ValueError, naming the argument by `names`, unless a plan of `family` ('mla_decode' or
    'gqa_decode') supports these arguments (MLA: kv_heads 1 and head_dim 576, as its callers pass them)."""
    n = names
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"{n['dtype']}={dtype!r}: supported 'bf16', 'fp16'")
    if family == "mla_decode":
        if not 1 <= heads <= policy.MLA_MAX_HEADS:
            raise ValueError(f"{n['heads']}={heads}: MLA decode supports 1..{policy.MLA_MAX_HEADS}")
    else:
        if head_dim not in policy.GQA_HEAD_DIMS:
            raise ValueError(f"{n['head_dim']}={head_dim}: supported {_listed(policy.GQA_HEAD_DIMS)}")
        if kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"{n['kv_heads']}={kv_heads}: must divide {n['heads']}={heads}")
        if heads // kv_heads not in policy.GQA_GROUPS:
            raise ValueError(f"{n['heads']}={heads}, {n['kv_heads']}={kv_heads}: the group {heads // kv_heads} must "
                             f"be one of {_listed(policy.GQA_GROUPS)}")
    if page_size not in policy.PAGE_SIZES:
        raise ValueError(f"{n['page_size']}={page_size}: supported {_listed(policy.PAGE_SIZES)}")
    if not 1 <= s_q <= policy.MAX_S_Q:
        raise ValueError(f"{n['s_q']}={s_q}: supported 1..{policy.MAX_S_Q}")
    if max_batch < 1:
        raise ValueError(f"{n['max_batch']}={max_batch}: must be at least 1")


def check_fp8_arch(arch: str, arg: str, device: str) -> None:
    """Raise ValueError naming `arg` (the fp8 cache or flag) unless `arch` reads fp8 e4m3 KV: a CUDA arch with the
    hardware e4m3 conversion (sm_89 and newer). `device` says where the arch came from ('this device is',
    '--arch')."""
    from .decode_sm80 import FP8_ARCHS

    if arch.startswith("gfx"):
        raise ValueError(f"{arg}: fp8 KV caches are not supported on AMD GPUs ({device} {arch}: the cdna backend "
                         "reads bf16/fp16; MI300's native fp8 is e4m3fnuz)")
    if arch not in FP8_ARCHS:
        raise ValueError(f"{arg}: fp8 KV needs the hardware e4m3 conversion of sm_89 and newer ({device} {arch}); "
                         "use a bf16/fp16 cache")
