#!/usr/bin/env python3
"""arenagrad beside PyTorch on the CPU, in one run: the benchmark table of docs/performance.md.

Runs `bench_core` (built first with `cargo build --release --example bench_core`), then the same
workloads in PyTorch in this process, and prints one table with both figures and their ratio.
The machine's speed drifts between runs; the ratio measured in one run is the figure to compare.

    python3 scripts/compare_torch.py [--quick] [--only w1,w2,w3,w4,cnn,attn,gpt,lstm,bf16,amp,topk,scatter,convt,conv,ew] [--candle] [--rounds N]

`--rounds N` alternates the two sides N times (arenagrad's run, then PyTorch's, and again) and
prints the medians, and the median of each round's ratio: on a machine whose speed drifts over
minutes, a round's two figures are minutes apart, not the whole run.

`--candle` adds candle (0.11, a Rust peer) on W1–W4: the harness in `examples/peers/candle` (its own
package, built here on first use with `cargo build --release`; candle takes a few minutes to
compile) runs after PyTorch, in the same run.

Workloads (the same definitions as `examples/bench_core.rs`):

* W1: x = randn(1024, 1024) requiring grad; (x @ x).sum().backward(); median ms per iteration.
  Also a 1024³ f32 GEMM's GFLOP/s.
* bf16: a 1024³ matrix product of bf16 operands accumulated in f32 (`torch.mm` on bf16 tensors,
  oneDNN's kernel), GFLOP/s.
* W2: a chain of ops x*1.0001, x+0.0001, tanh (in turn) on a tensor of ones of 16 (and 1)
  elements that requires grad, summed and backpropagated; ns per op, forward plus backward.
* W3 / W4: an MLP (784-512-512-10, batch 128 / 64-64-64-10, batch 32) with ReLU, cross-entropy
  and SGD (lr 0.01): one training step (zero_grad, forward, loss, backward, step), median of 50
  after 5 warm-up steps.
* topk: the 50 largest of 50,000 random logits at batch 1 (sampling's step), µs.
* convt: a U-Net's upsampling, ConvTranspose2d 64->32 at 14x14, b64, fwd+bwd, kernel 4 stride 2
  padding 1 and kernel 2 stride 2, ms.
* conv: the DDPM U-Net's 3x3 convolutions (padding 1) at its three resolutions, Conv2d 32->32 at
  28x28, 64->64 at 14x14 and 64->64 at 7x7, b64, fwd+bwd, ms.
* scatter: message passing's sum, 10^6 edge messages x 64 added into 10^5 nodes, fwd+bwd, ms.
* ew: GELU and dropout (p = 0.1) on [4096, 512] (the char GPT's MLP activations) in f32 and
  bf16, forward and backward of the output's sum, ms.
* CNN: the Fashion-MNIST example's net, one Adam step on 64 random images (as
  `scripts/torch_cnn_step.py`).

* W5 / W6: an LSTM (input 128, hidden 256, sequence 64, batch 1 / 32) trained by SGD (lr 0.01) on
  the mean square of its last hidden state against a random target: PyTorch's fused `nn.LSTM` and
  a Python loop of `nn.LSTMCell` beside arenagrad's `nn::LSTM` and a Rust loop of `LSTMCell`.

Threads: ARENAGRAD_NUM_THREADS and torch.set_num_threads get the same count (default: the
CPUs this process may use). Needs PyTorch (`pip install torch --index-url https://download.pytorch.org/whl/cpu`).
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def median(v):
    return sorted(v)[len(v) // 2]


def torch_w1(torch, quick):
    n = 1024
    iters = 5 if quick else 30
    a, b = torch.randn(n, n), torch.randn(n, n)
    reps = 3 if quick else 10
    t = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        torch.mm(a, b)
        t.append(time.perf_counter() - t0)
    gflops = 2 * n**3 / median(t[1:]) / 1e9
    t = []
    for _ in range(iters + 2):
        t0 = time.perf_counter()
        x = torch.randn(n, n, requires_grad=True)
        (x @ x).sum().backward()
        t.append(time.perf_counter() - t0)
    return {"gemm": gflops, "w1": median(t[2:]) * 1e3}


def torch_bf16(torch, quick):
    """bf16 `mm` at 1024³ (f32 accumulation inside oneDNN) on all the threads and on one, and
    the f32 `mm` in the same run."""
    n = 1024
    reps = 3 if quick else 10
    out = {}
    threads = torch.get_num_threads()
    for key, dtype, nt in (
        ("gemm_f32", torch.float32, threads),
        ("gemm_bf16", torch.bfloat16, threads),
        ("gemm_bf16_1", torch.bfloat16, 1),
    ):
        torch.set_num_threads(nt)
        a = (torch.arange(n * n) % 7 * 0.1).reshape(n, n).to(dtype)
        b = a.clone()
        t = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            torch.mm(a, b)
            t.append(time.perf_counter() - t0)
        out[key] = 2 * n**3 / median(t[1:]) / 1e9
    torch.set_num_threads(threads)
    return out


def torch_w2(torch, n, quick):
    length, reps = 10_000, (3 if quick else 7)
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x = torch.ones(n, requires_grad=True)
        h = x
        for k in range(length):
            r = k % 3
            h = h * 1.0001 if r == 0 else (h + 0.0001 if r == 1 else torch.tanh(h))
        h.sum().backward()
        t.append(time.perf_counter() - t0)
    return median(t) * 1e9 / length


def torch_step(torch, net, opt, x, y, steps=50, warmup=5, amp=False):
    import torch.nn.functional as F

    t = []
    for s in range(steps + warmup):
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        if s >= warmup:
            t.append(time.perf_counter() - t0)
    return median(t)


def torch_mlp(torch, dims, batch):
    layers = []
    for k in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[k], dims[k + 1]))
        if k + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(batch, dims[0])
    y = torch.randint(0, dims[-1], (batch,))
    return torch_step(torch, net, opt, x, y)


def torch_cnn(torch, amp=False):
    """The Fashion-MNIST CNN's Adam step, seconds; with amp, the forward under
    torch.autocast("cpu", dtype=torch.bfloat16) as bench_core --only amp runs ours."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from torch_common import fashion_cnn

    net = fashion_cnn()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    return torch_step(torch, net, opt, x, y, steps=30, amp=amp)


def torch_attention(torch, quick):
    """Forward + backward of causal scaled_dot_product_attention on [32, 4, 128, 32], seconds."""
    import torch.nn.functional as F

    q, k, v = (torch.randn(32, 4, 128, 32, requires_grad=True) for _ in range(3))
    times = []
    for i in range(3 + (5 if quick else 30)):
        t0 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.sum().backward()
        times.append(time.perf_counter() - t0)
        q.grad = k.grad = v.grad = None
    return median(times[3:])


def torch_topk(torch, quick):
    """torch.topk(50) over 50,000 random logits [1, 50000] under no_grad, median seconds."""
    x = torch.randn(1, 50_000)
    times = []
    with torch.no_grad():
        for _ in range(10 + (50 if quick else 500)):
            t0 = time.perf_counter()
            torch.topk(x, 50)
            times.append(time.perf_counter() - t0)
    return median(times[10:])


def torch_convt(torch, quick):
    """ConvTranspose2d 64→32 at 14x14, batch 64, forward and backward of sum(y^2) to the input
    and the weights: median ms for kernel 4 stride 2 padding 1, and kernel 2 stride 2."""
    out = {}
    torch.manual_seed(3)
    for key, k, p in (("convt_k4", 4, 1), ("convt_k2", 2, 0)):
        layer = torch.nn.ConvTranspose2d(64, 32, k, stride=2, padding=p)
        times = []
        for _ in range(3 + (3 if quick else 20)):
            x = torch.randn(64, 64, 14, 14, requires_grad=True)
            t0 = time.perf_counter()
            (layer(x) ** 2).sum().backward()
            times.append(time.perf_counter() - t0)
            layer.zero_grad()
        out[key] = median(times[3:]) * 1e3
    return out


def torch_conv(torch, quick):
    """The DDPM U-Net's 3x3 convolutions (padding 1), batch 64, forward and backward of sum(y^2)
    to the input and the weights: median ms at 28x28 (32 channels), 14x14 and 7x7 (64)."""
    out = {}
    torch.manual_seed(3)
    for c, hw in ((32, 28), (64, 14), (64, 7)):
        layer = torch.nn.Conv2d(c, c, 3, padding=1)
        times = []
        for _ in range(3 + (3 if quick else 20)):
            x = torch.randn(64, c, hw, hw, requires_grad=True)
            t0 = time.perf_counter()
            (layer(x) ** 2).sum().backward()
            times.append(time.perf_counter() - t0)
            layer.zero_grad()
        out[f"conv{hw}"] = median(times[3:]) * 1e3
    return out


def torch_scatter(torch, quick):
    """Message passing's sum: 10^6 edge messages [E, 64] added into 10^5 nodes, forward and
    backward of sum(out^2), median seconds of each form: index_add, scatter_add with the index
    expanded (a view), and the mean aggregation scatter_reduce("mean", include_self=False) over
    that index."""
    e, n, f = 1_000_000, 100_000, 64
    gen = torch.Generator().manual_seed(7)
    dst = torch.randint(0, n, (e,), generator=gen)
    msgs = torch.randn(e, f, requires_grad=True)
    expanded = dst.unsqueeze(1).expand(-1, f)
    out = {}
    for form in ("index_add", "scatter_add", "scatter_mean"):
        times = []
        for _ in range(2 + (3 if quick else 10)):
            t0 = time.perf_counter()
            nodes = torch.zeros(n, f)
            if form == "index_add":
                y = nodes.index_add(0, dst, msgs)
            elif form == "scatter_add":
                y = nodes.scatter_add(0, expanded, msgs)
            else:
                y = nodes.scatter_reduce(0, expanded, msgs, reduce="mean", include_self=False)
            (y * y).sum().backward()
            msgs.grad = None
            times.append(time.perf_counter() - t0)
        out[form] = median(times[2:])
    return out


def torch_ew(torch, quick):
    """GELU and dropout (p = 0.1) on [4096, 512] in f32 and bf16, forward and backward of the
    output's sum, median ms each (the input made outside the timed part, as bench_core's)."""
    out = {}
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        for op in ("gelu", "drop"):
            times = []
            for _ in range(3 + (10 if quick else 60)):
                x = torch.randn(4096, 512).to(dtype).requires_grad_()
                t0 = time.perf_counter()
                if op == "gelu":
                    y = torch.nn.functional.gelu(x)
                else:
                    y = torch.nn.functional.dropout(x, 0.1, training=True)
                y.sum().backward()
                times.append(time.perf_counter() - t0)
            out[f"ew_{op}_{name}"] = median(times[3:]) * 1e3
    return out


def gpt_step_seconds(torch, quick, amp):
    """The char GPT of scripts/torch_char_gpt.py: median seconds of a training step (batch 32 of
    random bytes, AdamW with decay groups, clipping); with amp, the forward and the loss under
    torch.autocast("cpu", dtype=torch.bfloat16). Returns the model too."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import torch.nn.functional as F
    from torch_char_gpt import Gpt, param_groups

    model = Gpt(256, 128, 4, 4, 128, 0.1)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=3e-3, weight_decay=0.1)
    x = torch.randint(0, 256, (32, 128))
    y = torch.randint(0, 256, (32, 128))
    times = []
    for _ in range(3 + (8 if quick else 20)):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return median(times[3:]), model


def torch_gpt(torch, quick):
    """The char GPT's training step (gpt_step_seconds) and generation tokens/s at batch 1 with a
    key/value cache, as bench_core --only gpt measures arenagrad's."""
    step, model = gpt_step_seconds(torch, quick, amp=False)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    prompt = list(b"The meaning of life is")
    model.generate(prompt, 10, 0.8, 40, gen)
    n = 300 if quick else 2000
    t0 = time.perf_counter()
    model.generate(prompt, n, 0.8, 40, gen)
    return step, n / (time.perf_counter() - t0)


def torch_lstm(torch, batch, cells, quick):
    """W5/W6: median seconds of an SGD step of an LSTM 128→256 over 64 positions (bench_core's
    lstm_step)."""
    t, i, h = 64, 128, 256
    x, y = torch.randn(t, batch, i), torch.randn(batch, h)
    m = torch.nn.LSTMCell(i, h) if cells else torch.nn.LSTM(i, h)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    times = []
    for _ in range(3 + (8 if quick else 30)):
        t0 = time.perf_counter()
        opt.zero_grad()
        if cells:
            state = None
            for p in range(t):
                state = m(x[p], state)
            last = state[0]
        else:
            _, (hn, _) = m(x)
            last = hn[0]
        loss = torch.nn.functional.mse_loss(last, y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return median(times[3:])


# bench_core's rows: (key, the row's start, unit shown, scale to the unit).
ROWS = [
    ("w1", "| randn-matmul loop 1024²", "ms/iter"),
    ("gemm", "| f32 GEMM 1024³ through the graph", "GFLOP/s"),
    ("gemm_bf16", "| bf16 GEMM 1024³ (f32 accumulation), over", "GFLOP/s"),
    ("gemm_bf16_1", "| bf16 GEMM 1024³ (f32 accumulation), 1 thread", "GFLOP/s"),
    ("w2_16", "| W2 tiny-op chain, 16 elements", "ns/op"),
    ("w2_1", "| W2 tiny-op chain, 1 element", "ns/op"),
    ("w3", "| W3 MLP 784-512-512-10", "ms"),
    ("w4", "| W4 MLP 64-64-64-10", "µs"),
    ("cnn", "| Fashion-MNIST CNN 32/64", "ms"),
    ("attn", "| causal attention [32, 4, 128, 32] fwd+bwd, fused", "ms"),
    ("topk", "| top-k 50 of 50,000 logits", "µs"),
    ("scatter", "| scatter: index_add of 10^6 edges", "ms"),
    ("scatter_add", "| scatter_add of the same, the index expanded", "ms"),
    ("scatter_mean", "| scatter_reduce mean of the same", "ms"),
    ("convt_k4", "| convt: ConvTranspose2d 64→32 k4 s2 p1", "ms"),
    ("convt_k2", "| convt: ConvTranspose2d 64→32 k2 s2,", "ms"),
    ("conv28", "| conv: Conv2d 32→32 3×3 p1, 28²", "ms"),
    ("conv14", "| conv: Conv2d 64→64 3×3 p1, 14²", "ms"),
    ("conv7", "| conv: Conv2d 64→64 3×3 p1, 7²", "ms"),
    ("ew_gelu_f32", "| ew: GELU [4096, 512] F32", "ms"),
    ("ew_drop_f32", "| ew: dropout 0.1 [4096, 512] F32", "ms"),
    ("ew_gelu_bf16", "| ew: GELU [4096, 512] BF16", "ms"),
    ("ew_drop_bf16", "| ew: dropout 0.1 [4096, 512] BF16", "ms"),
    ("gpt", "| char GPT step (", "ms"),
    ("gpt_gen", "| char GPT generation, batch 1", "tokens/s"),
    ("gpt_amp", "| char GPT step under bf16 autocast |", "ms"),
    ("cnn_amp", "| Fashion-MNIST CNN step under bf16 autocast |", "ms"),
    ("w5", "| W5 LSTM 128→256, seq 64, batch 1, SGD step, nn::LSTM (fused)", "ms"),
    ("w5_cells", "| W5 LSTM 128→256, seq 64, batch 1, SGD step, LSTMCell loop", "ms"),
    ("w6", "| W6 LSTM 128→256, seq 64, batch 32, SGD step, nn::LSTM (fused)", "ms"),
    ("w6_cells", "| W6 LSTM 128→256, seq 64, batch 32, SGD step, LSTMCell loop", "ms"),
]

# Rows comparing one of arenagrad's figures with another of PyTorch's: (row, ours, theirs).
CROSS = [
    ("w5_vs_cells", "w5", "w5_cells"),
    ("w6_vs_cells", "w6", "w6_cells"),
]

LABELS = {
    "w1": "W1 randn-matmul loop 1024², ms/iter",
    "gemm": "f32 GEMM 1024³, GFLOP/s (higher is better)",
    "gemm_bf16": "bf16 GEMM 1024³, f32 accumulation, GFLOP/s (higher is better)",
    "gemm_bf16_1": "bf16 GEMM 1024³, f32 accumulation, 1 thread, GFLOP/s (higher is better)",
    "w2_16": "W2 tiny-op chain, 16 elements, ns/op",
    "w2_1": "W2 tiny-op chain, 1 element, ns/op",
    "w3": "W3 MLP 784-512-512-10 b128 SGD step, ms",
    "w4": "W4 MLP 64-64-64-10 b32 SGD step, µs",
    "cnn": "Fashion-MNIST CNN, one Adam step (random data), ms",
    "attn": "causal attention [32, 4, 128, 32] fwd+bwd (PyTorch's SDPA), ms",
    "topk": "top-k 50 of 50,000 logits, batch 1 (torch.topk), µs",
    "scatter": "index_add of 10^6 edges x 64 into 10^5 nodes, fwd+bwd (PyTorch's faster of index_add and scatter_add), ms",
    "scatter_add": "scatter_add of the same over the index expanded to [10^6, 64] (a view in PyTorch), ms",
    "scatter_mean": "scatter_reduce mean (include_self=False) of the same over the expanded index, ms",
    "convt_k4": "ConvTranspose2d 64→32 k4 s2 p1, 14²→28², b64, fwd+bwd, ms",
    "convt_k2": "ConvTranspose2d 64→32 k2 s2, 14²→28², b64, fwd+bwd, ms",
    "conv28": "Conv2d 32→32 3×3 p1, 28², b64, fwd+bwd (the U-Net's full resolution), ms",
    "conv14": "Conv2d 64→64 3×3 p1, 14², b64, fwd+bwd, ms",
    "conv7": "Conv2d 64→64 3×3 p1, 7², b64, fwd+bwd (the U-Net's lowest resolution), ms",
    "ew_gelu_f32": "GELU [4096, 512] f32, fwd+bwd (of the sum), ms",
    "ew_drop_f32": "dropout p=0.1 [4096, 512] f32, fwd+bwd (of the sum), ms",
    "ew_gelu_bf16": "GELU [4096, 512] bf16, fwd+bwd (of the sum), ms",
    "ew_drop_bf16": "dropout p=0.1 [4096, 512] bf16, fwd+bwd (of the sum), ms",
    "gpt": "char GPT training step (4×128, ctx 128, b32, AdamW, clip), ms",
    "gpt_gen": "char GPT generation, batch 1, key/value cache, tokens/s (higher is better)",
    "gpt_amp": "char GPT training step under bf16 autocast (torch.autocast on the CPU), ms",
    "cnn_amp": "Fashion-MNIST CNN Adam step under bf16 autocast, ms",
    "w5": "W5 LSTM 128→256 seq 64 b1 SGD step: nn::LSTM vs nn.LSTM, ms",
    "w5_vs_cells": "W5: nn::LSTM vs PyTorch's nn.LSTMCell loop, ms",
    "w5_cells": "W5: LSTMCell loop vs nn.LSTMCell loop, ms",
    "w6": "W6 LSTM 128→256 seq 64 b32 SGD step: nn::LSTM vs nn.LSTM, ms",
    "w6_vs_cells": "W6: nn::LSTM vs PyTorch's nn.LSTMCell loop, ms",
    "w6_cells": "W6: LSTMCell loop vs nn.LSTMCell loop, ms",
}


def parse_bench_core(text):
    out = {}
    for line in text.splitlines():
        for key, start, _unit in ROWS:
            if line.startswith(start):
                figure = line.split("|")[2]
                m = re.search(r"[-+]?\d+(\.\d+)?", figure)
                if m:
                    out[key] = float(m.group(0))
    return out


CANDLE = ROOT / "examples" / "peers" / "candle"


def run_candle(threads, quick):
    manifest = CANDLE / "Cargo.toml"
    print("# building the candle harness (the first time takes minutes)", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path", str(manifest)], check=True)
    exe = CANDLE / "target" / "release" / "arenagrad-peer-candle"
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run([str(exe)] + (["--quick"] if quick else []), env=env, check=True, capture_output=True, text=True)
    return parse_bench_core(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--only", default="w1,w2,w3,w4,cnn,attn,gpt,lstm", help="workloads, comma-separated")
    p.add_argument("--candle", action="store_true", help="add candle's figures (W1-W4)")
    p.add_argument("--rounds", type=int, default=1, help="alternate arenagrad and PyTorch this many times")
    args = p.parse_args()
    only = set(args.only.split(","))
    try:
        import torch
    except ImportError as e:
        sys.exit(f"compare_torch.py: PyTorch is not installed ({e})")
    threads = int(os.environ.get("ARENAGRAD_NUM_THREADS", len(os.sched_getaffinity(0))))
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    exe = ROOT / "target" / "release" / "examples" / "bench_core"
    if not exe.exists():
        sys.exit(f"{exe} not found: run `cargo build --release --example bench_core` first")
    cmd = [str(exe), "--only", ",".join(sorted(only))] + (["--quick"] if args.quick else [])
    env = dict(os.environ, ARENAGRAD_NUM_THREADS=str(threads))

    def torch_round():
        theirs = {}
        if "w1" in only:
            theirs.update(torch_w1(torch, args.quick))
        if "bf16" in only:
            bf = torch_bf16(torch, args.quick)
            theirs["gemm_bf16"] = bf["gemm_bf16"]
            theirs["gemm_bf16_1"] = bf["gemm_bf16_1"]
        if "w2" in only:
            theirs["w2_16"] = torch_w2(torch, 16, args.quick)
            theirs["w2_1"] = torch_w2(torch, 1, args.quick)
        if "w3" in only:
            theirs["w3"] = torch_mlp(torch, [784, 512, 512, 10], 128) * 1e3
        if "w4" in only:
            theirs["w4"] = torch_mlp(torch, [64, 64, 64, 10], 32) * 1e6
        if "cnn" in only:
            theirs["cnn"] = torch_cnn(torch) * 1e3
        if "attn" in only:
            theirs["attn"] = torch_attention(torch, args.quick) * 1e3
        if "topk" in only:
            theirs["topk"] = torch_topk(torch, args.quick) * 1e6
        if "scatter" in only:
            forms = torch_scatter(torch, args.quick)
            theirs["scatter"] = min(forms["index_add"], forms["scatter_add"]) * 1e3
            theirs["scatter_add"] = forms["scatter_add"] * 1e3
            theirs["scatter_mean"] = forms["scatter_mean"] * 1e3
        if "convt" in only:
            theirs.update(torch_convt(torch, args.quick))
        if "conv" in only:
            theirs.update(torch_conv(torch, args.quick))
        if "ew" in only:
            theirs.update(torch_ew(torch, args.quick))
        if "gpt" in only:
            step, tps = torch_gpt(torch, args.quick)
            theirs["gpt"], theirs["gpt_gen"] = step * 1e3, tps
        if "amp" in only:
            theirs["gpt_amp"] = gpt_step_seconds(torch, args.quick, amp=True)[0] * 1e3
            theirs["cnn_amp"] = torch_cnn(torch, amp=True) * 1e3
        if "lstm" in only:
            for w, batch in (("w5", 1), ("w6", 32)):
                theirs[w] = torch_lstm(torch, batch, False, args.quick) * 1e3
                theirs[f"{w}_cells"] = torch_lstm(torch, batch, True, args.quick) * 1e3
        return theirs

    # Rounds alternate the two sides, so that the machine's drift (tens of percent over minutes
    # on a shared VM) falls on both alike; each figure is the median over the rounds, and each
    # ratio the median of the rounds' own ratios.
    rounds = []
    print(f"# PyTorch {torch.__version__}, {threads} threads, {args.rounds} round(s)", file=sys.stderr)
    for r in range(args.rounds):
        print(f"# round {r + 1}: {' '.join(cmd)}, then PyTorch", file=sys.stderr)
        ours = parse_bench_core(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        theirs = torch_round()
        for row, a, b in CROSS:
            if a in ours and b in theirs:
                ours[row], theirs[row] = ours[a], theirs[b]
        rounds.append((ours, theirs))

    candle = run_candle(threads, args.quick) if args.candle else {}

    def ratio(key, a, other):
        return a / other if key in ("gemm", "gemm_bf16", "gemm_bf16_1", "gpt_gen") else other / a

    head = f"| workload | arenagrad | PyTorch {torch.__version__} | PyTorch ÷ arenagrad |"
    rule = "|---|---|---|---|"
    if args.candle:
        head += " candle 0.11 | candle ÷ arenagrad |"
        rule += "---|---|"
    print(head)
    print(rule)
    keys = [key for key, _s, _u in ROWS]
    for row, a, _b in CROSS:
        keys.insert(keys.index(a) + 1, row)
    for key in keys:
        both = [(o[key], t[key]) for o, t in rounds if key in o and key in t]
        if not both:
            continue
        a = median([x for x, _ in both])
        t = median([y for _, y in both])
        q = median([ratio(key, x, y) for x, y in both])
        row = f"| {LABELS[key]} | {a:.4g} | {t:.4g} | {q:.2f}× |"
        if args.candle:
            c = candle.get(key)
            row += f" {c:.4g} | {ratio(key, a, c):.2f}× |" if c is not None else " | |"
        print(row)
    if args.rounds > 1:
        print(f"(medians of {args.rounds} alternating rounds; the ratio is the median of each round's own)")
    print(f"({threads} threads; a ratio above 1 means arenagrad is faster)")


if __name__ == "__main__":
    main()
