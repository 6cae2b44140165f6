#!/usr/bin/env python3
"""BERT of all-MiniLM-L6-v2's shape (random weights) beside `transformers` on the CPU: sentence
embeddings (encoder, mean pooling, normalisation) of a batch of 4 × 128 tokens in f32, in
alternating rounds:

    cargo build --release --example embed
    python3 scripts/bert_embed_bench.py [--dir /tmp/minilm-l6] [--rounds 3] [--threads 2]
        [--dtype f32|bf16]

The model directory is made first if missing (`BertModel(BertConfig(hidden_size=384,
num_hidden_layers=6, intermediate_size=1536))` seeded, saved by `save_pretrained`: about 90 MB).
Each round runs `examples/embed --bench 4x128` (the median of 20 runs after a warm-up) and then
the same shape through `transformers`' `BertModel` under `torch.inference_mode()` with the same
pooling (median of 20 after a warm-up), and the table gives the medians over rounds. (That the two
compute the same embeddings is checked by the tests, on a small model `transformers` wrote.)
With `--dtype bf16` both sides convert the f32 checkpoint to bf16 as they load and encode in
bf16 (`from_pretrained(dir, dtype=torch.bfloat16)` there, `embed --dtype bf16` here).

Needs torch and transformers (PyPI).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "target", "release", "examples", "embed")


def make(dir):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536)
    BertModel(cfg).eval().save_pretrained(dir, safe_serialization=True)


def ours(dir, threads, shape, dtype):
    env = dict(os.environ, ARENAGRAD_NUM_THREADS=str(threads))
    out = subprocess.run([EXE, "--model", dir, "--bench", shape, "--runs", "20", "--dtype", dtype],
                         capture_output=True, text=True, env=env, check=True).stdout
    return float(re.search(r"median ([0-9.]+) ms", out).group(1))


def pooled(model, ids, mask):
    import torch

    h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(h.dtype)
    mean = (h * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)


def theirs(model, batch, length, threads):
    import torch

    torch.set_num_threads(threads)
    ids = torch.randint(0, model.config.vocab_size, (batch, length),
                        generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    times = []
    with torch.inference_mode():
        pooled(model, ids, mask)
        for _ in range(20):
            t = time.perf_counter()
            pooled(model, ids, mask)
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/minilm-l6")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", default="4x128")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    args = ap.parse_args()
    if not os.path.exists(EXE):
        sys.exit(f"{EXE} is missing: cargo build --release --example embed")
    if not os.path.exists(os.path.join(args.dir, "config.json")):
        print(f"# making {args.dir} (random BERT of all-MiniLM-L6-v2's shape)", file=sys.stderr)
        make(args.dir)
    import torch
    from transformers import BertModel

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = BertModel.from_pretrained(args.dir, dtype=dtype).eval()
    batch, length = map(int, args.shape.split("x"))
    rows = []
    for r in range(args.rounds):
        a = ours(args.dir, args.threads, args.shape, args.dtype)
        b = theirs(model, batch, length, args.threads)
        rows.append((a, b))
        print(f"# round {r + 1}: ours {a:.2f} ms, transformers {b:.2f} ms", file=sys.stderr)
    a, b = (statistics.median(c) for c in zip(*rows))
    print(f"| MiniLM-L6 shape, batch {batch} × {length}, {args.threads} threads | arenagrad | "
          f"transformers | ratio |")
    print("|---|---|---|---|")
    print(f"| sentence embeddings in {args.dtype}, ms | {a:.2f} | {b:.2f} | {a / b:.2f}× |")
    print(f"(medians of {args.rounds} alternating rounds, each the median of 20 runs)")


if __name__ == "__main__":
    main()
