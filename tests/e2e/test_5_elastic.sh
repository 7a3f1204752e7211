#!/usr/bin/env bash
# e2e 5: membership that changes while a compose run trains, and the restart policies.
# Each scenario is its own compose project and run directory, and must end with the run
# "completed" after exactly MQGRAD_ITERATIONS iterations, a final test accuracy in the band
# below, and the membership events it caused in events.jsonl:
#   kill       SIGKILL to one worker's process at 25 %: worker_lost, the restart policy
#              brings the container back, it registers again (worker_joined); then
#              `docker kill` of the other at 50 %: lost too, but Docker counts `docker kill`
#              as a manual stop and does not restart it, so the test starts it again.
#   scale      `compose up -d --scale worker=3` from 2 at 25 %, `--scale worker=1` at 60 %:
#              joins, then losses with reason "it left (stopped)" (SIGTERM, exit 0); the
#              metrics' workers column reads 2, 3 and 1.
#   scheduler  `compose restart scheduler` at 40 %: the run resumes from the last checkpoint
#              (a "restart" event with from_iter) and completes.
#   server     SIGKILL to one server's process at 40 %: the policy restarts it and the run
#              rolls back to the last checkpoint ("rollback") and completes.
# E2E_ELASTIC_ONLY=regex picks scenarios.
#
# Pace: the small model, 2 workers, 1000 iterations over emulated 100 Mbit/s links, so an
# iteration takes ~70 ms whatever the machine's speed (measured: 14 it/s, 71 s of training
# on 2 cores) and there is time to see each change take effect before the run ends.
# Accuracy band: an undisturbed compose run with these settings ended at 0.821 (measured
# 2026-11-24, seed 1, on 2000 test images; 0.776 at iteration 300, 0.64 at 100). The
# disturbed runs ended between 0.773 and 0.826 (kill 0.805-0.826, scale 0.773-0.817: one
# worker, batch 32, for its last 40 %, is the noisiest; scheduler and server 0.8195). The
# floor is 0.72: ten points under the calm run and five under the worst disturbed one, and
# still far above what a run that lost its parameters or averaged wrong shards would show
# (the small model is at 0.64 after only 100 iterations; 0.10 is chance).
source "$(dirname "$0")/lib.sh"

if [ $# -eq 0 ]; then
    # The scenarios E2E_ELASTIC_JOBS at once (default 1: one after another), each under its
    # own time limit, project, run directory, cleanup and host ports (a base of its own, so
    # that two never take the same free port at once). Side by side they take about 60 % of
    # the time, but the scale scenario's accuracy then fell towards the floor below (it ended
    # between 0.73 and 0.78 in three such runs beside the fuzz and sanitizer stages, against
    # 0.80 and 0.81 alone): the floor was set on scenarios run alone, so they run alone.
    jobs="${E2E_ELASTIC_JOBS:-1}"
    rc=0 k=0 pids=() names=()
    for s in kill scale scheduler server; do
        [[ "$s" =~ ${E2E_ELASTIC_ONLY:-.} ]] || continue
        if [ "${#pids[@]}" -ge "$jobs" ]; then
            wait "${pids[0]}" || { rc=1; echo "elastic: scenario ${names[0]} failed" >&2; }
            pids=("${pids[@]:1}") names=("${names[@]:1}")
        fi
        E2E_AGENT_PORT=$((7200 + 20 * k)) E2E_HTTP_PORT=$((8200 + 20 * k)) \
            E2E_SCHEDULER_HTTP_PORT=$((8000 + 20 * k)) E2E_PROMETHEUS_PORT=$((9090 + 20 * k)) \
            env -u E2E_UNDER_TIMEOUT bash "$0" "$s" &
        pids+=($!) names+=("$s") k=$((k + 1))
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { rc=1; echo "elastic: scenario ${names[$i]} failed" >&2; }
    done
    exit "$rc"
fi

scenario="$1"
e2e_begin "elastic-$scenario" "${E2E_LIMIT:-600}" "$@"

export MQGRAD_WORKERS=2
export MQGRAD_ITERATIONS="${E2E_ELASTIC_ITERATIONS:-1000}"
export MQGRAD_EVAL_EVERY="${E2E_ELASTIC_EVAL_EVERY:-250}"
export MQGRAD_LINK_MBPS="${E2E_ELASTIC_LINK_MBPS:-100}"
export MQGRAD_HEARTBEAT_TIMEOUT=3
export MQGRAD_CHECKPOINT_EVERY=100
MIN_ACC="${E2E_ELASTIC_MIN_ACC:-0.72}"
N="$MQGRAD_ITERATIONS"
figure() { echo "elastic_${scenario}_$1=$2" >>"${E2E_FIGURES:-/dev/null}"; e2e_log "figure: $1=$2"; }

# Every container of the project that dies, with its exit code, as it happens (containers
# removed by a scale-down take their state with them).
docker events --filter "label=com.docker.compose.project=$E2E_PROJECT" --filter event=die \
    --format '{{.Actor.Attributes.name}} {{.Actor.Attributes.exitCode}}' >"$E2E_TMP/die.log" &
events_pid=$!
e2e_on_cleanup "kill $events_pid 2>/dev/null"
e2e_on_cleanup '[ "$rc" = 0 ] || { e2e_log "events.jsonl:"; grep -v "\"event\":\"\(bits\|guard\|checkpoint\)\"" "$E2E_RUN/events.jsonl" 2>/dev/null | tail -n 30 >&2; }'

t_up=$(date +%s)
compose up -d >"$E2E_TMP/up.log" 2>&1 || { cat "$E2E_TMP/up.log" >&2; e2e_fail "compose up failed"; }
e2e_wait 300 "the first iteration" e2e_training_started
e2e_log "training started $(( $(date +%s) - t_up )) s after 'up'"

# Seconds since $1 (a date +%s).
since() { echo $(( $(date +%s) - $1 )); }
# The run went back to a checkpoint: a restarted scheduler writes {"event":"restart",
# "from_iter":..}, a lost server {"event":"rollback",..}, both with "iterations_lost" (a
# "resume" event, the name first planned, is taken too; no pause happens in these scenarios).
RESUMED='"event":"(restart|rollback|resume)"'
run_resumed() { grep -Eq "$RESUMED" "$E2E_RUN/events.jsonl" 2>/dev/null; }
resumed_check() {
    local ev from lost
    ev=$(grep -E "$RESUMED" "$E2E_RUN/events.jsonl" | head -n1)
    e2e_log "resumed: $ev"
    from=$(e2e_json_num from_iter <<<"$ev" || true)
    lost=$(e2e_json_num iterations_lost <<<"$ev" || true)
    [ -n "$from" ] && figure resumed_from_iter "$from"
    [ -n "$lost" ] && figure iterations_lost "$lost"
    # From a checkpoint: at most one checkpoint period is done again.
    [ -z "$lost" ] || [ "$lost" -le "$MQGRAD_CHECKPOINT_EVERY" ] \
        || e2e_fail "the resumed run lost $lost iterations, more than a checkpoint period ($MQGRAD_CHECKPOINT_EVERY)"
}
running_again() {
    [ "$(docker inspect -f '{{.State.Status}}' "$1")" = running ] && [ "$(e2e_restarts "$1")" -ge 1 ]
}
finish() {
    e2e_wait "${E2E_TRAIN_LIMIT:-480}" "the run to end" e2e_scheduler_exited
    figure up_to_end_s "$(since "$t_up")"
    local fig
    fig=$(e2e_check_run "$N" "$MIN_ACC")
    read -r acc iters train_s <<<"$fig"
    figure final_test_acc "$acc"
    figure iterations "$iters"
    figure train_time_s "$train_s"
    local col
    col=$(e2e_metrics_column workers | uniq -c | awk '{ printf "%s%s×%s", (NR > 1 ? " " : ""), $2, $1 }')
    e2e_log "workers per iteration (value×rows, in order): $col"
    [ "$(e2e_metrics_column iter | tail -n1)" = "$((N - 1))" ] \
        || e2e_fail "metrics.csv's last iteration is $(e2e_metrics_column iter | tail -n1), expected $((N - 1))"
    e2e_log "membership events:"
    grep -E '"event":"(worker_lost|worker_joined|server_lost|pause|resume|restart|rollback|stop)"' "$E2E_RUN/events.jsonl" | sed 's/^/    /' >&2
}

case "$scenario" in
kill)
    e2e_wait 300 "iteration $((N / 4))" e2e_iterations_at_least $((N / 4))
    mapfile -t ws < <(e2e_containers worker)
    [ "${#ws[@]}" = 2 ] || e2e_fail "expected 2 worker containers, found ${#ws[@]}"
    a="${ws[0]}" b="${ws[1]}"
    # 1. A crash: SIGKILL to the worker process. Nothing says goodbye: the scheduler finds out
    #    after the heartbeat timeout; the policy (on-failure:3) restarts the container at once.
    t0=$(date +%s)
    e2e_crash "$a"
    e2e_wait 60 "the killed worker to be lost" e2e_event_at_least worker_lost 1
    figure crash_to_lost_s "$(since "$t0")"
    e2e_wait 60 "the restart policy to restart ${a:0:12}" running_again "$a"
    figure crash_to_restarted_s "$(since "$t0")"
    e2e_wait 90 "the restarted worker to join" e2e_event_at_least worker_joined 1
    figure crash_to_joined_s "$(since "$t0")"
    e2e_log "lost: $(e2e_events worker_lost | tail -n1)"
    e2e_log "joined: $(e2e_events worker_joined | tail -n1)"
    e2e_events worker_lost | grep -q '"reason":"silent' \
        || e2e_log "note: the crash was not reported as silence: $(e2e_events worker_lost | head -n1)"

    # 2. `docker kill`: SIGKILL too, but a manual stop for Docker, which then ignores the
    #    restart policy (documented; moby/moby#21359). An operator starts it again.
    e2e_wait 300 "iteration $((N / 2))" e2e_iterations_at_least $((N / 2))
    e2e_scheduler_exited && e2e_fail "the run ended before the second kill"
    t0=$(date +%s)
    docker kill "$b" >/dev/null
    e2e_wait 60 "the docker-killed worker to be lost" e2e_event_at_least worker_lost 2
    figure docker_kill_to_lost_s "$(since "$t0")"
    sleep 2
    st=$(e2e_state "$b")
    e2e_log "after docker kill: ${b:0:12} is '$st', restarted $(e2e_restarts "$b") times"
    if [ "$(docker inspect -f '{{.State.Status}}' "$b")" != running ]; then
        e2e_log "Docker did not restart it (manual stop): docker start"
        docker start "$b" >/dev/null
    fi
    e2e_wait 90 "the started worker to join" e2e_event_at_least worker_joined 2
    figure docker_kill_to_joined_s "$(since "$t0")"

    finish
    [ "$(e2e_metrics_column workers | tail -n1)" = 2 ] \
        || e2e_fail "the last iterations were not aggregated over 2 workers again: $(e2e_metrics_column workers | tail -n1)"
    e2e_check_exits_zero
    ;;

scale)
    e2e_wait 300 "iteration $((N / 4))" e2e_iterations_at_least $((N / 4))
    t0=$(date +%s)
    compose up -d --scale worker=3 >"$E2E_TMP/up3.log" 2>&1 || { cat "$E2E_TMP/up3.log" >&2; e2e_fail "compose up --scale worker=3 failed"; }
    figure scale_up_cmd_s "$(since "$t0")"
    [ "$(e2e_containers worker | wc -l)" = 3 ] || e2e_fail "expected 3 worker containers"
    e2e_wait 90 "the third worker to join" e2e_event_at_least worker_joined 1
    figure scale_up_to_joined_s "$(since "$t0")"
    has_rows_with() { e2e_metrics_column workers | grep -qx "$1"; }
    e2e_wait 60 "an iteration aggregated over 3 workers" has_rows_with 3

    e2e_wait 300 "iteration $((N * 6 / 10))" e2e_iterations_at_least $((N * 6 / 10))
    e2e_scheduler_exited && e2e_fail "the run ended before the scale-down"
    t0=$(date +%s)
    compose up -d --scale worker=1 >"$E2E_TMP/up1.log" 2>&1 || { cat "$E2E_TMP/up1.log" >&2; e2e_fail "compose up --scale worker=1 failed"; }
    figure scale_down_cmd_s "$(since "$t0")"
    [ "$(e2e_containers worker | wc -l)" = 1 ] || e2e_fail "expected 1 worker container after the scale-down"
    left() { [ "$(e2e_events worker_lost | grep -c '"reason":"it left (stopped)"')" -ge 2 ]; }
    e2e_wait 30 "two workers to leave with reason 'it left (stopped)'" left
    figure scale_down_to_left_s "$(since "$t0")"
    e2e_wait 60 "an iteration aggregated over 1 worker" has_rows_with 1

    finish
    for n in 2 3 1; do has_rows_with "$n" || e2e_fail "no iteration in metrics.csv was aggregated over $n workers"; done
    [ "$(e2e_metrics_column workers | tail -n1)" = 1 ] || e2e_fail "the last iteration was not aggregated over 1 worker"
    lost=$(e2e_event_count worker_lost)
    [ "$lost" = 2 ] || e2e_fail "expected 2 worker_lost events (the scale-down), found $lost"
    e2e_check_exits_zero
    # Removed by the scale-down, the two workers are gone: their exits are in the die events.
    sleep 1
    e2e_log "container exits: $(tr '\n' ';' <"$E2E_TMP/die.log")"
    bad=$(awk '$2 != 0' "$E2E_TMP/die.log")
    [ -z "$bad" ] || e2e_fail "containers exited non-zero (SIGKILL after the grace period is 137): $bad"
    [ "$(grep -c '_worker_' "$E2E_TMP/die.log")" -ge 3 ] || e2e_fail "expected the exits of 3 workers in docker events"
    ;;

scheduler)
    e2e_wait 300 "iteration $((N * 4 / 10))" e2e_iterations_at_least $((N * 4 / 10))
    e2e_event_at_least checkpoint 1 || e2e_log "note: no checkpoint event yet"
    at=$(e2e_iterations)
    t0=$(date +%s)
    compose restart scheduler >"$E2E_TMP/restart.log" 2>&1 || { cat "$E2E_TMP/restart.log" >&2; e2e_fail "compose restart scheduler failed"; }
    figure restart_cmd_s "$(since "$t0")"
    e2e_log "scheduler restarted at iteration ~$at"
    e2e_wait 180 "the run to resume (a restart or rollback event)" run_resumed
    figure restart_to_resume_s "$(since "$t0")"
    resumed_check
    finish
    e2e_check_exits_zero
    ;;

server)
    e2e_wait 300 "iteration $((N * 4 / 10))" e2e_iterations_at_least $((N * 4 / 10))
    e2e_event_at_least checkpoint 1 || e2e_log "note: no checkpoint event yet"
    s=$(e2e_containers server | sed -n 1p) # not head: SIGPIPE under pipefail
    t0=$(date +%s)
    e2e_crash "$s"
    e2e_wait 60 "the restart policy to restart server ${s:0:12}" running_again "$s"
    figure crash_to_restarted_s "$(since "$t0")"
    e2e_wait 180 "the run to resume (a restart or rollback event)" run_resumed
    figure crash_to_resume_s "$(since "$t0")"
    resumed_check
    finish
    e2e_check_exits_zero
    ;;

*) e2e_fail "unknown scenario '$scenario' (kill, scale, scheduler, server)" ;;
esac
