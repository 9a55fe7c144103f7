"""prom_text: real exposition fixtures, timed scrapes from a real prometheus_client registry."""
import io
import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mixdiag.collectors.prometheus import prom_text, scrape_reader
from mixdiag.errors import UserError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

# Counts by grep: total = wc -l, ignored = lines starting with '#', parsed = lines starting with vllm:/sglang:.
FIXTURES = [
    ("sglang_metrics_docs.txt", 49, 29, 20, {"sglang:num_queue_reqs": 2826.0, "sglang:token_usage": 0.28}),
    ("vllm_metrics_11117.txt", 52, 48, 4, {"vllm:iteration_tokens_total_count": 8.0}),
    ("vllm_metrics_ps318.txt", 29, 25, 4, {}),
]


@pytest.mark.parametrize("name,total,parsed,ignored,values", FIXTURES)
def test_fixture_counts(name, total, parsed, ignored, values):
    tl = scrape_reader.read(FIX / name)
    src = tl.meta["sources"][0]
    assert (src["lines_total"], src["lines_parsed"], src["lines_skipped"], src["lines_ignored"]) == \
        (total, parsed, 0, ignored)
    # one dump: one since-start row per target (collectors/prometheus/endpoint.since_start)
    assert tl.meta["clock"] == "relative" and len(tl.steps) == 1 and "since_start" in tl.meta
    assert len(tl.series) == parsed  # one scrape: every sample is kept as a series value
    for metric, v in values.items():
        got = tl.series[tl.series["name"] == metric]["value"]
        assert list(got) == [v]


def test_parse_syntax_variants():
    text = ('# TYPE old_counter counter\n'
            'old_counter{a="x"} 3\n'                                  # counter without _total
            'sglang_num_running_reqs{model_name="m"} 4\n'             # underscore variant
            'm{l="has \\"quote\\", comma"} +Inf 1700000000000\n'      # escapes + timestamp
            'bad{l="unterminated} 1\n'
            'x 12abc\n'
            'x_created 1.7e9\n'
            'dup 1\ndup 2\n')
    stats = prom_text.LineStats(format="prom-text", path="t", lines_total=9)
    s = prom_text.parse(text, stats)
    assert s.samples["old_counter_total"] == {(("a", "x"),): 3.0}
    assert s.samples["sglang:num_running_reqs"] == {(("model_name", "m"),): 4.0}
    assert s.samples["m"] == {(("l", 'has "quote", comma'),): math.inf}
    assert (stats.lines_parsed, stats.lines_skipped, stats.lines_ignored) == (4, 3, 2)


def test_cut_last_line_is_skipped_and_flagged():
    tl = scrape_reader.read(io.BytesIO(b"a_total 1\nb_total 2"), t_s=5.0)
    src = tl.meta["sources"][0]
    assert (src["lines_parsed"], src["lines_skipped"], src["partial"]) == (1, 1, True)
    assert tl.meta["partial"] is True


def test_not_prometheus_is_user_error(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello world\nthis is a log\n")
    with pytest.raises(UserError):
        scrape_reader.read(p)
    with pytest.raises(UserError):
        scrape_reader.read(tmp_path / "missing.prom")


def _engine_registry():
    reg = CollectorRegistry()
    m = {
        "steps": Counter("mixdiag_engine_steps", "", ["kind"], registry=reg),
        "tok": Counter("mixdiag_engine_scheduled_tokens", "", ["segment"], registry=reg),
        "gen": Counter("mixdiag_engine_generation_tokens", "", registry=reg),
        "itl": Histogram("mixdiag_engine_inter_token_latency_seconds", "", buckets=(0.01, 0.05, 0.1, 1.0),
                         registry=reg),
        "run": Gauge("mixdiag_engine_requests_running", "", registry=reg),
    }
    return reg, m


def test_scrape_sequence_intervals_from_real_registry():
    reg, m = _engine_registry()
    scrapes = [(100.0, generate_latest(reg).decode())]
    # interval 0: 3 decode steps, 30 decode rows, ITL observations 0.02 x 4
    m["steps"].labels("decode").inc(3)
    m["tok"].labels("decode").inc(30)
    m["gen"].inc(30)
    for _ in range(4):
        m["itl"].observe(0.02)
    m["run"].set(10)
    scrapes.append((101.0, generate_latest(reg).decode()))
    # interval 1: one mixed step (label child born now) + 1 decode; slow tokens
    m["steps"].labels("mixed").inc()
    m["steps"].labels("decode").inc()
    m["tok"].labels("prefill").inc(512)
    m["tok"].labels("decode").inc(20)
    m["gen"].inc(20)
    for _ in range(2):
        m["itl"].observe(0.5)
    scrapes.append((102.0, generate_latest(reg).decode()))
    # interval 2: nothing ran
    scrapes.append((103.0, generate_latest(reg).decode()))
    tl = scrape_reader.read_scrapes(scrapes, instance="engine0")
    s = tl.steps
    assert list(s["kind"]) == ["decode", "mixed", "idle"]
    assert list(s["granularity"]) == ["interval"] * 3
    assert list(s["t_start_s"]) == [100.0, 101.0, 102.0] and list(s["t_end_s"]) == [101.0, 102.0, 103.0]
    assert list(s["decode_rows"]) == [30.0, 20.0, 0.0]
    assert list(s["prefill_tokens"]) == [0.0, 512.0, 0.0]
    assert list(s["output_tokens"]) == [30.0, 20.0, 0.0]
    assert list(s["mixed_steps"]) == [0.0, 1.0, 0.0] and list(s["decode_steps"]) == [3.0, 1.0, 0.0]
    assert list(s["itl_count"]) == [4.0, 2.0, 0.0]
    assert s["itl_mean_s"][0] == pytest.approx(0.02) and s["itl_mean_s"][1] == pytest.approx(0.5)
    assert 0.01 < s["itl_p50_s"][0] <= 0.05 and 0.1 < s["itl_p99_s"][1] <= 1.0
    assert math.isnan(s["itl_p50_s"][2])
    assert list(s["running_reqs"]) == [10.0, 10.0, 10.0]
    inc = tl.series[(tl.series["name"] == "mixdiag_engine_steps_total:increase") &
                    (tl.series["labels"] == "kind=mixed")]
    assert list(inc["value"]) == [1.0, 0.0]  # born in interval 1
    assert tl.meta["metric_sources"]["engine0"]["decode_rows"] == "mixdiag_engine_scheduled_tokens_total{segment=decode}"
    assert tl.meta["signals"]["engine0"]["kind"] == "measured"


def _vllm(engine_values, gen, running, itl_buckets, name="vllm:generation_tokens_total"):
    lines = []
    for e, g, r, b in zip(engine_values, gen, running, itl_buckets):
        lab = f'engine="{e}",model_name="m"'
        lines.append(f"{name}{{{lab}}} {g}")
        lines.append(f"vllm:num_requests_running{{{lab}}} {r}")
        for le, c in zip(("0.01", "0.1", "+Inf"), b):
            lines.append(f'vllm:inter_token_latency_seconds_bucket{{{lab},le="{le}"}} {c}')
        lines.append(f"vllm:inter_token_latency_seconds_count{{{lab}}} {b[-1]}")
    return "\n".join(lines) + "\n"


def test_vllm_engines_split_and_counter_reset():
    s0 = _vllm(["0", "1"], [100, 50], [3, 4], [(1, 2, 2), (0, 0, 0)])
    s1 = _vllm(["0", "1"], [130, 10], [5, 6], [(1, 5, 5), (0, 1, 1)])   # engine 1 restarted: 50 -> 10
    tl = scrape_reader.read_scrapes([(0.0, s0), (10.0, s1)], instance="vllm")
    s = tl.steps.set_index("instance")
    assert sorted(s.index) == ["vllm/engine0", "vllm/engine1"]
    assert s.loc["vllm/engine0", "output_tokens"] == 30.0
    assert s.loc["vllm/engine1", "output_tokens"] == 10.0  # reset: increase = value since restart
    assert s.loc["vllm/engine0", "itl_count"] == 3.0
    assert s.loc["vllm/engine1", "running_reqs"] == 6.0
    assert s.loc["vllm/engine0", "kind"] == "unknown"  # tokens flowed, kind not in vLLM's metrics


def test_scrape_directory(tmp_path):
    reg, m = _engine_registry()
    (tmp_path / "1700000000.prom").write_bytes(generate_latest(reg))
    m["steps"].labels("prefill").inc(2)
    (tmp_path / "1700000005.5.prom").write_bytes(generate_latest(reg))
    (tmp_path / "README").write_text("not a scrape\n")
    sub = tmp_path / "engine1"  # a multi-instance run writes scrapes/engine<rank>/
    sub.mkdir()
    reg1, m1 = _engine_registry()
    (sub / "1700000000.prom").write_bytes(generate_latest(reg1))
    m1["steps"].labels("decode").inc(4)
    (sub / "1700000001.prom").write_bytes(generate_latest(reg1))
    tl = scrape_reader.read(tmp_path, instance="e")
    assert tl.instances == ["e", "engine1"]
    assert list(tl.steps["kind"]) == ["prefill", "decode"]
    assert tl.steps["t_end_s"][0] == 1700000005.5
    assert len(tl.meta["sources"]) == 4
    assert any("1 other file" in n for s in tl.meta["sources"] for n in s["notes"])
    assert set(tl.meta["metric_sources"]) == {"e", "engine1"}


@pytest.mark.parametrize("head,name,want", [
    (b"# HELP vllm:x y\n# TYPE vllm:x gauge\n", "m.txt", True),
    (b'sglang:token_usage{model_name="m"} 0.2\n', "m.txt", True),
    (b"", "scrape.prom", True),
    (b"[2025-01-01 00:00:00] Prefill batch. #new-seq: 1", "x.log", False),
])
def test_sniff(head, name, want):
    assert scrape_reader.sniff(head, name) is want



@pytest.mark.parametrize("names,times", [
    (["scrape-1700000000123.prom", "scrape-1700000001623.prom"], [1700000000.123, 1700000001.623]),  # ms
    (["m_1700000000.txt", "m_1700000002.txt"], [1700000000.0, 1700000002.0]),  # s, anywhere in the name
    (["2023-11-14T22:13:20Z.prom", "2023-11-14T22:13:21.5Z.prom"], [1700000000.0, 1700000001.5]),  # RFC 3339
    (["metrics_2023-11-14_22-13-20.prom", "metrics_2023-11-14_22-13-22.prom"], [1700000000.0, 1700000002.0]),
    (["node7-pid12345-1700000000.prom", "node7-pid12345-1700000003.prom"], [1700000000.0, 1700000003.0]),
])
def test_user_named_scrapes_are_one_instance_on_the_unix_clock(tmp_path, names, times):
    reg, m = _engine_registry()
    for n in names:
        m["steps"].labels("decode").inc(3)
        (tmp_path / n).write_bytes(generate_latest(reg))
    tl = scrape_reader.read(tmp_path, instance="u")
    assert tl.instances == ["u"] and tl.meta["clock"] == "unix" and len(tl.steps) == 1
    assert (tl.steps["t_start_s"][0], tl.steps["t_end_s"][0]) == pytest.approx(tuple(times))
    assert scrape_reader.sniff(b"", str(tmp_path))


def test_scrapes_without_a_time_use_mtime_and_say_so(tmp_path):
    import os
    reg, m = _engine_registry()
    for i, n in enumerate(["a.prom", "b.prom", "c.prom"]):
        m["steps"].labels("decode").inc(1)
        (tmp_path / n).write_bytes(generate_latest(reg))
        os.utime(tmp_path / n, (1700000000 + 10 * i, 1700000000 + 10 * i))
    tl = scrape_reader.read(tmp_path, instance="u")
    assert tl.instances == ["u"] and len(tl.steps) == 2 and tl.steps["t_end_s"].iloc[-1] == 1700000020
    assert any("modification time" in n for s in tl.meta["sources"] for n in s["notes"])


@pytest.mark.parametrize("name,t", [("1700000000.prom", 1700000000.0), ("x-99.prom", None),
                                    ("run-20231114.prom", None), ("1700000000123.txt", 1700000000.123)])
def test_name_time(name, t):
    got = prom_text.name_time(name)
    assert got == (pytest.approx(t) if t is not None else None)


def _created_scrapes(tmp_path, lead_s: float):
    """Two scrapes of a real prometheus_client registry (vLLM's and SGLang's metrics library),
    named ``lead_s`` and ``lead_s + 1`` seconds after the counters were created; 5 tokens counted
    before the first scrape, 3 between them."""
    import re as _re

    from prometheus_client import CollectorRegistry, Counter, generate_latest
    reg = CollectorRegistry()
    c = Counter("vllm:generation_tokens", "Generated tokens.", registry=reg)
    text = generate_latest(reg).decode()
    created = float(_re.search(r"^vllm:generation_tokens_created (\S+)", text, _re.M).group(1))
    c.inc(5)
    (tmp_path / f"{created + lead_s:.3f}.prom").write_bytes(generate_latest(reg))
    c.inc(3)
    (tmp_path / f"{created + lead_s + 1:.3f}.prom").write_bytes(generate_latest(reg))
    return created


def test_first_interval_starts_at_counter_creation(tmp_path):
    created = _created_scrapes(tmp_path, lead_s=1.0)
    tl = scrape_reader.read(tmp_path, instance="e")
    assert list(tl.steps["output_tokens"]) == [5.0, 3.0]  # the work before the first scrape is kept
    assert tl.steps["t_start_s"].iloc[0] == pytest.approx(created)
    assert any("counters' creation" in n for s in tl.meta["sources"] for n in s["notes"])


def test_no_creation_interval_when_created_long_before(tmp_path):
    # started 30 scrape periods before the first scrape: that interval would not compare with the rest
    _created_scrapes(tmp_path, lead_s=30.0)
    tl = scrape_reader.read(tmp_path, instance="e")
    assert list(tl.steps["output_tokens"]) == [3.0]
