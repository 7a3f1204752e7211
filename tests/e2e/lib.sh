# Shared helpers for mqgrad's end-to-end tests on real containers (sourced, not run).
# Each test: e2e_begin NAME LIMIT_SECONDS "$@" → runs itself under `timeout`, gets a unique
# compose project, a private run directory and free host ports, and a trap that removes
# every container, network and volume it made, whether it passes, fails or times out.
# E2E_KEEP_RUNS=DIR keeps a copy of each run directory and the services' logs there.

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_REPO="$(cd "$E2E_DIR/../.." && pwd)"
export MQGRAD_IMAGE="${MQGRAD_IMAGE:-mqgrad:latest}"

e2e_log() { printf '%s [%s] %s\n' "$(date -u +%H:%M:%S)" "${E2E_NAME:-e2e}" "$*" >&2; }
e2e_fail() { e2e_log "FAIL: $*"; exit 1; }

# Re-executes the calling test under `timeout` (once), then sets up its world.
e2e_begin() {
    E2E_NAME="$1"
    local limit="$2"
    shift 2
    if [ -z "${E2E_UNDER_TIMEOUT:-}" ]; then
        export E2E_UNDER_TIMEOUT=1
        # -k: what cleanup may still take after the limit, before everything is killed.
        exec timeout -k 120 "$limit" bash "$0" "$@"
    fi
    set -euo pipefail
    E2E_START=$(date +%s)
    E2E_PROJECT="mqgrad-e2e-${E2E_NAME}-$$"
    E2E_TMP="$(mktemp -d "${TMPDIR:-/tmp}/mqgrad-e2e-${E2E_NAME}.XXXXXX")"
    # The scheduler writes the run directory as uid 10001 (the image's user) unless the
    # caller is not root, then as the caller, so the files can be removed afterwards.
    mkdir -p "$E2E_TMP/runs"
    if [ "$(id -u)" = 0 ]; then
        chmod 0777 "$E2E_TMP/runs"
    else
        export MQGRAD_UID="$(id -u)" MQGRAD_GID="$(id -g)"
    fi
    export MQGRAD_RUNS="$E2E_TMP/runs"
    export MQGRAD_RUN_NAME="$E2E_NAME"
    E2E_RUN="$E2E_TMP/runs/$E2E_NAME"
    export MQGRAD_AGENT_PORT="$(e2e_free_port "${E2E_AGENT_PORT:-7200}")"
    export MQGRAD_HTTP_PORT="$(e2e_free_port "${E2E_HTTP_PORT:-8200}")"
    # the scheduler's /metrics and the monitoring profile's Prometheus, published as well
    export MQGRAD_SCHEDULER_HTTP_PORT="$(e2e_free_port "${E2E_SCHEDULER_HTTP_PORT:-8000}")"
    export MQGRAD_PROMETHEUS_PORT="$(e2e_free_port "${E2E_PROMETHEUS_PORT:-9090}")"
    E2E_CLEANUPS=()
    trap e2e_cleanup EXIT
    trap 'e2e_log "interrupted (time limit ${limit}s?)"; exit 124' TERM INT
    e2e_compose_cmd
    docker image inspect "$MQGRAD_IMAGE" >/dev/null 2>&1 \
        || e2e_fail "image $MQGRAD_IMAGE is missing: run deploy/build-images.sh (tests/e2e/run.sh does)"
    # The cluster's keys (SECURITY.md), made as a user makes them: security is on.
    export MQGRAD_KEYS_DIR="$E2E_TMP/keys"
    "$E2E_REPO/deploy/keygen.sh" "$MQGRAD_KEYS_DIR" >/dev/null || e2e_fail "deploy/keygen.sh failed"
    e2e_log "project $E2E_PROJECT, run dir $E2E_RUN, ports agent $MQGRAD_AGENT_PORT http $MQGRAD_HTTP_PORT"
}

# The first port from $1 up that nothing on this host listens on.
e2e_free_port() {
    local p="$1"
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}

# Compose v2 (`docker compose`) if present, else docker-compose v1; E2E_COMPOSE_CMD overrides.
e2e_compose_cmd() {
    if [ -n "${E2E_COMPOSE_CMD:-}" ]; then
        read -r -a E2E_COMPOSE <<<"$E2E_COMPOSE_CMD"
    elif docker compose version >/dev/null 2>&1; then
        E2E_COMPOSE=(docker compose)
    elif command -v docker-compose >/dev/null 2>&1; then
        E2E_COMPOSE=(docker-compose)
    else
        e2e_fail "neither 'docker compose' nor 'docker-compose' is installed"
    fi
}

# `compose ARGS...` for this test's project, with both compose files of the repository.
compose() {
    (cd "$E2E_REPO" && "${E2E_COMPOSE[@]}" -p "$E2E_PROJECT" \
        -f docker-compose.yml -f docker-compose.override.yml "$@")
}

# Registers a command to run at cleanup, before the project is taken down (the last
# registered first); E2E_STATUS is then the test's exit status.
e2e_on_cleanup() { E2E_CLEANUPS+=("$*"); }

e2e_cleanup() {
    local rc=$?
    trap - EXIT TERM INT
    set +e
    E2E_STATUS=$rc # the hooks' to read: non-zero when the test failed
    local _e2e_k
    for ((_e2e_k = ${#E2E_CLEANUPS[@]} - 1; _e2e_k >= 0; _e2e_k--)); do
        eval "${E2E_CLEANUPS[$_e2e_k]}"
    done
    # E2E_KEEP_RUNS=DIR keeps a copy of the run directory (and the logs) to look at later.
    if [ -n "${E2E_KEEP_RUNS:-}" ] && [ -d "${E2E_RUN:-}" ]; then
        mkdir -p "$E2E_KEEP_RUNS" && cp -r "$E2E_RUN" "$E2E_KEEP_RUNS/$E2E_NAME-$$" \
            && compose logs --no-color >"$E2E_KEEP_RUNS/$E2E_NAME-$$/compose.log" 2>&1 \
            && e2e_log "run directory kept in $E2E_KEEP_RUNS/$E2E_NAME-$$"
    fi
    if [ "$rc" != 0 ] && [ -n "${E2E_PROJECT:-}" ]; then
        e2e_log "containers of $E2E_PROJECT (state, exit code, restarts by the policy):"
        docker ps -aq --filter "label=com.docker.compose.project=$E2E_PROJECT" \
            | xargs -r docker inspect -f '    {{.Name}} {{.State.Status}} {{.State.ExitCode}} restarts={{.RestartCount}}' >&2 2>/dev/null
        e2e_log "last logs of $E2E_PROJECT:"
        compose logs --no-color --tail 30 >&2 2>/dev/null
    fi
    if [ -n "${E2E_PROJECT:-}" ]; then
        compose down -v --remove-orphans --timeout 30 >/dev/null 2>&1
        # Whatever compose did not remove (e.g. it failed to parse): by label.
        local label="label=com.docker.compose.project=$E2E_PROJECT"
        docker ps -aq --filter "$label" | xargs -r docker rm -f >/dev/null 2>&1
        docker network ls -q --filter "$label" | xargs -r docker network rm >/dev/null 2>&1
        docker volume ls -q --filter "$label" | xargs -r docker volume rm -f >/dev/null 2>&1
    fi
    [ -n "${E2E_TMP:-}" ] && rm -rf "$E2E_TMP"
    e2e_log "$([ "$rc" = 0 ] && echo PASS || echo "FAIL (exit $rc)") in $(( $(date +%s) - E2E_START )) s"
    exit "$rc"
}

# Waits up to $1 seconds for the command "$@" (after shift) to succeed; fails with $2.
e2e_wait() {
    local limit="$1" what="$2"
    shift 2
    local end=$(( $(date +%s) + limit ))
    until "$@"; do
        [ "$(date +%s)" -lt "$end" ] || e2e_fail "timed out after ${limit}s waiting for: $what"
        sleep 1
    done
}

# Number of iterations recorded in the run's metrics.csv (data rows, not the header).
e2e_iterations() {
    local f="$E2E_RUN/metrics.csv"
    [ -f "$f" ] || { echo 0; return; }
    local n
    n=$(wc -l <"$f")
    echo $(( n > 0 ? n - 1 : 0 ))
}
e2e_training_started() { [ "$(e2e_iterations)" -ge 1 ]; }
e2e_summary_completed() {
    [ -f "$E2E_RUN/summary.json" ] && grep -Eq '"status"[[:space:]]*:[[:space:]]*"completed"' "$E2E_RUN/summary.json"
}

# Prints the value of a top-level JSON number field $1 from standard input.
e2e_json_num() { grep -Eo "\"$1\"[[:space:]]*:[[:space:]]*-?[0-9]+" | head -n1 | grep -Eo -- '-?[0-9]+$'; }

# Container ids of a compose service (running or not).
e2e_containers() { compose ps -aq "$1" 2>/dev/null; }

# "STATUS EXITCODE" of a container.
e2e_state() { docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$1"; }

e2e_scheduler_exited() {
    local id
    id=$(e2e_containers scheduler | head -n1)
    [ -n "$id" ] && [ "$(docker inspect -f '{{.State.Status}}' "$id")" = exited ]
}

# A top-level JSON number field $1 (integer or not) from standard input.
e2e_json_float() {
    grep -Eo "\"$1\"[[:space:]]*:[[:space:]]*-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?" | head -n1 \
        | sed -E 's/^[^:]*:[[:space:]]*//'
}

# Lines of the run's events.jsonl whose "event" is $1 (nothing when there is none).
e2e_events() { grep -E "\"event\":\"$1\"" "$E2E_RUN/events.jsonl" 2>/dev/null || true; }
# How many events $1 the run has recorded.
e2e_event_count() { e2e_events "$1" | wc -l; }
# Succeeds once the run has recorded at least $2 events $1.
e2e_event_at_least() { [ "$(e2e_event_count "$1")" -ge "$2" ]; }

# The values of metrics.csv's column named $1, one per data row (the header names columns).
e2e_metrics_column() {
    awk -F, -v want="$1" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == want) c = i; next }
                          c { print $c }' "$E2E_RUN/metrics.csv" 2>/dev/null
}
# Succeeds once metrics.csv holds at least $1 iterations.
e2e_iterations_at_least() { [ "$(e2e_iterations)" -ge "$1" ]; }

# How many times Docker's restart policy restarted container $1.
e2e_restarts() { docker inspect -f '{{.RestartCount}}' "$1"; }

# Crashes the service in container $1 the way a fault or the kernel's OOM killer would:
# SIGKILL to the mqgrad process (tini's child), from inside the container. Not `docker kill`,
# which Docker counts as a manual stop: the restart policy then does not apply.
e2e_crash() {
    local killed
    killed=$(docker exec "$1" sh -c '
        for d in /proc/[0-9]*; do
            read -r c <"$d/comm" 2>/dev/null || continue
            case "$c" in mqgrad-*) kill -KILL "${d#/proc/}" && echo "pid ${d#/proc/} ($c)" ;; esac
        done' 2>&1 || true)
    [ -n "$killed" ] || e2e_fail "found no mqgrad process to kill in ${1:0:12}"
    e2e_log "SIGKILL to $killed in ${1:0:12}"
}

# The checks every finished run must pass: summary.json says "completed" after $1 iterations
# and a final test accuracy of at least $2. Prints "ACCURACY ITERATIONS TRAIN_TIME_S".
e2e_check_run() {
    local want="$1" min_acc="$2" s="$E2E_RUN/summary.json"
    e2e_summary_completed || e2e_fail "summary.json is missing or not \"status\":\"completed\": $(tr -d '\n' <"$s" 2>/dev/null | cut -c1-400)"
    local iters acc tt
    iters=$(e2e_json_num iterations <"$s" || true)
    [ "$iters" = "$want" ] || e2e_fail "summary.json says iterations=$iters, expected $want"
    acc=$(e2e_json_float final_test_acc <"$s" || true)
    [ -n "$acc" ] || e2e_fail "summary.json has no final_test_acc: $(tr -d '\n' <"$s" | cut -c1-400)"
    awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' \
        || e2e_fail "final test accuracy $acc is below the band's floor $min_acc"
    tt=$(e2e_json_float train_time_s <"$s" || true)
    echo "$acc $iters ${tt:-?}"
}

# Waits for every scheduler, server and worker container to exit, then requires exit 0.
e2e_check_exits_zero() {
    local ids
    ids="$(e2e_containers worker; e2e_containers server; e2e_containers scheduler)"
    e2e_wait 60 "workers and servers to exit" bash -c '
        for id in $0; do [ "$(docker inspect -f "{{.State.Status}}" "$id")" = exited ] || exit 1; done' "$ids"
    local svc id st
    for svc in scheduler server worker; do
        for id in $(e2e_containers "$svc"); do
            st=$(e2e_state "$id")
            [ "$st" = "exited 0" ] || e2e_fail "$svc container ${id:0:12} is '$st', expected 'exited 0'"
        done
    done
}
