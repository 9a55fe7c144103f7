#!/usr/bin/env bash
# Create or refresh .venv and install mixdiag with its extras. Idempotent: pip skips what is
# already installed. Without an NVIDIA GPU the CPU build of torch is installed first (pinned, so
# pip does not pull a multi-GB CUDA build to satisfy the plain `torch` requirement).
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade "pip>=23" "setuptools>=68" wheel
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRAS="test,gpu"
  $PIP install --quiet torch
else
  EXTRAS="test"
  $PIP install --quiet "torch==2.13.0"
fi
$PIP install --quiet -e ".[${EXTRAS}]"
"$VENV/bin/python" -c "import mixdiag, mixdiag.engine, mixdiag.collectors, mixdiag.dashboard; print('mixdiag', mixdiag.__version__, 'installed in $VENV')"
