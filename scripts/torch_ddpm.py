#!/usr/bin/env python3
"""The DDPM U-Net of examples/ddpm.rs in PyTorch: the same layers, widths and training step
(noise MSE, Adam), timed on random images at the example's batch.

    python3 scripts/torch_ddpm.py [--steps 10] [--batch 64] [--channels 32] [--threads N]

Prints the median milliseconds of a training step, as `ddpm --bench N` prints arenagrad's; with
`--layer`, also the transposed convolution of the U-Net's last upsampling alone (forward and
backward).
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

T = 1000
TIME_FEATURES = 64
TIME_DIM = 128
GROUPS = 8


class ResBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm1 = nn.GroupNorm(GROUPS, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(TIME_DIM, cout)
        self.norm2 = nn.GroupNorm(GROUPS, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = None if cin == cout else nn.Conv2d(cin, cout, 1)

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time(temb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


class AttnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = nn.GroupNorm(GROUPS, c)
        self.attn = nn.MultiheadAttention(c, 4, batch_first=True)

    def forward(self, x):
        b, c, h, w = x.shape
        seq = self.norm(x).reshape(b, c, h * w).permute(0, 2, 1)
        y, _ = self.attn(seq, seq, seq, need_weights=False)
        return x + y.permute(0, 2, 1).reshape(b, c, h, w)


class UNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.time1 = nn.Linear(TIME_FEATURES, TIME_DIM)
        self.time2 = nn.Linear(TIME_DIM, TIME_DIM)
        self.conv_in = nn.Conv2d(1, c, 3, padding=1)
        self.down1 = ResBlock(c, c)
        self.pool1 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.down2 = ResBlock(2 * c, 2 * c)
        self.pool2 = nn.Conv2d(2 * c, 2 * c, 3, stride=2, padding=1)
        self.mid1 = ResBlock(2 * c, 2 * c)
        self.mid_attn = AttnBlock(2 * c)
        self.mid2 = ResBlock(2 * c, 2 * c)
        self.up2 = nn.ConvTranspose2d(2 * c, 2 * c, 2, stride=2)
        self.up2_block = ResBlock(4 * c, 2 * c)
        self.up1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.up1_block = ResBlock(2 * c, c)
        self.norm_out = nn.GroupNorm(GROUPS, c)
        self.conv_out = nn.Conv2d(c, 1, 3, padding=1)

    def forward(self, x, t):
        half = TIME_FEATURES // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half) / half)
        args = t[:, None].float() * freqs[None]
        feats = torch.cat([args.sin(), args.cos()], dim=1)
        temb = F.silu(self.time2(F.silu(self.time1(feats))))
        h1 = self.down1(self.conv_in(x), temb)
        h2 = self.down2(self.pool1(h1), temb)
        m = self.mid1(self.pool2(h2), temb)
        m = self.mid2(self.mid_attn(m), temb)
        u2 = self.up2_block(torch.cat([self.up2(m), h2], 1), temb)
        u1 = self.up1_block(torch.cat([self.up1(u2), h1], 1), temb)
        return self.conv_out(F.silu(self.norm_out(u1)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: its own)")
    p.add_argument("--layer", action="store_true", help="also time the last transposed convolution")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = UNet(args.channels)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0).float()
    x0 = torch.rand(args.batch, 1, 28, 28) * 2 - 1
    times = []
    for _ in range(args.steps + 2):
        t0 = time.perf_counter()
        t = torch.randint(0, T, (args.batch,))
        eps = torch.randn_like(x0)
        ab = alpha_bar[t][:, None, None, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        loss = F.mse_loss(model(xt, t), eps)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    n = sum(p.numel() for p in model.parameters())
    print(
        f"U-Net ({n} parameters), batch {args.batch}: {statistics.median(times[2:]):.1f} ms per "
        f"training step (median of {args.steps}; PyTorch {torch.__version__}, "
        f"{torch.get_num_threads()} threads)"
    )
    if args.layer:
        layer = nn.ConvTranspose2d(2 * args.channels, args.channels, 2, stride=2)
        x = torch.randn(args.batch, 2 * args.channels, 14, 14, requires_grad=True)
        times = []
        for _ in range(args.steps + 2):
            t0 = time.perf_counter()
            layer(x).square().sum().backward()
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"ConvTranspose2d {2 * args.channels}→{args.channels} k2 s2 at 14×14, fwd+bwd: "
              f"{statistics.median(times[2:]):.2f} ms")


if __name__ == "__main__":
    main()
