#!/usr/bin/env bash
# e2e 1: images build with no registry; `docker compose up --scale worker=3` trains to the end;
# the run directory on the host holds a complete summary.json; every replica exits 0.
source "$(dirname "$0")/lib.sh"
e2e_begin scale "${E2E_LIMIT:-1200}" "$@"

if [ -z "${E2E_SKIP_BUILD:-}" ]; then
    e2e_log "building images offline (quick when they exist)"
    "$E2E_REPO/deploy/build-images.sh" --tag "$MQGRAD_IMAGE" >"$E2E_TMP/build.log" 2>&1 \
        || { tail -n 30 "$E2E_TMP/build.log" >&2; e2e_fail "deploy/build-images.sh failed"; }
fi
# Nothing may have been pulled: every image in use is local and has no registry digest.
for img in debian:bookworm debian:bookworm-slim "$MQGRAD_IMAGE"; do
    [ "$(docker image inspect -f '{{len .RepoDigests}}' "$img")" = 0 ] \
        || e2e_fail "$img has a registry digest: was it pulled?"
done

export MQGRAD_WORKERS=3
export MQGRAD_ITERATIONS="${E2E_ITERATIONS:-200}"
export MQGRAD_EVAL_EVERY="${E2E_EVAL_EVERY:-50}"
t0=$(date +%s)
e2e_log "compose up --scale worker=3 (MQGRAD_WORKERS=3, $MQGRAD_ITERATIONS iterations)"
compose up -d --scale worker=3 >"$E2E_TMP/up.log" 2>&1 \
    || { cat "$E2E_TMP/up.log" >&2; e2e_fail "compose up failed"; }

e2e_wait 300 "the first iteration in metrics.csv" e2e_training_started
t1=$(date +%s)
e2e_log "first iteration $((t1 - t0)) s after 'up'"
echo "up_to_first_iteration_s=$((t1 - t0))" >>"${E2E_FIGURES:-/dev/null}"

workers=$(e2e_containers worker | wc -l)
[ "$workers" = 3 ] || e2e_fail "expected 3 worker containers, found $workers"

e2e_wait "${E2E_TRAIN_LIMIT:-900}" "the scheduler to finish the run" e2e_scheduler_exited
t2=$(date +%s)
e2e_log "run finished $((t2 - t0)) s after 'up' ($(e2e_iterations) iterations in metrics.csv)"
echo "up_to_completed_s=$((t2 - t0))" >>"${E2E_FIGURES:-/dev/null}"

e2e_summary_completed || { cat "$E2E_RUN/summary.json" >&2 2>/dev/null; e2e_fail "summary.json is missing or not \"status\":\"completed\""; }
for f in config.json metrics.csv events.jsonl summary.json; do
    [ -s "$E2E_RUN/$f" ] || e2e_fail "run directory lacks $f"
done
iters=$(e2e_json_num iterations <"$E2E_RUN/summary.json" || true)
[ "$iters" = "$MQGRAD_ITERATIONS" ] || e2e_fail "summary.json says iterations=$iters, expected $MQGRAD_ITERATIONS"
nworkers=$(e2e_json_num workers <"$E2E_RUN/summary.json" || true)
[ -z "$nworkers" ] || [ "$nworkers" = 3 ] || e2e_fail "summary.json says workers=$nworkers, expected 3"
e2e_log "summary: $(tr -d '\n' <"$E2E_RUN/summary.json" | cut -c1-300)"

# The scheduler told everyone to stop: workers and servers leave by themselves, with 0.
e2e_check_exits_zero
