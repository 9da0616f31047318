"""Config models reject what cannot work, naming the field, the value and what is allowed."""
from __future__ import annotations

import pytest

from kvforge.codegen.decode import DecodeConfig
from kvforge.codegen.errors import ConfigError, build
from kvforge.codegen.kv_buffer import KVBufferConfig
from kvforge.codegen.pipeline import PipelineConfig
from kvforge.codegen.selftest import PipelineSelfTestConfig
from kvforge.codegen.variant import variant_from_dict

PIPE = {"num_kv_stages": 2}
MLA = dict(family="mla_decode", backend="sm80", arch="sm_90", head_dim_qk=576, head_dim_v=512, heads_per_cta=16,
           page_size=64, block_n=64, pipeline={"num_kv_stages": 2, "num_consumer": 4})
GQA = dict(family="gqa_decode", backend="sm80", arch="sm_90", head_dim_qk=128, head_dim_v=128, heads_per_cta=8,
           page_size=16, block_n=64, pipeline=PIPE)
KBUF = dict(role="K", BN=32, WN=32, BK=16, depth=128, num_threads=256)
VBUF = dict(KBUF, role="V")
CDNA = dict(GQA, backend="cdna", arch="gfx942", pipeline=None, kv_buffers=(KBUF, VBUF), block_n=32)
SM90 = dict(family="mla_decode", backend="sm90", arch="sm_90a", head_dim_qk=576, head_dim_v=512, heads_per_cta=64,
            page_size=64, block_n=64)
SELF = dict(arch="sm_90", fill="arrive", slot_bytes=8192, pipeline={"num_kv_stages": 3})

INVALID = [
    # (model, data, substrings the message must contain)
    (DecodeConfig, dict(GQA, arch="sm_89", kv_load="bulk"), ["kv_load='bulk'", "sm_90, sm_100a", "'cp_async'"]),
    (DecodeConfig, dict(GQA, kv_load="bulk", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        convert={"num_load_stages": 2}), ["kv_load='bulk'", "fp8", "'cp_async' or 'tma'"]),
    (DecodeConfig, dict(MLA, kv_load="bulk", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        convert={"num_load_stages": 4, "num_convert": 4}),
     ["kv_load='bulk'", "mla_decode with fp8_convert='registers'", "'cp_async'"]),
    (DecodeConfig, dict(GQA, kv_load="dma"), ["kv_load", "'cp_async', 'bulk' or 'tma'"]),
    (DecodeConfig, dict(GQA, kv_load="tma", pipeline={"num_kv_stages": 2, "num_producer": 2}), ["pipeline.num_producer=2", "kv_load='tma'", "use 1"]),
    (DecodeConfig, dict(GQA, arch="sm_89", kv_load="tma", pipeline={"num_kv_stages": 2, "num_producer": 1}),
     ["kv_load='tma'", "sm_90, sm_100a", "'cp_async'"]),
    (DecodeConfig, dict(MLA, kv_load="tma", pipeline={"num_kv_stages": 2, "num_consumer": 4, "num_producer": 1}),
     ["kv_load='tma'", "gqa_decode", "'sm90'"]),
    (DecodeConfig, dict(GQA, kv_load="tma", kv_dtype="fp8_e4m3", scale_mode="block", scale_block_size=64,
                        fp8_convert="registers", pipeline={"num_kv_stages": 2, "num_producer": 1}),
     ["kv_load='tma'", "scale_mode='per_tensor'", "scale_mode='block'", "'cp_async'"]),
    (DecodeConfig, dict(GQA, kv_load="tma", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        convert={"num_load_stages": 2}, pipeline={"num_kv_stages": 2, "num_producer": 1}),
     ["kv_load='tma'", "fp8_convert='registers'", "fp8_convert='ring'"]),
    (DecodeConfig, dict(GQA, kv_load="tma", kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_convert="registers",
                        head_dim_qk=64, head_dim_v=64, pipeline={"num_kv_stages": 2, "num_producer": 1}),
     ["head_dim_qk=64", "128 bytes", "128 fp8_e4m3 columns", "kv_load='cp_async'"]),
    (DecodeConfig, dict(GQA, fp8_convert="registers"), ["fp8_convert='registers'", "kv_dtype='fp8_e4m3'"]),
    (DecodeConfig, dict(GQA, fp8_block_p="scaled"), ["fp8_block_p='scaled'", "fp8 V block scales", "kv_dtype='bf16'"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_convert="registers", fp8_block_p="scaled"),
     ["fp8_block_p='scaled'", "scale_mode 'block' or 'fp8_ds_mla'", "scale_mode='per_tensor'"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="block", scale_block_size=64, fp8_convert="registers",
                        fp8_block_p="half"), ["fp8_block_p", "'fp32' or 'scaled'"]),
    (DecodeConfig, dict(GQA, fp8_v_convert="bits"), ["fp8_v_convert='bits'", "register path", "kv_dtype='bf16'"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_v_convert="bits",
                        convert={"num_load_stages": 2}), ["fp8_v_convert='bits'", "set fp8_convert='registers'"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_convert="registers",
                        fp8_v_convert="sideways"), ["fp8_v_convert='sideways'", "'cvt' or 'bits'"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_convert="diagonal"),
     ["fp8_convert", "'ring' or 'registers'"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3", scale_mode="fp8_ds_mla", fp8_convert="registers", max_s_q=2),
     ["num_consumer=4", "depth-split QK", "2 row group(s) x 2 warps", "num_consumer=8", "fp8_convert='ring'"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3", scale_mode="block", scale_block_size=32, fp8_convert="registers",
                        pipeline={"num_kv_stages": 2, "num_consumer": 2}),
     ["num_consumer=2", "depth-split QK", "1 row group(s) x 2 warps", "num_consumer=4"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_convert="registers", convert={}),
     ["convert", "no convert warps"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_convert="registers", head_dim_qk=64,
                        head_dim_v=64, pipeline={"num_kv_stages": 2, "num_consumer": 4}),
     ["num_consumer=4", "groups of 32", "16"]),
    (PipelineConfig, {"num_kv_stages": 1}, ["num_kv_stages=1", "greater than or equal to 2"]),
    (PipelineConfig, {"num_kv_stages": 9}, ["num_kv_stages=9", "less than or equal to 8"]),
    (PipelineConfig, {"num_kv_stages": 2, "num_qk_stages": 0}, ["num_qk_stages=0", "greater than or equal to 1"]),
    (PipelineConfig, {"num_kv_stages": 8, "num_qk_stages": 4}, ["8 * 4 = 32 slots", "at most 24"]),
    (PipelineConfig, {"num_kv_stages": 2, "num_producer": 0}, ["num_producer=0"]),
    (PipelineConfig, {"num_kv_stages": 2, "consumer_arrive": "lane"}, ["consumer_arrive='lane'", "'warp' or 'thread'"]),
    (PipelineConfig, {"num_kv_stages": 2, "stages": 3}, ["PipelineConfig.stages", "Extra inputs are not permitted"]),
    (PipelineSelfTestConfig, dict(SELF, arch="sm_80", fill="expect_tx"), ["fill='expect_tx'", "sm_90 or newer", "fill='arrive'"]),
    (PipelineSelfTestConfig, dict(SELF, arch="gfx942"), ["arch='gfx942'", "CUDA only"]),
    (PipelineSelfTestConfig, dict(SELF, arch="sm_75"), ["arch='sm_75'", "'sm_80'"]),
    (PipelineSelfTestConfig, dict(SELF, slot_bytes=8200), ["slot_bytes=8200", "multiple of 16"]),
    (PipelineSelfTestConfig, dict(SELF, slot_bytes=1536, pipeline={"num_kv_stages": 2, "num_consumer": 5}),
     ["slot_bytes=1536", "num_consumer=5", "multiple of 80"]),
    (PipelineSelfTestConfig, dict(SELF, slot_bytes=65536, pipeline={"num_kv_stages": 4}),
     ["num_kv_stages=4", "232448 B", "at most 3 stages"]),
    (PipelineSelfTestConfig, dict(SELF, arch="sm_86", slot_bytes=32768, pipeline={"num_kv_stages": 4}),
     ["sm_86 allows 101376 B"]),
    (PipelineSelfTestConfig, dict(SELF, slot_bytes=131072), ["slot_bytes=131072", "less than or equal to 65536"]),
    (DecodeConfig, dict(MLA, head_dim_qk=512), ["head_dim_qk/head_dim_v=512/512", "576"]),
    (DecodeConfig, dict(GQA, head_dim_qk=96, head_dim_v=96), ["head_dim_qk=96", "64, 128, 256"]),
    (DecodeConfig, dict(GQA, head_dim_v=64), ["head_dim_v=64", "head_dim_v == head_dim_qk"]),
    (DecodeConfig, dict(GQA, heads_per_cta=3), ["heads_per_cta=3", "1, 2, 4, 8 or 16"]),
    (DecodeConfig, dict(MLA, page_size=48), ["page_size=48", "16, 32, 64 or 128"]),
    (DecodeConfig, dict(MLA, block_n=24), ["block_n=24"]),
    (DecodeConfig, dict(MLA, arch="sm_90a"), ["arch='sm_90a'", "backend 'sm80' targets"]),
    (DecodeConfig, dict(MLA, backend="sm100", arch="sm_100a"), ["backend='sm100'", "not landed", "'sm80'"]),
    (DecodeConfig, dict(SM90, arch="sm_90"), ["arch='sm_90'", "backend 'sm90' targets sm_90a"]),
    (DecodeConfig, dict(SM90, block_n=32), ["block_n=32", "tiles of 64 keys"]),
    (DecodeConfig, dict(SM90, block_n=128), ["block_n=128", "tiles of 64 keys"]),
    (DecodeConfig, dict(SM90, max_s_q=2), ["heads_per_cta=64", "128 query rows", "holds 64"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, max_s_q=8), ["heads_per_cta=16", "128 query rows", "holds 64"]),
    (DecodeConfig, dict(SM90, family="gqa_decode", head_dim_qk=128, head_dim_v=128, heads_per_cta=8,
                        kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_staging="fp8_ring"),
     ["fp8_staging='fp8_ring'", "producer warpgroup's registers", "'registers'"]),
    (DecodeConfig, dict(SM90, family="gqa_decode", head_dim_qk=256, head_dim_v=256, heads_per_cta=16, max_s_q=8,
                        kv_dtype="fp8_e4m3", scale_mode="per_tensor"), ["registers per math thread", "128 output"]),
    (DecodeConfig, dict(SM90, family="gqa_decode", head_dim_qk=128, head_dim_v=128, heads_per_cta=8,
                        schedule="seesaw"), ["schedule='seesaw'", "gqa_decode", "'lockstep'"]),
    (DecodeConfig, dict(SM90, family="gqa_decode", head_dim_qk=128, head_dim_v=128, heads_per_cta=8,
                        merge_in_kernel=True), ["merge_in_kernel=True", "combine kernel", "False"]),
    (DecodeConfig, dict(SM90, family="gqa_decode", head_dim_qk=256, head_dim_v=256, heads_per_cta=16, max_s_q=8,
                        num_kv_stages=4), ["num_kv_stages=4", "shared memory", "allows"]),
    (DecodeConfig, dict(SM90, family="gqa_decode", head_dim_qk=128, head_dim_v=128, heads_per_cta=16, max_s_q=9),
     ["max_s_q=9"]),
    (DecodeConfig, dict(SM90, num_kv_stages=1), ["num_kv_stages=1", "16-bit KV ring needs 2 to 4", "fp8"]),
    (DecodeConfig, dict(SM90, schedule="seesaw", num_kv_stages=3), ["num_kv_stages=3", "'seesaw'", "exactly 2"]),
    (DecodeConfig, dict(SM90, seesaw_b_first=True), ["seesaw_b_first=True", "schedule='seesaw'", "'lockstep'"]),
    (DecodeConfig, dict(SM90, schedule="seesaw", kv_dtype="fp8_e4m3", scale_mode="per_tensor"),
     ["schedule='seesaw'", "fp8_staging='slot'", "'registers'", "'lockstep'"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_staging="slot"),
     ["fp8_staging='slot'", "schedule='seesaw'", "scale_mode='per_tensor'", "schedule='lockstep'"]),
    (DecodeConfig, dict(SM90, schedule="seesaw", kv_dtype="fp8_e4m3", scale_mode="block", scale_block_size=128,
                        fp8_staging="slot"),
     ["fp8_staging='slot'", "scale_mode='per_tensor'", "scale_mode='block'"]),
    (DecodeConfig, dict(SM90, schedule="seesaw", fp8_staging="slot"), ["fp8_staging='slot'", "fp8 KV only"]),
    (DecodeConfig, dict(SM90, fp8_slot_loads_ahead=True), ["fp8_slot_loads_ahead=True", "fp8_staging='slot'",
                                                           "kv_dtype='bf16'"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_slot_loads_ahead=True),
     ["fp8_slot_loads_ahead=True", "fp8_staging='registers'"]),
    (DecodeConfig, dict(SM90, schedule="pingpong"), ["schedule", "'lockstep', 'seesaw' or 'keys_m'"]),
    # schedule 'keys_m': per-tensor, block-scaled (64 or 128 columns) or packed fp8, <= 16 query rows, an even ring of
    # 2 or 4, the other schedules' fields refused
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", merge_in_kernel=False, partials_16bit=False),
     ["schedule='keys_m'", "scale_mode 'per_tensor', 'block' or 'fp8_ds_mla'", "kv_dtype='bf16'"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="block",
                        scale_block_size=32, merge_in_kernel=False, partials_16bit=False),
     ["scale_block_size=32", "'keys_m'", "64 or 128 columns"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="block",
                        scale_block_size=128, qk_chains=2, merge_in_kernel=False, partials_16bit=False),
     ["qk_chains=2", "block caches", "per scale block", "use 1"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="fp8_ds_mla",
                        qk_chains=2, merge_in_kernel=False, partials_16bit=False),
     ["qk_chains=2", "fp8_ds_mla caches", "per scale block", "use 1"]),
    (DecodeConfig, dict(SM90, heads_per_cta=32, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        merge_in_kernel=False, partials_16bit=False), ["heads_per_cta=32", "32 query rows", "at most 16"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        merge_in_kernel=False, partials_16bit=False, num_kv_stages=3),
     ["num_kv_stages=3", "2 or 4", "parity"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        partials_16bit=False), ["merge_in_kernel=True", "'keys_m'", "combine kernel", "False"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        merge_in_kernel=False, partials_16bit=False, fp8_staging="slot"),
     ["fp8_staging='slot'", "'keys_m'", "'registers'"]),
    (DecodeConfig, dict(SM90, heads_per_cta=16, schedule="keys_m", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                        merge_in_kernel=False, partials_16bit=False, fp8_slot_loads_ahead=True),
     ["fp8_slot_loads_ahead=True", "'keys_m'", "False"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="fp8_ds_mla", num_kv_stages=2, fp8_staging="fp8_ring"),
     ["num_kv_stages=2", "232448 B", "kv8_stages"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor", num_kv_stages=1),
     ["num_kv_stages=1", "16-bit KV ring needs 2 to 4", "fp8_staging='fp8_ring'"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor", num_kv_stages=3),
     ["num_kv_stages=3", "kv_stages"]),
    (DecodeConfig, dict(SM90, fp8_staging="fp8_ring"), ["fp8_staging='fp8_ring'", "fp8 KV only"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor", fp8_staging="smem"),
     ["fp8_staging", "'fp8_ring', 'registers' or 'slot'"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3", scale_mode="per_tensor"), ["convert", "required for kv_dtype='fp8_e4m3'"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", arch="sm_86", convert={}),
     ["arch='sm_86'", "hardware e4m3", "sm_89, sm_90, sm_100a"]),
    (DecodeConfig, dict(MLA, convert={}), ["convert", "fp8_e4m3' only", "kv_dtype='bf16'"]),
    (DecodeConfig, dict(GQA, kv_dtype="fp8_e4m3", scale_mode="fp8_ds_mla", convert={}),
     ["scale_mode='fp8_ds_mla'", "MLA cache layout"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3", scale_mode="block", scale_block_size=48, convert={}),
     ["scale_block_size"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3", scale_mode="per_tensor", convert={"num_load_stages": 1}),
     ["num_load_stages=1", "greater than or equal to 2"]),
    (DecodeConfig, dict(SM90, pipeline=PIPE), ["DecodeConfig.pipeline", "only the sm80 backend", "num_kv_stages"]),
    (DecodeConfig, dict(MLA, backend="tpu", arch="sm_90"), ["backend='tpu'", "cdna, sm80"]),
    (DecodeConfig, dict(MLA, kv_buffers=None, pipeline={"num_kv_stages": 2, "num_consumer": 4}, foo=1), ["foo"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3"), ["scale_mode='none'", "'per_tensor', 'block' or 'fp8_ds_mla'"]),
    (DecodeConfig, dict(MLA, scale_mode="per_tensor"), ["scale_mode='per_tensor'", "fp8_e4m3 KV only"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp16"), ["kv_dtype='fp16'", "q_dtype='bf16'"]),
    (DecodeConfig, dict(MLA, kv_dtype="fp8_e4m3", scale_mode="block", convert={}),
     ["scale_block_size=None", "scale_mode='block'"]),
    (DecodeConfig, dict(MLA, max_s_q=9), ["max_s_q=9", "less than or equal to 8"]),
    (DecodeConfig, dict(MLA, heads_per_cta=64, max_s_q=4), ["max_s_q=4", "256 query rows", "at most 128"]),
    (DecodeConfig, dict(MLA, heads_per_cta=64, block_n=32, pipeline={"num_kv_stages": 2, "num_consumer": 4}),
     ["heads_per_cta=64", "256 fp32 registers"]),
    (DecodeConfig, dict(MLA, pipeline=None), ["pipeline", "required for backend 'sm80'"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="block", scale_block_size=32, num_kv_stages=3),
     ["num_kv_stages=3", "232448 B"]),
    (DecodeConfig, dict(GQA, head_dim_qk=64, head_dim_v=64, pipeline={"num_kv_stages": 2, "num_qk_stages": 3}),
     ["num_qk_stages=3", "head_dim_qk=64", "multiples of 16"]),
    (DecodeConfig, dict(MLA, block_n=128, pipeline={"num_kv_stages": 2, "num_consumer": 4}),
     ["num_kv_stages=2", "232448 B", "kv_stages"]),
    (DecodeConfig, dict(MLA, arch="sm_86"), ["sm_86 allows 101376 B"]),
    (DecodeConfig, dict(MLA, pipeline={"num_kv_stages": 2, "num_consumer": 32}), ["num_consumer=32", "less than or equal to 16"]),
    (DecodeConfig, dict(MLA, heads_per_cta=64, pipeline={"num_kv_stages": 2, "num_consumer": 6}),
     ["num_consumer=6", "4 row groups", "multiple of 4"]),
    (DecodeConfig, dict(MLA, block_n=16), ["block_n=16", "4 column-group warps", "multiple of 64 or exactly 32"]),
    (DecodeConfig, dict(MLA, pipeline={"num_kv_stages": 2, "num_consumer": 4, "num_producer": 3}),
     ["1, 2, 4 or 8 cp.async producer warps", "num_producer=3"]),
    (DecodeConfig, dict(GQA, head_dim_qk=64, head_dim_v=64, block_n=16,
                        pipeline={"num_kv_stages": 2, "num_consumer": 1, "num_producer": 8}),
     ["block_n=16", "8 producer warps", "passes of 4", "multiple of 32"]),
    (DecodeConfig, dict(CDNA, pipeline=PIPE), ["pipeline", "set kv_buffers"]),
    (DecodeConfig, dict(CDNA, kv_buffers=None), ["kv_buffers", "required for backend 'cdna'"]),
    (DecodeConfig, dict(CDNA, lazy_rescale=True), ["lazy_rescale=True", "cdna", "remove it"]),
    (DecodeConfig, dict(MLA, merge_in_kernel=True), ["merge_in_kernel=True", "'sm90' only", "'sm80'", "remove it"]),
    (DecodeConfig, dict(CDNA, merge_in_kernel=True), ["merge_in_kernel=True", "'sm90' only", "'cdna'"]),
    (DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor", l2_prefetch_tiles=2),
     ["l2_prefetch_tiles=2", "TMA producers", "fp8_staging='registers'", "set it to 0"]),
    (DecodeConfig, dict(SM90, l2_prefetch_tiles=5), ["l2_prefetch_tiles", "less than or equal to 4"]),
    (DecodeConfig, dict(MLA, l2_prefetch_tiles=1), ["l2_prefetch_tiles", "only the sm90 backend"]),
    (DecodeConfig, dict(CDNA, kv_buffers=(VBUF, KBUF)), ["expected (K with depth 128"]),
    (DecodeConfig, dict(GQA, kv_buffers=(KBUF, VBUF)), ["kv_buffers", "only the cdna backend"]),
    (DecodeConfig, dict(MLA, softmax="exp2"), ["DecodeConfig.softmax", "Extra inputs"]),
    (KVBufferConfig, dict(KBUF, WN=24), ["WN=24", "must divide BN=32"]),
    (KVBufferConfig, dict(KBUF, num_threads=96), ["num_threads=96", "multiple of the wavefront"]),
    (KVBufferConfig, dict(KBUF, BK=12), ["BK=12", "MFMA 16x16x16 K=16"]),
    (KVBufferConfig, dict(KBUF, depth=100), ["depth=100", "64, 128, 256"]),
    (KVBufferConfig, dict(KBUF, mfma="32x32x8", WN=16, BN=32), ["WN=16", "N=32"]),
    (KVBufferConfig, dict(KBUF, depth=576, BN=16, WN=16, num_threads=256), ["num_threads=256", "divides 1152"]),
    (KVBufferConfig, dict(KBUF, depth=512, BN=256, WN=256, num_threads=256), ["BN=256", "LDS"]),
    (KVBufferConfig, dict(KBUF, depth=256, BN=64, WN=64, num_threads=64, num_stages=2), ["num_stages=2", "VGPRs"]),
]


@pytest.mark.parametrize("model,data,needles", INVALID, ids=[f"{m.__name__}-{i}" for i, (m, _, _) in enumerate(INVALID)])
def test_invalid_config_is_rejected_with_a_message_naming_the_field(model, data, needles):
    with pytest.raises(ConfigError) as exc:
        build(model, data)
    msg = str(exc.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in: {msg}"


def test_there_are_at_least_25_distinct_rejections():
    assert len({(m.__name__, repr(sorted(d.items(), key=str))) for m, d, _ in INVALID}) >= 25


@pytest.mark.parametrize("data", [MLA, GQA, CDNA, dict(MLA, heads_per_cta=64, block_n=32,
                                                            pipeline={"num_kv_stages": 3, "num_consumer": 8}),
                                  SM90, dict(SM90, heads_per_cta=32, max_s_q=2, q_dtype="fp16", kv_dtype="fp16")])
def test_valid_decode_configs_are_accepted_and_fit_their_arch(data):
    from kvforge.codegen.arch import arch_spec

    cfg = build(DecodeConfig, data)
    assert 0 < cfg.layout.total_bytes <= arch_spec(cfg.arch).max_smem_per_block
    # regions laid one after another, apart from the overlays (the first of each declared alias pair: the sm90
    # epilogue's staged rows over Q and the ring), which may only share bytes with the regions they name
    overlays = {a for a, _ in cfg.layout.aliases}
    placed = [r for r in cfg.layout.regions if r.name not in overlays]
    offsets = [r.offset for r in placed]
    assert offsets == sorted(offsets)
    for a, b in zip(placed, placed[1:]):
        assert a.offset + a.size <= b.offset, "regions overlap"
    assert cfg.layout.overlaps() == [], cfg.layout.describe()


def test_configs_are_frozen():
    cfg = build(PipelineConfig, {"num_kv_stages": 3})
    with pytest.raises(Exception):
        cfg.num_kv_stages = 4


def test_derived_counts_follow_the_design():
    p = build(PipelineConfig, {"num_kv_stages": 3, "num_qk_stages": 2, "num_producer": 1, "num_consumer": 2,
                               "consumer_arrive": "warp"})
    assert (p.num_stages, p.num_barriers, p.full_arrive_count, p.empty_arrive_count) == (6, 12, 1, 2)
    t = build(PipelineConfig, {"num_kv_stages": 2, "num_consumer": 4})  # per-thread release by default
    assert t.consumer_arrive == "thread" and t.empty_arrive_count == 128


def test_matrix_entry_errors_name_the_kind():
    with pytest.raises(ConfigError, match=r"pipeline_selftest\.pipeline\.num_kv_stages=1"):
        variant_from_dict({"kind": "pipeline_selftest", "pipeline": {"num_kv_stages": 1}})


def test_one_config_class_per_backend():
    """The backend field picks the class; each class has only its own backend's fields."""
    from kvforge.codegen.decode_cdna import CdnaDecodeConfig
    from kvforge.codegen.decode_sm80 import Sm80DecodeConfig

    sm80 = build(DecodeConfig, dict(MLA))
    assert type(sm80) is Sm80DecodeConfig and "kv_buffers" not in sm80.model_dump()
    cdna = build(DecodeConfig, dict(CDNA))
    assert type(cdna) is CdnaDecodeConfig and "pipeline" not in cdna.model_dump()
    # a dump round-trips to the same class and name; older dumps with the other backend's field as null load too
    assert build(DecodeConfig, sm80.model_dump(mode="json")) == sm80
    assert build(DecodeConfig, {**sm80.model_dump(mode="json"), "kv_buffers": None}) == sm80
    with pytest.raises(ConfigError, match=r"kv_buffers: only the cdna backend uses it"):
        build(DecodeConfig, {**sm80.model_dump(mode="json"), "kv_buffers": cdna.model_dump(mode="json")["kv_buffers"]})


def test_merge_in_kernel_defaults_and_names():
    """sm90: merge_in_kernel defaults to policy.SM90_MERGE_IN_KERNEL for 16-bit and fp8 KV; a merging
    variant's name carries 'mk', its main kernel takes the counts (before the tensor map), and its
    combine skips the sequences the main kernel merged."""
    from kvforge.codegen import policy
    from kvforge.codegen.render import render_variant
    from kvforge.codegen.variant import Variant

    plain16 = build(DecodeConfig, SM90)
    assert plain16.merge_in_kernel is policy.SM90_MERGE_IN_KERNEL
    fp8 = build(DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor"))
    assert fp8.merge_in_kernel is policy.SM90_MERGE_IN_KERNEL
    assert fp8.merged_splits == (policy.MERGE_MAX_SPLITS if policy.SM90_MERGE_IN_KERNEL else 1)
    on, off = (Variant(build(DecodeConfig, dict(SM90, merge_in_kernel=m))) for m in (True, False))
    assert "_mk_" in on.name and "_mk_" not in off.name
    assert on.config.merged_splits == policy.MERGE_MAX_SPLITS and off.config.merged_splits == 1
    args = [a.name for a in on.contracts["main"].args]
    assert args[-2:] == ["merge_counters", "kv_map"] and "merge_counters" not in [a.name for a in off.contracts["main"].args]
    src_on, src_off = render_variant(on), render_variant(off)
    assert f"if (n <= {policy.MERGE_MAX_SPLITS}) return;" in src_on and "if (n <= 1) return;" in src_off
    assert "constexpr bool kMergeInKernel = true;" in src_on and "constexpr bool kMergeInKernel = false;" in src_off
    refused = "last_to_finish(merge_counters, w, reinterpret_cast<int*>(smem + kOffRedSum)"  # a refused CTA counts
    assert refused in src_on and refused not in src_off


def test_l2_evict_first_defaults_names_source_and_fp8_refusal():
    """sm90: l2_evict_first is off by default; on, the variant's name carries 'ef' and its source the constant the
    TMA producers' loads take as their template argument; fp8 KV refuses it naming the field and the dtype; the
    sm80 backend has no such field; the built-in choice takes it for split launches only."""
    from kvforge.codegen import policy, select
    from kvforge.codegen.render import render_variant
    from kvforge.codegen.variant import Variant

    assert build(DecodeConfig, SM90).l2_evict_first is False
    on, off = (Variant(build(DecodeConfig, dict(SM90, l2_evict_first=p))) for p in (True, False))
    assert "_ef_" in on.name and "_ef_" not in off.name
    src_on, src_off = render_variant(on), render_variant(off)
    assert "constexpr bool kL2EvictFirst = true;" in src_on and "constexpr bool kL2EvictFirst = false;" in src_off
    assert "wg::tma_load_3d<kL2EvictFirst>(" in src_on
    with pytest.raises(ConfigError, match=r"l2_evict_first=True: for 16-bit KV .*'fp8_e4m3'"):
        build(DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor", l2_evict_first=True))
    with pytest.raises(ConfigError, match=r"l2_evict_first: only the sm90 backend uses it"):
        build(DecodeConfig, dict(MLA, l2_evict_first=True))
    assert policy.SM90_L2_EVICT_FIRST_SPLIT
    assert [select.sm90_l2_evict_first(k) for k in (None, 1, 2, 64)] == [True, False, True, True]
    split = select.sm90_choice("mla_decode", "bf16", 64, 1, splits=4)
    assert split.l2_evict_first and not select.sm90_choice("mla_decode", "bf16", 64, 1, splits=1).l2_evict_first
    fp8 = select.sm90_choice("mla_decode", "bf16", 64, 1, kv=dict(kv_dtype="fp8_e4m3", scale_mode="per_tensor"),
                             splits=4)
    assert not fp8.l2_evict_first


def test_partials_16bit_defaults_names_and_source():
    """sm90: partials_16bit defaults to policy.SM90_PARTIALS_16BIT for 16-bit and fp8 KV; a 16-bit-partials
    variant's name carries 'po16', its source the constant the epilogue, the merge and the combine read, its
    staged partial rows the output rows' stride; the sm80 backend has no such field."""
    from kvforge.codegen import policy
    from kvforge.codegen.render import render_variant
    from kvforge.codegen.variant import Variant

    assert build(DecodeConfig, SM90).partials_16bit is policy.SM90_PARTIALS_16BIT
    fp8 = build(DecodeConfig, dict(SM90, kv_dtype="fp8_e4m3", scale_mode="per_tensor"))
    assert fp8.partials_16bit is policy.SM90_PARTIALS_16BIT
    on, off = (Variant(build(DecodeConfig, dict(SM90, partials_16bit=p))) for p in (True, False))
    assert "_po16_" in on.name and "_po16_" not in off.name
    assert on.config.epilogue_part_row_bytes == on.config.epilogue_out_row_bytes == 512 * 2 + 16
    assert off.config.epilogue_part_row_bytes == 512 * 4 + 32
    src_on, src_off = render_variant(on), render_variant(off)
    assert "constexpr bool kPartials16 = true;" in src_on and "constexpr bool kPartials16 = false;" in src_off
    assert "constexpr int kEpiPartRowBytes = 1040;" in src_on and "constexpr int kEpiPartRowBytes = 2080;" in src_off
    with pytest.raises(ConfigError, match=r"partials_16bit: only the sm90 backend uses it"):
        build(DecodeConfig, dict(MLA, partials_16bit=True))


def test_l2_prefetch_defaults_and_names():
    """sm90: l2_prefetch_tiles defaults to policy.SM90_L2_PREFETCH_TILES; a prefetching variant's name carries
    'pf<n>' and its source the constant its producers read; the 'slot' fp8 staging (TMA) takes it too."""
    from kvforge.codegen import policy
    from kvforge.codegen.render import render_variant
    from kvforge.codegen.variant import Variant

    assert build(DecodeConfig, SM90).l2_prefetch_tiles == policy.SM90_L2_PREFETCH_TILES
    on, off = (Variant(build(DecodeConfig, dict(SM90, l2_prefetch_tiles=n))) for n in (2, 0))
    assert "_pf2_" in on.name and "_pf" not in off.name
    assert "constexpr int kL2PrefetchTiles = 2;" in render_variant(on)
    assert "constexpr int kL2PrefetchTiles = 0;" in render_variant(off)
    slot = build(DecodeConfig, dict(SM90, schedule="seesaw", kv_dtype="fp8_e4m3", scale_mode="per_tensor",
                                    fp8_staging="slot", l2_prefetch_tiles=1))
    assert "_pf1_" in Variant(slot).name
