"""Reading text sources honestly: open a path or file object, split lines, count what happened.

Every text collector reads through :func:`read_lines` and accounts for every line with a
:class:`LineStats`: ``lines_total == lines_parsed + lines_skipped + lines_ignored`` always holds.

* parsed   - the line fed a row or sample;
* skipped  - the line looked like this format but could not be read (cut mid-way, a bad value,
             binary garbage); a few are kept as examples;
* ignored  - a line of another kind (a comment, a uvicorn access line, a blank line).

Bytes that are not UTF-8 (a latin-1 model name, a stray byte from a terminal) are replaced and
counted (``bytes_replaced``); on a line that is otherwise text each becomes a space, so the
line's readable fields still parse - one foreign byte must never cost a whole stats line. A line
made mostly of undecodable bytes is binary garbage and is skipped as such.

``to_meta()`` gives the ``meta["sources"]`` entry of docs/contracts.md §4.
"""
from __future__ import annotations

import calendar
import csv
import io
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from mixdiag.errors import UserError

MAX_EXAMPLES = 5
_EXAMPLE_CHARS = 200
#: Distinct skip reasons counted per source; more (reasons naming a value) go under "other".
MAX_REASONS = 20
#: A line whose share of undecodable characters is at least this is binary, not text.
GARBAGE_SHARE = 0.25
_REPLACEMENT = "\ufffd"


@dataclass
class LineStats:
    """Honesty counters for one input (see the module docstring for the three outcomes)."""

    format: str
    path: str
    lines_total: int = 0
    lines_parsed: int = 0
    lines_skipped: int = 0
    lines_ignored: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    partial: bool = False
    notes: list[str] = field(default_factory=list)
    #: reason -> count of skipped lines (the first MAX_REASONS reasons; the rest under "other")
    skipped_reasons: dict[str, int] = field(default_factory=dict)
    #: why the source is partial beyond its skipped lines (a cut exposition, a file not read)
    partial_reasons: list[str] = field(default_factory=list)
    bytes_replaced: int = 0

    def parsed(self, n: int = 1) -> None:
        self.lines_parsed += n

    def ignored(self) -> None:
        self.lines_ignored += 1

    def skipped(self, line: str, reason: str) -> None:
        """Count an unreadable line; keep the first few (shortened) with the reason."""
        self.lines_skipped += 1
        key = reason if reason in self.skipped_reasons or len(self.skipped_reasons) < MAX_REASONS else "other"
        self.skipped_reasons[key] = self.skipped_reasons.get(key, 0) + 1
        if len(self.skipped_examples) < MAX_EXAMPLES:
            text = line if len(line) <= _EXAMPLE_CHARS else line[:_EXAMPLE_CHARS] + "..."
            self.skipped_examples.append(f"{reason}: {text!r}")

    def incomplete(self, reason: str) -> None:
        """Mark the source partial for a reason no single line shows (e.g. an exposition cut mid-family)."""
        self.partial = True
        if reason not in self.partial_reasons:
            self.partial_reasons.append(reason)
        self.note(reason)

    def note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)

    def to_meta(self) -> dict:
        """The ``meta["sources"]`` entry (JSON-able)."""
        assert self.lines_total == self.lines_parsed + self.lines_skipped + self.lines_ignored, self
        return {"format": self.format, "path": self.path, "lines_total": self.lines_total,
                "lines_parsed": self.lines_parsed, "lines_skipped": self.lines_skipped,
                "lines_ignored": self.lines_ignored, "skipped_examples": list(self.skipped_examples),
                "partial": bool(self.partial or self.lines_skipped > 0), "notes": list(self.notes),
                "skipped_reasons": dict(self.skipped_reasons), "partial_reasons": list(self.partial_reasons),
                "bytes_replaced": int(self.bytes_replaced)}


def source_name(source) -> str:
    """A printable name for a path or file object."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return str(getattr(source, "name", "<stream>"))


def read_text(source) -> tuple[str, str]:
    """``(name, text)`` of a path or a text/binary file object; bytes decode as UTF-8 with U+FFFD.

    A missing or unreadable path raises :class:`UserError` (one line), never a traceback.
    """
    name, text, _ = _read_counted(source)
    return name, text


def _read_counted(source) -> tuple[str, str, int]:
    """``(name, text, undecodable byte sequences replaced)``; paths are opened read-only."""
    name = source_name(source)
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if p.is_dir():
            raise UserError(f"{p} is a directory, expected a file")
        try:
            data: bytes | str = p.read_bytes()
        except FileNotFoundError:
            raise UserError(f"no such file: {p}") from None
        except OSError as e:
            raise UserError(f"cannot read {p}: {e.strerror or e}") from None
    elif isinstance(source, (bytes, bytearray)):
        data, name = bytes(source), "<bytes>"
    elif isinstance(source, io.IOBase) or hasattr(source, "read"):
        data = source.read()
    else:
        raise UserError(f"cannot read a {type(source).__name__}: expected a path or a file object")
    if isinstance(data, (bytes, bytearray)):
        return (name,) + decode(bytes(data))
    return name, data, 0


def decode(data: bytes) -> tuple[str, int]:
    """UTF-8 with every undecodable sequence replaced by U+FFFD; ``(text, replacements)``."""
    text = data.decode("utf-8", errors="replace")
    n = text.count(_REPLACEMENT)
    if n:
        n -= data.count(_REPLACEMENT.encode())  # a U+FFFD the file itself held is not a replacement
    return text, n


def clean_replaced(line: str) -> str:
    """A line with a few undecodable characters, each as a space (its fields still parse); a line
    mostly of them is left as is, for :func:`is_garbage` to reject."""
    n = line.count(_REPLACEMENT)
    if not n:
        return line
    visible = sum(1 for c in line if not c.isspace())
    if n >= GARBAGE_SHARE * max(visible, 1):
        return line
    return line.replace(_REPLACEMENT, " ")


def split_lines(text: str) -> tuple[list[str], bool]:
    """Lines split on ``\\n`` only (a stray ``\\r`` or form feed stays inside its line).

    Returns ``(lines, ends_with_newline)``; an empty text has no lines. A final line without a
    newline is still returned; callers decide whether it may be cut mid-way.
    """
    if not text:
        return [], True
    ends = text.endswith("\n")
    lines = text.split("\n")
    if ends:
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines], ends


# C0 controls other than tab, CR and ESC (ANSI colours are common in logs), and U+FFFD (bytes
# that did not decode as UTF-8).
_GARBAGE = re.compile("[\x00-\x08\x0a-\x0c\x0e-\x1a\x1c-\x1f\ufffd]")


def is_garbage(line: str) -> bool:
    """True for lines that are not text: NUL bytes, undecodable bytes, other C0 controls."""
    return _GARBAGE.search(line) is not None


def read_lines(source, fmt: str) -> tuple[list[str], bool, LineStats]:
    """Read ``source`` into lines with a fresh :class:`LineStats` (``lines_total`` set)."""
    name, text, replaced = read_counted(source)
    lines, ends = split_lines(text)
    stats = line_stats(fmt, name, len(lines), replaced)
    if replaced:
        lines = clean_lines(lines)
    return lines, ends, stats


def csv_records(source, fmt: str, header: tuple[str, ...], what: str) -> tuple[list[tuple[str, list[str]]], LineStats]:
    """The data rows of one of mixdiag's sampler CSVs (NVML, host): ``(raw line, fields)`` of every line with
    ``len(header)`` fields, and the :class:`LineStats` that counted the header and blank lines ignored and every
    other line skipped. A first line other than ``header`` is a one-line error naming ``what`` the file should be."""
    lines, _, stats = read_lines(source, fmt)
    if not lines or lines[0].strip() != ",".join(header):
        raise UserError(f"{source_name(source)}: not {what} (first line must be {','.join(header)})")
    stats.ignored()  # the header
    out = []
    for raw in lines[1:]:
        if not raw.strip():
            stats.ignored()
            continue
        if is_garbage(raw):
            stats.skipped(raw, "not text")
            continue
        try:
            rec = next(csv.reader(io.StringIO(raw)), [])
        except csv.Error:  # a stray CR inside the line
            rec = []
        if len(rec) != len(header):
            stats.skipped(raw, f"not {len(header)} fields: {','.join(header)}")
            continue
        out.append((raw, rec))
    return out, stats


def read_counted(source, ascii_bytes: bool = False) -> tuple[str, str | bytes, int]:
    """``(name, text, undecodable byte sequences replaced)`` for readers that split the text themselves.

    ``ascii_bytes``: ASCII input comes back as the bytes read (no 200 MB decoded copy of a large
    log); anything else is decoded as usual.
    """
    if ascii_bytes and isinstance(source, (str, os.PathLike)) and not Path(source).is_dir():
        try:
            data = Path(source).read_bytes()
        except OSError:
            return _read_counted(source)  # the usual one-line error
        if data.isascii():
            return source_name(source), data, 0
        return (source_name(source),) + decode(data)
    return _read_counted(source)


def line_stats(fmt: str, name: str, n_lines: int, replaced: int) -> LineStats:
    """A fresh :class:`LineStats` for ``n_lines`` lines, noting replaced bytes and an empty input."""
    stats = LineStats(format=fmt, path=name, lines_total=n_lines)
    if replaced:
        stats.bytes_replaced = replaced
        stats.note(f"{replaced} undecodable byte sequence(s) (not UTF-8) replaced; lines otherwise text "
                   "were still read")
    if not n_lines:
        stats.partial = True
        stats.note("empty input")
    return stats


def clean_lines(lines: list[str]) -> list[str]:
    """:func:`clean_replaced` on the lines that hold a replaced byte."""
    return [clean_replaced(ln) if _REPLACEMENT in ln else ln for ln in lines]


def rfc3339_to_unix(stamp: str, zone: str | None) -> float | None:
    """``2026-04-05T20:02:51.5`` with zone ``Z``/``+02:00``/None (UTC) -> unix seconds; None if no date."""
    base, _, frac = stamp.partition(".")
    try:
        dt = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    secs = calendar.timegm(dt.timetuple()) + (float("0." + frac[:9]) if frac else 0.0)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "+" else 1  # local = UTC + offset
        hh, mm = int(zone[1:3]), int(zone[-2:])
        secs += sign * (hh * 3600 + mm * 60)
    return secs
