"""One testbed run against a real ``vllm serve``: traffic, timed scrapes, faults, truth.

:class:`Testbed` starts the server once (a context manager; everything it started is stopped on
leaving it, on exit, on SIGTERM and on Ctrl+C) and :meth:`Testbed.run` drives one run into a
directory; several runs may share one server (the tests do) as long as they need the same server
knobs. :func:`run` is the CLI's one-run path. A run directory holds::

    DIR/scrapes/<unix_time_s>.prom   timed /metrics scrapes (docs/contracts.md section 1)
    DIR/vllm.log                     the operator log, exactly as vLLM printed it (no iteration lines)
    DIR/client.jsonl                 every stream's `mixdiag load` records, merged
    DIR/host.csv                     the EngineCore process as the OS saw it every 10 ms (`mixdiag sample-host`;
                                     host.out: its console output)
    DIR/loads/<stream>.jsonl         each stream's own records (and .out: its console output)
    DIR/truth/iterations.log         vLLM's per-iteration records, unix-time stamped
    DIR/truth/faults.csv             t_start_s,t_end_s,cause,detail of every injected fault
    DIR/testbed.json                 config, drawn plan, server command, times, counts, errors
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.vllm_testbed import environment, fault_plan, live_view, log_routing, traffic, truth
from mixdiag.vllm_testbed.config import ServerConfig, TestbedConfig
from mixdiag.vllm_testbed.injectors import FaultRunner, TruthRow
from mixdiag.vllm_testbed.process_guard import ProcessGuard
from mixdiag.vllm_testbed.scraper import Scraper
from mixdiag.vllm_testbed.server import VllmServer

MODEL_NAME = "tiny-llama"
_BURST_CONCURRENCY = 64    # a saturation burst's open streams: well above --max-num-seqs


@dataclass(frozen=True)
class RunResult:
    """What a run wrote and measured (also saved as ``DIR/testbed.json``)."""

    out: Path
    url: str
    t_start_s: float
    t_end_s: float
    requests: dict
    scrapes: int
    scrape_failures: int
    iterations: int
    faults: int
    errors: tuple[str, ...]


#: seconds the live view keeps polling after the sending window (the last requests' decodes)
_LIVE_TAIL_S = 10.0
#: seconds between host samples of the EngineCore: a stop is placed within 10 ms
HOST_SAMPLE_S = 0.01


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} exists and is not empty; choose a new directory (nothing is overwritten)")
    (out / "scrapes").mkdir(parents=True, exist_ok=True)
    (out / "truth").mkdir(parents=True, exist_ok=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _copy_slice(src: Path, start: int, dst: Path) -> None:
    """Copy ``src`` from byte ``start`` to its current end into ``dst`` (a run's share of a server log)."""
    with open(src, "rb") as f, open(dst, "wb") as g:
        f.seek(start)
        shutil.copyfileobj(f, g)


class Testbed:
    """A running ``vllm serve`` with ``server`` knobs, its logs at ``log_path`` and ``truth_log``."""

    __test__ = False   # not a pytest test class despite the name

    def __init__(self, server: ServerConfig, log_path: Path, truth_log: Path, venv: Path | None = None,
                 say=lambda msg: None):
        self.server_cfg, self.log_path, self.truth_log = server, Path(log_path), Path(truth_log)
        self.venv, self.say = venv, say
        self.guard = ProcessGuard()
        self.server: VllmServer | None = None
        self._tmp: Path | None = None

    def __enter__(self) -> "Testbed":
        env = environment.locate(self.venv)
        model = environment.ensure_model(env)
        self.guard.__enter__()
        try:
            self._tmp = Path(tempfile.mkdtemp(prefix="mixdiag-vllm-"))
            default = log_routing.default_config(env.python, env.server_env(1, None),
                                                 env.cache_dir / "default_logging.json")
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.truth_log.parent.mkdir(parents=True, exist_ok=True)
            cfg_path = log_routing.write_config(default, self.truth_log.resolve(), self._tmp / "logging.json")
            self.say(f"starting vllm serve ({self.server_cfg.max_num_batched_tokens}-token steps, "
                     f"max {self.server_cfg.max_num_seqs} sequences); ready in 30-120 s")
            self.gc_pause_dir = self._tmp / "gc_pause"
            self.gc_pause_dir.mkdir()
            self.server = VllmServer.start(self.guard, env, model, self.server_cfg, self.log_path, cfg_path,
                                           self.gc_pause_dir)
            self.server.wait_ready(self.server_cfg.ready_timeout_s)
            self.engine_core_pid = self.server.engine_core_pid()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.guard.__exit__(*exc)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def run(self, cfg: TestbedConfig, out: Path, *, fresh: bool = True) -> RunResult:
        """Drive one run of ``cfg`` into ``out`` (new or empty, unless ``fresh`` is False: the
        one-run path, whose server already writes its log there)."""
        plan = fault_plan.draw(cfg)
        # a server with vLLM's GC debugger on serves runs that do not need it (it only adds log lines)
        if dataclasses.replace(plan.server, gc_debug=self.server_cfg.gc_debug) != self.server_cfg \
                or (plan.server.gc_debug and not self.server_cfg.gc_debug):
            raise UserError(f"run needs server knobs {plan.server} but this server has {self.server_cfg}")
        out = Path(out)
        if fresh:
            _prepare_out(out)
        log_at, truth_at = _size(self.log_path), _size(self.truth_log)
        scraper = Scraper(self.server.url, out / "scrapes", cfg.scrape_interval_s)
        scraper.start()
        host = _HostSampler(self.guard, self.engine_core_pid, out / "host.csv")
        time.sleep(cfg.scrape_interval_s * 1.5)   # a scrape before the first request: counters' start
        streams = [traffic.Stream("base", cfg.traffic.rate, cfg.duration_s, cfg.traffic.prompt_len,
                                  cfg.traffic.output_len, cfg.traffic.max_concurrency, cfg.seed)]
        if plan.long_prompts is not None:
            lp = plan.long_prompts
            streams.append(traffic.Stream("long", lp.rate, cfg.duration_s, lp.prompt_len, str(lp.output_len),
                                          4, cfg.seed + 7919))
        # the live view polls as long as the traffic is sent plus the time its last requests take
        live = (live_view.start(self.guard, self.server.url, cfg.duration_s + _LIVE_TAIL_S, cfg.scrape_interval_s, out)
                if cfg.live_analyze else None)
        t0 = time.time()
        running = [traffic.start(self.guard, s, self.server.url, MODEL_NAME, out / "loads") for s in streams]
        bursts: list[traffic.RunningStream] = []

        def start_burst(f, index):
            s = traffic.Stream(f"burst{index}", f.magnitude, f.duration_s, cfg.traffic.prompt_len,
                               cfg.traffic.output_len, _BURST_CONCURRENCY, cfg.seed * 1000 + index)
            bursts.append(traffic.start(self.guard, s, self.server.url, MODEL_NAME, out / "loads"))

        faults = FaultRunner(self.guard, t0, lambda: self.engine_core_pid, start_burst,
                             gc_pause_dir=self.gc_pause_dir if self.server_cfg.gc_debug else None)
        faults.schedule(plan.timed)
        errors: list[str] = []
        try:
            deadline = time.monotonic() + cfg.duration_s + cfg.drain_s + 60.0   # + the loads' start-up
            while time.monotonic() < deadline:
                if not self.server.alive():
                    raise UserError(f"vllm serve died during the run (status {self.server.proc.returncode}); "
                                    f"see {self.log_path}")
                if time.time() > t0 + cfg.duration_s and all(r.done() for r in running + bursts):
                    break
                time.sleep(0.5)
            else:
                errors.append(f"loads still running {cfg.drain_s:.0f} s after the sending window; stopped")
            faults.join(timeout_s=max(0.0, t0 + cfg.duration_s + 5.0 - time.time()))
        finally:
            faults.cancel()
            for r in running + bursts:
                if not r.done():
                    self.guard.stop(r.proc, grace_s=5.0)
        time.sleep(cfg.scrape_interval_s * 1.5)   # a scrape after the last token
        scraper.finish()
        errors += host.finish()
        t_end = time.time()
        errors += faults.errors
        if live is not None:
            e = live.finish(self.guard, timeout_s=t0 + cfg.duration_s + _LIVE_TAIL_S + 120.0 - time.time())
            if e:
                errors.append(e)
        for r in running + bursts:
            if r.proc.returncode not in (0, None):
                errors.append(f"mixdiag load {r.stream.name} exited {r.proc.returncode}; see {r.log}")
        return self._finish(cfg, plan, out, t0, t_end, running, bursts, faults.rows, scraper, errors, log_at, truth_at)

    def _finish(self, cfg, plan, out, t0, t_end, running, bursts, rows, scraper, errors, log_at, truth_at) -> RunResult:
        if (out / "vllm.log").resolve() != self.log_path.resolve():
            _copy_slice(self.log_path, log_at, out / "vllm.log")
        its_path = out / "truth" / "iterations.log"
        if its_path.resolve() != self.truth_log.resolve():
            if self.truth_log.exists():
                _copy_slice(self.truth_log, truth_at, its_path)
            else:
                its_path.touch()
        files = {r.stream.name: r.out for r in running + bursts}
        counts = traffic.merge(files, out / "client.jsonl")
        rows: list[TruthRow] = list(rows)
        for r in running:
            if r.stream.name == "long":
                rows += truth.long_prompt_rows(traffic.read_records(r.out), plan.server.max_num_batched_tokens)
        for b in bursts:
            rows += truth.burst_rows(traffic.read_records(b.out), b.stream.rate, b.stream.max_concurrency)
        rows += [TruthRow(t0, t_end, cause, detail) for cause, detail in plan.whole_run]
        truth.write_faults(rows, out / "truth" / "faults.csv")
        n_iter = len(truth.read_iterations(its_path)) if its_path.exists() else 0
        if cfg.server.iteration_details and n_iter == 0:
            errors.append("no iteration records reached truth/iterations.log")
        result = RunResult(out, self.server.url, t0, t_end, counts, scraper.written, scraper.failed, n_iter,
                           len(rows), tuple(errors))
        meta = {"testbed": "mixdiag-vllm", "vllm_version": environment.VLLM_VERSION, "model": MODEL_NAME,
                "config": dataclasses.asdict(cfg), "plan": plan.to_dict(), "server_argv": self.server.argv,
                "server_ready_s": self.server.ready_s, "engine_core_pid": self.engine_core_pid,
                "result": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(result).items()}}
        (out / "testbed.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
        return result


class _HostSampler:
    """``mixdiag sample-host`` of the EngineCore as a process of its own, from the first scrape to the last (the
    testbed drives the analysis side only through processes and files, as it does ``mixdiag load``): the OS's view
    of the process the faults stop (collectors/host/proc_samples.py)."""

    def __init__(self, guard: ProcessGuard, pid: int | None, out: Path):
        self.guard, self.errors, self.proc = guard, [], None
        if pid is None:
            self.errors.append("no EngineCore pid: host.csv not sampled")
            return
        self.log = out.with_suffix(".out")
        with open(self.log, "w") as f:
            self.proc = guard.popen([sys.executable, "-m", "mixdiag", "sample-host", "--pid", str(pid), "--out", str(out),
                                     "--interval", str(HOST_SAMPLE_S), "-q"], stdout=f, stderr=subprocess.STDOUT)

    def finish(self) -> list[str]:
        if self.proc is not None:
            self.guard.stop(self.proc, grace_s=10.0)   # SIGTERM: the sampler closes its file and exits
            if self.proc.returncode not in (0, -15):
                self.errors.append(f"host sampler exited {self.proc.returncode}; see {self.log}")
        return self.errors


def run(cfg: TestbedConfig, out: Path, venv: Path | None = None, say=lambda msg: None) -> RunResult:
    """Start a server with the knobs ``cfg``'s faults draw, drive one run into ``out``, stop everything."""
    out = Path(out)
    _prepare_out(out)
    plan = fault_plan.draw(cfg)
    with Testbed(plan.server, out / "vllm.log", out / "truth" / "iterations.log", venv=venv, say=say) as tb:
        say(f"server ready at {tb.server.url}; driving {cfg.duration_s:g} s of traffic "
            f"(faults: {', '.join(cfg.faults) or 'none'})")
        return tb.run(cfg, out, fresh=False)
