"""text_input: reading paths, file objects and bytes; splitting; garbage; the honesty counters."""
import io

import pytest

from mixdiag.collectors.text_input import LineStats, is_garbage, read_lines, read_text, split_lines
from mixdiag.errors import UserError


@pytest.mark.parametrize("text,lines,ends", [
    ("", [], True), ("a", ["a"], False), ("a\n", ["a"], True), ("a\r\nb\n", ["a", "b"], True),
    ("a\n\nb", ["a", "", "b"], False), ("a\x0cb\u2028c\n", ["a\x0cb\u2028c"], True),  # only LF splits
])
def test_split_lines(text, lines, ends):
    assert split_lines(text) == (lines, ends)


@pytest.mark.parametrize("line,bad", [
    ("plain text", False), ("tab\tand ESC\x1b[0m colour", False), ("NUL\x00", True), ("bell\x07", True),
    ("undecodable \ufffd", True), ("form\x0cfeed", True),
])
def test_is_garbage(line, bad):
    assert is_garbage(line) is bad


def test_sources(tmp_path):
    p = tmp_path / "x.log"
    p.write_bytes(b"ok\n\xff\xfe\n")
    assert read_text(p) == (str(p), "ok\n\ufffd\ufffd\n")
    assert read_text(io.StringIO("s"))[1] == "s" and read_text(io.BytesIO(b"b"))[1] == "b"
    assert read_text(b"raw") == ("<bytes>", "raw")
    for bad, msg in ((tmp_path / "missing", "no such file"), (tmp_path, "is a directory"), (42, "cannot read")):
        with pytest.raises(UserError, match=msg):
            read_text(bad)


def test_counters_and_meta():
    lines, ends, st = read_lines(io.BytesIO(b"a\nb\nc\n" + b"x\n" * 6), "fmt")
    assert (lines[:3], ends, st.lines_total) == (["a", "b", "c"], True, 9)
    st.parsed()
    st.ignored()
    for i in range(7):
        st.skipped("x" * 300, f"reason {i}")
    m = st.to_meta()
    assert (m["lines_parsed"], m["lines_ignored"], m["lines_skipped"], m["partial"]) == (1, 1, 7, True)
    assert len(m["skipped_examples"]) == 5 and m["skipped_examples"][0].endswith("...'")
    bad = LineStats(format="f", path="p", lines_total=2)
    bad.parsed()
    with pytest.raises(AssertionError):  # counters that do not add up never reach meta
        bad.to_meta()
    _, _, empty = read_lines(io.BytesIO(b""), "fmt")
    assert empty.partial and empty.notes == ["empty input"]
