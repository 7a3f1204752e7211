#!/usr/bin/env bash
# The Criterion suite under AddressSanitizer and UndefinedBehaviorSanitizer: builds
# build-asan (MQGRAD_SANITIZE=ON, the compiler of the normal build) and runs every test
# through ctest there. UBSan findings abort (-fno-sanitize-recover). Every report, from a test
# or from a service or command a test starts, goes to build-asan/sanitizer-logs/ as well, so a
# report in a process whose exit a test does not check still fails the run. Fails if a test
# fails or any report was written. Extra arguments go to ctest (e.g. -R test_codecs).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
tools/install-deps.sh test
build="${MQGRAD_ASAN_BUILD_DIR:-build-asan}"
cmake -S . -B "$build" -DMQGRAD_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$(nproc)"
case "$build" in /*) logs="$build/sanitizer-logs" ;; *) logs="$repo/$build/sanitizer-logs" ;; esac
rm -rf "$logs"
mkdir -p "$logs"
# Leaks are reported too (LeakSanitizer is on by default on x86-64 Linux).
export ASAN_OPTIONS="${ASAN_OPTIONS:-strict_string_checks=1}:log_path=$logs/asan"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}:log_path=$logs/ubsan"
rc=0
ctest --test-dir "$build" --output-on-failure --timeout 2400 "$@" || rc=$?
if [ -n "$(ls -A "$logs")" ]; then
    for f in "$logs"/*; do
        echo "== sanitizer report $f"
        head -60 "$f"
    done
    echo "sanitize: $(ls "$logs" | wc -l) sanitizer report(s), in $logs" >&2
    rc=1
fi
exit "$rc"
