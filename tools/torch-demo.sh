#!/usr/bin/env bash
# Your own PyTorch model on a local cluster: installs what is missing (Debian's python3-torch
# for /usr/bin/python3), builds the services, mqgrad and libmqgrad, and runs
# examples/torch/paper_cnn.py (the MQGrad paper's CNN written in PyTorch) as 2 workers beside
# C servers and the SARSA agent, 400 iterations on Fashion-MNIST. Extra flags go to
# `mqgrad local`, e.g. --worker-exec '/usr/bin/python3 examples/torch/resnet.py' for another
# model (python/README.md). Exit code: mqgrad local's.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
tools/install-deps.sh build
tools/install-deps.sh torch
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j"$(nproc)" --target mqgrad mqgrad-scheduler mqgrad-server \
    mqgrad-worker mqgrad-agent mqgrad_shared
exec build-release/tools/mqgrad local --worker-exec '/usr/bin/python3 examples/torch/paper_cnn.py' \
    --workers 2 --iterations 400 --lr-decay 0.3 --eval-every 100 --eval-limit 1000 --final-eval-limit 0 \
    --threads 1 --progress-every 15 --run-dir "runs/torch-$(date +%Y%m%d-%H%M%S)" "$@"
