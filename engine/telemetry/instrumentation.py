"""Everything that watches an engine, attached and detached in one place.

::

    inst = Instrumentation(InstrumentationConfig(serve_port=9400, log_formats=("vllm",)), engine, out_dir)
    engine.run()
    inst.close()                                   # stops the server, writes metrics.prom, trace.json
    timeline = to_timeline(records, signals=inst.signals())

What it attaches (docs/instrumentation.md): the NVTX/Kineto tracer (on by default; a no-op
unless Nsight or the PyTorch profiler records), the SM-activity source (CPU estimate or NVML)
as the *first* observer so the others see ``sm_active``, the Prometheus metrics, the optional
``/metrics`` server, timed scrapes and ``metrics.prom``, the log lines and the profiler window.

Instances: the rank comes from the engine's instance name (``engineN`` -> N) unless given; it
sets the vLLM process tag ``EngineCore_DP<N>``, SGLang's `` DP<N> TP<N>`` prefix (with
``multi_instance``) and the ``/metrics`` port ``PORT + N``. Each instance in its own directory
(``mixdiag run --instance``, one process each) writes the file names of docs/contracts.md §1.
Several instances in *one* directory pass ``shared_dir=True``: rank N > 0 then writes
``trace.engineN.json``, ``metrics.engineN.prom``, ``scrapes/engineN/`` and ``engine.engineN.log``
(or shares one ``engine.log`` stream passed as ``log_sink`` when they run in one process).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from mixdiag.errors import UserError

from mixdiag.engine.telemetry.loglines import LogLineConfig, LogLineWriter
from mixdiag.engine.telemetry.metrics import EngineMetrics
from mixdiag.engine.telemetry.metrics_server import MetricsServer
from mixdiag.engine.telemetry.nvtx_tracer import NvtxTracer
from mixdiag.engine.telemetry.profiler import ProfileWindow
from mixdiag.engine.telemetry.scrape_writer import ScrapeWriter
from mixdiag.engine.telemetry.sm_activity import DeviceModel, make_sm_source


@dataclass(frozen=True)
class InstrumentationConfig:
    """What to attach. Defaults: NVTX ranges, metrics, SM estimate on; serving, logs, profile off."""

    nvtx: bool = True
    sm_activity: bool = True
    serve_port: int | None = None          # --serve PORT (0 = any free port)
    linger_s: float = 0.0                  # --linger S: keep serving after the run
    log_formats: tuple[str, ...] = ()      # --log-format vllm|sglang|both
    decode_log_interval: int = 40          # SGLang's --decode-log-interval
    profile: tuple[int, int | None] | None = None  # --profile START:STOP | START: | all
    profile_ops: bool = True               # --profile-light: False (no per-operator events)
    scrape_interval_s: float | None = None  # --scrape-interval S
    final_scrape: bool = True              # write metrics.prom at close (needs an out_dir)
    metrics_dialect: str = "mixdiag"       # --metrics-dialect mixdiag|vllm|sglang (engine/telemetry/dialects.py)

    def __post_init__(self):
        if self.serve_port is not None and not 0 <= self.serve_port <= 65535:
            raise UserError(f"--serve port must be in 0..65535, got {self.serve_port}")
        if self.linger_s < 0:
            raise UserError(f"--linger must be >= 0 seconds, got {self.linger_s}")
        if self.linger_s > 0 and self.serve_port is None:
            raise UserError("--linger needs --serve PORT")
        if self.scrape_interval_s is not None and not self.scrape_interval_s > 0:
            raise UserError(f"--scrape-interval must be > 0 seconds, got {self.scrape_interval_s}")
        if self.metrics_dialect not in ("mixdiag", "vllm", "sglang"):
            raise UserError(f"--metrics-dialect must be mixdiag, vllm or sglang, got {self.metrics_dialect!r}")
        LogLineConfig(formats=self.log_formats or ("vllm",), decode_log_interval=self.decode_log_interval)


class Instrumentation:
    """Attach the configured observers to ``engine``; :meth:`close` stops and flushes them."""

    def __init__(self, config: InstrumentationConfig, engine: Any, out_dir: str | Path | None = None, *,
                 rank: int | None = None, multi_instance: bool = False, shared_dir: bool = False,
                 log_sink: TextIO | None = None,
                 device_model: DeviceModel = DeviceModel(), registry: CollectorRegistry | None = None):
        self.config = cfg = config
        self.engine = engine
        self.out_dir = Path(out_dir) if out_dir is not None else None
        # engineN -> rank N: the vLLM process tag, SGLang's DP tag and the --serve port offset
        if rank is None:
            m = re.fullmatch(r"engine(\d+)", str(getattr(engine.config, "instance", "")))
            rank = int(m.group(1)) if m else 0
        self.rank = rank
        needs_dir = cfg.log_formats and log_sink is None or cfg.profile or cfg.scrape_interval_s
        if needs_dir and self.out_dir is None:
            raise UserError("--log-format, --profile and --scrape-interval need an output directory (--out)")
        # several instances writing into one directory: rank > 0 suffixes its file names
        suffix = f".engine{rank}" if shared_dir and rank else ""
        ecfg = engine.config
        self._observers: list = []
        self._closed = False
        self.server: MetricsServer | None = None
        self.scrapes: ScrapeWriter | None = None
        self.loglines: LogLineWriter | None = None
        self.profile: ProfileWindow | None = None
        self.sm = None
        self._prev_tracer = engine.tracer
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            if cfg.nvtx or cfg.profile:
                # --no-nvtx still mirrors into Kineto while a --profile window records
                engine.tracer = NvtxTracer(nvtx=cfg.nvtx, kineto=True)
            if cfg.sm_activity:
                self.sm = make_sm_source(ecfg.device, ecfg.model, ecfg.cache.num_slots, device_model)
                self._observers.append(self.sm)
            if cfg.metrics_dialect == "mixdiag":
                self.metrics = EngineMetrics(registry if registry is not None else CollectorRegistry(),
                                             arrival_s=self._arrival)
            else:  # what vLLM / SGLang would expose for the same steps, nothing of ours
                from mixdiag.engine.telemetry.dialects import make_dialect_metrics
                self.metrics = make_dialect_metrics(
                    cfg.metrics_dialect, arrival_s=self._arrival, prompt_len=self._prompt_len,
                    model_name=str(getattr(ecfg.model, "name", "") or "mixdiag-ref"), rank=rank,
                    decode_log_interval=cfg.decode_log_interval, registry=registry, request_end=self._request_end,
                    max_model_len=int(getattr(ecfg.model, "max_model_len", 16384)))
            self._observers.append(self.metrics)
            if cfg.log_formats:
                lcfg = LogLineConfig(formats=cfg.log_formats, decode_log_interval=cfg.decode_log_interval,
                                     rank=rank, show_rank=multi_instance)
                sink = log_sink if log_sink is not None else self.out_dir / f"engine{suffix}.log"
                self.loglines = LogLineWriter(sink, lcfg, kv_capacity_tokens=ecfg.cache.num_slots)
                self.loglines.write_server_args(ecfg.scheduler)
                self._observers.append(self.loglines)
            if cfg.profile:
                self.profile = ProfileWindow(*cfg.profile, self.out_dir / f"trace{suffix}.json",
                                             cuda=str(ecfg.device).startswith("cuda"), ops=cfg.profile_ops)
                self._observers.append(self.profile)
            if self.out_dir is not None and (cfg.final_scrape or cfg.scrape_interval_s):
                self.scrapes = ScrapeWriter(self.metrics.registry, self.out_dir, cfg.scrape_interval_s,
                                            subdir=f"scrapes/engine{rank}" if suffix else "scrapes",
                                            final_name=f"metrics{suffix}.prom")
            if cfg.serve_port is not None:
                port = cfg.serve_port + rank if cfg.serve_port else 0
                self.server = MetricsServer(self.metrics.registry, port)
        except BaseException:
            self.close()
            raise
        # SM first so every later observer sees sm_active; then ours; then what was there before.
        engine.observers[:0] = self._observers
        if self.profile is not None:
            self.profile.begin(engine.step_no)

    def _arrival(self, request_id: str) -> float | None:
        try:
            return self.engine.request(request_id).arrival_s
        except KeyError:
            return None

    def _request_end(self, request_id: str) -> tuple[str, int] | None:
        """(vLLM finished_reason, max_tokens) of a finished request; None while it runs."""
        try:
            req = self.engine.request(request_id)
        except KeyError:
            return None
        if not req.status.finished:
            return None
        reason = {"FINISHED_STOPPED": "stop", "FINISHED_LENGTH": "length"}.get(req.status.name, "abort")
        return reason, req.params.max_tokens

    def _prompt_len(self, request_id: str) -> int | None:
        try:
            return self.engine.request(request_id).num_prompt_tokens
        except KeyError:
            return None

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def signals(self) -> dict[str, str]:
        """Signal qualities for ``meta["signals"][instance]`` (``sm_active``: estimated/measured/inferred/absent)."""
        return {"sm_active": self.sm.source if self.sm is not None else "absent"}

    def summary(self) -> dict:
        """What was written or served, for ``summary.json`` and the CLI."""
        d: dict[str, Any] = {"nvtx": self.config.nvtx, "sm_active": self.signals()["sm_active"]}
        if getattr(self.sm, "note", None):
            d["sm_active_note"] = self.sm.note
        if self.server is not None:
            d["metrics_url"] = self.server.url
        if self.loglines is not None:
            d["log_lines"] = self.loglines.lines_written
            d["log_formats"] = list(self.config.log_formats)
            if self.loglines.unknown_fields:
                d["log_unknown_fields"] = dict(self.loglines.unknown_fields)
        if self.profile is not None:
            d["profile"] = {"window": list(self.config.profile), "steps_recorded": len(self.profile.steps_recorded),
                            "path": str(self.profile.written) if self.profile.written else None,
                            "partial": self.profile.partial}
        if self.scrapes is not None:
            d["scrapes"] = len(self.scrapes.written) - (1 if self.scrapes.final else 0)
        return d

    def close(self, linger_s: float | None = None) -> dict:
        """Detach, stop the profiler, flush logs, write the final scrape, linger, stop serving."""
        if self._closed:
            return self.summary()
        self._closed = True
        obs = self.engine.observers
        self.engine.observers[:] = [o for o in obs if not any(o is mine for mine in self._observers)]
        self.engine.tracer = self._prev_tracer
        if self.profile is not None:
            self.profile.close()
        if self.loglines is not None:
            self.loglines.close()
        if self.scrapes is not None:
            self.scrapes.close()
        if self.server is not None:
            linger = self.config.linger_s if linger_s is None else linger_s
            if linger > 0:
                time.sleep(linger)
            self.server.stop()
        if self.sm is not None and hasattr(self.sm, "close"):
            self.sm.close()
        return self.summary()

    def __enter__(self) -> "Instrumentation":
        return self

    def __exit__(self, *exc) -> None:
        self.close(linger_s=0.0 if exc[0] is not None else None)
