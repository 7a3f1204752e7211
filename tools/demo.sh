#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the MQGrad paper's CNN on
# Fashion-MNIST with a local cluster (agent, scheduler, 2 servers, 2 workers as processes),
# the bit-width chosen by the SARSA agent. Extra flags go to `mqgrad local`, e.g.
#   tools/demo.sh --workers 4 --link-mbps 80 --time-budget 600
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
tools/install-deps.sh build
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j"$(nproc)" --target mqgrad mqgrad-scheduler mqgrad-server \
    mqgrad-worker mqgrad-agent
exec build-release/tools/mqgrad local --model paper --workers 2 --servers 2 --policy mqgrad \
    --iterations 600 --eval-every 100 --eval-limit 2000 --threads 1 "$@"
