# Shared helpers for mqgrad's end-to-end tests on real containers (sourced, not run).
# Each test: e2e_begin NAME LIMIT_SECONDS "$@" → runs itself under `timeout`, gets a unique
# compose project, a private run directory and free host ports, and a trap that removes
# every container, network and volume it made, whether it passes, fails or times out.

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
    E2E_CLEANUPS=()
    trap e2e_cleanup EXIT
    trap 'e2e_log "interrupted (time limit ${limit}s?)"; exit 124' TERM INT
    e2e_compose_cmd
    docker image inspect "$MQGRAD_IMAGE" >/dev/null 2>&1 \
        || e2e_fail "image $MQGRAD_IMAGE is missing: run deploy/build-images.sh (tests/e2e/run.sh does)"
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

# Registers a command to run at cleanup, before the project is taken down (last first).
e2e_on_cleanup() { E2E_CLEANUPS+=("$*"); }

e2e_cleanup() {
    local rc=$?
    trap - EXIT TERM INT
    set +e
    local _e2e_k
    for ((_e2e_k = ${#E2E_CLEANUPS[@]} - 1; _e2e_k >= 0; _e2e_k--)); do
        eval "${E2E_CLEANUPS[$_e2e_k]}"
    done
    if [ "$rc" != 0 ] && [ -n "${E2E_PROJECT:-}" ]; then
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
