#!/usr/bin/env python3
"""PyTorch counterpart of the Fashion-MNIST example (`examples/fashion_mnist.rs`): the same CNN, Adam, batch 64,
and by default the same recipe (learning rate annealed from 2e-3 to 0 along a cosine over the run's
steps; `--schedule constant --lr 1e-3` is the plain one). Prints seconds per epoch and test accuracy:

    python3 scripts/torch_fashion_mnist.py [--seed 0] [--epochs 2]

With `--init OUT` it instead writes its seeded initial weights to a safetensors file and trains in
file order, printing `step S loss L` every --log-every steps, so that arenagrad can run the same
training from the same weights and the two loss sequences can be compared step for step:

    python3 scripts/torch_fashion_mnist.py --init /tmp/init.safetensors --steps 150 > torch.txt
    cargo run --release --example fashion_mnist -- --init /tmp/init.safetensors \\
        --order fixed --steps 150 --log-every 10 --epochs 1 | grep '^step' > arenagrad.txt

Needs torch and numpy (and safetensors for --init).
"""
import argparse, gzip, math, struct, sys, time

import numpy as np
import torch
import torch.nn.functional as F

from torch_common import fashion_cnn


def idx(path):
    with gzip.open(path, "rb") as f:
        magic, = struct.unpack(">I", f.read(4))
        dims = struct.unpack(">" + "I" * (magic & 0xFF), f.read(4 * (magic & 0xFF)))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def load(data, split):
    x = torch.tensor(idx(f"{data}/{split}-images-idx3-ubyte.gz"), dtype=torch.float32).unsqueeze(1) / 255.0
    y = torch.tensor(idx(f"{data}/{split}-labels-idx1-ubyte.gz"), dtype=torch.long)
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", help="write the initial weights here and train in file order")
    p.add_argument("--steps", type=int, help="stop after this many steps")
    p.add_argument("--log-every", type=int, default=10)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = load(a.data, "train")
    net = fashion_cnn()
    if a.init:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, a.init)
    per_epoch = math.ceil(len(x) / 64)
    total = min(a.steps or a.epochs * per_epoch, a.epochs * per_epoch)
    opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    print(f"torch {torch.__version__} fashion-mnist: Adam lr {a.lr} ({a.schedule}), {a.threads} threads", file=sys.stderr)
    step = 0
    for epoch in range(1, a.epochs + 1):
        t = time.perf_counter()
        order = torch.arange(len(x)) if a.init else torch.randperm(len(x))
        net.train()
        for i in range(0, len(x), 64):
            if step >= total:
                break
            if a.schedule == "cosine":
                for group in opt.param_groups:
                    group["lr"] = 0.5 * a.lr * (1 + math.cos(math.pi * step / total))
            b = order[i:i + 64]
            loss = F.cross_entropy(net(x[b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if a.init and step % a.log_every == 0:
                print(f"step {step} loss {loss.item():.6f}", flush=True)
            step += 1
        if a.init:
            continue
        dt = time.perf_counter() - t
        xt, yt = load(a.data, "t10k")
        net.eval()
        with torch.no_grad():
            hits = sum((net(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item() for i in range(0, len(xt), 1000))
        print(f"epoch {epoch}: test accuracy {100 * hits / len(xt):.2f}%  {dt:.1f} s/epoch", flush=True)


if __name__ == "__main__":
    main()
