#!/usr/bin/python3
"""PyTorch's 8-bit per-tensor quantization timed on one thread, for bench_quant to compare with.

Prints one JSON object: GB/s of fp32 input for torch.quantize_per_tensor (quint8), for the same
with the range taken first (torch.aminmax, what our encode does too), for .dequantize(), and for
a plain tensor copy. Times are this thread's CPU time, best of --reps, like bench_quant's. When
torch cannot be imported the object says so ({"available": false, ...}) and the exit code is 0.

    /usr/bin/python3 bench/torch_quant.py [--n VALUES] [--reps R]
"""

import argparse
import json
import sys
import time


def best_of(reps, fn):
    best = float("inf")
    out = None
    for _ in range(reps):
        t0 = time.thread_time()
        out = fn()
        best = min(best, time.thread_time() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16777216, help="values (default 16777216)")
    ap.add_argument("--reps", type=int, default=7, help="runs per operation, best kept")
    args = ap.parse_args()
    if args.n < 1 or args.reps < 1:
        ap.error("--n and --reps must be positive")
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install failing while importing
        print(json.dumps({"available": False, "reason": f"{type(e).__name__}: {e}"}))
        return 0

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.n, generator=gen, dtype=torch.float32) * 1e-3  # bench_quant's scale
    lo, hi = (v.item() for v in torch.aminmax(x))
    scale = (hi - lo) / 255.0
    zero_point = min(255, max(0, round(-lo / scale)))

    def quantize():
        return torch.quantize_per_tensor(x, scale, zero_point, torch.quint8)

    def range_and_quantize():
        mn, mx = torch.aminmax(x)
        s = (mx.item() - mn.item()) / 255.0
        return torch.quantize_per_tensor(x, s, min(255, max(0, round(-mn.item() / s))),
                                         torch.quint8)

    y = torch.empty_like(x)
    t_q, q = best_of(args.reps, quantize)
    t_rq, _ = best_of(args.reps, range_and_quantize)
    t_dq, _ = best_of(args.reps, q.dequantize)
    t_copy, _ = best_of(args.reps, lambda: y.copy_(x))
    gbps = lambda t: 4e-9 * args.n / t
    print(json.dumps({
        "available": True,
        "torch": torch.__version__,
        "n": args.n,
        "reps": args.reps,
        "quantize_gbps": gbps(t_q),
        "range_quantize_gbps": gbps(t_rq),
        "dequantize_gbps": gbps(t_dq),
        "copy_gbps": gbps(t_copy),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
