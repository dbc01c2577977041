#!/usr/bin/python3
"""make_cnn_fixture.py: PyTorch's loss, gradients and updated batch-norm
statistics for a small CNN of the definition in scripts/models/cnn.lua, for
tests/lua/cnn_reference_spec.lua.

The model (same parameter and buffer names as the Lua module): conv1 (3x3,
padding 1, no bias), bn1 (training: batch statistics), ReLU, 2x2 max pool;
conv2, bn2, ReLU, max pool; flatten; fc1, ReLU, fc2; mean cross-entropy.
Sizes are small (4 and 6 channels, 12 x 12 inputs, 16 hidden) so the file is.
The batch norm weights and biases are not at their defaults, and the running
statistics start away from theirs, so that every gradient and update means
something.

Writes tests/reference/fixtures/cnn.safetensors in the layout of
make_fixtures.py (input.x, input.target, param.<name>, loss, grad.<name>),
plus buffer.<name>: the batch norms' buffers before the step (the model's
state: running statistics, and num_batches_tracked as PyTorch stores it, I64)
and after.<name>: the same after one training forward (momentum 0.1,
unbiased variance), computed in float64 from float32 values.

    /usr/bin/python3 tests/reference/make_cnn_fixture.py     (Debian's python3-torch)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import f32, fixture  # noqa: E402

BATCH, SIZE, C1, C2, HIDDEN, CLASSES = 5, 12, 4, 6, 16, 10


def cnn(gen):
    inputs = {
        "x": f32(BATCH, 1, SIZE, SIZE, gen=gen, lo=0.0, hi=1.0),   # like Fashion-MNIST pixels
        "target": torch.randint(0, CLASSES, (BATCH,), generator=gen, dtype=torch.int64).to(torch.int32),
    }
    params = {}
    b1, b2 = 1 / math.sqrt(1 * 9), 1 / math.sqrt(C1 * 9)
    params["conv1.weight"] = f32(C1, 1, 3, 3, gen=gen, lo=-b1, hi=b1)
    params["conv2.weight"] = f32(C2, C1, 3, 3, gen=gen, lo=-b2, hi=b2)
    for bn, c in (("bn1", C1), ("bn2", C2)):
        params[bn + ".weight"] = f32(c, gen=gen, lo=0.5, hi=1.5)
        params[bn + ".bias"] = f32(c, gen=gen, lo=-0.2, hi=0.2)
    flat = C2 * (SIZE // 4) ** 2
    for name, fan_in, fan_out in (("fc1", flat, HIDDEN), ("fc2", HIDDEN, CLASSES)):
        b = 1 / math.sqrt(fan_in)
        params[name + ".weight"] = f32(fan_out, fan_in, gen=gen, lo=-b, hi=b)
        params[name + ".bias"] = f32(fan_out, gen=gen, lo=-b, hi=b)
    buffers = {}
    for bn, c in (("bn1", C1), ("bn2", C2)):
        buffers[bn + ".running_mean"] = f32(c, gen=gen, lo=-0.5, hi=0.5)
        buffers[bn + ".running_var"] = f32(c, gen=gen, lo=0.5, hi=2.0)
    running = {k: v.double().clone() for k, v in buffers.items()}
    for bn in ("bn1", "bn2"):   # PyTorch's own dtype for it: I64 in the file, read as i32 by mpengine
        buffers[bn + ".num_batches_tracked"] = torch.tensor(0, dtype=torch.int64)

    def forward(v):
        x = v["x"]
        for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
            x = F.conv2d(x, v[conv + ".weight"], None, padding=1)
            x = F.batch_norm(x, running[bn + ".running_mean"], running[bn + ".running_var"], v[bn + ".weight"],
                             v[bn + ".bias"], training=True, momentum=0.1, eps=1e-5)
            x = F.max_pool2d(F.relu(x), 2)
        x = F.relu(F.linear(x.flatten(1), v["fc1.weight"], v["fc1.bias"]))
        logits = F.linear(x, v["fc2.weight"], v["fc2.bias"])
        return F.cross_entropy(logits, v["target"].long())

    def extra():
        out = {"buffer." + k: v for k, v in buffers.items()}
        out.update({"after." + k: v.float() for k, v in running.items()})
        out.update({"after.%s.num_batches_tracked" % bn: torch.tensor(1, dtype=torch.int64) for bn in ("bn1", "bn2")})
        return out

    return fixture("cnn", "scripts/models/cnn.lua at 4 and 6 channels, 12 x 12 inputs: conv, batch norm (training), "
                   "ReLU, max pool, twice; fc1, ReLU, fc2; cross_entropy", inputs, params, forward,
                   {"batch": BATCH, "size": SIZE, "c1": C1, "c2": C2, "hidden": HIDDEN, "classes": CLASSES,
                    "generator": "tests/reference/make_cnn_fixture.py"}, extra)


def main():
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cnn(torch.Generator().manual_seed(2025))
    return 0


if __name__ == "__main__":
    sys.exit(main())
