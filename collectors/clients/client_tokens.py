"""Per-request client token times -> a Timeline ``tokens`` frame (one row per streamed chunk)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from mixdiag.collectors.provenance import source_entry
from mixdiag.schema import Timeline

DEFAULT_INSTANCE = "client"


@dataclass
class ClientRequest:
    """One request as the client saw it: when it was sent and when each chunk of tokens arrived."""

    request_id: str
    start_s: float | None
    token_times_s: list[float] = field(default_factory=list)
    tokens_per_event: list[int] | None = None   # None: one token per chunk
    prompt_tokens: int | None = None            # the prompt's length where the record says


def to_timeline(reqs: list[ClientRequest], fmt: str, path, *, instance: str | None, clock: str,
                quality: str = "measured", total: int, skipped: int, examples=(), notes=(), aligned: bool = True,
                **extra) -> Timeline:
    """The tokens frame of ``reqs`` on ``clock`` ('unix' or 'relative') with provenance in meta; with
    ``aligned`` (streams on one clock, token times measured) also the steps the client saw."""
    inst = instance or DEFAULT_INSTANCE
    rows = []
    for r in reqs:
        n = r.tokens_per_event or [1] * len(r.token_times_s)
        for i, (t, k) in enumerate(zip(r.token_times_s, n)):
            first = i == 0
            arrival = float(r.start_s) if first and r.start_s is not None else float("nan")
            plen = float(r.prompt_tokens) if first and r.prompt_tokens is not None else float("nan")
            rows.append((inst, r.request_id, float(t), int(k), float("nan"), 1.0 if first else 0.0, arrival, plen))
    tokens = pd.DataFrame(rows, columns=["instance", "request_id", "t_s", "n_tokens", "step", "is_first", "arrival_s",
                                         "prompt_tokens"])
    tokens = tokens.sort_values(["request_id", "t_s"], kind="stable")
    steps, stalls = None, None
    if aligned and quality == "measured":   # streams line up and each chunk's time is real: steps are visible
        from mixdiag.collectors.clients.client_steps import client_steps

        steps, tokens, stalls = client_steps(tokens, inst)
    entry = source_entry(fmt, path, total=total, parsed=total - skipped, skipped=skipped, examples=examples,
                         partial=skipped > 0, notes=list(notes), instances=[inst], measured_at="client", **extra)
    signals = {"tokens": quality}
    if steps is not None and len(steps):
        signals |= {"token_allocation": "inferred", "host_time": "absent"}
    meta = {"clock": clock, "sources": [entry], "signals": {inst: signals},
            "client": {"requests": len(reqs), "token_events": len(rows), "quality": quality,
                       **({"steps_from_client": stalls} if stalls else {})}}
    if steps is not None and len(steps):
        return Timeline(steps=steps, tokens=tokens, meta=meta)
    return Timeline(tokens=tokens, meta=meta)


def cumulative(start: float, ttft: float, itls) -> list[float]:
    """Token times from a start, a TTFT and the inter-token gaps that follow."""
    out = [start + ttft]
    for gap in itls:
        out.append(out[-1] + float(gap))
    return out
