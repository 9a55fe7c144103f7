"""The whole live loop of docs/serving.md's recipe: load -> server -> /metrics -> ``mixdiag watch`` naming mixing.

The server (uvicorn thread, the mixing engine of test_client_fusion) takes chat streams plus long
prompts from ``mixdiag load`` while ``mixdiag watch --engine URL/metrics`` (a real subprocess, as a
user runs it in a second terminal) polls every second; its final JSON must count mixing spikes.
"""
from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import urllib.request

from helpers.polling import wait_until
from helpers.prometheus_server import free_port
from mixdiag.loadgen import Dist, LoadConfig, run_load

_MIXING = re.compile(r'^mixdiag_spikes_total\{[^}]*cause="mixing"[^}]*\}\s+([0-9.eE+-]+)', re.M)


def _mixing_counted(port: int) -> bool:
    """The watcher's own /metrics counts at least one mixing spike."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            m = _MIXING.search(r.read().decode())
    except OSError:
        return False
    return bool(m) and float(m.group(1)) >= 1


def test_watch_names_mixing_live_on_a_loaded_server(tmp_path, mixing_server):
    url, server, th = mixing_server(tmp_path, dialect="mixdiag")
    cfgs = [LoadConfig(url=url, rate=6.0, duration_s=7.0, prompt_len=Dist.parse("uniform:32:96"),
                       output_len=Dist("fixed", 60), seed=1, id_prefix="chat"),
            LoadConfig(url=url, rate=1.0, duration_s=7.0, prompt_len=Dist("fixed", 1536), output_len=Dist("fixed", 4),
                       seed=2, arrival="constant", id_prefix="long")]
    summaries: list = []

    def drive():
        async def both():
            return await asyncio.gather(*(run_load(c, lambda r: None) for c in cfgs))
        summaries.extend(asyncio.run(both()))

    # the watcher first (a busy machine may take seconds to import it), the load once it follows. No poll
    # count: the watcher runs until the load has finished and its own /metrics has counted a mixing spike
    # (what this test measures), however long a busy machine takes; then Ctrl+C ends it as a user would.
    port = free_port()
    watch = subprocess.Popen([sys.executable, "-m", "mixdiag", "watch", "--engine", url + "/metrics", "--interval",
                              "1", "--window", "60", "--host", "127.0.0.1", "--port", str(port), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             # a suite started in the background (`make test &`, CI) inherits SIGINT ignored, and
                             # Python then installs no Ctrl+C handler: give the watcher the default back
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    load = threading.Thread(target=drive, daemon=True)
    try:
        first = watch.stderr.readline()
        assert "serving" in first or "following" in first, first
        load.start()
        load.join(300)
        assert not load.is_alive(), "the load did not finish in 300 s"
        # a hang guard, not a timing assertion: the last long prompts' interval must reach a diagnosis
        wait_until(lambda: _mixing_counted(port) or watch.poll() is not None, timeout=240, every=0.5)
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=120)
    finally:
        if watch.poll() is None:
            watch.kill()
        if load.is_alive() or load.ident:
            load.join(60)
        server.should_exit = True
        th.join(30)
    assert watch.returncode == 0, err[-500:]
    doc = json.loads(out)
    assert doc["diagnoses"] >= 4
    assert doc["spikes_total"].get("mixing", 0) >= 1, doc
    assert max(doc["spikes_total"], key=doc["spikes_total"].get) == "mixing"
    assert "mixed batching" in (doc["verdict"] or "")
    assert all(s["statuses"] == {"ok": s["requests"]} for s in summaries)
