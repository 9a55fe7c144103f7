"""``mixdiag run`` with the instrumentation flags, end to end: files in the run directory, a real Prometheus scrape."""
import json
import re
import subprocess
import sys
import time

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.prometheus_server import free_port
from mixdiag.cli import main

SCENARIO = """
name = "instr-small"
description = "a few short requests, one torch thread (test of the instrumentation flags)"
seed = 3
max_steps = 200

[engine]
num_threads = 1

[model]
preset = "tiny"

[scheduler]
policy = "token_budget"
max_num_batched_tokens = 128

[workload]
time_unit = "step"

[[workload.groups]]
name = "chat"
count = {count}
arrival = "burst"
start = 0
prompt_len = {{ dist = "uniform", low = 40, high = 200 }}
output_len = {{ dist = "uniform", low = {out_low}, high = {out_high} }}
{extra}"""

# Paces a run with real host pauses (40 ms before every step) so that it lasts several seconds
# however fast the machine is: Prometheus (scraping every 0.25 s) must see it mid-run.
PACED = """
[faults.host_stall]
windows = [[0, 100000]]
every = 1
how = "sleep"
stall_s = 0.04
"""


def scenario(tmp_path, count=6, out_low=8, out_high=16, extra=""):
    p = tmp_path / "instr-small.toml"
    p.write_text(SCENARIO.format(count=count, out_low=out_low, out_high=out_high, extra=extra))
    return p


def kinds_from_prom(text):
    for fam in text_string_to_metric_families(text):
        if fam.name == "mixdiag_engine_steps":
            return {s.labels["kind"]: s.value for s in fam.samples if s.name.endswith("_total")}


def test_run_writes_trace_logs_and_scrapes(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--scenario", str(scenario(tmp_path)), "--out", str(out), "-q", "--json",
               "--profile", "2:6", "--log-format", "both", "--decode-log-interval", "1", "--scrape-interval", "0.2"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    steps = pd.read_parquet(out / "steps.parquet")
    # Kineto trace: valid JSON whose step ranges are exactly the window, texts as docs/instrumentation.md
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    step_texts = sorted((e["name"] for e in events if str(e.get("name", "")).startswith("step ")),
                        key=lambda t: int(t.split()[1]))
    assert [int(t.split()[1]) for t in step_texts] == [2, 3, 4, 5]
    for t in step_texts:
        row = steps[steps["step"] == int(t.split()[1])].iloc[0]
        assert t == (f"step {row.step} kind={row.kind} prefill_tokens={int(row.prefill_tokens)} "
                     f"decode_reqs={int(row.decode_reqs)} decode_rows={int(row.decode_rows)} graph={row.graph_mode}")
    # engine.log: one vLLM line per non-idle step, numbered like the Timeline
    log = (out / "engine.log").read_text().splitlines()
    iters = [int(m.group(1)) for l in log for m in [re.search(r"Iteration\((\d+)\)", l)] if m]
    assert iters == steps.loc[steps["kind"] != "idle", "step"].tolist()
    assert any("Prefill batch, " in l for l in log) and any("Decode batch, " in l for l in log)
    # final scrape == the Timeline's step counts; timed scrapes exist; SM estimate flagged
    counts = kinds_from_prom((out / "metrics.prom").read_text())
    assert counts == {k: float((steps["kind"] == k).sum()) for k in ("prefill", "decode", "mixed", "idle")}
    assert list((out / "scrapes").glob("*.prom"))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["signals"]["engine0"]["sm_active"] == "estimated" and steps["sm_active"].notna().all()
    assert summary["instrumentation"]["profile"]["steps_recorded"] == 4


@pytest.mark.prometheus
def test_prometheus_scrapes_mixdiag_run_serve(tmp_path, prometheus_server):
    port = free_port()
    prom = prometheus_server([f"127.0.0.1:{port}"], scrape_interval_s=0.25)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "mixdiag", "run", "--scenario",
                             str(scenario(tmp_path, count=8, out_low=120, out_high=160, extra=PACED)), "--out", str(out), "-q",
                             "--serve", str(port), "--linger", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # during the run: Prometheus sees a partial count (the run is still going: no metrics.prom yet)
        mid = prom.wait_until("sum(mixdiag_engine_steps_total)", lambda r: bool(r) and float(r[0]["value"][1]) > 0,
                              timeout_s=120)
        assert not (out / "metrics.prom").exists(), "the run ended before Prometheus saw it running"
        deadline = time.monotonic() + 180
        while not (out / "metrics.prom").exists():  # written at the end of the run, before lingering
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.1)
        time.sleep(0.05)
        final = kinds_from_prom((out / "metrics.prom").read_text())
        got = prom.wait_until("mixdiag_engine_steps_total",
                              lambda r: {x["metric"]["kind"]: float(x["value"][1]) for x in r} == final, timeout_s=5)
        assert float(mid[0]["value"][1]) < sum(final.values()) and len(got) == 4
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    steps = pd.read_parquet(out / "steps.parquet")
    assert final == {k: float((steps["kind"] == k).sum()) for k in ("prefill", "decode", "mixed", "idle")}
