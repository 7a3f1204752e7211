#!/usr/bin/env bash
# The test command: installs what is missing, builds with warnings as errors, runs every
# Criterion test through ctest, every fuzz target for a bounded time with ASan and UBSan
# (tools/fuzz.sh; MQGRAD_FUZZ_SECONDS, default 20 each), the Criterion suite once more under
# ASan and UBSan (tools/sanitize.sh), then the end-to-end tests on real containers, after
# rendering and validating the Kubernetes manifests offline (tools/check-k8s.sh).
# The end-to-end stage starts as soon as ctest has passed and runs beside the fuzz, sanitize
# and k8s stages (its containers mostly wait on their emulated links, and building its images
# mostly waits on the network and the disk); its log is printed when it ends.
# MQGRAD_E2E_BESIDE=0 runs it after them instead.
# MQGRAD_FUZZ=0, MQGRAD_SANITIZE=0, MQGRAD_K8S=0 and MQGRAD_E2E=0 skip a stage;
# MQGRAD_TEST_JOBS (default: the cores) is how many tests run at once. ctest runs the
# Python tests too (pytest under Debian's /usr/bin/python3, test_python).
#
# Every stage ends passed, failed or skipped, and the last lines say which: a stage or a test
# that could not run (MQGRAD_E2E=0, no Docker engine, a ctest test that exits 77) is counted
# as skipped, never as passed. Exits non-zero when a stage fails, and when one was skipped
# under MQGRAD_REQUIRE_ALL=1 (CI sets it: there everything must run).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
tools/install-deps.sh test
build="${MQGRAD_BUILD_DIR:-build}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac

results=()      # "stage: passed|failed|skipped (why)", in order
passed=0 skipped=0 failed=0 t_all=$(date +%s)
# The machine's busy CPU time so far, in clock ticks (/proc/stat: user, nice, system, irq,
# softirq; the containers' too): the command cannot take less wall time than it over the cores.
s_cpu_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat 2>/dev/null || echo 0; }
cpu0=$(s_cpu_ticks)
s_summary() {
    local took=$(( $(date +%s) - t_all )) hz cores busy
    echo "== test command: $took s"
    hz=$(getconf CLK_TCK 2>/dev/null || echo 100) cores=$(nproc)
    busy=$(( ($(s_cpu_ticks) - cpu0) / hz ))
    echo "   CPU: $busy core-seconds busy on $cores cores (the machine's, whatever ran): no" \
        "order of the stages takes less than $(( busy / cores )) s here"
    for r in "${results[@]}"; do echo "   $r"; done
    echo "== $passed stage(s) passed, $skipped skipped, $failed failed"
}
e2e_pid="" e2e_t0="" e2e_out=""
# A stage that fails ends the command: an end-to-end stage still running beside it is stopped
# (its tests' own traps take their containers down) before the summary.
s_end() {
    local rc=$?
    if [ -n "$e2e_pid" ]; then
        # Its session holds every process it started (each test runs under `timeout`, in a
        # process group of its own); each test's trap takes its containers down on TERM.
        echo "== stopping the end-to-end stage (a stage beside it failed)"
        local k sid
        sid="$(cat "$build/e2e.sid" 2>/dev/null || true)"
        if [ -n "$sid" ]; then
            pkill -TERM -s "$sid" 2>/dev/null || true
            for ((k = 0; k < 180; k++)); do pgrep -s "$sid" >/dev/null || break; sleep 1; done
            pkill -KILL -s "$sid" 2>/dev/null || true
        fi
        kill -TERM "$e2e_pid" 2>/dev/null || true
        results+=("e2e: stopped (a stage beside it failed)")
    fi
    s_summary
    exit "$rc"
}
trap s_end EXIT

# ctest's skipped tests (exit 77, SKIP_RETURN_CODE) from its JUnit file, as "a, b".
s_ctest_skipped() {
    { grep -o '<testcase name="[^"]*"[^>]*status="notrun"' "$1" 2>/dev/null || true; } |
        sed -E 's/<testcase name="([^"]*)".*/\1/' | paste -sd, - | sed 's/,/, /g'
}

# Runs stage NAME: COMMAND...; exit 77 from it means "could not run".
s_stage() {
    local name="$1" t0 rc=0
    shift
    t0="${STAGE_T0:-$(date +%s)}"
    echo "== stage $name"
    "$@" || rc=$?
    local took="$(( $(date +%s) - t0 )) s"
    if [ "$rc" = 77 ]; then
        skipped=$((skipped + 1)); results+=("$name: skipped ($took; it could not run here)")
    elif [ "$rc" != 0 ]; then
        failed=$((failed + 1)); results+=("$name: FAILED ($took, exit $rc)")
        exit "$rc"
    else
        passed=$((passed + 1)); results+=("$name: passed ($took)")
    fi
}

# A stage turned off by its variable.
s_off() {
    skipped=$((skipped + 1)); results+=("$1: skipped ($2)")
    echo "SKIP: $1 ($2)"
}

# ctest in DIR with ARGS; tests that could not run are named and make the stage "skipped" only
# if nothing failed (the stage's other tests did run and pass).
s_ctest() {
    local junit="$1/ctest-junit.xml" rc=0 not_run
    shift
    ctest --output-junit "$junit" "$@" || rc=$?
    not_run="$(s_ctest_skipped "$junit")"
    [ "$rc" = 0 ] || return "$rc"
    if [ -n "$not_run" ]; then
        echo "SKIP: tests that could not run: $not_run"
        results+=("  (tests that could not run: $not_run)")
        [ "${MQGRAD_REQUIRE_ALL:-0}" = 1 ] && return 77
    fi
    return 0
}

s_build() {
    cmake -S . -B "$build" -DMQGRAD_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
        cmake --build "$build" -j"$(nproc)"
}
s_stage build s_build
# As many tests at once as there are cores: the cluster tests spend part of their time waiting
# on sockets and timers, which another test's compute fills.
jobs="${MQGRAD_TEST_JOBS:-$(nproc)}"
s_stage ctest s_ctest "$build" --test-dir "$build" --output-on-failure --timeout 900 -j"$jobs"
# The end-to-end tests, started beside the next stages in a process group of their own.
if [ "${MQGRAD_E2E:-1}" != 0 ] && [ "${MQGRAD_E2E_BESIDE:-1}" != 0 ]; then
    mkdir -p "$build"
    e2e_out="$build/e2e.log" e2e_t0=$(date +%s)
    # --wait: $! ends with the stage even where setsid must fork; the session's id is the
    # leader's pid, which it writes down before it becomes the stage.
    rm -f "$build/e2e.sid"
    setsid --wait bash -c 'echo $$ >"$1"; exec tests/e2e/run.sh' e2e "$build/e2e.sid" \
        >"$e2e_out" 2>&1 &
    e2e_pid=$!
    echo "== stage e2e: started beside the next stages (log: $e2e_out, printed when it ends)"
fi
# Waits for the end-to-end stage started beside the others, prints its log, returns its exit.
s_e2e_join() {
    local rc=0
    wait "$e2e_pid" || rc=$?
    e2e_pid=""
    cat "$e2e_out"
    return "$rc"
}
if [ "${MQGRAD_FUZZ:-1}" != 0 ]; then
    s_stage fuzz tools/fuzz.sh "${MQGRAD_FUZZ_SECONDS:-20}"
else
    s_off fuzz "MQGRAD_FUZZ=0"
fi
if [ "${MQGRAD_SANITIZE:-1}" != 0 ]; then
    # Under ASan and UBSan, every test but the five that train for minutes in separate
    # processes (there they take many minutes each; docs/testing.md); the in-process cluster,
    # protocol and security tests run the same services' code.
    # MQGRAD_SANITIZE_EXCLUDE= (empty) runs them all.
    exclude="${MQGRAD_SANITIZE_EXCLUDE-^test_(elastic|local|methods|clock|python)$}"
    asan="${MQGRAD_ASAN_BUILD_DIR:-build-asan}"
    case "$asan" in /*) ;; *) asan="$repo/$asan" ;; esac
    mkdir -p "$asan"
    s_stage sanitize tools/sanitize.sh ${exclude:+-E "$exclude"} -j"$jobs" \
        --output-junit "$asan/ctest-junit.xml"
    not_run="$(s_ctest_skipped "$asan/ctest-junit.xml")"
    [ -z "$not_run" ] || results+=("  (tests that could not run: $not_run)")
else
    s_off sanitize "MQGRAD_SANITIZE=0"
fi
if [ "${MQGRAD_K8S:-1}" != 0 ]; then
    s_stage k8s tools/check-k8s.sh --self-test
else
    s_off k8s "MQGRAD_K8S=0"
fi
if [ -n "$e2e_pid" ]; then
    STAGE_T0="$e2e_t0" s_stage e2e s_e2e_join
elif [ "${MQGRAD_E2E:-1}" != 0 ]; then
    s_stage e2e tests/e2e/run.sh
else
    s_off e2e "MQGRAD_E2E=0"
fi
if [ "$skipped" != 0 ] && [ "${MQGRAD_REQUIRE_ALL:-0}" = 1 ]; then
    echo "test command: $skipped stage(s) skipped under MQGRAD_REQUIRE_ALL=1: failing" >&2
    exit 1
fi
