//! proptest strategies for property-testing code built on arenagrad: shapes, pairs of shapes
//! that broadcast, tensors of values, and whole well-typed random programs.
//!
//! Programs are generated as lists of choices ([`LeafChoice`], [`OpChoice`]) read by
//! [`generate::well_typed`], so they shrink the way lists do: a failing program loses statements
//! until none can go, and the statements its output does not use are dropped. With a wrong
//! backward rule planted in one op (see [`Overrides`](crate::Overrides)), a failing
//! program shrinks to the op and its operands.
//!
//! ```
//! use arenagrad_program::strategy::{self, GenConfig};
//! use arenagrad_program::{CheckOptions, Limits};
//! use proptest::test_runner::{Config, TestRunner};
//!
//! // In a test suite this is `proptest! { #[test] fn f(p in strategy::smooth_program(4)) {..} }`.
//! let mut runner = TestRunner::new(Config { cases: 8, ..Config::default() });
//! runner
//!     .run(&strategy::program(GenConfig::smooth(), 4), |p| {
//!         let opts = CheckOptions { limits: Limits::small(), ..CheckOptions::default() };
//!         let report = p.gradcheck(&opts).unwrap();
//!         proptest::prop_assert!(report.passed, "{}\n{}", p, report);
//!         Ok(())
//!     })
//!     .unwrap();
//! ```

use proptest::collection::vec;
use proptest::prelude::*;

use crate::generate;
pub use crate::generate::{all_ops, smooth_ops, GenConfig, LeafChoice, OpChoice};
use crate::Program;
use arenagrad_graph::HostTensor;

/// Shapes of rank `0..=max_rank` with extents in `1..=max_dim`.
pub fn shape(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    vec(1..=max_dim.max(1), 0..=max_rank)
}

/// Shapes of rank `0..=max_rank` with extents in `0..=max_dim` (empty tensors included).
pub fn shape_with_zeros(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    vec(0..=max_dim, 0..=max_rank)
}

/// Pairs of shapes that broadcast together under numpy's rules: both are suffixes of a common
/// shape with some extents replaced by 1.
pub fn broadcast_pair(
    max_rank: usize,
    max_dim: usize,
) -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        shape(max_rank, max_dim),
        vec(any::<(bool, bool)>(), max_rank),
        0..=max_rank,
        0..=max_rank,
    )
        .prop_map(|(full, ones, drop_a, drop_b)| {
            let r = full.len();
            let make = |drop: usize, pick: &dyn Fn((bool, bool)) -> bool| -> Vec<usize> {
                let start = drop.min(r);
                (start..r)
                    .map(|d| {
                        if ones.get(d).copied().is_some_and(pick) {
                            1
                        } else {
                            full[d]
                        }
                    })
                    .collect()
            };
            (make(drop_a, &|(a, _)| a), make(drop_b, &|(_, b)| b))
        })
}

/// An `f64` tensor of the given shape with values in `range`.
pub fn tensor(shape: Vec<usize>, range: std::ops::Range<f64>) -> impl Strategy<Value = HostTensor> {
    let n: usize = shape.iter().product();
    vec(range, n)
        .prop_map(move |v| HostTensor::new(v, &shape).expect("invariant: n values for the shape"))
}

/// A shape (as [`shape`]) with an `f64` tensor of it, values in (-2, 2).
pub fn shaped_tensor(max_rank: usize, max_dim: usize) -> impl Strategy<Value = HostTensor> {
    shape(max_rank, max_dim).prop_flat_map(|s| tensor(s, -2.0..2.0))
}

/// One leaf choice for `cfg`.
pub fn leaf_choice(cfg: &GenConfig) -> impl Strategy<Value = LeafChoice> {
    (vec(any::<u8>(), 0..=cfg.max_rank), 0u8..4, any::<u64>())
        .prop_map(|(dims, kind, seed)| LeafChoice { dims, kind, seed })
}

/// One op choice.
pub fn op_choice() -> impl Strategy<Value = OpChoice> {
    (any::<u8>(), any::<u8>(), any::<u8>(), any::<[u8; 4]>())
        .prop_map(|(op, a, b, attrs)| OpChoice { op, a, b, attrs })
}

/// The choices a program is made of: one to three leaves and up to `max_ops` op choices.
pub fn choices(
    cfg: &GenConfig,
    max_ops: usize,
) -> impl Strategy<Value = (Vec<LeafChoice>, Vec<OpChoice>)> {
    (vec(leaf_choice(cfg), 1..=3), vec(op_choice(), 0..=max_ops))
}

/// Well-typed programs over `cfg.ops` with up to `max_ops` op statements (plus their leaves).
/// Leaf values are written in the program, so a printed failing case reproduces by itself.
pub fn program(cfg: GenConfig, max_ops: usize) -> impl Strategy<Value = Program> {
    choices(&cfg, max_ops).prop_map(move |(l, o)| generate::well_typed(&l, &o, &cfg))
}

/// Programs over the smooth ops ([`GenConfig::smooth`]): what [`Program::gradcheck`] can verify.
pub fn smooth_program(max_ops: usize) -> impl Strategy<Value = Program> {
    program(GenConfig::smooth(), max_ops)
}
