#!/usr/bin/python3
"""PyTorch DDP on the MQGrad paper's CNN: the peer bench/netns_race.sh races mqgrad against.

One process per rank (bench/netns_race.sh starts them in the worker namespaces, over
tc-shaped veths). Everything is chosen to match a `mqgrad-scheduler --model paper` run:

- model: PaperCNN imported from bench/torch_cnn.py (the same network as common/nn), or with
  --model paper_cnn the one of examples/torch/paper_cnn.py (the C model tensor for tensor: what
  mqgrad's PyTorch workers train, so a race of PyTorch workers runs the same code on both
  sides);
- data: Fashion-MNIST read from Debian's gzip idx files (dataset-fashion-mnist, the files
  mqgrad's workers read), pixels scaled to [-1, 1] as common/src/data/data.c does;
- batching: per epoch a seeded permutation of the training set cut into global batches of
  batch x world, rank r taking slice r (mqgrad's batcher does the same, with its own RNG);
- initialization: mqgrad's scheme (truncated He normal, zero biases), not PyTorch's default;
- update: plain SGD (no momentum) on the mean gradient, lr 0.01 (the cluster's default),
  loss = cross-entropy + l2/2 (|fc1.W|^2 + |fc2.W|^2) with l2 = 1e-4 (the cluster's default);
- communication: gloo all-reduce (ring), fp32, or fp16 with DDP's fp16_compress_hook;
- evaluation: rank 0, on the first --eval-limit test images, every --eval-every iterations
  and after the last one; its time is not training time (mqgrad's train_time_s excludes
  evaluation too); the other ranks wait in a broadcast that also carries "stop" (so the
  time budget and --stop-at-target are checked at evaluations only).

The training clock is the sum of the iteration times (forward, backward with the overlapped
all-reduce, optimizer step). Before training every rank times --floor-iters forward+backward
passes under ddp.no_sync() (no communication, gradients discarded, parameters untouched),
all ranks at once so the CPU contention is the run's: the compute floor.

Rank 0 writes --out (key value lines) and prints progress; exit 3 if torch is missing.
"""
import argparse
import gzip
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_cnn import PaperCNN  # noqa: E402  (exits 3 when torch is missing)

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "torch")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def read_idx(path):
    """A gzip idx file (the MNIST format) as a uint8 tensor of its dimensions."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError("%s: not an unsigned-byte idx file" % path)
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    off = 4 + 4 * ndim
    n = 1
    for d in dims:
        n *= d
    if len(data) - off != n:
        raise ValueError("%s: %d bytes of data for dimensions %s" % (path, len(data) - off, dims))
    return torch.frombuffer(bytearray(data[off:]), dtype=torch.uint8).reshape(dims)


def load(data_dir, split):
    x = read_idx(os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % split))
    y = read_idx(os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % split))
    x = (x.float() / 255.0 - 0.5) / 0.5
    return x.unsqueeze(1).contiguous(), y.long()


def init_like_mqgrad(model):
    """mq_model_init's scheme (common/src/nn/nn.c): He init, a normal truncated at 2 standard
    deviations, std sqrt(2 / fan_in) (sqrt(1 / fan_in) for the logits, fc3), biases zero.
    PyTorch's default (kaiming_uniform with a = sqrt(5)) starts far slower at lr 0.01 (17 %
    test accuracy after 8 iterations of 4 x 32 images, where mqgrad had 56 %), which would
    race initializations, not systems."""
    with torch.no_grad():
        for name in ("conv1", "conv2", "fc1", "fc2", "fc3"):
            layer = getattr(model, name)
            fan_in = layer.weight[0].numel()
            sd = (1.0 if name == "fc3" else 2.0) ** 0.5 / fan_in ** 0.5
            torch.nn.init.trunc_normal_(layer.weight, std=sd, a=-2 * sd, b=2 * sd)
            layer.bias.zero_()


def median(v):
    s = sorted(v)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, default=int(os.environ.get("RANK", 0)))
    ap.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    ap.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    ap.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT", 29500)))
    ap.add_argument("--hook", choices=["none", "fp16"], default="none",
                    help="fp16 = default_hooks.fp16_compress_hook")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--time-budget", type=float, default=0, help="seconds of training (0 = none)")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--eval-limit", type=int, default=1000)
    ap.add_argument("--target", type=float, default=0.70)
    ap.add_argument("--stop-at-target", type=int, default=0,
                    help="stop after the first evaluation at or above --target once this many "
                         "iterations are done (0 = never stop early)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--l2", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", choices=["mqgrad", "torch"], default="mqgrad",
                    help="mqgrad = mqgrad's scheme (same distribution, not the same draws); "
                         "paper_cnn's model always starts so")
    ap.add_argument("--model", choices=["torch_cnn", "paper_cnn"], default="torch_cnn",
                    help="torch_cnn = bench/torch_cnn.py's PaperCNN; paper_cnn = "
                         "examples/torch/paper_cnn.py's, what mqgrad's PyTorch workers train")
    ap.add_argument("--floor-iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3, help="iterations left out of the median")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", default="", help="rank 0's results (key value lines)")
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    x_train, y_train = load(a.data_dir, "train")
    x_test, y_test = load(a.data_dir, "t10k")
    x_test, y_test = x_test[:a.eval_limit or None], y_test[:a.eval_limit or None]

    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (a.master_addr, a.master_port),
                            rank=a.rank, world_size=a.world)
    if a.model == "paper_cnn":
        sys.path.insert(0, EXAMPLES)
        import paper_cnn  # noqa: E402  (its own initialization is mqgrad's scheme)
        model = paper_cnn.PaperCNN("paper", channels=1)

        def l2_term():
            return model.l2_term(a.l2)
    else:
        model = PaperCNN(1)  # same seed on every rank; DDP broadcasts rank 0's parameters anyway
        if a.init == "mqgrad":
            init_like_mqgrad(model)

        def l2_term():
            return a.l2 * 0.5 * (model.fc1.weight.pow(2).sum() + model.fc2.weight.pow(2).sum())
    ddp = DDP(model)
    if a.hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr)
    params = sum(p.numel() for p in model.parameters())

    n = x_train.shape[0]
    gb = a.batch * a.world
    steps_per_epoch = n // gb
    perm = None
    epoch = -1

    def batch(step):
        nonlocal perm, epoch
        e = step // steps_per_epoch
        if e != epoch:
            g = torch.Generator()
            g.manual_seed(a.seed * 1000003 + e)
            perm = torch.randperm(n, generator=g)
            epoch = e
        pos = (step % steps_per_epoch) * gb + a.rank * a.batch
        idx = perm[pos:pos + a.batch]
        return x_train[idx], y_train[idx]

    def loss_of(x, y):
        return F.cross_entropy(ddp(x), y) + l2_term()

    # Compute floor: forward + backward without communication, every rank at once. The
    # barrier lines the ranks up: DDP's initial broadcast of the parameters lets them go at
    # different times (seconds apart on a 100 Mbit/s link), and a rank timing alone would
    # see less CPU contention than the run.
    dist.barrier()
    floor = []
    x, y = batch(0)
    for i in range(a.floor_iters + 2):
        t0 = time.perf_counter()
        with ddp.no_sync():
            loss_of(x, y).backward()
        if i >= 2:
            floor.append(time.perf_counter() - t0)
        opt.zero_grad(set_to_none=False)
    dist.barrier()

    def evaluate():
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, x_test.shape[0], 500):
                correct += (model(x_test[i:i + 500]).argmax(1) == y_test[i:i + 500]).sum().item()
        model.train()
        return correct / max(1, x_test.shape[0])

    steps = []
    train_time = 0.0
    evals = []
    hit = None
    stop = torch.zeros(1)
    it = 0
    while it < a.iters:
        x, y = batch(it)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = loss_of(x, y)
        loss.backward()  # returns once DDP's all-reduce of every bucket is done
        opt.step()
        dt = time.perf_counter() - t0
        steps.append(dt)
        train_time += dt
        it += 1
        # Every rank must take the same branch: the iteration count decides where the
        # evaluations are, rank 0 decides (and broadcasts) whether to stop, there only, so
        # the time budget is checked every --eval-every iterations.
        if (a.eval_every > 0 and it % a.eval_every == 0) or it >= a.iters:
            if a.rank == 0:
                acc = evaluate()
                evals.append((it, train_time, acc))
                if hit is None and acc >= a.target:
                    hit = (it, train_time)
                print("ddp[%s] iter %d  loss %.4f  acc %.2f%%  %.0f ms/iter  train %.1f s"
                      % (a.hook, it, loss.item(), 100 * acc,
                         1000 * median(steps[a.warmup:] or steps), train_time), flush=True)
                over = a.time_budget > 0 and train_time >= a.time_budget
                early = a.stop_at_target > 0 and hit is not None and it >= a.stop_at_target
                stop[0] = 1.0 if (it >= a.iters or over or early) else 0.0
            dist.broadcast(stop, 0)  # everyone waits here while rank 0 evaluates
            if stop[0] > 0:
                break

    if a.rank == 0 and a.out:
        body = steps[a.warmup:] if len(steps) > a.warmup else steps
        with open(a.out, "w") as f:
            f.write("hook %s\n" % a.hook)
            f.write("model %s\n" % a.model)
            f.write("world %d\n" % a.world)
            f.write("params %d\n" % params)
            f.write("grad_bytes %d\n" % (params * (2 if a.hook == "fp16" else 4)))
            f.write("iters %d\n" % it)
            f.write("median_ms %.3f\n" % (1000 * median(body)))
            f.write("floor_ms %.3f\n" % (1000 * median(floor)))
            f.write("train_time_s %.3f\n" % train_time)
            f.write("last_acc %.4f\n" % (evals[-1][2] if evals else float("nan")))
            f.write("target_iter %s\n" % (hit[0] if hit else "none"))
            f.write("target_s %s\n" % ("%.3f" % hit[1] if hit else "none"))
            f.write("evals %s\n" % " ".join("%d:%.2f:%.4f" % e for e in evals))
    # Every rank is done with the group; leave without destroy_process_group: with the fp16
    # hook a rank sometimes never returned from the group's teardown (torch 1.13, gloo).
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
