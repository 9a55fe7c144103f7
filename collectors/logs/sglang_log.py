"""SGLang scheduler logs: ``Prefill batch`` / ``Decode batch`` lines -> step rows.

Every format era in reference/formats.md §2.1 is read by key, never by position: ``batch.`` or
``batch,``, an optional ``[forward_ct]``, trailing ``", "``/``","`` or none, ``cuda graph`` /
``npu graph`` / ``cpu graph``, PD fields, ``accept len``/``accept rate``, swapped field order,
``[YYYY-MM-DD HH:MM:SS(.mmm) DPk TPk EPk]`` prefixes, custom or missing prefixes.

* A ``Prefill batch`` line is one prefill (extend) forward: ``prefill_tokens`` = ``#new-token``
  (computed; cache hits are ``#cached-token``).
* A ``Decode batch`` line describes the one decode forward just run; SGLang prints it every
  ``decode_log_interval`` forwards (default 40), so decode rows are a sample, not every step.
* **Mixed steps.** SGLang's logs never say MIXED: with ``--enable-mixed-chunk`` (and a chunked
  prefill size) the ``#running-req`` decodes of a Prefill line were folded into that forward, so
  the row is ``mixed`` - *inferred* (``meta["signals"][instance]["kind"] == "inferred"``). Without
  it those decodes were stalled by the prefill. The setting comes from the ``enable_mixed_chunk=``
  option or a ``server_args=ServerArgs(...)`` line in the log; when neither says, SGLang's default
  (off) is assumed and a note says so.
* ``cuda graph: <b>`` gives ``graph_mode`` (Decode: FULL/NONE, Prefill: PIECEWISE/NONE). On a
  Decode line it is ``measured``, with ``graph_replayed``, for the one forward that logged the line:
  the model runner replays the graph exactly when ``can_run_graph`` holds and returns that flag with
  the forward's output (``ModelRunnerOutput(can_run_graph=...)``, model_runner.py ``_forward_raw``);
  ``process_batch_result_decode`` passes ``result.can_run_cuda_graph`` to ``log_decode_stats``. It
  says nothing of the other forwards since the previous line (1 in ``decode_log_interval``, default
  40, is logged). A Prefill line's flag: ``log_prefill_stats`` ran at scheduling, before the forward,
  in the versions read here (newer ones pass it a ``can_run_cuda_graph`` argument, not checked):
  ``estimated``, no replay claimed.
* ``elapsed_s`` (extra column) on Decode rows: ``#running-req`` x accept len / ``gen throughput``,
  the mean decode step time since the previous Decode line (``estimated``): interleaved prefills
  stretch it, as they stretch TPOT.
* Retraction lines (``Decode out of memory happened``), EP balancedness lines and every field
  without a Timeline column go to ``series`` (``sglang_log:<field>``).
"""
from __future__ import annotations

import re
from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.schema import Timeline

from mixdiag.collectors.logs.log_lines import LogRows, attach_events, naive_to_unix, parse_number, slug, strip_container_prefix
from mixdiag.collectors.text_input import is_garbage, read_lines, source_name

FORMAT = "sglang-log"

# Every era's first field is #new-seq or #running-req; requiring '#' keeps prose that merely
# mentions "Prefill batch," (a comment, a quoted PR title) out.
_BATCH = re.compile(r"\b(Prefill|Decode) batch(?: ?\[(\d+)\])?[.,]\s*(?=#|$)")
_FIELD_BODY = r"(#?[A-Za-z][A-Za-z _-]*?(?: \([a-z/]+\))?): ([^,]*[^,\s]|)\s*(?:,|$)"
_FIELD = re.compile(_FIELD_BODY)
_ALL_FIELDS = re.compile(rf"(?:{_FIELD_BODY}[ ,]*)*")  # the whole rest is fields and separators
_PREFIX = re.compile(r"\[(\d{4})-(\d\d)-(\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,](\d+))?((?:\s+[A-Z_]*\d+)*)\s*\]")
_RETRACT = re.compile(r"Decode out of memory happened\.\s*(.*)$")
_BALANCE = re.compile(r"\[Expert Balancedness\]\s*(.*)$")
# --gc-warning-threshold-secs (utils.configure_gc_warning, a gc.callbacks hook): a collection that took longer
_GC = re.compile(r"LONG GARBAGE COLLECTION DETECTED \| Generation (\S+) \| Duration: ([\d.]+)s")
_SERVER_ARGS = re.compile(r"server_args=ServerArgs\(")
_ARG = {"enable_mixed_chunk": re.compile(r"\benable_mixed_chunk=(True|False)"),
        "chunked_prefill_size": re.compile(r"\bchunked_prefill_size=(-?\d+|None)"),
        "decode_log_interval": re.compile(r"\bdecode_log_interval=(\d+)"),
        "cuda_graph_max_bs": re.compile(r"\bcuda_graph_max_bs=(\d+|None)")}
# A DP/EP rank's log may hold only EPLB balancedness or DEBUG lines: the rank-tagged prefix
# (``[2026-01-02 03:04:05 DP1 TP0 EP1]``) is SGLang's own and says so too.
_SNIFF = re.compile(rb"(?:Prefill|Decode) batch(?: ?\[\d+\])?[.,] #|Decode out of memory happened|server_args=ServerArgs\(|"
                    rb"\[Expert Balancedness\]|^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: (?:DP|TP|EP|PP)\d+)+\] ", re.M)
_GRAPH_KEYS = ("cuda graph", "npu graph", "cpu graph")


def sniff(head: bytes, name: str) -> bool:
    """True when the head holds an SGLang scheduler, retraction or EP-balancedness line, or a line
    with SGLang's rank-tagged prefix."""
    return _SNIFF.search(head) is not None  # the registry bounds how far it reads


def _server_args(lines: list[str]) -> dict:
    args: dict = {}
    for line in lines:
        if _SERVER_ARGS.search(line):
            for key, rx in _ARG.items():
                m = rx.search(line)
                if m:
                    v = m.group(1)
                    args[key] = True if v == "True" else False if v == "False" else None if v == "None" else int(v)
    return args


def _fields(rest: str) -> dict[str, str] | None:
    """``key: value`` pairs of a batch line; None if text is left that is not a field (cut line)."""
    rest = rest.rstrip()
    if _ALL_FIELDS.fullmatch(rest) is None:
        return None
    return {k.strip(): v for k, v in _FIELD.findall(rest)}


def _mixed_chunk(args: dict, option: bool | None) -> bool | None:
    if option is not None:
        return bool(option)
    if "enable_mixed_chunk" not in args:
        return None
    size = args.get("chunked_prefill_size")
    return bool(args["enable_mixed_chunk"]) and size is not None and size > 0


def read(source, *, instance: str | None = None, enable_mixed_chunk: bool | None = None, **options) -> Timeline:
    """Read an SGLang log (path or file object) into step rows and series; see the module doc."""
    lines, _, stats = read_lines(source, FORMAT)
    base = instance or Path(source_name(source)).stem
    args = _server_args(lines)
    mixed_on = _mixed_chunk(args, enable_mixed_chunk)
    out = LogRows(stats, meta={"server_args": args, "mixed_chunk": mixed_on})
    if mixed_on is None:
        stats.note("server args not in the log and not given: assumed mixed chunk off (SGLang's default); "
                   "pass enable_mixed_chunk=True if the server ran with --enable-mixed-chunk")
    stats.note(f"Decode lines sample one forward every decode_log_interval "
               f"({args.get('decode_log_interval', 40)}) forwards")
    last_t: float | None = None
    have_time = False
    naive_lines = zoned_lines = 0  # SGLang prints local time ([YYYY-MM-DD hh:mm:ss]) without a zone
    pending: list[dict] = []  # rows seen before the first timestamp
    events: list[tuple] = []  # (instance, t, column, value, how): retractions, balancedness
    for raw in lines:
        if is_garbage(raw):
            stats.skipped(raw, "not text")
            continue
        line, t_container = strip_container_prefix(raw)
        pm = _PREFIX.search(line)
        t = t_container
        tag = ""
        if pm:
            y, mo, d, hms, frac, tag = pm.groups()
            if t is None:
                t = naive_to_unix(int(y), int(mo), int(d), hms, frac)
                naive_lines += t is not None
            else:
                zoned_lines += 1
            tag = "-".join(tag.split())
        if t is not None:
            have_time, last_t = True, t
        inst = f"{base}/{tag}" if tag else base
        t_row = t if t is not None else last_t
        if _SERVER_ARGS.search(line):
            stats.parsed()
            continue
        bm = _BATCH.search(line)
        if bm:
            row = _batch_row(bm, line[bm.end():], inst, t_row, mixed_on, out, raw)
            if row is not None:
                (pending if t_row is None else out.steps).append(row)
            continue
        gm = _GC.search(line) if "GARBAGE" in line else None
        if gm:   # a pause the scheduler timed itself: series, and the row's host_pause_s (sum)
            pause = float(gm.group(2))
            out.add_series(inst, "sglang_log:gc_pause_s", t_row, pause, f"generation={gm.group(1)}")
            events.append((inst, t_row, "host_pause_s", pause, "sum"))
            stats.parsed()
            continue
        rm = _RETRACT.search(line) or _BALANCE.search(line)
        if rm:
            _event(rm, inst, t_row, out, raw, retract=rm.re is _RETRACT, events=events)
            continue
        stats.ignored()
    first_t = min((x for x in [r["t_start_s"] for r in out.steps] + [r["t_s"] for r in out.series]
                   if x is not None), default=None)
    if pending:
        t0 = first_t if first_t is not None else 0.0
        for r in pending:
            r["t_start_s"] = r["t_end_s"] = t0
        out.steps[:0] = pending
        if first_t is None:
            stats.note("no timestamps in the log: every row at t=0 on a relative clock; order is line order")
        else:
            stats.note(f"{len(pending)} row(s) before the first timestamp placed at the first timestamp")
    for s in out.series:
        if s["t_s"] is None:
            s["t_s"] = first_t if first_t is not None else 0.0
    events = [(i, t if t is not None else (first_t or 0.0), c, v, h) for i, t, c, v, h in events]
    orphans = attach_events(out.steps, events)
    if orphans:
        stats.note(f"{orphans} retraction/balancedness/GC value(s) logged before any batch line: kept as series only")
    for r in out.steps:
        r["step_source"] = "log"
    for inst, _, col, _, _ in events:
        out.signal(inst, col, "measured")
    for r in out.steps:
        if r.get("expert_imbalance") is not None:
            r["q_expert_imbalance"] = "measured"
    if lines and stats.lines_parsed == 0 and stats.lines_skipped == 0:
        raise UserError(f"{source_name(source)}: no SGLang scheduler line (Prefill batch / Decode batch) found")
    if naive_lines and not zoned_lines:
        out.meta["clock_zone"] = "naive"  # local wall time, zone unknown: collectors/logs/log_zone.py
    return out.timeline(FORMAT, "unix" if have_time else "relative")


#: Fields that fill Timeline columns; every other field goes to series.
_USED = frozenset({"token usage", "full token usage", "#queue-req", "#running-req", "#new-token", "#new-seq",
                   "#cached-token", "#retracted-req"})


def _num(nums: dict, *keys: str) -> float:
    for k in keys:
        if nums.get(k) is not None:
            return nums[k]
    return float("nan")


def _batch_row(bm: re.Match, rest: str, inst: str, t: float | None, mixed_on: bool | None,
               out: LogRows, raw: str) -> dict | None:
    stats = out.stats
    kind_word, fwd = bm.group(1), bm.group(2)
    fields = _fields(rest)
    if fields is None:
        stats.skipped(raw, "text after the fields (line cut mid-way?)")
        return None
    nums = {k: parse_number(v.split(" -> ")[-1]) for k, v in fields.items()}  # "old -> new": the new
    need = "#new-token" if kind_word == "Prefill" else "#running-req"
    if need not in fields:
        stats.skipped(raw, f"{kind_word} line without {need!r}")
        return None
    bad = [k for k, n in nums.items() if n is None]
    core = [k for k in bad if k in _USED]  # a field that fills a Timeline column is unreadable
    if core:
        stats.skipped(raw, f"bad value for {core[0]!r}")
        return None
    stats.parsed()
    if bad:  # a field we only keep as a series, in a shape we do not know: leave it out, say so
        stats.note(f"field(s) with an unreadable value left out, e.g. {bad[0]!r}")
        nums = {k: n for k, n in nums.items() if n is not None}
    row = {"instance": inst, "t_start_s": t, "t_end_s": t, "granularity": "step"}
    if fwd is not None:
        row["forward_iter"] = float(fwd)
    row["kv_usage"] = _num(nums, "token usage", "full token usage")
    row["waiting_reqs"] = _num(nums, "#queue-req")
    running = _num(nums, "#running-req")
    row["running_reqs"] = running
    graph_key = next((k for k in _GRAPH_KEYS if k in nums), None)
    graph = nums[graph_key] if graph_key else None
    if kind_word == "Prefill":
        row["prefill_tokens"] = _num(nums, "#new-token")
        row["prefill_reqs"] = _num(nums, "#new-seq")
        row["prefix_hit_tokens"] = _num(nums, "#cached-token")
        row["arrivals"] = row["prefill_reqs"]  # #new-seq: requests whose prefill began in this batch
        row["q_token_allocation"] = "inferred" if mixed_on is None or (mixed_on and decodes_of(running) > 0) \
            else "measured"
        decodes = running if running == running else 0.0
        if mixed_on and decodes > 0:
            row["kind"], row["decode_reqs"], row["decode_rows"] = "mixed", decodes, decodes
            out.signal(inst, "kind", "inferred")
        else:
            row["kind"], row["decode_reqs"], row["decode_rows"] = "prefill", 0.0, 0.0
            out.signal(inst, "kind", "measured" if mixed_on is not None else "inferred")
        # a prefill/extend forward with a graph runs the piecewise graph
        row["graph_mode"] = "unknown" if graph is None else ("PIECEWISE" if graph else "NONE")
    else:
        row["kind"] = "decode"
        row["prefill_tokens"] = row["prefill_reqs"] = 0.0
        row["decode_reqs"] = running
        spec = "accept len" in fields or "accept rate" in fields
        row["decode_rows"] = float("nan") if spec else running  # k+1 rows per request, k unknown
        row["graph_mode"] = "unknown" if graph is None else ("FULL" if graph else "NONE")
        row["preempted_reqs"] = _num(nums, "#retracted-req")
        out.signal(inst, "kind", "measured")
        # gen throughput = tokens generated since the previous Decode line / the time since it, so
        # batch x tokens-per-request-step / throughput is the mean time of one decode step over
        # that window - interleaved prefills included, which is how they show in TPOT.
        gen = nums.get("gen throughput (token/s)")
        per_req = nums.get("accept len") or 1.0
        if gen and gen > 0 and running == running and running > 0:
            row["elapsed_s"] = running * per_req / gen
            out.signal(inst, "elapsed_s", "estimated")
    if graph is not None and row["kind"] == "decode":
        # the flag the logged decode forward ran with: the model runner replays the graph exactly
        # when ``can_run_graph`` holds and hands that flag back with the output, which the Decode
        # line prints (module doc) - a measured replay flag for that one forward; the other
        # forwards since the previous line are not covered by it
        row["graph_replayed"] = 1.0 if graph else 0.0
        row["q_graph_mode"] = "measured"
        out.signal(inst, "graph_mode", "measured")
    elif graph is not None:
        # a Prefill line's flag: printed at scheduling, before its forward, in the versions checked (module doc)
        row["q_graph_mode"] = "estimated"
        out.signal(inst, "graph_mode", "estimated")
    labels = f"batch={kind_word.lower()}"
    for k, n in nums.items():
        if k not in _USED:
            out.add_series(inst, f"sglang_log:{slug(k)}", t, n, labels)
    return row


def decodes_of(running: float) -> float:
    return running if running == running else 0.0


def _event(m: re.Match, inst: str, t: float | None, out: LogRows, raw: str, retract: bool,
           events: list | None = None) -> bool:
    body = m.group(1)
    pairs = re.findall(r"([#\w]+)[:=]\s*([^,\s]+(?:\s*->\s*[^,\s]+)?)", body)
    vals = {}
    for k, v in pairs:
        n = parse_number(v.split("->")[-1])
        if n is not None:
            vals[slug(k)] = n
    if not vals:
        out.stats.skipped(raw, "event line without values")
        return False
    out.stats.parsed()
    prefix = "sglang_log:" if retract else "sglang_log:eplb_"
    for k, v in vals.items():
        out.series.append({"instance": inst, "name": prefix + k, "labels": "", "t_s": t, "value": v})
    if events is not None:
        # retraction: counted on the batch row at or before it; balancedness is avg/max, imbalance max/avg
        if retract and vals.get("retracted_reqs") is not None:
            events.append((inst, t, "preempted_reqs", vals["retracted_reqs"], "sum"))
        bal = vals.get("current_pass_balancedness")
        if not retract and bal and bal > 0:
            events.append((inst, t, "expert_imbalance", 1.0 / bal, "mean"))
    return True
