//! Arbitrary bytes into the program parser: a typed error or a program that round-trips and runs (or is refused) without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(v) = arenagrad_program::fuzzing::check_parse(data) {
        panic!("{v}");
    }
});
