#!/usr/bin/env bash
# e2e 6: Prometheus beside the cluster (the compose profile "monitoring", deploy/prometheus).
# promtool accepts the configuration, the recording rules and their unit tests (in the image
# and from the repository); with 2 workers training, every replica of every role is a
# target that is up and reports mqgrad_build_info; scaled to 3 workers while the run trains,
# and back to 2, Prometheus follows through DNS alone; the iteration counter rises; every
# recording rule evaluates without error and gives values; the first queries of
# deploy/prometheus/README.md answer. With a bearer token set (the default here;
# E2E_MONITORING_TOKEN=0 runs without), Prometheus scrapes with it while a request without it
# is refused. The run is longer than
# the test; the teardown ends it.
source "$(dirname "$0")/lib.sh"
e2e_begin monitoring "${E2E_LIMIT:-360}" "$@"
command -v curl >/dev/null || e2e_fail "curl is needed"
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)" || e2e_fail "python3 is needed (to read Prometheus' JSON)"
export MQGRAD_PROMETHEUS_IMAGE="${MQGRAD_PROMETHEUS_IMAGE:-mqgrad-prometheus:latest}"
figure() { echo "monitoring_$1=$2" >>"${E2E_FIGURES:-/dev/null}"; e2e_log "figure: $1=$2"; }
since() { echo $(( $(date +%s) - $1 )); }

# The Prometheus image, from the repository's configuration (quick when Docker's cache has
# it: the image build itself runs promtool check config, check rules and test rules).
t0=$(date +%s)
"$E2E_REPO/deploy/build-images.sh" --prometheus-only >"$E2E_TMP/build.log" 2>&1 \
    || { tail -n 40 "$E2E_TMP/build.log" >&2; e2e_fail "deploy/build-images.sh --prometheus-only failed"; }
e2e_log "$(grep '^build-images: .*prometheus.* built' "$E2E_TMP/build.log" || echo "image $MQGRAD_PROMETHEUS_IMAGE ready")"
figure build_s "$(since "$t0")"
[ "$(docker image inspect -f '{{len .RepoDigests}}' "$MQGRAD_PROMETHEUS_IMAGE")" = 0 ] \
    || e2e_fail "$MQGRAD_PROMETHEUS_IMAGE has a registry digest: was it pulled?"
figure image_mb "$(docker image inspect -f '{{.Size}}' "$MQGRAD_PROMETHEUS_IMAGE" | awk '{ printf "%.0f", $1 / 1e6 }')"

# promtool over the repository's files, as they are now.
promtool_repo() {
    docker run --rm -v "$E2E_REPO/deploy/prometheus:/cfg:ro" -w /cfg "$MQGRAD_PROMETHEUS_IMAGE" promtool "$@"
}
promtool_repo check config prometheus.yml local.yml >"$E2E_TMP/promtool.log" 2>&1 \
    && promtool_repo check rules rules.yml >>"$E2E_TMP/promtool.log" 2>&1 \
    && promtool_repo test rules rules_test.yml >>"$E2E_TMP/promtool.log" 2>&1 \
    || { cat "$E2E_TMP/promtool.log" >&2; e2e_fail "promtool rejects deploy/prometheus"; }
e2e_log "promtool: check config, check rules, test rules pass"

# Every compose command of this test (and of the cleanup: down -v) includes the profile.
export COMPOSE_PROFILES=monitoring
# (e2e_begin chose free host ports for Prometheus and the scheduler's /metrics)
if [ "${E2E_MONITORING_TOKEN:-1}" != 0 ]; then
    MQGRAD_HTTP_TOKEN="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    export MQGRAD_HTTP_TOKEN
else
    unset MQGRAD_HTTP_TOKEN
fi
export MQGRAD_WORKERS=2 MQGRAD_SERVERS=2
export MQGRAD_ITERATIONS="${E2E_MONITORING_ITERATIONS:-100000}"
# A steady pace whatever the machine (~70 ms an iteration, as test_5's), evaluations and
# checkpoints early enough to be seen.
export MQGRAD_LINK_MBPS="${E2E_MONITORING_LINK_MBPS:-100}"
export MQGRAD_EVAL_EVERY=50 MQGRAD_CHECKPOINT_EVERY=50
PROM="http://127.0.0.1:$MQGRAD_PROMETHEUS_PORT"
e2e_log "ports: prometheus $MQGRAD_PROMETHEUS_PORT, scheduler http $MQGRAD_SCHEDULER_HTTP_PORT; token $([ -n "${MQGRAD_HTTP_TOKEN:-}" ] && echo set || echo none)"

# --- Prometheus' HTTP API -------------------------------------------------------------
# Instant query $1: one line per series, "VALUE<TAB>name{label=value,...}" (labels sorted).
prom_query() {
    curl -fsS --max-time 5 -G "$PROM/api/v1/query" --data-urlencode "query=$1" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
if d.get("status") != "success":
    sys.exit("query failed: %s" % d.get("error"))
for r in d["data"]["result"]:
    m = dict(r["metric"])
    name = m.pop("__name__", "")
    print("%s\t%s{%s}" % (r["value"][1], name, ",".join("%s=%s" % kv for kv in sorted(m.items()))))
'
}
# The value of the query's first series (nothing when it has none).
prom_value() { prom_query "$1" | head -n1 | cut -f1; }
# Succeeds when every value of the query (at least $3, default 1, of them) is finite and
# satisfies the Python condition $2 over v, e.g. "v > 0".
prom_all() {
    prom_query "$1" | cut -f1 | "$PY" -c '
import math, sys
vals = [float(x) for x in sys.stdin.read().split()]
ok = len(vals) >= int(sys.argv[2]) and all(math.isfinite(v) and eval(sys.argv[1]) for v in vals)
sys.exit(0 if ok else 1)' "$2" "${3:-1}"
}
# "ROLE COUNT" lines, sorted by role, for a query of the form "count by (role) (...)".
by_role() { prom_query "$1" | sed -E 's/^([^\t]*)\t.*role=([a-z]+).*/\2 \1/' | sort; }
# Prometheus' targets: "role instance health last-error".
targets_report() {
    curl -fsS --max-time 5 "$PROM/api/v1/targets" | "$PY" -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    print("    %s %s %s %s" % (t["labels"].get("role"), t["labels"].get("instance"), t["health"], t["lastError"]))'
}

# "agent N\nscheduler 1\nserver S\nworker W": what every query by role must find.
expected() { printf 'agent 1\nscheduler 1\nserver %s\nworker %s\n' "$MQGRAD_SERVERS" "$1"; }
# Every replica of every role is a target, up, and reports mqgrad_build_info.
all_up() {
    local want
    want="$(expected "$1")"
    [ "$(by_role 'count by (role) (up)')" = "$want" ] \
        && [ "$(by_role 'count by (role) (up == 1)')" = "$want" ] \
        && [ "$(by_role 'count by (role) (mqgrad_build_info)')" = "$want" ]
}
show_roles() {
    e2e_log "targets by role: $(by_role 'count by (role) (up)' | tr '\n' ' ')| up: $(by_role 'count by (role) (up == 1)' | tr '\n' ' ')| build_info: $(by_role 'count by (role) (mqgrad_build_info)' | tr '\n' ' ')"
}
e2e_on_cleanup '[ "$rc" = 0 ] || { show_roles 2>/dev/null; e2e_log "Prometheus targets:"; targets_report >&2 2>/dev/null; }'

# --- the cluster, with Prometheus ------------------------------------------------------
t_up=$(date +%s)
compose up -d --scale worker=2 >"$E2E_TMP/up.log" 2>&1 || { cat "$E2E_TMP/up.log" >&2; e2e_fail "compose up (profile monitoring) failed"; }
[ "$(e2e_containers prometheus | wc -l)" = 1 ] || e2e_fail "the profile did not start a prometheus container"
prom_ready() { curl -fsS --max-time 3 -o /dev/null "$PROM/-/ready"; }
e2e_wait 90 "Prometheus to be ready on 127.0.0.1:$MQGRAD_PROMETHEUS_PORT" prom_ready
figure up_to_ready_s "$(since "$t_up")"
prom_id=$(e2e_containers prometheus)
[ "$(docker inspect -f '{{.Config.User}}' "$prom_id")" != root ] && [ "$(docker exec "$prom_id" id -u)" != 0 ] \
    || e2e_fail "Prometheus runs as root"
docker exec "$prom_id" promtool check config /etc/prometheus/prometheus.yml >"$E2E_TMP/promtool-in.log" 2>&1 \
    && docker exec "$prom_id" promtool check rules /etc/prometheus/rules.yml >>"$E2E_TMP/promtool-in.log" 2>&1 \
    || { cat "$E2E_TMP/promtool-in.log" >&2; e2e_fail "promtool in the running container rejects its configuration"; }
e2e_wait 300 "the first iteration" e2e_training_started
figure up_to_first_iteration_s "$(since "$t_up")"

e2e_wait 90 "every replica to be scraped: $(expected 2 | tr '\n' ' ')" all_up 2
show_roles
figure up_to_all_scraped_s "$(since "$t_up")"
prom_query 'mqgrad_build_info' | sed 's/^/    /' >&2
[ -z "$(prom_query '{exported_role!=""}' | head -n1)" ] || e2e_fail "series with an exported_role label remain"

# The scheduler's /metrics on this host's loopback (for `mqgrad top`), and the token.
sched="http://127.0.0.1:$MQGRAD_SCHEDULER_HTTP_PORT"
code() { curl -s -o /dev/null --max-time 5 -w '%{http_code}' "$@"; }
[ "$(code "$sched/healthz")" = 200 ] || e2e_fail "the scheduler's /healthz on 127.0.0.1:$MQGRAD_SCHEDULER_HTTP_PORT: $(code "$sched/healthz")"
if [ -n "${MQGRAD_HTTP_TOKEN:-}" ]; then
    [ "$(code "$sched/metrics")" = 401 ] || e2e_fail "the scheduler's /metrics without the token: $(code "$sched/metrics"), expected 401"
    [ "$(code -H "Authorization: Bearer $MQGRAD_HTTP_TOKEN" "$sched/metrics")" = 200 ] \
        || e2e_fail "the scheduler's /metrics with the token was refused"
    e2e_log "token: /metrics refuses a request without it (401); Prometheus scrapes every target with it"
else
    [ "$(code "$sched/metrics")" = 200 ] || e2e_fail "the scheduler's /metrics: $(code "$sched/metrics")"
fi

# The iteration counter rises, as Prometheus sees it.
it1=$(prom_value 'max(mqgrad_scheduler_iterations_total)')
[ -n "$it1" ] || e2e_fail "no mqgrad_scheduler_iterations_total in Prometheus"
rose() { local v; v=$(prom_value 'max(mqgrad_scheduler_iterations_total)') && "$PY" -c 'import sys; sys.exit(float(sys.argv[1]) <= float(sys.argv[2]))' "$v" "$it1"; }
e2e_wait 30 "mqgrad_scheduler_iterations_total to rise from $it1" rose
e2e_log "mqgrad_scheduler_iterations_total: $it1 -> $(prom_value 'max(mqgrad_scheduler_iterations_total)') (metrics.csv: $(e2e_iterations) rows)"
e2e_wait 30 "increase(mqgrad_scheduler_iterations_total[1m]) > 0" \
    prom_all 'sum(increase(mqgrad_scheduler_iterations_total[1m]))' 'v > 0'

# A third worker while the run trains: scraped with no change anywhere; then back to two.
t0=$(date +%s)
compose up -d --scale worker=3 >"$E2E_TMP/up3.log" 2>&1 || { cat "$E2E_TMP/up3.log" >&2; e2e_fail "compose up --scale worker=3 failed"; }
e2e_wait 60 "the third worker to be scraped: $(expected 3 | tr '\n' ' ')" all_up 3
figure scale_up_to_scraped_s "$(since "$t0")"
e2e_wait 60 "mqgrad_scheduler_workers to read 3" prom_all 'max(mqgrad_scheduler_workers)' 'v == 3'
show_roles

# --- the recording rules: each evaluates without error and gives values ------------------
rules_ok() {
    curl -fsS --max-time 5 "$PROM/api/v1/rules" | "$PY" -c '
import json, sys
rules = [r for g in json.load(sys.stdin)["data"]["groups"] for r in g["rules"]]
bad = ["%s: %s %s" % (r["name"], r["health"], r.get("lastError", "")) for r in rules if r["health"] != "ok"]
print("%d rules, %d not ok" % (len(rules), len(bad)))
for b in bad: print("    " + b)
sys.exit(1 if bad or not rules else 0)'
}
e2e_wait 30 "every recording rule to evaluate" rules_ok >/dev/null
e2e_log "rules: $(rules_ok | head -n1)"
check_rule() {   # EXPR CONDITION [MIN_SERIES]
    e2e_wait 60 "$1 to give values with $2 (at least ${3:-1} series)" prom_all "$1" "$2" "${3:-1}"
    e2e_log "  $1 = $(prom_query "$1" | cut -f1 | "$PY" -c '
import sys
v = sys.stdin.read().split()
print(" ".join(v) if len(v) <= 6 else "%d series, %s to %s" % (len(v), min(v, key=float), max(v, key=float)))')"
}
check_rule 'mqgrad:iterations:rate1m' 'v > 0'
check_rule 'mqgrad:pushed_bytes:rate1m' 'v > 0'
check_rule 'mqgrad:pushed_bytes_per_iteration:rate1m' 'v > 0'
check_rule 'mqgrad:fp32_pushed_bytes_per_iteration:avg1m' 'v > 0'
check_rule 'mqgrad:pushed_bytes_vs_fp32:ratio1m' '0 < v < 2'
check_rule 'mqgrad:checkpoint_age:seconds' 'v >= 0'
check_rule 'mqgrad:iteration_seconds:p50_1m' 'v > 0'
check_rule 'mqgrad:iteration_seconds:p90_1m' 'v > 0'
check_rule 'mqgrad:worker_pushed_bytes_per_iteration:rate1m' 'v > 0' 3
check_rule 'mqgrad:worker_pushed_bytes_vs_fp32:ratio1m' '0 < v < 2' 3
check_rule 'mqgrad:worker_phase_seconds:mean1m{phase="compute"}' 'v > 0'
check_rule 'mqgrad:worker_phase_seconds:p50_1m{phase="compute"}' 'v > 0'
check_rule 'mqgrad:worker_phase_seconds:p90_1m{phase="compute"}' 'v > 0'
check_rule 'mqgrad:worker_phase_seconds:share1m' '0 <= v <= 1' 2
check_rule 'abs(sum(mqgrad:worker_phase_seconds:share1m) - 1)' 'v < 0.001'
check_rule 'mqgrad:targets_up:sum{role="worker"}' 'v == 3'
check_rule 'mqgrad:dropped_messages:rate1m' 'v >= 0'
e2e_log "phase split (share of the workers' time): $(prom_query 'mqgrad:worker_phase_seconds:share1m' | sed -E 's/^([^\t]*)\t.*phase=([a-z]+).*/\2 \1/' | tr '\n' ' ')"

# The first queries deploy/prometheus/README.md suggests (those that are not rules above):
# each answers.
check_rule 'mqgrad_scheduler_loss' 'v >= 0'
check_rule 'mqgrad_scheduler_worker_loss' 'v >= 0' 3
check_rule 'mqgrad_scheduler_test_accuracy_ratio' '0 < v <= 1'
check_rule 'mqgrad_scheduler_bits' '1 <= v <= 32'
check_rule 'mqgrad_agent_bits' '1 <= v <= 32'
check_rule 'mqgrad_scheduler_fp32_push_bytes' 'v > 0'
# (">= 0": a phase without observations in the window would give NaN)
check_rule 'histogram_quantile(0.9, sum by (phase, le) (rate(mqgrad_worker_phase_seconds_bucket[1m]))) >= 0' 'v >= 0' 3
check_rule 'mqgrad_scheduler_worker_seconds{phase="wait"}' 'v >= 0' 3
check_rule 'sum by (role, reason) (rate({__name__=~"mqgrad_.*_dropped_messages_total"}[5m]))' 'v >= 0' 4
down=$(prom_query 'up == 0')
[ -z "$down" ] || e2e_fail "targets down: $down"

# Back to two workers: the removed one stops being a target at the next DNS refresh.
t0=$(date +%s)
compose up -d --scale worker=2 >"$E2E_TMP/up2.log" 2>&1 || { cat "$E2E_TMP/up2.log" >&2; e2e_fail "compose up --scale worker=2 failed"; }
e2e_wait 60 "Prometheus to drop the removed worker: $(expected 2 | tr '\n' ' ')" all_up 2
figure scale_down_to_dropped_s "$(since "$t0")"
show_roles
rose_again() { it1=$(prom_value 'max(mqgrad_scheduler_iterations_total)'); sleep 3; rose; }
e2e_wait 30 "training to go on with two workers" rose_again
e2e_log "training goes on: $(prom_value 'max(mqgrad_scheduler_iterations_total)') iterations (metrics.csv: $(e2e_iterations) rows)"
