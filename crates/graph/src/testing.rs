//! Running one test body on every device: [`device_test!`](crate::device_test).

use crate::Device;

/// The environment variable that turns a missing GPU from a skip into a failure (set it on
/// machines that have one, so a broken driver setup cannot pass as "skipped").
pub const REQUIRE_CUDA_ENV: &str = "ARENAGRAD_TEST_CUDA";

/// The CUDA device a device test should use, or `None` after printing why it is skipped.
///
/// # Panics
/// When [`REQUIRE_CUDA_ENV`] is set to `1` and no CUDA device can be used: a test machine that
/// promises a GPU must not pass by skipping.
pub fn cuda_test_device(test: &str) -> Option<Device> {
    let dev = Device::Cuda(0);
    let why = match crate::check_device(dev) {
        Ok(()) => return Some(dev),
        Err(e) => e.to_string(),
    };
    if std::env::var(REQUIRE_CUDA_ENV).is_ok_and(|v| v == "1") {
        panic!("{test}: {REQUIRE_CUDA_ENV}=1 but CUDA is unusable: {why}");
    }
    eprintln!("skipped {test} on CUDA: {why}");
    None
}

/// Defines a test whose body runs on the CPU always and on `cuda:0` when a GPU is present.
///
/// `device_test!(fn name(dev) { ... })` makes a module `name` with two tests, `name::cpu` and
/// `name::cuda`; the body sees the device as `dev: Device`. Without a usable GPU the CUDA test
/// prints why it skipped and passes — unless `ARENAGRAD_TEST_CUDA=1`, when it fails.
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
                let name = concat!(module_path!(), "::cuda");
                if let Some(d) = $crate::testing::cuda_test_device(name) {
                    body(d)
                }
            }
        }
    };
    ($($(#[$meta:meta])* fn $name:ident($dev:ident) $body:block)+) => {
        $($crate::device_test! { $(#[$meta])* fn $name($dev) $body })+
    };
}
