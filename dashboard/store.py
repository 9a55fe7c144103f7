"""Data access for the dashboard: what can be loaded, loading it safely, and the loaded datasets.

Inputs are read only through the collectors' registry (``mixdiag.collectors.load``, in a child
process for captures and uploads). The server reads nothing outside its configured data directory: every path a browser sends is
resolved (symlinks included) and must stay inside it. Uploads go to a private temporary folder,
are size-capped and parsed in a child process (:mod:`.isolate`); nothing a user gave is written
over. Loaded datasets are kept server-side under a short id; the browser only holds the id.
"""
from __future__ import annotations

import base64
import binascii
import itertools
import re
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from mixdiag.collectors.engine_run import is_run_dir
from mixdiag.dashboard.settings import DashboardConfig
from mixdiag.dashboard.isolate import parse_isolated
from mixdiag.dashboard.stats import Headline, headline
from mixdiag.errors import UserError
from mixdiag.schema import Timeline

#: File names the Sources page offers from the data directory (collectors sniff the format).
LOADABLE_SUFFIXES = (".sqlite", ".json", ".log", ".txt", ".prom", ".jsonl", ".gz")
#: Files that are part of a run directory's bookkeeping, never offered on their own.
NOT_CAPTURES = frozenset(Timeline.FILES.values()) | {"summary.json", "truth.csv"}
#: How deep the Sources page looks for runs and files under the data directory.
MAX_DEPTH = 3
#: Datasets kept in memory at once (oldest dropped first).
MAX_DATASETS = 4


@dataclass
class Dataset:
    """A loaded Timeline, its diagnosis and headline numbers, under an id the browser holds."""

    id: str
    label: str
    timeline: Timeline
    diagnosis: object
    headline: Headline
    analysis_s: float
    loaded_unix_s: float = field(default_factory=time.time)
    views: dict = field(default_factory=dict)  # instance -> the Timeline page's view, computed once
    _breakdown: object = None  # the device breakdown, computed on first use (:meth:`breakdown`)

    def breakdown(self):
        """The device breakdown of this dataset (:func:`mixdiag.diagnosis.breakdown.breakdown`), computed once."""
        if self._breakdown is None:
            from mixdiag.diagnosis.breakdown import breakdown

            self._breakdown = breakdown(self.timeline, self.diagnosis)
        return self._breakdown


def is_scrape_dir(path: Path) -> bool:
    """True if ``path`` holds timed ``/metrics`` scrapes (``<unix_time_s>.prom`` files)."""
    try:
        return any(p.suffix == ".prom" and p.stem.replace(".", "", 1).isdigit() for p in path.iterdir())
    except OSError:
        return False


def diagnose_timed(timeline: Timeline):
    """``mixdiag.diagnosis.diagnose(timeline)`` and the seconds it took."""
    from mixdiag.diagnosis import diagnose

    t = time.perf_counter()
    d = diagnose(timeline)
    return d, time.perf_counter() - t


class DataStore:
    """The dashboard's datasets and the only code that touches the file system for it."""

    def __init__(self, config: DashboardConfig, exporter=None):
        self.config = config
        self.exporter = exporter
        self._lock = threading.Lock()
        self._datasets: OrderedDict[str, Dataset] = OrderedDict()
        self._ids = itertools.count(1)
        self.current_id: str | None = None

    # ---- paths ----------------------------------------------------------------------------
    @property
    def root(self) -> Path | None:
        return self.config.data_root

    def resolve(self, rel: str) -> Path:
        """The real path of ``rel`` inside the data directory; UserError if it leaves it."""
        if self.root is None:
            raise UserError("no data directory configured (start with --data PATH)")
        if not isinstance(rel, str) or "\x00" in rel:
            raise UserError("invalid path")
        root = self.root.resolve()
        p = (root / rel).resolve()
        if p != root and root not in p.parents:
            raise UserError(f"{rel!r} is outside the data directory")
        if not p.exists():
            raise UserError(f"{rel!r} does not exist in the data directory")
        return p

    def entries(self) -> list[dict]:
        """Run directories and loadable files under the data directory, as {label, value} options."""
        if self.root is None or not self.root.is_dir():
            return []
        root = self.root.resolve()
        out = []
        if is_run_dir(root):
            out.append({"label": f"run: {root.name}/", "value": "."})

        def walk(d: Path, depth: int):
            try:
                children = sorted(d.iterdir(), key=lambda p: p.name)
            except OSError:
                return
            for c in children:
                if c.name.startswith("."):
                    continue
                try:
                    real = c.resolve()
                except OSError:
                    continue
                if real != root and root not in real.parents:
                    continue  # a symlink pointing outside: not offered
                rel = str(c.relative_to(root))
                if c.is_dir():
                    if is_run_dir(c):
                        out.append({"label": f"run: {rel}/", "value": rel})
                    elif is_scrape_dir(c):
                        out.append({"label": f"scrapes: {rel}/", "value": rel})
                    elif depth < MAX_DEPTH:
                        walk(c, depth + 1)
                elif c.suffix.lower() in LOADABLE_SUFFIXES and c.name not in NOT_CAPTURES:
                    out.append({"label": f"file: {rel}", "value": rel})

        walk(root, 1)
        return out

    # ---- loading --------------------------------------------------------------------------
    def load_path(self, rel: str) -> Dataset:
        """Load a run directory (in-process, Parquet), or a capture file or scrape directory (parsed in isolation)."""
        p = self.resolve(rel)
        if p.is_dir() and is_run_dir(p):
            from mixdiag import collectors

            tl = collectors.load(p)  # the registry's run-directory collector, as `mixdiag analyze` reads it
        elif p.is_dir() and not is_scrape_dir(p):
            raise UserError(f"{rel!r} is a directory without Timeline files or scrapes")
        else:
            tl = parse_isolated(p, timeout_s=self.config.parse_timeout_s)
        label = p.name if rel not in (".", "") else (p.name or str(p))
        return self.add(tl, label)

    def load_upload(self, filename: str, contents: str) -> Dataset:
        """Load a ``dcc.Upload`` payload (``data:...;base64,...``), size-capped, parsed in isolation."""
        if not contents or "," not in contents:
            raise UserError("empty upload")
        b64 = contents.split(",", 1)[1]
        if len(b64) * 3 // 4 > self.config.upload_max_bytes + 3:
            raise UserError(f"upload larger than the {self.config.upload_max_bytes / 2**20:.0f} MiB limit")
        try:
            data = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise UserError("upload is not valid base64") from None
        if len(data) > self.config.upload_max_bytes:
            raise UserError(f"upload larger than the {self.config.upload_max_bytes / 2**20:.0f} MiB limit")
        # Only the last path component, restricted characters: the name never chooses a location.
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(str(filename or "upload")).name)[:100] or "upload"
        safe = safe.lstrip(".") or "upload"
        with tempfile.TemporaryDirectory(prefix="mixdiag-upload-") as tmp:
            path = Path(tmp) / safe
            path.write_bytes(data)
            tl = parse_isolated(path, timeout_s=self.config.parse_timeout_s)
        return self.add(tl, f"upload: {safe}")

    def add(self, timeline: Timeline, label: str) -> Dataset:
        """Diagnose ``timeline``, keep it as the current dataset and publish it to the exporter."""
        diagnosis, took = diagnose_timed(timeline)
        ds = Dataset(id=f"d{next(self._ids)}", label=label, timeline=timeline, diagnosis=diagnosis,
                     headline=headline(timeline, diagnosis), analysis_s=took)
        with self._lock:
            self._datasets[ds.id] = ds
            while len(self._datasets) > MAX_DATASETS:
                self._datasets.popitem(last=False)
            self.current_id = ds.id
        if self.exporter is not None:
            self.exporter.publish(timeline, diagnosis, duration_s=took, reset=True)
        return ds

    def replace_live(self, ds_id: str | None, timeline: Timeline, label: str) -> Dataset:
        """Live mode: re-diagnose the latest window and publish it incrementally under a stable id."""
        diagnosis, took = diagnose_timed(timeline)
        with self._lock:
            ds_id = ds_id if ds_id in self._datasets else f"d{next(self._ids)}"
            ds = Dataset(id=ds_id, label=label, timeline=timeline, diagnosis=diagnosis,
                         headline=headline(timeline, diagnosis), analysis_s=took)
            self._datasets[ds_id] = ds
            self._datasets.move_to_end(ds_id)
            while len(self._datasets) > MAX_DATASETS:
                self._datasets.popitem(last=False)
            self.current_id = ds_id
        if self.exporter is not None:
            self.exporter.publish(timeline, diagnosis, duration_s=took)
        return ds

    def get(self, ds_id: str | None) -> Dataset | None:
        """The dataset with ``ds_id`` (or the current one when ``ds_id`` is None)."""
        with self._lock:
            return self._datasets.get(ds_id if ds_id else (self.current_id or ""))

