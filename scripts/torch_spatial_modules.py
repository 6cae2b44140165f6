#!/usr/bin/env python3
"""Writes the PyTorch reference the spatial layers are tested against
(`tests/spatial_modules.rs`): PyTorch's own `nn.Conv1d`, depthwise `nn.Conv2d`, `nn.ConvTranspose1d`,
`nn.ConvTranspose2d`, `nn.GroupNorm`, `nn.InstanceNorm2d`, `nn.AdaptiveAvgPool2d` and
`nn.Upsample` (by size and by fractional factors, on images and on sound), their state dict as PyTorch saves it, and what
each computes:

    python3 scripts/torch_spatial_modules.py tests/data/spatial

Writes `modules.safetensors` (`Net().state_dict()` through `safetensors.torch.save_file`: the
names a PyTorch checkpoint of these layers carries) and `reference.safetensors`, for each case
`{case}/input`, `{case}/output`, `{case}/w` (the fixed weights of the loss `Σ w·y`),
`{case}/grad/input` and `{case}/grad/{parameter}` (the loss's gradients); `f64/…` cases run
`F.interpolate` by factors in float64 (images and `[N, C, L]` sound); `init/…` holds freshly initialised layers (PyTorch's
own draws, for their bounds).

Needs torch and safetensors (PyPI). Deterministic (seeded).
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2)
        self.convt1d = nn.ConvTranspose1d(
            6, 4, 4, stride=3, padding=1, output_padding=2, groups=2
        )
        self.convt1d_plain = nn.ConvTranspose1d(3, 5, 2, stride=2, bias=False)
        self.convt2d = nn.ConvTranspose2d(
            4,
            6,
            (3, 2),
            stride=(2, 1),
            padding=(1, 0),
            output_padding=(1, 0),
            dilation=(1, 2),
            groups=2,
        )
        self.depthwise = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.depthwise_x2 = nn.Conv2d(
            4, 8, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=4
        )
        self.gn = nn.GroupNorm(2, 6)
        self.inorm = nn.InstanceNorm2d(3)
        self.pool = nn.AdaptiveAvgPool2d((2, 3))
        self.up_nearest = nn.Upsample(scale_factor=1.5, mode="nearest")
        self.up_bilinear = nn.Upsample(scale_factor=(0.6, 1.75), mode="bilinear")
        self.up_corners = nn.Upsample(size=(9, 4), mode="bilinear", align_corners=True)
        self.up_sound_nearest = nn.Upsample(scale_factor=2.5, mode="nearest")
        self.up_sound_linear = nn.Upsample(size=23, mode="linear")


# The case, its input's shape.
CASES = [
    ("conv1d", (2, 4, 11)),
    ("convt1d", (2, 6, 7)),
    ("convt1d_plain", (1, 3, 9)),
    ("convt2d", (2, 4, 5, 6)),
    ("depthwise", (2, 6, 7, 6)),
    ("depthwise_x2", (2, 4, 9, 8)),
    ("gn", (2, 6, 4, 5)),
    ("inorm", (2, 3, 4, 5)),
    ("pool", (2, 3, 7, 8)),
    ("up_nearest", (1, 2, 5, 7)),
    ("up_bilinear", (2, 2, 7, 6)),
    ("up_corners", (1, 2, 5, 7)),
    ("up_sound_nearest", (2, 3, 9)),
    ("up_sound_linear", (2, 2, 9)),
]

# F.interpolate by factors in float64: (case, input shape, factors, mode, align_corners).
F64_CASES = [
    ("nearest_up", (1, 2, 5, 7), (1.5, 2.3), "nearest", None),
    ("nearest_down", (1, 1, 13, 17), (0.7, 0.45), "nearest", None),
    ("bilinear_up", (2, 1, 5, 7), (1.7, 1.25), "bilinear", False),
    ("bilinear_down", (1, 2, 13, 11), (0.35, 0.8), "bilinear", False),
    ("bilinear_corners", (1, 1, 6, 5), (1.5, 2.5), "bilinear", True),
    ("bilinear_same_height", (1, 1, 5, 6), (1.1, 1.5), "bilinear", False),
    ("sound_nearest_up", (1, 2, 13), 2.3, "nearest", None),
    ("sound_nearest_down", (2, 1, 17), 0.45, "nearest", None),
    ("sound_nearest_kept", (1, 1, 5), 1.1, "nearest", None),
    ("sound_linear_up", (2, 1, 9), 1.7, "linear", False),
    ("sound_linear_down", (1, 2, 19), 0.45, "linear", False),
    ("sound_linear_corners", (1, 1, 6), 2.5, "linear", True),
    ("sound_linear_kept", (1, 1, 5), 1.1, "linear", False),
]


def record(out, case, module, x):
    x = x.clone().requires_grad_(True)
    y = module(x)
    w = torch.randn(y.shape, dtype=y.dtype)
    (y * w).sum().backward()
    out[f"{case}/input"] = x.detach()
    out[f"{case}/output"] = y.detach()
    out[f"{case}/w"] = w
    out[f"{case}/grad/input"] = x.grad
    if isinstance(module, nn.Module):
        for name, p in module.named_parameters():
            out[f"{case}/grad/{name}"] = p.grad


def main(dest):
    torch.manual_seed(20261207)
    net = Net()
    os.makedirs(dest, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in net.state_dict().items()},
        os.path.join(dest, "modules.safetensors"),
    )
    out = {}
    for case, shape in CASES:
        record(out, case, getattr(net, case), torch.randn(shape))
    for case, shape, factors, mode, corners in F64_CASES:
        f = lambda x: F.interpolate(
            x, scale_factor=factors, mode=mode, align_corners=corners
        )
        record(out, f"f64/{case}", f, torch.randn(shape, dtype=torch.float64))
    # Fresh layers large enough for their draws to reach their bounds.
    fresh = {
        "conv1d": nn.Conv1d(8, 12, 5, groups=4),
        "convt1d": nn.ConvTranspose1d(16, 32, 5, groups=2),
        "convt2d": nn.ConvTranspose2d(8, 12, (3, 2), groups=4),
    }
    for name, m in fresh.items():
        for p, t in m.state_dict().items():
            out[f"init/{name}/{p}"] = t
    save_file(
        {k: v.contiguous() for k, v in out.items()},
        os.path.join(dest, "reference.safetensors"),
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/spatial")
