#!/usr/bin/env bash
# Install, start the sandbox engine, and run the main training job on its embedded defaults.
# Extra arguments are config overrides, e.g. `scripts/train.sh algo=grpo trainer.total_steps=20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
AREAL_SKIP_VLLM=1 bash scripts/services.sh
# exec: Python takes this process over (a signal reaches it directly). The process is then as
# old as this script, install included: the trainer's start-up figures (imports_s,
# time_to_first_step_s) count from Python's import of the package instead (trainers/stop.py).
exec .venv/bin/python -m areal_agents.train env=code_sandbox "$@"
