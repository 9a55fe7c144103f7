"""The wire format between the reference engine and the collectors (docs/contracts.md §2 and §3).

What the engine writes (NVTX / ``record_function`` range names and messages, Prometheus series
names) and what the trace and Prometheus collectors read back are defined here once: the writer
formats with :func:`format_step` / :func:`format_step_stats` / :func:`layer_range`, the readers
match with the same constants and regex fragments. Standard library only, so the collectors and
the CLI can import it without the engine (torch).

Parsers are lenient about drift: extra `` key=value`` fields are accepted and kept.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

# --------------------------------------------------------------------------- NVTX ranges (§2)
#: NVTX domain the engine emits into.
DOMAIN = "mixdiag"

STEP = "step"
STEP_STATS = "step_stats"
SCHEDULE = "schedule"
PREPARE_INPUTS = "prepare_inputs"
FORWARD = "forward"
SAMPLE = "sample"
KV_TRANSFER = "kv_transfer"
ATTN = "attn"
MOE = "moe"

#: Per-step phase ranges, in the order a step runs them (kv_transfer precedes its step).
PHASES: tuple[str, ...] = (KV_TRANSFER, SCHEDULE, PREPARE_INPUTS, FORWARD, SAMPLE)
#: Ranges whose text changes every step (never cached by a tracer).
VARIABLE_RANGES: tuple[str, ...] = (STEP, STEP_STATS)

#: Integer fields of the ``step`` message, in the order they are written.
STEP_INT_FIELDS: tuple[str, ...] = ("prefill_tokens", "decode_reqs", "decode_rows")
#: Numeric fields of the ``step_stats`` message (float on read; NaN/None where absent).
STATS_FIELDS: tuple[str, ...] = ("expert_imbalance", "preempted_reqs", "kv_transfer_bytes")
PER_RANK_TOKENS = "per_rank_tokens"

#: Regex fragments the vectorised (pandas) parsers share with :func:`parse_step_message`.
STEP_HEAD_RE = rf"^{STEP}\s+(\d+)(?:\s|$)"
STEP_STATS_HEAD_RE = rf"^{STEP_STATS}\s+(\d+)(?:\s|$)"
NUMBER_RE = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf)"
INT_LIST_RE = r"(\d+(?:,\d+)*)"
_STEP_HEAD = re.compile(STEP_HEAD_RE)
_STATS_HEAD = re.compile(STEP_STATS_HEAD_RE)
_KV = re.compile(r"(\w+)=(\S*)")
_NUMBER = re.compile(NUMBER_RE + "$")
_INT_LIST = re.compile(INT_LIST_RE + "$")


def field_re(key: str, value: str = r"(\S*)") -> str:
    """Regex matching `` key=<value>`` anywhere after the message head (one capture group)."""
    return rf"(?:^|\s){key}={value}" + ("" if value == r"(\S*)" else r"(?:\s|$)")


def layer_range(kind: str, index: int) -> str:
    """``attn L<i>`` / ``moe L<i>``: the per-layer range text."""
    return f"{kind} L{index}"


def format_step(step: int, kind: str, prefill_tokens: int, decode_reqs: int, decode_rows: int,
                graph: str, **extra: Any) -> str:
    """The ``step`` range message; ``extra`` appends `` key=value`` fields."""
    text = (f"{STEP} {int(step)} kind={kind} prefill_tokens={int(prefill_tokens)} decode_reqs={int(decode_reqs)} "
            f"decode_rows={int(decode_rows)} graph={graph}")
    for k, v in extra.items():
        text += f" {k}={v}"
    return text


def format_step_stats(step: int, preempted_reqs: int, kv_transfer_bytes: float,
                      expert_imbalance: float | None = None, per_rank_tokens: Iterable[int] | None = None) -> str:
    """The ``step_stats`` range message; the EP fields only when ``per_rank_tokens`` was counted."""
    text = f"{STEP_STATS} {int(step)} preempted_reqs={int(preempted_reqs)} kv_transfer_bytes={int(kv_transfer_bytes)}"
    if per_rank_tokens is not None:
        text += (f" expert_imbalance={float(expert_imbalance):.4g} "
                 f"{PER_RANK_TOKENS}={','.join(str(int(v)) for v in per_rank_tokens)}")
    return text


@dataclass(frozen=True)
class StepMessage:
    """A parsed ``step`` range message; fields the message lacks are None."""

    step: int
    kind: str = "unknown"
    prefill_tokens: int | None = None
    decode_reqs: int | None = None
    decode_rows: int | None = None
    graph: str = "unknown"
    extra: dict = field(default_factory=dict)


def parse_step_message(text: str | None, kinds: Iterable[str] | None = None,
                       graphs: Iterable[str] | None = None) -> StepMessage | None:
    """Parse a ``step`` message; None if ``text`` is not one.

    Unknown ``key=value`` fields land in ``extra``; a kind or graph value outside ``kinds`` /
    ``graphs`` (when given) becomes "unknown"; a malformed integer field becomes None.
    """
    if not text:
        return None
    text = text.strip()
    m = _STEP_HEAD.match(text)
    if not m:
        return None
    fields = dict(_KV.findall(text[m.end():]))
    kind = fields.pop("kind", "unknown")
    graph = fields.pop("graph", "unknown").upper()
    ints = {}
    for name in STEP_INT_FIELDS:
        raw = fields.pop(name, None)
        ints[name] = int(raw) if raw is not None and raw.isdigit() else None
    if kinds is not None and kind not in kinds:
        kind = "unknown"
    if graphs is not None and graph not in graphs:
        graph = "unknown"
    return StepMessage(step=int(m.group(1)), kind=kind, graph=graph, extra=fields, **ints)


@dataclass(frozen=True)
class StepStats:
    """A parsed ``step_stats`` message; absent or malformed fields are None."""

    step: int
    preempted_reqs: float | None = None
    kv_transfer_bytes: float | None = None
    expert_imbalance: float | None = None
    per_rank_tokens: tuple[int, ...] | None = None
    extra: dict = field(default_factory=dict)


def parse_step_stats(text: str | None) -> StepStats | None:
    """Parse a ``step_stats`` message; None if ``text`` is not one. Extra fields land in ``extra``."""
    if not text:
        return None
    text = text.strip()
    m = _STATS_HEAD.match(text)
    if not m:
        return None
    fields = dict(_KV.findall(text[m.end():]))
    nums = {}
    for name in STATS_FIELDS:
        raw = fields.pop(name, None)
        nums[name] = float(raw) if raw is not None and _NUMBER.match(raw) else None
    raw = fields.pop(PER_RANK_TOKENS, None)
    prt = tuple(int(v) for v in raw.split(",")) if raw is not None and _INT_LIST.match(raw) else None
    return StepStats(step=int(m.group(1)), per_rank_tokens=prt, extra=fields, **nums)


# --------------------------------------------------------------------- Prometheus series (§3)
METRIC_PREFIX = "mixdiag_engine"
STEPS_TOTAL = f"{METRIC_PREFIX}_steps_total"
SCHEDULED_TOKENS_TOTAL = f"{METRIC_PREFIX}_scheduled_tokens_total"
PROMPT_TOKENS_TOTAL = f"{METRIC_PREFIX}_prompt_tokens_total"
GENERATION_TOKENS_TOTAL = f"{METRIC_PREFIX}_generation_tokens_total"
GRAPH_DISPATCH_TOTAL = f"{METRIC_PREFIX}_graph_dispatch_total"
GRAPH_REPLAYS_TOTAL = f"{METRIC_PREFIX}_graph_replays_total"
STEP_DURATION_SECONDS = f"{METRIC_PREFIX}_step_duration_seconds"
INTER_TOKEN_LATENCY_SECONDS = f"{METRIC_PREFIX}_inter_token_latency_seconds"
TIME_TO_FIRST_TOKEN_SECONDS = f"{METRIC_PREFIX}_time_to_first_token_seconds"
REQUESTS_RUNNING = f"{METRIC_PREFIX}_requests_running"
REQUESTS_WAITING = f"{METRIC_PREFIX}_requests_waiting"
KV_USAGE_RATIO = f"{METRIC_PREFIX}_kv_usage_ratio"
PREFIX_CACHE_QUERIES_TOTAL = f"{METRIC_PREFIX}_prefix_cache_queries_total"
PREFIX_CACHE_HITS_TOTAL = f"{METRIC_PREFIX}_prefix_cache_hits_total"
PREEMPTIONS_TOTAL = f"{METRIC_PREFIX}_preemptions_total"
EXPERT_IMBALANCE_RATIO = f"{METRIC_PREFIX}_expert_imbalance_ratio"
KV_TRANSFER_BYTES_TOTAL = f"{METRIC_PREFIX}_kv_transfer_bytes_total"
KV_TRANSFER_SECONDS_TOTAL = f"{METRIC_PREFIX}_kv_transfer_seconds_total"
SM_ACTIVE_RATIO = f"{METRIC_PREFIX}_sm_active_ratio"


def counter_family(series: str) -> str:
    """The family name ``prometheus_client.Counter`` takes (it appends ``_total`` itself)."""
    return series[:-len("_total")] if series.endswith("_total") else series
