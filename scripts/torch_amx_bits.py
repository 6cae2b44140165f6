"""Whether PyTorch's bf16 matrix product gives the same bits on AMX as on AVX-512.

oneDNN picks AMX's tile unit for bf16 `mm` where the CPU has it; `ONEDNN_MAX_CPU_ISA` caps it at
AVX-512 BF16 (`vdpbf16ps`). This script runs the same product under both (each in a process of
its own, since oneDNN reads the variable once) and counts the bf16 outputs that differ.

    python3 scripts/torch_amx_bits.py
"""

import os
import subprocess
import sys
import tempfile

import torch

CHILD = """
import sys, torch
torch.manual_seed(0)
a = torch.randn(256, 4096).to(torch.bfloat16)
b = torch.randn(4096, 256).to(torch.bfloat16)
torch.save(a @ b, sys.argv[1])
"""


def product(path, isa):
    env = dict(os.environ)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    subprocess.run([sys.executable, "-c", CHILD, path], env=env, check=True)
    return torch.load(path)


def main():
    with tempfile.TemporaryDirectory() as d:
        best = product(os.path.join(d, "best.pt"), None)
        avx512 = product(os.path.join(d, "avx512.pt"), "AVX512_CORE_BF16")
    differ = (best.view(torch.int16) != avx512.view(torch.int16)).sum().item()
    amx = "amx_bf16" in open("/proc/cpuinfo").read()
    print(f"CPU has AMX-BF16: {amx}")
    print(f"256x4096x256 bf16 product: {differ} of {best.numel()} bf16 outputs differ "
          "between oneDNN's best ISA and AVX512_CORE_BF16")


if __name__ == "__main__":
    main()
