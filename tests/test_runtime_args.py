"""Runtime argument errors that need no GPU: the plan/run objects' constructor and shape checks,
streams, KV dtypes the kernels do not read, the device error record's messages, and the packed
argument slots every launch goes through."""
from __future__ import annotations

import ctypes

import pytest

from kvforge.codegen.matrix import load_matrix
from kvforge.runtime.call_args import CallShape
from kvforge.runtime.kv_format import KVFormat, cache_format, scale_values
from kvforge.runtime.tensors import TensorArg


@pytest.mark.parametrize("kwargs,needle", [
    (dict(num_heads=0, page_size=64), r"num_heads=0: MLA decode supports 1\.\.128"),
    (dict(num_heads=16, page_size=48), r"page_size=48: supported 16, 32, 64, 128"),
    (dict(num_heads=16, page_size=64, dtype="fp32"), r"dtype='fp32': supported 'bf16', 'fp16'"),
    (dict(num_heads=16, page_size=64, s_q=9), r"s_q=9: supported 1\.\.8"),
    (dict(num_heads=16, page_size=64, max_batch=0), r"max_batch=0: must be at least 1"),
])
def test_mla_plan_object_rejects_bad_arguments_before_touching_a_device(kwargs, needle):
    import kvforge

    kwargs.setdefault("max_batch", 4)
    with pytest.raises(ValueError, match=needle):
        kvforge.MLADecode(**kwargs)


@pytest.mark.parametrize("args,needle", [
    ((32, 8, 96, 16), r"head_dim=96: supported 64, 128, 256"),
    ((32, 3, 128, 16), r"num_kv_heads=3: must divide num_q_heads=32"),
    ((64, 2, 128, 16), r"num_q_heads=64, num_kv_heads=2: the group 32 must be one of 1, 2, 4, 8, 16"),
])
def test_gqa_plan_object_rejects_bad_head_layouts(args, needle):
    import kvforge

    with pytest.raises(ValueError, match=needle):
        kvforge.GQADecode(*args, max_batch=4)


def _shape(**over):
    base = dict(family="mla_decode", device_id=0, dtype="bf16", batch=4, s_q=1, num_q_heads=16, num_kv_heads=1,
                head_dim=576, page_size=64, num_pages=100, max_pages=10, out_shape=(), lse_shape=())
    base.update(over)
    return CallShape(**base)


@pytest.mark.parametrize("over,needle", [
    (dict(batch=9), r"q: batch 9 exceeds max_batch=8 of this MLADecode"),
    (dict(s_q=2), r"q: s_q=2 does not match this MLADecode, planned for s_q=1"),
    (dict(page_size=16), r"page_size=16 does not match this MLADecode, planned for 64"),
    (dict(dtype="fp16"), r"dtype='fp16' does not match this MLADecode, planned for 'bf16'"),
    (dict(num_q_heads=32), r"num_q_heads=32 does not match this MLADecode, planned for 16"),
    (dict(device_id=1), r"device_id=1 does not match this MLADecode, planned for 0"),
])
def test_a_plan_object_refuses_calls_outside_its_shape_class(over, needle):
    from kvforge.runtime.decode import MLADecode

    obj = MLADecode.__new__(MLADecode)  # the shape check alone: no device, no compile
    obj._shape, obj.max_batch, obj.s_q = _shape(), 8, 1
    obj._check_shape(_shape(batch=8))  # the planned class itself passes
    with pytest.raises(ValueError, match=needle):
        obj._check_shape(_shape(**over))


def test_streams_of_unknown_types_are_refused_by_name():
    from kvforge.runtime.decode import _stream_handle

    assert _stream_handle(7, None, 0) == 7
    with pytest.raises(TypeError, match=r"stream: expected None, an int handle, .* got str"):
        _stream_handle("default", None, 0)


def _cache(dtype, shape, name="kv_cache"):
    return TensorArg(name, 0, shape, dtype, 0, None)


@pytest.mark.parametrize("family,caches,scales,want", [
    ("mla_decode", [("bf16", (10, 64, 576))], {"kv_scale": None}, KVFormat("bf16")),
    ("mla_decode", [("fp8_e4m3", (10, 64, 576))], {"kv_scale": 0.5}, KVFormat("fp8_e4m3", "per_tensor")),
    ("mla_decode", [("uint8", (10, 64, 656))], {"kv_scale": None}, KVFormat("fp8_e4m3", "fp8_ds_mla")),
    ("gqa_decode", [("fp8_e4m3", (10, 16, 8, 128)), ("fp8_e4m3", (10, 16, 8, 128))], {"k_scale": 2, "v_scale": 0.1},
     KVFormat("fp8_e4m3", "per_tensor")),
])
def test_the_cache_format_follows_dtypes_and_scales(family, caches, scales, want):
    names = ["kv_cache"] if family == "mla_decode" else ["k_cache", "v_cache"]
    args = tuple(_cache(d, s, n) for (d, s), n in zip(caches, names))
    assert cache_format(family, args, "bf16", scales) == want


@pytest.mark.parametrize("family,caches,scales,err,needle", [
    ("mla_decode", [("fp16", (10, 64, 576))], {"kv_scale": None}, TypeError,
     r"kv_cache: dtype must be bf16 \(q's\) or float8_e4m3fn \(with scales\), or uint8 \[.., 656\]"),
    ("mla_decode", [("fp8_e4m3", (10, 64, 576))], {"kv_scale": None}, ValueError,
     r"kv_scale: required for a float8_e4m3fn kv_cache: a float, a 1-element float32 device tensor"),
    ("mla_decode", [("bf16", (10, 64, 576))], {"kv_scale": 1.0}, ValueError,
     r"kv_scale: scales apply to float8_e4m3fn KV caches; pass None for a bf16 cache"),
    ("mla_decode", [("uint8", (10, 64, 656))], {"kv_scale": 1.0}, ValueError,
     r"kv_scale: an fp8_ds_mla cache carries its scales in each token"),
    ("mla_decode", [("fp8_e4m3", (10, 64, 576))], {"kv_scale": 0.0}, ValueError,
     r"kv_scale: a per-tensor scale must be finite and non-zero, got 0.0"),
    ("gqa_decode", [("uint8", (10, 16, 8, 656)), ("uint8", (10, 16, 8, 656))], {"k_scale": None, "v_scale": None},
     TypeError, r"k_cache: a uint8 cache of 656-byte tokens is the fp8_ds_mla layout of MLA caches"),
    ("gqa_decode", [("fp8_e4m3", (10, 16, 8, 128)), ("fp8_e4m3", (10, 16, 8, 128))], {"k_scale": 1.0, "v_scale": None},
     ValueError, r"v_scale: required for a float8_e4m3fn v_cache"),
    ("gqa_decode", [("fp8_e4m3", (10, 16, 8, 128)), ("bf16", (10, 16, 8, 128))], {"k_scale": 1.0, "v_scale": 1.0},
     TypeError, r"v_cache: dtype bf16 differs from k_cache's fp8_e4m3"),
])
def test_kv_caches_the_kernels_cannot_read_get_a_clear_error(family, caches, scales, err, needle):
    names = ["kv_cache"] if family == "mla_decode" else ["k_cache", "v_cache"]
    args = tuple(_cache(d, s, n) for (d, s), n in zip(caches, names))
    with pytest.raises(err, match=needle):
        cache_format(family, args, "bf16", scales)


def test_scale_values_pass_numbers_by_value_and_tensors_by_pointer():
    assert scale_values(None, None) == (0, 0, 1.0, 1.0)
    assert scale_values(0.5, 2) == (0, 0, 0.5, 2.0)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(fp8_layout="int4"), r"fp8_layout='int4': supported 'per_tensor', 'block', 'fp8_ds_mla'"),
    (dict(fp8_layout="block"), r"scale_block_size=None: required \(one of 32, 64, 128\) exactly when"),
    (dict(fp8_layout="block", scale_block_size=48), r"scale_block_size=48: supported 32, 64, 128"),
    (dict(scale_block_size=64), r"scale_block_size=64: only with fp8_layout='block'"),
])
def test_fp8_plan_objects_reject_bad_layouts_before_touching_a_device(kwargs, needle):
    import kvforge

    with pytest.raises(ValueError, match=needle):
        kvforge.MLADecode(16, 64, max_batch=4, **kwargs)


def test_the_error_record_reads_as_the_host_checks_did():
    from kvforge.codegen.policy import ERR_PAGE, ERR_SEQLEN
    from kvforge.runtime.error_record import describe

    assert describe([ERR_SEQLEN, 3, -1, 9999, 9999, 192, 0, 0]).startswith(
        "cache_seqlens[3]=9999: must be in 0..192")
    assert describe([ERR_PAGE, 1, 5, 77, 700, 24, 0, 0]).startswith(
        "block_table[1][5]=77: pages used by its 700 tokens must be in 0..23")
    assert "unknown device error code 9" in describe([9, 0, 0, 0, 0, 0, 0, 0])


def test_argument_slots_follow_the_contract_order_and_types():
    from kvforge.runtime.launch import ArgSlots

    v = next(v for v in load_matrix() if v.family == "mla_decode" and v.backend == "sm80")
    contract = v.contracts["main"]
    slots = ArgSlots(contract)
    slots.set("q", 0x1234_5678_9ABC)
    slots.set("num_pages", 77)
    slots.set("scale_log2", 0.5)
    argv = (ctypes.c_void_p * len(contract.args)).from_address(slots.argv_addr)
    names = [a.name for a in contract.args]
    assert ctypes.c_uint64.from_address(argv[names.index("q")]).value == 0x1234_5678_9ABC
    assert ctypes.c_int32.from_address(argv[names.index("num_pages")]).value == 77
    assert ctypes.c_float.from_address(argv[names.index("scale_log2")]).value == 0.5
    assert [type(s) for s in slots.slots] == [
        {"ptr": ctypes.c_uint64, "int": ctypes.c_int32, "float": ctypes.c_float}[a.scalar_kind] for a in contract.args]


def test_fp8_caches_are_refused_on_rocm_and_on_pre_sm89_gpus(monkeypatch):
    """No AMD backend reads OCP e4m3fn (MI300's native fp8 is e4m3fnuz); sm_80/sm_86 have no e4m3
    conversion: both refuse before any variant is chosen, saying why."""
    from kvforge.runtime import decode, hip_launch

    fp8 = KVFormat("fp8_e4m3", "per_tensor")
    monkeypatch.setattr(decode, "_on_rocm", lambda: True)
    monkeypatch.setattr(hip_launch, "rocm_arch", lambda device_id=0: "gfx942")
    with pytest.raises(ValueError, match=r"^kv_cache: fp8 KV caches are not supported on AMD GPUs \(this device is "
                                         r"gfx942: .*e4m3fnuz\)"):
        decode.select_config("gqa_decode", "bf16", 16, 4, 128, 1, 0, fp8)
    monkeypatch.setattr(decode, "_on_rocm", lambda: False)
    monkeypatch.setattr(decode, "device_arch", lambda device_id: "sm_86")
    with pytest.raises(ValueError, match=r"^kv_cache: fp8 KV needs the hardware e4m3 conversion of sm_89 and newer "
                                         r"\(this device is sm_86\); use a bf16/fp16 cache"):
        decode.select_config("mla_decode", "bf16", 64, 16, 576, 1, 0, fp8)


def test_a_scale_that_is_neither_a_number_nor_an_array_is_refused_by_name():
    with pytest.raises(TypeError, match=r"^kv_scale: expected a CUDA array \(DLPack or __cuda_array_interface__\), "
                                        r"got str"):
        cache_format("mla_decode", (_cache("fp8_e4m3", (10, 64, 576)),), "bf16", {"kv_scale": "0.5"})
    with pytest.raises(TypeError, match=r"^k_scale: expected a CUDA array"):
        cache_format("gqa_decode", (_cache("fp8_e4m3", (10, 16, 8, 128), "k_cache"),
                                    _cache("fp8_e4m3", (10, 16, 8, 128), "v_cache")), "bf16",
                     {"k_scale": [1.0], "v_scale": 1.0})


def _fake_h200_plans(monkeypatch) -> list:
    """A faked sm_90 device of 132 SMs whose plan loading records each loaded variant's schedule
    (the list returned)."""
    from kvforge.runtime import decode

    loaded = []

    class FakePlan:
        num_sms = 132

        def __init__(self, config):
            self.config = config
            loaded.append(config.schedule)

    monkeypatch.setattr(decode, "_on_rocm", lambda: False)
    monkeypatch.setattr(decode, "device_arch", lambda device_id=0: "sm_90")
    monkeypatch.setattr(decode, "sm_count", lambda device_id=0: 132)
    monkeypatch.setattr(decode, "plan_for", lambda cfg, device_id: FakePlan(cfg))
    return loaded


def test_mla_plan_object_loads_both_sm90_schedules_and_picks_per_batch(monkeypatch):
    """On sm_90 the 16-bit MLA schedule depends on whether the split plan cuts sequences, i.e. on the
    batch: a plan object loads both variants at construction (run never compiles) and picks per
    run's batch; one whose max_batch always splits loads one; a pinned config is the only one.
    (The device is faked: arch, SM count and plan loading.)"""
    import kvforge

    loaded = _fake_h200_plans(monkeypatch)
    dec = kvforge.MLADecode(128, 64, "bf16", max_batch=64)
    # the seesaw twice: unsplit (fp32-partials variant) and split under the hint (16-bit partials)
    assert sorted(loaded) == ["lockstep", "seesaw", "seesaw"] and dec.config.schedule == "seesaw"
    # 128 heads = 2 head blocks: 34 sequences fill 132 SMs unsplit (68 CTAs), 33 are split
    picked = {b: dec.plan_for_batch(b).config.schedule for b in (1, 33, 34, 64)}
    assert picked == {1: "lockstep", 33: "lockstep", 34: "seesaw", 64: "seesaw"} and len(loaded) == 3
    partials = {b: dec.plan_for_batch(b).config.partials_16bit for b in (1, 33, 34, 64)}
    assert partials == {1: True, 33: True, 34: False, 64: False}  # select.sm90_partials_16bit
    assert dec.plan_for_batch(33, long_chunks=True).config.partials_16bit
    evict = {b: dec.plan_for_batch(b).config.l2_evict_first for b in (1, 33, 34, 64)}
    assert evict == {1: True, 33: True, 34: False, 64: False}  # select.sm90_l2_evict_first
    loaded.clear()
    # every batch of max_batch 8 is split: the lockstep, and the seesaw a run's max_seq_len hint may pick
    small = kvforge.MLADecode(128, 64, "bf16", max_batch=8)
    assert loaded == ["lockstep", "seesaw"] and small.plan_for_batch(8).config.schedule == "lockstep"
    assert small.plan_for_batch(8, long_chunks=True).config.schedule == "seesaw"
    loaded.clear()
    kvforge.MLADecode(64, 64, "bf16", max_batch=8)  # one head block: no hint applies, one variant
    assert loaded == ["lockstep"]
    loaded.clear()
    pinned = kvforge.MLADecode(128, 64, "bf16", max_batch=64, config=dec.config)
    assert loaded == ["seesaw"] and pinned.plan_for_batch(1).config.schedule == "seesaw"


def test_mla_plan_object_follows_the_seesaw_split_limit(monkeypatch):
    """With policy.SEESAW_MAX_SPLITS = 2 (two-chunk launches take the seesaw), a plan object loads both
    schedules for max_batch 30 (128 heads on 132 SMs: 23..33 sequences are cut in two, 17..22 in three)
    and picks per run's batch. (The device is faked: arch, SM count and plan loading.)"""
    import kvforge
    from kvforge.codegen import policy, select

    loaded = _fake_h200_plans(monkeypatch)
    select._select_decode_config.cache_clear()
    monkeypatch.setattr(policy, "SEESAW_MAX_SPLITS", 2)
    try:
        dec = kvforge.MLADecode(128, 64, "bf16", max_batch=30)
        assert sorted(loaded) == ["lockstep", "seesaw"] and dec.config.schedule == "seesaw"
        picked = {b: dec.plan_for_batch(b).config.schedule for b in (1, 22, 23, 30)}
        assert picked == {1: "lockstep", 22: "lockstep", 23: "seesaw", 30: "seesaw"} and len(loaded) == 2
    finally:
        select._select_decode_config.cache_clear()


def _fake_plan(monkeypatch, cfg):
    """A DecodePlan of `cfg` on a faked 132-SM CUDA device whose launches are recorded as (symbol, grid,
    {argument: value}) in the list returned with it."""
    from types import SimpleNamespace

    from kvforge.codegen.variant import Variant
    from kvforge.runtime import plan as planmod

    launches = []

    class FakeLaunch:
        def __init__(self, contract):
            self.contract = contract
            self.index = {a.name: i for i, a in enumerate(contract.args)}
            self.slots = [SimpleNamespace(value=None) for _ in contract.args]

        def launch(self, grid, stream):
            launches.append((self.contract.symbol, grid, {a.name: s.value for a, s in zip(self.contract.args,
                                                                                         self.slots)}))

    class FakeLauncher:
        platform, num_sms = "cuda", 132

        def __init__(self, variant, device_id):
            self.main, self.combine = FakeLaunch(variant.contracts["main"]), FakeLaunch(variant.contracts["combine"])

    monkeypatch.setattr(planmod, "CudaLauncher", FakeLauncher)
    plan = planmod.DecodePlan(Variant(cfg), 0)
    plan._tensor_maps = []  # no driver to encode them
    return plan, launches


@pytest.mark.parametrize("merge", [True, False])
def test_split_workspace_layout_and_when_the_combine_runs(monkeypatch, merge):
    """Every CUDA workspace starts with the merge counts (WORKSPACE_PREFIX_BYTES, whatever the variant, so
    one plan object's variants share it), then the partial outputs, then the partial lse values. A
    merge_in_kernel variant gets the counts' address and launches no combine where sequences are cut into
    at most policy.MERGE_MAX_SPLITS chunks (b=32 x 128 heads: 2), but does where more (b=8: 8)."""
    from kvforge.codegen import policy
    from kvforge.codegen.decode import DecodeConfig
    from kvforge.codegen.errors import build
    from kvforge.codegen.select import sm90_choice
    from kvforge.runtime.plan import WORKSPACE_PREFIX_BYTES

    cfg = build(DecodeConfig, {**sm90_choice("mla_decode", "bf16", 64, 1).model_dump(mode="json"),
                               "merge_in_kernel": merge})
    plan, launches = _fake_plan(monkeypatch, cfg)
    ws = 1 << 20
    for batch, splits in ((32, 2), (8, 8)):
        geo = plan.geometry(batch, 1, 128, 1)
        assert geo[0] == splits
        floats = plan.workspace_floats(batch, 1, 128, splits)
        assert floats == WORKSPACE_PREFIX_BYTES // 4 + batch * splits * 128 * 513
        launches.clear()
        plan.launch_packed((batch, 1, 128, 1, 1000, 200, geo), (1, 2, 2, 3, 4, 5, 6), ws, 0.1, 0, 0)
        (_, _, main), *rest = launches
        assert main["part_o"] == ws + WORKSPACE_PREFIX_BYTES
        assert main["part_lse"] == main["part_o"] + 4 * batch * splits * 128 * 512
        assert main.get("merge_counters") == (ws if merge else None)
        combined = merge is False or splits > policy.MERGE_MAX_SPLITS
        assert len(rest) == int(combined), (batch, merge, rest)
        if combined:
            assert rest[0][2]["part_o"] == main["part_o"] and rest[0][2]["part_lse"] == main["part_lse"]
    assert policy.MERGE_COUNTER_INTS * 4 == WORKSPACE_PREFIX_BYTES


def test_max_seq_len_hint_takes_the_seesaw_for_long_split_chunks(monkeypatch):
    """mla_decode / MLADecode.run's max_seq_len: on sm_90, a split launch whose longest sequence's chunk has
    32+ tiles with two head blocks (128 heads) takes the seesaw (policy.SEESAW_SPLIT_MIN_TILES); short chunks,
    one head block or an unsplit grid keep the built-in choice; a bad hint is a ValueError naming it. (The
    device is faked: arch, SM count and plan loading; q is a stand-in with a shape and a device.)"""
    from types import SimpleNamespace

    from kvforge.runtime import decode

    _fake_h200_plans(monkeypatch)
    decode._least_long_seq_len.cache_clear()  # cached per device: this one is faked
    q = lambda b, h, s_q=1: SimpleNamespace(shape=(b, s_q, h, 576), device=SimpleNamespace(index=0))  # noqa: E731
    assert decode._long_chunks(q(32, 128), 8192)          # 2 chunks of 4096 keys, 2 head blocks
    assert decode._long_chunks(q(16, 128), 8192)          # 4 chunks of 2048
    assert not decode._long_chunks(q(32, 128), 2048)      # chunks of 1024 keys: 16 tiles
    assert not decode._long_chunks(q(32, 64), 8192)       # one head block
    assert not decode._long_chunks(q(128, 128), 8192)     # unsplit: the seesaw already
    assert not decode._long_chunks(q(1, 128), 32768)      # 64 chunks of 512 keys
    for bad in (-1, 1.5, "4096", True):
        with pytest.raises(ValueError, match="max_seq_len"):
            decode._long_chunks(q(32, 128), bad)
    # the per-call test is one cached threshold per launch shape: it agrees with the rule at every length
    from kvforge.codegen.select import sm90_long_chunks

    for b, h, s_q in ((32, 128, 1), (16, 128, 1), (1, 128, 1), (33, 128, 1), (32, 64, 2), (32, 64, 1), (128, 128, 1)):
        least = decode._least_long_seq_len(b, h, s_q, 0)
        for n in [*range(0, 140_000, 509), least - 1, least, least + 1]:
            if n >= 0:
                assert decode._long_chunks(q(b, h, s_q), n) == sm90_long_chunks(n, b, h, s_q, 132), (b, h, s_q, n)
    shape = SimpleNamespace(family="mla_decode", dtype="bf16", page_size=64, group=128, head_dim=576, s_q=1,
                            device_id=0, kv=None, batch=32)
    assert decode._LONG_CHUNK_PLANS.plan(shape).config.schedule == "seesaw"
    assert decode._DEFAULT_PLANS.plan(shape).config.schedule == "lockstep"
    assert decode._LONG_CHUNK_PLANS.key != decode._DEFAULT_PLANS.key  # separate cached signatures
    fp8 = SimpleNamespace(**{**vars(shape), "kv": decode.KVFormat("fp8_e4m3", "per_tensor", None)})
    assert decode._LONG_CHUNK_PLANS.plan(fp8).config.schedule == "lockstep"  # fp8 staging ignores the hint
    decode._least_long_seq_len.cache_clear()  # no faked device's threshold left for later tests


@pytest.mark.parametrize("value,want", [(None, 7.5), (0.5, 0.5 * 1.4426950408889634), (2, 2 * 1.4426950408889634),
                                        (0.0, 0.0), (-0.25, -0.25 * 1.4426950408889634)])
def test_softmax_scale_is_taken_in_log2_units(value, want):
    from kvforge.runtime.call_args import scale_log2

    assert scale_log2(value, 7.5) == pytest.approx(want, rel=1e-15, abs=0)


@pytest.mark.parametrize("value,err,needle", [
    (float("nan"), ValueError, "softmax_scale: must be finite, got nan"),
    (float("inf"), ValueError, "softmax_scale: must be finite, got inf"),
    ("0.1", TypeError, "softmax_scale: must be a real number (a Python or NumPy float or int) or None, got str"),
    (True, TypeError, "got bool"), ([0.1], TypeError, "got list")])
def test_softmax_scales_that_are_not_finite_real_numbers_are_refused_by_name(value, err, needle):
    from kvforge.runtime.call_args import scale_log2

    with pytest.raises(err) as e:
        scale_log2(value, 1.0)
    assert needle in str(e.value)


def test_the_torch_ops_take_softmax_scale_by_the_same_check():
    """Under torch.compile the scale reaches the op through runtime/torch_ops.py: the same check as eager calls
    (a string is refused, not parsed by float())."""
    from kvforge.runtime import torch_ops

    with pytest.raises(TypeError, match="softmax_scale: must be a real number"):
        torch_ops.mla_decode_op(None, None, None, None, softmax_scale="0.1")
    with pytest.raises(ValueError, match="softmax_scale: must be finite, got inf"):
        torch_ops.gqa_decode_op(None, None, None, None, None, softmax_scale=float("inf"))
