#!/usr/bin/env bash
# The control plane's cost as the cluster grows: one `mqgrad local` run per worker count, on
# the simulated clock (each node charged its own CPU time, as on separate machines), the small
# model, a fixed number of servers. From the scheduler's and server 0's /metrics it reads
# process_cpu_seconds_total at two iterations of the steady state (after the start-up and the
# registrations) and reports each one's CPU per iteration, and per iteration and worker: flat
# in the last column is linear growth. It also reports the run's end (completed, accuracy)
# and the processes' resident memory.
#
#   bench/scale.sh [OUT_DIR]        # 16, 64 and 256 workers (~10 min on 2 cores)
#
# Environment (defaults): MQGRAD (build/tools/mqgrad), WORKERS ("16 64 256"), SERVERS (4),
# ITERS (100), FROM (20: the first sample; the second at 4/5 of ITERS), BATCH (32), SEED (1), DEADLINE (1800 s
# per run). The data set is Fashion-MNIST from Debian's package, unpacked once into OUT_DIR:
# plain files are mapped, so the workers of this machine share one copy of the images.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
MQGRAD="${MQGRAD:-$here/../build/tools/mqgrad}"
WORKERS="${WORKERS:-16 64 256}" SERVERS="${SERVERS:-4}" ITERS="${ITERS:-100}" FROM="${FROM:-20}"
BATCH="${BATCH:-32}" SEED="${SEED:-1}" DEADLINE="${DEADLINE:-1800}"
OUT="${1:-/tmp/mqgrad-scale}"
SRC=/usr/share/datasets/fashion-mnist
for v in $WORKERS "$SERVERS" "$ITERS" "$FROM" "$BATCH" "$SEED" "$DEADLINE"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt 0 ] || { echo "scale.sh: '$v' is not a positive integer" >&2; exit 2; }
done
TO=$((ITERS * 4 / 5)) # the last sample: before the run's end, while every process answers
[ "$FROM" -lt "$TO" ] || { echo "scale.sh: FROM ($FROM) must be below 4/5 of ITERS ($TO)" >&2; exit 2; }
[ -x "$MQGRAD" ] || { echo "scale.sh: $MQGRAD is not there (build first, or set MQGRAD)" >&2; exit 2; }
command -v curl >/dev/null || { echo "scale.sh: needs curl" >&2; exit 2; }
mkdir -p "$OUT/data" || exit 2
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [ -s "$OUT/data/$f" ] && continue
    [ -r "$SRC/$f.gz" ] || { echo "scale.sh: $SRC/$f.gz: not there (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
    gzip -dc "$SRC/$f.gz" >"$OUT/data/$f.tmp" && mv "$OUT/data/$f.tmp" "$OUT/data/$f" || exit 2
done

# The value of the series NAME (no labels) in the /metrics of 127.0.0.1:PORT, or "".
metric() {
    curl -s --max-time 2 "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2; exit}'
}
# The port of PROCESS in RUN/prometheus-targets.json.
port_of() {
    grep -o "127.0.0.1:[0-9]*\"\], \"labels\": {\"role\": \"[a-z]*\", \"process\": \"$2\"" \
        "$1/prometheus-targets.json" 2>/dev/null | head -1 | sed 's/127.0.0.1:\([0-9]*\).*/\1/'
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

printf '%s\n' "workers servers iters status acc sched_ms_it sched_us_it_w server_ms_it server_us_it_w sched_mb server_mb worker_mb wall_s" >"$OUT/scale.txt"
rc=0
for w in $WORKERS; do
    run="$OUT/run-$w"
    rm -rf "$run"
    hp=$(free_port)
    "$MQGRAD" local --run-dir "$run" --quiet --insecure --workers "$w" --servers "$SERVERS" \
        --model small --clock simulated --iterations "$ITERS" --batch "$BATCH" --seed "$SEED" \
        --eval-every 0 --final-eval-limit 2000 --threads 1 --data-dir "$OUT/data" \
        --heartbeat-timeout 60 --http-port "$hp" >"$OUT/run-$w.log" 2>&1 &
    pid=$!
    t0=$(date +%s.%N)
    a_it="" a_s="" a_v="" b_it="" b_s="" b_v="" sport="" mem=""
    end=$((SECONDS + DEADLINE))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do
        sleep 0.5
        it=$(metric "$hp" mqgrad_scheduler_iteration)
        [ -n "$it" ] || continue
        [ -n "$sport" ] || sport=$(port_of "$run" server-0)
        it=${it%.*}
        # each sample whole (both processes answered) or taken again at the next poll
        if [ -z "$a_it" ] && [ "$it" -ge "$FROM" ]; then
            a_s=$(metric "$hp" process_cpu_seconds_total)
            a_v=$(metric "$sport" process_cpu_seconds_total)
            [ -n "$a_s" ] && [ -n "$a_v" ] && a_it=$it
        elif [ -n "$a_it" ] && [ -z "$b_it" ] && [ "$it" -ge "$TO" ]; then
            b_s=$(metric "$hp" process_cpu_seconds_total)
            b_v=$(metric "$sport" process_cpu_seconds_total)
            wport=$(port_of "$run" worker-0)
            mem="$(metric "$hp" process_resident_memory_bytes) $(metric "$sport" process_resident_memory_bytes) $(metric "$wport" process_resident_memory_bytes)"
            [ -n "$b_s" ] && [ -n "$b_v" ] && [ "$(echo $mem | wc -w)" = 3 ] && b_it=$it
        fi
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "scale.sh: $w workers: still running after $DEADLINE s: stopped" >&2
        kill "$pid"; wait "$pid"; rc=1; continue
    fi
    wait "$pid"; code=$?
    wall=$(echo "$(date +%s.%N) - $t0" | bc)
    status=$(grep -o '"status": "[a-z]*"' "$run/summary.json" 2>/dev/null | cut -d'"' -f4)
    acc=$(grep -o '"final_test_acc": [0-9.]*' "$run/summary.json" 2>/dev/null | awk '{print $2}')
    if [ "$code" != 0 ] || [ "$status" != completed ] || [ -z "$b_it" ] || [ -z "$a_v" ] || [ -z "$b_v" ]; then
        echo "scale.sh: $w workers: exit $code, status '${status:-none}', samples '${a_it:-}' '${b_it:-}' (log: $OUT/run-$w.log)" >&2
        rc=1; continue
    fi
    awk -v w="$w" -v s="$SERVERS" -v n="$ITERS" -v st="$status" -v acc="$acc" -v ai="$a_it" -v bi="$b_it" \
        -v as="$a_s" -v bs="$b_s" -v av="$a_v" -v bv="$b_v" -v mem="$mem" -v wall="$wall" 'BEGIN {
        split(mem, m, " "); d = bi - ai
        printf "%d %d %d %s %.4f %.2f %.1f %.2f %.1f %.0f %.0f %.0f %.0f\n", w, s, n, st, acc,
            (bs - as) / d * 1e3, (bs - as) / d / w * 1e6, (bv - av) / d * 1e3, (bv - av) / d / w * 1e6,
            m[1] / 1048576, m[2] / 1048576, m[3] / 1048576, wall }' >>"$OUT/scale.txt"
done
echo
echo "CPU per iteration between the samples at iteration $FROM and $TO (or the first poll after each); memory at the second ($OUT/scale.txt):"
echo
echo "| workers | status, accuracy | scheduler ms/it | scheduler µs/it/worker | server 0 ms/it | server 0 µs/it/worker | RSS MB: scheduler, server, worker | wall s |"
echo "|---|---|---|---|---|---|---|---|"
awk 'NR > 1 {printf "| %d | %s, %.3f | %.2f | %.1f | %.2f | %.1f | %d, %d, %d | %d |\n", $1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13}' "$OUT/scale.txt"
exit $rc
