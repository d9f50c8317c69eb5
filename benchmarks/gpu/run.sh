#!/usr/bin/env bash
# The async-vs-sync ratio and the learner figures on ONE GPU machine: vLLM generates and the
# FSDP2 learner trains on the same GPU (vLLM takes a slice of its memory). Sized to finish in
# under 8 minutes (3 trainer runs of ~2 minutes, each starting its own vLLM server).
#
#   bash benchmarks/gpu/run.sh            # writes benchmarks/results/*_gpu.json, plots/gpu/
#   bash benchmarks/gpu/run.sh --check    # print what would run, check the prerequisites
#
# Needs: torch with CUDA, and vLLM importable by $AREAL_VLLM_PYTHON (else .venv-vllm, else the
# same interpreter). Without vLLM the built-in server runs on the GPU instead (said in the output).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/gpu}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU visible to $PY: this script is for a GPU machine" >&2
    exit 2
fi
VLLM_PY=${AREAL_VLLM_PYTHON:-}
if [ -z "$VLLM_PY" ] && [ -x .venv-vllm/bin/python ]; then VLLM_PY=.venv-vllm/bin/python; fi
if [ -z "$VLLM_PY" ]; then VLLM_PY=$PY; fi
if "$VLLM_PY" -c "import vllm" 2>/dev/null; then
    export AREAL_VLLM_PYTHON=$VLLM_PY
    ENGINE=(inference=vllm "inference.extra_args=[--gpu-memory-utilization,0.35,--dtype,bfloat16]")
else
    echo "vLLM is not importable by $VLLM_PY: using the built-in server on the GPU" >&2
    ENGINE=(inference=builtin "inference.extra_args=[--device,cuda,--max-batch-size,64]")
fi
COMMON=(--staleness 0,2,4 --steps 10 --groups-per-step 8 --group-size 8 --concurrent-groups 16
        --max-tokens 48 --lr 1e-5 --timeout-s 150 --out "$OUT/async_vs_sync")
if [ "${1:-}" = "--check" ]; then
    echo "engine: ${ENGINE[*]}"
    echo "1. $PY -m examples.cpu_quickstart.warm_start --out $OUT/warm_start --steps 8"
    echo "2. $PY benchmarks/async_vs_sync.py --model $OUT/warm_start ${COMMON[*]} ${ENGINE[*]} ray.learner_gpus=0.5"
    echo "3. $PY benchmarks/learner.py --rows 32 --seq-len 512 --configs plain,fsdp1 --push-repeats 3 --vllm"
    exit 0
fi
start=$(date +%s)
# 1. the warm-start (on the GPU: seconds)
"$PY" -m examples.cpu_quickstart.warm_start --out "$OUT/warm_start" --steps 8
# 2. sync vs async (staleness 2 and 4), same trained samples: 10 steps x 64 episodes
"$PY" benchmarks/async_vs_sync.py --model "$OUT/warm_start" "${COMMON[@]}" \
    --json benchmarks/results/async_vs_sync_gpu.json --plots benchmarks/plots/gpu \
    "${ENGINE[@]}" ray.learner_gpus=0.5
# 3. learner time per token (one GPU: plain torch vs FSDP2 with 1 rank) and weight push
"$PY" benchmarks/learner.py --rows 32 --seq-len 512 --configs plain,fsdp1 --push-repeats 3 --vllm \
    --json benchmarks/results/learner_gpu.json
echo "total $(( $(date +%s) - start )) s"
