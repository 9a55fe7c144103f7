"""The engine configuration vLLM logs once at start-up, as far as it bears on a cause:
``Initializing a V1 LLM engine (vX) with config: ... enforce_eager=False, ...
compilation_config={... 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>,
'cudagraph_capture_sizes': [1, 2, 4, ...], 'max_cudagraph_capture_size': 512, ...}`` (the engine
core's ``core.py`` line; real 0.32 capture in tests/fixtures/vllm032, GPU lines in vLLM issue
#23739). ``max_cudagraph_capture_size`` was ``max_capture_size`` before PR #26016; the list alone
serves when neither is printed.

What it gives: the largest batch (tokens) vLLM replays from a CUDA graph. ``CudagraphDispatcher``
returns NONE for any batch of more tokens (formats.md §1.3, rule 2 - before any key is looked up), so
on an engine with graphs on, a decode batch larger than that ran eager: the same fact the
``--cudagraph-metrics`` table states per window, from the configuration the engine printed.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mixdiag.collectors.logs.vllm_graph_steps import write_modes

INIT = re.compile(r"Initializing a V1 LLM engine\b")
_EAGER = re.compile(r"\benforce_eager=(True|False)\b")
_MODE = re.compile(r"'cudagraph_mode':\s*<CUDAGraphMode\.(\w+)")
_MAX = re.compile(r"'max_(?:cudagraph_)?capture_size':\s*(\d+|None)")
_SIZES = re.compile(r"'cudagraph_capture_sizes':\s*\[([\d,\s]*)\]")
#: a later WARNING when the KV cache (Mamba blocks) cannot hold the largest sizes (vLLM ``compilation.py``):
#: ``Capping cudagraph capture sizes from max 512 to 352 ...`` - the limit in force is the second number
CAP = re.compile(r"Capping cudagraph capture sizes from max (\d+) to (\d+)")


@dataclass(frozen=True)
class GraphConfig:
    """What one start-up line says about CUDA graphs (None: not printed)."""

    enforce_eager: bool | None
    cudagraph_mode: str | None
    max_capture_tokens: int | None

    @property
    def eager_above(self) -> int | None:
        """The token count above which every batch runs without a graph, or None when the line does not
        say, or graphs are off altogether (then every batch runs eager: no fallback to name)."""
        if self.enforce_eager or self.cudagraph_mode == "NONE" or not self.max_capture_tokens:
            return None
        return self.max_capture_tokens


def parse(body: str) -> GraphConfig:
    """The graph settings of a start-up line's text (the fields it lacks stay None)."""
    e, m, mx = _EAGER.search(body), _MODE.search(body), _MAX.search(body)
    top = int(mx.group(1)) if mx and mx.group(1) != "None" else None
    if top is None:
        s = _SIZES.search(body)
        sizes = [int(x) for x in re.findall(r"\d+", s.group(1))] if s else []
        top = max(sizes) if sizes else None
    return GraphConfig(None if e is None else e.group(1) == "True", m.group(1) if m else None, top)


def read_line(body: str, key: str, t: float | None, configs: dict) -> bool:
    """Fold a start-up config line or a capping warning of engine ``key`` into ``configs`` (key -> (time of
    the start-up line, GraphConfig)); False when ``body`` is neither."""
    if INIT.search(body):
        configs[key] = (t, parse(body))
        return True
    m = CAP.search(body)
    if m is None:
        return False
    t0, cfg = configs.get(key, (t, GraphConfig(None, None, None)))
    configs[key] = (t0, dataclasses.replace(cfg, max_capture_tokens=int(m.group(2))))
    return True


def interval_graph_limit(df: pd.DataFrame, configs: dict) -> None:
    """Interval rows of an engine whose start-up line has graphs on and a largest capture size N, from that
    line's time on: every batch of more than N tokens ran without a graph, so ``graph_none_min_tokens`` is at
    most N + 1 - the column the ``--cudagraph-metrics`` table fills; the smaller of the two is kept (in place)."""
    if not len(df) or "granularity" not in df:
        return
    for key, (t, cfg) in configs.items():
        top = cfg.eager_above
        if top is None:
            continue
        rows = (df["instance"].to_numpy(dtype=object) == key) & (df["granularity"] == "interval").to_numpy(dtype=bool)
        if t is not None:
            rows &= df["t_end_s"].to_numpy(dtype=float) >= t
        if rows.any():
            cur = df["graph_none_min_tokens"].to_numpy(dtype=float, copy=True) if "graph_none_min_tokens" in df \
                else np.full(len(df), np.nan)
            cur[rows] = np.fmin(cur[rows], float(top + 1))
            df["graph_none_min_tokens"] = cur


#: decode-only batches within the capture sizes replay this graph under each mode (CudagraphDispatcher:
#: FULL keys exist for uniform decode in the FULL modes; PIECEWISE keys for every captured size)
_DECODE_MODE = {"FULL_AND_PIECEWISE": "FULL", "FULL_DECODE_ONLY": "FULL", "FULL": "FULL", "PIECEWISE": "PIECEWISE"}


def step_graph_modes(steps, configs: dict):
    """Iteration steps of engines whose start-up line has graphs on, with the runtime mode the dispatcher
    gives their token count where no ``--cudagraph-metrics`` table said it (``graph_mode`` still unknown):

    * more tokens than the largest capture size: NONE, ``measured`` - the dispatcher's first test, before any
      key is looked up, so nothing at run time changes it (a later capping warning lowers the size, read);
    * a decode-only batch within the sizes: the mode's decode graph (FULL or PIECEWISE), ``inferred`` - the
      key lookup can still fall back (an attention backend without full-graph support), so it is context
      for the instance's decode norm, never evidence on its own row.

    ``configs``: engine key -> (t, GraphConfig). The frame unchanged when no engine applies."""
    if not len(steps) or "prefill_tokens" not in steps or "decode_rows" not in steps:
        return steps
    inst = steps["instance"].to_numpy(dtype=object)
    pt = pd.to_numeric(steps["prefill_tokens"], errors="coerce").fillna(0).to_numpy(dtype=float)
    dr = pd.to_numeric(steps["decode_rows"], errors="coerce").to_numpy(dtype=float)
    known = steps["graph_mode"].astype(object).to_numpy() if "graph_mode" in steps else np.full(len(steps), "unknown", object)
    open_ = np.array([m in (None, "unknown") or m != m for m in known], dtype=bool)
    mode = np.full(len(steps), None, dtype=object)
    qual = np.full(len(steps), None, dtype=object)
    for key, (_, cfg) in configs.items():
        top = cfg.eager_above
        if top is None:
            continue
        mine = (inst == key) & open_ & np.isfinite(dr)
        over = mine & (pt + dr > top)
        mode[over], qual[over] = "NONE", "measured"
        dec = _DECODE_MODE.get(cfg.cudagraph_mode or "")
        within = mine & ~over & (pt == 0) & (dr > 0)
        if dec is not None:
            mode[within], qual[within] = dec, "inferred"
    hit = mode != None  # noqa: E711 (object array)
    return write_modes(steps, hit, mode, qual)
