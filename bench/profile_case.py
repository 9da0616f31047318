"""One bench shape, a few calls, for `ncu` (python bench/profile_case.py INDEX)."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import SHAPES, make_inputs, run_kvforge  # noqa: E402

sh = SHAPES[int(sys.argv[1])]
q, kv, bt, lens = make_inputs(sh, 1)
for _ in range(3):
    run_kvforge(sh, q, *kv[0], bt, lens)
torch.cuda.synchronize()
print("profiled", sh.label)
