"""One server, every source: which inputs of one ``load`` belong to the same server, and their rows
joined so each server is one instance whose step rows and interval rows are each counted once.

Why: a server's log, its scrape directory (or ``/metrics`` URL), the client records of the load
that drove it and its trace are several views of one engine. Read apart they become instances
"engine", "scrapes" and "client": the evidence sits in one, the latency in another, and a stall the
client and the scrapes both saw is counted twice.

Which inputs are one server (:func:`plan`), in this order:

1. ``explicit`` (``analyze --instance NAME=PATH[,PATH...]``): those inputs are server NAME.
2. An input that holds several instances itself (a fleet's Prometheus, DP ranks split by their
   ``engine``/``dp_rank`` labels, a multi-engine run directory) is left as its own labels name it.
3. The other inputs are joined greedily when nothing separates them: their time spans overlap by at
   least half of the shorter one (:data:`MIN_OVERLAP`: a log and the scrapes of one run cover the same
   minutes; a few seconds of start/stop offset do not matter), their model names agree (``model_name``
   labels in /metrics, ``model=``/``model_path=``/``served_model_name=`` in a log's start-up lines,
   the ``model`` of a client file's header; an input that names none agrees with any), a client
   file's URL (``host:port``) agrees with a URL input's instance name, and the server does not
   already hold an input of the same role (one log, one scrape stream, one client file, one trace
   per server: two logs side by side are two servers). Basis: a capture is taken of the server
   under study; inputs that overlap in time and name the same model with no label telling them
   apart are the same engine far more often than two identical engines captured together, and
   ``--instance`` (or different model names / labels) separates the rare opposite case.

How one server's inputs become rows (:func:`join_server`): step rows of all its inputs are merged
into one step view, named NAME, aligned by time: the spine is an input whose clock resolves its steps (a
client's per-token clock before a log's whole-second stamps), the engine's own step records (a trace, per-step
log lines on a fine clock) before steps rebuilt from a client's reads, and the others fill the spine rows'
empty columns from the step that ended nearest in time, only where their clock resolution allows
it (within half the spine's median step); interval rows (scrapes, a log's stats lines) likewise
into one interval view, named NAME@intervals (the diagnosis fuses NAME and NAME@... as views of
one engine, docs/contracts.md section 5), with a longer interval lending only its gauges and
ratios (counts over 10 s do not belong to a 1 s row). Rows that align with nothing are dropped
from the view and counted in ``meta["instance_sources"][NAME]["notes"]``, never silently.
``meta["instance_sources"]`` lists each server's inputs (path, format, role, view).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from mixdiag.collectors.join_cells import POINT_SERIES, fill_overlaps, fill_points, fill_sums, fill_window
from mixdiag.collectors.join_spine import resolution, spine_first
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

#: Overlap of two inputs' time spans, as a share of the shorter span, above which they may be one
#: server (the same rule diagnosis/evidence/fusion.py applies to a lone log and scrape directory).
MIN_OVERLAP = 0.5
#: Interval rows of another source fill a row's counts only when their lengths are this close
#: (ratio of the longer to the shorter); otherwise only its gauges and ratios.
SAME_LENGTH = 2.0
#: Interval columns that describe a state or a ratio, not a count over the interval.
INTENSIVE = ("running_reqs", "waiting_reqs", "kv_usage", "expert_imbalance", "sm_active", "itl_mean_s",
             "itl_p50_s", "itl_p90_s", "itl_p99_s", "ttft_p50_s", "ttft_p99_s", "large_step_share", "graph_mode")
#: Bytes of a file's head searched for model names.
HEAD_BYTES = 256 * 1024

_MODEL_PATTERNS = (re.compile(rb'model_name="([^"]+)"'),
                   # vLLM's engine config line: served_model_name=tiny-llama (0.32: bare), ['m'] or 'm' (older)
                   re.compile(rb"served_model_name=\[?'?([^',\s\]]+)'?"))
#: the model path or name, read only where no served name is printed: the metrics' model_name label is
#: the served name, which defaults to the --model argument
_MODEL_ARG = re.compile(rb"\bmodel(?:_path)?='([^']+)'")
_ROLES = {"vllm-log": "log", "sglang-log": "log", "prom-text": "scrapes", "prom-endpoint": "scrapes",
          "prom-http": "scrapes", "client-load": "client", "vllm-bench": "client", "guidellm": "client",
          "nsys-sqlite": "trace", "kineto-json": "trace", "mixdiag-run": "run", "host-samples": "host"}


@dataclass
class Input:
    """One input of a load: what was given, its format, its Timeline and the hints read off it."""

    given: str
    source: str
    fmt: str
    timeline: Timeline
    models: frozenset = frozenset()
    url: str | None = None

    @property
    def role(self) -> str:
        return _ROLES.get(self.fmt, self.fmt)


@dataclass
class Server:
    """Inputs that are one server, and why."""

    name: str | None
    members: list = field(default_factory=list)
    rule: str = "single input"


def hints(src: str, fmt: str) -> tuple[frozenset, str | None]:
    """Model names and (client files) the target URL's ``host:port`` read off an input's head."""
    if src.startswith(("http://", "https://")):
        return frozenset(), None
    p = Path(src)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file())
        p = files[0] if files else None
    if p is None or p.suffix in (".sqlite", ".sqlite3", ".db", ".parquet"):
        return frozenset(), None
    try:
        with open(p, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return frozenset(), None
    url = None
    if fmt == "client-load":
        try:
            first = json.loads(head.split(b"\n", 1)[0])
            models = frozenset([str(first["model"])]) if first.get("model") else frozenset()
            m = re.match(r"https?://([^/]+)", str(first.get("url") or ""))
            return models, (m.group(1) if m else None)
        except (ValueError, KeyError, AttributeError):
            return frozenset(), None
    models = {m.decode("utf-8", "replace") for pat in _MODEL_PATTERNS for m in pat.findall(head)} - {"None"}
    if not models:
        models = {m.decode("utf-8", "replace") for m in _MODEL_ARG.findall(head)}
    # a model given as a path is also known by its last part (a served name, a label) - one model either way
    models |= {m.rstrip("/").rsplit("/", 1)[-1] for m in models if "/" in m}
    return frozenset(models), url


def _span(tl: Timeline) -> tuple[float, float] | None:
    return tl.span()


def _overlap(a, b) -> bool:
    if a is None or b is None:
        return False
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    shorter = min(a[1] - a[0], b[1] - b[0])
    return hi >= lo if shorter <= 0 else hi - lo >= MIN_OVERLAP * shorter


def _agrees(inp: Input, server: Server) -> bool:
    """Whether nothing separates ``inp`` from the inputs already in ``server``."""
    for other in server.members:
        if other.role == inp.role or not _overlap(_span(inp.timeline), _span(other.timeline)):
            return False
        if inp.models and other.models and not inp.models & other.models:
            return False
        for a, b in ((inp, other), (other, inp)):
            if a.url and b.fmt in ("prom-endpoint", "prom-http") and a.url not in b.timeline.instances:
                return False
    return True


def _same_path(a: str, b: str) -> bool:
    if a.startswith(("http://", "https://")) or b.startswith(("http://", "https://")):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def plan(inputs: list[Input], explicit: dict[str, list[str]] | None = None) -> list[Server]:
    """The servers ``inputs`` form (module doc: explicit names, then labels, then overlap and hints)."""
    servers: list[Server] = []
    taken: set[int] = set()
    for name, paths in (explicit or {}).items():
        srv = Server(name, rule="--instance")
        for path in paths:
            hit = [i for i, inp in enumerate(inputs) if _same_path(inp.given, path)]
            if not hit:
                raise UserError(f"--instance {name}={path}: {path} is not one of the inputs")
            if taken & set(hit):
                raise UserError(f"--instance {name}={path}: {path} is already named by another --instance")
            many = [inputs[i] for i in hit if len(inputs[i].timeline.instances) > 1]
            if many:
                raise UserError(f"--instance {name}={path}: {path} holds {len(many[0].timeline.instances)} instances "
                                f"({', '.join(many[0].timeline.instances[:3])}...); --instance joins inputs of one server")
            taken |= set(hit)
            srv.members += [inputs[i] for i in hit]
        servers.append(srv)
    for i, inp in enumerate(inputs):
        if i in taken:
            continue
        if len(inp.timeline.instances) != 1:  # its own labels say which instances it holds
            servers.append(Server(None, [inp], rule="labels"))
            continue
        srv = next((s for s in servers if s.rule in ("single input", "overlap") and _agrees(inp, s)), None)
        if srv is None:
            servers.append(Server(None, [inp]))
        else:
            srv.members.append(inp)
            srv.rule = "overlap"
    for srv in servers:
        if srv.name is None:
            srv.name = _name_of(srv)
    return servers


def _name_of(srv: Server) -> str | None:
    """A joined server's name: a URL input's instance (``host:port``), else its one model name, else
    the first input's instance; None for a single input (it keeps its own names)."""
    if len(srv.members) == 1:
        return None
    for m in srv.members:
        if m.fmt in ("prom-endpoint", "prom-http"):
            return m.timeline.instances[0]
    models = set().union(*(m.models for m in srv.members))
    if len(models) == 1:
        return models.pop()
    return srv.members[0].timeline.instances[0]


def _empty_cells(df: pd.DataFrame, col: str) -> pd.Series:
    s = df[col]
    if s.dtype == object or pd.api.types.is_string_dtype(s):
        return s.isna() | s.isin(["unknown", ""])
    return s.isna()


def _fill(spine: pd.DataFrame, other: pd.DataFrame, tolerance: float, cols) -> tuple[pd.DataFrame, int]:
    """``spine`` with its empty cells of ``cols`` taken from the row of ``other`` that ended nearest
    in time (within ``tolerance`` s); and how many rows of ``other`` lent to none."""
    if not len(other) or not np.isfinite(tolerance) or tolerance <= 0:
        return spine, len(other)
    a = spine.reset_index(drop=True).assign(_pos=np.arange(len(spine))).sort_values("t_end_s", kind="stable")
    b = other[["t_end_s", *cols]].reset_index(drop=True).assign(_src=np.arange(len(other)))
    b = b.sort_values("t_end_s", kind="stable")
    m = pd.merge_asof(a[["t_end_s", "_pos"]], b.rename(columns={c: f"_o_{c}" for c in cols}), on="t_end_s",
                      direction="nearest", tolerance=tolerance)
    m = m.sort_values("_pos")
    out = spine.reset_index(drop=True).copy()
    for c in cols:
        if c not in out.columns:  # a column only the other source has (a log's own iteration number): empty here
            out[c] = pd.Series(np.nan, index=out.index, dtype=other[c].dtype if other[c].dtype.kind == "f" else object)
        take = _empty_cells(out, c).to_numpy() & m[f"_o_{c}"].notna().to_numpy()
        if c in ("kind", "graph_mode", "granularity", "step_source") or out[c].dtype == object:
            take &= ~m[f"_o_{c}"].isin(["unknown", ""]).to_numpy()
        if take.any():
            out.loc[take, c] = m.loc[take, f"_o_{c}"].to_numpy() if take.any() else out.loc[take, c]
    unused = len(other) - int(m["_src"].dropna().nunique())
    return out, unused


def _merge_view(parts: list[tuple[Input, pd.DataFrame]], steps: bool, notes: list[str]) -> pd.DataFrame:
    """One view's rows from several inputs' rows (module doc)."""
    parts = spine_first(parts, steps)
    spine_inp, spine = parts[0]
    length = float((spine["t_end_s"] - spine["t_start_s"]).median()) if len(spine) else np.nan
    gaps = spine["t_end_s"].sort_values().diff().median() if len(spine) > 1 else np.nan
    typical = np.nanmax([length, gaps]) if np.isfinite([length, gaps]).any() else np.nan
    skip = {"instance", "step", "t_start_s", "t_end_s", "granularity", "step_source"}
    for inp, rows in parts[1:]:
        res = resolution(rows["t_end_s"])
        tol = 0.5 * typical if np.isfinite(typical) else np.nan
        cols = [c for c in rows.columns if c not in skip]
        if not steps:
            ratio = float((rows["t_end_s"] - rows["t_start_s"]).median()) / length if length > 0 else np.inf
            if not 1 / SAME_LENGTH <= ratio <= SAME_LENGTH:
                cols = [c for c in cols if c in INTENSIVE]
            tol = 0.5 * float((rows["t_end_s"] - rows["t_start_s"]).median()) if ratio > SAME_LENGTH else tol
        if steps and res > tol:
            notes.append(f"{len(rows)} step rows of {inp.given} ({inp.fmt}) not merged: their clock resolution "
                         f"({res:g} s) is coarser than half a step of {spine_inp.given} ({tol:.3g} s)")
            continue
        # which interval cells were empty before this input lent to them (the ones its per-step points may set)
        empty = {} if steps else {c: _empty_cells(spine, c).to_numpy() if c in spine else np.ones(len(spine), bool)
                                  for c in POINT_SERIES}
        spine, unused = _fill(spine, rows, tol, cols)
        if not steps:
            spine = fill_window(spine, rows)
            spine = fill_points(spine, inp, empty, notes)
            spine = fill_sums(spine, inp, notes)
        notes.append(f"{len(rows) - unused} of {len(rows)} {'step' if steps else 'interval'} rows of {inp.given} "
                     f"({inp.fmt}) merged into {spine_inp.given}'s by time"
                     + (f"; {unused} aligned with none" if unused else ""))
    return spine


def join_server(srv: Server) -> Timeline:
    """One Timeline for the server: its step view named ``srv.name``, its interval view
    ``srv.name@intervals`` (just ``srv.name`` when it has only interval rows); the step spine's
    token events on the step view; each input's series on the view its rows went to."""
    name, notes = srv.name, []
    parts: dict[str, list] = {"step": [], "interval": []}
    for inp in srv.members:
        st = inp.timeline.steps
        for gran, bucket in parts.items():
            rows = st[st["granularity"] == gran]
            if len(rows):
                bucket.append((inp, rows))
    view_name = {"step": name, "interval": f"{name}@intervals" if parts["step"] else name}
    frames, spine, members_of = [], {}, {}
    for gran, bucket in parts.items():
        if bucket:
            view = _merge_view(bucket, gran == "step", notes)
            if gran == "step":
                # timed stand-stills of a member without rows of its own (the host sampler) on the steps they hit
                for inp in srv.members:
                    if not any(inp is p for p, _ in bucket):
                        view = fill_overlaps(view, inp, notes)
            if gran == "interval":
                # timed events of a member whose rows went to the step view (an SGLang log, a vLLM log with
                # iteration lines) reach the intervals too
                for inp in srv.members:
                    if not any(inp is p for p, _ in bucket):
                        view = fill_sums(view, inp, notes)
            frames.append(view.assign(instance=view_name[gran]))
            spine[gran] = spine_first(bucket, gran == "step")[0][0]
            members_of[view_name[gran]] = [inp for inp, _ in bucket]
    tokens, series, sources, clock_notes = [], [], [], []
    for inp in srv.members:
        tl = inp.timeline
        view = view_name["step"] if any(inp is p for p, _ in parts["step"]) else view_name["interval"]
        if len(tl.tokens):
            if inp is spine.get("step"):
                tokens.append(tl.tokens.assign(instance=view))
            else:
                notes.append(f"{len(tl.tokens)} token events of {inp.given} not used: the step view keeps "
                             f"{spine['step'].given if 'step' in spine else 'no'} token clock")
        if len(tl.series):
            series.append(tl.series.assign(instance=view))
        sources.append({"path": inp.given, "format": inp.fmt, "role": inp.role, "models": sorted(inp.models),
                        "view": view})
        if tl.meta.get("clock_note"):  # a log's zone placed beside the others' unix clock (logs/log_zone.py)
            clock_notes.append(f"{inp.given}: {tl.meta['clock_note']}")
    signals = {}
    for view, members in members_of.items():  # a view's signals: the best quality its inputs give
        merged = signals.setdefault(view, {})
        for inp in members:
            for sig in inp.timeline.meta.get("signals", {}).values():
                for k, q in sig.items():
                    if _rank(q) > _rank(merged.get(k, "absent")):
                        merged[k] = q
    meta = {"sources": [], "partial": any(m.timeline.meta.get("partial") for m in srv.members)}
    for m, src in zip(srv.members, sources):
        meta["sources"] += m.timeline.meta.get("sources", [])
        old = set(m.timeline.instances)
        for k, v in m.timeline.meta.items():
            if isinstance(v, dict) and v and set(v) <= old:  # per-instance entries follow their rows' view
                meta.setdefault(k, {}).update({src["view"]: x for x in v.values()})
            else:
                meta.setdefault(k, v)
    meta["signals"] = signals
    activity = _spine_activity(srv, spine.get("step"), view_name["step"], notes)
    meta["instance_sources"] = {name: {"sources": sources, "views": list(members_of) or [name],
                                       "joined_by": srv.rule, "notes": notes, "clock_notes": clock_notes}}
    return Timeline(pd.concat(frames, ignore_index=True) if frames else None,
                    pd.concat(tokens, ignore_index=True) if tokens else None,
                    pd.concat(series, ignore_index=True) if series else None, meta, activity)


def _spine_activity(srv: Server, spine, view: str, notes: list[str]):
    """The device rows of the step view's spine (its steps keep their numbers), renamed to the view; other
    members' device rows are dropped with a note (their steps merged into the spine's by time)."""
    keep = None
    for inp in srv.members:
        act = inp.timeline.activity
        if not len(act):
            continue
        if inp is spine and act["instance"].nunique() == 1:
            keep = act.assign(instance=pd.Categorical.from_codes(np.zeros(len(act), dtype=np.int8), [view]))
        else:
            notes.append(f"{len(act)} device rows of {inp.given} not kept: its steps were merged into another "
                         "input's by time, so the rows have no step of the joined view")
    return keep


def _rank(q: str) -> int:
    return {"absent": 0, "estimated": 1, "inferred": 2, "measured": 3}.get(str(q), 0)


def sources_of(inp: Input) -> dict:
    """``meta["instance_sources"]`` entries for an input that joined nothing: one per instance it holds."""
    return {inst: {"sources": [{"path": inp.given, "format": inp.fmt, "role": inp.role,
                                "models": sorted(inp.models), "view": inst}],
                   "views": [inst], "joined_by": "labels" if len(inp.timeline.instances) > 1 else "single input",
                   "notes": [], "clock_notes": [f"{inp.given}: {inp.timeline.meta['clock_note']}"]
                   if inp.timeline.meta.get("clock_note") else []}
            for inst in inp.timeline.instances}
