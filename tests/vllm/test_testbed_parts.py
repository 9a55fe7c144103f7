"""The vLLM testbed's parts that need no server: the drawn plan, the log routing, truth parsing and
the merge of load records. (tests/vllm/test_real_vllm.py runs the real engine.)"""
from __future__ import annotations

import json
import logging
import logging.config
import subprocess
import sys

import pytest

from mixdiag.errors import UserError
from mixdiag.vllm_testbed import fault_plan, log_routing, traffic, truth
from mixdiag.vllm_testbed.config import TestbedConfig, parse_faults
from mixdiag.vllm_testbed.injectors import TruthRow

ITER = ("1796141801.682534 Engine 000: Iteration(2072): 1 context requests, 506 context tokens, "
        "6 generation requests, 6 generation tokens, iteration elapsed time: 87.04 ms, CPU KV cache usage: 0.8%\n")


def test_plan_is_a_function_of_the_seed_and_faults_keep_their_own_streams():
    a = fault_plan.draw(TestbedConfig(duration_s=120, seed=4, faults=("host_stall", "cpu_hog")))
    b = fault_plan.draw(TestbedConfig(duration_s=120, seed=4, faults=("host_stall", "cpu_hog")))
    c = fault_plan.draw(TestbedConfig(duration_s=120, seed=4, faults=("host_stall",)))
    d = fault_plan.draw(TestbedConfig(duration_s=120, seed=5, faults=("host_stall",)))
    assert a == b
    stalls = lambda p: [f for f in p.timed if f.kind == "host_stall"]   # noqa: E731
    assert stalls(a) == stalls(c) and stalls(c) != stalls(d)
    assert all(0.1 <= f.duration_s <= 0.5 and 3.0 <= f.at_s < 119.0 for f in stalls(a))
    assert {f.kind for f in a.timed} == {"host_stall", "cpu_hog"}


def test_gc_pauses_turn_the_gc_debugger_on_and_leave_other_schedules_alone():
    a = fault_plan.draw(TestbedConfig(duration_s=120, seed=4, faults=("host_stall", "gc_pause")))
    c = fault_plan.draw(TestbedConfig(duration_s=120, seed=4, faults=("host_stall",)))
    pauses = [f for f in a.timed if f.kind == "gc_pause"]
    assert a.server.gc_debug and not c.server.gc_debug
    assert [f for f in a.timed if f.kind == "host_stall"] == list(c.timed)
    assert pauses and all(0.1 <= f.duration_s <= 0.5 and 3.0 <= f.at_s < 119.0 for f in pauses)


def test_the_engine_side_hook_runs_full_collections_and_reports_them(tmp_path):
    """vllm_side/sitecustomize.py in a plain interpreter (the hook is standard library only): SIGUSR1 with a
    requested 0.05 s -> at least one full collection, timed by the process itself, in done.log."""
    import os
    import signal
    import time

    from mixdiag.vllm_testbed.log_routing import FILTER_DIR
    env = dict(os.environ, PYTHONPATH=str(FILTER_DIR), MIXDIAG_GC_PAUSE_DIR=str(tmp_path))
    (tmp_path / "request").write_text("0.05\n")
    code = "import sys, time\nprint('ready', flush=True)\nend = time.time() + 60\nwhile time.time() < end:\n    time.sleep(0.01)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t_sent = time.time()
        os.kill(proc.pid, signal.SIGUSR1)
        done = tmp_path / "done.log"
        for _ in range(3000):
            if done.exists() and done.read_text().strip():
                break
            time.sleep(0.01)
        pid, t0, t1, n = done.read_text().split()
    finally:
        proc.kill()
        proc.wait()
    assert int(pid) == proc.pid and int(n) >= 1
    assert t_sent - 1.0 <= float(t0) <= float(t1) and float(t1) - float(t0) >= 0.05


def test_small_kv_caps_the_model_length_below_the_cache():
    p = fault_plan.draw(TestbedConfig(duration_s=30, seed=7, faults=("small_kv", "long_prompts")))
    blocks = p.server.num_kv_blocks
    assert 6 <= blocks <= 9 and p.server.max_model_len == (blocks - 1) * fault_plan.CPU_BLOCK_TOKENS
    assert p.long_prompts.hi + p.long_prompts.output_len < p.server.max_model_len
    assert p.whole_run[0][0] == "kv_pressure"


def test_bad_fault_names_are_one_line_errors():
    assert parse_faults("none") == () and parse_faults("host_stall, cpu_hog") == ("host_stall", "cpu_hog")
    with pytest.raises(UserError, match="unknown fault 'gc'"):
        parse_faults("gc")
    with pytest.raises(UserError, match="duration"):
        TestbedConfig(duration_s=1)


def test_cli_rejects_a_bad_fault_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "mixdiag", "testbed", "vllm", "--out", "/nonexistent/x",
                           "--faults", "bogus"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown fault" in proc.stderr


def test_routed_config_splits_iteration_records_from_the_operator_log(tmp_path, monkeypatch):
    # the filter module as the server imports it: its folder alone on the path
    monkeypatch.syspath_prepend(str(log_routing.FILTER_DIR))
    default = {"version": 1, "disable_existing_loggers": False,
               "formatters": {"vllm": {"format": "%(levelname)s %(message)s"}},
               "handlers": {"vllm": {"class": "logging.FileHandler", "filename": str(tmp_path / "op.log"),
                                     "formatter": "vllm", "level": "INFO"}},
               "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}}}
    cfg = log_routing.routed_config(default, tmp_path / "truth.log")
    assert default["handlers"]["vllm"].get("filters") is None   # the default is not edited in place
    logging.config.dictConfig(json.loads(json.dumps(cfg)))
    try:
        lg = logging.getLogger("vllm.v1.metrics.loggers")
        lg.info("%sIteration(%d): %d context requests, %d context tokens, %d generation requests, "
                "%d generation tokens, iteration elapsed time: %.2f ms, %s KV cache usage: %.1f%%",
                "Engine 000: ", 3, 1, 506, 6, 6, 87.04, "CPU", 0.8)
        lg.info("Engine 000: Avg prompt throughput: 1.0 tokens/s")
        logging.getLogger("vllm.entrypoints").info("Iteration( in another logger stays operator")
    finally:
        for h in logging.getLogger("vllm").handlers:
            h.close()
        logging.getLogger("vllm").handlers.clear()
    op = (tmp_path / "op.log").read_text()
    its = truth.read_iterations(tmp_path / "truth.log")
    assert "Avg prompt throughput" in op and "Iteration(3)" not in op and "another logger" in op
    assert len(its) == 1 and its[0].index == 3 and its[0].context_tokens == 506 and its[0].mixed


def test_iteration_lines_parse(tmp_path):
    p = tmp_path / "it.log"
    p.write_text(ITER + "garbage\n" + ITER.replace("(2072)", "(2073)").replace(" 87.04 ms,", " 5.00 ms (dummy),"))
    its = truth.read_iterations(p)
    assert [i.index for i in its] == [2072, 2073]
    assert its[0].elapsed_s == pytest.approx(0.08704) and its[0].kv_usage == pytest.approx(0.008)
    assert its[1].dummy and not its[0].dummy


def test_merge_keeps_one_header_and_unique_ids(tmp_path):
    def load(path, n):
        recs = [{"type": "header", "format": "mixdiag-load"}] + \
               [{"type": "request", "request_id": f"load-{i}", "start_s": 10.0 + i, "ttft_s": 0.5, "status": "ok"}
                for i in range(n)] + [{"type": "summary", "requests": n}]
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n{torn")
        return path

    files = {"base": load(tmp_path / "a.jsonl", 3), "long": load(tmp_path / "b.jsonl", 2)}
    counts = traffic.merge(files, tmp_path / "client.jsonl")
    recs = [json.loads(ln) for ln in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert counts == {"base": 3, "long": 2}
    assert recs[0]["type"] == "header" and sum(r["type"] == "header" for r in recs) == 1
    ids = [r["request_id"] for r in recs if r["type"] == "request"]
    assert len(set(ids)) == 5 and "long:load-0" in ids
    rows = truth.long_prompt_rows(traffic.read_records(files["long"]), 512)
    assert [(r.t_start_s, r.t_end_s, r.cause) for r in rows] == [(10.0, 10.5, "mixing"), (11.0, 11.5, "mixing")]


def test_faults_csv_round_trip(tmp_path):
    rows = [TruthRow(2.0, 2.3, "host_stall", "SIGSTOP"), TruthRow(1.0, 5.0, "mixing", "prompt_tokens=3000, x")]
    truth.write_faults(rows, tmp_path / "f.csv")
    back = truth.read_faults(tmp_path / "f.csv")
    assert [r.cause for r in back] == ["mixing", "host_stall"] and back[0].detail == "prompt_tokens=3000, x"
