"""``vllm serve`` on loopback: the command line, start, readiness, the EngineCore's pid, stop.

The server's stdout and stderr go, unchanged, to the operator log file (``DIR/vllm.log``).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.vllm_testbed.config import ServerConfig
from mixdiag.vllm_testbed.environment import VllmEnv
from mixdiag.vllm_testbed.process_guard import ProcessGuard

HOST = "127.0.0.1"
#: /proc/PID/comm of vLLM's engine-core process (the kernel keeps 15 characters of "VLLM::EngineCore").
ENGINE_CORE_COMM = "VLLM::EngineCor"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def command(env: VllmEnv, model: Path, port: int, cfg: ServerConfig) -> list[str]:
    """The ``vllm serve`` command line for ``cfg``."""
    args = [str(env.vllm), "serve", str(model), "--host", HOST, "--port", str(port),
            "--served-model-name", "tiny-llama",
            # CPU: no CUDA graphs to capture, and torch.compile would take minutes on 2 cores
            "--enforce-eager", "--dtype", cfg.dtype,
            "--max-model-len", str(cfg.max_model_len),
            "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
            "--max-num-seqs", str(cfg.max_num_seqs),
            # random prompts share no prefixes; caching would only blur the prefill work per step
            "--no-enable-prefix-caching",
            "--seed", "0"]
    if cfg.num_kv_blocks is not None:
        args += ["--num-gpu-blocks-override", str(cfg.num_kv_blocks)]
    if cfg.iteration_details:
        args += ["--enable-logging-iteration-details"]
    return args


class VllmServer:
    """One running ``vllm serve`` (started by :meth:`start`, stopped by the guard or :meth:`stop`)."""

    def __init__(self, guard: ProcessGuard, proc: subprocess.Popen, port: int, log_path: Path, argv: list[str]):
        self.guard, self.proc, self.port, self.log_path, self.argv = guard, proc, port, log_path, argv
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @classmethod
    def start(cls, guard: ProcessGuard, env: VllmEnv, model: Path, cfg: ServerConfig, log_path: Path,
              logging_config: Path | None, gc_pause_dir: Path | None = None) -> "VllmServer":
        """Start the server; its output is appended to ``log_path``. ``gc_pause_dir`` (with
        ``cfg.gc_debug``): where the engine-side GC-pause hook takes requests."""
        port = free_port()
        argv = command(env, model, port, cfg)
        log = open(log_path, "ab")
        try:
            proc = guard.popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env=env.server_env(cfg.kv_cache_space_gib, logging_config,
                                                  gc_pause_dir if cfg.gc_debug else None), cwd=str(log_path.parent))
        finally:
            log.close()   # the child holds its own descriptor
        return cls(guard, proc, port, log_path, argv)

    def wait_ready(self, timeout_s: float) -> float:
        """Block until ``/health`` answers 200 and the model is listed; returns the unix time it was ready."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise UserError(f"vllm serve exited with status {self.proc.returncode} before it was ready; "
                                f"last line of {self.log_path}: {self._last_line()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    healthy = r.status == 200
                if healthy:
                    with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                        if json.loads(r.read()).get("data"):
                            self.ready_s = time.time()
                            return self.ready_s
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(1.0)
        raise UserError(f"vllm serve not ready after {timeout_s:.0f} s; last line of {self.log_path}: {self._last_line()}")

    def engine_core_pid(self) -> int:
        """The pid of vLLM's EngineCore process (a child of the server in its process group)."""
        for pid in _group_pids(self.proc.pid):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(ENGINE_CORE_COMM):
                return pid
        raise UserError(f"no {ENGINE_CORE_COMM} process under vllm serve (pid {self.proc.pid})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server's process group (EngineCore and workers with it)."""
        self.guard.stop(self.proc, grace_s=20.0)

    def _last_line(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "(no log)"
        # a failed start ends in shutdown noise; the cause is the last line naming an error
        errors = [ln for ln in lines if "Error:" in ln]
        return (errors or lines or ["(empty)"])[-1][:400]


def _group_pids(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid`` (read from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid:   # fields: state ppid pgrp ...
            out.append(int(d))
    return sorted(out)
