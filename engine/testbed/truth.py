"""Ground truth: which cause shaped each step's latency, recorded while the engine runs.

:class:`TruthRecorder` hooks an engine (``before_step`` + an observer) and, with the
:class:`~.faults.FaultInjector`'s state, writes ``truth.csv`` rows ``instance,step,cause``
(causes from docs/contracts.md §1). A step shaped by several causes gets one row per cause.
Rules, per step ``n``:

* ``host_stall``     a stall was injected right before step ``n`` (the gap, not the step, is long);
* ``kv_pressure``    the step preempted requests, or recomputes the prompt of a preempted one;
* ``pd_transfer``    the step received/installed PD KV bytes;
* ``ep_hotspot``     the step ran inside an EP hotspot window (router skewed to one rank);
* ``graph_fallback`` a graph-miss fault is on and a decode-only step did not get a FULL graph;
* ``prefill_stall``  a prefill-only step while decoding requests were running (they sat out);
* ``mixing``         a mixed step whose prefill tokens are a real prefill chunk (not only the
                     1-token EXTEND of PD requests installed in that step).

Only evaluation (tests, benchmarks) reads ``truth.csv``; diagnosis never does.
"""
from __future__ import annotations

import csv
from pathlib import Path

from mixdiag.causes import CAUSES

COLUMNS = ("instance", "step", "cause")


class TruthRecorder:
    """Collects ground-truth rows for one engine; attach before the first step."""

    def __init__(self, engine, injector=None):
        self.engine = engine
        self.injector = injector
        self.instance = engine.config.instance
        self.rows: list[tuple[str, int, str]] = []
        self._decoding_before = 0
        engine.before_step.append(self._before)
        engine.observers.append(self._after)

    def _before(self, step: int) -> None:
        sched = self.engine.scheduler
        self._decoding_before = sum(1 for r in sched.running if r.is_decode)

    def _after(self, rec) -> None:
        causes = self.causes(rec)
        self.rows.extend((self.instance, rec.step, c) for c in causes)

    def causes(self, rec) -> list[str]:
        """The causes that shaped step ``rec`` (possibly none)."""
        out = []
        inj = self.injector
        faults = inj.faults if inj is not None else None
        state = inj.state if inj is not None else None
        if state is not None and rec.step in state.stalled_steps:
            out.append("host_stall")
        if rec.preempted_reqs > 0 or self._recomputes(rec):
            out.append("kv_pressure")
        if rec.kv_transfer_bytes > 0:
            out.append("pd_transfer")
        if state is not None and rec.step in state.ep_steps and rec.kind != "idle":
            out.append("ep_hotspot")
        if faults is not None and faults.graph_miss is not None and rec.kind == "decode" and rec.graph_mode != "FULL":
            out.append("graph_fallback")
        if rec.kind == "prefill" and self._decoding_before > 0:
            out.append("prefill_stall")
        if rec.kind == "mixed" and self._local_prefill_tokens(rec) > 0:
            out.append("mixing")
        return out

    def _recomputes(self, rec) -> bool:
        reqs = self.engine.scheduler.requests
        for rid, n in rec.num_scheduled_tokens.items():
            req = reqs.get(rid) or self._finished(rid)
            if req is not None and req.num_preemptions > 0 and n > 1 + self.engine.config.scheduler.num_spec_tokens:
                return True
        return False

    def _finished(self, rid):
        try:
            return self.engine.request(rid)
        except KeyError:
            return None

    def _local_prefill_tokens(self, rec) -> int:
        """Prefill tokens of the step minus the 1-token EXTENDs of PD requests installed in it."""
        pd = getattr(self.injector, "pd", None) if self.injector is not None else None
        installed = set(pd.installed_last_step) if pd is not None else set()
        extend = sum(rec.num_scheduled_tokens.get(r, 0) for r in installed)
        return rec.prefill_tokens - extend

    def causes_named(self) -> set[str]:
        return {c for _, _, c in self.rows}


def write_truth(path: str | Path, rows, overwrite: bool = False) -> Path:
    """Write ``rows`` (instance, step, cause) as ``truth.csv``; refuses to replace a file unless told."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise FileExistsError(f"{p} exists; choose another directory")
    rows = list(rows)
    for r in rows:
        if r[2] not in CAUSES:
            raise ValueError(f"truth cause {r[2]!r} is not one of {', '.join(CAUSES)}")
    rows.sort(key=lambda r: (r[0], int(r[1]), CAUSES.index(r[2])))
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(rows)
    return p


def read_truth(path: str | Path) -> list[tuple[str, int, str]]:
    """Rows of a ``truth.csv`` (for tests and benchmarks only)."""
    with Path(path).open(newline="") as f:
        r = csv.reader(f)
        header = next(r, None)
        if tuple(header or ()) != COLUMNS:
            raise ValueError(f"{path}: expected header {','.join(COLUMNS)}, got {header}")
        return [(a, int(b), c) for a, b, c in r]
