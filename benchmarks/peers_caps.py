"""Which of the peer analyzers' summaries mixdiag also gives, read from its own ``analyze --json`` documents.

Pure functions (no files, no processes) so a test can feed them a dict. The mixdiag column is never typed
by hand: a summary counts as given when the keys of the ``breakdown`` section (issue 25 item 1) name it,
when ``mixdiag diff`` answers ``--help``, or when every spike carries a cause. The peer columns say what
the peers' own documentation offers (shared/reference/formats.md §5: nsys-ai 0.3.0, HTA 0.5.0).
"""
from __future__ import annotations

import re

#: summary -> (nsys-ai offers it, HTA offers it, key patterns in mixdiag's ``breakdown`` that give it;
#: every pattern must match some key). Patterns are lenient about spelling (utilisation/utilization, memcpy/copy).
SUMMARIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "per-GPU top kernels": ("yes (summary, hotspot skills)", "yes (kernel breakdown)", (r"top_?kernel|^kernels$",)),
    "GPU utilisation": ("yes (idle summary)", "yes (temporal breakdown)", (r"utili[sz]ation|util|busy",)),
    "idle split host/kernel/other": ("gaps only (gpu_idle_gaps)", "yes (idle-time breakdown)",
                                     (r"host_?wait", r"kernel_?wait")),
    "comm time + overlap": ("yes (overlap, nccl)", "yes (comm-comp overlap)", (r"comm|nccl|collective", r"overlap")),
    "memcpy volume/bandwidth": ("yes (H2D transfer findings)", "yes (memory bw summary)",
                                (r"memcpy|copy|copies", r"bytes|bandwidth|gbps|volume")),
    "straggler ranks": ("no", "yes (needs ProfilerStep)", (r"straggler",)),
    "before/after diff": ("yes (diff --gate)", "yes (TraceDiff)", ()),
    "cause per spike": ("no", "no", ()),
}
NOT_IN_BUILD = "not in this build"


def keys_of(node, prefix: str = "") -> list[str]:
    """Every dict key under ``node`` as a dotted path (lists are walked through, their index left out)."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.append(path)
            out.extend(keys_of(v, path))
    elif isinstance(node, list):
        for v in node:
            out.extend(keys_of(v, prefix))
    return out


def _match(patterns: tuple[str, ...], keys: list[str]) -> str | None:
    """The first key matching each pattern (last path element), joined; None unless all match."""
    found = []
    for pat in patterns:
        rx = re.compile(pat, re.I)
        hit = next((k for k in keys if rx.search(k.rsplit(".", 1)[-1])), None)
        if hit is None:
            return None
        found.append(hit)
    return ", ".join(dict.fromkeys(found))


def spike_causes(doc: dict) -> str | None:
    """Evidence that every spike in ``doc`` carries a cause (None when no spike or a spike without one)."""
    spikes = doc.get("spikes") or []
    if spikes and all(s.get("cause") for s in spikes):
        return f"spikes[].cause ({len(spikes)} spikes)"
    return None


def mixdiag_gives(summary: str, docs: list[dict], diff_available: bool) -> tuple[str, str]:
    """``(status, evidence)`` for one summary over mixdiag's JSON documents: status ``yes``, ``no`` or
    ``not in this build`` (the section or command it would live in is absent)."""
    patterns = SUMMARIES[summary][2]
    if summary == "before/after diff":
        return ("yes", "mixdiag diff --help") if diff_available else (NOT_IN_BUILD, "no `mixdiag diff` command")
    if summary == "cause per spike":
        hits = [e for e in (spike_causes(d) for d in docs) if e]
        return ("yes", f"{hits[0]}; {len(hits)} of {len(docs)} inputs had spikes") if hits else ("no", "no spike had a cause")
    with_bd = [d["breakdown"] for d in docs if isinstance(d.get("breakdown"), (dict, list))]
    if not with_bd:
        return NOT_IN_BUILD, "no `breakdown` key in analyze --json"
    hits = [h for h in (_match(patterns, keys_of(b, "breakdown")) for b in with_bd) if h]
    if hits:
        return "yes", f"{hits[0]} ({len(hits)} of {len(with_bd)} inputs)"
    return "no", "breakdown has no key for it"


def capability_rows(docs: list[dict], diff_available: bool) -> list[dict]:
    """One row per peer summary: what nsys-ai and HTA offer, and what mixdiag gives (computed)."""
    rows = []
    for name, (nsys_ai, hta, _) in SUMMARIES.items():
        status, evidence = mixdiag_gives(name, docs, diff_available)
        rows.append({"summary": name, "nsys-ai": nsys_ai, "HTA": hta, "mixdiag": status, "evidence": evidence})
    return rows


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width table (no third-party package: the script also prints when imports fail)."""
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    line = lambda vals: "  ".join(str(v).ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line([r.get(c, "") for c in columns])
                                                                         for r in rows)])
