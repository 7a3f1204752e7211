#!/bin/sh
# Per-iteration time split (compute, encode, wait, decode+update) and wire bytes per iteration
# of a 4-worker, 2-server cluster on the paper model, for fp32, 8, 4 and 2 bits, without and
# with link emulation: one `mqgrad local` run per cell, medians over the iterations after warm-up.
#
# usage: bench/split.sh [OUT_DIR]            runs everything, then prints the tables
#        bench/split.sh --summarize OUT_DIR  prints the tables of runs already in OUT_DIR
# environment: MQGRAD (the CLI, default build/tools/mqgrad), ITERS (15), ITERS_LINK (10: fp32
# at 80 Mbit/s takes ~30 s an iteration), WARMUP (3), LINKS ("0 80"), CODECS ("none 8 4 2"),
# WORKERS (4), SERVERS (2), NICE (e.g. "nice -n 10" when the machine is shared).
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
MQGRAD=${MQGRAD:-$here/build/tools/mqgrad}
ITERS=${ITERS:-15}
ITERS_LINK=${ITERS_LINK:-10}
WARMUP=${WARMUP:-3}
LINKS=${LINKS:-"0 80"}
CODECS=${CODECS:-"none 8 4 2"}
WORKERS=${WORKERS:-4}
SERVERS=${SERVERS:-2}
NICE=${NICE:-}

# Medians of one run's metrics.csv after WARMUP iterations. The iteration time is the step of
# train_time_s (evaluation is excluded from it); bytes are the sum over workers, as the
# scheduler records them. Prints: n iter_ms compute encode wait decode bytes_up bytes_down.
s_medians() {
    awk -F, -v warm="$WARMUP" '
    function med(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
        return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
    }
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
        t = $col["train_time_s"]
        if ($col["iter"] >= warm && have) {
            n++
            it[n] = (t - prev) * 1000; cp[n] = $col["compute_ms"]; en[n] = $col["encode_ms"]
            wa[n] = $col["wait_ms"]; de[n] = $col["decode_ms"] + $col["update_ms"]
            up[n] = $col["bytes_up"]; dn[n] = $col["bytes_down"]
        }
        prev = t; have = 1
    }
    END {
        if (n == 0) { print "0"; exit }
        printf "%d %.1f %.1f %.1f %.1f %.1f %.0f %.0f\n", n, med(it, n), med(cp, n), med(en, n),
               med(wa, n), med(de, n), med(up, n), med(dn, n)
    }' "$1"
}

s_label() { [ "$1" = none ] && echo fp32 || echo "$1-bit"; }

s_summarize() {
    out=$1
    for link in $LINKS; do
        if [ "$link" = 0 ]; then echo "## no link emulation"; else echo "## --link-mbps $link"; fi
        echo
        echo "| codec | n | iter ms | compute ms | encode ms | wait ms | decode+update ms | MB up/iter | MB down/iter | MB/worker/iter | ratio vs fp32 |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|"
        base=""
        shares=""
        model=""
        for c in $CODECS; do
            csv=$out/link$link-$c/metrics.csv
            if [ ! -s "$csv" ]; then echo "| $(s_label "$c") | missing: $csv |"; continue; fi
            set -- $(s_medians "$csv")
            if [ "$1" = 0 ]; then echo "| $(s_label "$c") | no iterations after warm-up |"; continue; fi
            n=$1 it=$2 cp=$3 en=$4 wa=$5 de=$6 up=$7 dn=$8
            tot=$(awk -v u="$up" -v d="$dn" 'BEGIN { print u + d }')
            [ "$c" = none ] && base=$tot
            ratio=$(awk -v b="$base" -v t="$tot" 'BEGIN { if (b == "") print "n/a"; else printf "%.2fx", b / t }')
            awk -v l="$(s_label "$c")" -v n="$n" -v it="$it" -v cp="$cp" -v en="$en" -v wa="$wa" \
                -v de="$de" -v up="$up" -v dn="$dn" -v w="$WORKERS" -v r="$ratio" 'BEGIN {
                printf "| %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f | %s |\n",
                       l, n, it, cp, en, wa, de, up / 1e6, dn / 1e6, (up + dn) / w / 1e6, r }'
            shares="$shares$(awk -v l="$(s_label "$c")" -v it="$it" -v cp="$cp" -v en="$en" \
                -v wa="$wa" -v de="$de" 'BEGIN {
                o = it - cp - en - wa - de
                printf "| %s | %.0f%% | %.0f%% | %.0f%% | %.0f%% | %.0f%% |", l, 100 * cp / it,
                       100 * en / it, 100 * wa / it, 100 * de / it, 100 * o / it }')
"
            # Link time by the NIC model (DESIGN 7): a push of b bytes per worker and server;
            # server S-1 has its last push in after (S-1+W) push times, then sends W replies one
            # after the other: the last worker is served after 2W+S-1 push times.
            model="$model$(awk -v l="$(s_label "$c")" -v up="$up" -v w="$WORKERS" -v s="$SERVERS" \
                -v mbps="$link" -v it="$it" -v cp="$cp" 'BEGIN {
                if (mbps == 0) exit
                b = up / (w * s); t = (2 * w + s - 1) * b / (mbps * 1e6 / 8) * 1000
                printf "| %s | %.2f | %.0f | %.0f | %.0f | %.2f |", l, b / 1e6, t, cp + t, it,
                       it / (cp + t) }')
"
        done
        echo
        echo "Share of the iteration (medians; other = iteration - phases: scheduler, reports, skew)"
        echo
        echo "| codec | compute | encode | wait | decode+update | other |"
        echo "|---|---|---|---|---|---|"
        printf "%s" "$shares"
        echo
        if [ "$link" != 0 ]; then
            echo "Link time by the NIC model: (2W+S-1) pushes of MB per worker and server at the rate"
            echo
            echo "| codec | MB per push | link ms | compute + link ms | iter ms | iter / (compute + link) |"
            echo "|---|---|---|---|---|---|"
            printf "%s" "$model"
            echo
        fi
    done
}

if [ "${1:-}" = --summarize ]; then
    [ $# -eq 2 ] || { echo "usage: $0 --summarize OUT_DIR" >&2; exit 2; }
    s_summarize "$2"
    exit 0
fi

out=${1:-/tmp/mqgrad-split-$(date -u +%Y%m%d-%H%M%S)}
[ -x "$MQGRAD" ] || { echo "split.sh: $MQGRAD is not executable (build first, or set MQGRAD)" >&2; exit 2; }
mkdir -p "$out"
echo "split.sh: runs in $out ($(date -u +%H:%M:%S) UTC, load: $(cut -d' ' -f1-3 /proc/loadavg))"
for link in $LINKS; do
    for c in $CODECS; do
        if [ "$c" = none ]; then policy=none; else policy=fixed:$c; fi
        iters=$ITERS
        [ "$link" != 0 ] && iters=$ITERS_LINK
        dir=$out/link$link-$c
        rm -rf "$dir"
        start=$(date +%s)
        # shellcheck disable=SC2086 # NICE is a command prefix
        if ! $NICE "$MQGRAD" local --model paper --workers "$WORKERS" --servers "$SERVERS" \
            --policy "$policy" --iterations "$iters" --eval-every 0 --link-mbps "$link" \
            --threads 1 --quiet --run-dir "$dir" >"$out/link$link-$c.log" 2>&1; then
            echo "split.sh: run $dir failed; see $out/link$link-$c.log" >&2
            continue
        fi
        echo "  $(s_label "$c"), link $link: $(($(date +%s) - start)) s"
    done
done
echo "split.sh: done at $(date -u +%H:%M:%S) UTC, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
s_summarize "$out"
