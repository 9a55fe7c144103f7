"""log_lines: container prefixes, clocks, numbers and field names shared by the log readers."""
import pytest

from mixdiag.collectors.logs.log_lines import naive_to_unix, parse_number, slug, strip_container_prefix
from mixdiag.collectors.text_input import rfc3339_to_unix


@pytest.mark.parametrize("line,rest,t", [
    ("2025-03-01T10:00:00.250000000Z INFO x", "INFO x", 1740823200.25),                # docker --timestamps
    ("2025-03-01T11:00:00+01:00 stdout F Decode batch", "Decode batch", 1740823200.0),  # CRI log file
    ("sglang-1  | [2025-03-01 10:00:00] Prefill", "[2025-03-01 10:00:00] Prefill", None),  # compose
    ("2025-03-01T10:00:00Z vllm-0  | INFO y", "INFO y", 1740823200.0),
    ("INFO 03-01 10:00:00 [core.py:1] z", "INFO 03-01 10:00:00 [core.py:1] z", None),  # nothing to strip
    ("\x1b[32mINFO\x1b[0m 03-01 10:00:00 [core.py:1] z", "INFO 03-01 10:00:00 [core.py:1] z", None),  # colours
])
def test_strip_container_prefix(line, rest, t):
    got_rest, got_t = strip_container_prefix(line)
    assert got_rest == rest
    assert got_t == (pytest.approx(t) if t is not None else None)


@pytest.mark.parametrize("stamp,zone,want", [
    ("2025-03-01T10:00:00", "Z", 1740823200.0), ("2025-03-01T10:00:00", "-0130", 1740828600.0),
    ("2025-03-01T10:00:00.5", None, 1740823200.5), ("2025-02-30T10:00:00", "Z", None),
])
def test_rfc3339(stamp, zone, want):
    assert rfc3339_to_unix(stamp, zone) == want


def test_naive_to_unix_rejects_impossible_dates():
    assert naive_to_unix(2025, 3, 1, "10:00:00", "25") == 1740823200.25
    assert naive_to_unix(2025, 2, 30, "10:00:00") is None and naive_to_unix(2025, 1, 1, "25:00:00") is None


@pytest.mark.parametrize("text,want", [
    ("12", 12.0), (" 0.5 ", 0.5), ("57.9%", 57.9), ("True", 1.0), ("False", 0.0), ("3.", 3.0),
    ("many", None), ("", None), ("nan", None), ("inf", None),
])
def test_parse_number(text, want):
    assert parse_number(text) == want


@pytest.mark.parametrize("key,want", [
    ("#new-token", "new_token"), ("gen throughput (token/s)", "gen_throughput_token_per_s"),
    ("Avg xfer time (ms)", "avg_xfer_time_ms"), ("GPU KV cache usage", "gpu_kv_cache_usage"),
    ("#retracted_reqs", "retracted_reqs"),
])
def test_slug(key, want):
    assert slug(key) == want
