"""PyTorch 1.13 (Debian python3-torch) running train_cnn.lua --epochs 1's loop, for its peak
resident size: Fashion-MNIST kept as bytes (as mp.data keeps it) and each batch made f32 /255,
the CNN of scripts/models/cnn.lua, Adam lr 1e-3 at batch 128 on a shuffled epoch, then the
test set under no_grad in batches of 128 (train_classifier.lua's evaluation). Prints
`accuracy A peak_rss_mib R`.

    /usr/bin/python3 scripts/bench/train_cnn_torch.py [THREADS]

Compare with the "Maximum resident set size" of
    /usr/bin/time -v build/mpengine scripts/train_cnn.lua --epochs 1
"""
import os
import resource
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cnn_accuracy_torch import cnn, load  # noqa: E402

BATCH = 128


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    xtr = torch.from_numpy(load("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).copy())
    ytr = torch.from_numpy(load("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    xte = torch.from_numpy(load("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).copy())
    yte = torch.from_numpy(load("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    torch.manual_seed(0)
    m = cnn()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    perm = torch.randperm(len(xtr))
    for i in range(0, len(xtr), BATCH):
        idx = perm[i:i + BATCH]
        opt.zero_grad()
        loss = F.cross_entropy(m(xtr[idx].float() / 255), ytr[idx])
        loss.backward()
        opt.step()
        loss.item()
    m.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(xte), BATCH):
            correct += (m(xte[i:i + BATCH].float() / 255).argmax(1) == yte[i:i + BATCH]).sum().item()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"accuracy {correct / len(xte):.4f} peak_rss_mib {rss:.1f}")


if __name__ == "__main__":
    main()
