#!/usr/bin/env python3
"""PyTorch counterpart of `examples/tree_sum.rs`: the same recursive network (digit embeddings, one
Linear + tanh composition per operator, a linear head reading value / 10), the same random
expressions (1 to 6 digits joined pairwise at random adjacent positions with + or -), batch 16,
Adam with a cosine-annealed learning rate. The graph follows each expression's tree, built by a
Python loop over its nodes, as arenagrad's is by a Rust loop.

    python3 scripts/torch_tree_sum.py [--steps 1000] [--threads 2]

Prints expressions per second over the steps (and the held-out exact share at the end). Needs torch.
"""
import argparse, math, random, time

import torch
import torch.nn as nn


def expression(max_leaves, rng):
    leaves = 1 + rng.randrange(max_leaves)
    nodes = [("d", rng.randrange(10)) for _ in range(leaves)]
    roots = list(range(leaves))
    while len(roots) > 1:
        k = rng.randrange(len(roots) - 1)
        nodes.append(("+" if rng.randrange(2) == 0 else "-", roots[k], roots[k + 1]))
        roots[k] = len(nodes) - 1
        del roots[k + 1]
    return nodes


def value(e):
    v = []
    for n in e:
        if n[0] == "d":
            v.append(float(n[1]))
        else:
            v.append(v[n[1]] + v[n[2]] if n[0] == "+" else v[n[1]] - v[n[2]])
    return v[-1]


class TreeNet(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.digits = nn.Embedding(10, dim)
        self.plus = nn.Linear(2 * dim, dim)
        self.minus = nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, exprs):
        roots = []
        for e in exprs:
            h = []
            for n in e:
                if n[0] == "d":
                    h.append(self.digits.weight[n[1]].unsqueeze(0))
                else:
                    f = self.plus if n[0] == "+" else self.minus
                    h.append(torch.tanh(f(torch.cat([h[n[1]], h[n[2]]], 1))))
            roots.append(h[-1])
        return self.head(torch.cat(roots, 0))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--max-leaves", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    net = TreeNet(args.dim)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps, args.lr / 100)
    held_out = [expression(args.max_leaves, rng) for _ in range(1000)]
    t0 = time.perf_counter()
    for step in range(args.steps):
        batch = [expression(args.max_leaves, rng) for _ in range(args.batch)]
        want = torch.tensor([[value(e) / 10] for e in batch])
        opt.zero_grad()
        loss = ((net(batch) - want) ** 2).mean()
        loss.backward()
        opt.step()
        sched.step()
    secs = time.perf_counter() - t0
    with torch.no_grad():
        pred = net(held_out).squeeze(1) * 10
    exact = sum(round(p) == value(e) for p, e in zip(pred.tolist(), held_out)) / len(held_out)
    print(f"PyTorch {torch.__version__}: {args.steps} steps of {args.batch} in {secs:.1f} s: "
          f"{args.steps * args.batch / secs:.0f} expressions/s; held-out exact {100 * exact:.1f}%")


if __name__ == "__main__":
    main()
