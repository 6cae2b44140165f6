#!/usr/bin/env python3
"""Writes the torchvision reference the ResNet loader is tested against
(`tests/hf_models.rs`): `torchvision.models.resnet18` itself, in evaluation mode, with weights
that both sides compute from a formula (so that 47 MB of weights need not be stored), and what it
computes:

    python3 scripts/torchvision_reference.py tests/data/torchvision

Writes `resnet18.json` (the state dict's names, shapes and dtypes in torchvision's order: what a
converted torchvision checkpoint holds, `num_batches_tracked` included) and
`resnet18_reference.safetensors` (inputs `input/{case}` and class scores `logits/{case}` for
images of 2 × 3 × 64 × 64, 1 × 3 × 97 × 81 and 1 × 3 × 224 × 224).

The weights: tensor number `t` (its place in the list, from 0), element `i`:
`h = mix((i · 2654435761 + (t + 1) · 40503) mod 2³²)`, `u = (h mod 2001) / 1000 − 1` (in f64),
with `mix(h)`: `h ^= h >> 15; h = h · 2246822519 mod 2³²; h ^= h >> 13`; then convolution and
linear weights `u · √(6 / fan_in)`, batch-norm weights `0.5 + u / 4` (so that the
scores stay near 1 through the residual sums), biases and running means
`u / 10`, running variances `1 + u / 2`, each rounded once to f32.

Needs torch, torchvision and safetensors (PyPI). Deterministic.
"""
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file


def uniform(t, n):
    """The formula's `u` for tensor `t`, elements 0..n (f64)."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64((t + 1) * 40503)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(13)
    return (h % np.uint64(2001)).astype(np.float64) / 1000.0 - 1.0


def value(t, name, shape):
    n = int(np.prod(shape)) if shape else 1
    u = uniform(t, n)
    last = name.rsplit(".", 1)[-1]
    if last == "weight" and len(shape) > 1:
        fan_in = n // shape[0]
        v = u * math.sqrt(6.0 / fan_in)
    elif last == "weight":
        v = 0.5 + u / 4.0
    elif last == "running_var":
        v = 1.0 + u / 2.0
    else:  # bias, running_mean
        v = u / 10.0
    return torch.from_numpy(v.astype(np.float32).reshape(shape))


def main(out):
    import torchvision

    model = torchvision.models.resnet18(weights=None).eval()
    names = []
    state = {}
    for t, (name, p) in enumerate(model.state_dict().items()):
        names.append({"name": name, "shape": list(p.shape), "dtype": str(p.dtype).split(".")[-1]})
        if p.dtype == torch.int64:
            state[name] = torch.tensor(100, dtype=torch.int64)
        else:
            state[name] = value(t, name, list(p.shape))
    model.load_state_dict(state, strict=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "resnet18.json"), "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(n) for n in names) + "\n]\n")
    gen = torch.Generator().manual_seed(0)
    ref = {}
    for b, h, w in [(2, 64, 64), (1, 97, 81), (1, 224, 224)]:
        x = torch.randn(b, 3, h, w, generator=gen)
        with torch.no_grad():
            y = model(x)
        key = f"{b}x3x{h}x{w}"
        ref[f"input/{key}"] = x
        ref[f"logits/{key}"] = y.contiguous()
        print(f"{key}: scores from {float(y.min()):.3f} to {float(y.max()):.3f}")
    save_file(ref, os.path.join(out, "resnet18_reference.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1])
