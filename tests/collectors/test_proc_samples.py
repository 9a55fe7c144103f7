"""collectors/host/proc_samples.py: the OS's view of an engine process - stops (state T) and CPU starvation
(schedstat run-queue wait) read from a sampler CSV as timed stand-stills; the sampler itself on a real process;
and a real vLLM 0.32 capture (tests/fixtures/vllm032/host_stop) where the samples make the SIGSTOPs that
nothing vLLM exposes measurable host-stall evidence."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mixdiag.collectors import load
from mixdiag.collectors.host import proc_samples as ps
from mixdiag.diagnosis import diagnose
from mixdiag.errors import UserError
from mixdiag.vllm_testbed.truth import read_faults

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm032" / "host_stop"


def _t(n, dt=0.01):
    return np.arange(n) * dt


@pytest.mark.parametrize("case, state, delay_steps, want", [
    ("a stop of 5 samples: midway to midway", "RRTTTTTRR", [0.0] * 9, [(ps.STOPPED_SERIES, 0.065, 0.05)]),
    ("stopped to the last sample", "RRRTT", [0.0] * 5, [(ps.STOPPED_SERIES, 0.04, 0.015)]),
    ("runnable, off-CPU 9 ms of every 10 ms for 4 gaps (36 ms > one period)", "RRRRRRR",
     [0, 0, 0.009, 0.009, 0.009, 0.009, 0], [(ps.STARVED_SERIES, 0.05, 0.036)]),
    ("a 9 ms wait in one gap: ordinary time-slicing", "RRRR", [0, 0, 0.009, 0], []),
    ("run-queue wait grown by under half of each gap", "RRRRRR", [0, 0.004, 0.004, 0.004, 0.004, 0.004], []),
])
def test_stand_stills_from_samples(case, state, delay_steps, want):
    n = len(state)
    t = _t(n) + 100.0
    got = ps.events(t, np.array(list(state)), np.cumsum(delay_steps))
    marks = [e for e in got if e[2] == 0.0]
    assert [m[1] for m in marks] == [t[0], t[-1]], case   # the sampled span, measured zero
    real = [e for e in got if e[2] > 0]
    assert len(real) == len(want), (case, got)
    for (name, end, dur), (wname, wend, wdur) in zip(real, want):
        assert name == wname and end - 100.0 == pytest.approx(wend) and dur == pytest.approx(wdur), (case, got)


def _csv(tmp_path, rows, name="h.csv"):
    p = tmp_path / name
    p.write_text(",".join(ps.HEADER) + "\n" + "".join(r + "\n" for r in rows))
    return p


def test_reader_counts_what_it_cannot_read_and_refuses_two_processes(tmp_path):
    p = _csv(tmp_path, ["100.00,7,R,1.0,0.5", "100.01,7,T,1.0,0.5", "garbage", "100.02,7,T,1.0,", "100.03,7,R,1.0,0.5"])
    tl = ps.read(str(p))
    src = tl.meta["sources"][0]
    assert src["lines_skipped"] == 1 and tl.meta["partial"]
    stops = tl.series[(tl.series["name"] == ps.STOPPED_SERIES) & (tl.series["value"] > 0)]
    assert stops["value"].tolist() == pytest.approx([0.02])
    assert tl.instances == ["host-pid7"]
    two = _csv(tmp_path, ["100.00,7,R,1.0,0.5", "100.01,8,R,1.0,0.5"], "two.csv")
    with pytest.raises(UserError, match="2 processes"):
        ps.read(str(two))
    assert load(str(p)).meta["source"] == ps.FORMAT   # detected by its header


def test_the_sampler_sees_a_real_sigstop(tmp_path):
    """A busy Python process stopped for 0.3 s: the reader's stop lies within the sampling bounds of the span the
    test measured around SIGSTOP..SIGCONT (no wall-time target: the bounds are the samples' own gaps)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    out, stop = tmp_path / "h.csv", threading.Event()
    th = threading.Thread(target=ps.sample, args=(proc.pid, out), kwargs={"interval_s": 0.005, "stop": stop})
    try:
        th.start()
        time.sleep(0.3)
        t0 = time.time()
        os.kill(proc.pid, signal.SIGSTOP)
        t1 = time.time()
        time.sleep(0.3)
        t2 = time.time()
        os.kill(proc.pid, signal.SIGCONT)
        t3 = time.time()
        time.sleep(0.3)
    finally:
        stop.set()
        th.join(10)
        proc.kill()
        proc.wait(10)
    rows = [r.split(",") for r in out.read_text().splitlines()[1:]]
    t = np.array([float(r[0]) for r in rows])
    stopped = [float(r[0]) for r in rows if r[2] == "T"]
    assert stopped and t0 - 0.001 <= min(stopped) and max(stopped) <= t3 + 0.001
    ev = ps.read(str(out)).series
    got = ev[(ev["name"] == ps.STOPPED_SERIES) & (ev["value"] > 0)]
    assert len(got) == 1
    end, dur = float(got["t_s"].iloc[0]), float(got["value"].iloc[0])
    # the stop began in [t0, t1] and ended in [t2, t3]; the reader places each edge within half a sample gap
    gap = float(np.max(np.diff(t)))
    assert (t2 - t1) - gap <= dur <= (t3 - t0) + gap
    assert t2 - gap <= end <= t3 + gap


def test_sample_host_command(tmp_path):
    """``mixdiag sample-host``: a one-line result, and never an existing file overwritten."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    out = tmp_path / "h.csv"
    try:
        cmd = [sys.executable, "-m", "mixdiag", "sample-host", "--pid", str(proc.pid), "--out", str(out),
               "--duration", "0.2", "--interval", "0.01"]
        r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert '"stops": 0' in r.stdout and out.read_text().startswith(",".join(ps.HEADER))
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert again.returncode != 0 and "exists" in again.stderr and "Traceback" not in again.stderr
    finally:
        proc.kill()
        proc.wait(10)


def test_real_vllm_scrapes_log_and_host_samples_name_the_sigstops():
    """Real vLLM 0.32: the SIGSTOPs of the EngineCore are invisible to scrapes + operator log (vLLM exposes no host
    time); with the host samples beside them, the intervals holding the stops are host_stall, measured by the OS,
    and nothing else is."""
    truth = [r for r in read_faults(FIX / "truth" / "faults.csv") if r.cause == "host_stall"]
    tl = load([str(FIX / "scrapes"), str(FIX / "vllm.log"), str(FIX / "host.csv")])
    # one server: the samples joined the scrapes and the log (no instance of their own)
    assert {i.split("@")[0] for i in tl.instances} == {tl.instances[0].split("@")[0]}
    sp = diagnose(tl).spikes
    hs = sp[sp["cause"] == "host_stall"]
    assert len(hs) == 2 and len(hs) == len(sp)
    for a, b, ev in zip(hs["t_start_s"], hs["t_end_s"], hs["evidence"]):
        assert any(r.t_start_s <= b and a <= r.t_end_s for r in truth)
        assert ev["host_stopped_s"] > 0.15 and "OS saw the engine process" in ev["reason"]
    alone = diagnose(load([str(FIX / "scrapes"), str(FIX / "vllm.log")]))
    assert not (alone.spikes["cause"] == "host_stall").any()
    # the host time the OS measured is a signal the server now has; without the samples it has none
    inst = tl.instances[0]
    assert diagnose(tl).instances[inst]["signals"]["host_time"] == "measured"
    assert alone.instances[inst]["signals"]["host_time"] == "absent"
