"""The PyTorch side of bench_cnn.lua: the CNN of scripts/models/cnn.lua (built by
cnn_accuracy_torch.py) trained with Adam on random Fashion-MNIST-sized batches.

    /usr/bin/python3 bench_cnn_torch.py STEPS WARMUP THREADS MODE BATCH

MODE: f32 or bf16 (torch.autocast("cpu", bfloat16); PyTorch 1.13's CPU autocast
has no f16). Prints `torch threads=N mode=M median_ms=X peak_rss_mib=Y`.
"""
import contextlib
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cnn_accuracy_torch import cnn  # noqa: E402


def main():
    steps, warmup, threads, mode, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = cnn()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    xs, ys = torch.rand(8, batch, 1, 28, 28), torch.randint(0, 10, (8, batch))
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext():
            loss = F.cross_entropy(m(xs[s % 8]), ys[s % 8])
        loss.backward()
        opt.step()
        loss.item()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"torch threads={threads} mode={mode} median_ms={statistics.median(times) * 1000:.3f} peak_rss_mib={rss:.1f}")


if __name__ == "__main__":
    main()
