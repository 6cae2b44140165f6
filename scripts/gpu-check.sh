#!/usr/bin/env bash
# Checks arenagrad on a CUDA machine: the GPU, the whole test suite with the `cuda` features on
# (ARENAGRAD_TEST_CUDA=1, so GPU tests fail instead of skipping), the three `gpu_bench` runs and
# their PyTorch counterparts, then a summary table. Finishes within a time budget (default 450 s):
# every step runs under `timeout`, and steps that no longer fit are skipped.
#
#   scripts/gpu-check.sh [--budget SECONDS] [--no-tests] [--no-bench] [--no-torch]
#
# Output goes to stdout and to ${OUT:-gpu-check-out}/gpu-check.log; each step's own output is
# also kept, one after another under a header, in ${OUT:-gpu-check-out}/steps.log — two files in
# all, whatever the steps (a machine that sends back only a few files loses none). Exits non-zero
# if a build, test or gpu_bench step failed or ran out of time; the PyTorch steps are reported but
# do not change the exit status.
#
# Environment:
#   OUT                   where the log goes (default gpu-check-out)
#   CARGO_BUILD_JOBS      parallel jobs (default 16)
#   ARENAGRAD_BUNDLE      prebuilt test binaries and gpu_bench from scripts/gpu-bundle.sh (default:
#                         gpu-bundle/ when it exists): no toolchain or build is needed then, which
#                         is what a GPU machine without Rust and without network needs
#   ARENAGRAD_VENDOR_DIR  a `cargo vendor` directory to build from, offline (default: vendor/
#                         when it exists)
#   PYTHON                the interpreter for the PyTorch scripts (default python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

budget=450
do_tests=1
do_bench=1
do_torch=1
while [ "$#" -gt 0 ]; do
    case "$1" in
        --budget)
            budget="${2:-}"
            shift 2 || { echo "gpu-check: --budget needs a value" >&2; exit 2; }
            ;;
        --no-tests) do_tests=0; shift ;;
        --no-bench) do_bench=0; shift ;;
        --no-torch) do_torch=0; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$budget" in
    ''|*[!0-9]*) echo "gpu-check: --budget must be a whole number of seconds, got '$budget'" >&2; exit 2 ;;
esac

out_dir="${OUT:-gpu-check-out}"
mkdir -p "$out_dir"
log="$out_dir/gpu-check.log"
# Each step's output, kept outside $out_dir and gathered into $out_dir/steps.log at the end.
steps_dir="$(mktemp -d)"
trap 'gather_steps' EXIT

# Appends every step's log to $out_dir/steps.log, in the order the steps ran (run_step lists
# their names in $steps_dir/order).
gather_steps() {
    local name
    : > "$out_dir/steps.log"
    if [ -f "$steps_dir/order" ]; then
        while read -r name; do
            printf '\n===== %s\n' "$name" >> "$out_dir/steps.log"
            cat "$steps_dir/$name.log" >> "$out_dir/steps.log" 2>/dev/null || true
        done < "$steps_dir/order"
    fi
    rm -rf "$steps_dir"
}

export ARENAGRAD_TEST_CUDA=1
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-16}"
export CARGO_TERM_COLOR=never
export CARGO_INCREMENTAL=0
python="${PYTHON:-python3}"

deadline=$((SECONDS + budget))
failed=0
summary=()

# Appends a line to the summary table.
record() {
    summary+=("$(printf '%-22s %-14s %6s  %s' "$1" "$2" "$3" "${4:-}")")
}

# run_step NAME CAP RESERVE [--soft] CMD...: runs CMD under `timeout`, for at most CAP seconds and
# never past the deadline less RESERVE seconds (time kept for the steps after it). Its output goes
# to the terminal, the log and steps/NAME.log. A failure of a step marked --soft is reported but
# does not fail the run. Returns the command's status (or 124 when it was skipped for lack of time).
run_step() {
    local name="$1" cap="$2" reserve="$3"
    shift 3
    local soft=0
    if [ "${1:-}" = "--soft" ]; then
        soft=1
        shift
    fi
    local left=$((deadline - SECONDS - reserve))
    local limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 5 ]; then
        echo "== $name: skipped, out of time"
        record "$name" "SKIPPED" "-" "out of time"
        if [ "$soft" -eq 0 ]; then failed=1; fi
        return 124
    fi
    echo "== $name (limit ${limit}s): $*"
    # `timeout` runs programs: a shell function of this script runs in a child bash.
    if declare -F "$1" >/dev/null; then
        export -f "${1?}"
        set -- bash -c '"$@"' bash "$@"
    fi
    local start=$SECONDS status
    set +e
    echo "$name" >> "$steps_dir/order"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$steps_dir/$name.log"
    status=${PIPESTATUS[0]}
    set -e
    local took=$((SECONDS - start))
    if [ "$status" -eq 0 ]; then
        record "$name" "ok" "$took"
    elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        record "$name" "TIMEOUT" "$took" "limit ${limit}s"
    else
        record "$name" "FAILED($status)" "$took"
    fi
    if [ "$status" -ne 0 ] && [ "$soft" -eq 0 ]; then failed=1; fi
    return "$status"
}

# Whether the rustup installer's host answers (the GPU machine may have no network).
have_network() {
    command -v curl >/dev/null 2>&1 &&
        curl --proto '=https' --tlsv1.2 -sSfI --max-time 5 https://sh.rustup.rs >/dev/null 2>&1
}

gpu_summary() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "gpu-check: nvidia-smi not found: no NVIDIA driver on this machine" >&2
        return 1
    fi
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,compute_cap \
        --format=csv
    nvidia-smi
    echo "-- CUDA libraries the runtime loader sees:"
    ldconfig -p 2>/dev/null | grep -E 'lib(cuda|cublas|cublasLt|nvrtc)\.so' || echo "(none in the ldconfig cache)"
}

# Finds cargo (or installs it with rustup when the network allows) and puts it on PATH. Runs in
# this shell, not under run_step, so that the PATH change stays.
ensure_cargo() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        if ! have_network; then
            echo "gpu-check: cargo is not installed and the network is unreachable: put a Rust" >&2
            echo "toolchain on PATH (e.g. a copy of ~/.cargo and ~/.rustup) and run again" >&2
            return 1
        fi
        local left=$((deadline - SECONDS - 120))
        if [ "$left" -lt 30 ]; then
            echo "gpu-check: no time left to install a toolchain" >&2
            return 1
        fi
        echo "cargo not found: installing a minimal stable toolchain with rustup (limit $((left < 180 ? left : 180))s)"
        # The URL is inside the single-quoted script on purpose: the child shell runs it.
        # shellcheck disable=SC2016
        timeout "$((left < 180 ? left : 180))" sh -c 'curl --proto "=https" --tlsv1.2 -sSf https://sh.rustup.rs |
            sh -s -- -y --profile minimal --default-toolchain stable --no-modify-path' || return 1
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    cargo --version && rustc --version
}

# When the system has no cuBLAS/NVRTC but a pip-installed PyTorch brought its own, let the
# dynamically loaded CUDA libraries be found there.
# The lib folders of PyTorch's pip packages (nvidia/*/lib), one a line.
torch_lib_dirs() {
    "$python" - 2>/dev/null <<'EOF' || true
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for base in (spec.submodule_search_locations if spec else []):
    for d in sorted(os.listdir(base)):
        lib = os.path.join(base, d, "lib")
        if os.path.isdir(lib):
            print(lib)
EOF
}

# NCCL for the data-parallel test: cudarc opens `libnccl.so` (or `.so.13`, `.so.12`, ...), but
# pip's nvidia-nccl ships only `libnccl.so.2`: link the name to it in a folder of our own.
add_nccl_link() {
    if ldconfig -p 2>/dev/null | grep -Eq '[[:space:]]libnccl\.so '; then
        return 0
    fi
    local d found=""
    while read -r d; do
        if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then
            found="$d/libnccl.so.2"
            break
        fi
    done <<<"$(torch_lib_dirs)"
    if [ -z "$found" ]; then
        echo "gpu-check: no libnccl.so.2 found: the NCCL test will fail to start"
        return 0
    fi
    local link="${TMPDIR:-/tmp}/arenagrad-nccl"
    mkdir -p "$link"
    ln -sf "$found" "$link/libnccl.so"
    export LD_LIBRARY_PATH="$link${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu-check: libnccl.so -> $found"
}

add_torch_cuda_libs() {
    local cache
    cache="$(ldconfig -p 2>/dev/null || true)"
    # The names the CUDA 13 build loads (`.so`, `.so.13`, `.so.12`), each on its own: `libcublas.so`
    # alone would also match `libcublas.so.11`, and `libcublasLt.so` must not count for cuBLAS.
    if grep -Eq '[[:space:]]libcublas\.so(\.1[23])? ' <<<"$cache" &&
        grep -Eq '[[:space:]]libnvrtc\.so(\.1[23])? ' <<<"$cache"; then
        return 0
    fi
    local dirs
    dirs="$(torch_lib_dirs)"
    if [ -n "$dirs" ]; then
        local joined
        joined="$(paste -sd: <<<"$dirs")"
        export LD_LIBRARY_PATH="${joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "gpu-check: cuBLAS/NVRTC not in the ldconfig cache; using PyTorch's: $joined"
    fi
}

# The driver's libcuda.so.1 outside the ldconfig cache (containers often mount it elsewhere):
# its folder goes on LD_LIBRARY_PATH.
add_driver_dir() {
    if ldconfig -p 2>/dev/null | grep -Eq '[[:space:]]libcuda\.so\.1 '; then
        return 0
    fi
    local d
    for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
        /usr/lib/wsl/lib /usr/local/cuda/compat /usr/lib/x86_64-linux-gnu/nvidia/current; do
        if [ -e "$d/libcuda.so.1" ]; then
            export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            echo "gpu-check: libcuda.so.1 is not in the ldconfig cache; using $d"
            return 0
        fi
    done
    echo "gpu-check: libcuda.so.1 not found (ldconfig cache and the usual driver folders)"
}

# Each bundled test binary runs one test at a time (they share one CUDA context per device).
bundle_tests() {
    local dir="$1" status=0 t
    for t in "$dir"/tests/*; do
        echo "-- $(basename "$t")"
        "$t" --test-threads=1 || status=1
    done
    return "$status"
}

# The bundle's tests and benchmarks, then the summary.
run_bundle() {
    local dir="$1" have_torch="$2" reserve=0
    record toolchain "-" "-" "prebuilt bundle"
    if [ "$do_tests" -eq 1 ]; then
        if [ "$do_bench" -eq 1 ]; then reserve=$((reserve + 75)); fi
        if [ "$have_torch" -eq 1 ]; then reserve=$((reserve + 90)); fi
        run_step info 30 "$reserve" "$dir/bin/gpu_bench" info || true
        run_step tests 240 "$reserve" bundle_tests "$dir" || true
    fi
    benches_and_summary "$do_bench" "$have_torch" "$dir/bin/gpu_bench"
}

main() {
    echo "== gpu-check $(date -u '+%Y-%m-%dT%H:%M:%SZ') on $(uname -n), budget ${budget}s, ${CARGO_BUILD_JOBS} jobs"
    run_step gpu 30 0 gpu_summary || true

    local have_torch=0
    if [ "$do_torch" -eq 1 ]; then
        if timeout 120 "$python" -c 'import torch' >/dev/null 2>&1; then
            have_torch=1
            "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available:", torch.cuda.is_available())' || true
        else
            echo "gpu-check: '$python -c \"import torch\"' failed: the PyTorch comparison is skipped"
            record torch "SKIPPED" "-" "no PyTorch"
        fi
    fi
    add_driver_dir
    add_torch_cuda_libs
    add_nccl_link

    local bundle="${ARENAGRAD_BUNDLE:-gpu-bundle}"
    if [ -d "$bundle/tests" ] && [ -x "$bundle/bin/gpu_bench" ]; then
        bundle="$(cd "$bundle" && pwd)"
        echo "gpu-check: running the prebuilt binaries in $bundle (no build)"
        run_bundle "$bundle" "$have_torch"
        return $?
    fi

    echo "== toolchain"
    local cargo_ok=0 start=$SECONDS
    if ensure_cargo; then
        cargo_ok=1
        record toolchain "ok" "$((SECONDS - start))"
    else
        record toolchain "FAILED" "$((SECONDS - start))" "no cargo"
        failed=1
    fi

    # Build from vendored sources when they are there; stay offline when the network is not.
    local cargo_args=()
    local vendor="${ARENAGRAD_VENDOR_DIR:-vendor}"
    if [ -d "$vendor" ]; then
        vendor="$(cd "$vendor" && pwd)"
        echo "gpu-check: building from the vendored sources in $vendor"
        cargo_args+=(--offline
            --config 'source.crates-io.replace-with="vendored-sources"'
            --config "source.vendored-sources.directory=\"$vendor\"")
    elif [ "$cargo_ok" -eq 1 ] && ! have_network; then
        echo "gpu-check: no network: building offline from the local cargo registry cache"
        cargo_args+=(--offline)
    fi

    # Every member's `cuda` feature, as package/feature.
    local features=() manifest pkg
    for manifest in Cargo.toml crates/*/Cargo.toml; do
        if grep -qE '^cuda[[:space:]]*=' "$manifest"; then
            # The first `name =` is the package's ([[example]] and [[bin]] tables come later).
            pkg="$(sed -n '/^name[[:space:]]*=/{s/^name[[:space:]]*=[[:space:]]*"\(.*\)"/\1/p;q}' "$manifest")"
            features+=("$pkg/cuda")
        fi
    done
    local feature_list
    feature_list="$(IFS=,; echo "${features[*]}")"
    echo "gpu-check: cuda features: ${feature_list:-(none)}"

    local bench_ok=0 tests_built=0
    if [ "$cargo_ok" -eq 1 ]; then
        if [ -z "$feature_list" ]; then
            echo "gpu-check: no crate has a 'cuda' feature" >&2
            record features "FAILED" "-" "no cuda feature"
            failed=1
        else
            local keep=60
            if [ "$do_tests" -eq 1 ]; then
                keep=$((keep + 60))
                if run_step build-tests 330 "$keep" cargo test "${cargo_args[@]}" --release \
                    --workspace --features "$feature_list" --no-run; then
                    tests_built=1
                fi
            fi
            if [ "$do_bench" -eq 1 ]; then
                if [ ! -f examples/gpu_bench.rs ]; then
                    echo "gpu-check: examples/gpu_bench.rs is missing" >&2
                    record build-bench "FAILED" "-" "no examples/gpu_bench.rs"
                    failed=1
                elif [[ ",$feature_list," != *",arenagrad-suite/cuda,"* ]]; then
                    echo "gpu-check: package arenagrad-suite (the examples) has no 'cuda' feature" >&2
                    record build-bench "FAILED" "-" "no arenagrad-suite/cuda"
                    failed=1
                elif run_step build-bench 300 30 cargo build "${cargo_args[@]}" --release \
                    -p arenagrad-suite --features cuda --example gpu_bench; then
                    bench_ok=1
                fi
            fi
            if [ "$tests_built" -eq 1 ]; then
                local reserve=0
                if [ "$bench_ok" -eq 1 ]; then reserve=$((reserve + 75)); fi
                if [ "$have_torch" -eq 1 ]; then reserve=$((reserve + 90)); fi
                run_step tests 240 "$reserve" cargo test "${cargo_args[@]}" --release \
                    --workspace --features "$feature_list" -- --nocapture || true
            fi
        fi
    fi

    local bench=(cargo run "${cargo_args[@]}" -q --release -p arenagrad-suite --features cuda
        --example gpu_bench --)
    if [ "$bench_ok" -eq 1 ]; then
        run_step info 60 0 "${bench[@]}" info || true
    fi
    benches_and_summary "$bench_ok" "$have_torch" "${bench[@]}"
}

# The benchmarks (BENCH_OK: gpu_bench is runnable as the command after the first two arguments),
# the PyTorch counterparts (HAVE_TORCH), the summary table and the verdict.
benches_and_summary() {
    local bench_ok="$1" have_torch="$2"
    shift 2
    local bench=("$@")
    if [ "$bench_ok" -eq 1 ]; then
        run_step bench-leak_check 60 0 "${bench[@]}" leak-check --n 4096 --iters 50 || true
        run_step bench-mlp 60 0 "${bench[@]}" mlp --batch 1024 --steps 50 || true
        run_step bench-queue 60 0 "${bench[@]}" queue --width 1024 --ops 100 || true
    fi
    if [ "$have_torch" -eq 1 ]; then
        run_step torch-leak_check 60 0 --soft "$python" scripts/torch_leak_check.py --n 4096 --iters 50 || true
        run_step torch-mlp 60 0 --soft "$python" scripts/torch_mlp.py --batch 1024 --steps 50 || true
        run_step torch-queue 60 0 --soft "$python" scripts/torch_queue.py --width 1024 --ops 100 || true
    fi
    echo
    echo "== summary (${SECONDS}s of ${budget}s)"
    printf '%-22s %-14s %6s  %s\n' "step" "status" "secs" "note"
    printf '%s\n' "${summary[@]}"

    echo
    echo "== arenagrad against PyTorch"
    printf '%-10s %-10s %s\n' "bench" "engine" "row"
    local key engine file row
    for key in leak_check mlp queue; do
        for engine in arenagrad torch; do
            if [ "$engine" = arenagrad ]; then
                file="$steps_dir/bench-$key.log"
            else
                file="$steps_dir/torch-$key.log"
            fi
            row="(not run)"
            if [ -f "$file" ]; then
                row="$(grep -E "^$key " "$file" | tail -n 1 || true)"
                row="${row:-(no row)}"
            fi
            printf '%-10s %-10s %s\n' "$key" "$engine" "$row"
        done
    done

    if [ "$failed" -ne 0 ]; then
        echo "== gpu-check FAILED"
        return 1
    fi
    echo "== gpu-check passed"
}

# With pipefail, a failing main fails the pipeline and `set -e` exits with its status.
main 2>&1 | tee "$log"
