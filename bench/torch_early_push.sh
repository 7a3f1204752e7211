#!/bin/bash
# What sending gradients as the backward pass finishes them (mqgrad.torch's early push:
# mqgrad_ready from the hooks after each parameter's accumulation) saves a PyTorch worker's
# iteration, against sending them all at step(), in one invocation: paired runs of `mqgrad
# local --worker-exec examples/torch/paper_cnn.py` on an emulated link (real clock), the same
# in everything but MQGRAD_EARLY_PUSH (1 or 0), the two alternated within each repetition
# (which goes first swaps from one repetition to the next). Prints, per policy, each pair's
# median iteration time both ways and their ratio (late ÷ early: above 1, early push is
# faster), and the median of the ratios. The paper's CNN's backward pass finishes fc3, fc2
# and fc1 (99 % of its 16.2 M parameters) before the convolutions' backward, so their bytes
# can be on the link while the convolutions compute: the saving is bounded by that compute.
#
# usage: bench/torch_early_push.sh [OUT_DIR]
# environment (defaults):
#   MQGRAD (build/tools/mqgrad)   PYTHON (/usr/bin/python3: Debian's, with python3-torch)
#   POLICIES ("none fixed:8")     mqgrad local --policy of each pair (none = fp32)
#   LINK (1000)                   --link-mbps of every node
#   REPS (3), WORKERS (2)         pairs per policy; workers (one server each)
#   ITERS (12), WARMUP (2)        iterations per run; the first WARMUP are left out
#   DEADLINE (900)                seconds a run may take before it is stopped
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MQGRAD=${MQGRAD:-$here/build/tools/mqgrad}
POLICIES=${POLICIES:-"none fixed:8"}
LINK=${LINK:-1000}
REPS=${REPS:-3}
WORKERS=${WORKERS:-2}
ITERS=${ITERS:-12}
WARMUP=${WARMUP:-2}
DEADLINE=${DEADLINE:-900}

[ -x "$MQGRAD" ] || { echo "torch_early_push.sh: $MQGRAD is not executable (build first, or set MQGRAD)" >&2; exit 2; }
"$PYTHON" -c 'import torch, numpy' 2>/dev/null ||
    { echo "SKIP: $PYTHON has no torch (apt-get install python3-torch)"; exit 0; }
[ "$ITERS" -gt "$WARMUP" ] || { echo "torch_early_push.sh: ITERS must exceed WARMUP" >&2; exit 2; }
out=${1:-/tmp/mqgrad-torch-early-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"

# run EARLY POLICY REP: one run into $out/early|late-POLICY-REP.
run() {
    local early=$1 pol=$2 rep=$3 dir rc
    dir=$out/$([ "$early" = 1 ] && echo early || echo late)-${pol//:/}-$rep
    rm -rf "$dir" "$dir.log"
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MQGRAD_EARLY_PUSH=$early \
        timeout -k 10 "$DEADLINE" "$MQGRAD" local --model paper \
        --workers "$WORKERS" --policy "$pol" --iterations "$ITERS" --link-mbps "$LINK" \
        --eval-every 0 --final-eval-limit 100 --threads 1 --insecure --checkpoint-every 0 \
        --restarts 0 --quiet --run-dir "$dir" \
        --worker-exec "$PYTHON $here/examples/torch/paper_cnn.py" >"$dir.log" 2>&1
    rc=$?
    [ $rc = 0 ] || echo "  $pol rep $rep early=$early: exit $rc (see $dir.log)" >&2
}

echo "torch_early_push.sh: runs in $out; paper model in PyTorch, $WORKERS workers, $LINK Mbit/s, policies $POLICIES, $REPS pairs, $ITERS iterations ($WARMUP warm-up)"
echo "  start $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), $(git -C "$here" rev-parse --short HEAD 2>/dev/null)"
for rep in $(seq 1 "$REPS"); do
    for pol in $POLICIES; do
        if [ $((rep % 2)) = 1 ]; then order="1 0"; else order="0 1"; fi
        for e in $order; do run "$e" "$pol" "$rep"; done
    done
done
echo "  end $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$PYTHON" - "$out" "$POLICIES" "$REPS" "$WARMUP" <<'PY'
import csv, os, statistics as st, sys
out, policies, reps, warm = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
def med(d):
    p = os.path.join(d, "metrics.csv")
    if not os.path.exists(p):
        return None
    t = [float(r["train_time_s"]) for r in csv.DictReader(open(p))]
    dt = [b - a for a, b in zip(t, t[1:])][warm:]
    return st.median(dt) if dt else None
print("\n| policy | pair | early push (ms/iteration) | at step() (ms/iteration) | at step() ÷ early |")
print("|---|---:|---:|---:|---:|")
for pol in policies:
    ratios = []
    for r in range(1, reps + 1):
        a = med(os.path.join(out, "early-%s-%d" % (pol.replace(":", ""), r)))
        b = med(os.path.join(out, "late-%s-%d" % (pol.replace(":", ""), r)))
        if a and b:
            ratios.append(b / a)
            print("| %s | %d | %.0f | %.0f | %.3f |" % (pol, r, 1e3 * a, 1e3 * b, b / a))
        else:
            print("| %s | %d | %s | %s | (a run failed) |" % (pol, r, a, b))
    if ratios:
        print("| %s | median | | | **%.3f** (min %.3f, max %.3f) |"
              % (pol, st.median(ratios), min(ratios), max(ratios)))
PY
