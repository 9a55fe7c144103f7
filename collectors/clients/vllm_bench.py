"""``vllm bench serve --save-result --save-detailed`` result JSON -> client tokens.

The file (vLLM's benchmarks/serve.py, formerly benchmark_serving.py) holds run totals and, with
``--save-detailed``, per-request lists: ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls``
(a list of gaps in s per request), ``errors``, and in newer vLLM ``start_times``. A request's
token times are ``start + ttft`` and then the cumulative gaps. Without ``start_times``, every
request starts at 0: each stream's own ITLs are right, but streams cannot be lined up.

Anchoring. vLLM takes start times from ``time.perf_counter()``. On Linux that is
``CLOCK_MONOTONIC``: seconds since boot, the same in every process of the host, so one offset maps
it onto unix time for the whole run: ``clock_offset_s`` (CLI ``--clock-offset S``) =
``time.time() - time.perf_counter()`` read on the client host while it is up (any process, before
or after the run; NTP slews the two apart by parts per million). ``t0`` instead gives the unix time
of the first request (e.g. from the client machine's log). With neither, the result is
``clock = "relative"`` (seconds from the first start), unless the starts already look like unix time.
"""
from __future__ import annotations

import json
import math
import os

from mixdiag.collectors.clients.client_tokens import ClientRequest, cumulative, to_timeline
from mixdiag.errors import UserError

FORMAT = "vllm-bench"
_EPOCH_2001 = 1e9


def sniff(head: bytes, name: str) -> bool:
    h = head.lstrip()
    return h.startswith(b"{") and b'"ttfts"' in head or (h.startswith(b"{") and b'"request_throughput"' in head
                                                        and b'"itls"' in head)


def read(source, *, instance: str | None = None, t0: float | None = None, clock_offset_s: float | None = None,
         **options):
    """Read a vLLM bench result; ``clock_offset_s`` (unix - perf_counter on the client host) or ``t0``
    (unix time of the first start) anchors the starts on the unix clock."""
    if t0 is not None and clock_offset_s is not None:
        raise UserError("give either t0 (the first request's unix time) or a clock offset, not both")
    if clock_offset_s is not None and not math.isfinite(clock_offset_s):
        raise UserError(f"clock offset {clock_offset_s!r} is no finite number of seconds")
    path = os.fspath(source)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except ValueError as e:
        raise UserError(f"{path}: not a JSON document ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ttfts"), list) or not isinstance(doc.get("itls"), list):
        raise UserError(f"{path}: no per-request 'ttfts'/'itls' lists; rerun vllm bench serve with "
                        "--save-result --save-detailed")
    ttfts, itls = doc["ttfts"], doc["itls"]
    n = len(ttfts)
    starts = doc.get("start_times")
    errors = doc.get("errors") or [""] * n
    notes = []
    aligned = isinstance(starts, list) and len(starts) == n
    if not aligned:
        starts, clock = [0.0] * n, "relative"
        notes.append("no per-request start_times: every request starts at 0 (per-stream ITLs only)")
    elif t0 is not None or clock_offset_s is not None or min(starts, default=0) > _EPOCH_2001:
        base = min(starts)
        if base >= _EPOCH_2001:
            offset = 0.0  # already unix time: nothing to anchor
            if clock_offset_s is not None or t0 is not None:
                notes.append("start_times already look like unix time: the anchor given was not applied")
        elif clock_offset_s is not None:
            offset = float(clock_offset_s)
            notes.append(f"start_times anchored on unix time with clock offset {offset:.6f} s (unix - perf_counter)")
        else:
            offset = float(t0) - base
            notes.append(f"start_times anchored on unix time: the first request at t0 = {float(t0):.3f}")
        starts, clock = [s + offset for s in starts], "unix"
    else:
        base = min(starts)
        starts, clock = [s - base for s in starts], "relative"
        notes.append("start_times are perf_counter seconds: relative clock (--clock-offset or t0 anchors it on unix time)")
    reqs, skipped, examples = [], 0, []
    for i in range(n):
        err = errors[i] if i < len(errors) else ""
        ttft = ttfts[i]
        gaps = itls[i] if i < len(itls) else None
        if err or not isinstance(ttft, (int, float)) or ttft <= 0 or not isinstance(gaps, list):
            skipped += 1
            examples.append(f"request {i}: {'error: ' + str(err)[:100] if err else 'no ttft/itls'}")
            continue
        plens = doc.get("input_lens")
        plen = plens[i] if isinstance(plens, list) and i < len(plens) and isinstance(plens[i], int) else None
        reqs.append(ClientRequest(f"vllm-bench-{i}", starts[i], cumulative(float(starts[i]), float(ttft), gaps),
                                  prompt_tokens=plen))
    if n == 0:
        raise UserError(f"{path}: the result lists no requests")
    return to_timeline(reqs, FORMAT, path, instance=instance, clock=clock, total=n, skipped=skipped, aligned=aligned,
                       examples=examples, notes=notes, backend=doc.get("backend"), model=doc.get("model_id"),
                       date=doc.get("date"))
