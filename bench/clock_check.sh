#!/bin/sh
# The simulated clock against the real one: the same run (model, codec, bits, workers, link,
# seed) once with links that sleep and once on the simulated clock, and the ratio of their
# median iteration times (the first iteration, a warm-up, left out). Both are measured in the
# same invocation, so the ratio holds whatever the machine's speed.
#
#   bench/clock_check.sh [--quick] [--model small|paper] [--iterations N] [--mqgrad PATH]
#                        [--configs "BITS:WORKERS:MBPS ..."]   (BITS none = fp32)
#
# Prints one row per configuration: the median iteration time on each clock and their ratio;
# the same for the time workers spend waiting on the network (the link model's part); and the
# ratio once the real run's CPU contention is taken out. On a machine with fewer cores than
# busy nodes, the real clock measures workers slowing each other down, which separate machines
# would not (their compute takes longer than its CPU time); the simulated clock charges the CPU
# time, as if each node had its own core. "corrected" is the simulated iteration time against
# the real one less that excess (real compute time minus simulated compute time): where it is
# near 1, the clocks differ by the contention alone. Tensors of 100 values or more are
# quantized (--threshold 100), so the bit-width changes the bytes even on the small model.
# Exit 1 if a run fails.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
mqgrad=${MQGRAD:-$here/../build/tools/mqgrad}
model=small
iters=12
quick=0
configs=
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1 ;;
    --model) model=$2; shift ;;
    --iterations) iters=$2; shift ;;
    --mqgrad) mqgrad=$2; shift ;;
    --configs) configs=$2; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "clock_check: unknown flag '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -x "$mqgrad" ] || { echo "clock_check: no mqgrad at $mqgrad (build first, or --mqgrad)" >&2; exit 2; }

out=$(mktemp -d /tmp/clock-check.XXXXXX)
trap 'rm -rf "$out"' EXIT
cores=$(nproc)

# medians of the iteration time (train_time_s differences, iteration 0 left out), of the
# wait_ms and of the compute_ms columns, seconds, from a metrics.csv
medians() {
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        { t = $col["train_time_s"]
          if (NR > 2) { d[n] = t - prev; w[n] = $col["wait_ms"] / 1e3; c[n] = $col["compute_ms"] / 1e3; n++ }
          prev = t }
        function med(a, n,   i, j, x) { for (i = 1; i < n; i++) { x = a[i]; for (j = i - 1; j >= 0 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
            return n % 2 ? a[int(n / 2)] : (a[n / 2 - 1] + a[n / 2]) / 2 }
        END { if (n < 1) exit 1; printf "%.6f %.6f %.6f\n", med(d, n), med(w, n), med(c, n) }' "$1"
}

if [ -n "$configs" ]; then
    :
elif [ "$quick" = 1 ]; then
    configs="none:2:80 2:2:80"
else
    configs="none:2:80 8:2:80 2:2:80 none:4:80 8:4:80 2:4:80 none:2:1000 8:2:1000 2:2:1000 none:4:1000 8:4:1000 2:4:1000"
fi

printf '%-6s %-7s %-7s %9s %9s %7s %9s %9s %7s %9s\n' bits workers "Mbit/s" "real ms" "sim ms" ratio \
    "real wait" "sim wait" ratio corrected
for c in $configs; do
    bits=${c%%:*}; rest=${c#*:}; workers=${rest%%:*}; mbps=${rest#*:}
    if [ "$bits" = none ]; then
        method="--codec none --policy none"
    else
        method="--policy fixed:$bits"
    fi
    for clock in real simulated; do
        dir=$out/$bits-$workers-$mbps-$clock
        # shellcheck disable=SC2086
        if ! "$mqgrad" local --model "$model" --workers "$workers" --servers 2 --threads 1 \
            --iterations "$iters" --eval-every 0 --final-eval-limit 100 --link-mbps "$mbps" \
            --threshold 100 \
            --clock "$clock" --seed 1 --quiet --run-dir "$dir" $method >"$dir.log" 2>&1; then
            echo "clock_check: the $clock run ($bits bits, $workers workers, $mbps Mbit/s) failed:" >&2
            tail -5 "$dir.log" >&2
            exit 1
        fi
        medians "$dir/metrics.csv" >"$dir.med"
    done
    read -r rt rw rc <"$out/$bits-$workers-$mbps-real.med"
    read -r st sw sc <"$out/$bits-$workers-$mbps-simulated.med"
    awk -v b="$bits" -v w="$workers" -v m="$mbps" -v rt="$rt" -v st="$st" -v rw="$rw" -v sw="$sw" \
        -v rc="$rc" -v sc="$sc" \
        'BEGIN { x = rc > sc ? rc - sc : 0
                 printf "%-6s %-7s %-7s %9.1f %9.1f %7.3f %9.1f %9.1f %7.3f %9.3f\n", b, w, m,
                 rt * 1e3, st * 1e3, st / rt, rw * 1e3, sw * 1e3, (rw > 0 ? sw / rw : 0), st / (rt - x) }'
done
echo "($cores cores here; each run has $iters iterations, model $model)"
