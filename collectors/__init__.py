"""Collectors: readers that turn every real source into the Timeline data contract.

``load(path_or_paths, format="auto", **options)`` is the one entry point: it detects each input's
format (:mod:`.registry`), reads it with its collector and aligns several inputs on one clock.

Rooms: ``prometheus/``, ``logs/``, ``traces/`` (``nsys/``, ``kineto/``, ``steps/``), ``gpu/``,
``clients/``, and the run directory (``engine_run``); ``text_input`` and ``provenance`` are what they
all share. May import: mixdiag.schema, mixdiag.errors, mixdiag.wire, numpy, pandas, and each other
(acyclic; each sub-package's docstring says which). Never the engine, the diagnosis, the dashboard,
the commands or the report.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from mixdiag.errors import UserError

__all__ = ["load", "expand", "rename_instances"]
#: Formats that carry only SM activity: given with step sources, they fill ``steps.sm_active``.
SM_ACTIVITY_FORMATS = ("dcgm", "nvml-csv")
#: URL formats whose window can hold dcgm-exporter series beside the engine's (a Prometheus server
#: scraping both, an exporter's own URL): their DCGM series become ``sm_active`` on their own
#: interval rows, here, once, after the reader (files of DCGM scrapes are the ``dcgm`` format's).
GPU_FILLED_FORMATS = ("prom-http", "prom-endpoint")


def expand(paths: Iterable[str | os.PathLike], fmt: str = "auto", ignored: list | None = None
           ) -> list[tuple[str, str]]:
    """``(source, format)`` for every input; a directory no collector claims as a whole is
    replaced by the files in it that one does (the others are appended to ``ignored``).
    UserError when nothing is readable."""
    from mixdiag.collectors import registry

    out = []
    for p in paths:
        name = os.fspath(p)
        if fmt != "auto":
            registry.module(fmt)
            if not name.startswith(("http://", "https://")) and not os.path.exists(name):
                raise UserError(f"{name}: no such file or directory")
            out.append((name, fmt))
            continue
        try:
            out.append((name, registry.detect(name)))
        except UserError:
            if not os.path.isdir(name):
                raise
            inside = []
            files = sorted(f for f in Path(name).iterdir() if f.is_file() and f.stat().st_size > 0)
            for f in files:
                try:
                    inside.append((str(f), registry.detect(f)))
                except UserError:
                    if ignored is not None:
                        ignored.append(str(f))
            if not inside:
                raise UserError(f"{name}: nothing readable in this directory ({len(files)} non-empty files, "
                                "none in a known format)") from None
            out += inside
    if not out:
        raise UserError("no input given")
    return out


def load(path_or_paths, format: str = "auto", **options) -> Timeline:  # noqa: A002  (the CLI's word)
    """Read one input or several into one Timeline on one clock.

    ``format`` is "auto" (detect by content) or a registered format name applied to every input;
    ``options`` go to each collector's ``read`` (e.g. ``instance=``, ``step_gap_s=``). Instances
    of different inputs that share a name are renamed ``<name>@<input stem>`` so none is lost.
    DCGM / NVML inputs given together with step sources are mapped onto those steps
    (``steps.sm_active``) by their collectors; DCGM series inside a Prometheus window or a sampled
    URL fill its own rows (:data:`GPU_FILLED_FORMATS`).
    """
    from mixdiag.schema import Timeline  # pandas: only when something is read, not for `mixdiag --help`

    from mixdiag.collectors import registry

    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    explicit = options.pop("join", None)  # --instance NAME=PATH,...: which inputs are one server (join.py)
    ignored: list[str] = []
    given = [(os.fspath(p), src, fmt) for p in paths for src, fmt in expand([p], format, ignored)]
    inputs = [(src, fmt) for _, src, fmt in given]
    if len(inputs) > 1 and options.get("instance"):
        raise UserError("--instance names one input's instance; give it with a single input")
    # SM-activity sources (DCGM, NVML) are mapped onto the steps of the other inputs when there are any.
    sm = [(src, fmt) for src, fmt in inputs if fmt in SM_ACTIVITY_FORMATS]
    if sm and len(sm) < len(inputs):
        given = [g for g in given if g[2] not in SM_ACTIVITY_FORMATS]
        inputs = [(src, fmt) for src, fmt in inputs if fmt not in SM_ACTIVITY_FORMATS]
    else:
        sm = []
    zone = options.pop("log_zone_s", None)  # --log-zone: the zone a log's local clock ran in
    timelines = [_read(src, fmt, options) for src, fmt in inputs]
    if zone is not None:
        from mixdiag.collectors.logs.log_zone import apply_zone
        timelines = apply_zone(timelines, int(zone))
    if ignored:  # files of a directory in no known format: say so, never drop them silently
        tl = timelines[0]
        timelines[0] = Timeline(tl.steps, tl.tokens, tl.series, {**tl.meta, "inputs_ignored": ignored}, tl.activity)
    if len(timelines) > 1:  # a year-less log (vLLM) takes its year from the unix-clock inputs beside it
        from mixdiag.collectors.logs.log_lines import align_assumed_years
        timelines = align_assumed_years(timelines, inputs, lambda s, f, **kw: _read(s, f, kw), options)
        from mixdiag.collectors.logs.log_zone import align_naive_zones
        from mixdiag.collectors.join import hints
        if zone is None:  # a log in local time beside unix-clock inputs of the same server (same model, when named)
            timelines = align_naive_zones(timelines, [hints(src, fmt)[0] for src, fmt in inputs])
    timelines, inputs = _join(timelines, given, explicit)
    tl = timelines[0] if len(timelines) == 1 else _combine(timelines, inputs)
    for src, fmt in sm:
        tl = registry.module(fmt).read(src, steps=tl, **options)
    return tl


def _read(src: str, fmt: str, options: dict) -> Timeline:
    """One input through its collector; GPU series it carries filled onto its rows (GPU_FILLED_FORMATS)."""
    from mixdiag.collectors import registry

    tl = registry.module(fmt).read(src, **options)
    if fmt in GPU_FILLED_FORMATS:
        from mixdiag.collectors.gpu import dcgm

        tl = dcgm.fill_intervals(tl, options.get("gpu_map"))  # DCGM_FI_* series -> sm_active per interval
    return tl


def _join(timelines: list[Timeline], given: list[tuple[str, str, str]], explicit: dict | None):
    """The inputs of one server joined into one Timeline each (:mod:`.join`); with several inputs
    (or ``--instance``) every instance's inputs are listed in ``meta["instance_sources"]``."""
    from mixdiag.collectors import join

    if len(timelines) == 1 and not explicit:  # one input: the collector's own result, untouched
        return timelines, [given[0][1:]]
    inputs = [join.Input(g, src, fmt, tl, *join.hints(src, fmt)) for (g, src, fmt), tl in zip(given, timelines)]
    out, pairs = [], []
    for srv in join.plan(inputs, explicit):
        if len(srv.members) == 1 and srv.name is None:
            inp = srv.members[0]
            tl = inp.timeline
            tl.meta["instance_sources"] = join.sources_of(inp)
        else:
            tl = join.join_server(srv)
        out.append(tl)
        pairs.append((srv.members[0].source, srv.members[0].fmt))
    return out, pairs


def _combine(timelines: list[Timeline], inputs: list[tuple[str, str]]) -> Timeline:
    from mixdiag.schema import SchemaError, Timeline

    timelines = _disambiguate(timelines, [src for src, _ in inputs])
    clocks = {tl.meta.get("clock") for tl in timelines}
    if len(clocks) > 1:
        which = ", ".join(f"{Path(src).name}: {tl.meta.get('clock')}" for (src, _), tl in zip(inputs, timelines))
        raise UserError(f"inputs cannot be aligned on one clock ({which})")
    try:
        tl = Timeline.concat(timelines)
    except SchemaError as e:
        raise UserError(f"inputs cannot be combined: {e}") from None
    tl.meta["instance_sources"] = {k: v for t in timelines for k, v in t.meta.get("instance_sources", {}).items()}
    return tl


def _disambiguate(timelines: list[Timeline], sources: list[str]) -> list[Timeline]:
    seen: dict[str, int] = {}
    for tl in timelines:
        for inst in tl.instances:
            seen[inst] = seen.get(inst, 0) + 1
    out = []
    for tl, src in zip(timelines, sources):
        clash = {i: f"{i}@{Path(src).name.split('.')[0]}" for i in tl.instances if seen[i] > 1}
        out.append(rename_instances(tl, clash) if clash else tl)
    return out


def rename_instances(tl: Timeline, mapping: dict[str, str]) -> Timeline:
    """A copy of ``tl`` with instances renamed in every frame and in ``meta``."""
    from mixdiag.schema import Timeline  # pandas: only when something is read, not for `mixdiag --help`

    def ren(df):
        df = df.copy()
        df["instance"] = df["instance"].map(lambda i: mapping.get(i, i))
        return df

    meta = dict(tl.meta)
    meta["signals"] = {mapping.get(k, k): v for k, v in tl.meta.get("signals", {}).items()}
    sources = []
    for s in tl.meta.get("sources", []):
        s = dict(s)
        if isinstance(s.get("instances"), list):
            s["instances"] = [mapping.get(i, i) for i in s["instances"]]
        sources.append(s)
    meta["sources"] = sources
    if "instance_sources" in meta:  # join.py's listing: keyed by instance, naming its views
        meta["instance_sources"] = {mapping.get(k, k): {**v, "views": [mapping.get(i, i) for i in v.get("views", [])],
                                                        "sources": [{**s, "view": mapping.get(s.get("view"), s.get("view"))}
                                                                    for s in v.get("sources", [])]}
                                    for k, v in meta["instance_sources"].items()}
    act = tl.activity
    if len(act):  # categorical: rename the categories, not the rows
        act = act.assign(instance=act["instance"].cat.rename_categories(lambda i: mapping.get(i, i)))
    return Timeline(ren(tl.steps), ren(tl.tokens), ren(tl.series), meta, act)
