"""The runtime's variant choice: re-exported from `kvforge.codegen.select`, where the heuristics
live (the matrix loader fills a matrix entry's missing fields with the same choice)."""
from kvforge.codegen.select import (MAX_CONSUMER_WARPS, plan_choices, plan_launches, select_cdna_config,
                                   select_decode_config, select_for_launch, sm90_head_blocks, sm90_long_chunks,
                                   sm90_schedule, sm90_sequences_split, sm90_splits)

__all__ = ["MAX_CONSUMER_WARPS", "plan_choices", "plan_launches", "select_cdna_config", "select_decode_config",
           "select_for_launch", "sm90_head_blocks", "sm90_long_chunks", "sm90_schedule", "sm90_sequences_split",
           "sm90_splits"]
