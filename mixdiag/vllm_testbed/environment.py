"""Where the real vLLM lives: the ``.venv-vllm`` environment ``make vllm-env`` builds, its ``vllm``
console script, the offline model, and the process environment ``vllm serve`` needs on CPU.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mixdiag.errors import UserError
from mixdiag.vllm_testbed.log_routing import FILTER_DIR

#: The vLLM the testbed is written against (``scripts/setup_vllm.sh`` installs it).
VLLM_VERSION = "0.32.0"
_REPO = Path(__file__).resolve().parents[2]
_BUILDER = Path(__file__).resolve().parent / "model_build.py"


def default_venv() -> Path:
    """``$MIXDIAG_VLLM_VENV`` or ``.venv-vllm`` at the checkout's root."""
    return Path(os.environ.get("MIXDIAG_VLLM_VENV") or _REPO / ".venv-vllm")


@dataclass(frozen=True)
class VllmEnv:
    """A located vLLM environment: its Python, its ``vllm`` script and the model directory."""

    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def vllm(self) -> Path:
        return self.venv / "bin" / "vllm"

    @property
    def model_dir(self) -> Path:
        return self.venv / "models" / "tiny-llama"

    @property
    def cache_dir(self) -> Path:
        return self.venv / "mixdiag-cache"

    def server_env(self, kv_cache_space_gib: int, logging_config: Path | None, gc_pause_dir: Path | None = None) -> dict:
        """The environment ``vllm serve`` runs in: CPU platform, a small KV cache, nothing online; with
        ``gc_pause_dir``, vLLM's GC debugger on and the engine-side GC-pause hook armed
        (vllm_side/sitecustomize.py)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON", "VIRTUAL_ENV"))}
        env.update({
            "VLLM_TARGET_DEVICE": "cpu",              # the `vllm` dist-info alias says +cpu too
            "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_space_gib)),
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",                  # the operator log is written as it happens
            "PYTHONPATH": str(FILTER_DIR),   # only the log filter module and the GC-pause hook
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "VIRTUAL_ENV": str(self.venv),
        })
        if logging_config is not None:
            env["VLLM_LOGGING_CONFIG_PATH"] = str(logging_config)
        if gc_pause_dir is not None:
            # vLLM's own GC debugger (vllm/utils/gc_utils.py): "GC took X ms to complete" per collection
            env["VLLM_GC_DEBUG"] = "1"
            env["MIXDIAG_GC_PAUSE_DIR"] = str(gc_pause_dir)
        return env


def locate(venv: Path | None = None) -> VllmEnv:
    """The vLLM environment, or a one-line :class:`UserError` saying how to build it."""
    env = VllmEnv(Path(venv) if venv else default_venv())
    if not env.vllm.exists() or not env.python.exists():
        raise UserError(f"no vLLM environment at {env.venv} (its bin/vllm is missing); "
                        "build it with `make vllm-env` (about 4.5 min, 3.4 GB)")
    return env


def ensure_model(env: VllmEnv) -> Path:
    """Build the offline model into the environment if it is not there yet; returns its directory."""
    marker = env.model_dir / "mixdiag_model.json"
    if marker.exists() and (env.model_dir / "config.json").exists():
        return env.model_dir
    proc = subprocess.run([str(env.python), str(_BUILDER), "--out", str(env.model_dir)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"building the testbed model failed: {tail}")
    return env.model_dir
