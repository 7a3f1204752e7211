#!/usr/bin/python3
"""The MQGrad paper's CNN in PyTorch, the peer bench_nn.c compares mqgrad's OpenBLAS model with.

Same network as common/nn (conv 5x5x64, ReLU, max-pool 3x3/2 SAME, LRN, conv 5x5x64, ReLU,
LRN, max-pool, FC 3136-2304-3840-10, softmax cross-entropy + L2 on fc1/fc2), same batch, same
thread count. Prints one line: "images_per_s X". Exit 3 if torch is not importable.
"""
import argparse
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the caller prints a clear skip message
    print("torch missing: %s" % e, file=sys.stderr)
    sys.exit(3)


class PaperCNN(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 64, 5, padding=2)
        self.conv2 = nn.Conv2d(64, 64, 5, padding=2)
        self.fc1 = nn.Linear(3136, 2304)
        self.fc2 = nn.Linear(2304, 3840)
        self.fc3 = nn.Linear(3840, 10)
        # TensorFlow's LRN divides nothing by the window size; torch's alpha is per window,
        # so alpha_torch = alpha_tf * size = 0.001 / 9 * 9.
        self.lrn = nn.LocalResponseNorm(9, alpha=0.001, beta=0.75, k=1.0)

    @staticmethod
    def pool(x):
        # 3x3 stride 2 with TensorFlow SAME padding: one row/column of -inf at bottom/right.
        return F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float("-inf")), 3, 2)

    def forward(self, x):
        x = self.lrn(self.pool(F.relu(self.conv1(x))))
        x = self.pool(self.lrn(F.relu(self.conv2(x))))
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--l2", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = PaperCNN(a.channels)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(a.batch, a.channels, 28, 28) * 2 - 1
    y = torch.randint(0, 10, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss = loss + a.l2 * 0.5 * (model.fc1.weight.pow(2).sum() + model.fc2.weight.pow(2).sum())
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    print("images_per_s %.3f" % (a.batch * a.steps / dt))


if __name__ == "__main__":
    main()
