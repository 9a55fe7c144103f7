"""Issue 16's live acceptance: ``mixdiag analyze`` of a running ``mixdiag run --metrics-dialect vllm
--serve PORT`` (a real socket, a real subprocess) names mixing.

The engine runs mixed-default's workload - 32 chat decodes, 2k-8k-token prompts chunked into their
steps by a 512-token budget, a long prompt every 60 steps - with chat outputs long enough to keep
decoding for the whole look. Arrivals count engine steps, not seconds, so every interval holds the
same mix of chunk and decode-only steps per step whatever the machine's speed; a loaded machine only
takes longer to get there.

The test paces by what it measures, not by the clock (issue 22 item 6): it scrapes ``/metrics``
(as ``analyze URL`` does) every 0.5 s, or slower where the machine's measured step rate fits fewer
than 8 steps into 0.5 s, and stops once the scrapes hold enough measured
intervals - ITL in at least ``MIN_ITL_INTERVALS`` of them, prompt work counted by vLLM in at least
``MIN_WORK_INTERVALS`` and none in at least ``MIN_QUIET_INTERVALS`` (the contrast the interval relation
needs) - or after ``HARD_CAP_S`` (then it fails saying what was measured). A fixed ``--duration`` held
too few intervals with prompt work on a 2-core machine at load 5 (1-2 mixing spikes where 3 were
wanted). ``mixdiag analyze`` then reads those scrapes as a directory of ``<unix_time>.prom`` files,
which builds the Timeline exactly as sampling the URL does (:func:`scrape_reader.read_scrapes`); a
short ``analyze URL`` first checks the live path itself.

A 2k-8k prompt in 512-token chunks spans several steps, and vLLM counts its tokens
(``vllm:prompt_tokens_total``, ``iteration_tokens_total``, the TTFT histogram) only when its first
token comes, i.e. in the interval of the *last* chunk: the earlier intervals show slow decodes and no
counted prompt work. The vLLM dialect also exposes ``vllm:request_prefill_time_seconds``, and the
collector spreads each interval's prompt tokens back over it (``prefill_work_tokens``, inferred); the
interval relation and the interval rule read that column, so the chunk intervals count as prefill
work too.
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
from mixdiag.collectors.prometheus.scrape_reader import read_scrapes

# mixed-default (engine/testbed/scenarios/mixed-default.toml): the same model, budget, chat group,
# prompt lengths and step-paced arrivals (a long prompt every 60 steps, not 50: decode-only stretches
# between the chunks, the contrast between intervals); chat outputs of 3000 tokens (not 200-300) and
# blocks for them, so decoding outlasts the look on a fast machine
SCENARIO = """
name = "live-mixing"
seed = 7
max_steps = 6000

[model]
preset = "tiny"

[cache]
block_size = 16
num_blocks = 12288

[scheduler]
policy = "token_budget"
max_num_batched_tokens = 512

[engine]
num_threads = 1

[[workload.groups]]
name = "chat"
count = 32
arrival = "burst"
start = 0
prompt_len = { dist = "uniform", low = 64, high = 256 }
output_len = { dist = "fixed", value = 3000 }

[[workload.groups]]
name = "long"
count = 60
arrival = "fixed"
start = 30
interval = 60
prompt_len = { dist = "uniform", low = 2048, high = 8192 }
output_len = { dist = "fixed", value = 16 }
"""
#: the shortest scrape interval; a slow machine gets longer ones, so an interval still holds
#: STEPS_PER_INTERVAL engine steps (a 0.5 s interval at 2-3 steps/s mostly holds no finished step)
INTERVAL_S = 0.5
STEPS_PER_INTERVAL = 8
#: what the diagnosis needs measured before it is asked: intervals with ITL (the rank relation's
#: power), with prompt work vLLM counted, and without any (the baseline beside them)
MIN_ITL_INTERVALS = 40
MIN_WORK_INTERVALS = 8
MIN_QUIET_INTERVALS = 8
#: generous: a machine this slow fails with what it measured, not by hanging the suite
HARD_CAP_S = 420.0


def _steps_done(text: str) -> float:
    """Engine steps so far: the count of vLLM's per-step token histogram."""
    for line in text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_count"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _interval_s(url: str) -> float:
    """The scrape interval for this machine: STEPS_PER_INTERVAL steps at its measured step rate."""
    def scrape():
        with urllib.request.urlopen(url, timeout=10) as r:
            return time.monotonic(), _steps_done(r.read().decode())
    t0, n0 = scrape()
    t1, n1 = t0, n0
    while n1 - n0 < 2 * STEPS_PER_INTERVAL and t1 - t0 < 60:
        time.sleep(0.5)
        t1, n1 = scrape()
    rate = (n1 - n0) / (t1 - t0)
    return max(INTERVAL_S, STEPS_PER_INTERVAL / rate) if rate > 0 else 10.0


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


def _measured(pairs: list[tuple[float, str]]) -> dict:
    """What the scrapes so far hold: intervals with ITL, with counted prompt work, without any."""
    st = read_scrapes(pairs, instance="live").steps
    itl = st["itl_count"].fillna(0) > 0
    work = st["prefill_tokens"].fillna(0) > 0
    return {"intervals": len(st), "itl": int(itl.sum()), "work": int((itl & work).sum()),
            "quiet": int((itl & ~work).sum())}


def _enough(m: dict) -> bool:
    return m["itl"] >= MIN_ITL_INTERVALS and m["work"] >= MIN_WORK_INTERVALS and m["quiet"] >= MIN_QUIET_INTERVALS


def _scrape_until_measured(url: str, proc: subprocess.Popen, out_dir) -> tuple[int, dict]:
    """Scrape ``url`` every :func:`_interval_s` into ``out_dir/<unix_time>.prom`` until :func:`_enough` (or the
    cap, or the run's exit); (scrapes written, what they measured)."""
    out_dir.mkdir()
    interval_s = _interval_s(url)
    pairs: list[tuple[float, str]] = []
    t_first = time.monotonic()
    m = {"intervals": 0, "itl": 0, "work": 0, "quiet": 0}
    while time.monotonic() - t_first < HARD_CAP_S and proc.poll() is None:
        wait = t_first + len(pairs) * interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        t = time.time()
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        pairs.append((t, text))
        (out_dir / f"{t:.3f}.prom").write_text(text)
        if len(pairs) % 10 == 0:  # every 10 scrapes: re-read what is measured so far
            m = _measured(pairs)
            if _enough(m):
                break
    return len(pairs), m


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
    proc = subprocess.Popen([sys.executable, "-m", "mixdiag", "run", "--scenario", str(sc), "--metrics-dialect",
                             "vllm", "--serve", str(port), "--no-nvtx", "--out", str(tmp_path / "run")],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log)
    try:
        first = _wait_for_metrics(url, proc)
        assert "vllm:generation_tokens_total" in first and "mixdiag_" not in first
        # the live path itself: analyze samples the URL (3 scrapes, 2 intervals) and diagnoses them
        out = io.StringIO()
        with redirect_stdout(out):
            rc = cli_main(["analyze", url, "--duration", "1", "--interval", str(INTERVAL_S), "--json"])
        assert rc == 0 and json.loads(out.getvalue())["steps"]["intervals"] == 2
        n, measured = _scrape_until_measured(url, proc, tmp_path / "scrapes")
    finally:
        proc.kill()
        proc.wait(30)
        log.close()
    assert _enough(measured), (f"the engine did not produce what the test needs within {HARD_CAP_S:.0f} s "
                               f"(or exited: rc {proc.returncode}): {measured} in {n} scrapes")
    out = io.StringIO()
    with redirect_stdout(out):
        rc = cli_main(["analyze", str(tmp_path / "scrapes"), "--json"])
    assert rc == 0
    doc = json.loads(out.getvalue())
    assert doc["steps"]["intervals"] == n - 1
    assert len(seen) == 2
    steps = seen[-1].steps
    assert "prefill_work_tokens" in steps.columns  # the dialect exposes request_prefill_time_seconds
    work = {(r.instance, int(r.step)): (float(r.prefill_tokens or 0), float(r.prefill_work_tokens or 0))
            for r in steps.itertuples()}
    spikes = doc["spikes"]
    causes = [s["cause"] for s in spikes]
    named = {c: causes.count(c) for c in set(causes)}
    why = (named, doc["verdict"], [(s["step"], round(s["itl_s"], 3), round(s["baseline_s"], 3), s["cause"],
                                     work.get((s["instance"], s["step"]))) for s in spikes],
           {k: v.get("prefill_itl_relation") for k, v in doc["instances"].items()})
    # how many intervals spike is the machine's timing, not the product's (a fresh clone's busy run had
    # 2 mixing spikes where three runs before had >= 3): the claims are conditioned on what the scrapes
    # themselves show - the spikes that fell on intervals where vLLM counted prompt work
    on_work = [s for s in spikes if work.get((s["instance"], s["step"]), (0.0, 0.0))[0] > 0]
    assert on_work, why  # a 512-token chunk costs >= 8 decode steps: some such interval stands out
    # most of those are named mixing (a chunk beside 32 decodes is the only slow thing the engine does)
    assert sum(1 for s in on_work if s["cause"] == "mixing") * 3 >= 2 * len(on_work), why
    # mixing is the cause named most, and nothing the run did not do (no preemption, transfer, ...)
    assert max(named, key=named.get) == "mixing", why
    assert set(named) <= {"mixing", "unknown"}, named
    # every mixing spike falls on an interval with prefill work: prompt tokens vLLM counted there, or
    # spread back over their prefill time into it (the chunk intervals before the first token)
    mixing = [work.get((s["instance"], s["step"]), (0.0, 0.0)) for s in spikes if s["cause"] == "mixing"]
    assert all(pre > 0 or spread > 0 for pre, spread in mixing), why
    assert "mixed batching" in doc["verdict"]
