#!/usr/bin/env bash
# Install, start the sandbox engine, and run the main training job on its embedded defaults.
# Extra arguments are config overrides, e.g. `scripts/train.sh algo=grpo trainer.total_steps=20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
AREAL_SKIP_VLLM=1 bash scripts/services.sh
exec .venv/bin/python -m areal_agents.train env=code_sandbox "$@"
