"""The PyTorch side of bench_amp.lua: the same MLP, batch and optimizer on the CPU
under torch.autocast("cpu", dtype=torch.bfloat16), the recipe PyTorch documents
for bf16 on the CPU (no loss scaling, FP32 parameters and Adam).

Usage: bench_amp_torch.py STEPS WARMUP [ROUNDS] [--no-onednn]

Prints one line per thread setting tried: `torch bf16 threads=N median_ms=X`.
The default intra-op setting and torch.set_num_threads(2) are both measured, so
the comparison is against PyTorch's fastest setting on this machine. Each
setting is measured in ROUNDS rounds of STEPS/ROUNDS steps, alternating between
the settings, so that a noisy neighbour slows both alike rather than one. Data is
the real Fashion-MNIST training set read with numpy (no torchvision needed), the
same 64 batches each run.
"""
import gzip
import statistics
import sys
import time

import numpy as np
import torch

NO_ONEDNN = "--no-onednn" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--no-onednn"]
STEPS = int(ARGS[0]) if len(ARGS) > 0 else 300
WARMUP = int(ARGS[1]) if len(ARGS) > 1 else 30
ROUNDS = int(ARGS[2]) if len(ARGS) > 2 else 3
BATCH = 128
DIR = "/usr/share/datasets/fashion-mnist"


def load():
    with gzip.open(f"{DIR}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{DIR}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images, labels


class Run:
    """one model + Adam + batch list; step() is one timed bf16 autocast step"""

    def __init__(self, images, labels):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 10))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        rng = np.random.default_rng(1)
        order = rng.permutation(len(labels))[: 64 * BATCH]
        self.batches = [(torch.from_numpy(images[order[i:i + BATCH]].astype(np.float32) / 255),
                         torch.from_numpy(labels[order[i:i + BATCH]].astype(np.int64)))
                        for i in range(0, len(order), BATCH)]
        self.s = 0
        self.times = []

    def step(self, keep):
        x, y = self.batches[self.s % len(self.batches)]
        self.s += 1
        t0 = time.perf_counter()
        self.opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        self.opt.step()
        loss.item()
        if keep:
            self.times.append(time.perf_counter() - t0)
        return out.dtype


def bf16_path():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    if all(x in flags for x in ("avx512bw", "avx512vl", "avx512dq")):
        native = "avx512_bf16" in flags
        return "oneDNN bf16 matmul (AVX-512%s)" % (" with native avx512_bf16" if native else ", bf16 emulated")
    return "ATen non-BLAS bf16 kernels (no AVX-512)"


def main():
    images, labels = load()
    if NO_ONEDNN:
        torch.backends.mkldnn.set_flags(False)
        print("torch bf16 path: ATen non-BLAS bf16 kernels (oneDNN off, as on an AVX2-only machine)")
    else:
        print(f"torch bf16 path: {bf16_path()}")
    default = torch.get_num_threads()
    settings = [default] if default == 2 else [default, 2]
    runs = {n: Run(images, labels) for n in settings}
    out_dtype = None
    for n, r in runs.items():
        torch.set_num_threads(n)
        for _ in range(WARMUP):
            out_dtype = r.step(False)
    print(f"torch {torch.__version__} default threads={default} autocast output dtype={out_dtype}")
    per_round = max(1, STEPS // ROUNDS)
    for _ in range(ROUNDS):
        for n, r in runs.items():
            torch.set_num_threads(n)
            r.step(False)   # the first step after switching thread counts spawns/wakes the pool
            for _ in range(per_round):
                r.step(True)
    for n, r in runs.items():
        tag = "torch bf16 no-onednn" if NO_ONEDNN else "torch bf16"
        print(f"{tag} threads={n} median_ms={statistics.median(r.times) * 1000:.3f}")


if __name__ == "__main__":
    main()
