//! Well-typed programs over smooth ops in f64: gradients finite and within gradcheck tolerance.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(v) = arenagrad_program::fuzzing::check_grad(data) {
        panic!("{v}");
    }
});
