"""DecodePlan: a decode variant made ready to launch on one device, once.

A plan holds what every call of its shape class shares: the variant and its two kernel contracts,
the kernels compiled (through the cache) and loaded on the device, one launcher per platform
(CUDA: packed arguments and one cuLaunchKernel per kernel; HIP: hip-python), the split geometry
per batch size and the device's error record. `launch_packed()` writes the call's pointers (and,
when the signature changed, its sizes) into the packed arguments and launches the main kernel,
then the combine kernel when sequences are split: nothing is compiled, looked up or allocated there.
"""
from __future__ import annotations

import ctypes
import os
import threading

from kvforge.codegen import policy
from kvforge.codegen.variant import Variant

# KVFORGE_DEBUG_BARRIERS=1: decode kernels built with bounded mbarrier waits that print the
# barrier and trap instead of hanging (read once, at import).
DEBUG_BARRIERS = os.environ.get("KVFORGE_DEBUG_BARRIERS") == "1"
# KVFORGE_PDL: whether the combine kernel is launched programmatically (PDL) after the main kernel on
# sm_90 and newer (its CTAs may start once every main CTA has consumed its tiles, sm80 backend, or has
# exited, sm90; they wait for it with griddepcontrol.wait): "1" wherever the arch has it, "0" never,
# unset the measured default (`codegen.select.combine_pdl`: the sm80 and sm90 backends' kernels on sm_90).
PDL = os.environ.get("KVFORGE_PDL")


def uses_pdl(config) -> bool:
    """Whether the combine of a variant with this config is launched programmatically."""
    from kvforge.codegen.arch import arch_spec
    from kvforge.codegen.select import combine_pdl

    if PDL in ("0", "1"):
        return PDL == "1" and arch_spec(config.arch).has_pdl
    return combine_pdl(config)


# Every CUDA workspace starts with the merge_in_kernel variants' counts (zeroed when allocated, zero
# between calls); the partial outputs follow, then the partial lse values. The same layout for every
# variant, so the plans of one plan object (which may differ by batch) share one workspace safely.
WORKSPACE_PREFIX_BYTES = 4 * policy.MERGE_COUNTER_INTS


def workspace_floats_for(rows: int, head_dim_v: int) -> int:
    """fp32 words of a workspace holding `rows` partial rows (out of head_dim_v, and lse) after the prefix."""
    return WORKSPACE_PREFIX_BYTES // 4 + rows * (1 + head_dim_v)

# The main kernel's arguments a call writes, in this order (the rest follow from the contract).
CALL_ARGS = ("q", "k_cache", "v_cache", "block_table", "seqlens", "out", "lse", "part_o", "part_lse", "s_q",
             "num_q_heads", "num_kv_heads", "num_pages", "max_pages", "num_splits", "scale_log2", "causal")
SCALE_ARGS = ("k_scale", "v_scale", "k_scale_value", "v_scale_value")  # fp8 main kernels only
COMBINE_ARGS = ("part_o", "part_lse", "seqlens", "out", "lse", "s_q", "num_q_heads", "num_splits")


class CudaLauncher:
    """The variant's kernels on a CUDA device, launched through PackedLaunch."""

    platform = "cuda"

    def __init__(self, variant: Variant, device_id: int) -> None:
        from .compiler import compile
        from .device import sm_count
        from .error_record import record_ptr
        from .launch import PackedLaunch, load

        compiled = compile(variant, debug=DEBUG_BARRIERS)
        main, comb = variant.contracts["main"], variant.contracts["combine"]
        self.main = PackedLaunch(load(compiled, main.symbol, main.dynamic_smem_bytes, device_id), main)
        self.combine = PackedLaunch(load(compiled, comb.symbol, comb.dynamic_smem_bytes, device_id), comb,
                                    programmatic=uses_pdl(variant.config))
        self.num_sms = sm_count(device_id)
        self.main.set("error_word", record_ptr(device_id))


class HipLauncher:
    """The same on a ROCm device through hip-python. NEVER RUN (no AMD GPU here); compile-verified."""

    platform = "hip"

    def __init__(self, variant: Variant, device_id: int) -> None:
        from .hip_compiler import compile_hip
        from .hip_launch import PackedHipLaunch, cu_count, error_record_ptr, load_hip

        compiled = compile_hip(variant)
        main, comb = variant.contracts["main"], variant.contracts["combine"]
        self.main = PackedHipLaunch(load_hip(compiled, main.symbol, device_id), main)
        self.combine = PackedHipLaunch(load_hip(compiled, comb.symbol, device_id), comb)
        self.num_sms = cu_count(device_id)
        self.main.set("error_word", error_record_ptr(device_id))


class DecodePlan:
    def __init__(self, variant: Variant, device_id: int) -> None:
        self.variant = variant
        self.config = cfg = variant.config
        self.device_id = device_id
        self.launcher = (HipLauncher if variant.language == "hip" else CudaLauncher)(variant, device_id)
        self.num_sms = self.launcher.num_sms
        self._lock = threading.Lock()
        self._geometry: dict[tuple, tuple] = {}
        m, c = self.launcher.main, self.launcher.combine
        self._main_slots = [m.slots[m.index[n]] for n in CALL_ARGS]
        self._comb_slots = [c.slots[c.index[n]] for n in COMBINE_ARGS]
        self.head_dim_v = cfg.head_dim_v
        # TMA kernels: the caches' tensor maps, the main kernel's last arguments (re-encoded only
        # when a cache pointer, the page count or the KV head count changes)
        from .tensor_map import PagedKVMaps

        # (encoder, argument slot, index of the mapped cache's pointer in a call's ptrs: CALL_ARGS order)
        self._tensor_maps = [(PagedKVMaps(geometry, cache), m.slots[m.index[arg]], CALL_ARGS.index(cache))
                             for arg, cache, geometry in cfg.tensor_maps()]
        self._map_keys: list = [None] * len(self._tensor_maps)
        self._stream_workspaces: dict[tuple, object] = {}
        self._last_sizes = None
        # fp8: the scale arguments (k_scale, v_scale pointers, then their values)
        self.takes_scales = "k_scale" in m.index
        self._scale_slots = [m.slots[m.index[n]] for n in SCALE_ARGS] if self.takes_scales else None
        # merge_in_kernel: the counts' slot; sequences cut into at most merged_splits need no combine
        self._counter_slot = m.slots[m.index["merge_counters"]] if "merge_counters" in m.index else None
        self.merged_splits = cfg.merged_splits

    def stream_workspace(self, stream: int, s_q: int, num_q_heads: int, num_kv_heads: int) -> int:
        """A workspace for split calls on `stream`, allocated once per (stream, s_q, heads) and
        never resized: split launches have at most policy.WAVE_SPLIT_SLOTS x SMs x ctas_per_sm
        CTAs, so batch * splits <= policy.split_pairs_bound(...) whatever the batch. Calls on one
        stream are ordered, so they may share it; so do graphs captured on one stream (replay them
        on one stream, as with any persistent workspace)."""
        key = (stream, s_q, num_q_heads, num_kv_heads)
        buf = self._stream_workspaces.get(key)
        if buf is None:
            from .memory import DeviceBuffer

            blocks = self.config.head_blocks(num_q_heads, num_kv_heads)
            pairs = policy.split_pairs_bound(blocks, self.config.ctas_per_sm, self.num_sms, self.config.wave_splits)
            floats = workspace_floats_for(pairs * s_q * num_q_heads, self.head_dim_v)
            if self.launcher.platform != "cuda":
                raise RuntimeError("stream workspaces are CUDA allocations; HIP calls allocate through torch")
            buf = self._stream_workspaces[key] = DeviceBuffer(self.device_id, 4 * floats,
                                                              zero_bytes=WORKSPACE_PREFIX_BYTES)
        return buf.ptr

    def splits(self, batch: int, num_q_heads: int, num_kv_heads: int) -> int:
        blocks = self.config.head_blocks(num_q_heads, num_kv_heads)
        return policy.num_splits(blocks * batch, self.config.ctas_per_sm, self.num_sms, self.config.wave_splits)

    def geometry(self, batch: int, s_q: int, num_q_heads: int, num_kv_heads: int) -> tuple:
        """(splits, main grid, combine grid) for these sizes (cached)."""
        key = (batch, s_q, num_q_heads, num_kv_heads)
        geo = self._geometry.get(key)
        if geo is None:
            splits = self.splits(batch, num_q_heads, num_kv_heads)
            if self._counter_slot is not None and splits > 1:
                tiles = batch * self.config.head_blocks(num_q_heads, num_kv_heads)
                if tiles > policy.MERGE_COUNTER_INTS:  # not on GPUs of up to 8192 SMs (policy.py)
                    raise ValueError(f"{self.variant.name}: a split launch of {tiles} (sequence, head block) "
                                     f"tiles; merge_in_kernel counts at most {policy.MERGE_COUNTER_INTS}: use a "
                                     "config with merge_in_kernel=False")
            values = {"batch": batch, "s_q": s_q, "num_q_heads": num_q_heads, "num_kv_heads": num_kv_heads,
                      "num_splits": splits}
            geo = (splits, self.launcher.main.contract.grid_for(values),
                   self.launcher.combine.contract.grid_for(values))
            if len(self._geometry) < 4096:
                self._geometry[key] = geo
        return geo

    def workspace_floats(self, batch: int, s_q: int, num_q_heads: int, splits: int) -> int:
        """fp32 words of workspace a call needs (0 when no sequence is split): the counts'
        prefix (WORKSPACE_PREFIX_BYTES), the partial out rows, then the partial lse rows."""
        if splits <= 1:
            return 0
        return workspace_floats_for(batch * splits * s_q * num_q_heads, self.head_dim_v)

    def launch_packed(self, sizes: tuple, ptrs: tuple, workspace: int, scale_log2: float, causal: int,
                      stream: int, kv_scales: tuple | None = None) -> None:
        """The hot path. `sizes` = (batch, s_q, num_q_heads, num_kv_heads, num_pages, max_pages,
        geometry) is written into the packed arguments only when it differs from the previous
        call's (the same tuple object for a repeated signature); the pointers, scale and causal
        flag every call, and for fp8 kernels `kv_scales` = (k_scale pointer, v_scale pointer,
        k value, v value)."""
        batch, s_q, nq, nkv, num_pages, max_pages, (splits, main_grid, comb_grid) = sizes
        q, k, v, bt, sl, out, lse = ptrs
        # the counts, then the partial outputs (the combine reads them as float4: every row starts
        # 16-byte aligned whatever batch x splits x s_q x heads is), then the partial lse values
        part_o = workspace + WORKSPACE_PREFIX_BYTES if workspace else 0
        part_lse = part_o + 4 * batch * splits * s_q * nq * self.head_dim_v if workspace else 0
        m, c = self._main_slots, self._comb_slots
        with self._lock:
            if sizes is not self._last_sizes:
                for slot, val in zip(m[9:15], (s_q, nq, nkv, num_pages, max_pages, splits)):
                    slot.value = val
                for slot, val in zip(c[5:8], (s_q, nq, splits)):
                    slot.value = val
                self._last_sizes = sizes
            m[0].value, m[1].value, m[2].value, m[3].value, m[4].value = q, k, v, bt, sl
            m[5].value, m[6].value, m[7].value, m[8].value = out, lse, part_o, part_lse
            m[15].value, m[16].value = scale_log2, causal
            if self._scale_slots is not None:
                if kv_scales is None:
                    raise ValueError(f"{self.variant.name}: an fp8 kernel needs its scales (kv_scale, or k_scale and "
                                     "v_scale)")
                for slot, val in zip(self._scale_slots, kv_scales):
                    slot.value = val
            if self._counter_slot is not None:
                self._counter_slot.value = workspace
            for i, (maps, slot, which) in enumerate(self._tensor_maps):
                key = (ptrs[which], num_pages, nkv)
                if key != self._map_keys[i]:
                    ctypes.memmove(slot, maps.get(*key), 128)
                    self._map_keys[i] = key
            self.launcher.main.launch(main_grid, stream)
            if splits > self.merged_splits:
                c[0].value, c[1].value, c[2].value, c[3].value, c[4].value = part_o, part_lse, sl, out, lse
                self.launcher.combine.launch(comb_grid, stream)
