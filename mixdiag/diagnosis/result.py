"""The diagnosis result, a contract (docs/contracts.md section 5, ``mixdiag schema``): the spike
record and its evidence keys, counts by cause, the headline numbers, the last spike, the mixed-step
share, the ITL summary and the verdict - and :func:`finish`, which makes them from a :class:`Part`.
Outputs (text and HTML reports, exporter, dashboard) read these fields; none re-counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from mixdiag.causes import CAUSES, VERDICT_LEAD
from mixdiag.diagnosis.series_note import series_note
from mixdiag.diagnosis.budget import Budget, budget_of
from mixdiag.diagnosis.config import DiagnosisConfig
from mixdiag.diagnosis.counted_once import counted_once
from mixdiag.diagnosis.detection.spikes import itl_values
from mixdiag.diagnosis.evidence.fusion import engine_of
from mixdiag.diagnosis.labels import equal
from mixdiag.diagnosis.part import Part
from mixdiag.diagnosis.rules.decomposition import Regimes, regime_sentence, regimes_json, regimes_of
from mixdiag.schema import Column, Timeline

#: The spike record: the columns of ``Diagnosis.spikes`` and of ``analyze --json``'s spikes, in order.
SPIKE_COLUMNS: tuple[Column, ...] = (
    Column("instance", "str", "-", "instance the spike was seen on", required=True),
    Column("step", "int64", "count", "step (or interval) number of the spike row", required=True),
    Column("t_s", "float64", "s", "when the spike ended (the row's t_end_s)", required=True),
    Column("itl_s", "float64", "s", "measured latency: max ITL charged to the step, its latency, or the interval P99",
       required=True),
    Column("baseline_s", "float64", "s", "rolling baseline the latency was compared with", required=True),
    Column("cause", "str", "-", "one cause of mixdiag.causes.CAUSES", required=True),
    Column("confidence", "float64", "ratio", "confidence in the cause, 0..1", required=True),
    Column("evidence", "dict", "-", "signal values behind the cause (keys: EVIDENCE_FIELDS)", required=True),
    Column("missing_signals", "list[str]", "-", "signals the instance lacks (they lower the confidence)", required=True),
    Column("t_start_s", "float64", "s", "start of the spike row", required=True),
    Column("t_end_s", "float64", "s", "end of the spike row", required=True),
    Column("granularity", "str", "-", "step | interval", required=True, choices=("step", "interval")),
)

#: Keys a spike's ``evidence`` may hold: name -> (unit, meaning). Absent keys: not measured.
EVIDENCE_FIELDS: dict[str, tuple[str, str]] = {
    "kind": ("-", "the row's step kind"),
    "granularity": ("-", "step | interval"),
    "latency_s": ("s", "the row's latency (what was compared with the baseline)"),
    "baseline_s": ("s", "rolling baseline latency"),
    "height_x": ("ratio", "latency_s / baseline_s"),
    "prefill_tokens": ("tokens", "prefill tokens in the step"),
    "prefill_reqs": ("count", "requests with prefill tokens in the step"),
    "decode_rows": ("rows", "decode rows in the step"),
    "decode_reqs": ("count", "decoding requests in the step"),
    "graph_mode": ("-", "graph mode the step ran in"),
    "graph_norm": ("-", "graph mode decode-only steps of the instance normally run in"),
    "graph_left_full": ("bool", "the step left the FULL graph"),
    "batch_outside_full_sizes": ("bool", "decode batch size never seen replaying FULL"),
    "sm_active": ("ratio", "SM activity during the step"),
    "sm_delta": ("ratio", "SM activity above decode-only neighbours"),
    "sm_high": ("bool", "sm_delta above the mixing threshold"),
    "periodic": ("bool", "spike near a prefill arrival, and the instance's spikes fall near arrivals far above "
                 "chance (binomial test)"),
    "expert_imbalance": ("ratio", "max/mean tokens per EP rank"),
    "imbalance_rel": ("ratio", "expert_imbalance / its neighbourhood's"),
    "kv_transfer_bytes": ("B", "KV bytes installed from a prefill instance"),
    "kv_transfer_s": ("s", "time waiting for KV transfer"),
    "kv_transfer_share_of_excess": ("ratio", "kv_wait_s (else kv_transfer_s) / latency excess"),
    "rank_comm_spread": ("ratio", "largest minus smallest EP rank's exchange-kernel share of the step"),
    "kv_overlap_s": ("s", "side-stream KV copies / transfer kernels running inside the step's GPU span (traces)"),
    "kv_wait_s": ("s", "compute-stream idle inside the step while that transfer ran: the forward waited on it"),
    "preempted_reqs": ("count", "requests preempted or retracted"),
    "kv_usage": ("ratio", "KV cache usage"),
    "decodes_before": ("bool", "decodes were running when a prefill-only step left them out"),
    "gap_before_s": ("s", "idle host time before the step"),
    "gap_share_of_excess": ("ratio", "gap excess / latency excess"),
    "peer_graph_off": ("bool", "a peer EP rank's same step left the graph too"),
    "peer_gap_share_of_excess": ("ratio", "a peer EP rank's host-gap excess / this step's latency excess"),
    "request_stall_s": ("s", "longest wait of a request that sat out steps"),
    "interval": ("count", "interval (scrape) row whose evidence a step spike took"),
    "interval_expert_imbalance": ("ratio", "that interval's expert imbalance"),
    "interval_graph_off_decode_steps": ("count", "decode-only steps that interval dispatched off the FULL graph"),
    "interval_kv_transfer_bytes": ("B", "KV bytes that interval transferred"),
    "interval_preempted_reqs": ("count", "preemptions that interval counted"),
    "steps_in_interval": ("count", "steps of the step view inside an interval spike"),
    "slow_steps_in_interval": ("count", "slow steps among them"),
    "host_gap_unusual_s": ("s", "host time between steps beyond the usual per-step gap, per waiting request"),
    "host_gap_per_request_s": ("s", "ITL time of an interval minus its steps' time, per waiting request"),
    "host_gap_excess_s": ("s", "host_gap_per_request_s above its rolling median"),
    "reason": ("-", "why the cause was chosen or none was"),
    "signal_quality": ("-", "per signal of this row: measured | inferred | estimated | absent (estimated never "
                       "corroborates the token allocation)"),
    "comm_share": ("ratio", "collective/all-to-all share of the step's device time"),
    "comm_delta": ("ratio", "comm_share above decode neighbours"),
    "rank_skew": ("ratio", "slowest rank's compute time / median rank's"),
    "rank_skew_high": ("bool", "rank_skew above the EP-hotspot threshold"),
    "rank_sm_skew": ("ratio", "largest rank's SM-busy time / median rank's (graph-hidden compute)"),
    "device_idle_before_s": ("s", "measured device idle time before the step"),
    "interval_host_wait_excess_s": ("s", "interval rows: GPU wait on the host between forwards beyond the "
                                    "instance's usual share (SGLang gpu_overlap_wait_seconds_total; vLLM GC pauses)"),
    "host_pause_s": ("s", "interval rows: garbage-collection time the engine logged (vLLM VLLM_GC_DEBUG=1)"),
    "host_stopped_s": ("s", "interval rows: the longest time the OS saw the engine process stopped "
                            "(mixdiag sample-host)"),
    "interval_host_stopped_s": ("s", "step rows: the OS-sampled part of interval_host_pause_s"),
    "arrivals": ("count", "requests that arrived / began prefill in the row"),
    "large_step_share": ("ratio", "interval rows: share of steps with prefill work"),
    "prefill_itl_rho": ("ratio", "interval rows: Spearman rho of prefill work vs ITL excess across intervals"),
    "prefill_itl_p_value": ("ratio", "its one-sided permutation p-value"),
    "llm_serving": ("bool", "False when the input has no decode-like structure (confidence capped at 0.5)"),
    "decodes_waited": ("bool", "running decodes got no token during this prefill-only step"),
    "relation_confidence": ("ratio", "interval rows: confidence the whole-run prefill/ITL relation added"),
    "graph_none_min_tokens": ("tokens", "interval rows: the smallest batch the engine's CUDA-graph table counted "
                              "run without a graph in the window holding the interval"),
    "tail_only": ("-", "interval rows: the spike is only the slowest tokens (one per running request beside a "
                       "large chunk), read from the highest ITL bucket that grew; the interval's P99 did not move"),
    "prompt_chunk_ahead_tokens": ("tokens", "interval rows: prompt tokens, at least, of the largest iteration that "
                                  "finished a prefill in the interval or within one mean prefill time after it"),
    "prefill_work_near": ("count", "interval rows: prefill work in the interval (and the next, for late counters)"),
    "prefill_work_usual": ("count", "interval rows: the instance's median prefill work per interval"),
    "prefill_work_threshold": ("count", "interval rows: work above which it stands out (median + k sigma)"),
    "prefill_count_near": ("count", "interval rows: prompt tokens counted in the interval or the next"),
    "prefill_count_usual": ("count", "interval rows: the instance's median of that count"),
    "stamp_resolution_s": ("s", "the source's stamp grid, coarser than the step time it would measure"),
    "latency_below_resolution": ("bool", "the verdict's latency was read from too coarse stamps (confidence capped)"),
}



def describe() -> str:
    """The spike record and its evidence keys as a text table (``mixdiag schema`` prints it after the
    Timeline contract)."""
    out = ["spikes (analyze result, not a Timeline frame):"]
    out += [f"  {c.name:<20} {c.dtype:<9} {c.unit:<8} {c.doc}" for c in SPIKE_COLUMNS]
    out.append("spike evidence keys:")
    out += [f"  {k:<32} {u:<6} {doc}" for k, (u, doc) in EVIDENCE_FIELDS.items()]
    return "\n".join(out)


#: Step kinds that count as work when computing the share of mixed steps.
WORK_KINDS = ("prefill", "decode", "mixed")
#: ``Diagnosis.itl["source"]`` -> the headline's shorter label.
_ITL_SOURCE = {"token_events": "tokens", "step_latency": "steps", "interval_quantiles": "intervals"}


def _f(v) -> float:
    """A plain float (NaN for None/NA), safe to put in a dataclass and JSON."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class Headline:
    """The overview numbers of one diagnosis (dashboard Overview, exporter, demo summary)."""

    verdict: str
    by_cause: dict[str, int]
    n_spikes: int
    itl_p50_s: float
    itl_p99_s: float
    itl_max_s: float
    itl_source: str  # "tokens" (per output event) | "steps" (step-to-step) | "intervals" | "none"
    mixed_share: float  # mixed steps / work steps; NaN without step-granularity rows
    n_steps: int  # rows of the analysed Timeline's steps frame (steps and intervals)
    instances: tuple[str, ...]  # servers: the views NAME@... of one server count as NAME (evidence/fusion.py)
    t_first_s: float
    t_last_s: float
    last_spike: dict = field(default_factory=dict)  # cause, itl_s, t_s, instance, step (empty: none)


def count_by_cause(causes) -> dict[str, int]:
    """Spikes per cause, every cause of the closed set present (zeros included); a cause outside
    the set counts as ``unknown``. The one place spikes are counted by cause."""
    counts = {c: 0 for c in CAUSES}
    for c in causes:
        counts[c if c in counts else "unknown"] += 1
    return counts


def mixed_share(steps: pd.DataFrame) -> float:
    """Share of work steps (prefill, decode, mixed) that were mixed; NaN with no step rows."""
    is_step = equal(steps["granularity"], "step") if "granularity" in steps else None
    s = steps if is_step is None or is_step.all() else steps[is_step]  # all step rows: no copy of the frame
    n = int(s["kind"].isin(WORK_KINDS).sum())
    return float(equal(s["kind"], "mixed").sum() / n) if n else math.nan


def last_spike_of(spikes: pd.DataFrame | None) -> dict:
    """The latest spike (by time) as a plain dict, or {} when there is none."""
    if spikes is None or not len(spikes):
        return {}
    row = spikes.loc[spikes["t_s"].idxmax()]
    return {"cause": str(row["cause"]), "itl_s": _f(row["itl_s"]), "t_s": _f(row["t_s"]),
            "instance": str(row["instance"]), "step": int(row["step"])}


def make_headline(timeline: Timeline, verdict: str, by_cause: dict[str, int], itl: dict, last: dict) -> Headline:
    """The headline of a diagnosis of ``timeline`` (counts and ITL taken as given, never recomputed)."""
    span = timeline.span() or (math.nan, math.nan)
    return Headline(verdict=str(verdict), by_cause=dict(by_cause), n_spikes=sum(by_cause.values()),
                    itl_p50_s=_f(itl.get("p50_s")), itl_p99_s=_f(itl.get("p99_s")), itl_max_s=_f(itl.get("max_s")),
                    itl_source=_ITL_SOURCE.get(str(itl.get("source")), "none"),
                    mixed_share=mixed_share(timeline.steps), n_steps=len(timeline.steps),
                    instances=tuple(dict.fromkeys(engine_of(i) for i in timeline.instances)), t_first_s=_f(span[0]), t_last_s=_f(span[1]),
                    last_spike=last)


@dataclass
class Diagnosis:
    """The result of :func:`~mixdiag.diagnosis.pipeline.diagnose` (docs/contracts.md section 5).

    ``spikes`` follows :data:`SPIKE_COLUMNS`; ``by_cause`` has every cause as a key;
    ``headline``, ``last_spike``, ``mixed_share`` and ``itl`` are the numbers every output shows.
    """

    spikes: pd.DataFrame
    steps: pd.DataFrame
    by_cause: dict
    verdict: str
    itl: dict  # p50_s, p99_s, max_s (s or None), source
    headline: Headline
    instances: dict = field(default_factory=dict)  # instance -> {signals, periodicity, latency_source}
    config: DiagnosisConfig | None = None
    budget: Budget = field(default_factory=Budget)  # ITL excess by cause, P99 without each (budget.py)
    regimes: Regimes = field(default_factory=Regimes)  # episodes, excess split by cause, saturation

    @property
    def last_spike(self) -> dict:
        """The latest spike: cause, itl_s, t_s, instance, step ({} when none)."""
        return self.headline.last_spike

    @property
    def mixed_share(self) -> float:
        """Mixed steps / work steps of the analysed Timeline (NaN without step rows)."""
        return self.headline.mixed_share

    def by_cause_after(self, counted_until: dict[str, float]) -> tuple[dict[str, int], dict[str, float]]:
        """Spikes per cause newer than ``counted_until[instance]`` (a watcher's earlier publications),
        and the new per-instance newest spike time. With ``{}``: ``by_cause``."""
        until, new = dict(counted_until), []
        for inst, grp in (self.spikes.groupby("instance", sort=True) if len(self.spikes) else ()):
            t = grp["t_s"].to_numpy(dtype="float64")
            new += list(grp.loc[t > until.get(str(inst), -math.inf), "cause"].astype(str))
            until[str(inst)] = max(until.get(str(inst), -math.inf), float(t.max()))
        return count_by_cause(new), until

    def to_json(self, top: int | None = None) -> dict:
        """The ``mixdiag analyze --json`` document (docs/analyze.md)."""
        st = self.steps
        step_rows = st[equal(st["granularity"], "step")] if len(st) else st
        by_kind = {k: int(v) for k, v in step_rows["kind"].value_counts().sort_index().items()} if len(st) else {}
        spikes = self.spikes.sort_values("t_s", kind="stable")
        if top is not None:
            spikes = spikes.head(top)
        rows = []
        for r in spikes.itertuples(index=False):
            rows.append({"instance": r.instance, "step": int(r.step), "t_s": float(r.t_s),
                         "t_start_s": float(r.t_start_s), "t_end_s": float(r.t_end_s), "itl_s": float(r.itl_s),
                         "baseline_s": float(r.baseline_s), "cause": r.cause, "confidence": float(r.confidence),
                         "evidence": r.evidence, "missing_signals": list(r.missing_signals),
                         "shares": self.regimes.shares_at(r.instance, int(r.step))})
        return {"verdict": self.verdict,
                "steps": {"total": int(len(step_rows)), "by_kind": by_kind,
                          "intervals": int(equal(st["granularity"], "interval").sum()) if len(st) else 0},
                "itl": self.itl,
                "spikes": rows,
                "by_cause": dict(self.by_cause),
                "budget": self.budget.to_json(),
                "regimes": regimes_json(self.regimes),
                "instances": self.instances}


def itl_summary(tl: Timeline, steps: pd.DataFrame, part: Part | None = None) -> dict:
    """ITL P50/P99/max (s) and their source: token events, else decode step latency, else the
    interval quantiles' medians (max = the largest interval P99). ``part``: its ITL events are read
    when they cover every token event (the same values in another order: the same quantiles)."""
    if len(tl.tokens):
        if part is not None and part.itl and part.itl_token_rows == len(tl.tokens):
            v = np.concatenate([f["itl_s"].to_numpy(dtype="float64") for f in part.itl.values()])
        else:
            v = itl_values(tl.tokens)  # Timeline.itl()'s values, in request order: same quantiles
        src = "token_events"
    else:
        st = steps[equal(steps["granularity"], "step")]
        if "latency_s" in st.columns and len(st):
            # a zero-length row measured no latency (a log line's stamp alone: SGLang's Prefill line)
            st = st[pd.to_numeric(st["latency_s"], errors="coerce") > 0]
        if "latency_s" in st.columns and len(st):
            v = st.loc[st["has_decode"].astype(bool), "latency_s"].dropna().to_numpy()
            if not len(v):  # no decode rows known (a trace without token counts): every step's latency
                v = st["latency_s"].dropna().to_numpy()
            src = "step_latency"
        else:
            iv = steps[steps["granularity"] == "interval"] if len(steps) else steps
            p50 = iv["itl_p50_s"].dropna() if len(iv) else pd.Series(dtype=float)
            p99 = iv["itl_p99_s"].dropna() if len(iv) else pd.Series(dtype=float)
            return {"p50_s": float(p50.median()) if len(p50) else None,
                    "p99_s": float(p99.median()) if len(p99) else None,
                    "max_s": float(p99.max()) if len(p99) else None, "source": "interval_quantiles"}
    if not len(v):
        return {"p50_s": None, "p99_s": None, "max_s": None, "source": src}
    p50, p99 = np.quantile(v, [0.5, 0.99])  # one selection for both (each value as its own np.quantile gives)
    return {"p50_s": float(p50), "p99_s": float(p99), "max_s": float(v.max()), "source": src}


def _verdict(by_cause: dict, n_spikes: int, n_rows: int, itl: dict, unit: str = "") -> str:
    if n_rows == 0:
        return "No steps or intervals in the input: nothing to diagnose."
    if n_spikes == 0:
        p50, p99 = itl.get("p50_s"), itl.get("p99_s")
        ratio = f" (ITL P99 is {p99 / p50:.1f}x P50)" if p50 and p99 else ""
        return f"No TPOT spikes found in {unit}{ratio}."
    ranked = sorted(((c, n) for c, n in by_cause.items() if n), key=lambda x: -x[1])
    top, n_top = ranked[0]
    rest = ", ".join(f"{n} {c}" for c, n in ranked[1:])
    lead = VERDICT_LEAD[top]
    if n_top * 2 <= n_spikes and len(ranked) > 1:
        parts = ", ".join(f"{n} {c}" for c, n in ranked)
        return f"{n_spikes} TPOT spikes in {unit} have several causes: {parts}."
    tail = f"; the rest: {rest}" if rest else ""
    if top == "unknown":
        return f"{n_top} of {n_spikes} TPOT spikes in {unit} have no cause the available signals support (unknown){tail}."
    return f"{n_top} of {n_spikes} TPOT spikes in {unit} are caused by {lead}{tail}."


def _frames_or_empty(timeline: Timeline, frames: list) -> pd.DataFrame:
    """``Diagnosis.steps``: the views' frames in order, or the input's (empty) rows with the columns."""
    return pd.concat(frames, ignore_index=True) if frames else timeline.steps.assign(
        gap_before_s=pd.Series(dtype=float), is_spike=pd.Series(dtype=bool), cause=pd.Series(dtype=object),
        itl_max_s=pd.Series(dtype=float), latency_s=pd.Series(dtype=float), baseline_s=pd.Series(dtype=float),
        has_decode=pd.Series(dtype=bool))


def spike_frame(spikes: list) -> pd.DataFrame:
    """``Diagnosis.spikes``: the records sorted by time, then instance (stable: per instance, the
    order attribution made them)."""
    sp = pd.DataFrame(spikes, columns=[c.name for c in SPIKE_COLUMNS])
    if len(sp):
        sp = sp.sort_values(["t_s", "instance"], kind="stable").reset_index(drop=True)
    return sp


def with_sources(instances: dict, listing: dict) -> dict:
    """``Diagnosis.instances`` with each server's inputs (``sources``: path, format, role, view) and
    views from the collectors' ``instance_sources``; a view ``NAME@...`` of a server says ``view_of``."""
    out = {k: dict(v) for k, v in instances.items()}
    for name, entry in listing.items():
        out.setdefault(name, {}).update(sources=list(entry.get("sources", [])), views=list(entry.get("views", [])),
                                        joined_by=entry.get("joined_by"), join_notes=list(entry.get("notes", [])),
                                        clock_notes=list(entry.get("clock_notes", [])))
        for view in entry.get("views", []):
            if view != name and view in out:
                out[view]["view_of"] = name
    return out


def finish(timeline: Timeline, cfg: DiagnosisConfig, part: Part, budget=None) -> Diagnosis:
    """The Diagnosis of ``timeline`` from the detection/attribution of all its instances (one
    :class:`~mixdiag.diagnosis.part.Part`, or the parts of parallel.py merged): counts, ITL, verdict,
    headline, and the budget (computed here unless the parts computed it)."""
    steps = _frames_or_empty(timeline, part.frames)
    sp = spike_frame(part.spikes)
    by_cause = count_by_cause(sp["cause"])
    once = counted_once(steps, part.frames, timeline.meta)  # one server's views: its latency counted once
    itl = itl_summary(timeline, once, part)  # from the finer view (a log's 40-forward windows hide the tail)
    n_step = int(equal(steps["granularity"], "step").sum()) if len(steps) else 0
    unit = f"{n_step} steps" if n_step else f"{len(steps)} intervals"
    verdict = _verdict(by_cause, len(sp), int(len(steps)), itl, unit)
    if not len(steps):
        verdict = f"{verdict} {series_note(timeline.series)}".strip()
    not_llm, cap = part.not_llm, cfg.attribution.not_llm_cap  # the cap the rules applied (attribution.py)
    if part.instances and len(not_llm) == len(part.instances):
        verdict = (f"This input does not look like LLM serving (no decode-like steps: no output tokens or decode "
                   f"rows, no repeated FULL-graph replays, no ITL); causes are named with confidence <= "
                   f"{cap}. {verdict}")
    elif not_llm:
        verdict += f" {', '.join(not_llm)} do(es) not look like LLM serving (confidence <= {cap})."
    regimes = regimes_of(once, cfg.regimes)
    said = regime_sentence(regimes)
    if said:  # saturation leads: it is the level every spike stands on
        verdict = f"{said} {verdict}" if any(s.get("saturated") for s in regimes.saturation.values()) else f"{verdict} {said}"
    headline = make_headline(timeline, verdict, by_cause, itl, last_spike_of(sp))
    return Diagnosis(spikes=sp, steps=steps, by_cause=by_cause, verdict=verdict, itl=itl, headline=headline,
                     instances=with_sources(part.instances, timeline.meta.get("instance_sources") or {}), config=cfg,
                     regimes=regimes,
                     budget=budget if budget is not None else budget_of(timeline.tokens, once, sp, part.itl))
