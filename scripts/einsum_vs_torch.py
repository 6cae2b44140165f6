#!/usr/bin/env python3
"""`einsum` beside `torch.einsum` on random subscripts and shapes, through the program format's
`einsum` row and the `arenagrad` binary's `run --json`:

    cargo build -p arenagrad-program
    python3 scripts/einsum_vs_torch.py [--cases 1500] [--seed 2] [--bin target/debug/arenagrad]

Each case draws one or two operands over up to four letters, an ellipsis now and then (of up
to two axes, broadcast right-aligned), a letter twice in one operand (a diagonal) now and then,
extents of 1 that broadcast, an output given or implicit, and one time in seven an extent or
rank that does not fit. Where PyTorch computes, the output
(weighted, then summed for the backward) and both gradients must agree to 1e-12; where PyTorch
refuses, the program must be refused too (exit status 2). One operand is paired with a scalar
`1` (the row takes two; three or more operands, which `Graph::einsum` takes, are checked by its
tests). Exits non-zero on any disagreement.

Needs torch (PyPI).
"""
import argparse
import json
import os
import random
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LETTERS = "ijkbhq"


def numel(s):
    n = 1
    for d in s:
        n *= d
    return n


def draw(rng):
    letters = rng.sample(LETTERS, rng.randint(1, 4))
    ext = {c: rng.randint(1, 3) for c in letters}
    ops = []
    for _ in range(rng.choice([1, 2, 2, 2])):
        ls = rng.sample(letters, rng.randint(0, len(letters)))
        ell = rng.random() < 0.4
        ops.append((ls, ell, rng.randint(0, 2) if ell else 0))
    e = max(o[2] for o in ops)
    ell_ext = [rng.randint(1, 3) for _ in range(e)]
    subs, shapes = [], []
    for ls, ell, span in ops:
        if ls and rng.random() < 0.2:
            # A letter twice: a diagonal.
            ls = ls[:]
            ls.insert(rng.randint(0, len(ls)), rng.choice(ls))
        pos = rng.randint(0, len(ls))
        subs.append("".join(ls[:pos]) + ("..." if ell else "") + "".join(ls[pos:]))
        # An extent of 1 broadcasts, except for a letter repeated in the operand (its
        # diagonal needs one extent).
        rep = len(set(ls)) < len(ls)
        one = lambda d: 1 if rng.random() < 0.15 and not rep else d
        shape = [one(ext[c]) for c in ls[:pos]]
        shape += [1 if rng.random() < 0.3 else ell_ext[e - span + t] for t in range(span)]
        shape += [one(ext[c]) for c in ls[pos:]]
        r = rng.random()
        if r < 0.08 and shape:
            shape[rng.randrange(len(shape))] = rng.randint(2, 4)
        elif r < 0.12 and shape:
            shape.pop()
        elif r < 0.15:
            shape.append(2)
        shapes.append(shape)
    lhs = ",".join(subs)
    if rng.random() < 0.3:
        return lhs, shapes
    used = sorted({c for s in subs for c in s if c.isalpha()})
    out = rng.sample(used, rng.randint(0, len(used)))
    if any(o[1] for o in ops) and rng.random() < 0.7:
        pos = rng.randint(0, len(out))
        out = out[:pos] + ["..."] + out[pos:]
    return lhs + "->" + "".join(out), shapes


def leaf(kind, name, shape, v):
    dims = " ".join(map(str, shape))
    return f"{name} = {kind} {dims}{' ' if dims else ''}: {' '.join(map(str, v))}\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "arenagrad"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    vals = lambda n: [round(rng.uniform(-2, 2) * 8) / 8 for _ in range(n)]
    agree = refused = wrong = 0
    for _ in range(args.cases):
        spec, shapes = draw(rng)
        if len(spec) > 32:  # the program format's subscripts token
            continue
        if len(shapes) == 1:
            lhs, arrow, out = spec.partition("->")
            spec, shapes = lhs + "," + arrow + out, shapes + [[]]
        ins = [vals(numel(s)) for s in shapes]
        ts = [torch.tensor(v, dtype=torch.float64).reshape(s).requires_grad_()
              for v, s in zip(ins, shapes)]
        try:
            y = torch.einsum(spec, *ts)
        except RuntimeError:
            y = None
        prog = leaf("input", "a", shapes[0], ins[0]) + leaf("input", "b", shapes[1], ins[1])
        prog += f"y = einsum a b {spec}\n"
        if y is not None:
            w = vals(y.numel())
            prog += leaf("const", "w", list(y.shape), w) + "z = mul y w\n"
            z = y * torch.tensor(w, dtype=torch.float64).reshape(y.shape)
            z.sum().backward()
        r = subprocess.run([args.bin, "run", "--json", "-"], input=prog, capture_output=True,
                           text=True)
        if y is None:
            if r.returncode == 2:
                refused += 1
            else:
                wrong += 1
                print(f"torch refuses, arenagrad does not: {spec} {shapes}")
            continue
        if r.returncode != 0:
            wrong += 1
            print(f"arenagrad refuses, torch does not: {spec} {shapes}: {r.stderr.strip()}")
            continue
        got = json.loads(r.stdout)

        def close(t, v):
            return list(v["shape"]) == list(t.shape) and torch.allclose(
                torch.tensor(v["data"], dtype=torch.float64).reshape(t.shape), t,
                rtol=1e-12, atol=1e-12)

        ok = close(z.detach(), got["output"])
        for n, t in zip("ab", ts):
            g = t.grad if t.grad is not None else torch.zeros_like(t)
            ok = ok and close(g, got["grads"][n])
        if ok:
            agree += 1
        else:
            wrong += 1
            print(f"values or gradients differ: {spec} {shapes}")
    print(f"{agree} agree with torch.einsum, {refused} refused by both, {wrong} disagree")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
