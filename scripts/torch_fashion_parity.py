#!/usr/bin/env python3
"""Trains the main job's CNN in PyTorch from a seeded initialisation, in file order, and writes
that initialisation to a safetensors file, so that arenagrad can run the same training from the
same weights and the two loss sequences can be compared step for step:

    python3 scripts/torch_fashion_parity.py --out /tmp/init.safetensors --steps 150 > torch.txt
    cargo run --release -p arenagrad --example fashion_mnist -- --init /tmp/init.safetensors \\
        --order fixed --steps 150 --log-every 10 --epochs 1 | grep '^step' > arenagrad.txt

Both print `step S loss L` every --log-every steps (Adam 1e-3, batch 64, 32/64 channels).
Needs torch, numpy and safetensors.
"""
import argparse, gzip, struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file


def idx(path):
    with gzip.open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--out", required=True, help="where to write the initial weights")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x = torch.tensor(idx(f"{a.data}/train-images-idx3-ubyte.gz"), dtype=torch.float32).unsqueeze(1) / 255.0
    y = torch.tensor(idx(f"{a.data}/train-labels-idx1-ubyte.gz"), dtype=torch.long)
    net = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10),
    )
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, a.out)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for s in range(a.steps):
        loss = F.cross_entropy(net(x[s * 64:(s + 1) * 64]), y[s * 64:(s + 1) * 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if s % a.log_every == 0:
            print(f"step {s} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
