#!/usr/bin/env python3
"""Writes the reference the character GPT is held to under bf16 autocast (`tests/char_gpt_parity.rs`):
the small model of `tests/data/char_gpt/init.safetensors` (context 16, 2 blocks of width 16, 2
heads; `scripts/torch_char_gpt.py`'s `Gpt`) on a fixed batch of 4 × 16 tokens, its loss computed
inside `torch.autocast("cpu", dtype=torch.bfloat16)` and `loss.backward()` after it:

    python3 scripts/torch_gpt_autocast_reference.py tests/data/char_gpt/autocast_bf16.safetensors

Names: `loss` (float32, [1]), `logits` (the bf16 logits as float32, [4, 16, 256]) and
`grad/<parameter>` (each parameter's float32 gradient, under its state-dict name). The batch:
token `(37·k + 11) mod 256` at position k of the 4 × 17 window, inputs the first 16, targets the
last 16. Needs torch and safetensors.
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_char_gpt import Gpt  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main(out):
    torch.manual_seed(0)
    model = Gpt(256, 16, 2, 2, 16, 0.0)
    model.load_state_dict(load_file(os.path.join(ROOT, "tests/data/char_gpt/init.safetensors")))
    model.train()
    w = torch.tensor([(37 * k + 11) % 256 for k in range(4 * 17)]).reshape(4, 17)
    x, y = w[:, :-1], w[:, 1:]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
    loss.backward()
    tensors = {"loss": loss.detach().reshape(1).float(), "logits": logits.detach().float()}
    for name, p in model.named_parameters():
        tensors[f"grad/{name}"] = p.grad.detach().float().contiguous()
    save_file(tensors, out)


if __name__ == "__main__":
    main(sys.argv[1])
