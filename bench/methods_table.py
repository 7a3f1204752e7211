#!/usr/bin/env python3
"""The per-method table of docs/results.md ("Every method on the same cluster") from an
`mqgrad experiment` directory: final test accuracy, iterations in the time budget, bytes a
worker pushes per iteration, and the compression against fp32 twice: of the whole push
(what the link carries) and of the compressed tensors alone (what the methods' papers report:
the small tensors travel as fp32 in every method, so they cap the whole-push ratio).

usage: bench/methods_table.py EXPERIMENT_DIR [--fp32-values N]

N is the number of values that travel as fp32 whatever the method (default: the paper model's
tensors under the default 100k-element threshold, 46282 values: conv1 weights and biases, every
bias, and the last FC layer). The fp32 run (method "none") gives the whole vector's size.
Standard library only."""

import json
import math
import os
import re
import sys


def load(exp):
    runs = {}
    for name in sorted(os.listdir(exp)):
        m = re.match(r"(.+)-seed(\d+)$", name)
        path = os.path.join(exp, name, "summary.json")
        if not m or not os.path.exists(path):
            continue
        with open(path) as f:
            s = json.load(f)
        with open(os.path.join(exp, name, "config.json")) as f:
            c = json.load(f)
        s["workers"] = c["workers"]
        method = re.sub(r"^fixed-(\d)", r"fixed:\1", m.group(1))  # the directory's ':' is '-'
        runs.setdefault(method, []).append(s)
    return runs


def mean_sd(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan"), 0
    mu = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return mu, sd, len(xs)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    exp = argv[1]
    fp32_values = 46282
    if "--fp32-values" in argv:
        fp32_values = int(argv[argv.index("--fp32-values") + 1])
    runs = load(exp)
    if "none" not in runs:
        print("%s: no fp32 run (method none) to compare with" % exp, file=sys.stderr)
        return 1
    # bytes a worker pushes per iteration, by method (mean over seeds)
    def push(s):
        return s["bytes_up"] / s["iterations"] / s["workers"]
    fp32_push = sum(push(s) for s in runs["none"]) / len(runs["none"])
    fixed = 4 * fp32_values  # + a few hundred bytes of headers, in both
    print("| method | seeds | final test accuracy (%) | iterations in the budget | "
          "push per worker per iteration (kB) | × smaller than fp32: whole push | "
          "× smaller: compressed tensors | model zeros (%) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    order = sorted(runs, key=lambda k: (k != "none", -mean_sd([push(s) for s in runs[k]])[0]))
    for k in order:
        rs = runs[k]
        acc = mean_sd([s["final_test_acc"] for s in rs])
        it = mean_sd([s["iterations"] for s in rs])
        p = mean_sd([push(s) for s in rs])
        zeros = mean_sd([s.get("final_sparsity") for s in rs])
        whole = fp32_push / p[0]
        comp = (fp32_push - fixed) / max(p[0] - fixed, 1.0)
        print("| %s | %d | %.1f ± %.1f | %.0f ± %.0f | %.0f | %.1f | %.1f | %s |" % (
            k, len(rs), 100 * acc[0], 100 * acc[1], it[0], it[1], p[0] / 1e3, whole, comp,
            "%.1f" % (100 * zeros[0]) if zeros[2] else "—"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
