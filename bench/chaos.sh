#!/usr/bin/env bash
# The chaos run: a compose run of a few minutes with a seeded schedule of crashes of every
# role (worker, server, scheduler, agent), against a calm run of the same settings and seed
# on the same machine, right before it. Reports the iterations lost (as the runs' rollback and
# restart events count them), the time lost (wall time from `compose up` to the run's end,
# chaos minus calm) and the final test accuracy of both.
#
#   bench/chaos.sh [--seed N] [--iterations N] [--every SECONDS] [--workers N]
#
# A crash is SIGKILL to the service's process inside its container (what a fault or the OOM
# killer does; the restart policy then applies, bounded to 3 restarts per container); after
# each one the script waits a little and runs `compose up -d`, as an operator would, so a
# container out of restarts comes back. Needs Docker and the image (deploy/build-images.sh;
# it is built when missing). About 8 minutes with the defaults on 2 cores (two runs of
# ~50 it/s, plus start-up and what the crashes cost).
set -uo pipefail
SEED=1 ITERATIONS=10000 EVERY=15 WORKERS=3
while [ $# -gt 0 ]; do
    case "$1" in
    --seed) SEED="$2"; shift 2 ;;
    --iterations) ITERATIONS="$2"; shift 2 ;;
    --every) EVERY="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "chaos.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$SEED" "$ITERATIONS" "$EVERY" "$WORKERS"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt 0 ] || { echo "chaos.sh: '$v' is not a positive integer" >&2; exit 2; }
done
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../tests/e2e/lib.sh"
e2e_begin chaos $((ITERATIONS + 3600)) --seed "$SEED" --iterations "$ITERATIONS" --every "$EVERY" --workers "$WORKERS"
set +e

if ! docker image inspect "$MQGRAD_IMAGE" >/dev/null 2>&1; then
    "$E2E_REPO/deploy/build-images.sh" --tag "$MQGRAD_IMAGE" >"$E2E_TMP/build.log" 2>&1 \
        || { tail -n 30 "$E2E_TMP/build.log" >&2; e2e_fail "deploy/build-images.sh failed"; }
fi

export MQGRAD_MODEL=small MQGRAD_ITERATIONS="$ITERATIONS" MQGRAD_WORKERS="$WORKERS"
export MQGRAD_SERVERS=2 MQGRAD_EVAL_EVERY=$((ITERATIONS / 4)) MQGRAD_SEED="$SEED"
export MQGRAD_CHECKPOINT_EVERY=100 MQGRAD_HEARTBEAT_TIMEOUT=3 MQGRAD_POLICY=mqgrad

# One run named $1; the chaos driver runs beside it when $2 is "chaos". Prints
# "WALL_S ACCURACY ITERATIONS LOST KILLS".
run() {
    local name="$1" mode="$2"
    export MQGRAD_RUN_NAME="$name"
    E2E_RUN="$E2E_TMP/runs/$name"
    local t0 kills=0
    t0=$(date +%s)
    compose up -d --scale worker="$WORKERS" >"$E2E_TMP/up-$name.log" 2>&1 \
        || { cat "$E2E_TMP/up-$name.log" >&2; e2e_fail "compose up failed"; }
    e2e_wait 300 "the first iteration of $name" e2e_training_started
    RANDOM=$SEED
    local roles=(worker worker server scheduler agent)
    while ! e2e_summary_completed; do
        if [ $(( $(date +%s) - t0 )) -gt $((ITERATIONS + 1800)) ]; then
            e2e_fail "$name did not complete"
        fi
        if [ "$mode" != chaos ]; then
            sleep 2
            continue
        fi
        sleep $((EVERY / 2 + RANDOM % EVERY))
        e2e_summary_completed && break
        local role="${roles[RANDOM % ${#roles[@]}]}" ids id
        mapfile -t ids < <(compose ps -q "$role" 2>/dev/null)
        [ "${#ids[@]}" -gt 0 ] || continue
        id="${ids[RANDOM % ${#ids[@]}]}"
        e2e_log "chaos at iteration $(e2e_iterations): crashing the $role ${id:0:12}"
        (e2e_crash "$id") >/dev/null 2>&1 && kills=$((kills + 1)) # restarting: nothing to kill
        echo "$role" >>"$E2E_TMP/kills-$name"
        sleep 5
        compose up -d --scale worker="$WORKERS" >/dev/null 2>&1 # the operator
    done
    local wall=$(( $(date +%s) - t0 ))
    local s="$E2E_RUN/summary.json" acc iters lost
    acc=$(e2e_json_float final_test_acc <"$s")
    iters=$(e2e_json_num iterations <"$s")
    lost=$(grep -Eo '"iterations_lost":[0-9]+' "$E2E_RUN/events.jsonl" | awk -F: '{n += $2} END {print n + 0}')
    cp -r "$E2E_RUN" "$E2E_TMP/keep-$name" 2>/dev/null
    compose down -v --timeout 30 >/dev/null 2>&1
    echo "$wall $acc $iters $lost $kills"
}

e2e_log "calm run: $ITERATIONS iterations, $WORKERS workers, 2 servers, seed $SEED"
read -r calm_wall calm_acc calm_iters calm_lost _ < <(run calm calm)
e2e_log "chaos run: a crash every ${EVERY}-$((EVERY * 3 / 2)) s"
read -r chaos_wall chaos_acc chaos_iters chaos_lost kills < <(run chaos chaos)
[ -n "${calm_acc:-}" ] && [ -n "${chaos_acc:-}" ] || e2e_fail "a run did not complete (logs above)"
ev="$E2E_TMP/keep-chaos/events.jsonl"
count() { local n; n=$(grep -c "\"event\":\"$1\"" "$ev" 2>/dev/null); echo "${n:-0}"; }
by_role=$(sort "$E2E_TMP/kills-chaos" 2>/dev/null | uniq -c | awk '{printf "%s%s %s", n++ ? ", " : "", $1, $2}')
cat <<EOF
chaos run (bench/chaos.sh --seed $SEED --iterations $ITERATIONS --every $EVERY --workers $WORKERS)
                    calm        chaos
iterations          $calm_iters     $chaos_iters
final test acc      $calm_acc   $chaos_acc
wall time (s)       $calm_wall         $chaos_wall      (time lost: $((chaos_wall - calm_wall)) s, $(awk -v a="$chaos_wall" -v b="$calm_wall" 'BEGIN{printf "%.2f", a / b}')x)
iterations lost     $calm_lost           $chaos_lost        (rollback and restart events)
crashes             0           $kills ($by_role)
events: worker_lost $(count worker_lost), worker_joined $(count worker_joined), rollback $(count rollback), restart $(count restart), pause $(count pause)
EOF
