#!/usr/bin/env python3
"""PyTorch counterpart of `gpu_bench leak-check`.

Each iteration draws x = randn(n, n, requires_grad=True) on cuda:0 (float32) and runs
(x @ x).sum().backward(). The first iteration is the warm-up; iterations 2..iters are timed
(synchronised before and after). Prints one row in the same format as the Rust example:

    leak_check n=4096 iters=50 ms_per_iter=<f> num_device_alloc_first=<u> num_device_alloc_last=<u>

num_device_alloc_* is torch.cuda.memory_stats()["num_device_alloc"] (cudaMalloc calls of the
caching allocator) after the first and after the last iteration: equal values mean that the
steady loop allocated no device memory after its first iteration. Context (versions, device,
loss) goes to stderr so that stdout holds only the row.
"""

import argparse
import sys
import time

from torch_common import cuda_setup


def device_allocs(torch, dev):
    """cudaMalloc calls so far: "num_device_alloc", or on PyTorch releases older than that key,
    the segments ever allocated (the same count)."""
    stats = torch.cuda.memory_stats(dev)
    return stats.get("num_device_alloc", stats.get("segment.all.allocated", 0))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096, help="side of the square matrix")
    p.add_argument("--iters", type=int, default=50, help="iterations, the warm-up included")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    args = p.parse_args()
    if args.n < 1 or args.iters < 2:
        p.error("--n must be at least 1 and --iters at least 2 (the first is not timed)")

    torch, dev = cuda_setup("torch_leak_check", args.seed)

    def iteration():
        x = torch.randn(args.n, args.n, device=dev, dtype=torch.float32, requires_grad=True)
        y = (x @ x).sum()
        y.backward()
        return y

    iteration()
    torch.cuda.synchronize(dev)
    first = device_allocs(torch, dev)

    t0 = time.perf_counter()
    for _ in range(args.iters - 1):
        y = iteration()
    torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - t0
    last = device_allocs(torch, dev)

    print(f"# last y = {y.item():.6g}", file=sys.stderr)
    ms = elapsed * 1e3 / (args.iters - 1)
    print(
        f"leak_check n={args.n} iters={args.iters} ms_per_iter={ms:.3f} "
        f"num_device_alloc_first={first} num_device_alloc_last={last}"
    )


if __name__ == "__main__":
    main()
