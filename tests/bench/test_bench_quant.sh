#!/usr/bin/env bash
# bench_quant's command line as a user meets it, on a tensor small enough to take seconds:
# --rounds N prints each round's table, then one summary row a codec whose cells are
# "median (min-max)" of the rounds' ratios, with the median inside its range; a codec that
# fails is named as failed there and the run exits 1; a bad --rounds exits 2 with the reason.
# Speeds are not asserted (they are the machine's): only that they are there and consistent.
#
#   tests/bench/test_bench_quant.sh BUILD_DIR      Exit 0 all passed, 1 a check failed.
set -uo pipefail

build="${1:-}"
bq="$build/bench/bench_quant"
[[ -x "$bq" ]] || { echo "test_bench_quant: no $bq (build the bench_quant target)" >&2; exit 2; }
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
fails=0
check() { # NAME CONDITION-EXIT-STATUS
    if [[ "$2" == 0 ]]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}

timeout 120 "$bq" --torch 0 --n 8192 --reps 2 --rounds 3 --codec uniform:8:bucket=512 \
    --codec dgc >"$out" 2>&1
check "three rounds exit 0" $?
[[ "$(grep -c '^round [123] of 3$' "$out")" == 3 ]]
check "each round is announced" $?
grep -q '^over 3 rounds, medians (min-max) of each round.s ratio: read-only pass [0-9.]* ([0-9.]*-[0-9.]*), add pass [0-9.]* ([0-9.]*-[0-9.]*)$' "$out"
check "the floors' summary line" $?
# The summary rows: uniform has six cells (enc_ef, enc_ef/add_pass and ef_inpl included), dgc
# keeps its own state, so its error-feedback cells are "-". Every median lies within its range.
awk '
    /^over 3 rounds/ { s = 1; next }
    NF == 0 { s = 0 } # the summary ends at a blank line (the stats table follows)
    s && $1 == "uniform:8:bucket=512" { u = NF }
    s && $1 == "dgc" { q = ($(NF - 2) == "-" && $(NF - 1) == "-" && $NF == "-" && NF == 10) }
    s && ($1 == "uniform:8:bucket=512" || $1 == "dgc") {
        for (i = 2; i < NF; i++) if ($(i + 1) ~ /^\(/) {
            split(substr($(i + 1), 2, length($(i + 1)) - 2), r, "-")
            if ($i + 0 < r[1] - 0.0005 || $i + 0 > r[2] + 0.0005 || $i + 0 <= 0) bad = 1
            cells++
        }
    }
    END { exit !(u == 13 && q && cells == 9 && !bad) }' "$out"
check "summary rows: median (min-max) in range, '-' where there is no error feedback" $?

timeout 120 "$bq" --torch 0 --n 4096 --reps 1 --rounds 2 --codec uniform:4 --codec bogus:3 \
    >"$out" 2>&1
rc=$?
[[ $rc == 1 ]]
check "a codec that fails exits 1 (got $rc)" $?
awk '/^over 2 rounds/ { s = 1 } NF == 0 { s = 0 } s && $1 == "bogus:3" && $2 == "failed" { f = 1 }
     s && $1 == "uniform:4" && NF == 13 { u = 1 } END { exit !(f && u) }' "$out"
check "the failed codec is named in the summary, the other row is whole" $?

timeout 30 "$bq" --rounds 0 >"$out" 2>&1
rc=$?
[[ $rc == 2 ]] && grep -q -- "--rounds: '0' is not an integer in 1..1000" "$out"
check "--rounds 0 exits 2 with the reason (got $rc)" $?

[[ $fails == 0 ]] || { echo "test_bench_quant: $fails check(s) failed" >&2; exit 1; }
echo "test_bench_quant: all passed"
