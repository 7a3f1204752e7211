#!/usr/bin/env bash
# Fuzzing with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer (tests/fuzz/README.md):
# builds build-fuzz with clang (MQGRAD_FUZZ=ON), runs every target for SECONDS (default 60) on
# a fresh copy of its seed corpus, two at a time, and prints per target the executions,
# executions per second, coverage (cov: edges, ft: features) and corpus size from
# libFuzzer's final stats. Fails if any target crashes, times out (10 s on one input) or
# runs out of memory (2 GB); the reproducer and the log stay in build-fuzz/fuzz-out/TARGET/.
#   tools/fuzz.sh [SECONDS]
#   MQGRAD_FUZZ_TARGETS="fuzz_wire fuzz_codec"  only these targets
#   MQGRAD_FUZZ_JOBS=1                          one target at a time (default 2)
#   MQGRAD_FUZZ_ARGS="-runs=1000000"            more libFuzzer flags (here: stop at 10^6 runs)
#   MQGRAD_FUZZ_BUILD_DIR=DIR                   build directory (default build-fuzz)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
secs="${1:-60}"
case "$secs" in '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;; esac
tools/install-deps.sh test
build="${MQGRAD_FUZZ_BUILD_DIR:-build-fuzz}"
CC=clang-14 cmake -S . -B "$build" -DMQGRAD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz -j"$(nproc)" >"$build/fuzz-build.log" 2>&1 ||
    { tail -50 "$build/fuzz-build.log"; echo "fuzz: build failed" >&2; exit 1; }
all="fuzz_wire fuzz_codec fuzz_agent_state fuzz_ckpt fuzz_runfiles fuzz_flags fuzz_metrics"
targets="${MQGRAD_FUZZ_TARGETS:-$all}"
jobs="${MQGRAD_FUZZ_JOBS:-2}"
out="$build/fuzz-out"

# Runs target $1 in $out/$1: corpus copy, log, crash files.
run_one() {
    local t="$1" dir="$out/$1" dict=()
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -r "tests/fuzz/corpus/$t" "$dir/corpus"
    [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
    "$build/tests/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$dir/" "${dict[@]}" \
        ${MQGRAD_FUZZ_ARGS:-} "$dir/corpus" >"$dir/log" 2>&1
}

declare -A pid_of
failed=0
set -- $targets
while [ $# -gt 0 ]; do
    batch=()
    for _ in $(seq "$jobs"); do
        [ $# -gt 0 ] || break
        batch+=("$1")
        run_one "$1" &
        pid_of[$1]=$!
        shift
    done
    for t in "${batch[@]}"; do
        result=FAILED
        wait "${pid_of[$t]}" && result=ok
        echo "$result" >"$out/$t/status"
    done
done

printf '%-18s %-7s %12s %9s %7s %7s %8s\n' target result executions exec/s cov ft corpus
for t in $targets; do
    log="$out/$t/log"
    status="$(cat "$out/$t/status")"
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
    last="$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)"
    cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
    ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
    corp="$(find "$out/$t/corpus" -type f | wc -l)"
    printf '%-18s %-7s %12s %9s %7s %7s %8s\n' "$t" "$status" "${runs:-?}" "${rate:-?}" \
        "${cov:-?}" "${ft:-?}" "$corp"
done
for t in $targets; do
    [ "$(cat "$out/$t/status")" = ok ] && continue
    failed=1
    echo
    echo "== $t failed; log: $out/$t/log"
    grep -E -A30 '^==[0-9]+==|^fuzz_|runtime error|ERROR: libFuzzer' "$out/$t/log" |
        grep -v '^    #[0-9]* 0x.* in fuzzer::' | head -60 || true
    for f in "$out/$t"/crash-* "$out/$t"/timeout-* "$out/$t"/oom-* "$out/$t"/leak-*; do
        [ -e "$f" ] && echo "reproduce: $build/tests/fuzz/$t $f"
    done
done
[ "$failed" = 0 ] && echo "fuzz: no target crashed (each ran for at most ${secs} s)"
exit "$failed"
