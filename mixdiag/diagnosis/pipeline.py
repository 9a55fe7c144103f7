"""``diagnose(timeline) -> Diagnosis``: detect TPOT spikes, line up the signals, attribute each
spike to a cause with evidence and confidence (docs/contracts.md section 5).

Works with whatever the Timeline holds, per instance:

* step rows with token events (per-step records): ITL charged to culprit steps;
* step rows only (a profiler trace, engine log lines): step-to-step latency, or the step's own
  duration when the step clock is too coarse to give gaps (log timestamps in whole seconds);
* interval rows only (Prometheus scrapes, periodic stats lines): ITL P99 against the P50 baseline.

Missing signals are listed per spike and lower the confidence; nothing is guessed.

The stages, in order: detection (:mod:`.detection`), evidence (:mod:`.evidence`), rules
(:mod:`.rules`) - run together per group of instances by :mod:`.part` - then the result
(:mod:`.result`, with the budget of :mod:`.budget`). This module only chooses serial or parallel.
"""
from __future__ import annotations

from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.parallel import diagnose_parallel
from mixdiag.diagnosis.part import diagnose_part
from mixdiag.diagnosis.result import Diagnosis, finish
from mixdiag.schema import Timeline


def diagnose(timeline: Timeline, config: DiagnosisConfig | None = None, jobs: int = 1) -> Diagnosis:
    """Detect and attribute TPOT spikes in ``timeline``; never reads ground truth.

    ``jobs`` > 1 diagnoses groups of instances in worker processes when the instances are
    independent (see :mod:`~mixdiag.diagnosis.parallel`); the result equals the serial one."""
    cfg = config or DiagnosisConfig()
    if jobs > 1:
        d = diagnose_parallel(timeline, cfg, jobs)
        if d is not None:
            return d
    part = diagnose_part(timeline, cfg, timeline.instances)
    return finish(timeline, cfg, part)
