"""What the PyTorch examples share: the IDX data sets (Fashion-MNIST, MNIST) normalized as the
C workers do, the thread count, and the training loop over an mqgrad run's rounds.

Run the examples with the interpreter that has PyTorch (Debian's /usr/bin/python3 with
python3-torch) and the package on the path: PYTHONPATH=python (from the source checkout).
"""
import argparse
import gzip
import os
import sys
import time

try:
    import torch
except ImportError:
    # Run as `python3 examples/torch/...` where another python3 comes first on PATH (pyenv, a
    # venv) without PyTorch: run again under Debian's /usr/bin/python3, which has
    # python3-torch (tools/install-deps.sh torch). The examples import this module first.
    DEBIAN = "/usr/bin/python3"
    if os.access(DEBIAN, os.X_OK) and os.path.realpath(sys.executable) != os.path.realpath(DEBIAN):
        os.execv(DEBIAN, [DEBIAN] + sys.argv)
    sys.exit("%s: PyTorch is not installed for %s; install it with tools/install-deps.sh torch "
             "(Debian's python3-torch) or pip install torch" % (sys.argv[0], sys.executable))
import numpy as np  # noqa: E402

try:
    import mqgrad.torch as mq
except ImportError:  # a source checkout: the package is in python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    import mqgrad.torch as mq

IDX_SETS = ("fashion-mnist", "mnist")


def data_dir(dataset, given=None):
    """GIVEN, else $MQGRAD_DATA_DIR, else the data set's default folder (Debian's
    dataset-fashion-mnist installs /usr/share/datasets/fashion-mnist)."""
    return given or os.environ.get("MQGRAD_DATA_DIR") or "/usr/share/datasets/" + dataset


def _open(folder, base):
    for path in (os.path.join(folder, base), os.path.join(folder, base + ".gz")):
        if os.path.exists(path):
            # gzip or plain, as the C loader reads them
            with open(path, "rb") as f:
                gz = f.read(2) == b"\x1f\x8b"
            return path, (gzip.open(path, "rb") if gz else open(path, "rb"))
    raise FileNotFoundError(
        "%s/%s[.gz]: no such file; install Debian's dataset-fashion-mnist (apt-get install "
        "dataset-fashion-mnist), or give --data-dir / MQGRAD_DATA_DIR" % (folder, base))


def _idx(folder, base, magic, dims):
    path, f = _open(folder, base)
    with f:
        data = f.read()
    if len(data) < 4 + 4 * len(dims) or int.from_bytes(data[:4], "big") != magic:
        raise ValueError("%s: wrong magic (expected 0x%08x)" % (path, magic))
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(len(dims))]
    for want, got in zip(dims, shape):
        if want is not None and want != got:
            raise ValueError("%s: bad header: shape %s" % (path, shape))
    body = data[4 + 4 * len(dims):]
    if len(body) != int(np.prod(shape)):
        raise ValueError("%s: size mismatch: %d bytes for shape %s" % (path, len(body), shape))
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def load_idx(folder, train):
    """(images, labels) of the training or test split in FOLDER: images a float32 tensor
    N x 1 x 28 x 28 scaled to [0, 1] then normalized by (x - 0.5) / 0.5 in float32 (the C
    loader's arithmetic, so the values are the same bits), labels an int64 tensor."""
    pre = "train" if train else "t10k"
    px = _idx(folder, pre + "-images-idx3-ubyte", 0x803, (None, 28, 28))
    lab = _idx(folder, pre + "-labels-idx1-ubyte", 0x801, (px.shape[0],))
    if lab.max(initial=0) > 9:
        raise ValueError("%s: label out of range" % folder)
    x = (px.astype(np.float32) / np.float32(255.0) - np.float32(0.5)) / np.float32(0.5)
    return (torch.from_numpy(x).reshape(-1, 1, 28, 28),
            torch.from_numpy(lab.astype(np.int64)))


def parser(description):
    """The examples' own flags; the others go to mqgrad.torch.init (the worker's flags:
    --scheduler, --peer-timeout, --keys, --insecure, ...)."""
    p = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                epilog="Other flags are the worker's (mqgrad-worker --help), "
                                       "as are the MQGRAD_* variables.")
    p.add_argument("--dataset", default="fashion-mnist", choices=IDX_SETS,
                   help="the run's data set (default: fashion-mnist)")
    p.add_argument("--data-dir", default=None,
                   help="its folder (default: $MQGRAD_DATA_DIR, or /usr/share/datasets/NAME)")
    p.add_argument("--threads", type=int, default=None,
                   help="PyTorch's threads (default: $MQGRAD_THREADS, or 1; 0: PyTorch's own)")
    p.add_argument("--eval-batch", type=int, default=500,
                   help="test examples per forward pass when evaluating (default: 500)")
    p.add_argument("--init-seed", type=int, default=1,
                   help="PyTorch's seed for the model's initial values (default: 1; only the "
                        "run's first worker's values count: the others pull them)")
    return p


def setup(args):
    """Threads and data, before the join (so the worker does not hold a round up while it
    loads). Returns (train_x, train_y, test_x, test_y)."""
    threads = args.threads
    if threads is None:
        threads = int(os.environ.get("MQGRAD_THREADS", "1") or 1)
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(args.init_seed)  # a run starts from the same values each time
    folder = data_dir(args.dataset, args.data_dir)
    train = load_idx(folder, True)
    test = load_idx(folder, False)
    return train + test


@torch.no_grad()
def evaluate(model, x, y, batch):
    """(correct, summed cross-entropy) of MODEL over X, Y."""
    correct, loss_sum = 0, 0.0
    for at in range(0, len(x), batch):
        z = model(x[at:at + batch])
        loss_sum += torch.nn.functional.cross_entropy(
            z.double(), y[at:at + batch], reduction="sum").item()
        correct += int((z.argmax(1) == y[at:at + batch]).sum())
    return correct, loss_sum


def join(model, optimizer):
    """The DistributedOptimizer over MODEL's parameters: joins the run. A failed join (no
    scheduler, a refused model, bad flags) ends the program with libmqgrad's reason, without
    a traceback, and the join's exit code (4 refused: mqgrad local does not start it again)."""
    try:
        return mq.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    except RuntimeError as e:
        print("%s: %s" % (os.path.basename(sys.argv[0]), e), file=sys.stderr, flush=True)
        sys.exit(getattr(e, "exit_code", 1))


def check_dataset(args):
    """The run's data set must be the one loaded."""
    ds = mq.run()["dataset"]
    if ds != args.dataset:
        mq.shutdown()
        sys.exit("the run trains on %s, this worker loaded %s: give --dataset %s"
                 % (ds, args.dataset, ds if ds in IDX_SETS else "(an IDX data set)"))


def train(model, opt, data, loss_fn, eval_batch=500, out=sys.stdout):
    """The rounds of the run: each round this member's batch (DistributedSampler), the loss
    LOSS_FN(model, logits, labels) and its gradient, step(loss); when the scheduler asks,
    evaluate this member's share of the test set and report it (one line per evaluation).
    Returns the worker's exit code."""
    train_x, train_y, test_x, test_y = data
    sampler = mq.DistributedSampler(len(train_x))
    t0, rounds = time.monotonic(), 0
    try:
        for step in opt.rounds():
            model.train()
            idx = sampler.indices(step)
            opt.zero_grad()
            loss = loss_fn(model, model(train_x[idx]), train_y[idx])
            loss.backward()
            opt.step(loss)
            rounds += 1
            if step.evaluate:
                model.eval()
                lo, hi = mq.eval_range(step, len(test_x))
                correct, loss_sum = evaluate(model, test_x[lo:hi], test_y[lo:hi], eval_batch)
                mq.report(correct=correct, total=hi - lo, loss_sum=loss_sum)
                print("iter %d  member %d/%d  bits %d  lr %.4g  loss %.4f  test [%d, %d): "
                      "%.2f%% correct, loss %.4f  (%d rounds, %.1f s)"
                      % (step.iter, step.member, step.members, step.bits, step.lr,
                         loss.item(), lo, hi, 100.0 * correct / max(hi - lo, 1),
                         loss_sum / max(hi - lo, 1), rounds, time.monotonic() - t0),
                      file=out, flush=True)
    except KeyboardInterrupt:
        print("interrupted: leaving the run", file=sys.stderr)
    return mq.shutdown()
