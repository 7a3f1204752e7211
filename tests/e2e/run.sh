#!/usr/bin/env bash
# Runs mqgrad's end-to-end tests on real containers: builds the images offline, then each
# tests/e2e/test_*.sh in turn, but those of E2E_BESIDE, beside them (E2E_ONLY=regex picks
# some). Prints a SKIP line and exits 77
# (could not run: tools/test.sh counts it as skipped) when no Docker engine answers; exits 1
# when any test fails.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

if ! command -v docker >/dev/null 2>&1 || ! timeout 20 docker info >/dev/null 2>&1; then
    echo "SKIP: e2e tests: no Docker engine answers (docker info failed)"
    exit 77
fi
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
    echo "SKIP: e2e tests: neither 'docker compose' nor 'docker-compose' is installed"
    exit 77
fi

start=$(date +%s)
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export E2E_FIGURES="${E2E_FIGURES:-$scratch/figures}"
build_log="$scratch/build.log"
# The PyTorch worker image too when test_7_torch is among the tests to run.
images=(debian:bookworm debian:bookworm-slim "${MQGRAD_IMAGE:-mqgrad:latest}")
build_args=(--tag "${MQGRAD_IMAGE:-mqgrad:latest}")
if [[ test_7_torch =~ ${E2E_ONLY:-.} ]]; then
    build_args+=(--torch --torch-tag "${MQGRAD_TORCH_IMAGE:-mqgrad-torch:latest}")
    images+=("${MQGRAD_TORCH_IMAGE:-mqgrad-torch:latest}")
fi
echo "e2e: building images offline (deploy/build-images.sh ${build_args[*]})"
if ! timeout 3600 "$repo/deploy/build-images.sh" "${build_args[@]}" >"$build_log" 2>&1; then
    tail -n 60 "$build_log"
    echo "e2e: image build failed"
    echo "e2e: 0 passed, 1 failed"
    exit 1
fi
grep '^build-images:' "$build_log" | sed 's/^/e2e: /'
for img in "${images[@]}"; do
    docker image inspect -f "e2e: image {{index .RepoTags 0}} {{.Size}} bytes" "$img"
done
echo "build_s=$(( $(date +%s) - start ))" >>"$E2E_FIGURES"

passed=0 failed=0 failures=()
# test_1_scale checks the build itself; the images were just built.
export E2E_SKIP_BUILD=1
# The tests named in E2E_BESIDE (default: the monitoring test, whose containers mostly wait on
# Prometheus' scrapes) start now and run beside the sequence instead of lengthening it, on
# host ports from bases of their own; their logs are printed when they end. E2E_BESIDE=
# (empty) runs every test in turn.
beside_pids=() beside_names=()
s_beside() { [[ " ${E2E_BESIDE-test_6_monitoring} " == *" $1 "* ]]; } # is test $1 one of them
s_timed() { # runs test $1, then says how long it took
    local t0 rc=0
    t0=$(date +%s)
    bash "$1" || rc=$?
    echo "took=$(( $(date +%s) - t0 ))"
    return "$rc"
}
for t in "$here"/test_*.sh; do
    name="$(basename "$t" .sh)"
    [[ "$name" =~ ${E2E_ONLY:-.} ]] || continue
    s_beside "$name" || continue
    echo "e2e: --- $name (beside the others)"
    (export E2E_AGENT_PORT=7700 E2E_HTTP_PORT=8700 E2E_SCHEDULER_HTTP_PORT=8500 \
        E2E_PROMETHEUS_PORT=9590; s_timed "$t") >"$scratch/$name.log" 2>&1 &
    beside_pids+=($!) beside_names+=("$name")
done
for t in "$here"/test_*.sh; do
    name="$(basename "$t" .sh)"
    [[ "$name" =~ ${E2E_ONLY:-.} ]] || continue
    s_beside "$name" && continue
    echo "e2e: --- $name"
    t0=$(date +%s)
    if bash "$t"; then
        passed=$((passed + 1)); echo "e2e: PASS $name ($(( $(date +%s) - t0 )) s)"
    else
        failed=$((failed + 1)); failures+=("$name"); echo "e2e: FAIL $name ($(( $(date +%s) - t0 )) s)"
    fi
done
for i in "${!beside_pids[@]}"; do
    name="${beside_names[$i]}" rc=0
    wait "${beside_pids[$i]}" || rc=$?
    echo "e2e: --- $name (ran beside the others)"
    grep -v '^took=' "$scratch/$name.log"
    took="$(sed -n 's/^took=//p' "$scratch/$name.log")"
    if [ "$rc" = 0 ]; then
        passed=$((passed + 1)); echo "e2e: PASS $name (${took:-?} s)"
    else
        failed=$((failed + 1)); failures+=("$name"); echo "e2e: FAIL $name (${took:-?} s)"
    fi
done
echo "suite_s=$(( $(date +%s) - start ))" >>"$E2E_FIGURES"
echo "e2e: figures:"; sed 's/^/    /' "$E2E_FIGURES"
[ "$failed" = 0 ] || echo "e2e: failed: ${failures[*]}"
echo "e2e: $passed passed, $failed failed"
[ "$failed" = 0 ]
