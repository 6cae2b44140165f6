#!/usr/bin/env python3
"""PyTorch counterpart of `gpu_bench mlp`.

An MLP 784-512-512-10 with ReLU, trained with cross-entropy and SGD (lr 0.01) on one fixed batch
of random inputs (standard normal) and random labels (uniform over the 10 classes), all float32
on cuda:0 and drawn from a fixed seed. A training step is zero_grad, forward, loss, backward and
the optimiser step. After --warmup steps (5) the peak statistics are reset and --steps steps are
timed (synchronised before and after). Prints one row in the same format as the Rust example:

    mlp batch=1024 ms_per_step=<f> peak_allocated_bytes=<u>

peak_allocated_bytes is torch.cuda.max_memory_allocated() over the timed steps: parameters,
their gradients, the batch and every intermediate value. Context goes to stderr so that stdout
holds only the row.
"""

import argparse
import sys
import time

from torch_common import cuda_setup


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1024, help="rows per batch")
    p.add_argument("--steps", type=int, default=50, help="timed training steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before the timed ones")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    args = p.parse_args()
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--batch and --steps must be at least 1, --warmup at least 0")

    torch, dev = cuda_setup("torch_mlp", args.seed)
    from torch import nn
    from torch.nn import functional as F

    model = nn.Sequential(
        nn.Linear(784, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    ).to(device=dev, dtype=torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(args.batch, 784, device=dev, dtype=torch.float32)
    labels = torch.randint(0, 10, (args.batch,), device=dev)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)

    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev)

    print(f"# loss after {args.warmup + args.steps} steps = {loss.item():.6g}", file=sys.stderr)
    ms = elapsed * 1e3 / args.steps
    print(f"mlp batch={args.batch} ms_per_step={ms:.3f} peak_allocated_bytes={peak}")


if __name__ == "__main__":
    main()
