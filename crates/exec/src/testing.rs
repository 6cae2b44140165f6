//! Tests that cannot run everywhere: a skip that shows in `cargo test`'s output, and the
//! switches that turn a skip into a failure.
//!
//! Some tests need what a machine may lack: a GPU, NVRTC, a C++ compiler, `mpirun`, a Debian
//! data package. libtest has no way for a running test to call itself ignored, and it keeps what
//! a passing test prints with `print!` or `eprint!` to itself: a test that returns early would
//! show as `ok` and say nothing. [`skip`] writes its line to the process's standard error
//! directly (a `write_all` on [`std::io::stderr`], which libtest does not capture), so
//! `cargo test` shows it between the results:
//!
//! ```text
//! running 3 tests
//! SKIPPED wine: /usr/lib/python3/dist-packages/sklearn/datasets/data/wine_data.csv is not installed (Debian: python3-sklearn); ARENAGRAD_REQUIRE_DATA=1 makes this a failure
//! test wine ... ok
//! ```
//!
//! The test still counts as passed (libtest has no other outcome a test can choose at run time).
//! A machine that promises what a test needs sets the test's switch, and there the skip is a
//! failure ([`skip_or_fail`]): CI sets [`REQUIRE_DATA`], [`REQUIRE_MPI`], [`REQUIRE_CXX`] and
//! [`TEST_NVRTC`], a GPU machine [`TEST_CUDA`].

use std::fmt::Display;
use std::io::Write;

/// Fails the tests that read Debian's data packages (`python3-sklearn`, `fortunes`) where they
/// are missing.
pub const REQUIRE_DATA: &str = "ARENAGRAD_REQUIRE_DATA";
/// Fails the tests that run ranks under `mpirun` (Open MPI) where there is none.
pub const REQUIRE_MPI: &str = "ARENAGRAD_REQUIRE_MPI";
/// Fails the test that runs the CUDA kernels on the host where there is no C++ compiler.
pub const REQUIRE_CXX: &str = "ARENAGRAD_REQUIRE_CXX";
/// Fails the tests that need a CUDA device (and NCCL) where none is usable.
pub const TEST_CUDA: &str = "ARENAGRAD_TEST_CUDA";
/// Fails the CUDA kernels' compile test where NVRTC cannot be loaded.
pub const TEST_NVRTC: &str = "ARENAGRAD_TEST_NVRTC";

/// Whether `switch` is on: set to anything but nothing or `0`.
pub fn required(switch: &str) -> bool {
    std::env::var_os(switch).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Reports that the running test skipped its work, and why, on standard error where `cargo test`
/// shows it: `SKIPPED <test>: <why>`. The caller returns after it.
///
/// The test is named by its thread, which libtest names after the test.
pub fn skip(why: impl Display) {
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(name) if name != "main" => name,
        _ => "a test",
    };
    // One write of the whole line, so that tests skipping on several threads do not interleave.
    let line = format!("SKIPPED {test}: {why}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// [`skip`], unless `switch` is on ([`required`]): then the test fails, saying why.
///
/// # Panics
/// When `switch` is on.
#[track_caller]
pub fn skip_or_fail(switch: &str, why: impl Display) {
    if required(switch) {
        panic!("{switch} is set, so this test may not skip: {why}");
    }
    skip(format_args!("{why}; {switch}=1 makes this a failure"));
}
