"""Rows of a vLLM log (collectors/logs/vllm_log.py reads the lines): a step row per Iteration line, an
interval row per stats line, the measured-zero pauses and qualities of the columns event lines fill, and
the instance names of an engine's rows.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from mixdiag.label_arrays import str_column
from mixdiag.schema import repeat_label

from mixdiag.collectors.logs import vllm_clock, vllm_iterations
from mixdiag.collectors.logs.log_lines import LogRows

KV_USAGE = re.compile(r"^(?:[a-z]+_)?kv_cache_usage_pct$")  # gpu_, cpu_, xpu_... (the stats line's slug)
STAT_COLS = {"running": "running_reqs", "waiting": "waiting_reqs", "pending": "waiting_reqs",
             "preemptions": "preempted_reqs"}

_LINE_COLS = ("prefill_tokens", "prefill_reqs", "decode_reqs", "decode_rows", "iteration", "elapsed_s")


def line_frame(sl: vllm_iterations.SplitLines, times: vllm_clock.LineTimes, rows: list[dict], rows_ln: list[int]) -> pd.DataFrame:
    """The step rows of every Iteration line, fast and walked, in line order."""
    f = sl.fast
    nf = len(sl.fast_ln)
    kind = repeat_label(nf, "idle")
    if nf:  # the rule of iter_row, column-wise (later assignments win, as its elif chain does first)
        kind[f["gr"] > 0] = "decode"
        kind[f["ct"] > 0] = "prefill"
        kind[(f["ct"] > 0) & (f["gr"] > 0)] = "mixed"
    fast_cols = {"prefill_tokens": f.get("ct"), "prefill_reqs": f.get("cr"), "decode_reqs": f.get("gr"),
                 "decode_rows": f.get("gt"), "iteration": f.get("n"), "elapsed_s": f.get("elapsed_s")}
    t = np.concatenate([times.t_row_fast, np.array([np.nan if r["t_start_s"] is None else r["t_start_s"]
                                                    for r in rows], dtype=float)])
    order = np.argsort(np.concatenate([sl.fast_ln, np.array(rows_ln, dtype=np.int64)]), kind="stable")
    df = {"instance": np.concatenate([f.get("key", np.zeros(0, object)), np.array([r["instance"] for r in rows], dtype=object)]),
          "t_start_s": t, "t_end_s": t, "granularity": repeat_label(nf + len(rows), "step"),
          "kind": np.concatenate([kind, np.array([r["kind"] for r in rows], dtype=object)])}
    for c in _LINE_COLS:
        fc = fast_cols[c] if nf else np.zeros(0)
        df[c] = np.concatenate([fc.astype(np.float64), np.array([r[c] for r in rows], dtype=np.float64)])
    if rows:  # line order; without walked rows the fast rows are in it already
        df = {k: v[order] for k, v in df.items()}
    for c in ("instance", "kind", "granularity"):  # few shared labels: built by code, not str by str
        df[c] = str_column(df[c])
    return pd.DataFrame(df)


def measured_zero_pauses(steps: pd.DataFrame, keys: set) -> None:
    """Interval rows of an engine whose log holds GC-debugger lines and none in the row: a measured 0 s pause
    (the debugger logs every collection), not an unmeasured one."""
    if not keys or "host_pause_s" not in steps.columns or not len(steps):
        return
    rows = steps["instance"].isin(keys) & (steps["granularity"] == "interval") & steps["host_pause_s"].isna()
    steps.loc[rows, "host_pause_s"] = 0.0


def qualities(df: pd.DataFrame, out: LogRows, events: list) -> None:
    """Per-row and meta qualities of the columns the event lines filled."""
    cols = {(e[0], e[2]) for e in events}

    def filled(c: str) -> np.ndarray:
        return df[c].notna().to_numpy() if c in df else np.zeros(len(df), dtype=bool)

    def measured(q: str, rows: np.ndarray) -> None:
        if rows.any():
            if q not in df:
                df[q] = np.full(len(df), None, dtype=object)
            df.loc[rows, q] = "measured"

    keys = [k for k, c in cols if c == "expert_imbalance"]
    if keys and len(df):
        measured("q_expert_imbalance", np.isin(df["instance"].to_numpy(dtype=object), keys) & filled("expert_imbalance"))
    if len(df):
        measured("q_kv_transfer", filled("kv_transfer_s") | filled("kv_transfer_bytes"))
        measured("q_graph_mode", filled("graph_full_steps") | filled("graph_piecewise_steps") | filled("graph_none_steps"))
    for k, col in cols:
        out.signal(k, col if not col.startswith("graph_") else "graph_steps", "measured")


def name_instances(df: pd.DataFrame, out: LogRows, base: str) -> pd.DataFrame:
    """Engine keys -> instance names: the base alone for one engine, else ``base/engineN``."""
    codes, uniq = pd.factorize(df["instance"]) if len(df) else (np.zeros(0, np.int64), [])
    keys = set(uniq) | {s["instance"] for s in out.series}
    single = len(keys) <= 1

    def name(k: str) -> str:
        if single:
            return base
        return f"{base}/aggregated" if k == "all" else f"{base}/engine{k}"

    if len(df):
        names = np.array([name(k) for k in uniq], dtype=object)
        df["instance"] = str_column(names[codes])
    for s in out.series:
        s["instance"] = name(s["instance"])
    out.signals = {name(k): v for k, v in out.signals.items()}
    if len(df):
        # the names of the step rows, read from their codes (a row's name is names[code], code -1 included)
        step = (df["granularity"] == "step").to_numpy(dtype=bool, na_value=False)
        for inst in set(names[np.unique(codes[step])]):
            out.signals.setdefault(inst, {})["kind"] = "measured"
    return df


def iter_row(key, t, n, ctx_req, ctx_tok, gen_req, gen_tok, elapsed_s) -> dict:
    if ctx_tok > 0 and gen_req > 0:
        kind = "mixed"
    elif ctx_tok > 0:
        kind = "prefill"
    elif gen_req > 0:
        kind = "decode"
    else:
        kind = "idle"
    return {"instance": key, "t_start_s": t, "t_end_s": t, "granularity": "step", "kind": kind,
            "prefill_tokens": float(ctx_tok), "prefill_reqs": float(ctx_req), "decode_reqs": float(gen_req),
            "decode_rows": float(gen_tok), "iteration": float(n), "elapsed_s": elapsed_s}


def stats_row(key, t, f, iterating, prev_t, interval_s, out: LogRows) -> None:
    for k, v in f.items():
        out.add_series(key, f"vllm_log:{k}", t, v)
    if key in iterating:
        return  # Iteration lines are the steps of this engine; the stats stay series
    if key not in prev_t:
        out.stats.note(f"the first stats line of each engine is taken to cover {interval_s:g} s "
                       "(VLLM_LOG_STATS_INTERVAL's default; pass stats_interval_s=)")
    t0 = prev_t.get(key, t - interval_s)
    prev_t[key] = t
    dt = max(t - t0, 0.0)
    prompt, gen = f.get("avg_prompt_throughput", float("nan")), f.get("avg_generation_throughput", float("nan"))
    row = {"instance": key, "t_start_s": t0, "t_end_s": t, "granularity": "interval",
           "prefill_tokens": prompt * dt, "output_tokens": gen * dt,
           "kind": "idle" if prompt == 0 and gen == 0 else "unknown"}
    for src, col in STAT_COLS.items():
        if src in f:
            row[col] = f[src]
    # "GPU KV cache usage" on GPUs, "CPU KV cache usage" on the CPU backend (vLLM prints the platform's
    # device name; older releases "GPU" everywhere): every spelling is the one KV column
    kv = next((f[k] for k in f if KV_USAGE.match(k)), None)
    if kv is not None:
        row["kv_usage"] = kv / 100.0
    running = f.get("running")
    if running and gen > 0:
        # each running request gets gen/running tokens per second: its mean inter-token time
        row["itl_mean_s"] = running / gen
        out.signal(key, "itl_mean_s", "estimated")
    out.steps.append(row)
    out.signal(key, "prefill_tokens", "estimated")
    out.signal(key, "output_tokens", "estimated")
