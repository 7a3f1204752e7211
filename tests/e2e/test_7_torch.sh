#!/usr/bin/env bash
# e2e 7: PyTorch workers (the compose profile "torch", deploy/torch). The image builds with no
# pull; a user's script directory (a copy of examples/torch, the script renamed) is mounted
# read-only; 2 worker-torch replicas and no C worker train the built-in model "paper" with the
# paper's CNN in PyTorch and one server to the end: summary.json "completed" with every
# iteration and a final test accuracy far above chance; the torch workers run as uid 10001 on
# a read-only root, and every worker, server and the scheduler exits 0.
source "$(dirname "$0")/lib.sh"
e2e_begin torch "${E2E_LIMIT:-900}" "$@"
export MQGRAD_TORCH_IMAGE="${MQGRAD_TORCH_IMAGE:-mqgrad-torch:latest}"
figure() { echo "torch_$1=$2" >>"${E2E_FIGURES:-/dev/null}"; e2e_log "figure: $1=$2"; }
since() { echo $(( $(date +%s) - $1 )); }

# The image: tests/e2e/run.sh builds it with the others; alone, this test builds it (quick
# when Docker's cache has it).
if [ -z "${E2E_SKIP_BUILD:-}" ] || ! docker image inspect "$MQGRAD_TORCH_IMAGE" >/dev/null 2>&1; then
    t0=$(date +%s)
    "$E2E_REPO/deploy/build-images.sh" --torch-only --torch-tag "$MQGRAD_TORCH_IMAGE" >"$E2E_TMP/build.log" 2>&1 \
        || { tail -n 40 "$E2E_TMP/build.log" >&2; e2e_fail "deploy/build-images.sh --torch-only failed"; }
    e2e_log "$(grep '^build-images: .*torch.* built' "$E2E_TMP/build.log" || echo "image $MQGRAD_TORCH_IMAGE ready")"
    figure build_s "$(since "$t0")"
fi
[ "$(docker image inspect -f '{{len .RepoDigests}}' "$MQGRAD_TORCH_IMAGE")" = 0 ] \
    || e2e_fail "$MQGRAD_TORCH_IMAGE has a registry digest: was it pulled?"
figure image_mb "$(docker image inspect -f '{{.Size}}' "$MQGRAD_TORCH_IMAGE" | awk '{ printf "%.0f", $1 / 1e6 }')"

# A user's script directory: the example under another name, beside the module it imports.
export MQGRAD_TORCH_DIR="$E2E_TMP/torch-script"
mkdir -p "$MQGRAD_TORCH_DIR"
cp "$E2E_REPO/examples/torch/paper_cnn.py" "$MQGRAD_TORCH_DIR/my_cnn.py"
cp "$E2E_REPO/examples/torch/common.py" "$MQGRAD_TORCH_DIR/"
chmod 0755 "$MQGRAD_TORCH_DIR" && chmod 0644 "$MQGRAD_TORCH_DIR"/*.py
export MQGRAD_TORCH_SCRIPT=my_cnn.py

# Every compose command of this test (and of the cleanup: down -v) includes the profile.
export COMPOSE_PROFILES=torch
export MQGRAD_MODEL=paper MQGRAD_SERVERS=1 MQGRAD_WORKERS=2 MQGRAD_TORCH_WORKERS=2
export MQGRAD_ITERATIONS="${E2E_TORCH_ITERATIONS:-60}" MQGRAD_BATCH=32
# (the scheduler's default learning rate, named: the accuracy floor below depends on it)
export MQGRAD_LR="${E2E_TORCH_LR:-0.01}"
# Only the last iteration is evaluated (on the scheduler's default share of the test set),
# and no checkpoint is taken.
export MQGRAD_EVAL_EVERY=0 MQGRAD_CHECKPOINT_EVERY=0
min_acc="${E2E_TORCH_MIN_ACC:-0.5}"

t_up=$(date +%s)
e2e_log "compose --profile torch up --scale worker=0 --scale worker-torch=2 (model paper, $MQGRAD_ITERATIONS iterations)"
compose up -d --scale worker=0 --scale worker-torch=2 >"$E2E_TMP/up.log" 2>&1 \
    || { cat "$E2E_TMP/up.log" >&2; e2e_fail "compose up (profile torch) failed"; }
[ "$(e2e_containers worker | wc -l)" = 0 ] || e2e_fail "a C worker was started"
torch_ids="$(e2e_containers worker-torch)"
[ "$(echo "$torch_ids" | grep -c .)" = 2 ] || e2e_fail "expected 2 worker-torch containers, found: $torch_ids"

# Least privilege, as every service: uid 10001, read-only root.
for id in $torch_ids; do
    [ "$(docker inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$id")" = true ] \
        || e2e_fail "worker-torch ${id:0:12} has a writable root"
    uid=$(docker exec "$id" id -u 2>&1) || e2e_fail "cannot exec in worker-torch ${id:0:12}: $uid"
    [ "$uid" = 10001 ] || e2e_fail "worker-torch ${id:0:12} runs as uid $uid"
done

e2e_wait 300 "the first iteration" e2e_training_started
figure up_to_first_iteration_s "$(since "$t_up")"
# The run's end, whatever its status (a scheduler that failed would be restarted).
e2e_wait "${E2E_TRAIN_LIMIT:-600}" "the run to end (a \"stop\" event)" e2e_event_at_least stop 1
figure up_to_completed_s "$(since "$t_up")"

read -r acc iters train_s <<<"$(e2e_check_run "$MQGRAD_ITERATIONS" "$min_acc")"
nworkers=$(e2e_json_num workers <"$E2E_RUN/summary.json" || true)
[ -z "$nworkers" ] || [ "$nworkers" = 2 ] || e2e_fail "summary.json says workers=$nworkers, expected 2"
e2e_log "summary: $(tr -d '\n' <"$E2E_RUN/summary.json" | cut -c1-300)"
figure final_test_acc "$acc"
figure train_time_s "$train_s"

# (Only the mounted directory holds my_cnn.py, and no C worker ran: the run was theirs.)
compose logs --no-color worker-torch 2>/dev/null | grep -E 'joined|test \[' | sed 's/^/    /' >&2 || true

# The scheduler told everyone to stop: the torch workers leave by themselves, with 0.
e2e_check_exits_zero
e2e_wait 60 "the torch workers to exit" bash -c '
    for id in $0; do [ "$(docker inspect -f "{{.State.Status}}" "$id")" = exited ] || exit 1; done' "$torch_ids"
for id in $torch_ids; do
    st=$(e2e_state "$id")
    [ "$st" = "exited 0" ] || e2e_fail "worker-torch container ${id:0:12} is '$st', expected 'exited 0'"
done
e2e_log "PyTorch workers trained the paper CNN: $iters iterations, final test accuracy $acc (floor $min_acc)"
