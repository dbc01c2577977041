"""The PyTorch side of bench_mlp.lua: the same MLP, batch and optimizer on the CPU.

Prints one line per thread setting tried: `torch threads=N median_ms=X`. The
default intra-op setting and torch.set_num_threads(2) are both measured, so the
comparison is against PyTorch's fastest setting on this machine. Data is the
real Fashion-MNIST training set read with numpy (no torchvision needed).
"""
import gzip
import statistics
import sys
import time

import numpy as np
import torch

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
WARMUP = int(sys.argv[2]) if len(sys.argv) > 2 else 30
BATCH = 128
DIR = "/usr/share/datasets/fashion-mnist"


def load():
    with gzip.open(f"{DIR}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{DIR}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images, labels


def run(threads, images, labels):
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(1)
    order = rng.permutation(len(labels))[: 64 * BATCH]
    batches = [(torch.from_numpy(images[order[i:i + BATCH]].astype(np.float32) / 255),
                torch.from_numpy(labels[order[i:i + BATCH]].astype(np.int64)))
               for i in range(0, len(order), BATCH)]
    times = []
    for s in range(WARMUP + STEPS):
        x, y = batches[s % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if s >= WARMUP:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main():
    images, labels = load()
    default = torch.get_num_threads()
    print(f"torch {torch.__version__} default threads={default}")
    for threads in (None, 2):
        ms = run(threads, images, labels)
        print(f"torch threads={threads or default} median_ms={ms:.3f}")


if __name__ == "__main__":
    main()
