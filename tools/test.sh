#!/usr/bin/env bash
# The test command: installs what is missing, builds with warnings as errors, runs every
# Criterion test through ctest, then the end-to-end tests on real containers (skipped with a
# message when no Docker engine answers; MQGRAD_E2E=0 skips them too). Fails if a test fails.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
tools/install-deps.sh test
build="${MQGRAD_BUILD_DIR:-build}"
cmake -S . -B "$build" -DMQGRAD_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure --timeout 900
if [ "${MQGRAD_E2E:-1}" != 0 ]; then
    tests/e2e/run.sh
else
    echo "SKIP: e2e tests (MQGRAD_E2E=0)"
fi
