//! Running one test body on every device: [`device_test!`](crate::device_test); and, from
//! `arenagrad-exec`, the skip that shows in `cargo test`'s output and the switches that make it
//! a failure ([`skip`], [`skip_or_fail`]).

pub use arenagrad_exec::testing::*;

use crate::Device;

/// The environment variable that turns a missing GPU from a skip into a failure (set it on
/// machines that have one, so a broken driver setup cannot pass as "skipped").
pub const REQUIRE_CUDA_ENV: &str = TEST_CUDA;

/// The CUDA device a device test should use, or `None` after reporting the skip and why
/// ([`skip`]).
///
/// # Panics
/// When [`REQUIRE_CUDA_ENV`] is on ([`required`]) and no CUDA device can be used: a test
/// machine that promises a GPU must not pass by skipping.
#[track_caller]
pub fn cuda_test_device() -> Option<Device> {
    let dev = Device::Cuda(0);
    match crate::check_device(dev) {
        Ok(()) => Some(dev),
        Err(e) => {
            skip_or_fail(REQUIRE_CUDA_ENV, format_args!("CUDA is unusable: {e}"));
            None
        }
    }
}

/// Defines a test whose body runs on the CPU always and on `cuda:0` when a GPU is present.
///
/// `device_test!(fn name(dev) { ... })` makes a module `name` with two tests, `name::cpu` and
/// `name::cuda`; the body sees the device as `dev: Device`. Without a usable GPU the CUDA test
/// reports why it skipped ([`skip`](crate::testing::skip)) and passes — unless
/// `ARENAGRAD_TEST_CUDA` (set to anything but empty or `0`), when it fails.
///
/// ```
/// use arenagrad_graph::{device_test, Graph};
/// device_test! {
///     fn doubles(dev) {
///         let g = Graph::on(dev).unwrap();
///         let x = g.from_slice(&[1.0f32, 2.0], &[2]).unwrap();
///         assert_eq!(x.scale(2.0).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
///     }
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! device_test {
    ($(#[$meta:meta])* fn $name:ident($dev:ident) $body:block) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($dev: $crate::Device) $body

            #[test]
            pub fn cpu() {
                body($crate::Device::Cpu)
            }

            #[test]
            pub fn cuda() {
                if let Some(d) = $crate::testing::cuda_test_device() {
                    body(d)
                }
            }
        }
    };
    ($($(#[$meta:meta])* fn $name:ident($dev:ident) $body:block)+) => {
        $($crate::device_test! { $(#[$meta])* fn $name($dev) $body })+
    };
}
