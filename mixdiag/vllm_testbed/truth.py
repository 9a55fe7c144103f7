"""The testbed's truth: ``DIR/truth/faults.csv`` (every injected fault, when it really happened) and
``DIR/truth/iterations.log`` (vLLM's own per-iteration records, stamped with unix time).

Only benchmarks and tests read truth; ``mixdiag analyze`` never does.

``faults.csv`` columns: ``t_start_s,t_end_s,cause,detail`` (unix seconds). Causes are mixdiag's
(``mixing``, ``kv_pressure``, ``host_stall``) where one applies, and plain names otherwise:
``noisy_neighbour`` (a CPU hog slows every step, no idle gap), ``saturation`` (arrivals above what
the server sustains), ``config`` (server knobs drawn for the run).
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from mixdiag.vllm_testbed.injectors import TruthRow

FAULTS_HEADER = ("t_start_s", "t_end_s", "cause", "detail")

# "<unix> Engine 000: Iteration(12): 1 context requests, 506 context tokens, 6 generation requests,
#  6 generation tokens, iteration elapsed time: 87.04 ms[ (dummy)], CPU KV cache usage: 0.8%"
_ITER = re.compile(
    r"^(?P<t>\d+\.\d+) (?:Engine (?P<engine>\d+): )?Iteration\((?P<n>\d+)\): (?P<ctx_reqs>\d+) context requests, "
    r"(?P<ctx_tok>\d+) context tokens, (?P<gen_reqs>\d+) generation requests, (?P<gen_tok>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[\d.]+) ms(?P<dummy> \(dummy\))?, (?P<dev>\w+) KV cache usage: (?P<kv>[\d.]+)%")


@dataclass(frozen=True)
class Iteration:
    """One engine iteration as vLLM logged it. ``t_s`` is when the API server logged it (after the
    step ended and its outputs crossed to the front end); ``elapsed_s`` is measured in the EngineCore."""

    t_s: float
    engine: int
    index: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_s: float
    kv_usage: float
    dummy: bool

    @property
    def mixed(self) -> bool:
        """A step with prompt work and running decodes."""
        return self.context_tokens > 0 and self.generation_requests > 0


def read_iterations(path: Path) -> list[Iteration]:
    """Parse ``iterations.log``; lines of another shape are skipped (none are expected)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _ITER.match(line)
            if not m:
                continue
            out.append(Iteration(float(m["t"]), int(m["engine"] or 0), int(m["n"]), int(m["ctx_reqs"]),
                                 int(m["ctx_tok"]), int(m["gen_reqs"]), int(m["gen_tok"]), float(m["ms"]) / 1e3,
                                 float(m["kv"]) / 100.0, bool(m["dummy"])))
    return out


def long_prompt_rows(records: list[dict], chunk_tokens: int) -> list[TruthRow]:
    """One ``mixing`` row per long prompt that was sent: from its send to its first token (its
    prefill, chunked at ``chunk_tokens`` per step, ran in between)."""
    rows = []
    for r in records:
        if r.get("type") != "request" or r.get("start_s") is None:
            continue
        end = r["start_s"] + r["ttft_s"] if r.get("ttft_s") is not None else r.get("end_s") or r["start_s"]
        rows.append(TruthRow(r["start_s"], end, "mixing",
                             f"prompt_tokens={r.get('prompt_tokens')} chunked at {chunk_tokens} ({r.get('status')})"))
    return rows


def burst_rows(records: list[dict], rate: float, max_concurrency: int) -> list[TruthRow]:
    """One ``saturation`` row per burst: from its first send to the last of its requests' ends."""
    sent = [r for r in records if r.get("type") == "request" and r.get("start_s") is not None]
    if not sent:
        return []
    t0 = min(r["start_s"] for r in sent)
    t1 = max((r.get("end_s") or r["start_s"]) for r in sent)
    return [TruthRow(t0, t1, "saturation", f"{len(sent)} extra requests at {rate:.1f}/s, up to {max_concurrency} open")]


def write_faults(rows: list[TruthRow], path: Path) -> None:
    """Write ``faults.csv`` sorted by start time."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(FAULTS_HEADER)
        for r in sorted(rows, key=lambda r: (r.t_start_s, r.cause)):
            w.writerow([f"{r.t_start_s:.6f}", f"{r.t_end_s:.6f}", r.cause, r.detail])


def read_faults(path: Path) -> list[TruthRow]:
    """Read ``faults.csv`` back."""
    with open(path, newline="", encoding="utf-8") as f:
        rd = csv.DictReader(f)
        if tuple(rd.fieldnames or ()) != FAULTS_HEADER:
            raise ValueError(f"{path}: header {rd.fieldnames} is not {','.join(FAULTS_HEADER)}")
        return [TruthRow(float(r["t_start_s"]), float(r["t_end_s"]), r["cause"], r["detail"]) for r in rd]
