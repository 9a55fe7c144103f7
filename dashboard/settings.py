"""The dashboard's configuration: one frozen, validated dataclass."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mixdiag.collectors.engine_run import is_run_dir
from mixdiag.collectors.prometheus.prom_http import check_url
from mixdiag.dashboard.downsample import DEFAULT_MAX_POINTS
from mixdiag.errors import UserError
from mixdiag.exporter import check_address


@dataclass(frozen=True)
class DashboardConfig:
    """Where the dashboard reads from and how it serves.

    ``data_dir``: the only directory the server reads (a run directory or a folder of runs and
    captures); ``initial``: a path inside it loaded at start (``"."`` = the data directory
    itself when it is a run). ``prometheus_url``: start in live mode following this Prometheus
    server or engine ``/metrics`` URL every ``refresh_s`` seconds.
    """

    data_dir: Path | None = None
    initial: str | None = None
    prometheus_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8050
    refresh_s: float = 5.0
    upload_max_bytes: int = 64 * 2**20
    parse_timeout_s: float = 180.0
    max_points: int = DEFAULT_MAX_POINTS
    live_window_s: float = 900.0
    ledger_preset: str = "glm-5.3"   # model the Spike page's predicted height assumes (mixdiag ledger)
    ledger_device: str = "h200"

    def __post_init__(self):
        if self.data_dir is not None:
            d = Path(self.data_dir).expanduser()
            if not d.exists():
                raise UserError(f"data path does not exist: {d}")
            object.__setattr__(self, "data_dir", d.resolve())
        if self.prometheus_url is not None:
            object.__setattr__(self, "prometheus_url", check_url(self.prometheus_url, "--prometheus"))
        check_address(self.host, self.port)
        if not 0.5 <= float(self.refresh_s) <= 3600:
            raise UserError(f"refresh interval must be 0.5..3600 s, got {self.refresh_s}")
        if self.upload_max_bytes <= 0:
            raise UserError("upload size cap must be positive")
        from mixdiag.ledger.device_model import device
        from mixdiag.ledger.shapes import resolve

        resolve(self.ledger_preset)   # UserError naming the choices when unknown
        device(self.ledger_device)
        if self.max_points < 100:
            raise UserError("max_points must be at least 100")

    @property
    def data_root(self) -> Path | None:
        """The directory the server may read: ``data_dir``, or its folder when it names a file."""
        if self.data_dir is None:
            return None
        return self.data_dir if self.data_dir.is_dir() else self.data_dir.parent

    @classmethod
    def from_data_path(cls, path: str | Path | None, **kw) -> "DashboardConfig":
        """Config for ``--data PATH``: a run directory, a folder of runs/captures, or one capture file."""
        if path is None:
            return cls(**kw)
        p = Path(path).expanduser()
        if not p.exists():
            raise UserError(f"data path does not exist: {p}")
        p = p.resolve()
        if p.is_file():
            return cls(data_dir=p.parent, initial=p.name, **kw)
        return cls(data_dir=p, initial="." if is_run_dir(p) else None, **kw)
