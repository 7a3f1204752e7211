#!/usr/bin/env bash
# e2e 4: the same docker-compose.yml deploys as a stack on a single-node swarm
# (`docker stack deploy --resolve-image never`): every service converges and the run
# completes. Leaves the swarm afterwards only if this test created it.
source "$(dirname "$0")/lib.sh"
e2e_begin swarm "${E2E_LIMIT:-1200}" "$@"

stack="mqgrad-e2e-swarm-$$"
swarm_state() { docker info -f '{{.Swarm.LocalNodeState}}'; }
if [ "$(swarm_state)" != active ]; then
    e2e_log "initialising a single-node swarm"
    docker swarm init --advertise-addr "${E2E_SWARM_ADDR:-127.0.0.1}" >"$E2E_TMP/swarm.log" 2>&1 \
        || { cat "$E2E_TMP/swarm.log" >&2; e2e_fail "docker swarm init failed"; }
    had_gwbridge=$(docker network ls -q --filter name='^docker_gwbridge$')
    leave_swarm() {
        e2e_log "leaving the swarm this test created"
        docker swarm leave --force >/dev/null 2>&1
        # swarm init made the host's docker_gwbridge network; leaving keeps it.
        [ -n "$had_gwbridge" ] || docker network rm docker_gwbridge >/dev/null 2>&1
    }
    e2e_on_cleanup leave_swarm
fi
stack_gone() {
    [ -z "$(docker ps -aq --filter "label=com.docker.stack.namespace=$stack")" ] \
        && [ -z "$(docker network ls -q --filter "label=com.docker.stack.namespace=$stack")" ]
}
remove_stack() {
    docker stack rm "$stack" >/dev/null 2>&1
    local n
    for n in $(seq 90); do stack_gone && break; sleep 1; done
    # Volumes outlive the stack: remove this stack's (the agent's state).
    docker volume ls -q --filter "label=com.docker.stack.namespace=$stack" | xargs -r docker volume rm -f >/dev/null 2>&1
}
# Registered after the swarm's, so it runs before leaving.
e2e_on_cleanup remove_stack
# On a failure, what the swarm made of each service, before the stack goes: a task that never
# started has no container for lib.sh's dump to show, only a state and an error here.
show_tasks() {
    [ "${E2E_STATUS:-0}" != 0 ] || return 0
    local s
    e2e_log "tasks of $stack (desired, current state, error) and their last logs:"
    for s in $(docker service ls -q --filter "label=com.docker.stack.namespace=$stack"); do
        docker service ps --no-trunc --format '    {{.Name}} {{.DesiredState}} | {{.CurrentState}} | {{.Error}}' "$s" >&2
        timeout 20 docker service logs --tail 20 "$s" 2>&1 | sed 's/^/      /' >&2
    done
    docker info -f '    swarm {{.Swarm.LocalNodeState}} {{.Swarm.Error}}' >&2
}
e2e_on_cleanup show_tasks

export MQGRAD_WORKERS=2
export MQGRAD_ITERATIONS="${E2E_ITERATIONS:-200}"
t0=$(date +%s)
(cd "$E2E_REPO" && docker stack deploy -c docker-compose.yml -c deploy/swarm.yml --resolve-image never "$stack") \
    >"$E2E_TMP/deploy.log" 2>&1 || { cat "$E2E_TMP/deploy.log" >&2; e2e_fail "docker stack deploy failed"; }
sed 's/^/    /' "$E2E_TMP/deploy.log" >&2

# Converged: each service has as many running tasks as it wants.
converged() {
    local line ok=1
    while read -r name replicas; do
        want=${replicas#*/}; have=${replicas%/*}
        [ "$have" = "$want" ] || ok=0
    done < <(docker service ls --filter "label=com.docker.stack.namespace=$stack" --format '{{.Name}} {{.Replicas}}')
    # scheduler, server, worker, agent, and worker-torch with no replica (MQGRAD_TORCH_WORKERS)
    [ "$(docker service ls -q --filter "label=com.docker.stack.namespace=$stack" | wc -l)" = 5 ] && [ "$ok" = 1 ]
}
e2e_wait 300 "the stack to converge" converged
e2e_log "converged in $(( $(date +%s) - t0 ))s:"
docker service ls --filter "label=com.docker.stack.namespace=$stack" --format '    {{.Name}} {{.Replicas}}' >&2

e2e_wait 300 "the first iteration" e2e_training_started
e2e_log "first iteration $(( $(date +%s) - t0 ))s after deploy"
# The agent's host-mode port answers on this node.
bits=$(curl -fsS --max-time 5 "http://127.0.0.1:$MQGRAD_HTTP_PORT/bits" | e2e_json_num bits || true)
[ -n "$bits" ] || e2e_fail "curl localhost:$MQGRAD_HTTP_PORT/bits gave no bit-width on the swarm"
e2e_log "agent on the swarm answers: $bits bits"
e2e_wait "${E2E_TRAIN_LIMIT:-900}" "the run to complete" e2e_summary_completed
e2e_log "run completed: $(e2e_iterations) iterations"

# The scheduler's task finished with 0 (restart_policy on-failure leaves it complete).
sched_done() {
    docker service ps "${stack}_scheduler" --format '{{.CurrentState}}' | head -n1 | grep -q '^Complete'
}
e2e_wait 60 "the scheduler task to complete" sched_done
