"""The PyTorch side of bench_resnet.lua: the ResNet of scripts/models/resnet.lua
(basic blocks; 3x3 stem; stages at WIDTHS channels of BLOCKS blocks, each stage after
the first starting with a stride-2 3x3 conv and a 1x1 stride-2 projection; adaptive
average pool; linear to 10 classes) trained with SGD (momentum 0.9) on random
3 x 32 x 32 batches.

    /usr/bin/python3 bench_resnet_torch.py STEPS WARMUP THREADS MODE BATCH WIDTHS BLOCKS

MODE: f32 or bf16 (torch.autocast("cpu", bfloat16); PyTorch 1.13's CPU autocast
has no f16); WIDTHS: comma-separated, e.g. 16,32,64. Prints
`torch threads=N mode=M median_ms=X peak_rss_mib=Y`.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step_timer import time_steps  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), blocks=1, channels=3, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        cin, self.nstages = widths[0], len(widths)
        for s, w in enumerate(widths):
            layers = []
            for b in range(blocks):
                layers.append(BasicBlock(cin, w, 2 if s > 0 and b == 0 else 1))
                cin = w
            setattr(self, f"layer{s + 1}", nn.Sequential(*layers))   # the names of resnet.lua
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for s in range(self.nstages):
            x = getattr(self, f"layer{s + 1}")(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def main():
    steps, warmup, threads, mode, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    widths, blocks = tuple(int(w) for w in sys.argv[6].split(",")), int(sys.argv[7])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = ResNet(widths, blocks)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    xs, ys = torch.rand(4, batch, 3, 32, 32), torch.randint(0, 10, (4, batch))
    time_steps(m, opt, xs, ys, steps, warmup, threads, mode)


if __name__ == "__main__":
    main()
