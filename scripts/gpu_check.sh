#!/usr/bin/env bash
# GPU check, one command on a CUDA machine: the Triton kernel vs the PyTorch reference, the engine
# under every CUDA-graph mode (identical outputs), and decode step times FULL vs PIECEWISE vs NONE
# at batch 32 with ratios. Exit 0 pass, 1 a check failed, 2 no CUDA (one line on stderr).
# Extra arguments go to scripts/gpu_check.py (--batch, --context, --iters, --skip-engine, --json).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then
  echo "error: $PY not found; run 'make setup' (or set PY=/path/to/python)" >&2
  exit 2
fi
exec "$PY" scripts/gpu_check.py "$@"
