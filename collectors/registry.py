"""Which collector reads which input: the list of collector modules and format detection.

Modules are imported lazily by name, so a collector that is missing or broken makes only its
own format unavailable (with the reason), never the others. Detection is by content: each
module's ``sniff(head, name)`` looks at the first bytes (directories and URLs get an empty
``head`` and their name); when several claim an input, the one whose extensions match the file
name wins, then the order below (specific formats before generic ones).
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mixdiag.errors import UserError

HEAD_BYTES = 64 * 1024
#: Logs are sniffed further when the head holds no known line: a long start-up banner or per-step
#: EPLB/DEBUG lines can push the first stats line far down. Bounded so detection stays fast.
LOG_SNIFF_BYTES = 8 * 1024 * 1024
LOG_FORMATS = ("vllm-log", "sglang-log")


@dataclass(frozen=True)
class Collector:
    """One registered format: its name, the module that reads it, typical file extensions."""

    format: str
    module: str
    extensions: tuple[str, ...] = ()
    doc: str = ""


COLLECTORS: tuple[Collector, ...] = (
    Collector("mixdiag-run", "engine_run", (), "run directory of the reference engine (mixdiag run/demo)"),
    Collector("nsys-sqlite", "traces.nsys.reader", (".sqlite", ".sqlite3", ".db"), "Nsight Systems SQLite export"),
    Collector("kineto-json", "traces.kineto.reader", (".json", ".json.gz", ".pt.trace.json"), "PyTorch profiler (Kineto) trace"),
    Collector("dcgm", "gpu.dcgm", (".prom", ".txt"), "DCGM exporter scrape"),
    Collector("nvml-csv", "gpu.nvml", (".csv",), "CSV written by mixdiag's NVML sampler"),
    Collector("host-samples", "host.proc_samples", (".csv",), "CSV written by mixdiag's host sampler (sample-host)"),
    Collector("prom-text", "prometheus.scrape_reader", (".prom", ".txt", ".metrics"), "Prometheus text exposition (scrape or dir)"),
    Collector("vllm-log", "logs.vllm_log", (".log", ".txt"), "vLLM server log"),
    Collector("sglang-log", "logs.sglang_log", (".log", ".txt"), "SGLang server log"),
    Collector("prom-endpoint", "prometheus.endpoint", (), "an engine's live /metrics URL (sampled, or one dump)"),
    Collector("prom-http", "prometheus.server_reader", (), "Prometheus server HTTP API (URL)"),
    # client-side records (what a benchmark client saw of each stream), collectors/clients/
    Collector("client-load", "clients.load_records", (".jsonl",), "mixdiag load records (JSON lines)"),
    Collector("vllm-bench", "clients.vllm_bench", (".json",), "vllm bench serve --save-result --save-detailed JSON"),
    Collector("guidellm", "clients.guidellm_report", (".json",), "guidellm benchmarks report JSON"),
)
BY_FORMAT = {c.format: c for c in COLLECTORS}
_cache: dict[str, ModuleType | Exception] = {}


def formats() -> list[str]:
    """Every registered format name, in detection order."""
    return [c.format for c in COLLECTORS]


def _import(c: Collector) -> ModuleType | Exception:
    if c.module not in _cache:
        try:
            mod = importlib.import_module(f"mixdiag.collectors.{c.module}")
            missing = [a for a in ("FORMAT", "sniff", "read") if not hasattr(mod, a)]
            if missing:
                raise ImportError(f"module lacks {', '.join(missing)}")
            _cache[c.module] = mod
        except Exception as e:  # a broken collector must not take the others down
            _cache[c.module] = e
    return _cache[c.module]


def module(fmt: str) -> ModuleType:
    """The collector module of ``fmt``; UserError if the name is unknown or the module unavailable."""
    c = BY_FORMAT.get(fmt)
    if c is None:
        raise UserError(f"unknown format {fmt!r}; choose one of: auto, {', '.join(formats())}")
    mod = _import(c)
    if isinstance(mod, Exception):
        reason = f"{type(mod).__name__}: {str(mod).splitlines()[0] if str(mod) else ''}"
        raise UserError(f"format {fmt} unavailable (mixdiag.collectors.{c.module}: {reason})")
    return mod


def available() -> dict[str, str | None]:
    """``format -> None`` when usable, else the reason it is not."""
    out = {}
    for c in COLLECTORS:
        try:
            module(c.format)
            out[c.format] = None
        except UserError as e:
            out[c.format] = str(e)
    return out


def read_head(path: str | os.PathLike) -> bytes:
    """The first bytes of a file (empty for directories and URLs)."""
    p = Path(path)
    if not p.is_file():
        return b""
    with open(p, "rb") as f:
        return f.read(HEAD_BYTES)


def detect(source: str | os.PathLike) -> str:
    """The format of ``source`` by content, extension as tie-breaker; UserError if none fits."""
    name = os.fspath(source)
    is_url = name.startswith(("http://", "https://"))
    if not is_url and not os.path.exists(name):
        raise UserError(f"{name}: no such file or directory")
    head = b"" if is_url else read_head(name)
    if not is_url and os.path.isfile(name) and not head:
        raise UserError(f"{name}: empty file")
    claims = []
    for c in COLLECTORS:
        mod = _import(c)
        if isinstance(mod, Exception):
            continue
        try:
            if mod.sniff(head, name):
                claims.append(c)
        except Exception:  # a sniffer that trips on odd bytes just does not claim them
            continue
    if not claims and not is_url and os.path.isfile(name) and len(head) == HEAD_BYTES:
        with open(name, "rb") as f:
            more = f.read(LOG_SNIFF_BYTES)
        for c in COLLECTORS:
            mod = _import(c)
            if c.format in LOG_FORMATS and not isinstance(mod, Exception):
                try:
                    if mod.sniff(more, name):
                        claims.append(c)
                except Exception:
                    continue
    if not claims:
        what = "directory" if os.path.isdir(name) else "file"
        raise UserError(f"{name}: {what} in no known format (tried {', '.join(formats())}); pass --format")
    lower = name.lower()
    by_ext = [c for c in claims if any(lower.endswith(e) for e in c.extensions)]
    return (by_ext or claims)[0].format
