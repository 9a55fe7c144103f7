"""``mixdiag load`` records (JSON lines: header, one ``request`` per request, summary) -> client tokens.

Times are wall clock (unix seconds, ``clock = "unix"``): the same clock the server's scrape file
names, log timestamps and ``/metrics`` scrape times use on that machine.
"""
from __future__ import annotations

import json
import os

from mixdiag.collectors.clients.client_tokens import ClientRequest, to_timeline
from mixdiag.errors import UserError

FORMAT = "client-load"


def sniff(head: bytes, name: str) -> bool:
    first = head.split(b"\n", 1)[0]
    return b'"format":"mixdiag-load"' in first.replace(b" ", b"")


def read(source, *, instance: str | None = None, **options):
    """Read a load file; requests that failed (non-``ok`` status) are counted in the source entry."""
    path = os.fspath(source)
    reqs, skipped, examples, statuses, total = [], 0, [], {}, 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                skipped += 1
                examples.append(f"line {no}: not JSON: {line[:80]}")
                continue
            if not isinstance(rec, dict) or rec.get("type") != "request":
                continue
            total += 1
            status = str(rec.get("status"))
            statuses[status] = statuses.get(status, 0) + 1
            times = rec.get("token_times_s") or []
            if not isinstance(times, list) or not all(isinstance(t, (int, float)) for t in times):
                skipped += 1
                examples.append(f"line {no}: token_times_s is not a list of numbers")
                continue
            plen = rec.get("prompt_tokens")
            reqs.append(ClientRequest(str(rec.get("request_id", f"line-{no}")), rec.get("start_s"), list(times),
                                      prompt_tokens=plen if isinstance(plen, int) and plen >= 0 else None))
    if total == 0:
        raise UserError(f"{path}: no request records (is this a `mixdiag load` file?)")
    notes = [f"statuses: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}"]
    return to_timeline(reqs, FORMAT, path, instance=instance, clock="unix", total=total, skipped=skipped,
                       examples=examples, notes=notes, statuses=statuses)
