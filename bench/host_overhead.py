"""Host time per eager decode call (no sync inside the loop), and where it goes (cProfile).

    python bench/host_overhead.py
"""
import cProfile
import pstats
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import SHAPES, make_inputs, run_kvforge  # noqa: E402

sh = SHAPES[6]  # GQA b=1: the kernel is short, so the host shows
q, kv, bt, lens = make_inputs(sh, 1)
for _ in range(20):
    run_kvforge(sh, q, *kv[0], bt, lens)
torch.cuda.synchronize()
n = 300
t0 = time.perf_counter()
for _ in range(n):
    run_kvforge(sh, q, *kv[0], bt, lens)
host_us = (time.perf_counter() - t0) / n * 1e6
torch.cuda.synchronize()
print(f"{sh.label}: {host_us:.1f} us of host time per eager call")
prof = cProfile.Profile()
prof.enable()
for _ in range(100):
    run_kvforge(sh, q, *kv[0], bt, lens)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(12)
