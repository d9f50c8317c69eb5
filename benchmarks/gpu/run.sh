#!/usr/bin/env bash
# What the lent GPU machine can measure, in under 8 minutes. That machine has torch (CUDA),
# transformers and peft, and none of ray, vLLM, gymnasium or openai; at most 64 MiB of files
# travel to it (the repository without its virtual environments). So this measures only what
# runs on torch alone (benchmarks/gpu/measure.py):
#   1. the FSDP2 learner step on CUDA (NCCL, 1 rank) against plain torch, at two batch sizes;
#   2. the built-in engine's decode tokens/s against the number of concurrent generations, written
#      as a simulator profile (areal_agents/simulation/profiles format);
#   3. bf16 log-prob agreement between the learner and the engine.
#
#   bash benchmarks/gpu/run.sh            # benchmarks/results/gpu_measure.json + a profile
#   bash benchmarks/gpu/run.sh --check    # print what would run, check the prerequisites
#
# The model is a random one of SmolLM2-135M's shape that measure.py builds there (the trained
# model is ~270 MB in bf16, too large to travel; speed and agreement need the shape only):
# MODEL=default or MODEL=DIR measures a model already on that machine instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then PY=${PYTHON:-.venv/bin/python}; fi
MODEL=${MODEL:-synthetic}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

ARGS=(--device cuda --model "$MODEL" --dtype bfloat16 --rows 32 --seq-len 512 --steps 3
      --batch-sizes 1,4,16,64,128 --new-tokens 128 --agreement-rows 16
      --json benchmarks/results/gpu_measure.json
      --profile areal_agents/simulation/profiles/gpu_builtin_measured.yaml)
if [ "${1:-}" = "--check" ]; then
    echo "$PY benchmarks/gpu/measure.py ${ARGS[*]}"
    exit 0
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU visible to $PY: this script is for a GPU machine" >&2
    exit 2
fi
start=$(date +%s)
timeout 470 "$PY" benchmarks/gpu/measure.py "${ARGS[@]}"
echo "total $(( $(date +%s) - start )) s"
