"""vLLM logs: periodic stats, ``Iteration(N)`` lines, spec-decode / KV-transfer lines, the CUDA-graph table.

Read by key, lenient about drift (reference/formats.md §1.2):

* **Iteration lines** (``Iteration(N): a context requests, b context tokens, c generation
  requests, d generation tokens, iteration elapsed time: x ms`` and the newer
  ``SchedulerIterationDetails(...)``): one ``step`` row each; a step is ``mixed`` iff context
  tokens > 0 and generation requests > 0 (every prefill chunk counts as context). ``elapsed_s``
  (host time, not GPU time) and ``iteration`` (N) are extra columns.
* **Periodic stats** (``Engine NNN: Avg prompt throughput: ...``, V0 ``Swapped/Pending``, optional
  ``Preemptions``/``Corrupted``/... suffixes, a trailing ``.``): one ``interval`` row per line, from
  the previous line of that engine (the first covers ``stats_interval_s``, vLLM's default 10 s).
  Token counts are throughput x interval and ``itl_mean_s`` is Running / generation throughput
  (all ``estimated``). Where an engine also logs Iteration
  lines, those are the steps and the periodic values go to ``series`` only.
* ``SpecDecoding metrics``, ``KV Transfer metrics``, ``EPLB step`` lines and the
  ``--cudagraph-metrics`` table (``**CUDAGraph Stats:**`` + ``| ... |`` rows): ``series``.
* ``GC took X ms to complete. Collected N objects (out of M) in GC generation G.`` (vLLM's GC debugger,
  ``VLLM_GC_DEBUG=1``, ``utils/gc_utils.py``; logged by the process that collected, at the end of the
  collection): series ``vllm_log:gc_pause_s`` and the rows' ``host_pause_s`` (sum) - time the engine's
  Python was stopped in a collection, measured by the engine.

vLLM prints no year: pass ``year=``; otherwise a container timestamp's year, else the current
year is used and a note says so. Months running backwards (December -> January) add a year.

A 10-minute iteration log has a million lines: Iteration lines in the usual shape are matched
and converted column-wise (vllm_iterations.py), every other line is walked here one by one, the
line times of both come from vllm_clock.py, and the rows stay a frame (step_frame.py).
"""
from __future__ import annotations

import dataclasses
import os

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.logs import vllm_clock, vllm_config, vllm_graph_steps, vllm_iterations, vllm_json
from mixdiag.collectors.logs.log_lines import LogRows
from mixdiag.collectors.logs.step_frame import attach_events_frame
from mixdiag.collectors.logs.vllm_rows import (iter_row, line_frame, measured_zero_pauses, name_instances, qualities,
                                               stats_row)
from mixdiag.collectors.logs.vllm_series import series_line, stats_fields, table_row
from mixdiag.collectors.text_input import clean_lines, line_stats, read_counted, source_name

FORMAT = "vllm-log"

_ENGINE = re.compile(r"(?:Engine (\d+)|(\d+) Engines Aggregated):\s*")
_DP = re.compile(r"_DP(\d+)")
_ITER = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
                   r"(\d+) generation tokens, iteration elapsed time: ([\d.]+) ms")
_ITER_NEW = re.compile(r"SchedulerIterationDetails\((.*)\)")
_STATS = re.compile(r"Avg prompt throughput: ")
_SPEC = re.compile(r"SpecDecoding metrics: (.*)$")
_KV = re.compile(r"KV Transfer metrics: (.*)$")
_EPLB = re.compile(r"EPLB step: (.*)$")
_CG_STATS = re.compile(r"\*\*CUDAGraph Stats:\*\*")
_GC = re.compile(r"GC took ([\d.]+) ?ms to complete\.(?: Collected \S+ objects \(out of \d+\) in GC generation (\d+))?")
_CG_SETTING = re.compile(r"^\s*-\s*(Mode|Capture sizes):\s*(.*)$")
_REMOTE_KVS = re.compile(r"(\S+) is still in WAITING_FOR_REMOTE_KVS state")
# A DP engine's DEBUG log may hold only EPLB / KV-transfer lines, or only the process-tagged
# prefix vLLM gives every line of an engine core or API server: any of these says vLLM.
_SNIFF = re.compile(rb"Avg prompt throughput: |Iteration\(\d+\): |SchedulerIterationDetails\(|SpecDecoding metrics: |"
                    rb"KV Transfer metrics: |\*\*CUDAGraph Stats:\*\*|EPLB step: |WAITING_FOR_REMOTE_KVS state|"
                    rb"\((?:EngineCore|APIServer)[\w-]* pid=\d+\) +[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d")


def sniff(head: bytes, name: str) -> bool:
    """True when the head holds a vLLM stats, iteration, spec-decode, KV-transfer, EPLB, remote-KV wait
    or graph-table line, or a line with vLLM's engine-core / API-server prefix."""
    return _SNIFF.search(head) is not None  # the registry bounds how far it reads


def read(source, *, instance: str | None = None, year: int | None = None, stats_interval_s: float = 10.0,
         fast: bool = True, **options) -> Timeline:
    """Read a vLLM log (path or file object) into step/interval rows and series; see the module doc.

    ``fast=False`` reads every Iteration line in the per-line walk too (the reference the
    columnar fast path is tested against).
    """
    name, text, replaced = read_counted(source, ascii_bytes=True)
    head = text[:16384].decode("ascii", "replace") if isinstance(text, bytes) else text[:16384]
    json_records = None
    if vllm_json.looks_json(head):  # --logging-config.formatter json: one record per line
        as_text, json_year, json_records = vllm_json.to_text(
            text.decode("utf-8", "replace") if isinstance(text, bytes) else text)
        text = as_text
        year = year if year is not None else json_year
    sl = vllm_iterations.split(text, fast)
    del text
    st = line_stats(FORMAT, name, sl.n, replaced)
    if json_records is not None:
        st.note(f"JSON log: {json_records} record(s) read as vLLM's text lines (a multi-line message is one "
                "line per message line); times are the records' asctime: local time, year and milliseconds")
    base = instance or Path(source_name(source)).stem
    out = LogRows(st)
    written = None
    if isinstance(source, (str, os.PathLike)) and os.path.isfile(source):
        written = os.stat(source).st_mtime  # the year hint of a year-less log read alone (vllm_clock)
    times = vllm_clock.LineTimes(sl, clean_lines(sl.slow) if replaced else sl.slow, year, written)
    w = _walk(sl, times, out)
    steps = line_frame(sl, times, w.steps, w.steps_ln)
    # Lines before the first timestamp (or in a log without any) take the first known time.
    first_t = next((r["t"] for r in w.stats_rows if r["t"] is not None), None)
    if first_t is None and len(steps):
        timed = steps["t_start_s"].to_numpy()
        timed = timed[~np.isnan(timed)]
        first_t = float(timed[0]) if len(timed) else None
    if first_t is None:
        first_t = next((x["t_s"] for x in out.series if x["t_s"] is not None), None)
    iterating = set(pd.unique(steps["instance"])) if len(steps) else set()
    events = w.events
    for r in w.stats_rows:
        r["t"] = r["t"] if r["t"] is not None else (first_t or 0.0)
    # each interval runs from the engine's previous stats line in time (lines can arrive out of order)
    prev_stats_t: dict[str, float] = {}
    for r in sorted(w.stats_rows, key=lambda r: r["t"]):
        stats_row(r["key"], r["t"], r["fields"], iterating, prev_stats_t, stats_interval_s, out)
        if r["key"] in iterating and r["fields"].get("preemptions"):
            # the stats line counts preemptions since the last one; Iteration lines never do
            events.append((r["key"], r["t"], "preempted_reqs", r["fields"]["preemptions"], "sum"))
    if out.steps:  # interval rows come after every line's step rows
        steps = pd.concat([steps, pd.DataFrame(out.steps)], ignore_index=True) if len(steps) else pd.DataFrame(out.steps)
    steps["step_source"] = "log"
    events = [e if e[1] is not None else (e[0], first_t or 0.0) + e[2:] for e in events]
    # graph-table counts describe a stats interval: they fill interval rows, never one Iteration step as
    # counts; a step whose token count the window's table lists under one mode ran in it (vllm_graph_steps)
    events = [e for e in events if not (e[2].startswith("graph_") and e[0] in iterating)]
    if iterating:
        steps = vllm_graph_steps.step_graph_modes(steps, out.series, iterating)
        steps = vllm_config.step_graph_modes(steps, {k: v for k, v in w.graph_configs.items() if k in iterating})
    if w.cg_settings.get("Mode", "").rsplit(".", 1)[-1] == "NONE":
        # graphs off (enforce-eager): every batch runs NONE, which says nothing about a fallback
        events = [e for e in events if e[2] != "graph_none_min_tokens"]
    orphans = attach_events_frame(steps, events)
    vllm_config.interval_graph_limit(steps, w.graph_configs)
    measured_zero_pauses(steps, {e[0] for e in events if e[2] == "host_pause_s"})
    if orphans and not len(steps):
        st.note(f"no stats or iteration line: {orphans} EPLB/KV-transfer/CUDA-graph value(s) kept as series only")
    elif orphans:
        st.note(f"{orphans} EPLB/KV-transfer/CUDA-graph/preemption value(s) logged before any row of "
                "their engine: kept as series only")
    qualities(steps, out, events)
    steps = name_instances(steps, out, base)
    if w.cg_settings:
        out.meta["cudagraph_config"] = w.cg_settings
    if w.graph_configs:
        out.meta["engine_graph_config"] = {k: dataclasses.asdict(cfg) for k, (_, cfg) in w.graph_configs.items()}
    if times.first_year is not None and year is None:
        out.meta["year_assumed"] = times.first_year  # fusion may re-read with year= from unix-clock sources
    if times.naive_zone:
        out.meta["clock_zone"] = "naive"  # local wall time, zone unknown: collectors/logs/log_zone.py
    untimed = 0
    for x in out.series:
        if x["t_s"] is None:
            x["t_s"], untimed = first_t or 0.0, untimed + 1
    if len(steps):
        none = steps["t_start_s"].isna().to_numpy()
        if none.any():
            steps.loc[none, "t_start_s"] = steps.loc[none, "t_end_s"] = first_t or 0.0
            untimed += int(none.sum())
    if not times.have_time and (len(steps) or out.series):
        st.note("no timestamps in the log: rows at t=0 on a relative clock; order is line order")
    elif untimed:
        st.note(f"{untimed} value(s) logged before the first timestamp placed at the first timestamp")
    if sl.n and st.lines_parsed == 0 and st.lines_skipped == 0:
        raise UserError(f"{source_name(source)}: no vLLM stats/iteration/metrics line found")
    return out.timeline(FORMAT, "unix" if times.have_time else "relative", steps_frame=steps)


@dataclass
class _Walked:
    """What the per-line walk collected besides ``LogRows`` series and counts."""

    steps: list[dict] = field(default_factory=list)     # step rows of Iteration lines read here
    steps_ln: list[int] = field(default_factory=list)   # their line numbers
    stats_rows: list[dict] = field(default_factory=list)  # periodic rows, placed once we know who iterates
    events: list[tuple] = field(default_factory=list)   # (key, t, column, value, how) folded into rows at the end
    cg_settings: dict[str, str] = field(default_factory=dict)
    graph_configs: dict[str, tuple] = field(default_factory=dict)  # engine key -> (t, GraphConfig) of its start-up line


def _walk(sl: vllm_iterations.SplitLines, times: vllm_clock.LineTimes, out: LogRows) -> _Walked:
    """Every line the fast path left, in line order; the fast lines are counted parsed here."""
    st, w = out.stats, _Walked()
    st.parsed(len(sl.fast_ln))
    table: dict | None = None            # the CUDA-graph table being read
    remote_waits: dict[tuple, set[str]] = {}  # (engine, t) -> requests still waiting for remote KV
    fast_before = np.searchsorted(sl.fast_ln, sl.slow_ln).tolist()
    year_note = times.year_note
    prev_fast = 0
    for i, (ln, pre) in enumerate(zip(sl.slow_ln.tolist(), times.pre)):
        if fast_before[i] != prev_fast:
            table = None  # an Iteration line between closes any CUDA-graph table
            prev_fast = fast_before[i]
        if year_note is not None and ln >= times.first_clock_ln:
            st.note(year_note)
            year_note = None
        if pre is None:
            st.skipped(times.slow[i], "not text")
            table = None
            continue
        raw, body, proc, _ = pre
        t_row = times.t_row_slow[i]
        t_row = None if t_row != t_row else float(t_row)
        em = _ENGINE.search(body)
        dp = _DP.search(proc or "")
        key = ("all" if em.group(2) else str(int(em.group(1)))) if em else (str(int(dp.group(1))) if dp else "0")
        if table is not None:
            stripped = body.strip()
            if stripped.startswith("|"):
                table_row(table, stripped, out, raw)
                continue
            if not stripped and not table["rows"]:
                st.ignored()
                continue
            table = None
        if _CG_STATS.search(body):
            st.parsed()
            table = {"t": t_row, "key": key, "cols": None, "rows": 0, "events": w.events}
            continue
        sm = _CG_SETTING.match(body)
        if sm:
            w.cg_settings[sm.group(1)] = sm.group(2).strip()
            st.parsed()
            continue
        im = _ITER.search(body)
        if im:
            n, ctx_req, ctx_tok, gen_req, gen_tok = (int(x) for x in im.groups()[:5])
            w.steps.append(iter_row(key, t_row, n, ctx_req, ctx_tok, gen_req, gen_tok, float(im.group(6)) / 1e3))
            w.steps_ln.append(ln)
            st.parsed()
            continue
        inm = _ITER_NEW.search(body)
        if inm:
            kv = dict(re.findall(r"(\w+)=([\w.]+)", inm.group(1)))
            try:
                vals = [int(kv[k]) for k in ("iteration_index", "num_ctx_requests", "num_ctx_tokens",
                                             "num_generation_requests", "num_generation_tokens")]
                elapsed = float(kv["elapsed_ms"]) / 1e3
            except (KeyError, ValueError):
                st.skipped(raw, "SchedulerIterationDetails without the step fields")
                continue
            st.parsed()
            if kv.get("is_dummy") != "True":  # DP padding steps computed nothing
                w.steps.append(iter_row(key, t_row, *vals, elapsed))
                w.steps_ln.append(ln)
            continue
        if _STATS.search(body):
            fields, bad = stats_fields(body[_STATS.search(body).start():])
            if "avg_prompt_throughput" not in fields or "avg_generation_throughput" not in fields:
                st.skipped(raw, "stats line without readable throughputs")
                continue
            st.parsed()
            if bad:
                st.note(f"stats field(s) in an unknown shape left out, e.g. {bad[0][:80]!r}")
            w.stats_rows.append({"key": key, "t": t_row, "fields": fields})
            continue
        rk = _REMOTE_KVS.search(body)
        if rk:  # PD decode, DEBUG: a request waiting for its KV from the prefill instance
            remote_waits.setdefault((key, t_row), set()).add(rk.group(1))
            st.parsed()
            continue
        gm = _GC.search(body) if "GC took" in body else None
        if gm:
            pause = float(gm.group(1)) / 1e3
            out.add_series(key, "vllm_log:gc_pause_s", t_row, pause,
                           f"generation={gm.group(2)}" if gm.group(2) is not None else "")
            w.events.append((key, t_row, "host_pause_s", pause, "sum"))
            st.parsed()
            continue
        for rx, name in ((_SPEC, "spec_decode"), (_KV, "kv_transfer"), (_EPLB, "eplb")):
            m = rx.search(body)
            if m:
                series_line(name, m.group(1), key, t_row, out, raw, w.events)
                break
        else:
            # the start-up config line and a later capping warning, once per engine: looked for last
            if vllm_config.read_line(body, key, t_row, w.graph_configs):
                st.parsed()
            else:
                st.ignored()
    if year_note is not None:
        st.note(year_note)
    for (key, t), reqs in remote_waits.items():
        out.add_series(key, "vllm_log:waiting_for_remote_kvs_reqs", t, float(len(reqs)))
    return w
