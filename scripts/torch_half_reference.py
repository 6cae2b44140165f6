#!/usr/bin/env python3
"""Writes the 16-bit checkpoint the loaders are tested against (`crates/nn/tests/half.rs`): a
`torch.nn.Linear(4, 3)` state dict stored in bfloat16 and the same in float16, beside the float32
weights they were rounded from and the layer's output for a fixed input, computed by PyTorch in
each dtype:

    python3 scripts/torch_half_reference.py tests/data/half/linear.safetensors

Names: `bf16/weight`, `bf16/bias`, `f16/weight`, `f16/bias` (the state dicts), `f32/weight`,
`f32/bias`, `x` (float32, [2, 4]) and `bf16/out`, `f16/out` (the output in that dtype).
Needs torch and safetensors.
"""
import sys

import torch
from safetensors.torch import save_file


def main(out):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    x = torch.tensor([[0.5, -1.25, 2.0, 0.3], [1.7, 0.0, -0.9, 3.3]], dtype=torch.float32)
    tensors = {
        "f32/weight": layer.weight.detach().clone(),
        "f32/bias": layer.bias.detach().clone(),
        "x": x,
    }
    for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        low = torch.nn.Linear(4, 3).to(dtype)
        low.load_state_dict({k: v.to(dtype) for k, v in layer.state_dict().items()})
        for k, v in low.state_dict().items():
            tensors[f"{name}/{k}"] = v.detach().clone()
        with torch.no_grad():
            tensors[f"{name}/out"] = low(x.to(dtype))
    save_file(tensors, out)


if __name__ == "__main__":
    main(sys.argv[1])
