#!/usr/bin/env bash
# e2e 3: `docker compose down` in the middle of a run: every container gets SIGTERM and
# exits 0 within its stop grace period (none is killed), and the run is recorded as interrupted.
source "$(dirname "$0")/lib.sh"
e2e_begin down "${E2E_LIMIT:-900}" "$@"

grace=20   # stop_grace_period in docker-compose.yml
export MQGRAD_WORKERS=2
export MQGRAD_ITERATIONS=100000   # far more than it will get to
compose up -d >"$E2E_TMP/up.log" 2>&1 || { cat "$E2E_TMP/up.log" >&2; e2e_fail "compose up failed"; }
e2e_wait 300 "the first iteration" e2e_training_started
sleep 3

running=$(compose ps -q | wc -l)
[ "$running" -ge 6 ] || e2e_fail "expected at least 6 running containers mid-run, found $running"
# Containers are removed by `down`: record how each one died as it happens.
docker events --filter "label=com.docker.compose.project=$E2E_PROJECT" --filter event=die \
    --format '{{.Actor.Attributes.name}} {{.Actor.Attributes.exitCode}}' >"$E2E_TMP/die.log" &
events_pid=$!
e2e_on_cleanup "kill $events_pid 2>/dev/null"
# `down` removes the containers and their logs: keep a copy to show when a test fails.
compose logs -f --no-color >"$E2E_TMP/logs.txt" 2>&1 &
logs_pid=$!
e2e_on_cleanup "kill $logs_pid 2>/dev/null"
e2e_on_cleanup '[ "$rc" = 0 ] || { e2e_log "their last words:"; grep -E "(E|W) [0-9:.]+ |Assertion|dangling|stop" "$E2E_TMP/logs.txt" | tail -n 20 >&2; }'
sleep 1
t0=$(date +%s)
compose down >"$E2E_TMP/down.log" 2>&1 || { cat "$E2E_TMP/down.log" >&2; e2e_fail "compose down failed"; }
took=$(( $(date +%s) - t0 ))
sleep 2
kill "$events_pid" 2>/dev/null || true
e2e_log "down took ${took}s for $running containers; exits:"
sed 's/^/    /' "$E2E_TMP/die.log" >&2
died=$(wc -l <"$E2E_TMP/die.log")
[ "$died" -ge "$running" ] || e2e_fail "saw $died container exits, expected $running"
bad=$(awk '$2 != 0' "$E2E_TMP/die.log")
[ -z "$bad" ] || e2e_fail "containers did not exit 0: $bad"
# Containers stop in dependency order, so the total is bounded by a few grace periods;
# one killed at the end of its grace period would show exit 137 above.
[ "$took" -le $((3 * grace + 10)) ] || e2e_fail "down took ${took}s"
# Stopped first (see docker-compose.override.yml), the scheduler recorded the run as interrupted.
grep -Eq '"status"[[:space:]]*:[[:space:]]*"interrupted"' "$E2E_RUN/summary.json" 2>/dev/null \
    || e2e_fail "summary.json does not say the run was interrupted: $(tr -d '\n' <"$E2E_RUN/summary.json" 2>/dev/null | cut -c1-200)"
