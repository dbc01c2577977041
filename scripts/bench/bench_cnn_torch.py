"""The PyTorch side of bench_cnn.lua: the CNN of scripts/models/cnn.lua (built by
cnn_accuracy_torch.py) trained with Adam on random Fashion-MNIST-sized batches.

    /usr/bin/python3 bench_cnn_torch.py STEPS WARMUP THREADS MODE BATCH

MODE: f32 or bf16 (torch.autocast("cpu", bfloat16); PyTorch 1.13's CPU autocast
has no f16). Prints `torch threads=N mode=M median_ms=X peak_rss_mib=Y`.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cnn_accuracy_torch import cnn  # noqa: E402
from torch_step_timer import time_steps  # noqa: E402


def main():
    steps, warmup, threads, mode, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = cnn()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    xs, ys = torch.rand(8, batch, 1, 28, 28), torch.randint(0, 10, (8, batch))
    time_steps(m, opt, xs, ys, steps, warmup, threads, mode)


if __name__ == "__main__":
    main()
