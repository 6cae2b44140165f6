//! Structured, possibly ill-shaped programs built and run: typed errors only, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(v) = arenagrad_program::fuzzing::check_build(data) {
        panic!("{v}");
    }
});
