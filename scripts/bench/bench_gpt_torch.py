"""The PyTorch side of bench_gpt.lua: the GPT of scripts/models/gpt.lua (the
definition of tests/reference/make_gpt_fixture.py, as nn.Modules with GPT-2's
init, as gpt.lua's GPT:init_weights) trained with AdamW on random windows of fortunes-sized random ids.

    /usr/bin/python3 bench_gpt_torch.py STEPS WARMUP THREADS MODE

MODE: f32 or bf16 (torch.autocast("cpu", bfloat16); PyTorch 1.13's CPU autocast
has no f16). Prints `torch threads=N mode=M median_ms=X peak_rss_mib=Y`.
"""
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, LAYERS, DIM, HEADS, BATCH = 114, 64, 2, 128, 4, 32


class Block(nn.Module):
    def __init__(self, dim=DIM, heads=HEADS, ctx=CTX):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.attn_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.register_buffer("mask", torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), 1))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v)]
        if hasattr(F, "scaled_dot_product_attention"):   # PyTorch 2: its fused attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:                                             # PyTorch 1.13 (Debian's): the products
            s = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
            y = F.softmax(s.masked_fill(self.mask[:T, :T], float("-inf")), dim=-1) @ v
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """the default GPT of train_gpt.lua; other sizes by keyword (bench_gpu_torch.py's GPT-2 small)"""

    def __init__(self, vocab=VOCAB, ctx=CTX, layers=LAYERS, dim=DIM, heads=HEADS):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.h = nn.ModuleList([Block(dim, heads, ctx) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.init_weights(layers)

    def init_weights(self, layers):
        """GPT-2's, as scripts/models/gpt.lua: N(0, 0.02) embeddings and Linear weights,
        zero biases, the residual projections at N(0, 0.02 / sqrt(2 * layers))"""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln_" in name or name.startswith("ln_f."):
                    continue
                if name.endswith(".bias"):
                    p.zero_()
                elif name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight"):
                    p.normal_(0.0, 0.02 / math.sqrt(2 * layers))
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def adamw(model, lr=3e-3, wd=0.1):
    """minGPT's groups, as mp.optim.decay_groups: Linear weights decay, the rest not"""
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2 and "wte" not in n and "wpe" not in n]
    keep = [p for n, p in model.named_parameters() if not any(p is d for d in decay)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": keep, "weight_decay": 0.0}], lr=lr)


def main():
    STEPS, WARMUP, THREADS, MODE = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    model = GPT()
    opt = adamw(model)
    data = torch.randint(0, VOCAB, (2_300_000,))
    times = []
    for s in range(WARMUP + STEPS):
        start = torch.randint(0, len(data) - CTX - 1, (BATCH,))
        w = torch.stack([data[i:i + CTX + 1] for i in start.tolist()])
        x, y = w[:, :CTX], w[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=MODE == "bf16"):
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        if s >= WARMUP:
            times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"torch threads={THREADS} mode={MODE} median_ms={statistics.median(times) * 1000:.3f} peak_rss_mib={rss:.1f}")


if __name__ == "__main__":
    main()
