#!/usr/bin/env python3
"""GPT-2 (the 124M-parameter configuration, random weights) beside `transformers` on the CPU:
greedy generation of 64 tokens at batch 1 with the key/value cache, in f32, and loading the
checkpoint, in alternating rounds:

    cargo build --release --example generate
    python3 scripts/hf_generate_bench.py [--dir /tmp/gpt2-124m] [--rounds 3] [--threads 2]
        [--dtype f32|bf16]

The model directory is made first if missing (`GPT2LMHeadModel(GPT2Config())` seeded, saved by
`save_pretrained`: about 500 MB). For each round it runs `examples/generate --floor` (which also
compares each token's time with one read of the weights made just after it: at batch 1 every
token reads every weight, so that is the floor of a token's time) and then `transformers`'
`generate` with the same prompt, and prints the medians. Loading is compared with reading the file once. With `--dtype bf16` both sides
convert the f32 checkpoint to bf16 as they load and generate in bf16; the greedy tokens must
then agree only as far as two implementations' bf16 roundings let them (the run reports how
many of the 64 do, from the start); in f32 they must be the same.

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
PROMPT = [464, 2068, 7586]


def make(dir):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(bos_token_id=None, eos_token_id=None)).eval()
    model.save_pretrained(dir, safe_serialization=True)


def ours(dir, threads, dtype):
    exe = os.path.join(ROOT, "target", "release", "examples", "generate")
    if not os.path.exists(exe):
        sys.exit(f"{exe} is missing: cargo build --release --example generate")
    env = dict(os.environ, ARENAGRAD_NUM_THREADS=str(threads))
    ids = ",".join(map(str, PROMPT))
    out = subprocess.run(
        [exe, "--model", dir, "--prompt-ids", ids, "--tokens", "64", "--greedy", "--floor",
         "--dtype", dtype],
        capture_output=True, text=True, env=env, check=True,
    ).stdout
    load = float(re.search(r"in ([0-9.]+) s\)", out).group(1))
    rate = float(re.search(r"([0-9.]+) tokens/s", out).group(1))
    floor = float(re.search(r"([0-9.]+)× the read \(median", out).group(1))
    tokens = re.search(r"generated: ([0-9,]+)", out).group(1)
    return load, rate, floor, tokens


def theirs(dir, threads, dtype):
    import torch
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(threads)
    t = time.perf_counter()
    model = GPT2LMHeadModel.from_pretrained(
        dir, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32).eval()
    load = time.perf_counter() - t
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        t = time.perf_counter()
        seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                             do_sample=False, pad_token_id=0)
        took = time.perf_counter() - t
    tokens = ",".join(str(int(v)) for v in seq[0, len(PROMPT):])
    return load, 64 / took, tokens


def read_once(dir):
    """Seconds to read the checkpoint once into memory (one buffer the size of the file, as a
    loader that owns its tensors needs; the file in the page cache, as the runs find it)."""
    path = os.path.join(dir, "model.safetensors")
    with open(path, "rb") as f:
        f.read()
    t = time.perf_counter()
    with open(path, "rb") as f:
        data = f.read()
    took = time.perf_counter() - t
    del data
    return took


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.dir, "config.json")):
        print(f"# making {args.dir} (random GPT-2 124M)", file=sys.stderr)
        make(args.dir)
    rows = []
    for r in range(args.rounds):
        read = read_once(args.dir)
        a = ours(args.dir, args.threads, args.dtype)
        b = theirs(args.dir, args.threads, args.dtype)
        same = 0
        for x, y in zip(a[3].split(","), b[2].split(",")):
            if x != y:
                break
            same += 1
        if args.dtype == "f32" and a[3] != b[2]:
            sys.exit(f"round {r + 1}: the greedy tokens differ:\n ours   {a[3]}\n theirs {b[2]}")
        rows.append((read, a[0], a[1], a[2], b[0], b[1], same))
        print(f"# round {r + 1}: ours {a[1]:.1f} tokens/s, transformers {b[1]:.1f}", file=sys.stderr)
    med = [statistics.median(c) for c in zip(*rows)]
    read, load, rate, floor, tload, trate, same = med
    print(f"| GPT-2 124M, {args.dtype}, batch 1, {args.threads} threads | arenagrad | "
          f"transformers | ratio |")
    print("|---|---|---|---|")
    print(f"| greedy generation with the cache, tokens/s | {rate:.1f} | {trate:.1f} | "
          f"{rate / trate:.2f}× |")
    print(f"| a token's time over reading the weights once (median) | {floor:.2f}× | | |")
    print(f"| loading the checkpoint, s (reading the file once: {read:.2f} s) | {load:.2f} "
          f"({load / read:.1f}× the read) | {tload:.2f} | |")
    print(f"(medians of {args.rounds} alternating rounds; {same:.0f} of the 64 greedy tokens the "
          f"same on both sides, from the first)")


if __name__ == "__main__":
    main()
