"""Open and probe an Nsight Systems SQLite export (schema 3.2x) safely, read-only.

Exports are lazy (empty tables are omitted) and drift between versions (columns added or
renamed), so everything downstream asks :class:`NsysDb` which tables and columns exist instead of
assuming. Timestamps are integer nanoseconds on the target's clock, not zero-based;
``TARGET_INFO_SESSION_START_TIME`` maps them to the unix epoch (formats.md §3.2).
"""
from __future__ import annotations

import os
import sqlite3
import struct
from pathlib import Path
from urllib.parse import quote

from mixdiag.errors import UserError

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
NVTX = "NVTX_EVENTS"
STRINGS = "StringIds"
#: ``globalTid`` -> ``globalPid``: zero the 24 TID bits (SQLite reads the literal as -16777216).
PID_MASK = -16777216


def pid_of(global_id: int) -> int:
    """The OS process id inside a serialized globalTid/globalPid."""
    return (int(global_id) >> 24) & 0xFFFFFF


def read_only_uri(path: Path) -> str:
    """The SQLite URI that can never write the export: ``mode=ro`` refuses writes, and
    ``immutable=1`` also takes no lock and creates no ``-journal``/``-wal``/``-shm`` beside it (a
    finished export does not change while it is read)."""
    return f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"


class NsysDb:
    """A read-only connection to one export plus what it holds (tables, columns, clock)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        _check_file(self.path)
        try:
            self.conn = sqlite3.connect(read_only_uri(self.path), uri=True)
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:  # corrupt names decode as garbage
            # sqlite quotes the broken schema text, newlines included: keep the error one line
            raise UserError(f"{self.path}: not a readable SQLite database ({' '.join(str(e).split())})") from None
        self.tables = {r[0] for r in rows}
        self._columns: dict[str, set[str]] = {}
        self._arrow = None

    def arrow_connection(self):
        """A second read-only connection that returns Arrow batches (adbc-driver-sqlite), or None."""
        if self._arrow is None:
            try:
                import adbc_driver_sqlite.dbapi as adbc
            except ImportError:
                self._arrow = False
            else:
                try:
                    self._arrow = adbc.connect(read_only_uri(self.path))
                except Exception:  # noqa: BLE001  no fast path; sqlite3 still reads the file
                    self._arrow = False
        return self._arrow or None

    def disable_arrow(self) -> None:
        """Stop using the Arrow connection (after it failed on this file)."""
        if self._arrow:
            self._arrow.close()
        self._arrow = False

    def close(self) -> None:
        if self._arrow:
            self._arrow.close()
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- probing ----------------------------------------------------------------------------
    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        """Column names of ``table`` (empty if the table is absent)."""
        if table not in self._columns:
            self._columns[table] = ({r[1] for r in self.conn.execute(f'PRAGMA table_info("{table}")')}
                                    if self.has(table) else set())
        return self._columns[table]

    def scalar(self, sql: str, params=()):
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def export_info(self) -> dict:
        """Schema/product version from META_DATA_EXPORT (never host, user or paths: privacy)."""
        if not self.has("META_DATA_EXPORT"):
            return {}
        keep = ("EXPORT_SCHEMA_VERSION", "EXPORT_PRODUCT_VERSION")
        rows = self.conn.execute("SELECT name, value FROM META_DATA_EXPORT WHERE name IN (?, ?)", keep).fetchall()
        return {k.lower(): v for k, v in rows}

    def string_ids(self, where: str, params=()) -> dict[int, str]:
        """``id -> value`` of the StringIds rows matching an SQL condition on ``value``."""
        if not self.has(STRINGS):
            return {}
        return dict(self.conn.execute(f"SELECT id, value FROM {STRINGS} WHERE {where}", params).fetchall())

    def clock(self) -> tuple[str, float]:
        """``(clock, offset_s)``: add offset_s to ``t_ns / 1e9`` to get Timeline seconds.

        "unix" when the export records the session start both as UTC epoch and on the target
        clock (wall = utcEpochNs + (t - systemClockNs)); else "relative" (seconds of the raw
        target clock, which does not start at 0).
        """
        table = "TARGET_INFO_SESSION_START_TIME"
        if {"utcEpochNs", "systemClockNs"} <= self.columns(table):
            row = self.conn.execute(f"SELECT utcEpochNs, systemClockNs FROM {table} LIMIT 1").fetchone()
            if row and row[0] is not None and row[1] is not None:
                return "unix", (int(row[0]) - int(row[1])) / 1e9
        return "relative", 0.0

    def clock_ns(self) -> int:
        """:meth:`clock`'s offset as exact integer nanoseconds (add to ``t_ns``)."""
        table = "TARGET_INFO_SESSION_START_TIME"
        if self.clock()[0] == "unix":
            row = self.conn.execute(f"SELECT utcEpochNs, systemClockNs FROM {table} LIMIT 1").fetchone()
            return int(row[0]) - int(row[1])
        return 0


def _check_file(path: Path) -> None:
    """Fail with one line on a missing, empty, non-SQLite or truncated file."""
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not an Nsight Systems SQLite export")
    if not path.exists():
        raise UserError(f"{path}: no such file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = f.read(100)
    if size == 0:
        raise UserError(f"{path}: empty file")
    if not header.startswith(SQLITE_MAGIC):
        hint = " (a .nsys-rep report? export it with 'nsys export --type sqlite')" if path.suffix == ".nsys-rep" else ""
        raise UserError(f"{path}: not an SQLite file{hint}")
    if len(header) < 100:
        raise UserError(f"{path}: truncated SQLite file ({size} bytes, shorter than its header)")
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, n_pages = struct.unpack(">II", header[24:32])
    valid_for = struct.unpack(">I", header[92:96])[0]
    # The in-header page count is authoritative only when valid-for matches the change counter.
    if n_pages and valid_for == change_counter and size < n_pages * page_size:
        raise UserError(f"{path}: truncated SQLite file ({size} bytes of {n_pages * page_size})")
