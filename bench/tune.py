"""A/B timing of pinned sm80 variants on one bench shape (python bench/tune.py SHAPE_INDEX).

Each candidate is a dict of DecodeConfig overrides on top of the runtime's own choice."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import kvforge  # noqa: E402
from bench import SHAPES, graph_ms, make_inputs  # noqa: E402
from kvforge.codegen.decode import DecodeConfig  # noqa: E402
from kvforge.runtime.device import device_arch  # noqa: E402
from kvforge.runtime.select import select_decode_config  # noqa: E402

sh = SHAPES[int(sys.argv[1])]
candidates = [eval(a) for a in sys.argv[2:]] or [{}]  # noqa: S307 - a developer's own command line
q, kv, bt, lens = make_inputs(sh, 2)
heads = sh.hq if sh.family == "mla_decode" else sh.hq // sh.hkv
base = select_decode_config(sh.family, device_arch(0), "bf16", sh.page, heads=heads, head_dim=sh.d, s_q=sh.s_q)
for over in candidates:
    data = base.model_dump()
    for key, value in over.items():
        if isinstance(value, dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    cfg = DecodeConfig.model_validate(data)
    if sh.family == "mla_decode":
        call = [lambda i=i: kvforge.mla_decode(q, kv[i][0], bt, lens, check_inputs=False, config=cfg) for i in range(2)]
    else:
        call = [lambda i=i: kvforge.gqa_decode(q, kv[i][0], kv[i][1], bt, lens, check_inputs=False, config=cfg)
                for i in range(2)]
    ms = graph_ms(call, 20)
    print(f"{sh.label} {over}: {ms:.3f} ms, {sh.bytes() / ms / 1e6:.0f} GB/s")
