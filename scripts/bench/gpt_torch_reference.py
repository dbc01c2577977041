"""The PyTorch reference run for scripts/train_gpt.lua: the same model definition
(bench_gpt_torch.py's GPT, GPT-2's init as gpt.lua's) and recipe (AdamW lr 3e-3 with
weight decay 0.1 on the Linear weights, 30 warmup steps then a cosine to 0.1x,
gradients clipped to 1.0, batch 32 of 64 + 1 character windows) on the same data
(Debian's fortunes: every file without an extension, sorted by name, the bytes
as ids over the distinct ones, the last 10% for validation) and the same
validation protocol (EVAL_BATCHES, default 20, batches of random validation
windows from a fixed seed; as train_gpt.lua's --eval-batches).
Its own random windows: the same recipe, not the same batches.

    /usr/bin/python3 scripts/bench/gpt_torch_reference.py [STEPS] [EVAL_EVERY] [SEED] [EVAL_BATCHES]

Prints `step N val loss X` at every EVAL_EVERY steps and `final val loss: X.XXX`.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpt_torch import BATCH, CTX, GPT, VOCAB, adamw  # noqa: E402

DIR = "/usr/share/games/fortunes"


def text_ids():
    names = sorted((n for n in os.listdir(DIR) if "." not in n), key=lambda n: n.encode())
    data = b"".join(open(os.path.join(DIR, n), "rb").read() for n in names)
    vocab = sorted(set(data))
    assert len(vocab) == VOCAB, len(vocab)
    lut = {b: i for i, b in enumerate(vocab)}
    ids = torch.tensor([lut[b] for b in data], dtype=torch.int64)
    nval = max(1, len(ids) // 10)
    return ids[: len(ids) - nval], ids[len(ids) - nval:]


def windows(ids, gen):
    start = torch.randint(0, len(ids) - CTX, (BATCH,), generator=gen)
    w = torch.stack([ids[i:i + CTX + 1] for i in start.tolist()])
    return w[:, :CTX], w[:, 1:]


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    every = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    eval_batches = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    train, val = text_ids()
    model = GPT()
    opt = adamw(model)
    warmup, base, floor = min(30, steps), 3e-3, 3e-4
    gen = torch.Generator().manual_seed(seed + 1)

    def lr_at(n):   # n applied steps so far, as mp.optim.schedule.cosine
        if n < warmup:
            return base * (n + 1) / warmup
        f = min(1.0, (n - warmup) / max(1, steps - warmup))
        return floor + (base - floor) * 0.5 * (1 + math.cos(math.pi * f))

    def validate():
        g = torch.Generator().manual_seed(1234567)
        with torch.no_grad():
            losses = [F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).item()
                      for x, y in (windows(val, g) for _ in range(eval_batches))]
        return sum(losses) / len(losses)

    v = None
    for n in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(n)
        x, y = windows(train, gen)
        opt.zero_grad()
        F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (n + 1) % every == 0 or n + 1 == steps:
            v = validate()
            print(f"step {n + 1} val loss {v:.4f}", flush=True)
    print(f"final val loss: {v:.3f}")


if __name__ == "__main__":
    sys.exit(main())
