#!/usr/bin/python3
"""The tables of bench/torch_overhead.sh: what mqgrad adds per iteration to a PyTorch worker's
step against a C worker's, from runs already made (OUT_DIR/{c,torch}-POLICY-REP/).

    bench/torch_overhead.py OUT_DIR

Per run, per iteration after WARMUP: metrics.csv's per-worker means (compute_ms, encode_ms,
wait_ms, decode_ms) and, for PyTorch workers, the mean over the workers of their
MQGRAD_PROFILE lines (python/mqgrad/torch.py, _Profile) for that iteration. Each run gives
the median over its iterations of every column; a pair (C and PyTorch runs of one policy in
one repetition) gives the ratio of their costs; the table shows medians over the pairs and
(min-max). Standard library only.
"""
import csv
import glob
import os
import statistics
import sys

PROF_FIELDS = ("next", "pre", "zero", "check", "push", "post", "span")


def env(out):
    e = {"POLICIES": "fixed:4 none", "REPS": "5", "WORKERS": "2", "ITERS": "15",
         "WARMUP": "3"}
    try:
        with open(os.path.join(out, "env")) as f:
            for part in f.read().replace("\n", ";").split(";"):
                if "=" in part:
                    k, v = part.strip().split("=", 1)
                    e[k] = v.strip().strip('"')
    except OSError:
        pass
    return e


def metrics(path, warmup):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            it = int(r["iter"])
            if it >= warmup:
                rows[it] = dict((k, float(r[k])) for k in
                                ("compute_ms", "encode_ms", "wait_ms", "decode_ms"))
    return rows


def profile(run_dir):
    """iteration -> mean over the workers of each profile field (only iterations every
    worker's file has)."""
    per_rank = []
    for path in sorted(glob.glob(os.path.join(run_dir, "profile.*"))):
        d = {}
        with open(path) as f:
            for line in f:
                v = line.split()
                if len(v) == 1 + len(PROF_FIELDS):
                    d[int(v[0])] = [float(x) for x in v[1:]]
        per_rank.append(d)
    if not per_rank:
        return {}
    its = set(per_rank[0])
    for d in per_rank[1:]:
        its &= set(d)
    return dict((it, dict(zip(PROF_FIELDS, [sum(d[it][i] for d in per_rank) / len(per_rank)
                                            for i in range(len(PROF_FIELDS))])))
                for it in its)


def run_stats(run_dir, kind, warmup):
    """Median over the run's iterations of each quantity, or None."""
    path = os.path.join(run_dir, "metrics.csv")
    if not os.path.exists(path):
        return None
    m = metrics(path, warmup)
    p = profile(run_dir) if kind == "torch" else {}
    cols = {}
    for it, r in sorted(m.items()):
        q = dict(r)
        q["iter_ms"] = None
        q["codec"] = r["encode_ms"] + r["decode_ms"]
        if kind == "torch":
            if it not in p:
                continue
            pr = p[it]
            q["rounds"] = pr["pre"] + pr["post"]   # set-up and zeroing, loop checks
            q["zero_grad"] = pr["zero"]
            q["step_checks"] = pr["check"]
            q["handoff"] = (pr["push"] - r["encode_ms"] - r["wait_ms"] - r["decode_ms"]) + \
                (r["compute_ms"] - pr["span"])
            q["binding"] = q["rounds"] + q["zero_grad"] + q["step_checks"] + q["handoff"]
            q["model"] = pr["span"] - pr["pre"] - pr["zero"] - pr["check"]
        else:
            q["binding"] = 0.0
        q["cost"] = q["codec"] + q["binding"]
        for k, v in q.items():
            if v is not None:
                cols.setdefault(k, []).append(v)
    if not cols:
        return None
    s = dict((k, statistics.median(v)) for k, v in cols.items())
    s["n"] = len(cols["cost"])
    # iteration time: steps of train_time_s
    with open(path) as f:
        t = [(int(r["iter"]), float(r["train_time_s"])) for r in csv.DictReader(f)]
    steps = [(b[1] - a[1]) * 1e3 for a, b in zip(t, t[1:]) if a[0] + 1 >= warmup]
    s["iter_ms"] = statistics.median(steps) if steps else float("nan")
    return s


def fmt(v):
    if not v:
        return "-"
    med = statistics.median(v)
    if len(v) == 1:
        return "%.1f" % med
    return "%.1f (%.1f-%.1f)" % (med, min(v), max(v))


def fmt_ratio(v):
    if not v:
        return "-"
    return "%.2fx (%.2f-%.2f)" % (statistics.median(v), min(v), max(v))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torch_overhead.py OUT_DIR")
    out = sys.argv[1]
    e = env(out)
    warmup = int(e["WARMUP"])
    print("paper model, %s workers, %s iterations a run (%d warm-up left out); medians over the "
          "repetitions, (min-max); ms per iteration, per worker" % (e["WORKERS"], e["ITERS"],
                                                                   warmup))
    for pol in e["POLICIES"].split():
        tag = pol.replace(":", "")
        label = "fp32 (--policy none)" if pol == "none" else pol
        pairs = []
        for rep in range(1, int(e["REPS"]) + 1):
            c = run_stats(os.path.join(out, "c-%s-%d" % (tag, rep)), "c", warmup)
            t = run_stats(os.path.join(out, "torch-%s-%d" % (tag, rep)), "torch", warmup)
            if c and t:
                pairs.append((c, t))
        print()
        print("## %s: %d pairs" % (label, len(pairs)))
        if not pairs:
            continue
        print()
        print("| worker | iter ms | compute ms | wait ms | encode ms | decode ms | rounds() ms | "
              "zero_grad ms | step checks ms | hand-offs ms | cost mqgrad adds ms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, idx in (("C (mqgrad-worker)", 0), ("PyTorch (paper_cnn.py)", 1)):
            col = lambda k: [p[idx][k] for p in pairs if k in p[idx]]  # noqa: E731
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, fmt(col("iter_ms")), fmt(col("compute_ms")), fmt(col("wait_ms")),
                fmt(col("encode_ms")), fmt(col("decode_ms")), fmt(col("rounds")),
                fmt(col("zero_grad")), fmt(col("step_checks")), fmt(col("handoff")),
                fmt(col("cost"))))
        ratio = [t["cost"] / c["cost"] for c, t in pairs]
        ratio_codec = [t["codec"] / c["codec"] for c, t in pairs]
        ratio_nozero = [(t["cost"] - t["rounds"]) / c["cost"] for c, t in pairs]
        print()
        print("cost ratio PyTorch / C, pair by pair: %s; encode + decode alone: %s; without "
              "rounds() (the zeroing a PyTorch step's zero_grad() does too): %s"
              % (fmt_ratio(ratio), fmt_ratio(ratio_codec), fmt_ratio(ratio_nozero)))
        print("(PyTorch's forward + backward in its compute: %s ms)"
              % fmt([t["model"] for _, t in pairs]))


if __name__ == "__main__":
    main()
