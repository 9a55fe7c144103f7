"""The logging configuration the testbed hands to ``vllm serve`` through ``VLLM_LOGGING_CONFIG_PATH``.

Two handlers on vLLM's ``vllm`` logger:

* ``vllm`` - vLLM's own default handler, formatter and level, unchanged (stdout, which the driver
  writes to ``DIR/vllm.log``), with one filter that drops the per-iteration records: the operator
  log is what an operator running this server without iteration details would have;
* ``truth`` - a file handler for the per-iteration records only, each stamped with the unix time
  at which vLLM logged it (``%(created).6f``): ``DIR/truth/iterations.log``.

vLLM's default configuration is read from the installed vLLM (its ``DEFAULT_LOGGING_CONFIG``)
rather than copied, so the operator log keeps vLLM's exact format across versions. Reading it
imports vLLM (~10 s on 2 busy cores), so it is cached beside the vLLM environment.
"""
from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

from mixdiag.errors import UserError

#: The folder holding only the filter module the server imports (it goes on the server's PYTHONPATH).
FILTER_DIR = Path(__file__).resolve().parent / "vllm_side"
FILTER_CLASS = "mixdiag_vllm_logfilter.IterationRecords"
TRUTH_FORMAT = "%(created).6f %(message)s"

_DUMP = "import json, vllm, vllm.logger as l; print(json.dumps({'version': vllm.__version__, 'config': l.DEFAULT_LOGGING_CONFIG}))"


def default_config(python: Path, env: dict, cache: Path) -> dict:
    """vLLM's default logging config as the installed vLLM builds it (stdout not a terminal: no colour)."""
    try:
        return json.loads(cache.read_text())["config"]
    except (OSError, ValueError, KeyError):
        pass
    proc = subprocess.run([str(python), "-c", _DUMP], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"cannot read vLLM's default logging config with {python}: {tail}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(data))
    return data["config"]


def routed_config(default: dict, truth_log: Path) -> dict:
    """``default`` plus the iteration filter on vLLM's handler and the truth file handler."""
    cfg = copy.deepcopy(default)
    try:
        handler = cfg["handlers"]["vllm"]
        logger = cfg["loggers"]["vllm"]
    except (KeyError, TypeError):
        raise UserError("vLLM's default logging config has no 'vllm' handler/logger; "
                        "this vLLM version is not one the testbed knows (0.32)") from None
    cfg.setdefault("filters", {})
    cfg["filters"]["mixdiag_operator"] = {"()": FILTER_CLASS, "keep": False}
    cfg["filters"]["mixdiag_truth"] = {"()": FILTER_CLASS, "keep": True}
    handler["filters"] = list(handler.get("filters", [])) + ["mixdiag_operator"]
    cfg["formatters"]["mixdiag_truth"] = {"format": TRUTH_FORMAT}
    cfg["handlers"]["mixdiag_truth"] = {"class": "logging.FileHandler", "filename": str(truth_log), "mode": "a",
                                        "delay": True, "formatter": "mixdiag_truth", "level": "INFO",
                                        "filters": ["mixdiag_truth"]}
    logger["handlers"] = list(logger.get("handlers", [])) + ["mixdiag_truth"]
    return cfg


def write_config(default: dict, truth_log: Path, path: Path) -> Path:
    """Write the routed config as JSON to ``path`` (what ``VLLM_LOGGING_CONFIG_PATH`` names)."""
    path.write_text(json.dumps(routed_config(default, truth_log), indent=1))
    return path
