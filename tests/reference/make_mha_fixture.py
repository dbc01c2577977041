#!/usr/bin/python3
"""make_mha_fixture.py: PyTorch 1.13's nn.MultiheadAttention for tests/lua/mha_spec.lua.

Each case below builds torch.nn.MultiheadAttention(E, H, bias=..., batch_first=...) in
float32 from a fixed seed, runs it on fixed inputs (self-attention: one tensor as
query, key and value; cross-attention: three), and writes into
tests/reference/fixtures/mha.safetensors, under <case>.:

    param.in_proj_weight, param.in_proj_bias, param.out_proj.weight, param.out_proj.bias
    input.x (self-attention) or input.query, input.key, input.value
    mask                the attn_mask (bool masks as f32 0/1: 1 = not allowed), when the case has one
    out                 the output
    weights             the attention weights averaged over heads (need_weights=True cases)
    r                   the tensor the loss sum(out * r) is made with
    grad.<name>         the loss's gradient for every input and parameter

The __metadata__ holds, per case, "<case>" = a JSON object of its settings
(embed_dim, num_heads, bias, batch_first, self, mask: none|float|bool|causal,
need_weights). "causal" runs PyTorch with the boolean triu(1) mask (1.13's
MultiheadAttention has no is_causal); the spec passes is_causal = true instead.

    /usr/bin/python3 tests/reference/make_mha_fixture.py     (Debian's python3-torch)
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_optim_fixtures import write_safetensors  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "mha.safetensors")

# name, E, H, bias, batch_first, self-attention, N, L, S, mask, need_weights
CASES = [
    ("self_seq", 8, 2, True, False, True, 3, 5, 5, "none", False),
    ("cross_bf", 8, 4, True, True, False, 2, 4, 6, "none", False),
    ("self_float_mask_weights", 8, 2, True, True, True, 2, 5, 5, "float", True),
    ("cross_bool_mask_seq", 12, 3, True, False, False, 2, 4, 7, "bool", True),
    ("self_causal_bf", 8, 2, True, True, True, 3, 6, 6, "causal", False),
    ("cross_nobias_seq_weights", 6, 3, False, False, False, 2, 3, 4, "none", True),
]


def main():
    tensors, meta = {}, {"generator": "tests/reference/make_mha_fixture.py", "torch": torch.__version__}
    for name, E, H, bias, bf, self_attn, N, L, S, mask_kind, need in CASES:
        gen = torch.Generator().manual_seed(sum(map(ord, name)) + 27)
        torch.manual_seed(1000 + len(name))
        m = torch.nn.MultiheadAttention(E, H, bias=bias, batch_first=bf)
        with torch.no_grad():   # biases away from zero, so that their gradients and use are checked
            if bias:
                m.in_proj_bias.copy_(torch.randn(3 * E, generator=gen) * 0.1)
                m.out_proj.bias.copy_(torch.randn(E, generator=gen) * 0.1)

        def shape(t):
            return (N, t, E) if bf else (t, N, E)
        if self_attn:
            x = torch.randn(*shape(L), generator=gen).requires_grad_(True)
            inputs = {"x": x}
            q = k = v = x
        else:
            q = torch.randn(*shape(L), generator=gen).requires_grad_(True)
            k = torch.randn(*shape(S), generator=gen).requires_grad_(True)
            v = torch.randn(*shape(S), generator=gen).requires_grad_(True)
            inputs = {"query": q, "key": k, "value": v}
        mask, stored = None, None
        if mask_kind == "float":
            mask = torch.randn(L, S, generator=gen)
            stored = mask
        elif mask_kind == "bool":
            mask = torch.rand(L, S, generator=gen) < 0.3
            mask[:, 0] = False   # every query sees at least one key
            stored = mask.float()
        elif mask_kind == "causal":
            mask = torch.ones(L, S, dtype=torch.bool).triu(1)
        out, w = m(q, k, v, attn_mask=mask, need_weights=need)
        r = torch.randn(*out.shape, generator=gen)
        (out * r).sum().backward()
        p = name + "."
        for pn, t in m.named_parameters():
            tensors[p + "param." + pn] = t.detach()
            tensors[p + "grad." + pn] = t.grad
        for n, t in inputs.items():
            tensors[p + "input." + n] = t.detach()
            tensors[p + "grad." + n] = t.grad
        if stored is not None:
            tensors[p + "mask"] = stored
        tensors[p + "out"] = out.detach()
        tensors[p + "r"] = r
        if need:
            tensors[p + "weights"] = w.detach()
        meta[name] = json.dumps(dict(embed_dim=E, num_heads=H, bias=bias, batch_first=bf, self=self_attn,
                                     mask=mask_kind, need_weights=need), sort_keys=True)
    size = write_safetensors(OUT, tensors, meta)
    print("mha.safetensors %d bytes, %d cases" % (size, len(CASES)))


if __name__ == "__main__":
    main()
