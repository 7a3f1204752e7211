#!/usr/bin/env bash
# e2e 2: while training runs, the agent's HTTP answer (curl /bits) and the CLI's
# (`compose exec agent mqgrad bits`) agree; `compose restart agent` does not stop training,
# and the agent resumes from its state volume: its MDP step does not go back to 0. With
# security on (SECURITY.md), from the host: a client without the cluster's keys gets no
# answer, a worker's key may not set the policy, the operator's key may.
source "$(dirname "$0")/lib.sh"
e2e_begin agent "${E2E_LIMIT:-1200}" "$@"
command -v curl >/dev/null || e2e_fail "curl is needed"

export MQGRAD_WORKERS=2
export MQGRAD_ITERATIONS="${E2E_AGENT_ITERATIONS:-600}"
compose up -d >"$E2E_TMP/up.log" 2>&1 || { cat "$E2E_TMP/up.log" >&2; e2e_fail "compose up failed"; }
e2e_wait 300 "the first iteration" e2e_training_started

http_bits() { curl -fsS --max-time 5 "http://127.0.0.1:$MQGRAD_HTTP_PORT/bits"; }
# The MDP step advances as the scheduler asks for decisions: wait until it has.
step_positive() { local s; s=$(http_bits | e2e_json_num step) && [ "${s:-0}" -gt 0 ]; }
e2e_wait 180 "the agent's step to pass 0" step_positive

# The bit-width may change between two questions: ask HTTP, CLI, HTTP; the CLI's answer
# must be one of the two HTTP answers around it.
agree=0
for attempt in 1 2 3 4 5; do
    h1=$(http_bits | e2e_json_num bits)
    c=$(compose exec -T agent mqgrad bits --json | e2e_json_num bits)
    h2=$(http_bits | e2e_json_num bits)
    e2e_log "bits: http $h1, cli $c, http $h2"
    [ -n "$c" ] || e2e_fail "'mqgrad bits --json' printed no \"bits\""
    if [ "$c" = "$h1" ] || [ "$c" = "$h2" ]; then agree=1; break; fi
    sleep 1
done
[ "$agree" = 1 ] || e2e_fail "curl /bits and 'mqgrad bits' never agreed"
# The plain (human) form names the same number.
plain=$(compose exec -T agent mqgrad bits)
h=$(http_bits | e2e_json_num bits)
grep -Eq "(^|[^0-9])$h([^0-9]|$)" <<<"$plain" || e2e_log "note: plain 'mqgrad bits' printed '$plain', http says $h"

cli="$E2E_REPO/${MQGRAD_BUILD_DIR:-build}/tools/mqgrad"
ep="tcp://127.0.0.1:$MQGRAD_AGENT_PORT"
if [ -x "$cli" ]; then
    out=$("$cli" bits --agent "$ep" --insecure --timeout 1500 2>&1) \
        && e2e_fail "a client without keys was answered: $out"
    grep -q "no answer" <<<"$out" || e2e_fail "a client without keys: '$out'"
    if [ -r "$MQGRAD_KEYS_DIR/worker.key_secret" ]; then
        out=$(MQGRAD_KEYS="$MQGRAD_KEYS_DIR" "$cli" policy set fixed:8 --agent "$ep" \
              --key "$MQGRAD_KEYS_DIR/worker.key_secret" 2>&1) \
            && e2e_fail "a worker's key set the policy: $out"
        grep -q "operator" <<<"$out" || e2e_fail "a worker's key: '$out'"
    fi
    e2e_log "security: no keys → no answer; a worker's key may not set the policy"
else
    e2e_log "note: no $cli on the host: the keys are checked from inside the stack only"
fi

# Restart once the step is well past what a fresh agent could reach while it restarts, so
# "not back to 0" is told apart from "started anew and caught up a little".
step_at_least() { local s; s=$(http_bits | e2e_json_num step) && [ "${s:-0}" -ge "$1" ]; }
e2e_wait 180 "the agent's step to reach 20" step_at_least 20
step_before=$(http_bits | e2e_json_num step)
iters_before=$(e2e_iterations)
restart_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
e2e_log "restarting the agent at step $step_before (iteration $iters_before)"
compose restart agent >"$E2E_TMP/restart.log" 2>&1 || { cat "$E2E_TMP/restart.log" >&2; e2e_fail "compose restart agent failed"; }
agent_id=$(e2e_containers agent | head -n1)
agent_healthy() { [ "$(docker inspect -f '{{.State.Health.Status}}' "$agent_id")" = healthy ]; }
e2e_wait 90 "the restarted agent to be healthy" agent_healthy
e2e_wait 30 "the agent's HTTP port" eval "http_bits >/dev/null"
step_after=$(http_bits | e2e_json_num step)
# The agent logs the step it resumed at: the direct evidence, whatever the training speed.
resumed=$(docker logs --since "$restart_at" "$agent_id" 2>&1 | grep -m1 -io 'resumed at step [0-9]*' | grep -Eo '[0-9]+$' || true)
e2e_log "agent back at step $step_after (log: resumed at step ${resumed:-?})"
[ -n "$step_after" ] && [ "$step_after" -gt 0 ] || e2e_fail "the agent's step went back to ${step_after:-nothing} after restart"
[ "$step_after" -ge "$step_before" ] || e2e_fail "the agent's step went back from $step_before to $step_after"
if [ -n "$resumed" ]; then
    [ "$resumed" -ge "$step_before" ] || e2e_fail "the agent resumed at step $resumed, before $step_before"
else
    e2e_log "note: no 'resumed at step' line in the agent's log; judged by the HTTP step only"
fi

more_iterations() { [ "$(e2e_iterations)" -gt "$((iters_before + 5))" ]; }
e2e_wait 180 "training to go on after the agent's restart" more_iterations
e2e_log "training goes on: $(e2e_iterations) iterations"
e2e_wait "${E2E_TRAIN_LIMIT:-900}" "the run to complete" e2e_scheduler_exited
e2e_summary_completed || e2e_fail "the run did not complete after the agent's restart"
st=$(e2e_state "$(e2e_containers scheduler | head -n1)")
[ "$st" = "exited 0" ] || e2e_fail "scheduler is '$st'"
if [ -x "$cli" ]; then
    MQGRAD_KEYS="$MQGRAD_KEYS_DIR" "$cli" policy set fixed:4 --agent "$ep" >"$E2E_TMP/op.log" 2>&1 \
        || e2e_fail "the operator's key could not set the policy: $(cat "$E2E_TMP/op.log")"
    b=$(MQGRAD_KEYS="$MQGRAD_KEYS_DIR" "$cli" bits --agent "$ep")
    [ "$b" = 4 ] || e2e_fail "after the operator's 'policy set fixed:4' the agent says $b bits"
    e2e_log "security: the operator's key set the policy (fixed:4)"
fi
