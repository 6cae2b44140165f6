#!/usr/bin/env bash
# Builds, here, what scripts/gpu-check.sh runs on a GPU machine that has no Rust toolchain and no
# network: the release test binaries of arenagrad-exec, arenagrad-graph and arenagrad-nn that hold
# the CUDA tests (built with the `cuda` feature) and the `gpu_bench` example, stripped of debug info, in
# gpu-bundle/ (git-ignored). cudarc loads the driver, cuBLAS and NVRTC at run time, so nothing CUDA
# is needed to build them. Carry the folder to the GPU machine and run scripts/gpu-check.sh there:
# it uses the bundle instead of cargo.
#
#   scripts/gpu-bundle.sh [OUT_DIR]     (default gpu-bundle)
#
# Prints the bundle's size: with the working tree it must fit what the machine's file transfer
# takes (64 MiB where a remote run carries the working tree with it).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-gpu-bundle}"
rm -rf "$out"
mkdir -p "$out/tests" "$out/bin"

# The test binaries with CUDA tests in them: exec's and graph's library tests and graph's
# device-parametrised integration tests; the spatial ops against PyTorch's values (nn), which run
# on the GPU too where there is one. And the data-parallel crate's NCCL test (a world of one on
# GPU 0).
wanted=" arenagrad_exec arenagrad_graph ops_grad conv device_parity spatial_pytorch nccl "
cargo test --release -p arenagrad-exec -p arenagrad-graph -p arenagrad-nn -p arenagrad-dist \
    --features arenagrad-exec/cuda,arenagrad-graph/cuda,arenagrad-nn/cuda,arenagrad-dist/nccl --no-run \
    --message-format=json-render-diagnostics 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])
' >"$out/built.txt"
while read -r name exe; do
    if [[ "$wanted" == *" $name "* ]]; then
        cp "$exe" "$out/tests/$name"
        strip --strip-debug "$out/tests/$name"
    fi
done <"$out/built.txt"
rm "$out/built.txt"
for name in $wanted; do
    if [ ! -x "$out/tests/$name" ]; then
        echo "gpu-bundle: test binary '$name' was not built" >&2
        exit 1
    fi
done

cargo build --release --features cuda --example gpu_bench
cp target/release/examples/gpu_bench "$out/bin/gpu_bench"
strip --strip-debug "$out/bin/gpu_bench"

ls -l "$out/tests" "$out/bin"
du -sh "$out"
