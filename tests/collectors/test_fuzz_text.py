"""Fuzz every text parser: real lines, lines cut mid-way, random text, binary garbage, empty input.

No input may crash a parser: it returns a Timeline whose honesty counters add up to the number of
lines in the input, or it refuses the whole input with a one-line UserError.
"""
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixdiag.collectors.gpu import dcgm
from mixdiag.collectors.gpu import nvml
from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.collectors.logs import sglang_log
from mixdiag.collectors.logs import vllm_log
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REAL_LINES = sorted({ln for p in FIX.glob("*.txt") for ln in p.read_text().splitlines()})
REAL_LINES += ["t_s,gpu_index,gpu_uuid,metric,value", "1.0,0,GPU-a,gpm_sm_util,0.5",
               'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-0"} 0.5', "**CUDAGraph Stats:**",
               "| 8 | 8 | 0 | FULL | 40 |", "|---|---|",
               "server_args=ServerArgs(chunked_prefill_size=8192, enable_mixed_chunk=True)"]

line = st.one_of(
    st.sampled_from(REAL_LINES),
    st.sampled_from(REAL_LINES).flatmap(lambda s: st.integers(0, len(s)).map(lambda i: s[:i])),  # cut mid-way
    st.text(max_size=60),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
documents = st.one_of(
    st.tuples(st.lists(line, max_size=25), st.booleans()).map(
        lambda x: ("\n".join(x[0]) + ("\n" if x[1] and x[0] else "")).encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from(REAL_LINES), max_size=30).map(lambda ls: "\n".join(ls).encode()),  # shuffled real lines
    st.binary(max_size=300),
    st.just(b""),
)
PARSERS = {"prom-text": scrape_reader.read, "sglang-log": sglang_log.read, "vllm-log": vllm_log.read,
           "nvml-csv": nvml.read, "dcgm": dcgm.read}
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def n_lines(data: bytes) -> int:
    """Lines as the readers count them: split on LF, a final LF ends the last line."""
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def check(tl: Timeline, data: bytes) -> None:
    assert isinstance(tl, Timeline)
    for src in tl.meta["sources"]:
        assert src["lines_total"] == src["lines_parsed"] + src["lines_skipped"] + src["lines_ignored"]
        assert len(src["skipped_examples"]) <= 5
        assert src["partial"] or src["lines_skipped"] == 0
    if tl.meta["source"] in ("prom-text", "sglang-log", "vllm-log", "nvml-csv"):
        assert tl.meta["sources"][0]["lines_total"] == n_lines(data)


@pytest.mark.parametrize("fmt", sorted(PARSERS))
@FUZZ
@given(data=documents, header=st.booleans())
def test_parser_never_crashes_and_counts_add_up(fmt, data, header):
    if fmt == "nvml-csv" and header:  # past the header check, into the row parser
        data = b"t_s,gpu_index,gpu_uuid,metric,value\n" + data
    try:
        tl = PARSERS[fmt](io.BytesIO(data), instance="fuzz")
    except UserError as e:
        assert "\n" not in str(e) and str(e)
        return
    check(tl, data)


@FUZZ
@given(texts=st.lists(documents, min_size=1, max_size=4))
def test_scrape_sequence_never_crashes(texts):
    pairs = [(float(i), t.decode("utf-8", "replace")) for i, t in enumerate(texts)]
    tl = scrape_reader.read_scrapes(pairs, instance="fuzz")
    assert len(tl.meta["sources"]) == len(texts)
    for src, t in zip(tl.meta["sources"], texts):
        assert src["lines_total"] == n_lines(t) == src["lines_parsed"] + src["lines_skipped"] + src["lines_ignored"]
    assert len(tl.steps) <= max(0, len(texts) - 1)


GARBAGE = bytes(range(256)) + b"\n\x00\x01\x02\xff\xfe\n"


@pytest.mark.parametrize("fmt,good,rows", [
    ("sglang-log", (FIX / "sglang_log_22166.txt").read_bytes(), 4),
    ("vllm-log", (FIX / "vllm_log_37307.txt").read_bytes(), 5),
    ("prom-text", (FIX / "sglang_metrics_docs.txt").read_bytes(), 29),
])
def test_bad_input_is_flagged_not_fatal(fmt, good, rows):
    read = PARSERS[fmt]
    empty = read(io.BytesIO(b""), instance="x")
    assert empty.meta["partial"] is True and "empty input" in empty.meta["sources"][0]["notes"]
    # binary garbage around real lines: the real rows survive, the garbage is counted and flagged
    tl = read(io.BytesIO(GARBAGE + good + GARBAGE), instance="x")
    src = tl.meta["sources"][0]
    assert src["lines_skipped"] >= 4 and src["partial"] is True and tl.meta["partial"] is True
    assert (len(tl.series) if fmt == "prom-text" else len(tl.steps)) == rows
    # cut mid-line (no final newline): the last line is not trusted in an exposition
    cut = good[: good.rindex(b"\n", 0, len(good) - 1) + 12]
    tl = read(io.BytesIO(cut), instance="x")
    check(tl, cut)
    if fmt == "prom-text":
        assert tl.meta["partial"] is True and len(tl.series) == rows - 1
