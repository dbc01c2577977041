#!/usr/bin/python3
"""make_fixtures.py: PyTorch reference values for tests/lua/reference_spec.lua.

For a few small composite networks this writes, per network, one safetensors
file in tests/reference/fixtures/ holding fixed inputs and weights, the loss
and every gradient (weights and inputs), computed by PyTorch. The spec rebuilds
each network with mpengine's ops from the same inputs and weights and compares.

    /usr/bin/python3 tests/reference/make_fixtures.py     (Debian's python3-torch)

Tensor names in a file:
    input.<name>    inputs (f32, or i32 class ids / indices)
    param.<name>    weights, named as PyTorch's state_dict names them
    loss            the loss, a 0-d f32 tensor
    grad.<name>     d loss / d <name> for every float input and every param
The __metadata__ says what the network is (`net`, in words) and the settings
the spec needs (eps, reduction, ...).

Inputs and weights are drawn in float32 with a fixed seed. The forward and
backward passes then run in float64 from those float32 values, and the results
are rounded to float32 once: the reference is the exact answer to f32
precision, not PyTorch's own f32 rounding. The files are written by this
script's own safetensors writer (8-byte little-endian header length, JSON
header, raw little-endian data), so the `safetensors` package is not needed.
Regenerating gives byte-identical files on the same torch version.
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

DTYPES = {torch.float32: ("F32", "<f"), torch.int32: ("I32", "<i"), torch.int64: ("I64", "<q")}


def write_safetensors(path, tensors, metadata):
    """tensors: {name: tensor (f32, i32 or i64, any shape)}; metadata: {str: str}"""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        code, fmt = DTYPES[t.dtype]
        values = t.reshape(-1).tolist()
        data = struct.pack("<%d%s" % (len(values), fmt[1]), *values)
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)   # pad the header to 8 bytes, as the reference writer does
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)
    return 8 + len(text) + offset


def f32(*shape, gen, scale=1.0, lo=None, hi=None):
    """float32 values: normal * scale, or uniform in [lo, hi]"""
    if lo is not None:
        return (torch.rand(*shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(torch.float32)
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * scale).to(torch.float32)


def fixture(name, net, inputs, params, forward, metadata, extra=None):
    """run forward in float64 from the f32 inputs and params; write the file.
    extra(): more tensors to store ({name: tensor}), read after the backward
    (a network's updated running statistics, say)"""
    leaves = {}
    for k, v in list(inputs.items()) + list(params.items()):
        if v.dtype == torch.float32:
            leaves[k] = v.double().requires_grad_(True)
        else:
            leaves[k] = v
    loss = forward(leaves)
    loss.backward()
    out = {"loss": loss.detach().float()}
    for k, v in inputs.items():
        out["input." + k] = v
        if v.dtype == torch.float32:
            out["grad." + k] = leaves[k].grad.float()
    for k, v in params.items():
        out["param." + k] = v
        out["grad." + k] = leaves[k].grad.float()
    if extra:
        out.update(extra())
    meta = {"net": net, "generator": "tests/reference/make_fixtures.py",
            "torch": torch.__version__, "compute": "float64 from float32 inputs, rounded to float32"}
    meta.update(metadata)
    size = write_safetensors(os.path.join(OUT, name + ".safetensors"), out, meta)
    print("%-28s %8d bytes  loss %.9g" % (name + ".safetensors", size, loss.item()))
    return size


def mlp(gen):
    # MLP 784 -> 32 -> 10 with ReLU on a batch of 8, cross_entropy (mean); PyTorch's default
    # Linear init (U(-1/sqrt(in), 1/sqrt(in))), names as nn.Sequential(Linear, ReLU, Linear) gives
    bound1, bound2 = 1 / math.sqrt(784), 1 / math.sqrt(32)
    inputs = {
        "x": f32(8, 784, gen=gen, lo=0.0, hi=1.0),   # like Fashion-MNIST pixels
        "target": torch.randint(0, 10, (8,), generator=gen, dtype=torch.int64).to(torch.int32),
    }
    params = {
        "0.weight": f32(32, 784, gen=gen, lo=-bound1, hi=bound1),
        "0.bias": f32(32, gen=gen, lo=-bound1, hi=bound1),
        "2.weight": f32(10, 32, gen=gen, lo=-bound2, hi=bound2),
        "2.bias": f32(10, gen=gen, lo=-bound2, hi=bound2),
    }

    def forward(v):
        h = F.relu(F.linear(v["x"], v["0.weight"], v["0.bias"]))
        logits = F.linear(h, v["2.weight"], v["2.bias"])
        return F.cross_entropy(logits, v["target"].long())

    return fixture("mlp", "Sequential(Linear(784,32), ReLU, Linear(32,10)); cross_entropy mean over a batch of 8",
                   inputs, params, forward, {"reduction": "mean"})


def ln_gelu(gen):
    # LayerNorm(6) -> GELU (erf) -> Linear(6,3) -> mse_loss against a target that also gets a gradient;
    # the LayerNorm affine parameters are not at their defaults, so their gradients mean something
    inputs = {"x": f32(4, 6, gen=gen, scale=2.0), "y": f32(4, 3, gen=gen)}
    params = {
        "0.weight": f32(6, gen=gen, lo=0.5, hi=1.5),
        "0.bias": f32(6, gen=gen, scale=0.1),
        "2.weight": f32(3, 6, gen=gen, lo=-0.4, hi=0.4),
        "2.bias": f32(3, gen=gen, lo=-0.4, hi=0.4),
    }

    def forward(v):
        h = F.layer_norm(v["x"], (6,), v["0.weight"], v["0.bias"], eps=1e-5)
        h = F.gelu(h)
        out = F.linear(h, v["2.weight"], v["2.bias"])
        return F.mse_loss(out, v["y"])

    return fixture("ln_gelu", "Sequential(LayerNorm(6), GELU(), Linear(6,3)); mse_loss(out, y)",
                   inputs, params, forward, {"eps": "1e-05", "gelu": "none"})


def ln_gelu_tanh_3d(gen):
    # the same on a 3-d input {2,3,6} with GELU's tanh form and LayerNorm eps 1e-3
    inputs = {"x": f32(2, 3, 6, gen=gen, scale=1.5), "y": f32(2, 3, 3, gen=gen)}
    params = {
        "0.weight": f32(6, gen=gen, lo=0.5, hi=1.5),
        "0.bias": f32(6, gen=gen, scale=0.1),
        "2.weight": f32(3, 6, gen=gen, lo=-0.4, hi=0.4),
        "2.bias": f32(3, gen=gen, lo=-0.4, hi=0.4),
    }

    def forward(v):
        h = F.layer_norm(v["x"], (6,), v["0.weight"], v["0.bias"], eps=1e-3)
        h = F.gelu(h, approximate="tanh")
        out = F.linear(h, v["2.weight"], v["2.bias"])
        return F.mse_loss(out, v["y"])

    return fixture("ln_gelu_tanh_3d", "LayerNorm(6, eps=1e-3) -> GELU(tanh) -> Linear(6,3) on {2,3,6}; mse_loss",
                   inputs, params, forward, {"eps": "0.001", "gelu": "tanh"})


def embed_bag(gen):
    # Embedding(10, 8) on indices {4,5} (with repeats) -> mean over the 5 positions -> Linear(8, 6)
    # -> log_softmax -> cross_entropy of the log-probabilities (= NLL, log_softmax being idempotent)
    idx = torch.tensor([[1, 3, 3, 7, 0], [9, 9, 9, 2, 4], [5, 1, 1, 1, 8], [0, 2, 4, 6, 8]], dtype=torch.int32)
    inputs = {"idx": idx, "target": torch.tensor([2, 0, 5, 3], dtype=torch.int32)}
    params = {
        "emb.weight": f32(10, 8, gen=gen),
        "fc.weight": f32(6, 8, gen=gen, lo=-0.35, hi=0.35),
        "fc.bias": f32(6, gen=gen, lo=-0.35, hi=0.35),
    }

    def forward(v):
        e = F.embedding(v["idx"].long(), v["emb.weight"])   # {4,5,8}
        h = e.mean(dim=1)                                    # {4,8}
        logp = F.log_softmax(F.linear(h, v["fc.weight"], v["fc.bias"]), dim=-1)
        return F.cross_entropy(logp, v["target"].long())

    return fixture("embed_bag", "Embedding(10,8) -> mean over positions -> Linear(8,6) -> log_softmax -> "
                   "cross_entropy", inputs, params, forward, {"reduction": "mean"})


def attention(gen):
    # one attention head over x {B=2, T=4, D=8}: q, k, v = x Wq^T, x Wk^T, x Wv^T (no bias),
    # p = softmax(q k^T / sqrt(8), -1), o = p v, out = o Wo^T + bo, mse_loss against y
    D = 8
    b = 1 / math.sqrt(D)
    inputs = {"x": f32(2, 4, D, gen=gen), "y": f32(2, 4, D, gen=gen)}
    params = {
        "wq.weight": f32(D, D, gen=gen, lo=-b, hi=b),
        "wk.weight": f32(D, D, gen=gen, lo=-b, hi=b),
        "wv.weight": f32(D, D, gen=gen, lo=-b, hi=b),
        "wo.weight": f32(D, D, gen=gen, lo=-b, hi=b),
        "wo.bias": f32(D, gen=gen, lo=-b, hi=b),
    }

    def forward(v):
        x = v["x"]
        q, k, val = F.linear(x, v["wq.weight"]), F.linear(x, v["wk.weight"]), F.linear(x, v["wv.weight"])
        s = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(D)
        p = F.softmax(s, dim=-1)
        o = torch.matmul(p, val)
        out = F.linear(o, v["wo.weight"], v["wo.bias"])
        return F.mse_loss(out, v["y"])

    return fixture("attention", "single-head attention on {2,4,8}: softmax(q k^T / sqrt(8)) v, output "
                   "projection, mse_loss", inputs, params, forward, {"scale": repr(1 / math.sqrt(D))})


def misc(gen):
    # elementwise and shape ops end to end: sigmoid, tanh, narrow, cat, where (cond from a
    # comparison), exp, log, sqrt, pow, abs, max along a dim, 3-d cross_entropy with sum
    inputs = {"x": f32(3, 4, gen=gen), "z": f32(3, 4, gen=gen, lo=0.5, hi=2.0),
              "target": torch.tensor([[1, 0, 3], [2, 2, 0]], dtype=torch.int32)}
    params = {"w": f32(4, gen=gen, lo=-1.0, hi=1.0)}

    def forward(v):
        x, z, w = v["x"], v["z"], v["w"]
        a = torch.sigmoid(x) * w                                  # {3,4}, w broadcast
        b = torch.cat([a, x.narrow(1, 1, 2) * 2, torch.tanh(z.narrow(1, 0, 2))], dim=1)   # {3,8}
        cond = b.detach() > 0.25
        margin = (b.detach() - 0.25).abs().min().item()
        assert margin > 1e-3, "where's condition too close to its threshold: %g" % margin
        c = torch.where(cond, b, b * b * 0.5)
        d = c.exp() + z.log().repeat(1, 2) + z.sqrt().pow(3).repeat(1, 2) - c.abs()   # {3,8}
        m = d.reshape(3, 2, 4).max(dim=2).values                  # {3,2}
        logits = d.reshape(2, 3, 4)                                # 3-d logits, targets {2,3}
        ce = F.cross_entropy(logits.reshape(6, 4), v["target"].reshape(6).long(), reduction="sum")
        return ce + m.mean() + (x.transpose(0, 1) ** 2).sum() * 0.01

    return fixture("misc", "elementwise and shape ops: sigmoid tanh narrow cat where exp log sqrt pow abs max "
                   "cross_entropy(3-d, sum)", inputs, params, forward, {"threshold": "0.25"})


def rms_norm(gen):
    # RMSNorm(6) -> Linear(6,3) -> mse_loss on a 3-d input {2,3,6}: y = x / sqrt(mean(x^2) + eps) * w,
    # the definition of torch.nn.RMSNorm (PyTorch 2.4; written out here, this torch predates it), with
    # eps = 1e-6 and a weight away from its default of ones
    inputs = {"x": f32(2, 3, 6, gen=gen, scale=1.5), "y": f32(2, 3, 3, gen=gen)}
    params = {
        "0.weight": f32(6, gen=gen, lo=0.5, hi=1.5),
        "1.weight": f32(3, 6, gen=gen, lo=-0.4, hi=0.4),
        "1.bias": f32(3, gen=gen, lo=-0.4, hi=0.4),
    }

    def forward(v):
        x = v["x"]
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * v["0.weight"]
        out = F.linear(h, v["1.weight"], v["1.bias"])
        return F.mse_loss(out, v["y"])

    return fixture("rms_norm", "RMSNorm(6, eps=1e-6) -> Linear(6,3) on {2,3,6}; mse_loss",
                   inputs, params, forward, {"eps": "1e-06"})


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    total = 0
    for i, make in enumerate([mlp, ln_gelu, ln_gelu_tanh_3d, embed_bag, attention, misc, rms_norm]):
        gen = torch.Generator().manual_seed(1000 + i)
        total += make(gen)
    print("%-28s %8d bytes" % ("total", total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
