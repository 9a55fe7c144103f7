"""What instrumentation costs a decode step: everything on vs everything off, interleaved in one run.

One engine, 32 requests decoding (batch 32, ``ignore_eos``); after warm-up, steps alternate
between the two arms (ABBA order, so neither arm always runs first):

  on   NVTX tracer (no tool attached: the cheap path a production run takes), SM-activity
       estimate, Prometheus metrics, vLLM + SGLang log lines to a file, ``/metrics`` served on
       127.0.0.1 and scraped by a client thread every 0.5 s, timed scrapes to disk every 1 s;
  off  the engine's NullTracer and no observers.

The server, scrape client and scrape writer stay up through both arms (they are background
threads whose cost per scrape does not depend on the arm). Only ``engine.step()`` is timed.
Prints the median step time of each arm and their ratio (target <= 1.02), the median of per-pair
ratios, the same ratio on engine-thread CPU time (with one torch thread the whole step runs on the
calling thread; time spent waiting for a core shared with other processes does not count), and a
direct measure that other processes' noise cannot swamp: time spent inside the
observers (timed in the on arm) plus ranges per step x the cost of one range, over the off
median. ``--json`` ends with one JSON line.

    .venv/bin/python benchmarks/bench_instrumentation.py [--pairs 300] [--batch 32] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

from mixdiag.engine.config import EngineConfig
from mixdiag.engine.core.engine import Engine
from mixdiag.engine.hooks import NULL_TRACER, RecordingTracer
from mixdiag.engine.telemetry.instrumentation import Instrumentation, InstrumentationConfig
from mixdiag.engine.core.request import SamplingParams

TARGET = 1.02


def note(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def decode_engine(batch: int, steps: int, threads: int) -> Engine:
    """An engine whose next ``steps`` steps are pure decode steps of ``batch`` requests."""
    eng = Engine(EngineConfig(num_threads=threads))
    for i in range(batch):
        eng.add_request([2 + (i * 7 + j) % 500 for j in range(16)], SamplingParams(max_tokens=steps + 64, ignore_eos=True))
    while True:  # prefill (and mixed) steps until every request decodes
        rec = eng.step()
        if rec.kind == "decode" and rec.decode_reqs == batch:
            return eng


def scrape_client(url: str, stop: threading.Event, every_s: float = 0.5) -> None:
    while not stop.wait(every_s):
        with urllib.request.urlopen(url, timeout=5) as r:
            r.read()


def tracer_cost(tracer, reps: int = 2000) -> tuple[int, float]:
    """(ranges one decode step opens, seconds per range) for ``tracer`` with no profiler attached."""
    counter = RecordingTracer()
    eng = Engine(EngineConfig(num_threads=1))
    eng.add_request([2, 3, 4, 5], SamplingParams(max_tokens=3, ignore_eos=True))
    eng.step()
    eng.tracer = counter
    eng.step()  # a decode step: count what it opens
    n = len(counter.ranges)
    t0 = time.perf_counter()
    for _ in range(reps):
        with tracer.range("step", "step 1 kind=decode prefill_tokens=0 decode_reqs=32 decode_rows=32 graph=FULL", 32):
            pass
    return n, (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=300, help="on/off step pairs measured (default 300)")
    ap.add_argument("--warmup", type=int, default=30, help="decode steps before measuring (default 30)")
    ap.add_argument("--batch", type=int, default=32, help="decode batch size (default 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steady on shared cores)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)

    eng = decode_engine(args.batch, args.warmup + 2 * args.pairs + 8, args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        cfg = InstrumentationConfig(serve_port=0, log_formats=("vllm", "sglang"), scrape_interval_s=1.0)
        inst = Instrumentation(cfg, eng, tmp)
        obs_s: list[float] = []  # time inside the instrumentation observers, per on-arm step
        mine = list(eng.observers)

        def timed_observers(rec) -> None:
            t0 = time.perf_counter()
            for o in mine:
                o(rec)
            obs_s.append(time.perf_counter() - t0)

        on_obs, on_tracer = [timed_observers], eng.tracer
        stop = threading.Event()
        client = threading.Thread(target=scrape_client, args=(inst.server.url, stop), daemon=True)
        client.start()

        def arm(on: bool) -> None:
            eng.observers[:] = on_obs if on else []
            eng.tracer = on_tracer if on else NULL_TRACER

        def timed(on: bool) -> float:
            arm(on)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            rec = eng.step()
            dt = time.perf_counter() - t0
            (on_cpu if on else off_cpu).append(time.thread_time() - c0)
            if rec.kind != "decode" or rec.decode_reqs != args.batch:
                raise RuntimeError(f"step {rec.step} is {rec.kind} with {rec.decode_reqs} decodes, not batch {args.batch}")
            return dt

        on_cpu, off_cpu = [], []  # engine-thread CPU time of each step (1 torch thread: the whole step)
        for i in range(args.warmup):
            timed(i % 2 == 0)
        on_s, off_s = [], []
        del on_cpu[:], off_cpu[:]
        note(f"measuring {args.pairs} interleaved on/off decode-step pairs at batch {args.batch} ...")
        for i in range(args.pairs):
            order = (True, False) if i % 2 == 0 else (False, True)
            for on in order:
                (on_s if on else off_s).append(timed(on))
        stop.set()
        client.join(timeout=5)
        arm(True)
        summary = inst.close()

    ranges, range_s = tracer_cost(on_tracer)
    direct_s = statistics.median(obs_s) + ranges * range_s
    med_on, med_off = statistics.median(on_s), statistics.median(off_s)
    pair_ratio = statistics.median(a / b for a, b in zip(on_s, off_s))
    ratio = med_on / med_off
    overhead = statistics.median(a - b for a, b in zip(on_s, off_s))
    cpu_on, cpu_off = statistics.median(on_cpu), statistics.median(off_cpu)
    cpu_ratio = cpu_on / cpu_off
    result = {"bench": "instrumentation", "batch": args.batch, "pairs": args.pairs, "threads": args.threads,
              "on_median_ms": round(med_on * 1e3, 4), "off_median_ms": round(med_off * 1e3, 4),
              "on_mean_ms": round(statistics.fmean(on_s) * 1e3, 4), "off_mean_ms": round(statistics.fmean(off_s) * 1e3, 4),
              "overhead_median_us": round(overhead * 1e6, 1), "ratio": round(ratio, 4), "pair_ratio_median": round(pair_ratio, 4), "target": TARGET,
              "pass": ratio <= TARGET,
              "cpu_on_median_ms": round(cpu_on * 1e3, 4), "cpu_off_median_ms": round(cpu_off * 1e3, 4),
              "cpu_ratio": round(cpu_ratio, 4), "cpu_pass": cpu_ratio <= TARGET,
              "observers_median_us": round(statistics.median(obs_s) * 1e6, 1), "ranges_per_step": ranges,
              "range_cost_us": round(range_s * 1e6, 3), "direct_cost_us": round(direct_s * 1e6, 1),
              "direct_ratio": round((med_off + direct_s) / med_off, 4), "log_lines": summary.get("log_lines"), "scrapes": summary.get("scrapes")}
    print(f"decode step, batch {args.batch}: instrumentation on {result['on_median_ms']:.3f} ms, "
          f"off {result['off_median_ms']:.3f} ms (medians of {args.pairs} interleaved steps each)")
    print(f"median per-pair cost of instrumentation: {overhead * 1e6:.1f} us per step")
    print(f"ratio on/off = {ratio:.4f} (median of per-pair ratios {pair_ratio:.4f}); target <= {TARGET} -> "
          f"{'PASS' if result['pass'] else 'FAIL'}")
    print(f"engine-thread CPU time per step: on {cpu_on * 1e3:.3f} ms, off {cpu_off * 1e3:.3f} ms -> ratio "
          f"{cpu_ratio:.4f} ({'PASS' if cpu_ratio <= TARGET else 'FAIL'}; waiting for a core does not count)")
    print(f"direct cost: observers {result['observers_median_us']:.1f} us + {ranges} ranges x "
          f"{result['range_cost_us']:.2f} us = {result['direct_cost_us']:.1f} us per step -> "
          f"(off + direct) / off = {result['direct_ratio']:.4f}  (robust to noise from other processes)")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
