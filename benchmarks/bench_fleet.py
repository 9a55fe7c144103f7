"""Fleet scale: a real Prometheus holding N vLLM instances x 15 min at a 15 s step, analysed by mixdiag.

Backfills the TSDB with ``promtool tsdb create-blocks-from openmetrics`` (vLLM names, formats.md
§1.1), starts ``prometheus`` on 127.0.0.1, then measures

* a bare fetch-and-parse of the same raw series over the window (``query_range`` + JSON),
* ``mixdiag analyze http://127.0.0.1:PORT/?start=..&end=..&step=15 --json`` in a child process
  (wall time; peak RSS as the child reports it from ``getrusage``: the largest of it and its diagnosis
  workers - read inside the child, because this process's RUSAGE_CHILDREN also holds promtool's
  backfill; ``--jobs`` is passed through, default the CPU count),

each ``--repeat`` times (default 2), the best run counting for both (the load average is printed:
on a shared machine one run can take twice as long as the next; the client-side CPU seconds of
both are printed too),

and prints the ratio (target <= 3x), absolute time (<= 15 s at 500) and RSS (<= 1 GB at 500, <= 4 GB at
2000 instances: issue 23), and what the regime stage (healthy reference, episodes, decomposition of the
excess by cause - it runs inside analyze, after the workers) found. One instance
in ``--burst-every`` carries prefill bursts (4096 prompt tokens, ITL 60 ms instead of 20 ms) every
5th step; the verdicts per instance group are printed. Usage::

    .venv/bin/python benchmarks/bench_fleet.py --instances 500
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ITL_LE = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
STEP_S = 15
#: vLLM V1 ``iteration_tokens_total`` buckets (formats.md §1.1).
ITER_LE = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
RUNNING = 32


def openmetrics(path: Path, n_inst: int, t0: int, points: int, burst_every: int, seed: int = 0) -> int:
    """Write the fleet as OpenMetrics; returns the number of samples."""
    rng = random.Random(seed)
    fams: dict[str, list[str]] = {k: [] for k in ("prompt", "gen", "pre", "run", "wait", "bkt", "sum", "cnt", "it")}
    n = 0
    for i in range(n_inst):
        lab = f'instance="vllm-{i:04d}:8000",job="vllm",engine="0",model_name="m"'
        burst = burst_every > 0 and i % burst_every == 0
        prompt = gen = pre = itl_sum = cnt = it_total = 0.0
        bkt = [0.0] * len(ITL_LE)
        it = [0.0] * len(ITER_LE)
        for k in range(points):
            t = t0 + k * STEP_S
            if k:
                slow = burst and k % 5 == 0
                outs = 1500 + rng.randint(-50, 50)
                prompt += 4096 * 6 if slow else 200 + rng.randint(0, 50)
                gen += outs
                itl = (0.06 if slow else 0.02) * (1 + rng.uniform(-0.05, 0.05))
                itl_sum += outs * itl
                cnt += outs
                for b, le in enumerate(ITL_LE):
                    if itl <= le:
                        bkt[b] += outs
                # iterations: decode batches of RUNNING tokens; the new prompts ride in some of them
                # (one small chunk per step, or six 4096-token chunks in a burst)
                chunks = [RUNNING + 4096] * 6 if slow else [RUNNING + 200]
                sizes = [RUNNING] * (outs // RUNNING - len(chunks)) + chunks
                for b, le in enumerate(ITER_LE):
                    it[b] += sum(1 for x in sizes if x <= le)
                it_total = it_total + len(sizes)
            fams["prompt"].append(f"vllm:prompt_tokens_total{{{lab}}} {prompt} {t}")
            fams["gen"].append(f"vllm:generation_tokens_total{{{lab}}} {gen} {t}")
            fams["pre"].append(f"vllm:num_preemptions_total{{{lab}}} {pre} {t}")
            fams["run"].append(f"vllm:num_requests_running{{{lab}}} {32 + rng.randint(-2, 2)} {t}")
            fams["wait"].append(f"vllm:num_requests_waiting{{{lab}}} {rng.randint(0, 3)} {t}")
            for b, le in enumerate(ITL_LE):
                fams["bkt"].append(f'vllm:inter_token_latency_seconds_bucket{{{lab},le="{le}"}} {bkt[b]} {t}')
            fams["bkt"].append(f'vllm:inter_token_latency_seconds_bucket{{{lab},le="+Inf"}} {cnt} {t}')
            fams["sum"].append(f"vllm:inter_token_latency_seconds_sum{{{lab}}} {itl_sum} {t}")
            for b, le in enumerate(ITER_LE):
                fams["it"].append(f'vllm:iteration_tokens_total_bucket{{{lab},le="{le}.0"}} {it[b]} {t}')
            fams["it"].append(f'vllm:iteration_tokens_total_bucket{{{lab},le="+Inf"}} {it_total} {t}')
            fams["it"].append(f"vllm:iteration_tokens_total_count{{{lab}}} {it_total} {t}")
            fams["cnt"].append(f"vllm:inter_token_latency_seconds_count{{{lab}}} {cnt} {t}")
            n += 5 + len(ITL_LE) + 3 + len(ITER_LE) + 2
    head = {"prompt": ("vllm:prompt_tokens", "counter"), "gen": ("vllm:generation_tokens", "counter"),
            "pre": ("vllm:num_preemptions", "counter"), "run": ("vllm:num_requests_running", "gauge"),
            "wait": ("vllm:num_requests_waiting", "gauge")}
    with open(path, "w") as f:
        for key, (name, typ) in head.items():
            f.write(f"# TYPE {name} {typ}\n")
            f.write("\n".join(fams[key]) + "\n")
        f.write("# TYPE vllm:inter_token_latency_seconds histogram\n")
        for key in ("bkt", "sum", "cnt"):
            f.write("\n".join(fams[key]) + "\n")
        f.write("# TYPE vllm:iteration_tokens_total histogram\n")
        f.write("\n".join(fams["it"]) + "\n")
        f.write("# EOF\n")
    return n


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"prometheus at {url} not ready after {timeout_s} s")


def bare_fetch(url: str, start: float, end: float) -> tuple[float, int, float]:
    """Fetch and JSON-parse every raw vLLM series over the window: the floor any reader pays.
    Returns wall seconds, samples, and this process's CPU seconds."""
    t, c = time.perf_counter(), time.process_time()
    body = urllib.parse.urlencode({"query": '{__name__=~"vllm:.*"}', "start": start, "end": end,
                                   "step": STEP_S}).encode()
    with urllib.request.urlopen(url + "/api/v1/query_range", data=body, timeout=300) as r:
        doc = json.loads(r.read())
    n = sum(len(s["values"]) for s in doc["data"]["result"])
    return time.perf_counter() - t, n, time.process_time() - c


#: runs the CLI as ``python -m mixdiag.cli`` does, then reports its own peak RSS and its workers' on stderr
_RSS_WRAPPER = ("import resource, sys\n"
                "from mixdiag.cli import main\n"
                "try:\n"
                "    rc = main(sys.argv[1:])\n"
                "finally:\n"
                "    kb = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))\n"
                "    sys.stderr.write(f'\\nMAXRSS_KB {kb}\\n')\n"
                "sys.exit(rc)\n")


def _child_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=500)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--burst-every", type=int, default=10, help="every N-th instance carries prefill bursts")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--jobs", type=int, default=None, help="analyze --jobs (default: its default, the CPU count)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of the bare fetch and of analyze; the best counts")
    a = ap.parse_args(argv)
    for b in ("prometheus", "promtool"):
        if shutil.which(b) is None:
            raise SystemExit(f"{b} not found: run 'bash scripts/setup_system.sh' (Debian package prometheus)")
    work = Path(tempfile.mkdtemp(prefix="bench_fleet_"))
    points = int(a.minutes * 60 / STEP_S) + 1
    t0 = (int(time.time()) - 3 * 3600) // STEP_S * STEP_S  # old enough to be a persisted block
    tic = time.perf_counter()
    n = openmetrics(work / "fleet.om", a.instances, t0, points, a.burst_every)
    gen_s = time.perf_counter() - tic
    tic = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(work / "fleet.om"),
                    str(work / "tsdb")], check=True, capture_output=True)
    print(f"backfill: {a.instances} instances x {points} points, {n} samples "
          f"(generate {gen_s:.1f} s, promtool {time.perf_counter() - tic:.1f} s)")
    (work / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=30d", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url)
        start, end = t0, t0 + (points - 1) * STEP_S
        bare = [bare_fetch(url, start, end) for _ in range(a.repeat)]
        bare_s, n_bare, bare_cpu = min(bare)
        cmd = [sys.executable, "-c", _RSS_WRAPPER, "analyze", f"{url}/?start={start}&end={end}&step={STEP_S}",
               "--json"] + (["--jobs", str(a.jobs)] if a.jobs else [])
        times, cpus, rss = [], [], []
        for _ in range(a.repeat):  # best of N, as the bare fetch: the machine may be shared
            tic, cpu = time.perf_counter(), _child_cpu_s()
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            times.append(time.perf_counter() - tic)
            cpus.append(_child_cpu_s() - cpu)  # the analyze process and its diagnosis workers
            rss += [int(x.split()[1]) for x in out.stderr.splitlines() if x.startswith("MAXRSS_KB ")]
            if out.returncode != 0:
                print(out.stderr[-2000:])
                return 1
        an_s = min(times)
        rss_gb = max(rss) / 2**20 if rss else float("nan")
        from mixdiag.collectors.prometheus import server_reader  # after the child: its RSS is measured alone

        tic = time.perf_counter()
        tl = server_reader.read(f"{url}/?start={start}&end={end}&step={STEP_S}")
        read_s = time.perf_counter() - tic
        print(f"bare fetch+parse: {bare_s:.2f} s ({n_bare} samples)")
        print(f"collector read (PromQL aggregation): {read_s:.2f} s, {len(tl.steps)} interval rows; "
              f"the rest of analyze is start-up and diagnosis")
        print(f"analyze: {an_s:.2f} s (runs: {', '.join(f'{x:.2f}' for x in times)}; load {os.getloadavg()[0]:.1f}) "
              f"= {an_s / bare_s:.2f}x bare (target <= 3x); "
              + (f"target <= 15 s at 500: {'ok' if an_s <= 15 else 'MISSED'}" if a.instances <= 500 else ""))
        print(f"CPU (client side, Prometheus' own not counted): analyze {min(cpus):.2f} s, bare fetch "
              f"{bare_cpu:.2f} s = {min(cpus) / bare_cpu:.2f}x (less sensitive to other load than wall time)")
        rss_target = 1.0 if a.instances <= 500 else 4.0
        print(f"peak RSS of the analyze process: {rss_gb:.2f} GB (target <= {rss_target:g} GB at "
              f"{'500' if a.instances <= 500 else '2000'} instances: {'ok' if rss_gb <= rss_target else 'MISSED'})")
        report(json.loads(out.stdout), a.burst_every)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 0


def report(doc: dict, burst_every: int) -> None:
    """Spikes by cause on burst and steady instances."""
    spikes = doc.get("spikes") or []
    by: dict[str, dict[str, int]] = {"burst": {}, "steady": {}}
    for s in spikes:
        inst = str(s.get("instance", ""))
        i = int(inst.split("-")[1].split(":")[0]) if inst.startswith("vllm-") else -1
        grp = "burst" if burst_every > 0 and i % burst_every == 0 else "steady"
        cause = s.get("cause", "?")
        by[grp][cause] = by[grp].get(cause, 0) + 1
    verdict = str(doc.get("verdict"))
    print(f"verdict ({len(verdict)} characters): {verdict[:300]}{' ...' if len(verdict) > 300 else ''}")
    reg = doc.get("regimes") or {}
    sat = sum(1 for s in (reg.get("saturation") or {}).values() if s.get("saturated"))
    print(f"regime stage: reference for {len(reg.get('reference') or {})} instances, {sat} saturated, "
          f"{len(reg.get('episodes') or [])} episodes, excess shares {(reg.get('excess') or {}).get('shares')}")
    for grp, causes in by.items():
        print(f"spikes on {grp} instances: " + (", ".join(f"{c} {n}" for c, n in sorted(causes.items())) or "none"))


if __name__ == "__main__":
    sys.exit(main())
