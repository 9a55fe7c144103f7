"""Every flag group more than one verb shares, and the mapping of its parsed values onto what the
code below the CLI takes (a config object or keyword options), so the engine and the collectors
never see an ``argparse`` namespace.

Groups: ``output`` (every verb: :func:`common_parser`), ``instrumentation`` (``mixdiag run``:
:func:`add_instrumentation_flags` -> :func:`instrumentation_config`; ``mixdiag serve`` reads its own
subset through the same mapping), step finding in traces (ingest, analyze: :func:`add_step_flags`
-> :func:`step_options`), live sources and GPU mapping (ingest, analyze: :func:`add_source_flags`
-> :func:`source_options`) and ``serving`` (dashboard, demo, watch: :func:`add_serve_flags`).

Building the parser (``mixdiag --help``) must stay fast, so this module imports only the standard
library and the base layer at import time; the engine (torch) and the collectors are imported by
the mapping functions, when a verb runs.
"""
from __future__ import annotations

import argparse
import math

from mixdiag.errors import UserError
from mixdiag.wire import DOMAIN


def common_parser() -> argparse.ArgumentParser:
    """The parent parser of every verb: the ``output`` group (``--json``, ``-v``, ``-q``, ``--debug``)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")
    g.add_argument("-v", "--verbose", action="count", default=0, help="more detail (repeatable)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes")
    g.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    return p


# ---- instrumentation (mixdiag run) ------------------------------------------------------------
def add_instrumentation_flags(parser) -> None:
    """Add the instrumentation flags to a ``mixdiag run``-style parser."""
    g = parser.add_argument_group("instrumentation")
    g.add_argument("--serve", type=int, metavar="PORT", default=None,
                   help="serve Prometheus /metrics on 127.0.0.1:PORT during the run (0 = any free port)")
    g.add_argument("--linger", type=float, metavar="S", default=0.0,
                   help="keep serving /metrics S seconds after the run (with --serve)")
    g.add_argument("--log-format", choices=("vllm", "sglang", "both"), default=None,
                   help="write vLLM 'Iteration(N)' and/or SGLang 'Prefill/Decode batch' lines to DIR/engine.log")
    g.add_argument("--decode-log-interval", type=int, metavar="N", default=40,
                   help="SGLang Decode-batch line every N decode steps (SGLang's default 40)")
    g.add_argument("--profile", metavar="START:STOP", default=None,
                   help="record a PyTorch-profiler (Kineto) trace of steps START..STOP-1 to DIR/trace.json "
                        "('START:' or 'all': to the end of the run)")
    g.add_argument("--profile-light", action="store_true",
                   help="drop per-operator events from the --profile trace (keeps the step/phase ranges and GPU "
                        "kernels; for long windows)")
    g.add_argument("--scrape-interval", type=float, metavar="S", default=None,
                   help="write the engine's /metrics every S seconds to DIR/scrapes/<unix_time>.prom "
                        "(the final scrape always goes to DIR/metrics.prom)")
    g.add_argument("--metrics-dialect", choices=("mixdiag", "vllm", "sglang"), default="mixdiag",
                   help="series /metrics and the scrapes expose: mixdiag's own, or exactly vLLM's / SGLang's")
    g.add_argument("--nvtx", action="store_true", default=True, help=f"NVTX ranges in domain '{DOMAIN}' (default on)")
    g.add_argument("--no-nvtx", dest="nvtx", action="store_false", help="no NVTX ranges")


def instrumentation_config(args):
    """The engine's ``InstrumentationConfig`` for parsed instrumentation flags (UserError on bad values).

    Flags a verb does not define take the config's defaults (``mixdiag serve`` has no ``--serve``).
    """
    from mixdiag.engine.telemetry.instrumentation import InstrumentationConfig
    from mixdiag.engine.telemetry.loglines import parse_formats
    from mixdiag.engine.telemetry.profiler import parse_window

    return InstrumentationConfig(
        nvtx=bool(getattr(args, "nvtx", True)),
        serve_port=getattr(args, "serve", None),
        linger_s=float(getattr(args, "linger", 0.0) or 0.0),
        log_formats=parse_formats(args.log_format) if getattr(args, "log_format", None) else (),
        decode_log_interval=int(getattr(args, "decode_log_interval", 40)),
        profile=parse_window(args.profile) if getattr(args, "profile", None) else None,
        profile_ops=not getattr(args, "profile_light", False),
        scrape_interval_s=getattr(args, "scrape_interval", None),
        metrics_dialect=getattr(args, "metrics_dialect", None) or "mixdiag",
    )


def instrumentation_argv(config) -> list[str]:
    """The instrumentation flags that reproduce ``config`` (the inverse of :func:`instrumentation_config`)."""
    out: list[str] = [] if config.nvtx else ["--no-nvtx"]
    if config.serve_port is not None:
        out += ["--serve", str(config.serve_port)]
    if config.linger_s:
        out += ["--linger", repr(config.linger_s)]
    if config.log_formats:
        out += ["--log-format", "both" if len(config.log_formats) > 1 else config.log_formats[0]]
    if config.decode_log_interval != 40:
        out += ["--decode-log-interval", str(config.decode_log_interval)]
    if config.profile is not None:
        start, stop = config.profile
        out += ["--profile", f"{start}:{'' if stop is None else stop}"]
    if not config.profile_ops:
        out += ["--profile-light"]
    if config.scrape_interval_s is not None:
        out += ["--scrape-interval", repr(config.scrape_interval_s)]
    if config.metrics_dialect != "mixdiag":
        out += ["--metrics-dialect", config.metrics_dialect]
    return out


# ---- step finding in traces (ingest, analyze) -------------------------------------------------
def add_step_flags(p) -> None:
    """Add ``--step-gap-ms`` and ``--step-range NAME`` (how trace collectors find steps)."""
    p.add_argument("--step-gap-ms", type=float, default=None,
                   help="trace collectors without step ranges: GPU idle gap that separates steps "
                        "(default: from the trace's own gap distribution)")
    p.add_argument("--step-range", default=None, metavar="NAME",
                   help="trace collectors: treat ranges of this name on the engine thread as steps")


def step_options(args) -> dict:
    """Collector options from the step flags (only those given)."""
    out = {}
    gap = getattr(args, "step_gap_ms", None)
    if gap is not None:
        if not gap > 0:
            raise UserError("--step-gap-ms must be > 0")
        out["step_gap_s"] = gap / 1e3
    name = getattr(args, "step_range", None)
    if name is not None:
        if not name.strip():
            raise UserError("--step-range needs a range name")
        out["step_range"] = name.strip()
    if getattr(args, "quiet", False) or getattr(args, "json", False):
        out["progress"] = False  # long trace ingests draw a bar on stderr otherwise (terminals only)
    return out


# ---- live sources and GPU mapping (ingest, analyze) -------------------------------------------
def add_source_flags(p) -> None:
    """Flags of live sources and GPU mapping, shared by ingest and analyze."""
    g = p.add_argument_group("live /metrics URL and GPU mapping")
    g.add_argument("--duration", type=float, default=None, metavar="S",
                   help="sample an engine's /metrics URL for S seconds (default 60; 0 = one dump, since-start summary)")
    g.add_argument("--interval", type=float, default=None, metavar="S",
                   help="scrape the /metrics URL every S seconds (default 1)")
    g.add_argument("--clock-offset", type=float, default=None, metavar="S",
                   help="vllm bench serve results: unix time minus time.perf_counter() on the client host "
                        "(python3 -c 'import time; print(time.time() - time.perf_counter())' there): "
                        "puts its perf_counter start times on the capture's clock")
    g.add_argument("--log-zone", default=None, metavar="+HH:MM",
                   help="the UTC offset of the server's clock when its vLLM/SGLang log was written (they print "
                        "local time without a zone), e.g. +08:00; default: inferred from the unix-clock inputs "
                        "read with it (scrapes, traces, client records), else read as UTC")
    g.add_argument("--gpu-map", metavar="INST=GPU,...",
                   help="which GPUs serve which instance for DCGM sm_active, e.g. vllm-0:8000=0,vllm-0:8000=1")


def add_instance_flags(p) -> None:
    """``--instance NAME=PATH[,PATH...]`` (repeatable): which inputs are one server (collectors/join.py)."""
    g = p.add_argument_group("one server, every source")
    g.add_argument("--instance", action="append", default=None, metavar="NAME=PATH[,PATH...]", dest="join",
                   help="these inputs (log, scrape directory or URL, client records, trace) are one server named "
                        "NAME (repeatable; paths not among INPUT are added). Without it, inputs whose time spans "
                        "overlap and whose model names agree are joined into one server")


def instance_options(args) -> dict:
    """``load`` options from :func:`add_instance_flags`: ``join={NAME: [PATH, ...]}`` (only when given)."""
    out: dict[str, list[str]] = {}
    for spec in getattr(args, "join", None) or ():
        name, sep, paths = spec.partition("=")
        items = [x.strip() for x in paths.split(",") if x.strip()]
        if not sep or not name.strip() or not items:
            raise UserError(f"--instance {spec}: expected NAME=PATH[,PATH...]")
        if "@" in name:
            raise UserError(f"--instance {spec}: NAME may not contain '@' (it separates an instance's views)")
        if name.strip() in out:
            raise UserError(f"--instance {name.strip()} given twice")
        out[name.strip()] = items
    return {"join": out} if out else {}


def source_options(args) -> dict:
    """``load`` options from :func:`add_source_flags` (only those given)."""
    from mixdiag.collectors.gpu.dcgm import parse_gpu_map

    out = {}
    if getattr(args, "duration", None) is not None:
        out["duration_s"] = args.duration
    if getattr(args, "interval", None) is not None:
        out["interval_s"] = args.interval
    if getattr(args, "clock_offset", None) is not None:
        if not math.isfinite(args.clock_offset):
            raise UserError("--clock-offset must be a finite number of seconds")
        out["clock_offset_s"] = args.clock_offset
    if getattr(args, "gpu_map", None):
        out["gpu_map"] = parse_gpu_map(args.gpu_map)
    if getattr(args, "log_zone", None) is not None:
        from mixdiag.collectors.logs.log_zone import parse_zone
        try:
            out["log_zone_s"] = parse_zone(args.log_zone)
        except ValueError as e:
            raise UserError(f"--log-zone: {e}") from None
    return out


# ---- serving (dashboard, demo, watch) ---------------------------------------------------------
def add_serve_flags(p, port: int = 8050) -> None:
    """--host/--port shared by the verbs that serve (dashboard, demo, watch)."""
    g = p.add_argument_group("serving")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    g.add_argument("--port", type=int, default=port, help=f"port (default {port})")


# ---- two captures (diff) ----------------------------------------------------------------------
def add_diff_flags(p) -> None:
    """``BEFORE AFTER`` (each one path or PATH,PATH,...: one capture read from several inputs) and the
    flags of ``mixdiag diff``."""
    p.add_argument("before", metavar="BEFORE", help="the first capture: a path, or PATH,PATH,... read as one capture")
    p.add_argument("after", metavar="AFTER", help="the second capture, likewise")
    p.add_argument("--format", default="auto", help="input format for every path (default: auto-detect)")
    p.add_argument("--tuned", metavar="FILE",
                   help="the 'mixdiag tune --json' document (or 'mixdiag tune --save FILE') made on BEFORE: show "
                        "its recommendation's predicted P99 ITL/TTFT against what AFTER measured")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page (never overwrites)")
    p.add_argument("--top", type=int, default=5, metavar="N", help="kernels listed per step class (default 5)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes diagnosing a fleet's instances (default: the CPUs other work leaves idle)")


def side_paths(text: str) -> list[str]:
    """One side's paths: ``text`` itself when it names an existing path (a comma in a file name), else its
    comma-separated parts; UserError when empty."""
    from pathlib import Path

    if Path(text).exists():
        return [text]
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts:
        raise UserError(f"{text!r}: expected a path or PATH,PATH,...")
    return parts


def check_report_args(args) -> None:
    """The checks every report-writing command makes on ``--top``, ``--jobs`` and ``--html`` (one-line
    errors; an existing ``--html`` file is never overwritten)."""
    from pathlib import Path

    if args.top < 0:
        raise UserError("--top must be >= 0")
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs must be >= 1")
    if args.html and Path(args.html).exists():
        raise UserError(f"{args.html} exists; choose another path for --html (mixdiag never overwrites your files)")
