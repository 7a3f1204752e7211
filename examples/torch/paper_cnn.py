#!/usr/bin/python3
"""The MQGrad paper's CNN (section 4.1) in PyTorch, as an mqgrad worker.

The network is the C workers' built-in model ``paper`` (common/src/nn), tensor for tensor: the
same names, element counts and element order, the same layers and loss. So a PyTorch worker
running this script and C workers (mqgrad-worker) can train one run together, and this script
can join a run started with ``--model paper`` (or ``--model small`` with ``--size small``):

    conv1  5x5, C -> 64, SAME (pad 2)   conv1.w [64][C][5][5]  conv1.b [64]
    ReLU, max-pool 3x3 stride 2 SAME (28 -> 14), LRN
    conv2  5x5, 64 -> 64, SAME          conv2.w [64][64][5][5] conv2.b [64]
    ReLU, LRN, max-pool 3x3 stride 2 SAME (14 -> 7), flatten (c, h, w): 3136
    fc1    3136 -> 2304, ReLU           fc1.w [3136][2304] (in x out: y = x W + b)  fc1.b
    fc2    2304 -> 3840, ReLU           fc2.w [2304][3840]  fc2.b
    fc3    3840 -> 10                   fc3.w [3840][10]    fc3.b
    loss   mean softmax cross-entropy + l2/2 (|fc1.w|^2 + |fc2.w|^2), l2 the run's

LRN (AlexNet's, TensorFlow's cifar10): b_c = a_c / (1 + (0.001/9) sum_{|c'-c|<=4} a_c'^2)^0.75,
which is torch's local_response_norm(size=9, alpha=0.001, beta=0.75, k=1) (torch divides alpha
by size). SAME pooling: windows at rows 2i .. 2i+2, clipped at the bottom/right edge, which is
max_pool2d(3, 2, ceil_mode=True).

    PYTHONPATH=python /usr/bin/python3 examples/torch/paper_cnn.py --scheduler tcp://host:7000
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# common first: it finds a python3 that has PyTorch
from common import check_dataset, join, mq, parser, setup, train  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F


SIZES = {  # (k1, k2, h1, h2) of the C models (mq_arch_for)
    "paper": (64, 64, 2304, 3840),
    "small": (8, 16, 64, 32),
}


class Conv(nn.Module):
    """5x5 convolution with SAME padding; weight K x C x 5 x 5 (the C layout)."""

    def __init__(self, cin, cout):
        super().__init__()
        self.w = nn.Parameter(torch.empty(cout, cin, 5, 5))
        self.b = nn.Parameter(torch.zeros(cout))

    def forward(self, x):
        return F.conv2d(x, self.w, self.b, padding=2)


class FC(nn.Module):
    """Fully connected with the weight stored In x Out, as the C model stores it: y = x W + b."""

    def __init__(self, nin, nout):
        super().__init__()
        self.w = nn.Parameter(torch.empty(nin, nout))
        self.b = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w)


def lrn(x):
    return F.local_response_norm(x, size=9, alpha=0.001, beta=0.75, k=1.0)


def pool(x):
    return F.max_pool2d(x, kernel_size=3, stride=2, ceil_mode=True)


class PaperCNN(nn.Module):
    def __init__(self, size="paper", channels=1, classes=10):
        super().__init__()
        k1, k2, h1, h2 = SIZES[size]
        self.conv1 = Conv(channels, k1)
        self.conv2 = Conv(k1, k2)
        self.fc1 = FC(k2 * 49, h1)
        self.fc2 = FC(h1, h2)
        self.fc3 = FC(h2, classes)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        """As the C model's mq_model_init: weights from a normal truncated at two standard
        deviations, std sqrt(2 / fan_in) (sqrt(1 / fan_in) for fc3, the logits); biases 0.
        (Only the run's first worker's values count: every worker starts from them.)"""
        for layer, fan_in, gain in ((self.conv1, self.conv1.w[0].numel(), 2.0),
                                    (self.conv2, self.conv2.w[0].numel(), 2.0),
                                    (self.fc1, self.fc1.w.shape[0], 2.0),
                                    (self.fc2, self.fc2.w.shape[0], 2.0),
                                    (self.fc3, self.fc3.w.shape[0], 1.0)):
            sd = math.sqrt(gain / fan_in)
            nn.init.trunc_normal_(layer.w, std=sd, a=-2 * sd, b=2 * sd)
            layer.b.zero_()

    def forward(self, x):
        x = lrn(pool(F.relu(self.conv1(x))))
        x = pool(lrn(F.relu(self.conv2(x))))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

    def l2_term(self, l2):
        """The C model's L2 term: l2/2 (|fc1.w|^2 + |fc2.w|^2); its gradient l2 * w."""
        return 0.5 * l2 * (self.fc1.w.pow(2).sum() + self.fc2.w.pow(2).sum())


def main(argv=None):
    p = parser("The MQGrad paper's CNN in PyTorch as an mqgrad worker.")
    p.add_argument("--size", default="paper", choices=sorted(SIZES),
                   help="the C model to match: paper (default) or small")
    args, worker_flags = p.parse_known_args(argv)
    data = setup(args)
    mq.init(worker_flags)
    model = PaperCNN(args.size, channels=data[0].shape[1])
    opt = join(model, torch.optim.SGD(model.parameters(), lr=0.1))
    check_dataset(args)
    r = mq.run()
    l2 = float(r["l2"])
    print("joined: rank %d (of at most %d workers), model %s (run's: %s), %d parameters, batch %d, "
          "codec %s, optimizer %s, l2 %g"
          % (r["rank"], r["workers"], args.size, r["model"],
             sum(t.numel() for t in model.parameters()), r["batch"], r["codec"],
             r["optimizer"], l2), flush=True)

    def loss_fn(m, logits, labels):
        return F.cross_entropy(logits, labels) + m.l2_term(l2)

    return train(model, opt, data, loss_fn, args.eval_batch)


if __name__ == "__main__":
    sys.exit(main())
