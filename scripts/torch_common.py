"""What the PyTorch counterparts of `gpu_bench` share."""

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
