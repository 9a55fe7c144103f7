"""The whole live loop of docs/serving.md's recipe: load -> server -> /metrics -> ``mixdiag watch`` naming mixing.

The server (uvicorn thread, the mixing engine of test_client_fusion) takes chat streams plus long
prompts from ``mixdiag load`` while ``mixdiag watch --engine URL/metrics`` (a real subprocess, as a
user runs it in a second terminal) polls every second; its final JSON must count mixing spikes.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

from mixdiag.loadgen import Dist, LoadConfig, run_load


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

    # the watcher first (a busy machine may take seconds to import it), the load once it follows
    watch = subprocess.Popen([sys.executable, "-m", "mixdiag", "watch", "--engine", url + "/metrics", "--interval",
                              "1", "--window", "30", "--count", "8", "--no-serve", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    load = threading.Thread(target=drive, daemon=True)
    try:
        first = watch.stderr.readline()
        assert "following" in first, first
        load.start()
        out, err = watch.communicate(timeout=90)
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
