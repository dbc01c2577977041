"""The timed training loop of the PyTorch sides of the classifier benches
(bench_cnn_torch.py, bench_resnet_torch.py): one step is zero_grad, the forward
and cross-entropy (under bf16 autocast when MODE is bf16), backward, the optimizer
step and a read of the loss; batches cycle through xs/ys. Prints the line the Lua
side parses: `torch threads=N mode=M median_ms=X peak_rss_mib=Y`.
"""
import contextlib
import resource
import statistics
import time

import torch
import torch.nn.functional as F


def time_steps(model, opt, xs, ys, steps, warmup, threads, mode):
    times = []
    for s in range(warmup + steps):
        x, y = xs[s % len(xs)], ys[s % len(ys)]
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16" else contextlib.nullcontext():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"torch threads={threads} mode={mode} median_ms={statistics.median(times) * 1000:.3f} peak_rss_mib={rss:.1f}")
