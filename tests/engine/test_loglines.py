"""Log lines: byte-identical to real vLLM / SGLang lines (fixtures) and parseable by formats.md's regexes."""
import calendar
import io
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixdiag.engine.telemetry.loglines import LogLineConfig, LogLineWriter, parse_formats
from mixdiag.engine.core.records import StepRecord
from mixdiag.errors import UserError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"  # real public lines (see SOURCES.md)

VLLM_ITER = re.compile(r"Iteration\((?P<idx>\d+)\): (?P<ctx_req>\d+) context requests, (?P<ctx_tok>\d+) context tokens, "
                       r"(?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation tokens, "
                       r"iteration elapsed time: (?P<ms>[\d.]+) ms")
VLLM_PREFIX = re.compile(r"(?:\((?P<proc>[^)\s]+) pid=(?P<pid>\d+)\)\s+)?(?P<level>[A-Z]+) (?P<mmdd>\d\d-\d\d) "
                         r"(?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)? \[?(?P<file>[\w.]+):(?P<lineno>\d+)\] ")
SGL_PREFIX = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)((?: (?:DP|TP|EP|PP)\d+)*)\] ")
SGL_BATCH = re.compile(r"(Prefill|Decode) batch(?: \[(\d+)\])?[.,] ")
SGL_FIELD = re.compile(r"(#?[A-Za-z][A-Za-z -]*?(?: \(token/s\))?): ([^,]+)")


def real_line(name, contains):
    """First line of a real sample in tests/fixtures/logs containing ``contains``."""
    path = FIXTURES / name
    for line in path.read_text().splitlines():
        if not line.startswith("#") and contains in line:
            return line
    raise AssertionError(f"{contains!r} not in {path}")


def utc_ts(stamp, fmt):
    return calendar.timegm(time.strptime(stamp, fmt))


def test_vllm_line_is_byte_identical_to_a_real_one():
    real = real_line("vllm_log_31193.txt", "Iteration(515)")
    t1 = utc_ts("2025-12-22 21:44:40", "%Y-%m-%d %H:%M:%S") + 0.5
    r = StepRecord(step=515, t_start_s=t1 - 0.01099, t_end_s=t1, kind="decode", decode_reqs=20, decode_rows=20)
    out = io.StringIO()
    LogLineWriter(out, LogLineConfig(formats=("vllm",)), pid=2010410)(r)
    assert out.getvalue() == real + "\n"


def test_sglang_lines_are_byte_identical_to_real_ones():
    real_decode = real_line("sglang_log_22166.txt", "Decode batch")
    real_prefill = real_line("sglang_log_22166.txt", "Prefill batch")
    t = utc_ts("2026-04-05 20:02:51", "%Y-%m-%d %H:%M:%S")
    out = io.StringIO()
    w = LogLineWriter(out, LogLineConfig(formats=("sglang",), decode_log_interval=1))
    gap = 32 / 1635.11
    w(_with(StepRecord(step=0, t_start_s=t + 0.1, t_end_s=t + 0.1 + gap, kind="decode", decode_reqs=32,
                       decode_rows=32, output_tokens=32, graph_mode="FULL", kv_usage=0.08, waiting_reqs=0,
                       running_reqs=32), kv_tokens=11179))
    gap = 158 / 559.53
    w(StepRecord(step=1, t_start_s=t + 0.2, t_end_s=t + 0.2 + gap, kind="mixed", prefill_tokens=158, prefill_reqs=1,
                 decode_reqs=31, decode_rows=31, graph_mode="FULL", kv_usage=0.08, waiting_reqs=0))
    lines = out.getvalue().splitlines()
    assert lines == [real_decode, real_prefill]


def _with(record, **attrs):
    for k, v in attrs.items():
        setattr(record, k, v)
    return record


def run_steps(config, records, **kw):
    out = io.StringIO()
    w = LogLineWriter(out, config, **kw)
    for r in records:
        w(r)
    return out.getvalue().splitlines(), w


def steps(n_decode=5, t=1.7e9):
    recs = [StepRecord(step=0, t_start_s=t, t_end_s=t + 0.2, kind="prefill", prefill_tokens=512, prefill_reqs=1,
                       running_reqs=4, waiting_reqs=1, kv_usage=0.1, graph_mode="NONE")]
    t += 0.2
    for i in range(n_decode):
        recs.append(StepRecord(step=1 + i, t_start_s=t, t_end_s=t + 0.01, kind="decode", decode_reqs=4, decode_rows=4,
                               output_tokens=4, running_reqs=4, kv_usage=0.1, graph_mode="FULL"))
        t += 0.01
    recs.append(StepRecord(step=1 + n_decode, t_start_s=t, t_end_s=t + 0.1, kind="mixed", prefill_tokens=256,
                           prefill_reqs=1, decode_reqs=4, decode_rows=4, output_tokens=4, running_reqs=5,
                           kv_usage=0.12, graph_mode="PIECEWISE"))
    recs.append(StepRecord(step=2 + n_decode, t_start_s=t + 0.1, t_end_s=t + 0.1, kind="idle"))
    return recs


def test_vllm_one_line_per_busy_step_and_parseable():
    lines, _ = run_steps(LogLineConfig(formats=("vllm",), rank=1), steps())
    assert len(lines) == 7  # idle steps are not logged
    for line, r in zip(lines, steps()):
        m, p = VLLM_ITER.search(line), VLLM_PREFIX.match(line)
        assert m and p and p["proc"] == "EngineCore_DP1"
        assert (int(m["idx"]), int(m["ctx_tok"]), int(m["gen_req"])) == (r.step, r.prefill_tokens, r.decode_reqs)
        assert float(m["ms"]) == pytest.approx((r.t_end_s - r.t_start_s) * 1e3, abs=0.01)
    mixed = VLLM_ITER.search(lines[-1])
    assert int(mixed["ctx_tok"]) > 0 and int(mixed["gen_req"]) > 0  # a reader classifies it mixed


def test_sglang_prefill_every_prefill_step_decode_every_interval():
    lines, _ = run_steps(LogLineConfig(formats=("sglang",), decode_log_interval=2, rank=3, show_rank=True),
                         steps(n_decode=5), kv_capacity_tokens=1000)
    kinds = [SGL_BATCH.search(l).group(1) for l in lines]
    assert kinds == ["Prefill", "Decode", "Decode", "Prefill"]
    parsed = []
    for line in lines:
        pre = SGL_PREFIX.match(line)
        assert pre and pre.group(2) == " DP3 TP3"
        rest = line[SGL_BATCH.search(line).end():]
        parsed.append(dict(SGL_FIELD.findall(rest)))
    assert parsed[0]["#new-token"] == "512" and parsed[0]["#running-req"] == "0"  # nothing ran before it
    assert parsed[1]["#running-req"] == "4" and parsed[1]["#token"] == "100" and parsed[1]["cuda graph"] == "True"
    # 8 tokens over the 2 decode steps since the previous decode line (first line: since its own start)
    assert float(parsed[2]["gen throughput (token/s)"]) == pytest.approx(8 / 0.02, rel=1e-3)
    assert parsed[3]["#running-req"] == "4" and parsed[3]["cuda graph"] == "False"  # mixed: decodes folded in


def test_sglang_prefill_only_step_reports_the_stalled_running_batch():
    recs = steps(n_decode=1)[:-1]  # up to the mixed step, after which 5 requests run
    stall = StepRecord(step=9, t_start_s=2e9, t_end_s=2e9 + 0.3, kind="prefill", prefill_tokens=512, prefill_reqs=1,
                       running_reqs=5)
    without = SimpleNamespace(**{k: v for k, v in vars(stall).items() if k != "stalled_decode_reqs"})
    lines, _ = run_steps(LogLineConfig(formats=("sglang",)), recs + [without])  # a producer without the count
    assert "#running-req: 5," in lines[-1]  # the five running requests (after the mixed step) sat out
    stall.stalled_decode_reqs = 3  # the engine counts the decodes that sat out: that count wins
    lines, _ = run_steps(LogLineConfig(formats=("sglang",)), recs + [stall])
    assert "#running-req: 3," in lines[-1]


def test_both_formats_and_unknown_fields_counted():
    lines, w = run_steps(LogLineConfig(formats=parse_formats("both"), decode_log_interval=1), steps(n_decode=1))
    assert any("Iteration(" in l for l in lines) and any("Decode batch," in l for l in lines)
    assert w.unknown_fields == {"kv_tokens": 1}  # no capacity given: '#token: 0' is flagged, not measured


def test_writer_file_and_errors(tmp_path):
    p = tmp_path / "engine.log"
    w = LogLineWriter(p, LogLineConfig(formats=("vllm",)))
    w(steps()[0])
    w.close()
    assert p.read_text().count("Iteration(0)") == 1
    with pytest.raises(UserError):
        LogLineWriter(p)  # never overwrite
    for bad in ("json", ""):
        with pytest.raises(UserError):
            parse_formats(bad)
    with pytest.raises(UserError):
        LogLineConfig(decode_log_interval=0)


@pytest.mark.parametrize("policy,extra,mixed,chunk,max_bs", [
    ("mix_running", dict(enable_mixed_chunk=True, chunked_prefill_size=256), True, 256, "512"),
    ("mix_running", dict(enable_mixed_chunk=False), False, 512, "512"),
    ("token_budget", dict(max_num_batched_tokens=1024), True, 1024, "512"),
    ("prefill_first", dict(enforce_eager=True), False, 512, "None"),
])
def test_sglang_server_args_line_tells_readers_about_mixing(policy, extra, mixed, chunk, max_bs):
    from mixdiag.engine.config import SchedulerConfig

    out = io.StringIO()
    w = LogLineWriter(out, LogLineConfig(formats=("sglang",), decode_log_interval=7))
    w.write_server_args(SchedulerConfig(policy=policy, **extra), t=1.7e9)
    line = out.getvalue().strip()
    assert SGL_PREFIX.match(line) and "server_args=ServerArgs(" in line
    assert f"enable_mixed_chunk={mixed}," in line and f"chunked_prefill_size={chunk}," in line
    assert f"cuda_graph_max_bs={max_bs}," in line and "decode_log_interval=7," in line
    vllm_only = io.StringIO()
    LogLineWriter(vllm_only, LogLineConfig(formats=("vllm",))).write_server_args(SchedulerConfig(), t=1.7e9)
    assert vllm_only.getvalue() == ""


def test_timestamps_are_utc_whatever_the_local_zone(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Shanghai")  # UTC+8: a local-time writer would be 8 h off
    time.tzset()
    try:
        t = utc_ts("2026-04-05 20:02:51", "%Y-%m-%d %H:%M:%S")
        lines, _ = run_steps(LogLineConfig(decode_log_interval=1),
                             [StepRecord(step=4, t_start_s=t - 0.01, t_end_s=t, kind="decode", decode_reqs=1,
                                         decode_rows=1)])
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert " INFO 04-05 20:02:51 [core.py:349] Iteration(4)" in lines[0]
    assert lines[1].startswith("[2026-04-05 20:02:51] Decode batch, ")


@settings(max_examples=60, deadline=None)
@given(step=st.integers(0, 10**7), prefill=st.integers(0, 10**6), preqs=st.integers(0, 512),
       dreqs=st.integers(0, 4096), spec=st.integers(0, 4), usage=st.floats(0, 1), waiting=st.integers(0, 10**5),
       dur=st.floats(1e-5, 100), mode=st.sampled_from(["FULL", "PIECEWISE", "NONE"]))
def test_lines_round_trip_through_the_reference_regexes(step, prefill, preqs, dreqs, spec, usage, waiting, dur, mode):
    kind = "mixed" if prefill and dreqs else "prefill" if prefill else "decode" if dreqs else "idle"
    r = StepRecord(step=step, t_start_s=1.75e9, t_end_s=1.75e9 + dur, kind=kind, prefill_tokens=prefill,
                   prefill_reqs=preqs, decode_reqs=dreqs, decode_rows=dreqs * (1 + spec), kv_usage=usage,
                   waiting_reqs=waiting, graph_mode=mode)
    lines, _ = run_steps(LogLineConfig(decode_log_interval=1), [r])
    if kind == "idle":
        assert lines == []
        return
    m = VLLM_ITER.search(lines[0])
    assert VLLM_PREFIX.match(lines[0])
    assert (int(m["idx"]), int(m["ctx_req"]), int(m["ctx_tok"]), int(m["gen_req"]), int(m["gen_tok"])) == \
        (step, preqs, prefill, dreqs, dreqs * (1 + spec))
    assert float(m["ms"]) == pytest.approx(dur * 1e3, abs=0.006)
    sg = lines[1]
    assert SGL_PREFIX.match(sg)
    fields = dict(SGL_FIELD.findall(sg[SGL_BATCH.search(sg).end():]))
    assert float(fields["token usage"]) == pytest.approx(usage, abs=0.006)
    assert fields["cuda graph"] == str(mode == "FULL") and int(fields["#queue-req"]) == waiting
    if kind == "decode":
        assert int(fields["#running-req"]) == dreqs
    else:
        assert int(fields["#new-token"]) == prefill and int(fields["#new-seq"]) == preqs
