"""vLLM's JSON log records read as its text lines.

vLLM 0.32 logs JSON with ``--logging-config.formatter json`` (``vllm/logger.py``, python-json-logger's
``JsonFormatter`` with ``JSON_FORMAT = "%(asctime)s %(levelname)s %(name)s %(processName)s %(process)d
%(message)s"``); a record is one line::

    {"asctime": "2026-12-02 07:35:10,113", "levelname": "INFO", "name": "vllm.v1.metrics.loggers",
     "processName": "MainProcess", "process": 23393, "message": "Engine 000: Avg prompt throughput: ...",
     "vllm_process_name": "EngineCore_DP0"}

Log pipelines (Loki, Elasticsearch) keep that shape. Each record becomes the line the text formatter
would have printed - ``(PROC pid=N) LEVEL MM-DD hh:mm:ss.mmm [LOGGER:0] message`` - with every line of a
multi-line message (the CUDA-graph table) prefixed, as vLLM's ``NewLineFormatter`` does; the text
reader then reads it. ``asctime`` is logging's default (local time, a year, milliseconds): the year is
returned for the reader, the milliseconds kept; the zone stays unknown (``collectors/logs/log_zone.py``).
Lines that are no JSON record (other programs' output) pass through as they are.
"""
from __future__ import annotations

import json
import re

_TEXT_PREFIX = re.compile(r"[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d")  # vLLM's text form: LEVEL MM-DD hh:mm:ss
_ASCTIME = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[ T](\d\d:\d\d:\d\d)(?:[,.](\d+))?")


def looks_json(head: str) -> bool:
    """True when the head's lines hold JSON records with ``message`` and ``asctime`` and no more lines
    in vLLM's text form (other programs' plain lines - a Triton warning first - may come between)."""
    records = text_lines = 0
    for line in head.splitlines()[:200]:
        s = line.strip()
        if s.startswith("{"):
            try:
                rec = json.loads(s)
            except ValueError:
                continue  # a record cut at the head's end
            records += isinstance(rec, dict) and "message" in rec and "asctime" in rec
        elif _TEXT_PREFIX.search(s):
            text_lines += 1
    return records > 0 and records >= text_lines


def to_text(text: str) -> tuple[str, int | None, int]:
    """``(the records as text lines, the first record's year, records read)``."""
    out: list[str] = []
    year, n = None, 0
    for line in text.splitlines():
        s = line.strip()
        rec = None
        if s.startswith("{"):
            try:
                rec = json.loads(s)
            except ValueError:
                rec = None
        if not isinstance(rec, dict) or "message" not in rec:
            out.append(line)
            continue
        n += 1
        m = _ASCTIME.match(str(rec.get("asctime", "")))
        stamp = ""
        if m:
            year = year if year is not None else int(m.group(1))
            stamp = f"{m.group(2)}-{m.group(3)} {m.group(4)}" + (f".{m.group(5)}" if m.group(5) else "") + " "
        proc = rec.get("vllm_process_name") or rec.get("processName") or "vllm"
        head = (f"({str(proc).replace(' ', '_')} pid={rec.get('process', 0)}) {rec.get('levelname', 'INFO')} "
                f"{stamp}[{rec.get('name', 'vllm')}:0] ")
        out.extend(head + part for part in str(rec["message"]).split("\n"))
    return "\n".join(out) + "\n", year, n
