#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the MQGrad paper's CNN on
# Fashion-MNIST with a local cluster (agent, scheduler, 2 servers, 2 workers as processes),
# the bit-width chosen by the SARSA agent, over emulated 3 Gbit/s links, then prints what the
# run achieved: test accuracy on the whole test set, time, bits over time, bytes against fp32,
# and the time fp32 would have needed (an estimate from the link model).
#
# Why 3 Gbit/s: there an fp32 iteration of the paper model would spend longer on the link than
# on its computation (2 workers x 2 servers, 65 MB of gradient per worker each way), so the
# bit-width decides the iteration time, as on the paper's 10 MB/s cluster; and 1000 quantized
# iterations still finish in minutes on 2 cores, where the paper's rate would take far longer
# (docs/results.md, "The demo"). Extra flags go to `mqgrad local`, e.g.
#   tools/demo.sh --workers 4 --link-mbps 80 --time-budget 600
# The learning rate decays linearly to zero over the last 30 % of the iterations: at a constant
# rate the last iterate's test accuracy swings by a few points from one evaluation to the next
# (docs/codec-sweep.md), and the demo's result should not depend on where the swing stops.
# Exit code: 0 completed, 3 the run diverged, 1 a service failed, 130 interrupted.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
tools/install-deps.sh build
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-release -j"$(nproc)" --target mqgrad mqgrad-scheduler mqgrad-server \
    mqgrad-worker mqgrad-agent
exec build-release/tools/mqgrad local --model paper --workers 2 --servers 2 --policy mqgrad \
    --iterations 1000 --lr-decay 0.3 --link-mbps 3000 --eval-every 100 --eval-limit 1000 \
    --final-eval-limit 0 \
    --threads 1 --progress-every 15 --run-dir "runs/demo-$(date +%Y%m%d-%H%M%S)" "$@"
