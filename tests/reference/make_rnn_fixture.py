#!/usr/bin/python3
"""make_rnn_fixture.py: PyTorch reference values for tests/lua/rnn_spec.lua.

For three small recurrent networks (torch.nn.LSTM and torch.nn.GRU) this
writes one safetensors file each in tests/reference/fixtures/ (rnn_*.safetensors)
with the input, the initial states, the weights under PyTorch's state_dict
names, the outputs and every gradient, in the layout of make_fixtures.py:

    input.<name>    x, h0, c0 and the fixed weights r_* of the loss
    param.<name>    weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0, ... (state_dict names)
    out.<name>      output, h_n (and c_n)
    loss            sum(output * r_out) + sum(h_n * r_h) (+ sum(c_n * r_c)), 0-d
    grad.<name>     d loss / d <name> for x, h0, c0 and every param

The weights are drawn as PyTorch's init draws them (U(-1/sqrt(hidden),
1/sqrt(hidden)), float32); the passes run in float64 from the float32 values
and are rounded to float32 once, as make_fixtures.py does.

    /usr/bin/python3 tests/reference/make_rnn_fixture.py     (Debian's python3-torch)
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import OUT, f32, write_safetensors  # noqa: E402


def rnn_fixture(name, kind, gen, input_size, hidden, layers, batch, seq, batch_first, bias, with_state):
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    m = cls(input_size, hidden, num_layers=layers, bias=bias, batch_first=batch_first).double()
    bound = 1 / math.sqrt(hidden)
    params = {k: f32(*v.shape, gen=gen, lo=-bound, hi=bound) for k, v in m.state_dict().items()}
    m.load_state_dict({k: v.double() for k, v in params.items()})
    xshape = (batch, seq, input_size) if batch_first else (seq, batch, input_size)
    inputs = {"x": f32(*xshape, gen=gen)}
    if with_state:
        inputs["h0"] = f32(layers, batch, hidden, gen=gen, scale=0.5)
        if kind == "lstm":
            inputs["c0"] = f32(layers, batch, hidden, gen=gen, scale=0.5)
    oshape = (batch, seq, hidden) if batch_first else (seq, batch, hidden)
    inputs["r_out"] = f32(*oshape, gen=gen)
    inputs["r_h"] = f32(layers, batch, hidden, gen=gen)
    if kind == "lstm":
        inputs["r_c"] = f32(layers, batch, hidden, gen=gen)

    leaves = {k: v.double().requires_grad_(k[:2] != "r_") for k, v in inputs.items()}
    if kind == "lstm":
        state = (leaves["h0"], leaves["c0"]) if with_state else None
        output, (h_n, c_n) = m(leaves["x"], state)
        loss = (output * leaves["r_out"]).sum() + (h_n * leaves["r_h"]).sum() + (c_n * leaves["r_c"]).sum()
    else:
        output, h_n = m(leaves["x"], leaves["h0"] if with_state else None)
        loss = (output * leaves["r_out"]).sum() + (h_n * leaves["r_h"]).sum()
    loss.backward()

    out = {"loss": loss.detach().float(), "out.output": output.detach().float(), "out.h_n": h_n.detach().float()}
    if kind == "lstm":
        out["out.c_n"] = c_n.detach().float()
    for k, v in inputs.items():
        out["input." + k] = v
        if leaves[k].grad is not None:
            out["grad." + k] = leaves[k].grad.float()
    named = dict(m.named_parameters())
    for k, v in params.items():
        out["param." + k] = v
        out["grad." + k] = named[k].grad.float()
    net = "%s(%d, %d, num_layers=%d, bias=%s, batch_first=%s), batch %d, seq %d, %s" % (
        cls.__name__, input_size, hidden, layers, bias, batch_first, batch, seq,
        "h0/c0 given" if with_state else "zero state")
    meta = {"net": net, "generator": "tests/reference/make_rnn_fixture.py", "torch": torch.__version__,
            "compute": "float64 from float32 inputs, rounded to float32", "kind": kind,
            "input_size": input_size, "hidden_size": hidden, "num_layers": layers, "bias": int(bias),
            "batch_first": int(batch_first), "with_state": int(with_state)}
    size = write_safetensors(os.path.join(OUT, name + ".safetensors"), out, meta)
    print("%-28s %8d bytes  loss %.9g" % (name + ".safetensors", size, loss.item()))
    return size


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    total = 0
    cases = [
        ("rnn_lstm", "lstm", dict(input_size=5, hidden=7, layers=2, batch=3, seq=6, batch_first=False, bias=True,
                                  with_state=True)),
        ("rnn_lstm_bf", "lstm", dict(input_size=4, hidden=6, layers=1, batch=2, seq=5, batch_first=True, bias=False,
                                     with_state=False)),
        ("rnn_gru", "gru", dict(input_size=5, hidden=7, layers=2, batch=3, seq=6, batch_first=True, bias=True,
                                with_state=True)),
    ]
    for i, (name, kind, kw) in enumerate(cases):
        gen = torch.Generator().manual_seed(2700 + i)
        total += rnn_fixture(name, kind, gen, **kw)
    print("%-28s %8d bytes" % ("total", total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
