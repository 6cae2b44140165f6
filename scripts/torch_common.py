"""What the PyTorch counterparts of arenagrad's benchmarks and examples share."""

import sys


def require_cuda(script):
    """Imports torch and returns it, or exits with a message naming `script` when CUDA cannot
    be used."""
    try:
        import torch
    except ImportError as e:
        sys.exit(f"{script}: PyTorch is not installed ({e})")
    if not torch.cuda.is_available():
        sys.exit(
            f"{script}: CUDA is not available to PyTorch {torch.__version__} "
            f"(built for CUDA {torch.version.cuda}); this benchmark needs a GPU"
        )
    return torch


def cuda_setup(script, seed, extra=None):
    """`require_cuda`, then cuda:0 seeded with `seed`; prints a context line (versions, device,
    TF32 matmul, `extra`) to stderr so that stdout holds only the result row. Returns
    (torch, device)."""
    torch = require_cuda(script)
    dev = torch.device("cuda:0")
    torch.manual_seed(seed)
    notes = [f"tf32 matmul={torch.backends.cuda.matmul.allow_tf32}"] + ([extra] if extra else [])
    print(
        f"# torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(dev)}, "
        + ", ".join(notes),
        file=sys.stderr,
    )
    return torch, dev


def fashion_cnn():
    """The Fashion-MNIST example's net (`examples/fashion_mnist.rs`): conv3x3(1->32)-relu-maxpool2-
    conv3x3(32->64)-relu-maxpool2-linear(3136->128)-relu-linear(128->10), as a Sequential whose
    state_dict names (`0.weight`, ...) are the ones the example's `--init` reads."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10),
    )
