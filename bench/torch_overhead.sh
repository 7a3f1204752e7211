#!/bin/bash
# What mqgrad adds to a PyTorch step, against what it adds to the C worker's step, on the same
# model (the paper's CNN: examples/torch/paper_cnn.py is the C model tensor for tensor), in one
# invocation: paired runs of `mqgrad local --model paper` with C workers and with PyTorch
# workers (--worker-exec), no link emulation, the same servers, batch, seed, iterations and
# fixed bit-widths, the two kinds alternated within each repetition (which goes first swaps
# from one repetition to the next). The result is the ratio of the two in the same
# repetition; bench/torch_overhead.py prints the tables (bench/README.md, "torch_overhead.sh").
#
# usage: bench/torch_overhead.sh [OUT_DIR]
#        bench/torch_overhead.sh --summarize OUT_DIR   the tables again from runs already made
# environment (defaults):
#   MQGRAD (build/tools/mqgrad)   PYTHON (/usr/bin/python3: Debian's, with python3-torch)
#   POLICIES ("fixed:4 none")     mqgrad local --policy of each pair (none = fp32, no agent)
#   REPS (5)                      repetitions (pairs) per policy
#   WORKERS (2)                   workers (and servers: one per worker, mqgrad local's default)
#   ITERS (15), WARMUP (3)        iterations per run; the first WARMUP are left out
#   BATCH (32), SEED (1)          the run's batch per worker and seed
#   DEADLINE (600)                seconds a run may take before it is stopped (timeout)
#   TORCH_PYTHONPATH (none)       another mqgrad package for the PyTorch workers (a folder with
#                                 mqgrad/ in it: an older binding, to compare); default: the
#                                 build's, which mqgrad local names
#
# Cost mqgrad adds per iteration (medians over a run's iterations after WARMUP; per iteration
# the mean over the workers, as metrics.csv holds it):
#   C worker:       encode_ms + decode_ms
#   PyTorch worker: encode_ms + decode_ms + the binding's own time (MQGRAD_PROFILE, set for
#                   these runs: mqgrad.torch's Python code outside the library's calls: the
#                   round's set-up and zeroing in rounds(), zero_grad(), step()'s checks) + the
#                   hand-offs between the Python thread and the library's worker thread
#                   (mqgrad_push's wall time - encode - wait - decode, plus libmqgrad's compute_ms -
#                   the Python span from the Step to mqgrad_push; an upper bound: it counts the
#                   PUSH message's delivery twice).
# Left out on both sides: the model's forward and backward (compute_ms) and the wait for the
# servers (wait_ms).
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}

if [ "${1:-}" = --summarize ]; then
    [ $# -eq 2 ] || { echo "usage: $0 --summarize OUT_DIR" >&2; exit 2; }
    exec "$PYTHON" "$here/bench/torch_overhead.py" "$2"
fi

MQGRAD=${MQGRAD:-$here/build/tools/mqgrad}
POLICIES=${POLICIES:-"fixed:4 none"}
REPS=${REPS:-5}
WORKERS=${WORKERS:-2}
ITERS=${ITERS:-15}
WARMUP=${WARMUP:-3}
BATCH=${BATCH:-32}
SEED=${SEED:-1}
DEADLINE=${DEADLINE:-600}

[ -x "$MQGRAD" ] || { echo "torch_overhead.sh: $MQGRAD is not executable (build first, or set MQGRAD)" >&2; exit 2; }
"$PYTHON" -c 'import torch, numpy' 2>/dev/null ||
    { echo "SKIP: $PYTHON has no torch (apt-get install python3-torch)"; exit 0; }
[ "$ITERS" -gt "$WARMUP" ] || { echo "torch_overhead.sh: ITERS must exceed WARMUP" >&2; exit 2; }

out=${1:-/tmp/mqgrad-torch-overhead-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
cat >"$out/env" <<EOF
POLICIES="$POLICIES"; REPS="$REPS"; WORKERS="$WORKERS"; ITERS="$ITERS"; WARMUP="$WARMUP"; BATCH="$BATCH"; SEED="$SEED"
TORCH_PYTHONPATH="${TORCH_PYTHONPATH:-}"
EOF

# run KIND POLICY REP: one `mqgrad local` run into $out/KIND-POLICY-REP (KIND c or torch).
run() {
    local kind=$1 pol=$2 rep=$3 dir exec=() rc
    dir=$out/$kind-${pol//:/}-$rep
    rm -rf "$dir" "$dir.log"
    if [ "$kind" = torch ]; then
        if [ -n "${TORCH_PYTHONPATH:-}" ]; then
            exec=(--worker-exec "env PYTHONPATH=$TORCH_PYTHONPATH $PYTHON $here/examples/torch/paper_cnn.py")
        else
            exec=(--worker-exec "$PYTHON $here/examples/torch/paper_cnn.py")
        fi
    fi
    # MQGRAD_PROFILE reaches the PyTorch workers (mqgrad local passes its environment on);
    # the C workers do not read it. One thread each side: --threads 1 sets the C worker's
    # OpenBLAS and PyTorch's own threads (MQGRAD_THREADS), not the OpenBLAS that Debian's
    # PyTorch calls for its products, which would start a thread per core: hence the variable.
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MQGRAD_PROFILE=$dir/profile \
        timeout -k 10 "$DEADLINE" "$MQGRAD" local --model paper \
        --workers "$WORKERS" --policy "$pol" --iterations "$ITERS" --batch "$BATCH" --seed "$SEED" \
        --eval-every 0 --final-eval-limit 100 --threads 1 --insecure --checkpoint-every 0 \
        --restarts 0 --quiet --run-dir "$dir" "${exec[@]}" >"$dir.log" 2>&1
    rc=$?
    [ $rc = 0 ] || echo "  $kind $pol rep $rep: exit $rc (see $dir.log)" >&2
    return 0
}

echo "torch_overhead.sh: runs in $out; paper model, $WORKERS workers, policies $POLICIES, $REPS pairs each, $ITERS iterations ($WARMUP warm-up)"
echo "  start $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), $(git -C "$here" rev-parse --short HEAD 2>/dev/null)"
for rep in $(seq 1 "$REPS"); do
    for pol in $POLICIES; do
        if [ $((rep % 2)) = 1 ]; then order="c torch"; else order="torch c"; fi
        for kind in $order; do
            start=$(date +%s)
            run "$kind" "$pol" "$rep"
            echo "  rep $rep $pol $kind: $(($(date +%s) - start)) s, load $(cut -d' ' -f1 /proc/loadavg)"
        done
    done
done
echo "  end $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
exec "$PYTHON" "$here/bench/torch_overhead.py" "$out"
