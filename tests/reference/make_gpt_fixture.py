#!/usr/bin/python3
"""make_gpt_fixture.py: PyTorch's loss and gradients for a two-layer GPT of the
definition in scripts/models/gpt.lua, for tests/lua/gpt_reference_spec.lua.

The model (same parameter names as the Lua module): token and position
embeddings; per block x + attn(ln_1(x)) and x + mlp(ln_2(x)), where attn is
causal multi-head self-attention (one c_attn Linear to q, k, v; softmax of
q k^T / sqrt(dh) with the future masked; c_proj) and mlp is c_fc, exact GELU,
c_proj; a final LayerNorm; logits = x @ wte.weight^T (the output tied to the
token embedding); mean cross-entropy of next-token targets.

Writes tests/reference/fixtures/gpt.safetensors in the layout of
make_fixtures.py (input.idx, input.target, param.<name>, loss, grad.<name>),
computed in float64 from float32 values. The weights are drawn here, wider than
the model's GPT-2 initialisation (N(0, 0.02), scaled residual projections:
scripts/models/gpt.lua, bench_gpt_torch.py) so that every gradient is well
away from zero; the Lua side loads them, so its own initialisation does not
enter the fixture.

    /usr/bin/python3 tests/reference/make_gpt_fixture.py     (Debian's python3-torch)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import f32, fixture  # noqa: E402

VOCAB, CTX, LAYERS, DIM, HEADS, BATCH = 23, 12, 2, 16, 4, 3


def gpt(gen):
    inputs = {
        "idx": torch.randint(0, VOCAB, (BATCH, CTX), generator=gen, dtype=torch.int64).to(torch.int32),
        "target": torch.randint(0, VOCAB, (BATCH, CTX), generator=gen, dtype=torch.int64).to(torch.int32),
    }
    params = {"wte.weight": f32(VOCAB, DIM, gen=gen, scale=0.5), "wpe.weight": f32(CTX, DIM, gen=gen, scale=0.5)}
    for l in range(LAYERS):
        p = "h.%d." % l
        for ln in ("ln_1", "ln_2"):
            params[p + ln + ".weight"] = f32(DIM, gen=gen, lo=0.5, hi=1.5)
            params[p + ln + ".bias"] = f32(DIM, gen=gen, lo=-0.2, hi=0.2)
        for name, fan_in, fan_out in (("attn.c_attn", DIM, 3 * DIM), ("attn.c_proj", DIM, DIM),
                                      ("mlp.c_fc", DIM, 4 * DIM), ("mlp.c_proj", 4 * DIM, DIM)):
            b = 1 / math.sqrt(fan_in)
            params[p + name + ".weight"] = f32(fan_out, fan_in, gen=gen, lo=-b, hi=b)
            params[p + name + ".bias"] = f32(fan_out, gen=gen, lo=-b, hi=b)
    params["ln_f.weight"] = f32(DIM, gen=gen, lo=0.5, hi=1.5)
    params["ln_f.bias"] = f32(DIM, gen=gen, lo=-0.2, hi=0.2)

    def forward(v):
        idx = v["idx"].long()
        T, dh = idx.shape[1], DIM // HEADS
        x = v["wte.weight"][idx] + v["wpe.weight"][torch.arange(T)]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for l in range(LAYERS):
            p = "h.%d." % l
            h = F.layer_norm(x, (DIM,), v[p + "ln_1.weight"], v[p + "ln_1.bias"], 1e-5)
            qkv = F.linear(h, v[p + "attn.c_attn.weight"], v[p + "attn.c_attn.bias"])
            q, k, val = qkv.split(DIM, dim=2)
            q, k, val = [t.reshape(BATCH, T, HEADS, dh).transpose(1, 2) for t in (q, k, val)]
            s = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
            y = F.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ val
            y = y.transpose(1, 2).reshape(BATCH, T, DIM)
            x = x + F.linear(y, v[p + "attn.c_proj.weight"], v[p + "attn.c_proj.bias"])
            h = F.layer_norm(x, (DIM,), v[p + "ln_2.weight"], v[p + "ln_2.bias"], 1e-5)
            h = F.gelu(F.linear(h, v[p + "mlp.c_fc.weight"], v[p + "mlp.c_fc.bias"]))
            x = x + F.linear(h, v[p + "mlp.c_proj.weight"], v[p + "mlp.c_proj.bias"])
        x = F.layer_norm(x, (DIM,), v["ln_f.weight"], v["ln_f.bias"], 1e-5)
        logits = x @ v["wte.weight"].t()
        return F.cross_entropy(logits.reshape(-1, VOCAB), v["target"].long().reshape(-1))

    return fixture("gpt", "two-layer GPT of scripts/models/gpt.lua: pre-LN blocks, causal attention, GELU MLP, "
                   "tied output, cross_entropy", inputs, params, forward,
                   {"vocab": VOCAB, "ctx": CTX, "layers": LAYERS, "dim": DIM, "heads": HEADS,
                    "generator": "tests/reference/make_gpt_fixture.py"})


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    gpt(torch.Generator().manual_seed(2024))
    return 0


if __name__ == "__main__":
    sys.exit(main())
