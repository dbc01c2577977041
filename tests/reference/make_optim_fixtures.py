#!/usr/bin/python3
"""make_optim_fixtures.py: PyTorch reference runs for tests/lua/optim_spec.lua.

For each optimizer configuration below this runs torch.optim (SGD, Adam, AdamW;
PyTorch 1.13's single-tensor implementations, foreach=False) in float32 over two
parameters, p1 {5,3} and p2 {4}, for five steps with a fixed sequence of
gradients, and writes tests/reference/fixtures/optim_<config>.safetensors:

    init.<p>            the parameter before the first step
    grad.<p>.<k>        the gradient assigned to .grad before step k (k = 1..5)
    param.<p>.<k>       the parameter after step k
    state.<p>.<name>    the optimizer state after the last step: momentum_buffer
                        (SGD with momentum) or exp_avg and exp_avg_sq (Adam/AdamW)

The __metadata__ holds the configuration: `optimizer` (SGD | Adam | AdamW),
its hyperparameters as PyTorch got them (lr, momentum, dampening, weight_decay,
nesterov, beta1, beta2, eps), `lrs` (the lr used at each step, comma-separated:
a config may change opt.lr between steps), `steps`, and the generator and torch
version. Parameters and gradients are drawn in float32 from fixed seeds; all
configurations share them. This is PyTorch's own float32 arithmetic, not an
exact reference: the script also prints, per configuration, how far PyTorch's
float32 parameters are from the same run in float64, which bounds how closely
another float32 implementation can be expected to agree.

    /usr/bin/python3 tests/reference/make_optim_fixtures.py     (Debian's python3-torch)

The files are written by this script's own safetensors writer (as
make_fixtures.py does), so the `safetensors` package is not needed; the same
torch version gives byte-identical files.
"""
import json
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
STEPS = 5
SHAPES = {"p1": (5, 3), "p2": (4,)}
GRAD_SCALE = [1.0, 0.5, 2.0, 0.1, 1.0]   # per step: Adam's moments see changing magnitudes

# name -> (optimizer, hyperparameters, lr per step or None for a constant lr)
CONFIGS = [
    ("sgd_plain", "SGD", dict(lr=0.1), None),
    ("sgd_momentum", "SGD", dict(lr=0.1, momentum=0.9), None),
    ("sgd_momentum_damp_wd", "SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01), None),
    ("sgd_nesterov", "SGD", dict(lr=0.1, momentum=0.9, nesterov=True), None),
    ("adam_default", "Adam", dict(lr=1e-3), None),
    ("adam_wd_betas_eps", "Adam", dict(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6), None),
    ("adamw_default", "AdamW", dict(lr=1e-3), None),
    ("adamw_lr_wd", "AdamW", dict(lr=1e-2, weight_decay=0.1), None),
    # opt.lr changed between steps (param_groups[0]["lr"] in PyTorch)
    ("sgd_momentum_lr_change", "SGD", dict(lr=0.1, momentum=0.9), [0.1, 0.1, 0.05, 0.05, 0.2]),
    ("adam_lr_change", "Adam", dict(lr=1e-2), [1e-2, 1e-2, 3e-3, 3e-3, 2e-2]),
]

DEFAULTS = {
    "SGD": dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    "Adam": dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    "AdamW": dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
}


def write_safetensors(path, tensors, metadata):
    """tensors: {name: f32 tensor}; metadata: {str: str}"""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        assert t.dtype == torch.float32, name
        values = t.reshape(-1).tolist()
        data = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)
    return 8 + len(text) + offset


def inputs():
    """the shared initial parameters and gradient sequence, float32"""
    gen = torch.Generator().manual_seed(20240613)
    init = {n: torch.randn(*s, generator=gen, dtype=torch.float32) for n, s in SHAPES.items()}
    grads = {n: [torch.randn(*s, generator=gen, dtype=torch.float32) * GRAD_SCALE[k] for k in range(STEPS)]
             for n, s in SHAPES.items()}
    return init, grads


def run(kind, hyper, lrs, init, grads, dtype):
    params = {n: init[n].to(dtype).clone().requires_grad_(True) for n in SHAPES}
    cls = getattr(torch.optim, kind)
    opt = cls([params[n] for n in SHAPES], foreach=False, **hyper)
    after = {n: [] for n in SHAPES}
    for k in range(STEPS):
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[k]
        opt.zero_grad()
        for n in SHAPES:
            params[n].grad = grads[n][k].to(dtype).clone()
        opt.step()
        for n in SHAPES:
            after[n].append(params[n].detach().clone())
    state = {}
    for n in SHAPES:
        st = opt.state[params[n]]
        for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
            if st.get(key) is not None:
                state[n + "." + key] = st[key].detach().clone()
    return after, state


def main():
    os.makedirs(OUT, exist_ok=True)
    init, grads = inputs()
    total = 0
    for name, kind, hyper, lrs in CONFIGS:
        after, state = run(kind, hyper, lrs, init, grads, torch.float32)
        exact, exact_state = run(kind, hyper, lrs, init, grads, torch.float64)
        tensors = {}
        for n in SHAPES:
            tensors["init." + n] = init[n]
            for k in range(STEPS):
                tensors["grad.%s.%d" % (n, k + 1)] = grads[n][k]
                tensors["param.%s.%d" % (n, k + 1)] = after[n][k]
        for key, t in state.items():
            tensors["state." + key] = t
        full = dict(DEFAULTS[kind], **hyper)
        meta = {
            "optimizer": kind,
            "lr": repr(hyper["lr"]),
            "weight_decay": repr(float(full["weight_decay"])),
            "steps": str(STEPS),
            "lrs": ",".join(repr(x) for x in (lrs or [hyper["lr"]] * STEPS)),
            "generator": "tests/reference/make_optim_fixtures.py",
            "torch": torch.__version__,
        }
        if kind == "SGD":
            meta.update(momentum=repr(float(full["momentum"])), dampening=repr(float(full["dampening"])),
                        nesterov="true" if full["nesterov"] else "false")
        else:
            meta.update(beta1=repr(full["betas"][0]), beta2=repr(full["betas"][1]), eps=repr(full["eps"]))
        size = write_safetensors(os.path.join(OUT, "optim_%s.safetensors" % name), tensors, meta)
        total += size
        # PyTorch's own float32 rounding: max over params and steps of |f32 - f64| / max(|f64|, 1)
        worst = 0.0
        for n in SHAPES:
            for k in range(STEPS):
                d = (after[n][k].double() - exact[n][k]).abs().max().item()
                worst = max(worst, d / max(exact[n][k].abs().max().item(), 1.0))
        # and of the final state: |f32 - f64| / max |f64| per tensor
        worst_state = max([(state[k].double() - exact_state[k]).abs().max().item() / exact_state[k].abs().max().item()
                           for k in state] or [0.0])
        print("optim_%-40s %5d bytes  torch f32 vs f64: params %.3g, state %.3g"
              % (name + ".safetensors", size, worst, worst_state))
    print("total %d bytes" % total)


if __name__ == "__main__":
    main()
