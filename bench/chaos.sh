#!/usr/bin/env bash
# The chaos run: a compose run of a few minutes with a seeded schedule of crashes of every
# role (worker, server, scheduler, agent), against a calm run of the same settings and seed
# on the same machine, right before it. Reports the iterations lost (as the runs' rollback and
# restart events count them), the time lost (wall time from `compose up` to the run's end,
# chaos minus calm) and the final test accuracy of both.
#
#   bench/chaos.sh [--seed N] [--iterations N] [--every SECONDS] [--workers N] [--network]
#
# A crash is SIGKILL to the service's process inside its container (what a fault or the OOM
# killer does; the restart policy then applies, bounded to 3 restarts per container); after
# each one the script waits a little and runs `compose up -d`, as an operator would, so a
# container out of restarts comes back. Needs Docker and the image (deploy/build-images.sh;
# it is built when missing). About 8 minutes with the defaults on 2 cores (two runs of
# ~50 it/s, plus start-up and what the crashes cost).
#
# --network (root: iptables, tc, nsenter): the chaos run's events are also network faults,
# two in three of them by the seeded schedule, on a random service's container for 10-60 s,
# then healed: it loses 1-5 % of its packets (iptables' statistic match, both directions), or
# is cut off (everything on its eth0 dropped, both directions), or its link is slowed: 50-200
# ms of delay with a quarter of it as jitter (tc netem, both ends of its link) where the
# kernel has netem, else a congested link (tc tbf at 2-20 Mbit/s with a queue of 50-200 ms,
# both ends). Faults overlap crashes and one another. The script then checks the goals: the
# run completes, loses at most the checkpoint interval per fault or crash, and ends within 1
# point of the calm run's accuracy; it exits 1 when one is missed.
set -uo pipefail
SEED=1 ITERATIONS=10000 EVERY=15 WORKERS=3 NETWORK=0
while [ $# -gt 0 ]; do
    case "$1" in
    --network) NETWORK=1; shift ;;
    --seed) SEED="$2"; shift 2 ;;
    --iterations) ITERATIONS="$2"; shift 2 ;;
    --every) EVERY="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "chaos.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$SEED" "$ITERATIONS" "$EVERY" "$WORKERS"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt 0 ] || { echo "chaos.sh: '$v' is not a positive integer" >&2; exit 2; }
done
if [ "$NETWORK" = 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "chaos.sh: --network needs root (iptables, tc, nsenter)" >&2; exit 2; }
    for t in iptables tc nsenter ip unshare; do
        command -v "$t" >/dev/null || { echo "chaos.sh: --network needs $t (iptables, iproute2, util-linux)" >&2; exit 2; }
    done
    # Delay needs the kernel's netem; without it a slow link stands in (see above).
    NETEM=0
    unshare -n tc qdisc add dev lo root netem delay 1ms 2>/dev/null && NETEM=1
fi
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../tests/e2e/lib.sh"
args=(--seed "$SEED" --iterations "$ITERATIONS" --every "$EVERY" --workers "$WORKERS")
[ "$NETWORK" = 1 ] && args+=(--network)
e2e_begin chaos $((ITERATIONS + 3600)) "${args[@]}"
set +e

if ! docker image inspect "$MQGRAD_IMAGE" >/dev/null 2>&1; then
    "$E2E_REPO/deploy/build-images.sh" --tag "$MQGRAD_IMAGE" >"$E2E_TMP/build.log" 2>&1 \
        || { tail -n 30 "$E2E_TMP/build.log" >&2; e2e_fail "deploy/build-images.sh failed"; }
fi

export MQGRAD_MODEL=small MQGRAD_ITERATIONS="$ITERATIONS" MQGRAD_WORKERS="$WORKERS"
export MQGRAD_SERVERS=2 MQGRAD_EVAL_EVERY=$((ITERATIONS / 4)) MQGRAD_SEED="$SEED"
INTERVAL=100
export MQGRAD_CHECKPOINT_EVERY=$INTERVAL MQGRAD_HEARTBEAT_TIMEOUT=3 MQGRAD_POLICY=mqgrad

# ---- network faults (--network) ----
# The two ends of container $1's link, "NS_PID HOST_VETH": its eth0 is seen from its network
# namespace, the peer by the index eth0 names (eth0@ifN).
s_link_ends() {
    local pid idx veth
    pid=$(docker inspect -f '{{.State.Pid}}' "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && [ "$pid" != 0 ] || return 1
    idx=$(nsenter -t "$pid" -n ip -o link show eth0 2>/dev/null | sed -nE 's/^[0-9]+: eth0@if([0-9]+):.*/\1/p')
    [ -n "$idx" ] || return 1
    veth=$(ip -o link | awk -F': ' -v i="$idx" '$1 == i { sub(/@.*/, "", $2); print $2 }')
    [ -n "$veth" ] || return 1
    echo "$pid $veth"
}
# Fault KIND (loss P, partition, delay MS, slow MBPS MS, heal) on container $1's link.
s_shape() {
    local id="$1" kind="$2" ends pid veth
    ends=$(s_link_ends "$id") || return 1
    read -r pid veth <<<"$ends"
    local in=(nsenter -t "$pid" -n)
    case "$kind" in
    loss)
        local p
        p=$(awk -v p="$3" 'BEGIN { printf "%.2f", p / 100 }')
        "${in[@]}" iptables -A INPUT -i eth0 -m statistic --mode random --probability "$p" -j DROP &&
            "${in[@]}" iptables -A OUTPUT -o eth0 -m statistic --mode random --probability "$p" -j DROP ;;
    partition)
        "${in[@]}" iptables -A INPUT -i eth0 -j DROP && "${in[@]}" iptables -A OUTPUT -o eth0 -j DROP ;;
    delay)
        "${in[@]}" tc qdisc replace dev eth0 root netem delay "${3}ms" "$(($3 / 4))ms" &&
            tc qdisc replace dev "$veth" root netem delay "${3}ms" "$(($3 / 4))ms" ;;
    slow)
        "${in[@]}" tc qdisc replace dev eth0 root tbf rate "${3}mbit" burst 32kb latency "${4}ms" &&
            tc qdisc replace dev "$veth" root tbf rate "${3}mbit" burst 32kb latency "${4}ms" ;;
    heal)
        "${in[@]}" iptables -F INPUT 2>/dev/null
        "${in[@]}" iptables -F OUTPUT 2>/dev/null
        "${in[@]}" tc qdisc del dev eth0 root 2>/dev/null
        tc qdisc del dev "$veth" root 2>/dev/null
        return 0 ;;
    esac
}
HEALS=()   # every container a fault touched: healed as the run ends, whatever happened
declare -A UNTIL  # a container's fault lasts until then (s): one at a time on each
s_heal_all() {
    local id
    kill $(jobs -p) 2>/dev/null
    for id in "${HEALS[@]}"; do s_shape "$id" heal; done
    HEALS=()
}
# A network fault on container $1 (service $2) by the seeded schedule, healed after 10-60 s
# in the background. Sets FAULT to its kind (loss, delay, partition), or to nothing when the
# container could not be shaped (it was restarting).
s_fault() {
    local id="$1" role="$2" kind args secs what
    FAULT=""
    secs=$((10 + RANDOM % 51))
    if [ "${UNTIL[$id]:-0}" -gt "$(date +%s)" ]; then
        e2e_log "the $role ${id:0:12} is under a fault already: none added"
        return 0
    fi
    case $((RANDOM % 3)) in
    0) kind=loss args=("$((1 + RANDOM % 5))") what="${args[0]} % of packets lost" ;;
    1) local ms=$((50 + RANDOM % 151))
       if [ "$NETEM" = 1 ]; then
           kind=delay args=("$ms") what="${ms} ms of delay"
       else
           kind=slow args=("$((2 + RANDOM % 19))" "$ms") what="${args[0]} Mbit/s, a ${ms} ms queue"
       fi ;;
    *) kind=partition args=() what="cut off" ;;
    esac
    s_shape "$id" "$kind" "${args[@]}" || { e2e_log "cannot shape ${id:0:12} (restarting?)"; s_shape "$id" heal; return 0; }
    HEALS+=("$id")
    UNTIL[$id]=$(( $(date +%s) + secs + 1 ))
    e2e_log "network fault at iteration $(e2e_iterations): $kind ($what) on the $role ${id:0:12} for ${secs} s"
    (sleep "$secs"; s_shape "$id" heal && e2e_log "healed the $role ${id:0:12}") >/dev/null &
    FAULT="$kind"
}

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
        if [ "$NETWORK" = 1 ] && [ $((RANDOM % 3)) != 0 ]; then
            s_fault "$id" "$role"
            [ -n "$FAULT" ] && echo "$FAULT $role" >>"$E2E_TMP/faults-$name"
            continue
        fi
        e2e_log "chaos at iteration $(e2e_iterations): crashing the $role ${id:0:12}"
        (e2e_crash "$id") >/dev/null 2>&1 && kills=$((kills + 1)) # restarting: nothing to kill
        echo "$role" >>"$E2E_TMP/kills-$name"
        sleep 5
        compose up -d --scale worker="$WORKERS" >/dev/null 2>&1 # the operator
    done
    s_heal_all
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
e2e_log "chaos run: an event every ${EVERY}-$((EVERY * 3 / 2)) s$([ "$NETWORK" = 1 ] && echo ": a crash (1 in 3) or a network fault")"
read -r chaos_wall chaos_acc chaos_iters chaos_lost kills < <(run chaos chaos)
[ -n "${calm_acc:-}" ] && [ -n "${chaos_acc:-}" ] || e2e_fail "a run did not complete (logs above)"
ev="$E2E_TMP/keep-chaos/events.jsonl"
count() { local n; n=$(grep -c "\"event\":\"$1\"" "$ev" 2>/dev/null); echo "${n:-0}"; }
by_role=$(sort "$E2E_TMP/kills-chaos" 2>/dev/null | uniq -c | awk '{printf "%s%s %s", n++ ? ", " : "", $1, $2}')
faults=0 by_kind="none"
if [ -s "$E2E_TMP/faults-chaos" ]; then
    faults=$(wc -l <"$E2E_TMP/faults-chaos")
    by_kind=$(awk '{print $1 " of a " $2}' "$E2E_TMP/faults-chaos" | sort | uniq -c |
        awk '{c = $1; $1 = ""; printf "%s%s%s", n++ ? ", " : "", c, $0}')
fi
cat <<EOF
chaos run (bench/chaos.sh ${args[*]})
                    calm        chaos
iterations          $calm_iters     $chaos_iters
final test acc      $calm_acc   $chaos_acc
wall time (s)       $calm_wall         $chaos_wall      (time lost: $((chaos_wall - calm_wall)) s, $(awk -v a="$chaos_wall" -v b="$calm_wall" 'BEGIN{printf "%.2f", a / b}')x)
iterations lost     $calm_lost           $chaos_lost        (rollback and restart events)
crashes             0           $kills ($by_role)
network faults      0           $faults ($by_kind)
events: worker_lost $(count worker_lost), worker_joined $(count worker_joined), rollback $(count rollback), restart $(count restart), pause $(count pause)
EOF
# The goals (bench/README.md, chaos.sh): it completes (checked above), at most a checkpoint
# interval of iterations lost per event, and within 1 point of the calm run's accuracy.
events=$((kills + faults))
missed=0
if [ "$chaos_lost" -gt $((INTERVAL * (events > 0 ? events : 1))) ]; then
    echo "goal missed: $chaos_lost iterations lost, more than $INTERVAL per event ($events events)"
    missed=1
fi
if awk -v a="$calm_acc" -v b="$chaos_acc" 'BEGIN { exit !(a - b > 0.01) }'; then
    echo "goal missed: the chaos run ends more than 1 point below the calm run"
    missed=1
fi
[ "$missed" = 0 ] && echo "goals met: completed, at most $INTERVAL iterations lost per event, within 1 point of the calm run"
exit "$missed"
