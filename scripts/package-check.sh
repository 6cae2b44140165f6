#!/usr/bin/env bash
# Packages every published crate (`cargo publish --workspace --dry-run`: the registry's checks)
# and then compiles each package's own tests and doctests from the packages alone:
# the .crate files unpacked side by side, their arenagrad dependencies patched to one another,
# nothing else of the repository in reach.
#
#   scripts/package-check.sh [--run]    (--run: run all those tests; default: build them and run
#                                        the doctests)
set -euo pipefail
cd "$(dirname "$0")/.."
# These builds are checked, not debugged: no debug info keeps their target directories small.
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0

# Cargo unpacks the verification builds' packages under ~/.cargo/registry/src/-<hash>/ and does
# not unpack them again while a directory of that name and version exists: a rerun after a
# change would verify the old sources. Those directories hold only such local packages.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-* "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/-*
# Packages every crate and runs the registry's checks of a publish (metadata, dependency
# versions) without uploading. Not its verification build: the test builds below build every
# crate from its package too (with all features), and a second build of the workspace took
# minutes of CI.
cargo publish --workspace --dry-run --allow-dirty --no-verify
# The .crate files themselves, for the test builds below.
cargo package --workspace --allow-dirty --no-verify
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
crates=(arenagrad-derive arenagrad-alloc arenagrad-exec arenagrad-graph arenagrad-nn arenagrad-program arenagrad-dist arenagrad)
dir=target/package-check
rm -rf "$dir"
mkdir -p "$dir"
members=""
patches=""
for c in "${crates[@]}"; do
    tar xzf "target/package/$c-$version.crate" -C "$dir"
    members+="\"$c-$version\", "
    patches+="$c = { path = \"$c-$version\" }"$'\n'
done
cat >"$dir/Cargo.toml" <<TOML
[workspace]
resolver = "2"
members = [${members%, }]

[patch.crates-io]
${patches}
[profile.test]
opt-level = 1
TOML
cp Cargo.lock "$dir/"
cd "$dir"
export CARGO_TARGET_DIR=../package-check-target
if [ "${1:-}" = "--run" ]; then
    cargo test --workspace --all-features
else
    # The tests compiled; the doctests compiled and run (they are quick).
    cargo test --workspace --all-features --no-run
    cargo test --workspace --all-features --doc
fi
echo "package-check: every crate's tests and doctests build from its package alone"
