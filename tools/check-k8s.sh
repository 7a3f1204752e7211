#!/usr/bin/env bash
# Checks the Kubernetes manifests (deploy/k8s) offline: renders them with kustomize (Debian
# 12's kubectl 1.20, whose kustomize is the oldest a user has, and the kubectl on PATH when
# that is another), validates every document against the Kubernetes API schemas with
# unknown fields refused, and asserts the project's own rules (non-root, probes, resources,
# keys by role, metrics ports, ...). Also renders an overlay like deploy/README.md's.
# Installs what is missing once (a kubectl, a Python venv under the cache), then needs no
# network. Fails if anything does not hold.
#   tools/check-k8s.sh               the check
#   tools/check-k8s.sh --self-test   the check, then broken copies it must reject
# MQGRAD_K8S_VERSIONS (default "1.25.0 1.37.0"): the API versions validated against.
# MQGRAD_KUBECTL="PATH ...": the kubectls to render with, instead of finding them.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
src="$repo/deploy/k8s"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/mqgrad"
venv="$cache/k8s-venv"
validator_version=1.37.0
versions="${MQGRAD_K8S_VERSIONS:-1.25.0 1.37.0}"
self_test=0
case "${1:-}" in
    "") ;;
    --self-test) self_test=1 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [--self-test]" >&2; exit 2 ;;
esac
t0=$SECONDS
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=0
apt_update() {
    [ "$apt_updated" = 1 ] && return 0
    $sudo apt-get update -q >/dev/null
    apt_updated=1
}

# ---- what it needs -------------------------------------------------------------------

ensure_venv() {
    if "$venv/bin/python" -c "import sys, kubernetes_validate.version as v
sys.exit(v.__version__ != '$validator_version')" 2>/dev/null; then
        return 0
    fi
    echo "check-k8s: installing the schema validator ($validator_version) into $venv"
    if ! /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null; then
        apt_update
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q python3-venv >/dev/null
    fi
    rm -rf "$venv"
    mkdir -p "$cache"
    /usr/bin/python3 -m venv "$venv"
    # Its dependencies pinned too, as first installed, so that every machine checks alike.
    "$venv/bin/pip" install -q --disable-pip-version-check \
        "kubernetes-validate==$validator_version" jsonschema==4.26.0 \
        jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
        attrs==26.1.0 PyYAML==6.0.4 packaging==26.4 importlib_resources==7.1.0 \
        typing_extensions==4.16.0
}

is_kubectl_120() {
    "$1" version --client 2>/dev/null | grep -q 'GitVersion:"v1\.20\.'
}

# Debian 12's kubectl: the one on PATH if it is that; else installed when no kubectl is
# there; else (another package owns /usr/bin/kubectl, and installing would clash with it)
# unpacked from Debian's package into the cache.
debian_kubectl() {
    local onpath unpacked="$cache/kubectl-deb12/usr/bin/kubectl"
    onpath="$(command -v kubectl || true)"
    if [ -n "$onpath" ] && is_kubectl_120 "$onpath"; then
        echo "$onpath"
    elif [ -x "$unpacked" ] && is_kubectl_120 "$unpacked"; then
        echo "$unpacked"
    elif [ -z "$onpath" ]; then
        echo "check-k8s: installing kubernetes-client (Debian 12's kubectl)" >&2
        apt_update >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q kubernetes-client >&2
        command -v kubectl
    else
        echo "check-k8s: unpacking Debian 12's kubectl into $cache (beside $onpath)" >&2
        mkdir -p "$tmp/deb" && chmod 0777 "$tmp/deb"
        if ! (cd "$tmp/deb" && apt-get download -q kubernetes-client >/dev/null 2>&1); then
            apt_update >&2
            (cd "$tmp/deb" && apt-get download -q kubernetes-client >&2)
        fi
        rm -rf "$cache/kubectl-deb12"
        mkdir -p "$cache/kubectl-deb12"
        dpkg-deb -x "$tmp"/deb/kubernetes-client_*.deb "$cache/kubectl-deb12"
        is_kubectl_120 "$unpacked" || { echo "check-k8s: $unpacked is not kubectl 1.20" >&2; return 1; }
        echo "$unpacked"
    fi
}

kubectls=()
if [ -n "${MQGRAD_KUBECTL:-}" ]; then
    read -r -a kubectls <<<"$MQGRAD_KUBECTL"
else
    deb="$(debian_kubectl)"
    kubectls+=("$deb")
    other="$(command -v kubectl || true)"
    if [ -n "$other" ] && [ "$other" != "${kubectls[0]}" ]; then
        kubectls+=("$other")
    fi
fi
ensure_venv

kubectl_name() {
    local v
    v="$("$1" version --client 2>/dev/null | grep -o 'v[0-9][0-9.]*' | head -n1 || true)"
    echo "kubectl ${v:-?}"
}

# ---- the checks ----------------------------------------------------------------------

cat >"$tmp/check.py" <<'PY'
"""Validates rendered manifests against the API schemas (strict) and the project's rules.
usage: check.py --versions "1.25.0 1.37.0" --image IMAGE LABEL=FILE...
       check.py --mutate DIR CASE       (the self-test's breakages)"""
import re
import sys

import yaml
from kubernetes_validate import utils

NS = "mqgrad"
UID = 10001
# role: workload kinds allowed, ZeroMQ port (None: binds none), HTTP port (the spec's
# container ports), where its persistent data lives.
ROLES = {
    "scheduler": (("StatefulSet", "Deployment"), 7000, 8000, "/runs"),
    "server": (("StatefulSet",), 7100, 8100, "/checkpoints"),
    "worker": (("Deployment",), None, 8300, None),
    "agent": (("StatefulSet", "Deployment"), 7200, 8200, "/state"),
}
PUBLIC = {"scheduler.key", "server.key", "worker.key", "agent.key", "operator.key"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole",
                  "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass"}


class Report:
    def __init__(self, label):
        self.label, self.passed, self.failed, self.lines = label, 0, 0, {}

    def check(self, obj, what, ok, why=""):
        if ok:
            self.passed += 1
            self.lines.setdefault(obj, []).append(what)
        else:
            self.failed += 1
            print(f"FAIL [{self.label}] {obj}: {what}{': ' + why if why else ''}")
        return ok

    def show(self):
        for obj, whats in self.lines.items():
            print(f"ok   [{self.label}] {obj}: {'; '.join(whats)}")


def base_name(name):
    """A generated object's name without kustomize's hash suffix."""
    m = re.match(r"^(.*)-[a-z0-9]{10}$", name)
    return m.group(1) if m else name


def quantity(q):
    q = str(q)
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20,
             "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", q)
    if not m or (m.group(2) and m.group(2) not in units):
        raise ValueError(f"not a quantity: {q}")
    return float(m.group(1)) * units.get(m.group(2), 1)


def effective_env(c, maps):
    """The container's environment as the service sees it: envFrom maps, then env."""
    env = {}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef")
        if ref and ref.get("name") in maps:
            env.update(maps[ref["name"]].get("data", {}))
    for e in c.get("env", []):
        env[e["name"]] = e.get("value", e.get("valueFrom"))
    return env


def referenced(spec):
    """(kind, name) of every ConfigMap and Secret a pod spec needs (optional ones aside)."""
    refs = []
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for src in c.get("envFrom", []):
            if "configMapRef" in src:
                refs.append(("ConfigMap", src["configMapRef"]["name"]))
            if "secretRef" in src:
                refs.append(("Secret", src["secretRef"]["name"]))
        for e in c.get("env", []):
            vf = e.get("valueFrom", {})
            if "configMapKeyRef" in vf and not vf["configMapKeyRef"].get("optional"):
                refs.append(("ConfigMap", vf["configMapKeyRef"]["name"]))
            if "secretKeyRef" in vf and not vf["secretKeyRef"].get("optional"):
                refs.append(("Secret", vf["secretKeyRef"]["name"]))
    for v in spec.get("volumes", []):
        if "configMap" in v:
            refs.append(("ConfigMap", v["configMap"]["name"]))
        if "secret" in v:
            refs.append(("Secret", v["secret"]["secretName"]))
        for s in v.get("projected", {}).get("sources", []):
            if "configMap" in s:
                refs.append(("ConfigMap", s["configMap"]["name"]))
            if "secret" in s:
                refs.append(("Secret", s["secret"]["name"]))
    return refs


def secrets_of_volume(v):
    if "secret" in v:
        return [v["secret"]["secretName"]]
    return [s["secret"]["name"] for s in v.get("projected", {}).get("sources", []) if "secret" in s]


def check_workload(r, role, w, docs, image):
    kinds, zport, hport, datadir = ROLES[role]
    name = f"{w['kind']}/{w['metadata']['name']}"
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    spec, tmpl = w["spec"], w["spec"]["template"]
    pod = tmpl["spec"]
    labels = tmpl.get("metadata", {}).get("labels", {})
    r.check(name, f"a {'/'.join(kinds)}", w["kind"] in kinds, f"is a {w['kind']}")
    if role in ("scheduler", "agent"):
        r.check(name, "1 replica", spec.get("replicas", 1) == 1, f"{spec.get('replicas')}")
    sel = spec.get("selector", {}).get("matchLabels", {})
    r.check(name, "selector matches its pods",
            bool(sel) and all(labels.get(k) == v for k, v in sel.items()))

    psc = pod.get("securityContext", {})
    r.check(name, f"pod non-root {UID}:{UID}, fsGroup, seccomp RuntimeDefault",
            psc.get("runAsNonRoot") is True and psc.get("runAsUser") == UID
            and psc.get("runAsGroup") == UID and psc.get("fsGroup") == UID
            and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{psc}")
    r.check(name, "no host namespaces or host paths",
            not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
            and not any("hostPath" in v for v in pod.get("volumes", [])))
    r.check(name, "no service account token, no service links",
            pod.get("automountServiceAccountToken") is False
            and pod.get("enableServiceLinks") is False)
    r.check(name, "20 s to stop after SIGTERM",
            pod.get("terminationGracePeriodSeconds", 30) >= 20)

    ann = tmpl.get("metadata", {}).get("annotations", {})
    r.check(name, f"prometheus.io annotations (port {hport})",
            ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(hport),
            f"{ann}")

    existing = {("ConfigMap", n) for n in maps} | {("Secret", n) for n in secrets}
    missing = [f"{k}/{n}" for k, n in referenced(pod) if (k, n) not in existing]
    r.check(name, "every ConfigMap and Secret it names exists", not missing, ", ".join(missing))

    containers = pod.get("containers", [])
    r.check(name, "one container", len(containers) == 1, f"{len(containers)}")
    for c in containers + pod.get("initContainers", []):
        csc = c.get("securityContext", {})
        cn = f"{name} container {c['name']}"
        uid = csc.get("runAsUser", psc.get("runAsUser"))
        r.check(cn, "non-root",
                csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True and uid not in (None, 0)
                and csc.get("runAsGroup", psc.get("runAsGroup")) not in (None, 0)
                and not csc.get("privileged"), f"uid {uid}, {csc}")
        r.check(cn, "no privilege escalation, ALL capabilities dropped, none added",
                csc.get("allowPrivilegeEscalation") is False
                and "ALL" in csc.get("capabilities", {}).get("drop", [])
                and not csc.get("capabilities", {}).get("add"), f"{csc}")
        r.check(cn, "read-only root filesystem", csc.get("readOnlyRootFilesystem") is True)
        r.check(cn, f"image {image}", c.get("image") == image, f"{c.get('image')}")
        res = c.get("resources", {})
        ok, why = True, ""
        try:
            for k in ("cpu", "memory"):
                req, lim = res["requests"][k], res["limits"][k]
                if quantity(req) > quantity(lim):
                    ok, why = False, f"{k} request {req} above its limit {lim}"
        except (KeyError, TypeError, ValueError) as e:
            ok, why = False, f"missing or bad {e}"
        r.check(cn, "cpu and memory requests and limits", ok, why)

    c = containers[0]
    cn = f"{name} container {c['name']}"
    env = effective_env(c, maps)
    r.check(cn, f"runs mqgrad-{role} under the image's entrypoint (args, no command)",
            "command" not in c and c.get("args", [None])[0] == f"mqgrad-{role}",
            f"command {c.get('command')}, args {c.get('args')}")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    r.check(cn, f"MQGRAD_HTTP_PORT {hport} on container port 'metrics'",
            env.get("MQGRAD_HTTP_PORT") == str(hport) and ports.get("metrics") == hport,
            f"env {env.get('MQGRAD_HTTP_PORT')}, ports {ports}")
    if zport:
        bind = {"scheduler": "MQGRAD_SCHEDULER_BIND", "server": "MQGRAD_SERVER_BIND",
                "agent": "MQGRAD_AGENT_BIND"}[role]
        r.check(cn, f"ZeroMQ on port 'zmq' {zport}",
                ports.get("zmq") == zport and env.get(bind) == f"tcp://*:{zport}",
                f"{bind}={env.get(bind)}, ports {ports}")
        probe = ["mqgrad", "probe", f"tcp://127.0.0.1:{zport}", "--service", role]
        for p in ("readinessProbe", "livenessProbe"):
            got = c.get(p, {}).get("exec", {}).get("command")
            r.check(cn, f"{p} `{' '.join(probe)}`", got == probe, f"{got}")
    else:
        for p in ("readinessProbe", "livenessProbe"):
            g = c.get(p, {}).get("httpGet", {})
            r.check(cn, f"{p} GET /healthz on 'metrics'",
                    g.get("path") == "/healthz" and g.get("port") in ("metrics", hport), f"{g}")
    for p in ("readinessProbe", "livenessProbe"):
        pr = c.get(p, {})
        r.check(cn, f"{p} timing", pr.get("timeoutSeconds", 1) >= 3, f"{pr}")

    # Keys: the public keys and this role's secret only, where MQGRAD_KEYS/KEY say.
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    kdir = env.get("MQGRAD_KEYS")
    km = mounts.get(kdir) if isinstance(kdir, str) else None
    kvol = vols.get(km["name"]) if km else None
    r.check(cn, "MQGRAD_KEYS is a mounted volume", kvol is not None, f"MQGRAD_KEYS={kdir}")
    if kvol:
        files = {}
        for s in secrets_of_volume(kvol):
            files.update({k: base_name(s) for k in secrets.get(s, {}).get("data", {})})
        public = {k for k in files if k.endswith(".key")}
        private = {k for k in files if not k.endswith(".key")}
        r.check(cn, f"keys: the public ones and {role}.key_secret only",
                PUBLIC <= public and private == {f"{role}.key_secret"}, f"{sorted(files)}")
        r.check(cn, "keys read-only for the service's group",
                km.get("readOnly") is True
                and kvol.get("projected", kvol.get("secret", {})).get("defaultMode", 0o644) & 0o007 == 0,
                f"{kvol}")
    r.check(cn, f"MQGRAD_KEY is {kdir}/{role}.key_secret",
            env.get("MQGRAD_KEY") == f"{kdir}/{role}.key_secret", f"{env.get('MQGRAD_KEY')}")
    other = [s for v in pod.get("volumes", []) for s in secrets_of_volume(v)
             if re.fullmatch(r"mqgrad-(\w+)-key", base_name(s))
             and base_name(s) != f"mqgrad-{role}-key"]
    r.check(name, "mounts no other role's secret", not other, ", ".join(other))

    # Persistent data on a claim that outlives the pod.
    if datadir:
        m = mounts.get(datadir)
        vct = spec.get("volumeClaimTemplates")
        claims = {t.get("metadata", {}).get("name") for t in vct if isinstance(t, dict)} \
            if isinstance(vct, list) else set()
        v = vols.get(m["name"]) if m else None
        on_claim = bool(m) and (m["name"] in claims or (v is not None and "persistentVolumeClaim" in v))
        r.check(cn, f"{datadir} on a persistent volume claim", on_claim)
        if role == "server":
            r.check(name, "a volumeClaimTemplate for /checkpoints",
                    bool(m) and m["name"] in claims, f"templates {sorted(claims)}")
        var = {"scheduler": "MQGRAD_RUN_DIR", "server": "MQGRAD_CHECKPOINT_DIR",
               "agent": "MQGRAD_STATE_FILE"}[role]
        val = env.get(var)
        r.check(cn, f"{var} under {datadir}",
                isinstance(val, str) and (val == datadir or val.startswith(datadir + "/")), f"{val}")

    # Where the ZeroMQ endpoints point: the headless services' names and ports.
    if role in ("server", "worker"):
        r.check(cn, "MQGRAD_SCHEDULER is the scheduler service",
                env.get("MQGRAD_SCHEDULER") == "tcp://mqgrad-scheduler:7000",
                f"{env.get('MQGRAD_SCHEDULER')}")
    if role == "scheduler":
        r.check(cn, "MQGRAD_AGENT is the agent service",
                env.get("MQGRAD_AGENT") == "tcp://mqgrad-agent:7200", f"{env.get('MQGRAD_AGENT')}")
    if role == "server":
        adv = env.get("MQGRAD_ADVERTISE")
        pod_ip = env.get("POD_IP")
        r.check(cn, "advertises its own pod IP",
                adv is None or (adv == "tcp://$(POD_IP):7100" and isinstance(pod_ip, dict)
                                and pod_ip.get("fieldRef", {}).get("fieldPath") == "status.podIP"),
                f"MQGRAD_ADVERTISE={adv}, POD_IP={pod_ip}")

    svc = services.get(f"mqgrad-{role}")
    if r.check(name, f"Service mqgrad-{role}", svc is not None):
        s = svc["spec"]
        ssel = s.get("selector", {})
        r.check(name, "its Service selects its pods",
                bool(ssel) and all(labels.get(k) == v for k, v in ssel.items()), f"{ssel}")
        if zport:
            r.check(name, "its Service is headless (per-pod addresses for ZeroMQ)",
                    s.get("clusterIP") == "None")
        sports = {p.get("name"): (p.get("port"), p.get("targetPort")) for p in s.get("ports", [])}
        want = {"metrics": hport}
        if zport:
            want["zmq"] = zport
        r.check(name, "its Service's ports " + ", ".join(f"{k} {v}" for k, v in want.items()),
                all(sports.get(k, (None,))[0] == v and sports[k][1] in (k, v)
                    for k, v in want.items()), f"{sports}")
    if w["kind"] == "StatefulSet":
        gov = services.get(spec.get("serviceName"), {}).get("spec", {})
        r.check(name, "governed by a headless Service", gov.get("clusterIP") == "None",
                f"serviceName {spec.get('serviceName')}")
    return env


def check_docs(label, path, versions, image):
    r = Report(label)
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    r.check("render", "some documents", bool(docs))
    for d in docs:
        name = f"{d.get('kind')}/{d.get('metadata', {}).get('name')}"
        for v in versions:
            try:
                got = utils.validate(d, v, strict=True)
                r.check(name, f"schema {got} strict", True)
            except utils.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                r.check(name, f"schema {v} strict", False, f"{where}: {e.message}")
            except (utils.SchemaNotFoundError, utils.InvalidSchemaError) as e:
                r.check(name, f"schema {v} strict", False, e.message)
            except Exception as e:  # an unknown version, a document without a kind, ...
                r.check(name, f"schema {v} strict", False, f"{type(e).__name__}: {e}")
        if d.get("kind") not in CLUSTER_SCOPED:
            r.check(name, f"namespace {NS}", d.get("metadata", {}).get("namespace") == NS,
                    f"{d.get('metadata', {}).get('namespace')}")
        r.check(name, "labelled app.kubernetes.io/name=mqgrad",
                d.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/name") == "mqgrad")
    for d in docs:
        if d["kind"] == "Secret":
            held = [k for k in d.get("data", {}) if k.startswith("operator") and not k.endswith(".key")]
            r.check(f"Secret/{d['metadata']['name']}", "holds no operator secret", not held,
                    ", ".join(held))
    workloads = {d["metadata"]["name"]: d for d in docs
                 if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod")}
    envs = {}
    for role in ROLES:
        w = workloads.get(f"mqgrad-{role}")
        if r.check("workloads", f"mqgrad-{role} is there", w is not None):
            try:
                envs[role] = check_workload(r, role, w, docs, image)
            except (KeyError, IndexError, TypeError, AttributeError) as e:
                # A document too broken to walk (the schema check says where).
                r.check(f"{w.get('kind')}/mqgrad-{role}", "well-formed enough to check", False,
                        f"{type(e).__name__}: {e}")
    for n in workloads:
        r.check("workloads", f"{n} is one of the four roles", n in {f"mqgrad-{x}" for x in ROLES})
    if {"scheduler", "server", "worker"} <= envs.keys():
        run = envs["scheduler"]
        for k in ("MQGRAD_ITERATIONS", "MQGRAD_MODEL", "MQGRAD_WORKERS", "MQGRAD_SERVERS"):
            r.check("run settings", f"{k} set", k in run)
        servers = workloads["mqgrad-server"]["spec"].get("replicas", 1)
        workers = workloads["mqgrad-worker"]["spec"].get("replicas", 1)
        r.check("run settings", f"MQGRAD_SERVERS = server replicas ({servers})",
                str(run.get("MQGRAD_SERVERS")) == str(servers), f"{run.get('MQGRAD_SERVERS')}")
        r.check("run settings", f"MQGRAD_WORKERS <= worker replicas ({workers})",
                str(run.get("MQGRAD_WORKERS", "")).isdigit()
                and int(run["MQGRAD_WORKERS"]) <= int(workers), f"{run.get('MQGRAD_WORKERS')}")
    r.show()
    print(f"     [{label}] {len(docs)} documents: {r.passed} checks passed, {r.failed} failed")
    return r


# ---- the self-test's breakages: each must make the check fail, for the reason given ----

def _load(d, f):
    with open(f"{d}/{f}") as fh:
        return [x for x in yaml.safe_load_all(fh) if x]


def _save(d, f, docs):
    with open(f"{d}/{f}", "w") as fh:
        yaml.safe_dump_all(docs, fh, sort_keys=False)


def _edit(d, f, kind, fn):
    docs = _load(d, f)
    for x in docs:
        if x["kind"] == kind:
            fn(x, x.get("spec", {}).get("template", {}).get("spec", {}))
    _save(d, f, docs)


def _ctr(pod):
    return pod["containers"][0]


def _foreign_secret(w, pod):
    pod["volumes"][0]["projected"]["sources"].append({"secret": {"name": "mqgrad-server-key"}})


def _worker_statefulset(w, pod):
    w["kind"] = "StatefulSet"
    w["spec"]["serviceName"] = "mqgrad-worker"


def _kustomize_field(d):
    with open(f"{d}/kustomization.yaml", "a") as fh:
        fh.write("labels:\n  - pairs:\n      team: ml\n")


def _http_port(w, pod):
    for e in _ctr(pod)["env"]:
        if e["name"] == "MQGRAD_HTTP_PORT":
            e["value"] = "9000"


def _servers_mismatch(w, pod):
    w["spec"]["replicas"] = 3


MUTATIONS = {
    # name: (what it breaks, expected failure text, edit)
    "unknown-field": ("an unknown field in a container", "was unexpected",
                      lambda d: _edit(d, "worker.yaml", "Deployment",
                                      lambda w, p: _ctr(p).update(bogusField=True))),
    "root-container": ("a container running as root", "non-root",
                       lambda d: _edit(d, "scheduler.yaml", "StatefulSet",
                                       lambda w, p: _ctr(p)["securityContext"].update(runAsUser=0))),
    "privilege-escalation": ("privilege escalation allowed", "no privilege escalation",
                             lambda d: _edit(d, "agent.yaml", "StatefulSet",
                                             lambda w, p: _ctr(p)["securityContext"].update(
                                                 allowPrivilegeEscalation=True))),
    "writable-root": ("a writable root filesystem", "read-only root filesystem",
                      lambda d: _edit(d, "server.yaml", "StatefulSet",
                                      lambda w, p: _ctr(p)["securityContext"].pop(
                                          "readOnlyRootFilesystem"))),
    "no-liveness": ("a server without a liveness probe", "livenessProbe",
                    lambda d: _edit(d, "server.yaml", "StatefulSet",
                                    lambda w, p: _ctr(p).pop("livenessProbe"))),
    "no-limits": ("a worker without limits", "requests and limits",
                  lambda d: _edit(d, "worker.yaml", "Deployment",
                                  lambda w, p: _ctr(p)["resources"].pop("limits"))),
    "metrics-port": ("the scheduler's metrics on another port than the spec's", "MQGRAD_HTTP_PORT 8000",
                     lambda d: _edit(d, "scheduler.yaml", "StatefulSet", _http_port)),
    "foreign-secret": ("a worker mounting the servers' secret key", "another role's secret|key_secret only",
                       lambda d: _edit(d, "worker.yaml", "Deployment", _foreign_secret)),
    "worker-statefulset": ("workers as a StatefulSet", "a Deployment",
                           lambda d: _edit(d, "worker.yaml", "Deployment", _worker_statefulset)),
    "server-no-claim": ("servers without a volumeClaimTemplate", "a volumeClaimTemplate for /checkpoints",
                        lambda d: _edit(d, "server.yaml", "StatefulSet",
                                        lambda w, p: w["spec"].pop("volumeClaimTemplates"))),
    "tini-replaced": ("command overriding the image's entrypoint", "args, no command",
                      lambda d: _edit(d, "agent.yaml", "StatefulSet",
                                      lambda w, p: _ctr(p).update(command=_ctr(p).pop("args")))),
    "dangling-map": ("a ConfigMap name that does not exist", "exists",
                     lambda d: _edit(d, "worker.yaml", "Deployment",
                                     lambda w, p: _ctr(p)["envFrom"][0]["configMapRef"].update(
                                         name="mqgrad-nothing"))),
    "servers-mismatch": ("server replicas other than MQGRAD_SERVERS", "MQGRAD_SERVERS =",
                         lambda d: _edit(d, "server.yaml", "StatefulSet", _servers_mismatch)),
    "new-kustomize-field": ("a kustomization field Debian 12's kubectl does not know", "unknown field",
                            _kustomize_field),
}


def main(argv):
    if argv[:1] == ["--list"]:
        for k, (what, expect, _) in MUTATIONS.items():
            print(f"{k}\t{expect}\t{what}")
        return 0
    if argv[:1] == ["--mutate"]:
        MUTATIONS[argv[2]][2](argv[1])
        return 0
    versions, image, renders = ["1.37.0"], "mqgrad:latest", []
    i = 0
    while i < len(argv):
        if argv[i] == "--versions":
            versions, i = argv[i + 1].split(), i + 2
        elif argv[i] == "--image":
            image, i = argv[i + 1], i + 2
        else:
            renders.append(argv[i].split("=", 1))
            i += 1
    known = [utils.major_minor(v) for v in utils.all_versions()]
    for v in versions:
        if utils.major_minor(v) not in known:
            print(f"FAIL no schemas for Kubernetes {v} here (there are {known[0]} to {known[-1]})")
            return 2
    passed = failed = 0
    for label, path in renders:
        r = check_docs(label, path, versions, image)
        passed, failed = passed + r.passed, failed + r.failed
    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failed or not renders else 0


sys.exit(main(sys.argv[1:]))
PY
py() { "$venv/bin/python" "$tmp/check.py" "$@"; }

# A copy of the manifests without any real keys, with placeholder key files for the
# secretGenerator (their contents only become base64 in the rendered Secrets).
copy_tree() {
    local from="$1" to="$2" f
    mkdir -p "$to/keys"
    for f in "$from"/* "$from"/.[!.]*; do
        [ -e "$f" ] && [ "$(basename "$f")" != keys ] && cp -r "$f" "$to/"
    done
    for f in scheduler server worker agent operator; do
        echo "placeholder public key of $f (rendering only)" >"$to/keys/$f.key"
    done
    for f in scheduler server worker agent; do
        echo "placeholder secret key of $f (rendering only)" >"$to/keys/$f.key_secret"
    done
}

# An overlay as deploy/README.md shows one: another registry and tag, a bigger run. Its
# own namespace line matters: without it, Debian 12's kubectl leaves the merged map in no
# namespace (so in kubectl's current one, away from the pods that need it).
write_overlay() {
    local dir="$1" base="$2"
    mkdir -p "$dir"
    cat >"$dir/kustomization.yaml" <<EOF
namespace: mqgrad
bases:
  - $base
images:
  - name: mqgrad
    newName: registry.example.com/ml/mqgrad
    newTag: "2026.11"
configMapGenerator:
  - name: mqgrad-run
    behavior: merge
    literals:
      - MQGRAD_MODEL=paper
      - MQGRAD_ITERATIONS=1000
      - MQGRAD_WORKERS=4
      - MQGRAD_SERVERS=4
patchesStrategicMerge:
  - replicas.yaml
EOF
    cat >"$dir/replicas.yaml" <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: mqgrad-worker
spec:
  replicas: 4
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: mqgrad-server
spec:
  replicas: 4
EOF
}

# Renders DIR with every kubectl into OUT.N.yaml, and writes check.py's LABEL=FILE
# arguments to OUT.args. Kustomize's deprecation notes (newer kubectls on the old fields
# kept for Debian 12's) are left out; any other message is shown.
render_all() {
    local dir="$1" out="$2" suffix="$3" i=0 k
    : >"$out.args"
    for k in "${kubectls[@]}"; do
        i=$((i + 1))
        if ! "$k" kustomize "$dir" >"$out.$i.yaml" 2>"$out.$i.err"; then
            echo "FAIL [$(kubectl_name "$k")] kubectl kustomize $dir:"
            grep -v 'is deprecated' "$out.$i.err" || true
            return 1
        fi
        grep -v 'is deprecated' "$out.$i.err" >&2 || true
        echo "$(kubectl_name "$k")$suffix=$out.$i.yaml" >>"$out.args"
    done
}

# The whole check of the manifests in FROM (a tree like deploy/k8s), in WORK; 0 if all holds.
check_tree() {
    local from="$1" work="$2" args
    copy_tree "$from" "$work/k8s"
    write_overlay "$work/overlay" ../k8s
    render_all "$work/k8s" "$work/base" "" || return 1
    mapfile -t args <"$work/base.args"
    py --versions "$versions" --image mqgrad:latest "${args[@]}" || return 1
    render_all "$work/overlay" "$work/overlay" ", overlay" || return 1
    mapfile -t args <"$work/overlay.args"
    py --versions "$versions" --image registry.example.com/ml/mqgrad:2026.11 "${args[@]}" || return 1
}

echo "check-k8s: rendering $src with: $(for k in "${kubectls[@]}"; do printf '%s (%s)  ' "$(kubectl_name "$k")" "$k"; done)"
echo "check-k8s: schemas of Kubernetes $versions, unknown fields refused"
check_tree "$src" "$tmp/main"
echo "check-k8s: deploy/k8s and an overlay of it pass ($((SECONDS - t0)) s)"

[ "$self_test" = 1 ] || exit 0

# ---- self-test: every breakage must be caught, for its reason -------------------------
pass=0 fail=0
while IFS=$'\t' read -r case expect what; do
    work="$tmp/case-$case"
    mkdir -p "$work"
    copy_tree "$src" "$work/src"
    py --mutate "$work/src" "$case"
    if check_tree "$work/src" "$work" >"$work.log" 2>&1; then
        echo "FAIL self-test $case ($what): the check passed"
        fail=$((fail + 1))
    elif ! grep -E '^(FAIL|Error)' "$work.log" | grep -Eq -- "$expect"; then
        echo "FAIL self-test $case ($what): rejected, but not for that (no /$expect/):"
        grep -E 'FAIL|Error' "$work.log" | head -n 5
        fail=$((fail + 1))
    else
        echo "ok   self-test $case: $what is rejected: $(grep -E '^(FAIL|Error)' "$work.log" | grep -E -m1 -- "$expect" | cut -c1-150)"
        pass=$((pass + 1))
    fi
done < <(py --list)
echo "self-test: $pass passed, $fail failed ($((SECONDS - t0)) s in all)"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
