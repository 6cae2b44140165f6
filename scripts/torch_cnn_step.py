#!/usr/bin/env python3
"""PyTorch counterpart of `bench_core --only cnn`, on the CPU.

The Fashion-MNIST example's net, conv3x3(1->32)-relu-maxpool2-conv3x3(32->64)-relu-maxpool2-linear(3136->128)-
relu-linear(128->10), trained with cross-entropy and Adam (lr 1e-3) on one fixed batch of 64 random
images (standard normal) and random labels. A step is zero_grad, forward, loss, backward and the
optimiser step; the median of 30 steps after 5 warm-up steps is printed, split like the Rust row:

    | Fashion-MNIST CNN 32/64, b64 Adam step (random data, PyTorch) | <f> ms (fwd <f>, bwd <f>, opt <f>) | |

Threads: THREADS (default 2), as arenagrad's bench_core.
"""

import os
import time

import torch
import torch.nn.functional as F

from torch_common import fashion_cnn


def main():
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    torch.manual_seed(0)
    net = fashion_cnn()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    total, fwd, bwd, step = [], [], [], []
    for s in range(35):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if s >= 5:
            total.append(t3 - t0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t2)

    def med(v):
        return sorted(v)[len(v) // 2] * 1e3

    print(
        f"| Fashion-MNIST CNN 32/64, b64 Adam step (random data, PyTorch) | {med(total):.2f} ms "
        f"(fwd {med(fwd):.2f}, bwd {med(bwd):.2f}, opt {med(step):.2f}) | |"
    )


if __name__ == "__main__":
    main()
