"""dist_equivalence_torch.py: PyTorch's own answer to "do two data-parallel ranks
with batch B give one process's weights with batch 2B?", for bench_dist.lua.

The Fashion-MNIST MLP (784-512-256-10, Adam lr 1e-3), the same global order as
mpengine's sharded loader (global batch k is one process's batch k; rank r takes
its r-th half), 50 steps: one process with batch 2B, and DistributedDataParallel
over gloo with two processes of batch B. Prints, per precision (f32, and bf16
under CPU autocast: PyTorch 1.13 has no f16 autocast on the CPU):
    torch AMP max_abs_diff=X n_over_1e-7=N n=TOTAL
Run with Debian's python3 (python3-torch): python3 dist_equivalence_torch.py [B]
"""
import gzip
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

STEPS = 50
FM = "/usr/share/datasets/fashion-mnist/train-"


def data():
    with gzip.open(FM + "images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(FM + "labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(len(y), generator=g)
    return torch.from_numpy(x.copy()).float() / 255, torch.from_numpy(y.astype(np.int64)), perm


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def train(m, batches, amp):
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    for x, y in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
            loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def global_batches(b, rank, world):
    x, y, perm = data()
    out = []
    for k in range(STEPS):
        idx = perm[k * b * world:(k + 1) * b * world][rank * b:(rank + 1) * b]
        out.append((x[idx], y[idx]))
    return out


def ddp_rank(rank, b, amp, path):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    m = nn.parallel.DistributedDataParallel(model())
    w = train(m, global_batches(b, rank, 2), amp)
    if rank == 0:
        torch.save(w, path)
    dist.destroy_process_group()


def main():
    b = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    for amp in ("off", "bf16"):
        torch.set_num_threads(2)
        one = train(model(), global_batches(2 * b, 0, 1), amp)
        path = "/tmp/mpengine-ddp-%d.pt" % os.getpid()
        mp.spawn(ddp_rank, args=(b, amp, path), nprocs=2)
        two = torch.load(path)
        os.remove(path)
        d = [(p - q).abs() for p, q in zip(one, two)]
        print("torch %s max_abs_diff=%.3g n_over_1e-7=%d n=%d" % (
            "f32" if amp == "off" else amp, max(t.max().item() for t in d),
            sum(int((t > 1e-7).sum()) for t in d), sum(t.numel() for t in d)))


if __name__ == "__main__":
    main()
