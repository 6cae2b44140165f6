#!/usr/bin/env python3
"""PyTorch counterpart of `gpu_bench queue`.

How long the host takes to queue a forward pass, against how long the GPU takes to run it. The
pass starts from x = randn(4096, width) (float32, cuda:0, requires_grad unless --no-grad, so that
autograd records the graph as a training forward does) and applies --ops ops, alternating

    y @ W_k  (W_k: width x width, scaled by 1/sqrt(width)),  tanh(y)

(one kernel each), the same pass as `gpu_bench queue`. For each of --repeats runs, after two warm-up chains:

* host_ms: wall clock around the Python loop that queues the chain, without synchronising;
* gpu_ms: CUDA events recorded on the stream just before and just after the chain. The stream is
  first held by a sleep kernel (torch.cuda._sleep) long enough for the host to queue the whole
  chain, so that the kernels run back to back and gpu_ms is the device's own time, not the
  host's. Without torch.cuda._sleep, gpu_ms includes the gaps where the GPU waited for the host
  (a warning says so).

Prints the medians in one row, in the same format as the Rust example:

    queue width=1024 ops=100 host_ms=<f> gpu_ms=<f> ratio=<f>

ratio is host_ms / gpu_ms: above 1 the chain is bound by the host's queueing. Context goes to
stderr so that stdout holds only the row.
"""

import argparse
import statistics
import sys
import time

from torch_common import cuda_setup


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1024, help="features per row (and side of each W)")
    p.add_argument("--ops", type=int, default=100, help="ops in the pass (matmul and tanh alternate)")
    p.add_argument("--repeats", type=int, default=5, help="timed chains (the medians are shown)")
    p.add_argument("--no-grad", action="store_true", help="run the chain without autograd")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    args = p.parse_args()
    if args.width < 1 or args.ops < 1 or args.repeats < 1:
        p.error("--width, --ops and --repeats must be at least 1")

    torch, dev = cuda_setup("torch_queue", args.seed, f"autograd={'off' if args.no_grad else 'on'}")

    layers = (args.ops + 1) // 2
    ws = [
        torch.randn(args.width, args.width, device=dev, dtype=torch.float32) / args.width**0.5
        for _ in range(layers)
    ]
    x = torch.randn(
        4096, args.width, device=dev, dtype=torch.float32, requires_grad=not args.no_grad
    )

    def chain():
        y = x
        for i in range(args.ops):
            y = y @ ws[i // 2] if i % 2 == 0 else torch.tanh(y)
        return y

    # Warm-up: CUDA context, kernel loading, the caching allocator's blocks. The second chain also
    # estimates the host's queueing time, to size the sleep that holds the stream.
    host_estimate_ms = 0.0
    for _ in range(2):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        y = chain()
        host_estimate_ms = (time.perf_counter() - t0) * 1e3
        del y
    torch.cuda.synchronize(dev)

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    sleep = getattr(torch.cuda, "_sleep", None)
    cycles_per_ms = 0.0
    if sleep is not None:
        calib_cycles = 50_000_000
        start.record()
        sleep(calib_cycles)
        end.record()
        torch.cuda.synchronize(dev)
        cycles_per_ms = calib_cycles / max(start.elapsed_time(end), 1e-3)
    else:
        print(
            "# warning: torch.cuda._sleep is missing; gpu_ms includes the time the GPU waited "
            "for the host",
            file=sys.stderr,
        )

    host_ms, gpu_ms = [], []
    stall_ms = 4.0 * host_estimate_ms + 2.0
    for _ in range(args.repeats):
        torch.cuda.synchronize(dev)
        if sleep is not None:
            sleep(int(cycles_per_ms * stall_ms))
        start.record()
        t0 = time.perf_counter()
        y = chain()
        t1 = time.perf_counter()
        end.record()
        torch.cuda.synchronize(dev)
        host = (t1 - t0) * 1e3
        if sleep is not None and host > stall_ms:
            print(
                f"# warning: queueing took {host:.3f} ms, longer than the {stall_ms:.3f} ms stall; "
                "this run's gpu_ms includes host time",
                file=sys.stderr,
            )
            stall_ms = 2.0 * host
        host_ms.append(host)
        gpu_ms.append(start.elapsed_time(end))
        del y

    host, gpu = statistics.median(host_ms), statistics.median(gpu_ms)
    print(
        f"# host_ms runs: {' '.join(f'{v:.3f}' for v in host_ms)}; "
        f"gpu_ms runs: {' '.join(f'{v:.3f}' for v in gpu_ms)}",
        file=sys.stderr,
    )
    print(
        f"queue width={args.width} ops={args.ops} host_ms={host:.3f} gpu_ms={gpu:.3f} "
        f"ratio={host / max(gpu, 1e-9):.3f}"
    )


if __name__ == "__main__":
    main()
