"""What every ``--metrics-dialect`` observer shares: the registry, per-request last-output times and
arrival / prompt-length lookups (:class:`Dialect`), and the batch-fed histogram with one fixed label
set. The dialects themselves (:mod:`.dialects` for vLLM and the choice, :mod:`.sglang_dialect`)
build on this module; it imports neither. Standard library + prometheus_client + :mod:`.metrics`.
"""
from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry

from mixdiag.engine.telemetry.metrics import BatchHistogram


def labelled_histogram(name: str, documentation: str, buckets, labels: dict[str, str],
                       registry: CollectorRegistry) -> BatchHistogram:
    """A batch-fed histogram with the dialect's one fixed label set."""
    return BatchHistogram(name, documentation, buckets, registry, labels=labels)


class Dialect:
    """Shared plumbing: registry, per-request last-output times, arrival lookup."""

    def __init__(self, registry: CollectorRegistry | None, arrival_s: Callable[[Any], float | None] | None,
                 prompt_len: Callable[[Any], int | None] | None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._arrival_s = arrival_s
        self._prompt_len = prompt_len
        self._last_token_s: dict[Any, float] = {}
        self._scheduled_prompt: dict[Any, float] = {}  # prompt tokens scheduled so far, per request
        self.steps_seen = 0

    def __call__(self, record: Any) -> None:
        self.observe_step(record)

    def _latencies(self, events, per_token: bool):
        """(ttft values, itl values, itl sum, first-output request ids) of a step's output events."""
        ttft, itl, itl_sum, firsts = [], [], 0.0, []
        for ev in events:
            rid, t = ev.request_id, ev.t_s
            prev = None if ev.is_first else self._last_token_s.get(rid)
            if prev is None:
                firsts.append(rid)
                arrival = self._arrival_s(rid) if self._arrival_s is not None else None
                if arrival is not None and t >= arrival:
                    ttft.append(t - arrival)
            elif t >= prev:
                gap = t - prev
                n = max(int(getattr(ev, "n_tokens", 1) or 1), 1) if per_token else 1
                itl.extend([gap / n] * n)
                itl_sum += gap
            self._last_token_s[rid] = t
        return ttft, itl, itl_sum, firsts

    def _prompt_tokens(self, rid) -> float:
        """A request's whole prompt (what vLLM adds at its first output); scheduled chunks as fallback."""
        n = self._prompt_len(rid) if self._prompt_len is not None else None
        seen = self._scheduled_prompt.pop(rid, 0.0)
        return float(n) if n is not None else seen

    def finish_request(self, request_id: Any) -> None:
        self._last_token_s.pop(request_id, None)
        self._scheduled_prompt.pop(request_id, None)
