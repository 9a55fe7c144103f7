"""Damaged trace files never crash the trace collectors: a one-line UserError (or SchemaError for
impossible values) or a Timeline, flagged partial when it is not the whole input."""
import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixdiag.collectors.traces.kineto import reader as kineto
from mixdiag.collectors.traces.nsys import reader as nsys
from mixdiag.errors import UserError
from mixdiag.schema import SchemaError, Timeline

MOCK = Path(__file__).resolve().parents[1] / "fixtures" / "nsys" / "mock.sqlite"
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _trace() -> bytes:
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"step {i} kind=decode prefill_tokens=0 decode_reqs=2 "
           f"decode_rows=2 graph=FULL", "pid": 1, "tid": 1, "ts": 100.0 * i, "dur": 90.0} for i in range(20)]
    ev += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0 * i + 5, "dur": 10.0}
           for i in range(20)]
    return json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
                       "traceEvents": ev}, indent=1).encode()


TRACE = _trace()


@SETTINGS
@given(cut=st.integers(min_value=0, max_value=len(TRACE) - 1))
def test_kineto_cut_anywhere(tmp_path, cut):
    p = tmp_path / "cut.json"
    p.write_bytes(TRACE[:cut])
    try:
        tl = kineto.read(p)
    except UserError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(tl, Timeline) and tl.meta["partial"] is True
    assert len(tl.steps) <= 20


@SETTINGS
@given(offset=st.integers(min_value=100, max_value=MOCK.stat().st_size - 1),
       junk=st.binary(min_size=1, max_size=64))
def test_nsys_corrupt_bytes_anywhere(tmp_path, offset, junk):
    data = bytearray(MOCK.read_bytes())
    data[offset:offset + len(junk)] = junk
    p = tmp_path / "bad.sqlite"
    p.write_bytes(bytes(data[: len(MOCK.read_bytes())]))
    try:
        tl = nsys.read(p)
    except (UserError, SchemaError) as e:
        assert "\n" not in str(e)
        return
    assert isinstance(tl, Timeline)


@SETTINGS
@given(size=st.integers(min_value=0, max_value=MOCK.stat().st_size - 1))
def test_nsys_truncated_anywhere(tmp_path, size):
    p = tmp_path / "cut.sqlite"
    p.write_bytes(MOCK.read_bytes()[:size])
    with pytest.raises(UserError):
        nsys.read(p)


def test_sqlite_file_is_never_modified(tmp_path):
    p = tmp_path / "mock.sqlite"
    p.write_bytes(MOCK.read_bytes())
    before = p.read_bytes()
    nsys.read(p)
    assert p.read_bytes() == before and sqlite3.connect(p).execute("SELECT count(*) FROM sqlite_master").fetchone()


def test_text_where_integers_belong_is_a_user_error(tmp_path, monkeypatch):
    from mixdiag.collectors.traces.nsys.db import NsysDb

    p = tmp_path / "drift.sqlite"
    p.write_bytes(MOCK.read_bytes())
    with sqlite3.connect(p) as c:
        c.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 2")
    monkeypatch.setattr(NsysDb, "arrow_connection", lambda self: None)
    with pytest.raises(UserError, match="damaged export"):
        nsys.read(p)
