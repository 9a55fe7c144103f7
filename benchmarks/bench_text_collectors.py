"""Throughput of the text collectors against a bare scan of the same text.

Builds large inputs by repeating real fixture lines (tests/fixtures/logs) and times each reader
(``read`` into a validated Timeline) next to a bare scan: split the text into lines and run one
regex search per line. The ratio reader/bare says what the honest, by-key parsing costs over
merely touching every line. No targets are set by the issue; this records where we stand.

    python benchmarks/bench_text_collectors.py [--lines N] [--json]
"""
from __future__ import annotations

import argparse
import io
import json
import re
import time
from pathlib import Path

from mixdiag.collectors.prometheus import scrape_reader
from mixdiag.collectors.logs import sglang_log
from mixdiag.collectors.logs import vllm_log

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "logs"


def _body(name: str) -> list[str]:
    return [ln for ln in (FIX / name).read_text().splitlines() if not ln.startswith("# source") and
            not ln.startswith("# note")]


def sglang_text(n: int) -> str:
    base = [ln for ln in _body("sglang_log_22166.txt") + _body("sglang_log_13023.txt") if "batch" in ln]
    out = []
    for i in range(n):
        s = i // 20  # 20 lines a second, time moving forward
        out.append(re.sub(r"^\[[^\]]*\]", f"[2026-04-05 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}]",
                          base[i % len(base)]))
    return "\n".join(out) + "\n"


def vllm_text(n: int) -> str:
    it = _body("vllm_log_31193.txt")[0]
    stats = _body("vllm_log_37307.txt")[0]
    out = []
    for i in range(n):
        s = i // 100
        stamp = f"03-01 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
        line = stats if i % 100 == 99 else it.replace("Iteration(515)", f"Iteration({i})")
        out.append(re.sub(r"\d\d-\d\d \d\d:\d\d:\d\d", stamp, line, count=1))
    return "\n".join(out) + "\n"


def prom_texts(n_lines: int) -> list[tuple[float, str]]:
    one = (FIX / "sglang_metrics_docs.txt").read_text()
    per = one.count("\n")
    return [(float(i), one) for i in range(max(2, n_lines // per))]


def bare(text: str, rx: re.Pattern) -> float:
    t = time.perf_counter()
    hits = 0
    for line in text.split("\n"):
        hits += rx.search(line) is not None
    return time.perf_counter() - t


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000, help="lines per input (default 100000)")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = ap.parse_args()
    n = args.lines
    results = {}
    sg, vl = sglang_text(n), vllm_text(n)
    scrapes = prom_texts(n)
    joined = "".join(t for _, t in scrapes)
    cases = [
        ("sglang-log", sg, lambda: sglang_log.read(io.StringIO(sg), instance="b"), re.compile(r"(Prefill|Decode) batch")),
        ("vllm-log", vl, lambda: vllm_log.read(io.StringIO(vl), instance="b", year=2026), re.compile(r"Iteration\(")),
        ("prom-text scrapes", joined, lambda: scrape_reader.read_scrapes(scrapes, instance="b"), re.compile(r"^\w")),
    ]
    for name, text, run, rx in cases:
        lines = text.count("\n")
        t_read = timed(run)
        t_bare = bare(text, rx)
        results[name] = {"lines": lines, "read_s": round(t_read, 3), "lines_per_s": round(lines / t_read),
                         "bare_scan_s": round(t_bare, 4), "ratio_to_bare": round(t_read / t_bare, 1)}
        print(f"{name:18s} {lines:>8d} lines  read {t_read:7.2f} s  {lines / t_read:>9,.0f} lines/s  "
              f"bare scan {t_bare:6.3f} s  ratio {t_read / t_bare:5.1f}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
