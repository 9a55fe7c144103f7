"""vLLM log lines that become series (and a few timeline columns): stats fields, spec-decode /
KV-transfer / EPLB ``key=value`` lines, and rows of the ``--cudagraph-metrics`` table.

Split from :mod:`vllm_log` (which walks the lines and keeps the state); each function here reads
one line's body.
"""
from __future__ import annotations

import re

from mixdiag.collectors.logs.log_lines import LogRows, parse_number, slug

VALUE_UNIT = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*(tokens/s|reqs|%|tokens)?$")
_CG_MODE = re.compile(r"^(?:CUDAGraphMode\.)?(NONE|PIECEWISE|FULL)$")


def stats_fields(body: str) -> tuple[dict[str, float], list[str]]:
    """``Avg prompt throughput: 1.0 tokens/s, Running: 2 reqs, ...`` -> ({slug: value}, unreadable parts).

    Lenient about drift: a field in a shape we do not know is left out (and reported), the rest kept.
    """
    out: dict[str, float] = {}
    bad: list[str] = []
    body = _KV_FETCH.sub(_kv_fetch_fields, body)
    for part in body.strip().rstrip(".").split(", "):
        key, sep, val = part.partition(": ")
        m = VALUE_UNIT.match(val.strip().rstrip("."))
        if not sep or m is None:
            bad.append(part)
            continue
        out[slug(key) + ("_pct" if m.group(2) == "%" else "")] = float(m.group(1))
    return out, bad


# vLLM 0.32's stats line, when a KV connector fetches: "KV fetch: %d waiting to start, %d in progress,
# %d completed waiting" (v1/metrics/loggers.py; the stages of num_requests_kv_fetch_by_stage). Its
# inner ", " would split it into three parts of no known shape, so it is rewritten into three fields.
_KV_FETCH = re.compile(r"KV fetch: (\d+) waiting to start, (\d+) in progress, (\d+) completed waiting")


def _kv_fetch_fields(m: re.Match) -> str:
    return (f"KV fetch waiting to start: {m.group(1)} reqs, KV fetch in progress: {m.group(2)} reqs, "
            f"KV fetch completed waiting: {m.group(3)} reqs")


# vLLM 0.32 (distributed/eplb/eplb_state.py): "EPLB step: %d for model %s: avg_tokens=%.2f,
# max_tokens=%d, balancedness=%.4f, steps until the next rearrangement: %d"; older builds print the
# key=value pairs alone. The model name may hold ":" and "," (a path), so the prefix is cut first.
_EPLB_HEAD = re.compile(r"^\s*(\d+) for model (.*?): (?=avg_tokens=|max_tokens=|balancedness=)")
_EPLB_NEXT = re.compile(r",\s*steps until the next rearrangement:\s*(\d+)\s*$")


def eplb_fields(body: str) -> dict[str, float]:
    """An ``EPLB step:`` body in either shape -> {avg_tokens, max_tokens, balancedness, and, where
    logged, step, steps_to_rearrangement}."""
    out: dict[str, float] = {}
    head = _EPLB_HEAD.match(body)
    if head:
        out["step"] = float(head.group(1))
        body = body[head.end():]
    nxt = _EPLB_NEXT.search(body)
    if nxt:
        out["steps_to_rearrangement"] = float(nxt.group(1))
        body = body[:nxt.start()]
    pairs = _kv_pairs(body)
    return {**pairs, **out} if pairs else {}


def _kv_pairs(body: str) -> dict[str, float]:
    """``a=1, Avg xfer time (ms)=3.5`` -> {slug: value}; a value that is no number is left out."""
    out = {}
    for part in re.split(r",\s*(?=[A-Za-z][^=,]*=)", body):
        key, sep, val = part.rpartition("=")
        n = parse_number(val)
        if sep and n is not None:
            out[slug(key)] = n
    return out


def series_line(name: str, body: str, key: str, t, out: LogRows, raw: str, events: list) -> None:
    """A spec-decode / KV-transfer / EPLB line -> series, and the timeline columns it fills -> ``events``."""
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
            m = VALUE_UNIT.match(v.strip().rstrip("."))
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
        vals = eplb_fields(body) if name == "eplb" else _kv_pairs(body)
        if not vals:
            out.stats.skipped(raw, f"{name} line without key=value pairs")
            return
    out.stats.parsed()
    for k, v in vals.items():
        out.add_series(key, f"vllm_log:{name}_{k}", t, v)
    cols = _line_columns(name, vals)
    events.extend((key, t, col, v, how) for col, v, how in cols)
    if name == "eplb":
        # one line per engine step (eplb_state.py logs every log_balancedness_interval steps, default 1): kept
        # at its own stamp as well, so a finer interval than the stats line's (a 1 s scrape) takes the
        # imbalance of its own steps, not the 10 s window's mean (collectors/join.py POINT_SERIES)
        for col, v, _ in cols:
            out.add_series(key, f"vllm_log:eplb_{col}", t, v)


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


def table_row(table: dict, row: str, out: LogRows, raw: str) -> None:
    """One ``| ... |`` row of the CUDA-graph table: header, separator, or a (mode, count) row."""
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
    if mode.group(1) == "NONE" and count > 0:
        # the smallest batch dispatched without a graph: CudagraphDispatcher runs NONE only above the
        # largest capture size, so every decode batch at least this large ran eager in the window
        table["events"].append((table["key"], table["t"], "graph_none_min_tokens", float(unpadded), "min"))
