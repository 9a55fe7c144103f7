"""Issue 16's live acceptance: ``mixdiag analyze http://127.0.0.1:PORT/metrics --duration 20`` against a
running ``mixdiag run --metrics-dialect vllm --serve PORT`` names mixing (a real socket, a real subprocess).

The engine runs mixed-default's workload - 32 chat decodes, 2k-8k-token prompts chunked into their
steps by a 512-token budget - with one change that fits a 20 s look at 1 s scrapes: arrivals paced on
the wall clock (``time_unit = "s"``: a long prompt every 2.5 s; chat outputs long enough to keep
decoding past the sampling window on a fast machine), so the window holds the same mix of mixed and
decode-only intervals whatever the machine's speed.

A 2k-8k prompt in 512-token chunks spans 1-3 s of 1 s scrapes, and vLLM counts its tokens
(``vllm:prompt_tokens_total``, ``iteration_tokens_total``, the TTFT histogram) only when its first
token comes, i.e. in the interval of the *last* chunk: the earlier intervals show slow decodes and no
counted prompt work. The vLLM dialect also exposes ``vllm:request_prefill_time_seconds``, and the
collector spreads each interval's prompt tokens back over it (``prefill_work_tokens``, inferred); the
interval relation and the interval rule read that column, so the chunk intervals count as prefill
work too.

Measured on a 2-core machine shared with other work (load 1-3.8), 20 runs (16 of this test, 4 of the
same commands from a shell), 21-23 s each: 19 passed - rho 0.59-0.88, p 0.001-0.006 (20 intervals),
mixing named on 14-17 of 16-19 spikes, the rest ``unknown`` - the last interval (its prompts have not
reached their first token, so nothing is counted or spread into it yet) and small spikes on intervals
with no prompt work; in the 16 test runs every mixing spike fell on an interval with counted or
spread prompt work. One (the first of the 20) failed: rho 0.37, p 0.052, so the relation missed
the rule's p < 0.01 and all 17 spikes were ``unknown``. The earlier one-step variant (2048-token
budget, 768-1536-token prompts) is no longer needed for the relation to hold. The test samples at
0.5 s (40 intervals: more power for the rank relation): 9 of 9 runs passed; the 3 instrumented ones
gave rho 0.63-0.79, p at the 999-permutation floor (0.001), mixing on 18-21 of 20-24 spikes.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import urllib.request
from contextlib import redirect_stdout

import mixdiag.diagnosis
from helpers.prometheus_server import free_port

from mixdiag.cli import main as cli_main

# mixed-default (engine/testbed/scenarios/mixed-default.toml) paced on the wall clock: the same model,
# budget, chat group and prompt lengths; a long prompt every 2.5 s instead of every 50 steps, chat
# outputs of 2000 tokens (not 200-300) and blocks for them, so decoding outlasts the 20 s window
SCENARIO = """
name = "live-mixing"
seed = 7
max_steps = 2600

[model]
preset = "tiny"

[cache]
block_size = 16
num_blocks = 8192

[scheduler]
policy = "token_budget"
max_num_batched_tokens = 512

[engine]
num_threads = 1

[workload]
time_unit = "s"

[[workload.groups]]
name = "chat"
count = 32
arrival = "burst"
start = 0
prompt_len = { dist = "uniform", low = 64, high = 256 }
output_len = { dist = "fixed", value = 2000 }

[[workload.groups]]
name = "long"
count = 12
arrival = "fixed"
start = 1.5
interval = 2.5
prompt_len = { dist = "uniform", low = 2048, high = 8192 }
output_len = { dist = "fixed", value = 16 }
"""


def _wait_for_metrics(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mixdiag run exited ({proc.returncode}) before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.read().decode()
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f} s")


def test_analyze_names_mixing_on_a_live_vllm_dialect_engine(tmp_path, monkeypatch):
    sc = tmp_path / "live-mixing.toml"
    sc.write_text(SCENARIO)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    # the JSON's spike evidence does not carry prefill_work_tokens: keep the Timeline analyze diagnoses
    # (the CLI imports diagnose from mixdiag.diagnosis when it runs) to read the column per interval
    seen = []
    real_diagnose = mixdiag.diagnosis.diagnose

    def spy(tl, *a, **kw):
        seen.append(tl)
        return real_diagnose(tl, *a, **kw)

    monkeypatch.setattr(mixdiag.diagnosis, "diagnose", spy)
    log = (tmp_path / "run.log").open("w")
    # --linger: /metrics still answers if the run ends before the sampling does (a very fast machine)
    proc = subprocess.Popen([sys.executable, "-m", "mixdiag", "run", "--scenario", str(sc), "--metrics-dialect",
                             "vllm", "--serve", str(port), "--linger", "30", "--no-nvtx", "--out",
                             str(tmp_path / "run")], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log)
    try:
        first = _wait_for_metrics(url, proc)
        assert "vllm:generation_tokens_total" in first and "mixdiag_" not in first
        out = io.StringIO()
        t0 = time.monotonic()
        with redirect_stdout(out):
            # 0.5 s scrapes: 40 intervals give the cross-interval rank relation the power that 20 lack
            # against run-to-run variation (at 1 s, 1 run in 20 fell to rho 0.37, p 0.05)
            rc = cli_main(["analyze", url, "--duration", "20", "--interval", "0.5", "--json"])
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait(30)
        log.close()
    assert rc == 0
    assert 19 < took < 45  # sampled for --duration, then diagnosed
    doc = json.loads(out.getvalue())
    assert doc["steps"]["intervals"] == 40
    assert len(seen) == 1
    steps = seen[0].steps
    assert "prefill_work_tokens" in steps.columns  # the dialect exposes request_prefill_time_seconds
    work = {(r.instance, int(r.step)): (float(r.prefill_tokens or 0), float(r.prefill_work_tokens or 0))
            for r in steps.itertuples()}
    spikes = doc["spikes"]
    causes = [s["cause"] for s in spikes]
    named = {c: causes.count(c) for c in set(causes)}
    why = (named, doc["verdict"], [(s["step"], round(s["itl_s"], 3), round(s["baseline_s"], 3), s["cause"],
                                     work.get((s["instance"], s["step"]))) for s in spikes],
           {k: v.get("prefill_itl_relation") for k, v in doc["instances"].items()})
    assert named.get("mixing", 0) >= 3, why
    # mixing is the cause named most, and nothing the run did not do (no preemption, transfer, ...)
    assert max(named, key=named.get) == "mixing", why
    assert set(named) <= {"mixing", "unknown"}, named
    # every mixing spike falls on an interval with prefill work: prompt tokens vLLM counted there, or
    # spread back over their prefill time into it (the chunk intervals before the first token)
    mixing = [work.get((s["instance"], s["step"]), (0.0, 0.0)) for s in spikes if s["cause"] == "mixing"]
    assert all(pre > 0 or spread > 0 for pre, spread in mixing), why
    # and some where vLLM's own counters show the prompt work (not only via the inference)
    assert sum(1 for pre, _ in mixing if pre > 0) >= 3, why
    assert "mixed batching" in doc["verdict"]
