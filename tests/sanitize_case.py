"""One small decode call per family, run under compute-sanitizer by test_sanitizer_gpu.py."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from paged_inputs import make_case  # noqa: E402

import kvforge  # noqa: E402

family = sys.argv[1]
if family == "mla_decode":
    case = make_case(family, batch=2, s_q=2, hq=16, hkv=1, d=576, page_size=32, lens=[70, 5], seed=1)
    kvforge.mla_decode(case.q, case.k, case.block_table, case.seqlens, causal=True)
else:
    case = make_case(family, batch=2, s_q=1, hq=8, hkv=2, d=128, page_size=16, lens=[70, 5], seed=1)
    kvforge.gqa_decode(case.q, case.k, case.v, case.block_table, case.seqlens)
torch.cuda.synchronize()
print("sanitized run done")
