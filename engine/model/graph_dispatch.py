"""CUDA-graph mode of a step, decided the way vLLM's model runner decides it.

* uniform decode (every scheduled request computes exactly ``1 + num_spec_tokens`` tokens and the
  total is that times the number of requests) whose token count fits a captured size -> FULL,
  padded up to the smallest captured size >= the token count;
* anything else (mixed, prefill, non-uniform decode) within the largest captured size ->
  PIECEWISE (attention runs eager between captured pieces), padded the same way;
* above the largest captured size, an idle step, or ``enforce_eager`` -> NONE (eager).

``cudagraph_mode`` narrows this as vLLM's does: PIECEWISE (no FULL graphs) plans uniform decode
PIECEWISE; FULL (no piecewise graphs) plans non-uniform steps NONE; NONE plans every step NONE.

On CPU this is the *planned* mode; :class:`GraphPlan` never claims a replay happened.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from mixdiag.engine.config import SchedulerConfig


@dataclass(frozen=True)
class GraphPlan:
    mode: str                 # FULL | PIECEWISE | NONE
    bucket: int | None        # padded token count of the captured graph (None for NONE)
    uniform_decode: bool


def is_uniform_decode(num_scheduled: list[int], uniform_query_len: int, all_decode: bool) -> bool:
    """vLLM's ``_is_uniform_decode``: every request computes ``uniform_query_len`` tokens."""
    if not num_scheduled or not all_decode:
        return False
    return max(num_scheduled) == uniform_query_len and sum(num_scheduled) == uniform_query_len * len(num_scheduled)


def plan_graph(num_scheduled: list[int], all_decode: bool, config: SchedulerConfig) -> GraphPlan:
    """The graph mode and padded size for a step with these per-request token counts."""
    uniform = is_uniform_decode(num_scheduled, config.uniform_decode_query_len, all_decode)
    total = sum(num_scheduled)
    sizes = config.cudagraph_capture_sizes
    mode = config.cudagraph_mode
    if total == 0 or config.enforce_eager or mode == "NONE" or not sizes or total > sizes[-1]:
        return GraphPlan("NONE", None, uniform)
    bucket = sizes[bisect.bisect_left(sizes, total)]
    if uniform and mode != "PIECEWISE":
        return GraphPlan("FULL", bucket, uniform)
    if mode == "FULL":  # FULL-only: no piecewise graphs, non-uniform steps run eagerly
        return GraphPlan("NONE", None, uniform)
    return GraphPlan("PIECEWISE", bucket, uniform)
