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

vLLM prints no year: pass ``year=``; otherwise a container timestamp's year, else the current
year is used and a note says so. Months running backwards (December -> January) add a year.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.logs.log_lines import LogRows, attach_events, naive_to_unix, parse_number, slug, strip_container_prefix
from mixdiag.collectors.text_input import is_garbage, read_lines, source_name

FORMAT = "vllm-log"

_PREFIX = re.compile(r"(?:\((?P<proc>[^)\s]+) pid=\d+\)\s+)?(?P<level>[A-Z]+) (?P<mo>\d\d)-(?P<d>\d\d) "
                     r"(?P<hms>\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))? \[?[\w.]+:\d+\]\s?")
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
_CG_SETTING = re.compile(r"^\s*-\s*(Mode|Capture sizes):\s*(.*)$")
_CG_MODE = re.compile(r"^(?:CUDAGraphMode\.)?(NONE|PIECEWISE|FULL)$")
_REMOTE_KVS = re.compile(r"(\S+) is still in WAITING_FOR_REMOTE_KVS state")
# A DP engine's DEBUG log may hold only EPLB / KV-transfer lines, or only the process-tagged
# prefix vLLM gives every line of an engine core or API server: any of these says vLLM.
_SNIFF = re.compile(rb"Avg prompt throughput: |Iteration\(\d+\): |SchedulerIterationDetails\(|SpecDecoding metrics: |"
                    rb"KV Transfer metrics: |\*\*CUDAGraph Stats:\*\*|EPLB step: |WAITING_FOR_REMOTE_KVS state|"
                    rb"\((?:EngineCore|APIServer)[\w-]* pid=\d+\) +[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d")
_KV_USAGE = re.compile(r"^(?:[a-z]+_)?kv_cache_usage_pct$")  # gpu_, cpu_, xpu_... (the stats line's slug)
_VALUE_UNIT = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*(tokens/s|reqs|%|tokens)?$")
_STAT_COLS = {"running": "running_reqs", "waiting": "waiting_reqs", "pending": "waiting_reqs",
              "preemptions": "preempted_reqs"}


def sniff(head: bytes, name: str) -> bool:
    """True when the head holds a vLLM stats, iteration, spec-decode, KV-transfer, EPLB, remote-KV wait
    or graph-table line, or a line with vLLM's engine-core / API-server prefix."""
    return _SNIFF.search(head) is not None  # the registry bounds how far it reads


class _Clock:
    """Month-day times -> unix seconds with an assumed year that rolls over at New Year."""

    def __init__(self, year: int | None):
        self.year = self.first_year = year
        self.last_month = None

    def at(self, mo: int, d: int, hms: str, frac: str | None) -> float | None:
        if self.last_month is not None and mo < self.last_month:
            self.year += 1
        self.last_month = mo
        return naive_to_unix(self.year, mo, d, hms, frac)


def _recent_year(month: int, day: int) -> int:
    """The current year, or the one before when month-day would lie in the future (a log is past)."""
    now = time.gmtime()
    if (month, day) > (now.tm_mon, now.tm_mday + 1):
        return now.tm_year - 1
    return now.tm_year


def _stats_fields(body: str) -> tuple[dict[str, float], list[str]]:
    """``Avg prompt throughput: 1.0 tokens/s, Running: 2 reqs, ...`` -> ({slug: value}, unreadable parts).

    Lenient about drift: a field in a shape we do not know is left out (and reported), the rest kept.
    """
    out: dict[str, float] = {}
    bad: list[str] = []
    for part in body.strip().rstrip(".").split(", "):
        key, sep, val = part.partition(": ")
        m = _VALUE_UNIT.match(val.strip().rstrip("."))
        if not sep or m is None:
            bad.append(part)
            continue
        out[slug(key) + ("_pct" if m.group(2) == "%" else "")] = float(m.group(1))
    return out, bad


def _kv_pairs(body: str) -> dict[str, float]:
    out = {}
    for part in re.split(r",\s*(?=[A-Za-z][^=,]*=)", body):
        key, sep, val = part.rpartition("=")
        n = parse_number(val)
        if sep and n is not None:
            out[slug(key)] = n
    return out


def read(source, *, instance: str | None = None, year: int | None = None, stats_interval_s: float = 10.0,
         **options) -> Timeline:
    """Read a vLLM log (path or file object) into step/interval rows and series; see the module doc."""
    lines, _, st = read_lines(source, FORMAT)
    base = instance or Path(source_name(source)).stem
    out = LogRows(st)
    clock: _Clock | None = None
    have_time = False
    last_t: float | None = None
    stats_rows: list[dict] = []          # periodic rows, placed after we know which engines iterate
    prev_stats_t: dict[str, float] = {}
    table: dict | None = None            # the CUDA-graph table being read
    events: list[tuple] = []             # (key, t, column, value, how) folded into rows at the end
    cg_settings: dict[str, str] = {}
    remote_waits: dict[tuple, set[str]] = {}  # (engine, t) -> requests still waiting for remote KV
    for raw in lines:
        if is_garbage(raw):
            st.skipped(raw, "not text")
            table = None
            continue
        line, t_container = strip_container_prefix(raw)
        pm = _PREFIX.search(line)
        t = t_container
        proc = None
        if pm:
            proc = pm.group("proc")
            if t is None:
                if clock is None:
                    clock = _Clock(year if year is not None else _recent_year(int(pm.group("mo")), int(pm.group("d"))))
                    if year is None:
                        st.note(f"vLLM log times have no year: assumed {clock.year}, the latest year that puts "
                                "the first line in the past (pass year=)")
                t = clock.at(int(pm.group("mo")), int(pm.group("d")), pm.group("hms"), pm.group("frac"))
            body = line[pm.end():]
        else:
            body = line
        if t is not None:
            have_time, last_t = True, t
        t_row = t if t is not None else last_t
        em = _ENGINE.search(body)
        dp = _DP.search(proc or "")
        key = ("all" if em.group(2) else str(int(em.group(1)))) if em else (str(int(dp.group(1))) if dp else "0")
        if table is not None:
            stripped = body.strip()
            if stripped.startswith("|"):
                _table_row(table, stripped, out, raw)
                continue
            if not stripped and not table["rows"]:
                st.ignored()
                continue
            table = None
        if _CG_STATS.search(body):
            st.parsed()
            table = {"t": t_row, "key": key, "cols": None, "rows": 0, "events": events}
            continue
        sm = _CG_SETTING.match(body)
        if sm:
            cg_settings[sm.group(1)] = sm.group(2).strip()
            st.parsed()
            continue
        im = _ITER.search(body)
        if im:
            n, ctx_req, ctx_tok, gen_req, gen_tok = (int(x) for x in im.groups()[:5])
            out.steps.append(_iter_row(key, t_row, n, ctx_req, ctx_tok, gen_req, gen_tok, float(im.group(6)) / 1e3))
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
                out.steps.append(_iter_row(key, t_row, *vals, elapsed))
            continue
        if _STATS.search(body):
            sbody = body[_STATS.search(body).start():]
            fields, bad = _stats_fields(sbody)
            if "avg_prompt_throughput" not in fields or "avg_generation_throughput" not in fields:
                st.skipped(raw, "stats line without readable throughputs")
                continue
            st.parsed()
            if bad:
                st.note(f"stats field(s) in an unknown shape left out, e.g. {bad[0][:80]!r}")
            stats_rows.append({"key": key, "t": t_row, "fields": fields})
            continue
        rk = _REMOTE_KVS.search(body)
        if rk:  # PD decode, DEBUG: a request waiting for its KV from the prefill instance
            remote_waits.setdefault((key, t_row), set()).add(rk.group(1))
            st.parsed()
            continue
        for rx, name in ((_SPEC, "spec_decode"), (_KV, "kv_transfer"), (_EPLB, "eplb")):
            m = rx.search(body)
            if m:
                _series_line(name, m.group(1), key, t_row, out, raw, events)
                break
        else:
            st.ignored()
    for (key, t), reqs in remote_waits.items():
        out.add_series(key, "vllm_log:waiting_for_remote_kvs_reqs", t, float(len(reqs)))
    # Lines before the first timestamp (or in a log without any) take the first known time.
    known = [r["t"] for r in stats_rows] + [r["t_start_s"] for r in out.steps] + [x["t_s"] for x in out.series]
    first_t = next((t for t in known if t is not None), None)
    iterating = {r["instance"] for r in out.steps}
    for r in stats_rows:
        r["t"] = r["t"] if r["t"] is not None else (first_t or 0.0)
    # each interval runs from the engine's previous stats line in time (lines can arrive out of order)
    for r in sorted(stats_rows, key=lambda r: r["t"]):
        _stats_row(r["key"], r["t"], r["fields"], iterating, prev_stats_t, stats_interval_s, out)
        if r["key"] in iterating and r["fields"].get("preemptions"):
            # the stats line counts preemptions since the last one; Iteration lines never do
            events.append((r["key"], r["t"], "preempted_reqs", r["fields"]["preemptions"], "sum"))
    for r in out.steps:
        r["step_source"] = "log"
    events = [e if e[1] is not None else (e[0], first_t or 0.0) + e[2:] for e in events]
    # graph-table counts describe a stats interval: they fill interval rows, never one Iteration step
    events = [e for e in events if not (e[2].startswith("graph_") and e[0] in iterating)]
    orphans = attach_events(out.steps, events)
    if orphans and not out.steps:
        st.note(f"no stats or iteration line: {orphans} EPLB/KV-transfer/CUDA-graph value(s) kept as series only")
    elif orphans:
        st.note(f"{orphans} EPLB/KV-transfer/CUDA-graph/preemption value(s) logged before any row of "
                "their engine: kept as series only")
    _qualities(out, events, iterating)
    year_used = clock.first_year if clock is not None else None
    _name_instances(out, base)
    if cg_settings:
        out.meta["cudagraph_config"] = cg_settings
    if year_used is not None and year is None:
        out.meta["year_assumed"] = year_used  # fusion may re-read with year= from unix-clock sources
    untimed = 0
    for x in out.series:
        if x["t_s"] is None:
            x["t_s"], untimed = first_t or 0.0, untimed + 1
    for r in out.steps:
        if r["t_start_s"] is None:
            r["t_start_s"] = r["t_end_s"] = first_t or 0.0
            untimed += 1
    if not have_time and (out.steps or out.series):
        st.note("no timestamps in the log: rows at t=0 on a relative clock; order is line order")
    elif untimed:
        st.note(f"{untimed} value(s) logged before the first timestamp placed at the first timestamp")
    if lines and st.lines_parsed == 0 and st.lines_skipped == 0:
        raise UserError(f"{source_name(source)}: no vLLM stats/iteration/metrics line found")
    out.steps.sort(key=lambda r: (r["instance"], r["t_start_s"]))  # stable: line order within a time
    return out.timeline(FORMAT, "unix" if have_time else "relative")


def _iter_row(key, t, n, ctx_req, ctx_tok, gen_req, gen_tok, elapsed_s) -> dict:
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


def _stats_row(key, t, f, iterating, prev_t, interval_s, out: LogRows) -> None:
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
    for src, col in _STAT_COLS.items():
        if src in f:
            row[col] = f[src]
    # "GPU KV cache usage" on GPUs, "CPU KV cache usage" on the CPU backend (vLLM prints the platform's
    # device name; older releases "GPU" everywhere): every spelling is the one KV column
    kv = next((f[k] for k in f if _KV_USAGE.match(k)), None)
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


def _series_line(name: str, body: str, key: str, t, out: LogRows, raw: str, events: list) -> None:
    if name == "spec_decode":
        vals: dict[str, float] = {}
        current = None
        positions: list[float] = []
        for part in body.split(", "):
            k, sep, v = part.partition(": ")
            if sep:
                current = slug(k)
            else:
                v = part  # continuation of the per-position list
            m = _VALUE_UNIT.match(v.strip().rstrip("."))
            if m is None or current is None:
                out.stats.skipped(raw, f"spec-decode value {v!r}")
                return
            val = float(m.group(1))
            if current == "per_position_acceptance_rate":
                positions.append(val)
            else:
                vals[current + ("_pct" if m.group(2) == "%" else "")] = val
        for i, p in enumerate(positions):
            out.add_series(key, "vllm_log:spec_decode_per_position_acceptance_rate", t, p, f"position={i}")
    else:
        connector = re.match(r"KVConnectorType: ([^,]+), ", body)
        if connector:
            body = body[connector.end():]
        vals = _kv_pairs(body)
        if not vals:
            out.stats.skipped(raw, f"{name} line without key=value pairs")
            return
    out.stats.parsed()
    for k, v in vals.items():
        out.add_series(key, f"vllm_log:{name}_{k}", t, v)
    events.extend((key, t, col, v, how) for col, v, how in _line_columns(name, vals))


def _line_columns(name: str, vals: dict[str, float]) -> list[tuple[str, float, str]]:
    """Timeline columns an EPLB / KV-transfer / spec-decode line fills: (column, value, how).

    EPLB ``balancedness`` is avg/max tokens per rank; ``expert_imbalance`` is max/avg, so its
    reciprocal (``max_tokens/avg_tokens`` when both are logged). KV transfer: the NIXL stats are
    averages over the interval's transfers; with ``Num successful transfers`` their sums are
    count x average (without a count only the series are kept).
    """
    out = []
    if name == "eplb":
        avg, mx, bal = vals.get("avg_tokens"), vals.get("max_tokens"), vals.get("balancedness")
        if avg and mx is not None and avg > 0:
            out.append(("expert_imbalance", mx / avg, "mean"))
        elif bal and bal > 0:
            out.append(("expert_imbalance", 1.0 / bal, "mean"))
    elif name == "kv_transfer":
        n = vals.get("num_successful_transfers")
        if n is not None:
            if vals.get("avg_xfer_time_ms") is not None:
                out.append(("kv_transfer_s", n * vals["avg_xfer_time_ms"] / 1e3, "sum"))
            if vals.get("avg_mb_per_transfer") is not None:
                out.append(("kv_transfer_bytes", n * vals["avg_mb_per_transfer"] * 1e6, "sum"))
    return out


def _qualities(out: LogRows, events: list, iterating: set) -> None:
    """Per-row and meta qualities of the columns the event lines filled."""
    cols = {(e[0], e[2]) for e in events}
    for r in out.steps:
        k = r["instance"]
        if (k, "expert_imbalance") in cols and r.get("expert_imbalance") == r.get("expert_imbalance") \
                and "expert_imbalance" in r:
            r["q_expert_imbalance"] = "measured"
        if "kv_transfer_s" in r or "kv_transfer_bytes" in r:
            r["q_kv_transfer"] = "measured"
        if any(c in r for c in ("graph_full_steps", "graph_piecewise_steps", "graph_none_steps")):
            r["q_graph_mode"] = "measured"
    for k, col in cols:
        out.signal(k, col if not col.startswith("graph_") else "graph_steps", "measured")


def _table_row(table: dict, row: str, out: LogRows, raw: str) -> None:
    cells = [c.strip() for c in row.strip("|").split("|")]
    if all(set(c) <= set("-: ") for c in cells):
        out.stats.parsed()  # |---|---| separator
        return
    if table["cols"] is None and not any(c.isdigit() for c in cells):
        table["cols"] = [slug(c) for c in cells]
        out.stats.parsed()
        return
    cols = table["cols"] or ["unpadded_tokens", "padded_tokens", "num_paddings", "runtime_mode", "count"]
    rec = dict(zip(cols, cells))
    mode = _CG_MODE.match(rec.get("runtime_mode", ""))
    try:
        count = int(rec["count"])
        unpadded, padded = int(rec["unpadded_tokens"]), int(rec["padded_tokens"])
    except (KeyError, ValueError):
        out.stats.skipped(raw, "CUDA-graph table row")
        return
    if mode is None or len(cells) != len(cols):
        out.stats.skipped(raw, "CUDA-graph table row")
        return
    out.stats.parsed()
    table["rows"] += 1
    out.add_series(table["key"], "vllm_log:cudagraph_steps", table["t"], float(count),
                   f"mode={mode.group(1)},padded_tokens={padded},unpadded_tokens={unpadded}")
    col = {"FULL": "graph_full_steps", "PIECEWISE": "graph_piecewise_steps", "NONE": "graph_none_steps"}[mode.group(1)]
    table["events"].append((table["key"], table["t"], col, float(count), "sum"))


def _name_instances(out: LogRows, base: str) -> None:
    """Engine keys -> instance names: the base alone for one engine, else ``base/engineN``."""
    keys = {r["instance"] for r in out.steps} | {s["instance"] for s in out.series}
    single = len(keys) <= 1

    def name(k: str) -> str:
        if single:
            return base
        return f"{base}/aggregated" if k == "all" else f"{base}/engine{k}"

    for r in out.steps:
        r["instance"] = name(r["instance"])
    for s in out.series:
        s["instance"] = name(s["instance"])
    out.signals = {name(k): v for k, v in out.signals.items()}
    for inst in {r["instance"] for r in out.steps if r["granularity"] == "step"}:
        out.signals.setdefault(inst, {})["kind"] = "measured"
