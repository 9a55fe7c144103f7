"""Decode a Kineto / Chrome-trace JSON file into an event frame (one event at a time, no list of dicts).

A file cut mid-way is decoded up to its last whole event and flagged partial; ``.json.gz`` too.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd

from mixdiag.errors import UserError


class _Events:
    """The events of a trace, decoded one at a time from the text (no list of every event dict).

    After iteration: ``count`` events decoded, ``cut_at`` the byte where decoding stopped early
    (a file cut mid-way or damaged), else None.
    """

    def __init__(self, text: str, start: int):
        self.text, self.start = text, start
        self.count, self.cut_at = 0, None

    @property
    def closed(self) -> bool:
        """The document ends as it began (``}`` or ``]``): nothing after the events was cut off."""
        head, tail = self.text.lstrip()[:1], self.text.rstrip()[-1:]
        return tail == ("}" if head == "{" else "]")

    def __iter__(self):
        text, pos, n = self.text, self.start, len(self.text)
        dec = json.JSONDecoder()
        while True:
            while pos < n and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= n:
                self.cut_at = pos  # the array never closed
                return
            if text[pos] == "]":
                return
            try:
                ev, pos = dec.raw_decode(text, pos)
            except json.JSONDecodeError:
                self.cut_at = pos
                return
            self.count += 1
            yield ev


def _open(path: Path) -> tuple[_Events, dict]:
    """The trace's event stream and top-level facts (``baseTimeNanoseconds``)."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a Kineto trace")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError):
            with gzip.open(path, "rb") as f:
                raw = _read_truncated_gzip(f)
    if not raw.strip():
        raise UserError(f"{path}: empty file")
    text = raw.decode("utf-8", errors="replace")
    del raw
    head = text.lstrip()[:1]
    m = re.search(r'"traceEvents"\s*:\s*\[', text) if head == "{" else None
    if m is None and head != "[":
        try:
            json.loads(text)
        except json.JSONDecodeError:
            raise UserError(f"{path}: not a readable Kineto trace (invalid JSON, no traceEvents list)") from None
        raise UserError(f"{path}: JSON but not a Kineto/Chrome trace (no traceEvents list)")
    start = m.end() if m else text.index("[") + 1
    top = {}
    base = re.search(r'"baseTimeNanoseconds"\s*:\s*(\d+)', text[:m.start()] if m else "")
    if base is None and m is not None:  # some writers put the key after the events
        tail = text.rfind('"baseTimeNanoseconds"')
        base = re.match(r'"baseTimeNanoseconds"\s*:\s*(\d+)', text[tail:]) if tail > m.start() else None
    if base:
        top["baseTimeNanoseconds"] = int(base.group(1))
    # torch.distributed runs: {"distributedInfo": {"backend": ..., "rank": r, "world_size": n}}
    dist = re.search(r'"distributedInfo"\s*:\s*(\{[^{}]*\})', text[:m.start()] if m else "")
    if dist:
        try:
            info = json.loads(dist.group(1))
            if isinstance(info.get("rank"), int) and isinstance(info.get("world_size"), int):
                top["rank"], top["world_size"] = info["rank"], info["world_size"]
        except json.JSONDecodeError:
            pass
    return _Events(text, start), top


def _read_truncated_gzip(f) -> bytes:
    out = bytearray()
    try:
        while chunk := f.read(1 << 20):
            out += chunk
    except (EOFError, OSError):
        pass
    return bytes(out)


def _frame(events) -> tuple[pd.DataFrame, int, int, list[str]]:
    """Well-formed complete events as a frame; count the other kinds (ignored) and show the
    malformed ones (skipped)."""
    rows, bad, other, examples = [], 0, 0, []
    for ev in events:
        if not isinstance(ev, dict):
            bad += 1
            if len(examples) < 5:
                examples.append(f"not an event object: {str(ev)[:80]}")
            continue
        ph = ev.get("ph")
        if ph != "X":
            other += 1  # metadata, instant, flow events: not used, not errors
            continue
        ts, dur, name = ev.get("ts"), ev.get("dur", 0), ev.get("name")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or not isinstance(name, str):
            bad += 1
            if len(examples) < 5:
                examples.append(f"event without numeric ts/dur or name: {json.dumps(ev)[:120]}")
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        corr, dev, stream, nb = (args.get(k, -1) for k in ("correlation", "device", "stream", "bytes"))
        rows.append((name, str(ev.get("cat", "")), float(ts), float(ts) + max(float(dur), 0.0),
                     str(ev.get("pid", "")), str(ev.get("tid", "")), corr if isinstance(corr, int) else -1,
                     dev if isinstance(dev, int) else -1, stream if isinstance(stream, int) else -1,
                     nb if isinstance(nb, int) else 0))
    df = pd.DataFrame(rows, columns=["name", "cat", "t0_us", "t1_us", "pid", "tid", "corr", "dev", "stream", "bytes"])
    return df, bad, other, examples


class KinetoFile:
    """One decoded trace file: its event frame (name, cat, t0_us, t1_us, pid, tid, corr, dev, stream,
    bytes) and what the decoding saw (bad/ignored counts, examples, notes, partial, baseTimeNanoseconds)."""

    def __init__(self, path: Path):
        if not path.exists():
            raise UserError(f"{path}: no such file")
        self.events, top = _open(path)
        self.df, self.bad, self.ignored, self.examples = _frame(self.events)
        self.notes = []
        if self.events.cut_at is not None:
            self.notes.append(f"JSON cut or damaged at byte {self.events.cut_at}: "
                              f"read {self.events.count} whole events before it")
        elif not self.events.closed:
            self.notes.append("JSON cut after the events: the document is not closed")
        self.partial = bool(self.notes)
        self.base_ns = top.get("baseTimeNanoseconds")
        #: this file's rank in a multi-process job (``distributedInfo``), else None
        self.rank = top["rank"] if top.get("world_size", 1) > 1 else None
