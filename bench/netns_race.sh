#!/bin/bash
# mqgrad against PyTorch DDP over real, kernel-shaped links: one network namespace per node,
# every node's NIC shaped by tc to X Mbit/s in both directions, the same model, data, batch and
# learning rate; per rate, the median iteration time, the training time to a target test
# accuracy, the ratios mqgrad : DDP, and each configuration's floors.
#
# usage: bench/netns_race.sh [OUT_DIR]             (needs root; prints SKIP and exits 0 if not)
#        bench/netns_race.sh --summarize OUT_DIR   the tables again from runs already made
# environment (defaults):
#   WORKERS (4)                  mqgrad: N workers; DDP: N ranks in the N worker namespaces
#   LAYOUT (colocated)           colocated: one server in each worker's namespace (S = N, the
#                                layout `mqgrad local` defaults to: docs/operations.md,
#                                "Topology");
#                                dedicated: SERVERS servers in namespaces of their own
#   SERVERS (2)                  the server count of the dedicated layout
#   RATES ("1000 100")           Mbit/s of every NIC, each direction; "none" = unshaped veths
#                                (memory speed: the comm floor is 0)
#   BITS ("32 2")                mqgrad runs: 32 = fp32 (--codec none, no agent); K < 32 = the
#                                fixed:K policy with the default codec, --bucket 512
#   DDP ("fp32 fp16")            DDP runs: fp32 all-reduce; fp16 = fp16_compress_hook
#   ITERS (200)                  iterations at most per run
#   CAP (240)                    seconds of training at most per run (mqgrad --time-budget; DDP
#                                checks it at its evaluations)
#   TARGET (0.70)                test accuracy whose time is reported
#   EVAL_EVERY (10), EVAL_LIMIT (1000)   evaluation cadence and test images (the first ones)
#   STOP_AT_TARGET (40)          end a run at the first evaluation >= TARGET once this many
#                                iterations are done (0 = run ITERS/CAP out)
#   WARMUP (3)                   iterations left out of the medians
#   SECURE (0)                   1 = CURVE keys as `mqgrad local` makes them; 0 = --insecure
#                                (gloo is unencrypted too, so the race compares transports)
#   MQGRAD_WORKER (c)            c: mqgrad-worker; torch: each mqgrad worker is
#                                examples/torch/paper_cnn.py on libmqgrad (PyTorch computes the
#                                gradient), given what the C worker is given, as the MQGRAD_*
#                                variables libmqgrad reads (MQGRAD_SCHEDULER, MQGRAD_INSECURE or
#                                MQGRAD_KEYS, MQGRAD_THREADS, MQGRAD_DATA_DIR)
#   DDP_MODEL (torch_cnn; paper_cnn when MQGRAD_WORKER=torch)   ddp_race.py --model: DDP's
#                                network, bench/torch_cnn.py's or examples/torch/paper_cnn.py's
#                                (then both sides run the same PyTorch code)
#   BUILD (build)                the build directory; PYTHON (/usr/bin/python3, has torch)
#   DATA (/usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist)
#
# Topology: namespaces <p>-ctl (scheduler + agent, 10.214.0.2), <p>-s<i> (dedicated servers,
# 10.214.0.20+i), <p>-w<i> (workers, DDP rank i, and in the colocated layout server i,
# 10.214.0.40+i), each with one veth "eth0"
# whose peer sits in <p>-br on the Linux bridge br0. Each veth gets a tbf qdisc on BOTH ends:
# the node's end shapes what the node sends, the bridge's end what it receives, so each node
# has a full-duplex NIC of X Mbit/s, and the bridge itself is not a bottleneck (as a switch).
# tbf: rate X mbit; burst = 2 ms of traffic at X, at least 64 KiB (one GSO super-packet, so
# tbf rarely has to segment one; at 1000 Mbit 250 KB, i.e. a 2 ms line-rate burst: negligible
# against iterations of 100s of ms, and large enough that timer slack on a loaded 2-core
# machine does not lose rate); latency 100 ms = the queue (X x 100 ms of bytes, a switch
# port's buffer order) after which packets drop and TCP backs off. tbf counts whole frames
# (a 1448-byte TCP segment is a 1514-byte frame), so TCP goodput is ~95.6 % of X, for both.
#
# mqgrad: the services run directly (not `mqgrad local`, which is loopback-only) over real
# TCP, no link emulation (no --link-mbps), --model paper, OPENBLAS_NUM_THREADS=1 and
# --threads 1, batch 32 per worker, lr 0.01 (the defaults), checkpoints off. The median
# iteration time is the step of metrics.csv's train_time_s (evaluation excluded), the time
# to target the train_time_s of the first evaluated row with test_acc >= TARGET.
# DDP: bench/ddp_race.py (gloo, MASTER_ADDR = rank 0's address), same model/batch/lr/l2,
# torch.set_num_threads(1), the same Debian idx files, same evaluation cadence and images.
#
# Floors, per configuration:
#   compute: mqgrad = median compute_ms of the run's own metrics.csv (the workers' forward +
#     backward, under the run's CPU contention); DDP = median forward + backward under
#     ddp.no_sync() timed on all ranks at once before training (ddp_race.py).
#   comm = the busiest NIC's bytes per iteration / its rate (payload bytes, frames not
#     counted). mqgrad (bytes from metrics.csv: the run's real payload, fp32 or quantized):
#     dedicated: a server receives N pushes of its shard, then (after the barrier) sends N
#     replies: its NIC carries N x shard in, then N x shard out, one after the other ->
#     (in + out) / rate; a worker carries the whole model out then in -> 2 x model / rate; the
#     max of the two. colocated: in the push phase a host sends (N-1)/N of its worker's push
#     and receives as much for its server (at once, full duplex), in the reply phase the same
#     with the aggregates (its own shard stays on the host, over loopback) ->
#     (up + down) x (N-1) / N^2 / rate, with up and down summed over the workers.
#     DDP ring all-reduce: each node sends and receives 2 (N-1)/N x the gradient bytes at
#     once (full duplex) -> 2 (N-1)/N x bytes / rate (fp16: half the bytes).
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
WORKERS=${WORKERS:-4}
LAYOUT=${LAYOUT:-colocated}
SERVERS=${SERVERS:-2}
case $LAYOUT in
    colocated) SERVERS=$WORKERS ;;
    dedicated) ;;
    *) echo "netns_race.sh: LAYOUT '$LAYOUT' is not colocated or dedicated" >&2; exit 2 ;;
esac
RATES=${RATES:-"1000 100"}
BITS=${BITS-"32 2"}
DDP=${DDP-"fp32 fp16"}
ITERS=${ITERS:-200}
CAP=${CAP:-240}
TARGET=${TARGET:-0.70}
EVAL_EVERY=${EVAL_EVERY:-10}
EVAL_LIMIT=${EVAL_LIMIT:-1000}
STOP_AT_TARGET=${STOP_AT_TARGET:-40}
WARMUP=${WARMUP:-3}
SECURE=${SECURE:-0}
BUILD=${BUILD:-$here/build}
case $BUILD in /*) ;; *) BUILD=$here/$BUILD ;; esac
PYTHON=${PYTHON:-/usr/bin/python3}
MQGRAD_WORKER=${MQGRAD_WORKER:-c}
case $MQGRAD_WORKER in
    c) DDP_MODEL=${DDP_MODEL:-torch_cnn} ;;
    torch) DDP_MODEL=${DDP_MODEL:-paper_cnn} ;;
    *) echo "netns_race.sh: MQGRAD_WORKER '$MQGRAD_WORKER' is not c or torch" >&2; exit 2 ;;
esac
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
P=mqr$$
NET=10.214.0
CTL_IP=$NET.2
SCHED_PORT=7000
DDP_PORT=29500

# ---------------------------------------------------------------------------------------------
# Reading a finished run.

# One mqgrad run's metrics.csv -> "n iters median_iter_ms median_compute_ms bytes_up bytes_down
# target_iter target_s last_acc" (target_* "none" when not reached).
mq_stats() {
    awk -F, -v warm="$WARMUP" -v target="$TARGET" '
    function med(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
        return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
    }
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
        t = $col["train_time_s"]; last = $col["iter"] + 1
        if ($col["iter"] >= warm && have) {
            n++; it[n] = (t - prev) * 1000; cp[n] = $col["compute_ms"]
            up[n] = $col["bytes_up"]; dn[n] = $col["bytes_down"]
        }
        prev = t; have = 1
        a = $col["test_acc"]
        if (a != "") { acc = a; if (hit == "" && a + 0 >= target + 0) { hit = $col["iter"] + 1; hit_s = t } }
    }
    END {
        if (n == 0) { print "0"; exit }
        printf "%d %d %.1f %.1f %.0f %.0f %s %s %s\n", n, last, med(it, n), med(cp, n), med(up, n),
               med(dn, n), hit == "" ? "none" : hit, hit == "" ? "none" : sprintf("%.1f", hit_s),
               acc == "" ? "-" : sprintf("%.3f", acc)
    }' "$1"
}

# One DDP result file -> the same fields ("n iters median floor bytes . target_iter target_s
# last_acc"), bytes = the gradient bytes one all-reduce carries.
ddp_stats() {
    awk '{ v[$1] = $2 } END {
        if (!("median_ms" in v)) { print "0"; exit }
        ts = v["target_s"]; if (ts != "none") ts = sprintf("%.1f", ts)
        printf "%d %d %s %s %s 0 %s %s %s\n", v["iters"], v["iters"], v["median_ms"], v["floor_ms"],
               v["grad_bytes"], v["target_iter"], ts, sprintf("%.3f", v["last_acc"]) }' "$1"
}

# The iteration at which a configuration first reached TARGET at any rate (the arithmetic does
# not depend on the rate), or "none": what the projection of a run that ran out of time uses.
reach_iter() { # reach_iter mq|ddp BITS|HOOK
    local r f
    for r in $RATES; do
        if [ "$1" = mq ]; then f=$out/mq-$2-$r/metrics.csv; else f=$out/ddp-$2-$r.txt; fi
        [ -s "$f" ] || continue
        # shellcheck disable=SC2046
        set -- "$1" "$2" $(if [ "$1" = mq ]; then mq_stats "$f"; else ddp_stats "$f"; fi)
        [ $# -ge 9 ] && [ "$9" != none ] && { echo "$9"; return; }
        set -- "$1" "$2"
    done
    echo none
}

label_mq() {
    local w=""
    [ "${MQGRAD_WORKER:-c}" = torch ] && w=" (PyTorch workers)"
    [ "$1" = 32 ] && echo "mqgrad fp32$w" || echo "mqgrad $1-bit$w"
}
label_ddp() { echo "DDP $1"; }

summarize() {
    out=$1
    echo "race: $WORKERS workers, $SERVERS servers (mqgrad, ${LAYOUT:-dedicated} layout), target test accuracy $TARGET on the first $EVAL_LIMIT test images,"
    echo "evaluated every $EVAL_EVERY iterations; medians after $WARMUP warm-up iterations; times are training"
    echo "time (evaluation excluded). comm floor: busiest NIC's payload bytes / rate (see the header)."
    [ -f "$out/transport" ] && echo "mqgrad transport: $(cat "$out/transport")"
    echo "mqgrad workers: ${MQGRAD_WORKER:-c} ($([ "${MQGRAD_WORKER:-c}" = torch ] && echo "examples/torch/paper_cnn.py on libmqgrad" || echo mqgrad-worker)); DDP's model: ${DDP_MODEL:-torch_cnn}"
    for r in $RATES; do
        echo
        if [ "$r" = none ]; then echo "## unshaped (veths at memory speed)"; else echo "## $r Mbit/s per NIC"; fi
        [ -f "$out/linkcheck-$r" ] && echo "(link check: $(cat "$out/linkcheck-$r"))"
        echo
        echo "| configuration | iters | median iter ms | time to $TARGET | acc at end | compute floor ms | comm floor ms | iter / (compute + comm) | vs DDP fp32: iter, to target | vs DDP fp16: iter, to target |"
        echo "|---|---|---|---|---|---|---|---|---|---|"
        # DDP first: the ratios need them.
        d32_it="" d32_t="" d16_it="" d16_t=""
        rows=""
        for d in $DDP; do
            f=$out/ddp-$d-$r.txt
            if [ ! -s "$f" ]; then rows="$rows| $(label_ddp "$d") | did not run (see $out/ddp-$d-$r.log) |\n"; continue; fi
            # shellcheck disable=SC2046
            set -- $(ddp_stats "$f")
            [ "$1" = 0 ] && { rows="$rows| $(label_ddp "$d") | no result |\n"; continue; }
            [ "$d" = fp32 ] && { d32_it=$3; d32_t=$8; }
            [ "$d" = fp16 ] && { d16_it=$3; d16_t=$8; }
            comm=$(awk -v b="$5" -v n="$WORKERS" -v r="$r" 'BEGIN { printf "%.0f", r == "none" ? 0 : 2 * (n - 1) / n * b * 8 / (r * 1e6) * 1000 }')
            rows="$rows$(awk -v l="$(label_ddp "$d")" -v n="$2" -v it="$3" -v fl="$4" -v ti="$7" -v ts="$8" \
                -v acc="$9" -v c="$comm" -v pi="$(reach_iter ddp "$d")" 'BEGIN {
                tt = ts == "none" ? "not reached" : sprintf("%s s (it %s)", ts, ti)
                if (ts == "none" && pi != "none") tt = sprintf("not reached (~%.0f s projected: it %s)", pi * it / 1000, pi)
                printf "| %s | %d | %.0f | %s | %s | %.0f | %s | %.2f | - | - |", l, n, it, tt, acc, fl, c, it / (fl + c) }')\n"
        done
        for b in $BITS; do
            csv=$out/mq-$b-$r/metrics.csv
            if [ ! -s "$csv" ]; then printf '| %s | did not run (see %s) |\n' "$(label_mq "$b")" "$out/mq-$b-$r.log"; continue; fi
            # shellcheck disable=SC2046
            set -- $(mq_stats "$csv")
            [ "$1" = 0 ] && { printf '| %s | no iterations after warm-up |\n' "$(label_mq "$b")"; continue; }
            awk -v l="$(label_mq "$b")" -v n="$2" -v it="$3" -v cp="$4" -v up="$5" -v dn="$6" -v ti="$7" \
                -v ts="$8" -v acc="$9" -v w="$WORKERS" -v s="$SERVERS" -v r="$r" -v pi="$(reach_iter mq "$b")" \
                -v lay="${LAYOUT:-dedicated}" \
                -v d32i="$d32_it" -v d32t="$d32_t" -v d16i="$d16_it" -v d16t="$d16_t" 'BEGIN {
                srv = (up + dn) / s; wrk = (up + dn) / w
                if (lay == "colocated") srv = wrk = (up + dn) * (w - 1) / (w * w)
                c = r == "none" ? 0 : (srv > wrk ? srv : wrk) * 8 / (r * 1e6) * 1000
                tt = ts == "none" ? "not reached" : sprintf("%s s (it %s)", ts, ti)
                if (ts == "none" && pi != "none") tt = sprintf("not reached (~%.0f s projected: it %s)", pi * it / 1000, pi)
                r32i = d32i == "" ? "-" : sprintf("%.2fx", d32i / it)
                r16i = d16i == "" ? "-" : sprintf("%.2fx", d16i / it)
                r32t = (d32t == "" || d32t == "none" || ts == "none") ? "-" : sprintf("%.2fx", d32t / ts)
                r16t = (d16t == "" || d16t == "none" || ts == "none") ? "-" : sprintf("%.2fx", d16t / ts)
                printf "| %s | %d | %.0f | %s | %s | %.0f | %.0f | %.2f | %s, %s | %s, %s |\n", l, n, it, tt,
                       acc, cp, c, it / (cp + c), r32i, r32t, r16i, r16t }'
        done
        printf "%b" "$rows"
    done
    echo
    echo "ratios = DDP time / mqgrad time (>1: mqgrad faster); '-' where a side did not reach the target."
    echo "projected (runs that ran out of ITERS/CAP): the iteration at which the same configuration reached"
    echo "the target at another rate x this run's median iteration time; not used in the ratios."
}

if [ "${1:-}" = --summarize ]; then
    [ $# -eq 2 ] || { echo "usage: $0 --summarize OUT_DIR" >&2; exit 2; }
    [ -f "$2/env" ] && . "$2/env"
    summarize "$2"
    exit 0
fi

# ---------------------------------------------------------------------------------------------
# The network.

skip() { echo "SKIP: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "netns_race.sh needs root (network namespaces, tc)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip or tc not found (apt-get install iproute2)"
for s in scheduler server worker agent; do
    [ -x "$BUILD/services/mqgrad-$s" ] ||
        { echo "netns_race.sh: $BUILD/services/mqgrad-$s is not executable (build first, or set BUILD)" >&2; exit 2; }
done
if [ "$MQGRAD_WORKER" = torch ]; then
    [ -f "$BUILD/common/libmqgrad.so" ] ||
        { echo "netns_race.sh: no $BUILD/common/libmqgrad.so (cmake --build $BUILD --target mqgrad_shared)" >&2; exit 2; }
    "$PYTHON" -c 'import torch, numpy' 2>/dev/null ||
        { echo "netns_race.sh: MQGRAD_WORKER=torch needs torch and numpy in $PYTHON" >&2; exit 2; }
fi
[ -f "$DATA/train-images-idx3-ubyte.gz" ] ||
    { echo "netns_race.sh: no Fashion-MNIST in $DATA (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
have_torch=1
"$PYTHON" -c 'import torch, torch.distributed' 2>/dev/null || have_torch=0

NODES="ctl"
# server i's namespace: its own (dedicated) or worker i's (colocated)
server_node() { [ "$LAYOUT" = colocated ] && echo "w$1" || echo "s$1"; }
[ "$LAYOUT" = dedicated ] && for i in $(seq 0 $((SERVERS - 1))); do NODES="$NODES s$i"; done
for i in $(seq 0 $((WORKERS - 1))); do NODES="$NODES w$i"; done
node_ip() {
    case $1 in
        ctl) echo "$CTL_IP" ;;
        s*) echo "$NET.$((20 + ${1#s}))" ;;
        w*) echo "$NET.$((40 + ${1#w}))" ;;
    esac
}

PIDS=""
stop_pids() { # TERM, then KILL after 5 s, the processes this script started and still runs
    local p alive
    [ -n "$PIDS" ] || return 0
    # shellcheck disable=SC2086
    kill -TERM $PIDS 2>/dev/null
    for _ in $(seq 50); do
        alive=""
        for p in $PIDS; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
        [ -z "$alive" ] && break
        sleep 0.1
    done
    # shellcheck disable=SC2086
    [ -n "$alive" ] && kill -KILL $alive 2>/dev/null
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    PIDS=""
}
cleanup() {
    trap - EXIT INT TERM
    stop_pids
    for n in $NODES br; do
        ip netns list 2>/dev/null | grep -q "^$P-$n\b" || continue
        # Anything still inside one of our namespaces was started by us.
        for p in $(ip netns pids "$P-$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$P-$n" 2>/dev/null
    done
}
trap cleanup EXIT
trap 'echo "netns_race.sh: interrupted" >&2; exit 130' INT TERM

ip netns add "$P-br" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN?)"
ip -n "$P-br" link add br0 type bridge && ip -n "$P-br" link set br0 up &&
    ip -n "$P-br" link set lo up || skip "cannot make a bridge"
for n in $NODES; do
    ip netns add "$P-$n" || skip "ip netns add failed"
    # The host-side name is unique in the root namespace only while it passes through it.
    ip link add "$P$n" type veth peer name "b$P$n" || skip "cannot make a veth pair"
    ip link set "$P$n" netns "$P-$n" && ip link set "b$P$n" netns "$P-br" &&
        ip -n "$P-$n" link set "$P$n" name eth0 &&
        ip -n "$P-$n" addr add "$(node_ip "$n")/24" dev eth0 &&
        ip -n "$P-$n" link set eth0 up && ip -n "$P-$n" link set lo up &&
        ip -n "$P-br" link set "b$P$n" master br0 && ip -n "$P-br" link set "b$P$n" up ||
        skip "cannot set up the veth of $n"
done

# shape RATE: tbf on both ends of every veth (see the header for burst and latency).
shape() {
    if [ "$1" = none ]; then # unshaped: veths at memory speed, the loopback race
        for n in $NODES; do
            ip netns exec "$P-$n" tc qdisc del dev eth0 root 2>/dev/null
            ip netns exec "$P-br" tc qdisc del dev "b$P$n" root 2>/dev/null
        done
        return 0
    fi
    burst=$(awk -v r="$1" 'BEGIN { b = r * 1e6 / 8 * 0.002; printf "%d", b < 65536 ? 65536 : b }')
    for n in $NODES; do
        ip netns exec "$P-$n" tc qdisc replace dev eth0 root tbf rate "${1}mbit" burst "$burst" latency 100ms &&
            ip netns exec "$P-br" tc qdisc replace dev "b$P$n" root tbf rate "${1}mbit" burst "$burst" latency 100ms ||
            { echo "netns_race.sh: tc qdisc tbf failed" >&2; exit 2; }
    done
}

# A 1 s transfer worker 0 -> server 0 (bench_link, 1 MB messages) through the shaped path.
linkcheck() {
    bl=$BUILD/bench/bench_link
    [ -x "$bl" ] || { echo "no bench_link"; return; }
    n=$(awk -v r="$1" 'BEGIN { n = int(r * 1e6 / 8 / 1048576 * 1.5); print n < 4 ? 4 : n }')
    local to=s0
    [ "$LAYOUT" = colocated ] && to=w1 # server 0 shares w0's namespace: measure w0 -> w1
    ip netns exec "$P-$to" "$bl" --recv "tcp://$(node_ip $to):5600" --mbps 0 >"$out/linkcheck-$1.raw" 2>&1 &
    rx=$!
    ip netns exec "$P-w0" "$bl" --send "tcp://$(node_ip $to):5600" --mbps 0 --size 1048576 --messages "$n" \
        >/dev/null 2>&1 || kill "$rx" 2>/dev/null
    wait "$rx"
    echo "w0 -> $to $(sed -n 's/.*achieved=//p' "$out/linkcheck-$1.raw") Mbit/s of payload through tbf at $1"
}

# ---------------------------------------------------------------------------------------------
# The runs.

# spawn NODE LOG CMD...: starts CMD in NODE's namespace in the background; remembers its pid.
spawn() {
    local ns=$P-$1 log=$2
    shift 2
    ip netns exec "$ns" env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$@" >"$log" 2>&1 &
    PIDS="$PIDS $!"
    LAST=$!
}

# The last evaluated test accuracy >= TARGET after >= STOP_AT_TARGET iterations?
reached() {
    [ "$STOP_AT_TARGET" -gt 0 ] && [ -s "$1" ] || return 1
    awk -F, -v target="$TARGET" -v min="$STOP_AT_TARGET" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $col["test_acc"] != "" && $col["test_acc"] + 0 >= target + 0 && $col["iter"] + 1 >= min { hit = 1 }
        END { exit hit ? 0 : 1 }' "$1"
}

run_mq() { # run_mq BITS RATE
    local b=$1 r=$2 dir=$out/mq-$1-$2 log=$out/mq-$1-$2.log sched p i ip alive
    rm -rf "$dir"
    mkdir -p "$dir/logs"
    sec=(--insecure)
    if [ "$SECURE" = 1 ]; then
        sec=()
        "$BUILD/tools/mqgrad" keygen "$dir/keys" >/dev/null || { echo "keygen failed" >&2; return 1; }
        export MQGRAD_KEYS=$dir/keys
    fi
    agent=()
    if [ "$b" = 32 ]; then
        codec=(--bits 2 --codec none)
    else
        spawn ctl "$dir/logs/agent.log" "$BUILD/services/mqgrad-agent" --bind tcp://127.0.0.1:7200 \
            --http-port 0 --policy "fixed:$b" --state "$dir/agent.state" "${sec[@]}"
        codec=(--bits "$b" --bucket 512)
        agent=(--agent tcp://127.0.0.1:7200)
    fi
    spawn ctl "$log" "$BUILD/services/mqgrad-scheduler" --bind "tcp://$CTL_IP:$SCHED_PORT" \
        --workers "$WORKERS" --servers "$SERVERS" --run-dir "$dir" --model paper "${codec[@]}" "${agent[@]}" \
        --iterations "$ITERS" --time-budget "$CAP" --eval-every "$EVAL_EVERY" --eval-limit "$EVAL_LIMIT" \
        --final-eval-limit "$EVAL_LIMIT" --checkpoint-every 0 --progress-every 30 "${sec[@]}"
    sched=$LAST
    for i in $(seq 0 $((SERVERS - 1))); do
        ip=$(node_ip "$(server_node "$i")")
        spawn "$(server_node "$i")" "$dir/logs/server-$i.log" "$BUILD/services/mqgrad-server" \
            --scheduler "tcp://$CTL_IP:$SCHED_PORT" --bind "tcp://$ip:7100" --advertise "tcp://$ip:7100" "${sec[@]}"
    done
    for i in $(seq 0 $((WORKERS - 1))); do
        if [ "$MQGRAD_WORKER" = torch ]; then
            # the C worker's flags as the variables libmqgrad (and the example) read; the keys
            # (SECURE=1) are in MQGRAD_KEYS already
            spawn "w$i" "$dir/logs/worker-$i.log" env MQGRAD_SCHEDULER="tcp://$CTL_IP:$SCHED_PORT" \
                MQGRAD_DATA_DIR="$DATA" MQGRAD_THREADS=1 $([ "$SECURE" = 1 ] || echo MQGRAD_INSECURE=1) \
                PYTHONPATH="$here/python" MQGRAD_LIB="$BUILD/common/libmqgrad.so" \
                "$PYTHON" "$here/examples/torch/paper_cnn.py"
        else
            spawn "w$i" "$dir/logs/worker-$i.log" "$BUILD/services/mqgrad-worker" \
                --scheduler "tcp://$CTL_IP:$SCHED_PORT" --data-dir "$DATA" --threads 1 "${sec[@]}"
        fi
    done
    rc=""
    while kill -0 "$sched" 2>/dev/null; do
        if reached "$dir/metrics.csv"; then
            echo "    target reached: stopping the run" >&2
            break
        fi
        sleep 2
    done
    unset MQGRAD_KEYS
    # The scheduler stops the nodes when it ends; a stopped-at-target run is ended by us.
    for _ in $(seq 100); do
        alive=0
        for p in $PIDS; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        kill -0 "$sched" 2>/dev/null && break
        sleep 0.1
    done
    stop_pids
    tail -n 4 "$log" | sed 's/^/    /'
}

run_ddp() { # run_ddp fp32|fp16 RATE
    local d=$1 r=$2 res=$out/ddp-$1-$2.txt log=$out/ddp-$1-$2.log hook i l p left still failed
    rm -f "$res"
    hook=none
    [ "$d" = fp16 ] && hook=fp16
    for i in $(seq 0 $((WORKERS - 1))); do
        l=$log
        [ "$i" != 0 ] && l=$out/ddp-$d-$r.rank$i.log
        spawn "w$i" "$l" env GLOO_SOCKET_IFNAME=eth0 "$PYTHON" "$here/bench/ddp_race.py" --rank "$i" --world "$WORKERS" \
            --master-addr "$(node_ip w0)" --master-port "$DDP_PORT" --hook "$hook" --iters "$ITERS" \
            --time-budget "$CAP" --eval-every "$EVAL_EVERY" --eval-limit "$EVAL_LIMIT" --target "$TARGET" \
            --stop-at-target "$STOP_AT_TARGET" --warmup "$WARMUP" --data-dir "$DATA" --model "$DDP_MODEL" \
            --out "$res"
    done
    DDP_PORT=$((DDP_PORT + 1))
    # A rank that fails leaves the others blocked in gloo: then stop them all.
    left=$PIDS failed=0
    while [ -n "$left" ] && [ $failed = 0 ]; do
        sleep 1
        still=""
        for p in $left; do
            if kill -0 "$p" 2>/dev/null; then still="$still $p"; else wait "$p" || failed=1; fi
        done
        left=$still
    done
    [ $failed = 1 ] && echo "    a DDP rank failed (see $out/ddp-$d-$r*.log); stopping the others" >&2
    stop_pids
    tail -n 2 "$log" | sed 's/^/    /'
}

timed() { # timed LABEL CMD...: runs CMD between two progress lines, the second with its time
    local label=$1 start
    shift
    start=$(date +%s)
    echo "  $label ..."
    "$@"
    echo "  $label: $(($(date +%s) - start)) s"
}

out=${1:-/tmp/mqgrad-race-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
cat >"$out/env" <<EOF
WORKERS="$WORKERS"; SERVERS="$SERVERS"; LAYOUT="$LAYOUT"; RATES="$RATES"; BITS="$BITS"; DDP="$DDP"
TARGET="$TARGET"; EVAL_EVERY="$EVAL_EVERY"; EVAL_LIMIT="$EVAL_LIMIT"; WARMUP="$WARMUP"
MQGRAD_WORKER="$MQGRAD_WORKER"; DDP_MODEL="$DDP_MODEL"
EOF
if [ "$SECURE" = 1 ]; then
    echo "CURVE (throw-away keys per run, as mqgrad local)" >"$out/transport"
else
    echo "--insecure (plain TCP, like gloo)" >"$out/transport"
fi
[ "$have_torch" = 1 ] || { echo "netns_race.sh: $PYTHON has no torch (apt-get install python3-torch): DDP runs skipped" >&2; DDP=""; }
echo "netns_race.sh: runs in $out; $WORKERS workers, $SERVERS servers ($LAYOUT), rates $RATES Mbit/s, mqgrad bits $BITS, DDP $DDP"
echo "  mqgrad workers: $MQGRAD_WORKER; DDP's model: $DDP_MODEL"
echo "  ITERS=$ITERS CAP=$CAP s TARGET=$TARGET EVAL_EVERY=$EVAL_EVERY EVAL_LIMIT=$EVAL_LIMIT STOP_AT_TARGET=$STOP_AT_TARGET; mqgrad transport: $(cat "$out/transport")"
echo "  start $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $RATES; do
    shape "$r"
    linkcheck "$r" >"$out/linkcheck-$r"
    echo "$r Mbit/s: $(cat "$out/linkcheck-$r")"
    for b in $BITS; do timed "$(label_mq "$b") at $r Mbit/s" run_mq "$b" "$r"; done
    for d in $DDP; do timed "$(label_ddp "$d") at $r Mbit/s" run_ddp "$d" "$r"; done
done
echo "  end $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
summarize "$out"
