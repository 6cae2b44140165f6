#!/usr/bin/env bash
# Runs arenagrad's fuzz targets, each for a fixed time.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS defaults to 30; the targets default to all of them (parse, build_run, grad). Needs a
# nightly toolchain (`rustup toolchain install nightly`); installs cargo-fuzz if it is missing.
# New corpus entries go to a temporary directory, so the committed seed corpora under
# fuzz/corpus/ stay small; crashes are written to fuzz/artifacts/TARGET/. Exits non-zero if any
# target found a crash.
set -euo pipefail

secs="${1:-30}"
if [ "$#" -gt 0 ]; then shift; fi
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(parse build_run grad)
fi
case "$secs" in
    ''|*[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$secs'" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz.sh: cargo-fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$root/fuzz"
failed=()
for t in "${targets[@]}"; do
    if [ ! -d "corpus/$t" ]; then
        echo "fuzz.sh: unknown target '$t' (no fuzz/corpus/$t)" >&2
        exit 2
    fi
    mkdir -p "$work/$t"
    echo "== $t: ${secs}s"
    status=0
    cargo +nightly fuzz run "$t" "$work/$t" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$work/$t.log" 2>&1 || status=$?
    grep -E '^Done [0-9]+ runs|stat::number_of_executed_units' "$work/$t.log" || true
    if [ "$status" -ne 0 ]; then
        echo "== $t FAILED (exit $status); the end of its log:" >&2
        tail -n 60 "$work/$t.log" >&2
        failed+=("$t")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "== crashes in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "== all targets ran ${secs}s without a crash"
