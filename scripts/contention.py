#!/usr/bin/env python3
"""arenagrad and PyTorch on shared cores: each workload alone, beside a second copy of itself,
and beside a busy application thread of its own process, with each slowdown next to PyTorch's.

    cargo build --release --example bench_core
    python3 scripts/contention.py [--only w3,w5,w6,cnn,gpt] [--quick] [--rounds N]

An engine embedded in an application shares the machine: the application's threads, a second
model, other processes. Three conditions, each engine at the same thread count (default: the CPUs
this process may use, as both engines choose by default):

* alone: nothing else runs;
* beside a copy: a second process runs the same workload of the same engine in a loop the whole
  time (started first, so that the two overlap throughout);
* busy thread: the measuring process keeps one more thread of its own busy (arenagrad:
  `bench_core --busy-thread`, a loop of integer arithmetic; PyTorch: a thread hashing a buffer
  with `hashlib`, which releases the interpreter lock while it hashes, so the thread costs
  PyTorch a core and not the lock).

Each cell is a figure (ms per step, or tokens/s for generation) and its slowdown against the same
engine alone in the same run; on two cores a fair share is 2×. `--rounds N` repeats the whole
table N times, alternating the engines, and prints medians.

Workloads (as `scripts/compare_torch.py` and `bench_core` define them): W3 an MLP
784-512-512-10 b128 SGD step; W5/W6 an LSTM 128→256 over 64 positions at batch 1/32, SGD step
(PyTorch's fused `nn.LSTM`); the Fashion-MNIST CNN's Adam step (batch 64); the character GPT's
training step (batch 32) and its generation at batch 1 with a key/value cache.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import compare_torch  # noqa: E402

# Workload → bench_core's `--only` value and the figures it prints (keys of compare_torch.ROWS).
WORKLOADS = {
    "w3": ("w3", ["w3"]),
    "w5": ("w5", ["w5"]),
    "w6": ("w6", ["w6"]),
    "cnn": ("cnn", ["cnn"]),
    "gpt": ("gpt", ["gpt", "gpt_gen"]),
    "scatter": ("scatter", ["scatter"]),
}
LABELS = {
    "w3": "W3 MLP 784-512-512-10 b128 SGD step, ms",
    "w5": "W5 LSTM 128→256 seq 64 b1 SGD step, ms",
    "w6": "W6 LSTM 128→256 seq 64 b32 SGD step, ms",
    "cnn": "Fashion-MNIST CNN b64 Adam step, ms",
    "gpt": "char GPT training step b32, ms",
    "gpt_gen": "char GPT generation b1, tokens/s",
    "scatter": "index_add 10^6 edges x 64 into 10^5 nodes fwd+bwd, ms",
}
CONDITIONS = ["alone", "copy", "busy"]
HIGHER_IS_BETTER = {"gpt_gen"}


def torch_figures(torch, workload, quick):
    if workload == "w3":
        return {"w3": compare_torch.torch_mlp(torch, [784, 512, 512, 10], 128) * 1e3}
    if workload in ("w5", "w6"):
        batch = 1 if workload == "w5" else 32
        return {workload: compare_torch.torch_lstm(torch, batch, False, quick) * 1e3}
    if workload == "cnn":
        return {"cnn": compare_torch.torch_cnn(torch) * 1e3}
    if workload == "scatter":
        return {"scatter": compare_torch.torch_scatter(torch, quick) * 1e3}
    if workload == "gpt":
        step, tps = compare_torch.torch_gpt(torch, quick)
        return {"gpt": step * 1e3, "gpt_gen": tps}
    raise ValueError(workload)


def busy_hashing():
    """Hashes a 16 MiB buffer over and over: CPU work that holds the interpreter lock only
    between calls."""
    block = os.urandom(1 << 24)
    while True:
        hashlib.sha256(block).digest()


def torch_worker(args):
    """One PyTorch measurement in this process (or a loop of them: the second copy)."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.busy_thread:
        threading.Thread(target=busy_hashing, daemon=True).start()
    while True:
        figures = torch_figures(torch, args.torch_worker, args.quick)
        if not args.forever:
            for k, v in figures.items():
                print(f"{k} {v}")
            return


def engine_cmd(engine, workload, args, busy=False, forever=False):
    if engine == "arenagrad":
        exe = ROOT / "target" / "release" / "examples" / "bench_core"
        cmd = [str(exe), "--only", WORKLOADS[workload][0]]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--busy-thread"] if busy else []
        if forever:
            # A shell loop: the copy keeps running the workload until it is stopped.
            return ["sh", "-c", 'while :; do "$@" >/dev/null; done', "copy"] + cmd
        return cmd
    cmd = [sys.executable, str(Path(__file__).resolve()), "--torch-worker", workload]
    cmd += ["--threads", str(args.threads)]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--busy-thread"] if busy else []
    cmd += ["--forever"] if forever else []
    return cmd


def parse(engine, text):
    if engine == "arenagrad":
        return compare_torch.parse_bench_core(text)
    out = {}
    for line in text.splitlines():
        k, v = line.split()
        out[k] = float(v)
    return out


def measure(engine, workload, condition, args, env):
    cmd = engine_cmd(engine, workload, args, busy=condition == "busy")
    copy = None
    if condition == "copy":
        copy = subprocess.Popen(
            engine_cmd(engine, workload, args, forever=True),
            env=env,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        # Let the copy get going (PyTorch takes a couple of seconds to import).
        time.sleep(4.0 if engine == "torch" else 1.0)
    try:
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    finally:
        if copy is not None:
            os.killpg(copy.pid, 9)
            copy.wait()
    return parse(engine, out)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="w3,w5,w6,cnn,gpt", help="workloads, comma-separated: " + ",".join(WORKLOADS))
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--rounds", type=int, default=1, help="repeat the table, alternating the engines")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads per engine")
    p.add_argument("--torch-worker", help=argparse.SUPPRESS)
    p.add_argument("--busy-thread", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_worker:
        return torch_worker(args)
    try:
        import torch
    except ImportError as e:
        sys.exit(f"contention.py: PyTorch is not installed ({e}); pip install torch")
    exe = ROOT / "target" / "release" / "examples" / "bench_core"
    if not exe.exists():
        sys.exit(f"{exe} not found: run `cargo build --release --example bench_core` first")
    only = [w for w in args.only.split(",") if w]
    for w in only:
        if w not in WORKLOADS:
            sys.exit(f"contention.py: unknown workload {w!r} (known: {', '.join(WORKLOADS)})")
    env = dict(os.environ, ARENAGRAD_NUM_THREADS=str(args.threads))
    print(f"# PyTorch {torch.__version__}, {args.threads} threads per engine, {args.rounds} round(s)", file=sys.stderr)

    # results[engine][condition][key] = list of figures over the rounds
    results = {e: {c: {} for c in CONDITIONS} for e in ("arenagrad", "torch")}
    for r in range(args.rounds):
        for w in only:
            for c in CONDITIONS:
                for e in ("arenagrad", "torch"):
                    print(f"# round {r + 1}: {w}, {e}, {c}", file=sys.stderr)
                    for k, v in measure(e, w, c, args, env).items():
                        if k in WORKLOADS[w][1]:
                            results[e][c].setdefault(k, []).append(v)

    med = compare_torch.median

    def slowdown(key, alone, other):
        return alone / other if key in HIGHER_IS_BETTER else other / alone

    print(f"| workload | arenagrad alone | beside a copy | busy thread | PyTorch {torch.__version__} alone | beside a copy | busy thread |")
    print("|---|---|---|---|---|---|---|")
    for w in only:
        for key in WORKLOADS[w][1]:
            cells = []
            for e in ("arenagrad", "torch"):
                alone = results[e]["alone"].get(key)
                if not alone:
                    cells += ["", "", ""]
                    continue
                cells.append(f"{med(alone):.4g}")
                for c in ("copy", "busy"):
                    v = results[e][c].get(key)
                    if not v:
                        cells.append("")
                        continue
                    # The slowdown of each round against the same round's alone figure.
                    s = med([slowdown(key, a, b) for a, b in zip(alone, v)])
                    cells.append(f"{med(v):.4g} ({s:.2f}×)")
            print(f"| {LABELS[key]} | " + " | ".join(cells) + " |")
    note = f"medians of {args.rounds} rounds; " if args.rounds > 1 else ""
    print(f"({note}{args.threads} threads per engine; in brackets the slowdown against the same engine alone; a fair share of {args.threads} cores is 2×)")


if __name__ == "__main__":
    main()
