"""Prometheus exporter of the diagnosis: ``/metrics`` for ``mixdiag dashboard`` and ``mixdiag watch``.

What it publishes (base units, ``_total`` counters, labels from closed sets only):

=========================================  =======  ===========================================
``mixdiag_spikes_total{cause}``            counter  spikes attributed to each cause (all causes)
``mixdiag_itl_excess_seconds_total{cause}`` counter token-seconds of latency over the healthy reference,
                                                    split across causes (``Regimes.excess_by_cause``)
``mixdiag_episodes_total{cause}``          counter  sustained episodes of elevated latency, by cause
``mixdiag_last_spike_cause{cause}``        gauge    1 for the latest spike's cause, 0 otherwise
``mixdiag_last_spike_itl_seconds``         gauge    the latest spike's measured ITL
``mixdiag_last_spike_timestamp_seconds``   gauge    when it happened (Timeline clock)
``mixdiag_mixed_steps_ratio``              gauge    mixed steps / work steps in the analysed data
``mixdiag_itl_seconds{quantile}``          gauge    ITL P50 / P99 / max (quantile 0.5|0.99|1)
``mixdiag_analysis_lag_seconds``           gauge    publication time minus newest analysed sample
``mixdiag_analysis_duration_seconds``      gauge    how long the last diagnosis took
``mixdiag_last_analysis_timestamp_seconds`` gauge   unix time of the last publication
``mixdiag_analyses_total``                 counter  diagnoses published
``mixdiag_steps_analyzed``                 gauge    steps in the last analysed data
=========================================  =======  ===========================================

Counters only grow: a spike, a row's excess and an episode are counted by the first publication that
holds them (per instance, newer than what was counted before), so a watcher re-diagnosing overlapping
windows counts each once; ``rate()`` of the excess counter over the rate of all causes is the share of
excess a cause carried (``deploy/prometheus/mixdiag-rules.yml`` records and alerts on it).

Each exporter owns its :class:`~prometheus_client.CollectorRegistry` (never the global one), so
several can live in one process (tests, the dashboard and a watcher). Publication swaps one
immutable snapshot, so a scrape never sees half an update. :func:`check_address` validates the
``--host``/``--port`` everything serving it (``watch``, ``dashboard``, ``demo``) listens on.
"""
from __future__ import annotations

import ipaddress
import math
import threading
import time
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mixdiag.causes import CAUSES
from mixdiag.errors import UserError

__all__ = ["DiagnosisExporter", "Snapshot", "check_address"]


def check_address(host: str, port: int) -> tuple[str, int]:
    """``(host, port)`` when ``host`` is an IP address or 'localhost' and ``port`` is 1..65535; UserError otherwise."""
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise UserError(f"--port must be 1..65535, got {port}") from None
    if not 0 < port < 65536:
        raise UserError(f"--port must be 1..65535, got {port}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise UserError(f"--host must be an IP address or 'localhost', got {host!r}") from None
    return host, port


@dataclass(frozen=True)
class Snapshot:
    """Everything one scrape reports."""

    spikes_total: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CAUSES})
    last_spike: dict = field(default_factory=dict)
    mixed_steps_ratio: float = math.nan
    itl_p50_s: float = math.nan
    itl_p99_s: float = math.nan
    itl_max_s: float = math.nan
    analysis_lag_s: float = math.nan
    analysis_duration_s: float = math.nan
    last_analysis_unix_s: float = math.nan
    analyses_total: int = 0
    steps_analyzed: int = 0
    # Newest spike time counted per instance: later publications only add newer spikes.
    counted_until: dict[str, float] = field(default_factory=dict)
    itl_excess_total_s: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CAUSES})
    # Newest row (step or interval) whose excess was counted, per instance, as counted_until.
    excess_until: dict[str, float] = field(default_factory=dict)
    episodes_total: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CAUSES})
    # End of the last episode counted per instance: an episode starting after it is new.
    episodes_until: dict[str, float] = field(default_factory=dict)


class DiagnosisExporter:
    """Publishes diagnoses as Prometheus metrics on its own registry."""

    #: The HTTP Content-Type of :meth:`render`'s text.
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, namespace: str = "mixdiag"):
        self.namespace = namespace
        self._lock = threading.Lock()
        self._snap = Snapshot()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    @property
    def snapshot(self) -> Snapshot:
        """The snapshot the next scrape reports."""
        return self._snap

    def publish(self, timeline, diagnosis, *, duration_s: float = math.nan, now: float | None = None,
                reset: bool = False) -> Snapshot:
        """Make ``diagnosis`` (of ``timeline``) what ``/metrics`` reports.

        Counters only grow: a spike is counted the first time a publication contains it
        (it is newer than every spike already counted for its instance; the diagnosis counts them,
        :meth:`Diagnosis.by_cause_after`), likewise a row's excess and an episode
        (:meth:`Regimes.excess_after`, :meth:`Regimes.episodes_after`), so a watcher that
        re-diagnoses an overlapping window counts each once. ``reset=True`` starts the
        counters over, as a process restart would (the dashboard does this when the user loads a
        different dataset, so the counts equal that dataset's report).
        """
        now = time.time() if now is None else float(now)
        h = diagnosis.headline
        with self._lock:
            prev = Snapshot() if reset else self._snap
            new, until = diagnosis.by_cause_after(prev.counted_until)
            totals = {c: prev.spikes_total.get(c, 0) + new.get(c, 0) for c in CAUSES}
            new_ex, ex_until = diagnosis.regimes.excess_after(prev.excess_until)
            excess = {c: prev.itl_excess_total_s.get(c, 0.0) + new_ex.get(c, 0.0) for c in CAUSES}
            new_ep, ep_until = diagnosis.regimes.episodes_after(prev.episodes_until)
            episodes = {c: prev.episodes_total.get(c, 0) + new_ep.get(c, 0) for c in CAUSES}
            newest = h.t_last_s
            lag = now - newest if timeline.meta.get("clock", "unix") == "unix" and math.isfinite(newest) else math.nan
            self._snap = replace(prev, spikes_total=totals, counted_until=until, itl_excess_total_s=excess,
                                 excess_until=ex_until, episodes_total=episodes, episodes_until=ep_until,
                                 last_spike=h.last_spike or prev.last_spike, mixed_steps_ratio=h.mixed_share,
                                 itl_p50_s=h.itl_p50_s, itl_p99_s=h.itl_p99_s, itl_max_s=h.itl_max_s,
                                 analysis_lag_s=lag, analysis_duration_s=float(duration_s),
                                 last_analysis_unix_s=now, analyses_total=prev.analyses_total + 1,
                                 steps_analyzed=h.n_steps)
            return self._snap

    # prometheus_client collector protocol
    def collect(self):
        s = self._snap
        ns = self.namespace
        spikes = CounterMetricFamily(f"{ns}_spikes", "TPOT spikes attributed to each cause.", labels=["cause"])
        for cause in CAUSES:
            spikes.add_metric([cause], s.spikes_total.get(cause, 0))
        yield spikes
        ex = CounterMetricFamily(f"{ns}_itl_excess_seconds",
                                 "Token-seconds of latency above the healthy reference, split across causes.",
                                 labels=["cause"])
        for cause in CAUSES:
            ex.add_metric([cause], s.itl_excess_total_s.get(cause, 0.0))
        yield ex
        eps = CounterMetricFamily(f"{ns}_episodes", "Sustained episodes of elevated latency, by cause.",
                                  labels=["cause"])
        for cause in CAUSES:
            eps.add_metric([cause], s.episodes_total.get(cause, 0))
        yield eps
        last_cause = s.last_spike.get("cause")
        lc = GaugeMetricFamily(f"{ns}_last_spike_cause", "1 for the cause of the latest spike, 0 for the others.",
                               labels=["cause"])
        for cause in CAUSES:
            lc.add_metric([cause], 1.0 if cause == last_cause else 0.0)
        yield lc
        yield GaugeMetricFamily(f"{ns}_last_spike_itl_seconds", "Measured inter-token latency of the latest spike.",
                                value=s.last_spike.get("itl_s", math.nan))
        yield GaugeMetricFamily(f"{ns}_last_spike_timestamp_seconds",
                                "Time of the latest spike on the analysed data's clock.",
                                value=s.last_spike.get("t_s", math.nan))
        yield GaugeMetricFamily(f"{ns}_mixed_steps_ratio", "Share of work steps that mixed prefill and decode.",
                                value=s.mixed_steps_ratio)
        q = GaugeMetricFamily(f"{ns}_itl_seconds", "Inter-token latency quantiles of the analysed data.",
                              labels=["quantile"])
        for label, v in (("0.5", s.itl_p50_s), ("0.99", s.itl_p99_s), ("1", s.itl_max_s)):
            q.add_metric([label], v)
        yield q
        yield GaugeMetricFamily(f"{ns}_analysis_lag_seconds",
                                "Seconds between the newest analysed sample and the diagnosis' publication.",
                                value=s.analysis_lag_s)
        yield GaugeMetricFamily(f"{ns}_analysis_duration_seconds", "Seconds the last diagnosis took.",
                                value=s.analysis_duration_s)
        yield GaugeMetricFamily(f"{ns}_last_analysis_timestamp_seconds", "Unix time of the last published diagnosis.",
                                value=s.last_analysis_unix_s)
        yield CounterMetricFamily(f"{ns}_analyses", "Diagnoses published.", value=s.analyses_total)
        yield GaugeMetricFamily(f"{ns}_steps_analyzed", "Steps (or intervals) in the last analysed data.",
                                value=s.steps_analyzed)

    def render(self) -> bytes:
        """The text exposition of the registry (what ``/metrics`` returns)."""
        return generate_latest(self.registry)
