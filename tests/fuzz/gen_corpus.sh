#!/usr/bin/env bash
# Regenerates the seed corpus (tests/fuzz/corpus/<target>/) with gen_corpus, built in the fuzz
# build directory as tools/fuzz.sh builds it, and fuzz_flags.dict: the MQGRAD_* variables and
# the --flags the programs read (getenv's names are invisible to libFuzzer's comparison
# tracing, so the dictionary is how the fuzzer meets them).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
build="${MQGRAD_FUZZ_BUILD_DIR:-build-fuzz}"
CC=clang-14 cmake -S . -B "$build" -DMQGRAD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target gen_corpus -j"$(nproc)" >/dev/null
# Only the targets gen_corpus writes are replaced (a target whose corpus is kept by hand, as
# fuzz_metrics's, stays); inputs added by hand as regress-* (crashes once fixed) are kept;
# gen_corpus's own win.
fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
"$build/tests/fuzz/gen_corpus" "$fresh"
mkdir -p tests/fuzz/corpus
for dir in "$fresh"/*/; do
    target="$(basename "$dir")"
    old="tests/fuzz/corpus/$target"
    [ -d "$old" ] && find "$old" -type f -name 'regress-*' -exec cp -n {} "$dir" \;
    rm -rf "$old"
    mv "$dir" "$old"
done
srcs=(common/src services tools/mqgrad)
{
    echo "# MQGRAD_* variables and --flags of the programs (tests/fuzz/gen_corpus.sh writes it)"
    grep -rhoE '"MQGRAD_[A-Z0-9_]+"' "${srcs[@]}" common/include | tr -d '"' | sort -u |
        sed 's/.*/"&="/'
    { grep -rhoE '\{"[a-z][a-z0-9-]*", ("MQGRAD_|NULL)' "${srcs[@]}" common/include |
          sed -E 's/^\{"([^"]*)".*/\1/'
      grep -rhoE 'strcmp\(name, "[a-z][a-zA-Z0-9-]*"\)' services/agent |
          sed -E 's/.*"(.*)".*/\1/'; } | sort -u | sed 's/.*/"--&"/'
} >tests/fuzz/fuzz_flags.dict
du -sh tests/fuzz/corpus
