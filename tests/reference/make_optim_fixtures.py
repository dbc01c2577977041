#!/usr/bin/python3
"""make_optim_fixtures.py: PyTorch reference runs for tests/lua/optim_spec.lua.

For each optimizer configuration below this runs torch.optim (SGD, Adam, AdamW,
RMSprop, Adagrad;
PyTorch 1.13's single-tensor implementations, foreach=False) in float32 over two
parameters, p1 {5,3} and p2 {4}, for five steps with a fixed sequence of
gradients, and writes tests/reference/fixtures/optim_<config>.safetensors:

    init.<p>            the parameter before the first step
    grad.<p>.<k>        the gradient assigned to .grad before step k (k = 1..5)
    param.<p>.<k>       the parameter after step k
    state.<p>.<name>    the optimizer state after the last step: momentum_buffer
                        (SGD with momentum), exp_avg and exp_avg_sq (Adam/AdamW),
                        square_avg [momentum_buffer] [grad_avg] (RMSprop), sum (Adagrad)

The __metadata__ holds the configuration: `optimizer` (SGD | Adam | AdamW |
RMSprop | Adagrad), its hyperparameters as PyTorch got them (lr, momentum,
dampening, weight_decay, nesterov, beta1, beta2, eps; alpha, centered; lr_decay,
initial_accumulator_value), `lrs` (the lr used at each step, comma-separated:
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
import math
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
    ("rmsprop_default", "RMSprop", dict(), None),
    ("rmsprop_momentum_wd", "RMSprop", dict(lr=1e-2, alpha=0.9, eps=1e-6, weight_decay=0.1, momentum=0.9), None),
    ("rmsprop_centered", "RMSprop", dict(lr=1e-2, centered=True), None),
    ("rmsprop_centered_momentum", "RMSprop", dict(lr=5e-3, centered=True, momentum=0.5, weight_decay=0.01), None),
    ("adagrad_default", "Adagrad", dict(), None),
    ("adagrad_decay_wd_init", "Adagrad",
     dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.5, eps=1e-8), None),
]

DEFAULTS = {
    "SGD": dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    "Adam": dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    "AdamW": dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    "RMSprop": dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False),
    "Adagrad": dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10),
}
STATE_KEYS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "square_avg", "grad_avg", "sum")


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
        for key in STATE_KEYS:
            if torch.is_tensor(st.get(key)):
                state[n + "." + key] = st[key].detach().clone()
    return after, state


# Learning-rate schedules: name -> (optimizer, its options, scheduler, its options, steps).
# Each records the group's lr (and momentum or beta1 for OneCycleLR) after construction and
# after each of `steps` optimizer steps and scheduler steps; ReduceLROnPlateau steps with the
# metric sequence below. Written to fixtures/optim_schedules.safetensors, all in its metadata:
#   <name>.lrs         comma-separated repr()s, steps + 1 values
#   <name>.momentum    the same for momentum (SGD) or betas[0] (Adam), OneCycleLR only
#   plateau_metrics    the metrics fed to ReduceLROnPlateau.step, one per step
SCHED_STEPS = 60
METRICS = [round(1.0 / (1 + 0.1 * k) + 0.05 * math.sin(1.3 * k), 4) for k in range(SCHED_STEPS)]
SCHEDULES = [
    ("step", "SGD", dict(lr=0.1), "StepLR", dict(step_size=7, gamma=0.5)),
    ("multistep", "SGD", dict(lr=0.1), "MultiStepLR", dict(milestones=[5, 12, 12, 30], gamma=0.3)),
    ("exponential", "SGD", dict(lr=0.1), "ExponentialLR", dict(gamma=0.9)),
    ("onecycle_cos", "SGD", dict(lr=0.1, momentum=0.9), "OneCycleLR", dict(max_lr=0.5, total_steps=SCHED_STEPS)),
    ("onecycle_linear_three", "Adam", dict(lr=1e-3), "OneCycleLR",
     dict(max_lr=0.2, epochs=6, steps_per_epoch=10, anneal_strategy="linear", three_phase=True, pct_start=0.25,
          div_factor=10.0, final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9)),
    ("plateau_min_rel", "SGD", dict(lr=0.1), "ReduceLROnPlateau",
     dict(factor=0.5, patience=2, threshold=0.01, cooldown=1, min_lr=0.003)),
    ("plateau_max_abs", "SGD", dict(lr=0.1), "ReduceLROnPlateau",
     dict(mode="max", threshold_mode="abs", threshold=0.02, patience=1, factor=0.2, eps=1e-3)),
]


def schedules():
    meta = {"generator": "tests/reference/make_optim_fixtures.py", "torch": torch.__version__,
            "steps": str(SCHED_STEPS), "plateau_metrics": ",".join(repr(m) for m in METRICS)}
    for name, okind, oopts, skind, sopts in SCHEDULES:
        p = torch.zeros(2, requires_grad=True)
        opt = getattr(torch.optim, okind)([p], **oopts)
        sched = getattr(torch.optim.lr_scheduler, skind)(opt, **sopts)
        lrs, moms = [], []

        def record():
            g = opt.param_groups[0]
            lrs.append(g["lr"])
            moms.append(g["betas"][0] if "betas" in g else g.get("momentum", 0.0))
        record()
        for k in range(SCHED_STEPS):
            p.grad = torch.ones(2)
            opt.step()
            if skind == "ReduceLROnPlateau":
                sched.step(METRICS[k])
            else:
                sched.step()
            record()
        meta[name + ".lrs"] = ",".join(repr(float(x)) for x in lrs)
        if skind == "OneCycleLR":
            meta[name + ".momentum"] = ",".join(repr(float(x)) for x in moms)
        print("schedule %-24s lr %.6g -> %.6g" % (name, lrs[0], lrs[-1]))
    size = write_safetensors(os.path.join(OUT, "optim_schedules.safetensors"), {"unused": torch.zeros(1)}, meta)
    print("optim_schedules.safetensors %d bytes" % size)


def main():
    os.makedirs(OUT, exist_ok=True)
    schedules()
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
            "lr": repr(full["lr"]),
            "weight_decay": repr(float(full["weight_decay"])),
            "steps": str(STEPS),
            "lrs": ",".join(repr(x) for x in (lrs or [full["lr"]] * STEPS)),
            "generator": "tests/reference/make_optim_fixtures.py",
            "torch": torch.__version__,
        }
        if kind == "SGD":
            meta.update(momentum=repr(float(full["momentum"])), dampening=repr(float(full["dampening"])),
                        nesterov="true" if full["nesterov"] else "false")
        elif kind == "RMSprop":
            meta.update(alpha=repr(float(full["alpha"])), eps=repr(full["eps"]), momentum=repr(float(full["momentum"])),
                        centered="true" if full["centered"] else "false")
        elif kind == "Adagrad":
            meta.update(lr_decay=repr(float(full["lr_decay"])), eps=repr(full["eps"]),
                        initial_accumulator_value=repr(float(full["initial_accumulator_value"])))
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
