#!/usr/bin/python3
"""A small ResNet (He et al.'s CIFAR ResNet-6n+2 for 28x28 single-channel images) as an mqgrad
worker, for a run started with an external model (the layout comes from the first worker).

Three stages of n basic blocks (16, 32, 64 channels; 28x28, 14x14, 7x7), global average
pooling and a linear layer: --depth 8 (n = 1, 29 parameter tensors, 78k parameters), 14 or 20
(at most 65 tensors, within mqgrad's 128). BatchNorm's running statistics are buffers, not
parameters: each worker keeps its own (evaluation uses them); the parameters are the run's.

    PYTHONPATH=python /usr/bin/python3 examples/torch/resnet.py --scheduler tcp://host:7000
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# common first: it finds a python3 that has PyTorch
from common import check_dataset, join, mq, parser, setup, train  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


class ResNet(nn.Module):
    def __init__(self, depth=8, channels=1, classes=10, width=16):
        super().__init__()
        if (depth - 2) % 6 or depth < 8:
            raise ValueError("depth must be 6n+2 (8, 14, 20, ...), got %d" % depth)
        n = (depth - 2) // 6
        self.stem = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks, cin = [], width
        for stage in range(3):
            cout = width << stage
            for i in range(n):
                blocks.append(Block(cin, cout, 2 if stage and i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.blocks(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def main(argv=None):
    p = parser("A small ResNet in PyTorch as an mqgrad worker.")
    p.add_argument("--depth", type=int, default=8, help="6n+2: 8 (default), 14, 20")
    p.add_argument("--weight-decay", type=float, default=0.0,
                   help="L2 coefficient added to the loss on the conv and linear weights "
                        "(the update rule is the run's; default 0)")
    args, worker_flags = p.parse_known_args(argv)
    data = setup(args)
    mq.init(worker_flags)
    model = ResNet(args.depth, channels=data[0].shape[1])
    opt = join(model, torch.optim.SGD(model.parameters(), lr=0.1))
    check_dataset(args)
    r = mq.run()
    print("joined: rank %d (of at most %d workers), ResNet-%d, %d tensors, %d parameters, batch %d, "
          "codec %s, optimizer %s"
          % (r["rank"], r["workers"], args.depth, len(list(model.parameters())),
             sum(t.numel() for t in model.parameters()), r["batch"], r["codec"],
             r["optimizer"]), flush=True)
    decay = [m.weight for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]

    def loss_fn(m, logits, labels):
        loss = F.cross_entropy(logits, labels)
        if args.weight_decay:
            loss = loss + 0.5 * args.weight_decay * sum(w.pow(2).sum() for w in decay)
        return loss

    return train(model, opt, data, loss_fn, args.eval_batch)


if __name__ == "__main__":
    sys.exit(main())
