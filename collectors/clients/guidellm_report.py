"""guidellm's benchmarks report (``--output-path report.json``) -> client tokens.

The report lists ``benchmarks[*].requests.successful`` (also ``errored``, ``incomplete``). A
request carries unix times ``start_time``, ``first_token_time``, ``last_token_time`` and
``output_tokens`` (guidellm 0.2/0.3; newer reports nest them under ``info.timings`` as
``request_start``/``first_iteration``/``last_iteration``, read too). Per-token arrival times are
not in the report: the first token is measured, the others are spread evenly up to the last token
time, so the tokens' quality is ``inferred`` (each stream's mean ITL is right, its spikes are not).
"""
from __future__ import annotations

import json
import os

from mixdiag.collectors.clients.client_tokens import ClientRequest, to_timeline
from mixdiag.errors import UserError

FORMAT = "guidellm"


def sniff(head: bytes, name: str) -> bool:
    return head.lstrip().startswith(b"{") and b'"benchmarks"' in head and (
        b'"first_token_time"' in head or b'"successful"' in head or b'"guidellm' in head.lower())


def _first(d: dict, *keys):
    for k in keys:
        cur = d
        for part in k.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if isinstance(cur, (int, float)) and not isinstance(cur, bool):
            return float(cur)
    return None


def _times(r: dict) -> tuple[float | None, list[float]]:
    start = _first(r, "start_time", "info.timings.request_start", "scheduler_info.request_start_time")
    first = _first(r, "first_token_time", "info.timings.first_iteration", "info.timings.first_token_iteration")
    last = _first(r, "last_token_time", "info.timings.last_iteration", "info.timings.last_token_iteration")
    n = _first(r, "output_tokens", "output_metrics.text_tokens", "output_tokens_count")
    if first is None or n is None or n < 1:
        return start, []
    n = int(n)
    if n == 1 or last is None or last <= first:
        return start, [first]
    step = (last - first) / (n - 1)
    return start, [first + i * step for i in range(n)]


def read(source, *, instance: str | None = None, **options):
    path = os.fspath(source)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except ValueError as e:
        raise UserError(f"{path}: not a JSON document ({str(e).splitlines()[0]})") from None
    benches = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(benches, list):
        raise UserError(f"{path}: no 'benchmarks' list (is this a guidellm report?)")
    reqs, skipped, examples, total = [], 0, [], 0
    for b, bench in enumerate(benches):
        groups = (bench.get("requests") or {}) if isinstance(bench, dict) else {}
        for status in ("successful", "errored", "incomplete"):
            for i, r in enumerate(groups.get(status) or []):
                total += 1
                start, times = _times(r) if isinstance(r, dict) else (None, [])
                if status != "successful" or not times:
                    skipped += 1
                    examples.append(f"benchmark {b} {status}[{i}]: {'not successful' if status != 'successful' else 'no token times'}")
                    continue
                rid = str(r.get("request_id") or f"guidellm-{b}-{i}")
                reqs.append(ClientRequest(rid, start, times))
    if total == 0:
        raise UserError(f"{path}: the report lists no requests")
    return to_timeline(reqs, FORMAT, path, instance=instance, clock="unix", quality="inferred", total=total,
                       skipped=skipped, examples=examples,
                       notes=["token times between the first and last token are spread evenly (inferred)"])
