"""PyTorch 1.13 (Debian python3-torch) reference for train_cnn.lua's accuracy: the CNN of
scripts/models/cnn.lua (conv 3x3 1->32 no bias, BatchNorm2d, ReLU, max pool 2; conv 3x3
32->64, BatchNorm2d, ReLU, max pool 2; Linear 3136->128, ReLU, Linear 128->10), Adam lr 1e-3,
batch 128, Fashion-MNIST /255, test accuracy (eval mode) after each of EPOCHS epochs, for
the seeds given on the command line, in f32 or under CPU bf16 autocast:

    /usr/bin/python3 scripts/bench/cnn_accuracy_torch.py EPOCHS f32|bf16 SEED...

Compare with: build/mpengine scripts/train_cnn.lua --epochs EPOCHS --seed S [--amp bf16]
"""
import contextlib, gzip, sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

D = "/usr/share/datasets/fashion-mnist"


def load(p, off):
    with gzip.open(f"{D}/{p}") as f:
        return np.frombuffer(f.read(), np.uint8, offset=off)


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    epochs, mode, seeds = int(sys.argv[1]), sys.argv[2], [int(a) for a in sys.argv[3:]] or [0]
    xtr = torch.from_numpy(load("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255)
    ytr = torch.from_numpy(load("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    xte = torch.from_numpy(load("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).astype(np.float32) / 255)
    yte = torch.from_numpy(load("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext()

    for seed in seeds:
        torch.manual_seed(seed)
        m = cnn()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        accs = []
        for _ in range(epochs):
            m.train()
            perm = torch.randperm(60000)
            for i in range(0, 60000, 128):
                idx = perm[i:i + 128]
                opt.zero_grad()
                with autocast():
                    loss = F.cross_entropy(m(xtr[idx]), ytr[idx])
                loss.backward()
                opt.step()
            m.eval()
            with torch.no_grad(), autocast():
                accs.append((m(xte).argmax(1) == yte).float().mean().item())
        print(mode, seed, " ".join(f"{a:.4f}" for a in accs), flush=True)


if __name__ == "__main__":
    main()
