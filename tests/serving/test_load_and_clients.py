"""`mixdiag load` against the server (bounded), and the client-record collectors on its file and others."""
from __future__ import annotations

import asyncio
import json

import pytest

from mixdiag.collectors import registry
from mixdiag.errors import UserError
from mixdiag.loadgen import Dist, LoadConfig, run_load


def _load(server, path, **kw):
    recs = []
    cfg = LoadConfig(url=server.url, **{"rate": 4.0, "duration_s": 4.0, "prompt_len": Dist.parse("uniform:8:64"),
                                        "output_len": Dist.parse("24"), "seed": 5, **kw})
    with open(path, "w") as f:
        def write(r):
            recs.append(r)
            f.write(json.dumps(r) + "\n")
        summary = asyncio.run(run_load(cfg, write))
    return recs, summary


def test_bounded_load_loses_nothing_and_reads_back(server, tmp_path):
    path = tmp_path / "load.jsonl"
    recs, summary = _load(server, path, rate=8.0, max_concurrency=16)
    reqs = [r for r in recs if r["type"] == "request"]
    assert recs[0]["type"] == "header" and recs[-1]["type"] == "summary"
    assert len(reqs) == recs[0]["planned_requests"] > 10
    assert summary["statuses"] == {"ok": len(reqs)} and summary["lost_tokens"] == 0
    for r in reqs:
        assert len(r["token_times_s"]) == r["output_tokens"] == r["max_tokens"] == 24
        assert r["token_times_s"] == sorted(r["token_times_s"]) and len(r["itls_s"]) == 23
        assert r["start_s"] < r["token_times_s"][0] and abs(r["ttft_s"] - (r["token_times_s"][0] - r["start_s"])) < 1e-9
    assert registry.detect(path) == "client-load"
    tl = registry.module("client-load").read(path)
    assert len(tl.tokens) == 24 * len(reqs) and tl.meta["clock"] == "unix"
    assert tl.meta["signals"]["client"]["tokens"] == "measured"
    assert abs(tl.itl()["itl_s"].max() - max(x for r in reqs for x in r["itls_s"])) < 1e-6


@pytest.mark.parametrize("text, kind", [("128", "fixed"), ("uniform:4:9", "uniform"), ("exp:20", "exp"),
                                        ("normal:50:5", "normal")])
def test_dist_parse_and_sample(text, kind):
    import random

    d = Dist.parse(text)
    assert d.kind == kind and str(Dist.parse(str(d))) == str(d)
    assert all(v >= 1 for v in (d.sample(random.Random(i)) for i in range(50)))


@pytest.mark.parametrize("text", ["", "uniform:9:4", "beta:1:2", "0", "exp:x"])
def test_dist_rejects_bad_input(text):
    with pytest.raises(UserError):
        Dist.parse(text)


@pytest.mark.parametrize("arrival, n", [("constant", 20), ("poisson", None)])
def test_arrivals_are_bounded_and_seeded(arrival, n):
    cfg = LoadConfig(url="http://127.0.0.1:1", rate=2.0, duration_s=10.0, arrival=arrival, seed=1)
    a = cfg.arrivals()
    assert a == cfg.arrivals() and all(0 <= t < 10 for t in a) and a == sorted(a)
    if n is not None:
        assert len(a) == n


@pytest.mark.parametrize("rate, duration, n", [(8.0, 60.0, 480), (3.0, 7.0, 21), (0.29, 100.0, 29), (0.1, 30.0, 3),
                                               (10.0, 0.95, 9), (7.0, 1 / 7, 1)])
def test_constant_arrivals_are_exactly_rate_times_duration(rate, duration, n):
    a = LoadConfig(url="http://127.0.0.1:1", rate=rate, duration_s=duration, arrival="constant").arrivals()
    assert len(a) == n and a[0] == 0.0 and a[-1] < duration
    assert a == [i / rate for i in range(n)]   # from the index, never a running sum


def test_constant_load_sends_every_planned_request(server, tmp_path):
    recs, summary = _load(server, tmp_path / "c.jsonl", rate=5.0, duration_s=2.0, arrival="constant",
                          output_len=Dist.parse("4"))
    assert recs[0]["planned_requests"] == 10 and summary["statuses"] == {"ok": 10}


def _vllm_result(start_times=True):
    # the documented shape of `vllm bench serve --save-result --save-detailed` (benchmarks/serve.py)
    doc = {"date": "20261201-060000", "backend": "vllm", "model_id": "m", "num_prompts": 3, "duration": 3.0,
           "completed": 2, "request_throughput": 0.66, "input_lens": [10, 20, 30], "output_lens": [3, 2, 0],
           "ttfts": [0.1, 0.2, 0.0], "itls": [[0.05, 0.07], [0.1], []], "generated_texts": ["a", "b", ""],
           "errors": ["", "", "timeout"]}
    if start_times:
        doc["start_times"] = [100.0, 101.5, 102.0]
    return doc


@pytest.mark.parametrize("starts, t0, clock, first", [(True, None, "relative", 0.1), (True, 1.7e9, "unix", 1.7e9 + 0.1),
                                                     (False, None, "relative", 0.1)])
def test_vllm_bench_result_is_read(tmp_path, starts, t0, clock, first):
    p = tmp_path / "vllm-result.json"
    p.write_text(json.dumps(_vllm_result(starts)))
    assert registry.detect(p) == "vllm-bench"
    tl = registry.module("vllm-bench").read(p, t0=t0)
    assert tl.meta["clock"] == clock
    assert len(tl.tokens) == 5   # 3 + 2; the errored request is counted, not read
    src = tl.meta["sources"][0]
    assert src["lines_total"] == 3 and src["lines_skipped"] == 1
    r0 = tl.tokens[tl.tokens.request_id == "vllm-bench-0"]["t_s"].tolist()
    assert r0 == pytest.approx([first, first + 0.05, first + 0.12])
    if starts:
        r1 = tl.tokens[tl.tokens.request_id == "vllm-bench-1"]["t_s"].tolist()
        assert r1[0] - r0[0] == pytest.approx(1.6)
    # client steps only where the streams line up (start times); never from streams all put at 0
    assert (len(tl.steps) > 0) == starts and ((tl.steps["step_source"] == "client").all() if starts else True)


def test_guidellm_report_is_read_with_inferred_token_times(tmp_path):
    ok = {"request_id": "a", "start_time": 1000.0, "first_token_time": 1000.5, "last_token_time": 1001.5,
          "output_tokens": 5, "prompt_tokens": 10, "end_time": 1001.6}
    doc = {"benchmarks": [{"requests": {"successful": [ok], "errored": [{"request_id": "b"}], "incomplete": []}}]}
    p = tmp_path / "report.json"
    p.write_text(json.dumps(doc))
    assert registry.detect(p) == "guidellm"
    tl = registry.module("guidellm").read(p)
    assert tl.tokens["t_s"].tolist() == pytest.approx([1000.5, 1000.75, 1001.0, 1001.25, 1001.5])
    assert tl.meta["signals"]["client"]["tokens"] == "inferred"
    assert tl.meta["sources"][0]["lines_skipped"] == 1


@pytest.mark.parametrize("content, fmt", [('{"format":"mixdiag-load"}\n', "client-load"),
                                          ('{"ttfts": [], "itls": []}', "vllm-bench"),
                                          ('{"benchmarks": "x"}', "guidellm")])
def test_client_collectors_refuse_empty_or_wrong_files(tmp_path, content, fmt):
    p = tmp_path / "f.json"
    p.write_text(content)
    with pytest.raises(UserError):
        registry.module(fmt).read(p)


def test_arrivals_without_a_slot_before_the_window_ends_are_not_sent(server, tmp_path):
    import time

    server.state.loop.call(lambda engine: time.sleep(1.5))   # the one slot stays busy past the window
    recs, summary = _load(server, tmp_path / "l.jsonl", rate=4.0, duration_s=1.0, max_concurrency=1,
                          arrival="constant")
    reqs = [r for r in recs if r["type"] == "request"]
    assert [r["status"] for r in reqs].count("ok") == 1
    assert summary["statuses"] == {"ok": 1, "not_sent": len(reqs) - 1} and len(reqs) == 4
