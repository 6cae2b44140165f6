#!/usr/bin/env python3
"""Writes the reference the recurrent layers are tested against (`tests/rnn_pytorch.rs`): small
PyTorch cells and layers in float64 with their seeded initial weights, an input, and the outputs
and every gradient of a fixed weighted sum of the outputs, into one safetensors file:

    python3 scripts/torch_rnn_reference.py tests/data/rnn/reference.safetensors

Names: `<model>/<parameter>` for the weights (PyTorch's names, as arenagrad's modules have them),
`<model>/out/<output>` and `<model>/grad/<parameter or x>` for the results, `x`, `lengths` (as
float64) and the loss weights `w/<output>`.

Models: `lstm` (2 layers, bidirectional, packed with unsorted lengths), `gru` (the same), `rnn`
(one relu layer, batch first, full lengths, initial state given), and `lstm_cell`, `gru_cell`,
`rnn_cell` (three steps from a zero state, the loss on the last state).
"""
import sys

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from safetensors.torch import save_file

T, B, I, H = 5, 3, 3, 4
LENGTHS = [5, 2, 4]


def main(out):
    torch.manual_seed(0)
    x = torch.randn(T, B, I, dtype=torch.float64)
    tensors = {"x": x.clone(), "lengths": torch.tensor(LENGTHS, dtype=torch.float64)}

    def weights(name, shape):
        w = torch.randn(*shape, dtype=torch.float64)
        tensors[f"w/{name}"] = w
        return w

    def record(prefix, model, outs, xs):
        for n, p in model.named_parameters():
            tensors[f"{prefix}/{n}"] = p.detach().clone()
        loss = sum((o * weights(f"{prefix}/{k}", o.shape)).sum() for k, o in outs.items())
        loss.backward()
        for k, o in outs.items():
            tensors[f"{prefix}/out/{k}"] = o.detach().clone()
        for n, p in model.named_parameters():
            tensors[f"{prefix}/grad/{n}"] = p.grad.clone()
        tensors[f"{prefix}/grad/x"] = xs.grad.clone()

    for prefix, cls in [("lstm", nn.LSTM), ("gru", nn.GRU)]:
        model = cls(I, H, num_layers=2, bidirectional=True).double()
        xs = x.clone().requires_grad_()
        packed = pack_padded_sequence(xs, LENGTHS, enforce_sorted=False)
        y, state = model(packed)
        y, _ = pad_packed_sequence(y, total_length=T)
        outs = {"output": y}
        if prefix == "lstm":
            outs["h_n"], outs["c_n"] = state
        else:
            outs["h_n"] = state
        record(prefix, model, outs, xs)

    model = nn.RNN(I, H, nonlinearity="relu", batch_first=True).double()
    xs = x.transpose(0, 1).contiguous().requires_grad_()
    h0 = torch.randn(1, B, H, dtype=torch.float64)
    tensors["rnn/h0"] = h0
    y, h_n = model(xs, h0)
    record("rnn", model, {"output": y, "h_n": h_n}, xs)

    for prefix, cls in [("lstm_cell", nn.LSTMCell), ("gru_cell", nn.GRUCell), ("rnn_cell", nn.RNNCell)]:
        model = cls(I, H).double()
        xs = x.clone().requires_grad_()
        state = None
        for t in range(3):
            state = model(xs[t], state)
        outs = {"h": state[0], "c": state[1]} if prefix == "lstm_cell" else {"h": state}
        record(prefix, model, outs, xs)

    save_file({k: v.contiguous() for k, v in tensors.items()}, out)
    print(f"wrote {len(tensors)} tensors to {out} (PyTorch {torch.__version__})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/rnn/reference.safetensors")
