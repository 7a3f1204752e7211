#!/usr/bin/env bash
# `mqgrad top` as a user sees it: real processes in a real terminal (a detached tmux session
# of 120x40), the metrics first from a stand-in scheduler (fake_metrics.py serving a file the
# test rewrites between polls), then from a real `mqgrad local` run.
#
#   tests/tmux/test_top.sh BUILD_DIR      (or MQGRAD_BUILD_DIR; needs tmux and python3)
#
# Checks: bad flags exit 2; --once answers 0 with the line for logs over each of the three
# ways an HTTP body ends (Content-Length, close, chunked), 1 with the reason when nothing
# listens, 1 on a refused or missing bearer token and 0 with it (variable or file); the
# line mode prints one line per poll and shows the iteration advancing and a rate; the full
# view shows iteration, rate, loss, accuracy, a worker's row and the drops, follows the
# metrics as they change, lays itself out again when the window shrinks, and leaves with
# exit 0 and the terminal as it was (no alternate screen, same stty modes, cursor shown) on
# q, on Ctrl-C and on SIGTERM; an unreachable scheduler shows its status line and is picked
# up once it answers; a real run's iteration rises on the screen. Every wait is bounded.
# Exit 0 all passed, 1 a check failed, 77 skipped (no tmux or python3).
set -uo pipefail

build="${1:-${MQGRAD_BUILD_DIR:-}}"
if [[ -z "$build" ]]; then
    echo "usage: $0 BUILD_DIR (or MQGRAD_BUILD_DIR)" >&2
    exit 2
fi
build="$(cd "$build" && pwd)" || exit 2
mqgrad="$build/tools/mqgrad"
here="$(cd "$(dirname "$0")" && pwd)"
py=/usr/bin/python3
[[ -x "$mqgrad" ]] || { echo "test_top: no $mqgrad (build the mqgrad target)" >&2; exit 2; }
command -v tmux >/dev/null || { echo "test_top: SKIP: tmux is not installed" >&2; exit 77; }
[[ -x "$py" ]] || { echo "test_top: SKIP: no $py" >&2; exit 77; }

# The view's Unicode and the test's patterns need one UTF-8 locale, whatever the caller's.
export LANG=C.UTF-8
unset LC_ALL LC_CTYPE NO_COLOR MQGRAD_TOP_SCHEDULER MQGRAD_HTTP_TOKEN MQGRAD_HTTP_TOKEN_FILE

tmp="$(mktemp -d /tmp/mq_test_top_XXXXXX)"
pids=()
# A tmux server of our own (its own socket and an empty config): the user's are untouched.
printf 'set -g remain-on-exit on\nset -g default-shell /bin/sh\nset -g history-limit 100\n' \
    >"$tmp/tmux.conf"
tm() { tmux -S "$tmp/tmux.sock" -f "$tmp/tmux.conf" "$@"; }

cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null
    done
    tm kill-server 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
ok() {
    passed=$((passed + 1))
    echo "ok   $*"
}
fail() {
    echo "FAIL $*" >&2
    if [[ -n "${cur:-}" ]] && tm has-session -t "$cur" 2>/dev/null; then
        echo "---- pane $cur ----" >&2
        tm capture-pane -p -t "$cur" >&2
        echo "-------------------" >&2
    fi
    exit 1
}

# until SECONDS CMD...: runs CMD every 0.1 s until it succeeds; 1 when the time is up.
until_ok() {
    local end=$((SECONDS + $1))
    shift
    while ! "$@"; do
        ((SECONDS < end)) || return 1
        sleep 0.1
    done
}

free_port() {
    "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# fixture FILE ITER LOSS ACC BITS: a scheduler's exposition as the interface spec names it,
# written whole and renamed so a poll never sees half of it. Two workers (rank 1 straggled
# once), drops of two reasons, a checkpoint 12 s ago.
fixture() {
    local f=$1 it=$2 loss=$3 acc=$4 bits=$5 now
    now=$(date +%s)
    cat >"$f.tmp" <<EOF
# HELP mqgrad_build_info Which mqgrad this is.
# TYPE mqgrad_build_info gauge
mqgrad_build_info{role="scheduler",version="0.1.0"} 1
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds $((now - 192))
# TYPE mqgrad_scheduler_iteration gauge
mqgrad_scheduler_iteration $it
# TYPE mqgrad_scheduler_iterations_planned gauge
mqgrad_scheduler_iterations_planned 1000
# TYPE mqgrad_scheduler_iterations_total counter
mqgrad_scheduler_iterations_total $it
# TYPE mqgrad_scheduler_loss gauge
mqgrad_scheduler_loss $loss
# TYPE mqgrad_scheduler_test_accuracy_ratio gauge
mqgrad_scheduler_test_accuracy_ratio $acc
# TYPE mqgrad_scheduler_test_loss gauge
mqgrad_scheduler_test_loss 0.4412
# TYPE mqgrad_scheduler_bits gauge
mqgrad_scheduler_bits $bits
# TYPE mqgrad_scheduler_pushed_bytes_total counter
mqgrad_scheduler_pushed_bytes_total $((it * 32450000))
# TYPE mqgrad_scheduler_pulled_bytes_total counter
mqgrad_scheduler_pulled_bytes_total $((it * 31000000))
# TYPE mqgrad_scheduler_iteration_pushed_bytes gauge
mqgrad_scheduler_iteration_pushed_bytes 32450000
# TYPE mqgrad_scheduler_fp32_push_bytes gauge
mqgrad_scheduler_fp32_push_bytes 64900000
# TYPE mqgrad_scheduler_iteration_seconds histogram
mqgrad_scheduler_iteration_seconds_bucket{le="0.1"} 0
mqgrad_scheduler_iteration_seconds_bucket{le="0.25"} $it
mqgrad_scheduler_iteration_seconds_bucket{le="+Inf"} $it
mqgrad_scheduler_iteration_seconds_sum $(awk -v i="$it" 'BEGIN { printf "%.3f", i * 0.214 }')
mqgrad_scheduler_iteration_seconds_count $it
# TYPE mqgrad_scheduler_members gauge
mqgrad_scheduler_members 2
# TYPE mqgrad_scheduler_workers gauge
mqgrad_scheduler_workers 2
# TYPE mqgrad_scheduler_servers gauge
mqgrad_scheduler_servers 2
# TYPE mqgrad_scheduler_paused gauge
mqgrad_scheduler_paused 0
# TYPE mqgrad_scheduler_stragglers_total counter
mqgrad_scheduler_stragglers_total 1
# TYPE mqgrad_scheduler_worker_seconds gauge
mqgrad_scheduler_worker_seconds{rank="0",phase="compute"} 0.1402
mqgrad_scheduler_worker_seconds{rank="0",phase="encode"} 0.0101
mqgrad_scheduler_worker_seconds{rank="0",phase="wait"} 0.0503
mqgrad_scheduler_worker_seconds{rank="0",phase="decode"} 0.0050
mqgrad_scheduler_worker_seconds{rank="1",phase="compute"} 0.1655
mqgrad_scheduler_worker_seconds{rank="1",phase="encode"} 0.0112
mqgrad_scheduler_worker_seconds{rank="1",phase="wait"} 0.0221
mqgrad_scheduler_worker_seconds{rank="1",phase="decode"} 0.0049
# TYPE mqgrad_scheduler_worker_loss gauge
mqgrad_scheduler_worker_loss{rank="0"} 0.9812
mqgrad_scheduler_worker_loss{rank="1"} 0.9746
# TYPE mqgrad_scheduler_worker_straggles_total counter
mqgrad_scheduler_worker_straggles_total{rank="0"} 0
mqgrad_scheduler_worker_straggles_total{rank="1"} 1
# TYPE mqgrad_scheduler_agent_fallbacks_total counter
mqgrad_scheduler_agent_fallbacks_total 0
# TYPE mqgrad_scheduler_last_checkpoint_iteration gauge
mqgrad_scheduler_last_checkpoint_iteration 400
# TYPE mqgrad_scheduler_last_checkpoint_timestamp_seconds gauge
mqgrad_scheduler_last_checkpoint_timestamp_seconds $((now - 12))
# TYPE mqgrad_scheduler_link_mbps gauge
mqgrad_scheduler_link_mbps 3000
# TYPE mqgrad_scheduler_simulated_clock gauge
mqgrad_scheduler_simulated_clock 0
# TYPE mqgrad_scheduler_dropped_messages_total counter
mqgrad_scheduler_dropped_messages_total{reason="bad_token"} 3
mqgrad_scheduler_dropped_messages_total{reason="malformed"} 1
mqgrad_scheduler_dropped_messages_total{reason="stale_iteration"} 0
EOF
    mv "$f.tmp" "$f"
}

# fake NAME [ARGS...]: starts fake_metrics.py on $tmp/metrics.prom; its port in $port.
fake() {
    local name=$1
    shift
    rm -f "$tmp/$name.port"
    "$py" "$here/fake_metrics.py" --file "$tmp/metrics.prom" --port-file "$tmp/$name.port" "$@" \
        2>"$tmp/$name.log" &
    pids+=($!)
    until_ok 10 test -s "$tmp/$name.port" || fail "fake_metrics.py $name did not start: $(cat "$tmp/$name.log")"
    port=$(cat "$tmp/$name.port")
}

# Pane helpers: its text, a wait for a pattern in it, a format variable.
pane() { tm capture-pane -p -t "$cur"; }
pane_has() { pane | grep -Eq -- "$1"; }
pane_var() { tm display -p -t "$cur" "#{$1}"; }
wait_pane() {
    until_ok "${2:-15}" pane_has "$1" || fail "${3:-the pane never showed /$1/}"
}
pane_dead() { [[ "$(pane_var pane_dead)" == 1 ]]; }
# A session whose single pane runs CMD, 120x40.
session() {
    cur=$1
    tm new-session -d -s "$cur" -x 120 -y 40 "$2" || fail "tmux new-session $cur"
}
# top_session NAME ARGS: a session running `mqgrad top ARGS` under sh, which writes its exit
# code to $tmp/NAME.rc (tmux's own #{pane_dead_status} is sometimes never filled in).
top_session() {
    local name=$1
    shift
    session "$name" "'$mqgrad' top $*; echo \$? >'$tmp/$name.rc'"
}
# exited NAME: waits for it to end; its exit code in $rc.
exited() {
    until_ok 10 test -s "$tmp/$1.rc" || fail "$1: mqgrad top did not exit"
    until_ok 5 pane_dead || fail "$1: the pane's shell did not end"
    rc=$(cat "$tmp/$1.rc")
}
# The pid of the pane's mqgrad top (the child of its sh).
top_pid() { pgrep -P "$(pane_var pane_pid)" -x mqgrad; }

# Runs the rest with a timeout, so a hung mqgrad top fails the test instead of blocking it.
top_once() { timeout 20 "$mqgrad" top "$@"; }

fixture "$tmp/metrics.prom" 412 0.9779 0.836 8

# ---- flags ---------------------------------------------------------------------------------
out=$(top_once --bogus 2>&1)
[[ $? == 2 && "$out" == *"unknown flag '--bogus'"* ]] || fail "a bad flag: exit 2 with its name ($out)"
out=$(top_once --interval 0 2>&1)
[[ $? == 2 && "$out" == *"--interval"* ]] || fail "--interval 0: exit 2 ($out)"
out=$(top_once --scheduler ftp://host 2>&1)
[[ $? == 2 && "$out" == *"only http://"* ]] || fail "an ftp:// URL: exit 2 ($out)"
out=$(top_once --scheduler 127.0.0.1:99999 2>&1)
[[ $? == 2 && "$out" == *"port"* ]] || fail "port 99999: exit 2 ($out)"
out=$(top_once --http-token-file "$tmp/none" 2>&1)
[[ $? == 2 && "$out" == *"$tmp/none"* ]] || fail "a missing token file: exit 2 ($out)"
top_once --help | grep -q -- '--scheduler' || fail "--help lists --scheduler"
ok "bad flags exit 2 with the reason"

# ---- --once and the three ways a body ends --------------------------------------------------
for mode in length close chunked; do
    fake "$mode" --mode "$mode"
    out=$(top_once --once --scheduler "127.0.0.1:$port" </dev/null)
    rc=$?
    [[ $rc == 0 ]] || fail "--once ($mode): exit $rc, not 0"
    for want in "status=ok" "iter=412" "planned=1000" "loss=0.9779" "acc=0.8360" "bits=8" \
        "push_bytes=16225000" "fp32_bytes=64900000" "push_ratio=0.2500" "members=2" \
        "stragglers=1" "drops=4" "ckpt_iter=400" "worker_ms=205.6,203.7"; do
        [[ "$out" == *" $want"* ]] || fail "--once ($mode): no '$want' in: $out"
    done
    [[ $(wc -l <<<"$out") == 1 ]] || fail "--once ($mode): one line, got: $out"
done
ok "--once prints one line for logs over Content-Length, close and chunked bodies"

dead=$(free_port)
out=$(top_once --once --scheduler "127.0.0.1:$dead" 2>&1)
rc=$?
[[ $rc == 1 ]] || fail "--once, nothing listening: exit $rc, not 1"
[[ "$out" == "mqgrad top: scheduler unreachable: connection refused by 127.0.0.1:$dead" ]] ||
    fail "--once, nothing listening: the message was: $out"
out=$(top_once --once --scheduler "http://127.0.0.1:$port/elsewhere" 2>&1)
[[ $? == 1 && "$out" == *"HTTP 404 Not Found for /elsewhere"* ]] || fail "a 404: exit 1 with the status ($out)"
ok "--once exits 1 with the reason when nothing listens or the path is wrong"

fake token --token s3cret
out=$(top_once --once --scheduler "127.0.0.1:$port" 2>&1)
[[ $? == 1 && "$out" == *"HTTP 401"*"wants a bearer token"* ]] || fail "no token: exit 1, HTTP 401 ($out)"
out=$(MQGRAD_HTTP_TOKEN=wrong top_once --once --scheduler "127.0.0.1:$port" 2>&1)
[[ $? == 1 && "$out" == *"HTTP 401"*"token was refused"* ]] || fail "a wrong token: exit 1 ($out)"
out=$(MQGRAD_HTTP_TOKEN=s3cret top_once --once --scheduler "127.0.0.1:$port" 2>&1)
[[ $? == 0 && "$out" == *"iter=412"* ]] || fail "MQGRAD_HTTP_TOKEN: exit 0 ($out)"
printf 's3cret\n' >"$tmp/token"
out=$(top_once --once --http-token-file "$tmp/token" --scheduler "127.0.0.1:$port" 2>&1)
[[ $? == 0 && "$out" == *"iter=412"* ]] || fail "--http-token-file: exit 0 ($out)"
ok "bearer token: refused without or wrong, accepted from MQGRAD_HTTP_TOKEN or a file"

# ---- lines for logs: one per poll, the iteration advancing, a rate ---------------------------
fake lines
"$mqgrad" top --scheduler "127.0.0.1:$port" --interval 0.5 --count 4 >"$tmp/lines.txt" \
    2>"$tmp/lines.err" &
lp=$!
pids+=($lp)
until_ok 10 test -s "$tmp/lines.txt" || fail "line mode: no first line"
fixture "$tmp/metrics.prom" 420 0.9701 0.841 8
until_ok 15 bash -c "! kill -0 $lp 2>/dev/null" || fail "line mode: --count 4 did not stop"
wait "$lp"
rc=$?
[[ $rc == 0 ]] || fail "line mode: exit $rc"
[[ $(wc -l <"$tmp/lines.txt") == 4 ]] || fail "line mode: 4 lines for --count 4: $(cat "$tmp/lines.txt")"
head -1 "$tmp/lines.txt" | grep -q " iter=412 .* rate=- " || fail "line mode: the first line: $(head -1 "$tmp/lines.txt")"
tail -1 "$tmp/lines.txt" | grep -Eq " iter=420 .* rate=[0-9]+\.[0-9]+ " ||
    fail "line mode: the last line: $(tail -1 "$tmp/lines.txt")"
grep -q $'\e' "$tmp/lines.txt" && fail "line mode: escape sequences in a file"
ok "not a terminal: one key=value line per poll, the iteration advancing with a rate"

# ---- the view: content, updates, re-layout, q ------------------------------------------------
fixture "$tmp/metrics.prom" 412 0.9779 0.836 8
top_session view --scheduler "127.0.0.1:$port" --interval 0.5
wait_pane "iteration +412 / 1000"
[[ "$(pane_var alternate_on)" == 1 ]] || fail "the view is not on the alternate screen"
pane_has "loss +0\.9779" || fail "no loss"
pane_has "accuracy +83\.60 %" || fail "no accuracy"
pane_has "bits +8" || fail "no bits"
pane_has "16\.2 MB per worker vs fp32 64\.9 MB: 0\.250 \(4\.0× less\)" || fail "no bytes against fp32"
pane_has "2 members · 2 workers · 2 servers · running" || fail "no membership"
pane_has "rank 0 +140\.2 +10\.1 +50\.3 +5\.0 +205\.6 +0\.9812 +0 +█+▓+░+▒" || fail "no row for rank 0"
pane_has "rank 1 .* 203\.7 +0\.9746 +1 " || fail "no row for rank 1 (1 straggle)"
pane_has "drops +4: bad_token 3 · malformed 1" || fail "no drops by reason"
pane_has "checkpoint it 400, 1[0-9] s ago" || fail "no checkpoint age"
pane_has "stragglers cut 1" || fail "no straggler count"
fixture "$tmp/metrics.prom" 430 0.9650 0.845 6
wait_pane "iteration +430 / 1000 +\(43\.0 %\) +[1-9][0-9]*\.[0-9]+ it/s +ETA" 15 "the view did not follow the metrics to 430 with a rate"
wait_pane "accuracy +84\.50 %"
wait_pane "bits +6 +since it 430"
wait_pane "^ +8 → 6"
pane_has "loss +0\.9650 +[▁▂▃▄▅▆▇█]{2}" || fail "no loss sparkline"
ok "the view: iteration, rate, loss, accuracy, bits, bytes, workers, drops; it follows the metrics"

pane_has "loss straggles +time split" || fail "120 columns: no loss and straggle columns"
tm resize-window -t "$cur" -x 90 -y 30
wait_pane "total ms  time split" 10 "the view did not lay itself out again for 90 columns"
pane_has "loss straggles" && fail "90 columns: the narrow layout still has the loss column"
ok "SIGWINCH: the view lays itself out again for the new size"

tm send-keys -t "$cur" q
exited view
[[ $rc == 0 ]] || fail "q: exit $rc, not 0"
[[ "$(pane_var alternate_on)" == 0 ]] || fail "q: the alternate screen was left on"
ok "q exits 0 and leaves the alternate screen"

# ---- Ctrl-C from a shell: the terminal modes as they were ------------------------------------
fixture "$tmp/metrics.prom" 412 0.9779 0.836 8
session ctrlc /bin/sh
until_ok 5 pane_has '[$#] ?$' || fail "no shell prompt"
tm send-keys -t "$cur" "stty -a >$tmp/stty.before; $mqgrad top --scheduler 127.0.0.1:$port; echo rc=\$? >$tmp/ctrlc.rc; stty -a >$tmp/stty.after" Enter
wait_pane "iteration +412 / 1000"
[[ "$(pane_var alternate_on)" == 1 && "$(pane_var cursor_flag)" == 0 ]] || fail "Ctrl-C: the view was not up"
tm send-keys -t "$cur" C-c
until_ok 10 test -s "$tmp/stty.after" || fail "Ctrl-C: mqgrad top did not exit"
[[ "$(cat "$tmp/ctrlc.rc")" == rc=0 ]] || fail "Ctrl-C: $(cat "$tmp/ctrlc.rc"), not rc=0"
diff "$tmp/stty.before" "$tmp/stty.after" >&2 || fail "Ctrl-C: the terminal modes differ after"
[[ "$(pane_var alternate_on)" == 0 ]] || fail "Ctrl-C: the alternate screen was left on"
[[ "$(pane_var cursor_flag)" == 1 ]] || fail "Ctrl-C: the cursor was left hidden"
ok "Ctrl-C exits 0 with the stty modes, the screen and the cursor as they were"

# ---- SIGTERM ---------------------------------------------------------------------------------
top_session term --scheduler "127.0.0.1:$port"
wait_pane "iteration +412 / 1000"
tp=$(top_pid) || fail "SIGTERM: no mqgrad top under the pane's shell"
kill -TERM "$tp"
exited term
[[ $rc == 0 ]] || fail "SIGTERM: exit $rc, not 0"
[[ "$(pane_var alternate_on)" == 0 ]] || fail "SIGTERM: the alternate screen was left on"
ok "SIGTERM exits 0 and leaves the alternate screen"

# ---- an unreachable scheduler, then one that answers -----------------------------------------
late=$(free_port)
top_session late --scheduler "http://127.0.0.1:$late" --interval 0.5
wait_pane "^scheduler unreachable: connection refused by 127\.0\.0\.1:$late, retrying"
pane_has "iteration +- " || fail "unreachable: the iteration is not '-'"
[[ -s "$tmp/late.rc" ]] && fail "unreachable: mqgrad top gave up"
fake late --port "$late"
wait_pane "iteration +412 / 1000" 15 "the view did not pick up the scheduler once it answered"
pane_has "unreachable" && fail "the status still says unreachable"
tm send-keys -t "$cur" q
exited late
[[ $rc == 0 ]] || fail "q after unreachable: exit $rc"
ok "an unreachable scheduler: a status line, retries, the view once it answers"

# ---- a real run --------------------------------------------------------------------------------
# The small model over emulated 20 Mbit/s links: about 4 iterations a second, so polls see
# it rise; 80 iterations, about 25 s.
hport=$(free_port)
"$mqgrad" local --model small --workers 2 --servers 2 --threads 1 --iterations 80 \
    --link-mbps 20 --eval-every 20 --eval-limit 200 --insecure --quiet \
    --http-port "$hport" --run-dir "$tmp/run" >"$tmp/run.out" 2>&1 &
rp=$!
pids+=($rp)
top_session real --scheduler "127.0.0.1:$hport" --interval 0.5
real_iter() { pane | sed -nE 's/^iteration +([0-9]+) \/ 80 .*/\1/p'; }
at_least() {
    local i
    i=$(real_iter)
    [[ -n "$i" ]] && ((i >= $1))
}
until_ok 30 at_least 3 || fail "the real scheduler's iteration never showed 3 or more"
first=$(real_iter)
until_ok 30 at_least $((first + 5)) || fail "the real run's iteration did not rise from $first"
second=$(real_iter)
wait_pane "iteration +[0-9]+ / 80 +\([0-9.]+ %\) +[0-9]+\.[0-9]+ it/s" 10 "no rate from the real run"
wait_pane "rank 1 +[0-9]+\.[0-9]" 10 "no worker row from the real run"
wait_pane "2 members · 2 workers · 2 servers · running +link 20 Mbit/s, real clock" 10 "no membership from the real run"
wait_pane "accuracy +[0-9]+\.[0-9]+ %" 30 "no accuracy from the real run's evaluations"
pane >"$tmp/real.txt"
until_ok 60 bash -c "! kill -0 $rp 2>/dev/null" || fail "the real run did not finish"
wait "$rp" || fail "the real run failed: $(tail -5 "$tmp/run.out")"
wait_pane "^scheduler unreachable: connection refused by 127\.0\.0\.1:$hport, retrying \(last answer" 10 \
    "no unreachable status after the run ended"
tm send-keys -t "$cur" q
exited real
[[ $rc == 0 ]] || fail "q after the real run: exit $rc"
ok "a real run: the iteration rose from $first to $second on the screen; the end shows as unreachable"

echo "test_top: $passed checks passed"
