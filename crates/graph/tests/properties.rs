//! Property tests: random shapes and broadcast pairs for the binary ops, random chains of ops,
//! gradients against finite differences.

use arenagrad_graph::check::{check_fn, gradcheck, GradcheckOptions};
use arenagrad_graph::exec::Domain;
use arenagrad_graph::{BinaryOp, DType, Graph, HostTensor, UnaryOp};
use proptest::prelude::*;

fn cases() -> u32 {
    if cfg!(miri) {
        2
    } else {
        64
    }
}

/// A shape of rank 0..=3 with extents 1..=3, and a second shape that broadcasts with it (some
/// axes dropped from the front, some set to 1).
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(1usize..=3, 0..=3).prop_flat_map(|a| {
        let r = a.len();
        (Just(a), 0..=r, prop::collection::vec(any::<bool>(), r)).prop_map(|(a, drop, ones)| {
            let b: Vec<usize> = a
                .iter()
                .zip(&ones)
                .skip(drop)
                .map(|(&d, &one)| if one { 1 } else { d })
                .collect();
            (a, b)
        })
    })
}

fn values(n: usize, seed: u64, positive: bool) -> Vec<f64> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 11) as f64) / ((1u64 << 53) as f64);
            let x = 0.25 + u; // away from 0 and from ties
            if positive || (s >> 7) & 1 == 0 {
                x
            } else {
                -x
            }
        })
        .collect()
}

fn host(shape: &[usize], seed: u64, positive: bool) -> HostTensor {
    HostTensor::new(values(shape.iter().product(), seed, positive), shape).unwrap()
}

/// A public row of the binary op table.
fn public_binary_op() -> impl Strategy<Value = BinaryOp> {
    let public: Vec<BinaryOp> = BinaryOp::KINDS
        .iter()
        .copied()
        .filter(|op| op.is_public())
        .collect();
    prop::sample::select(public)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn binary_ops_broadcast_like_numpy((a, b) in broadcast_pair(), swap in any::<bool>(), seed in any::<u64>()) {
        let (a, b) = if swap { (b, a) } else { (a, b) };
        let g = Graph::new();
        let x = g.from_f64(&values(a.iter().product(), seed, false), &a, DType::F64).unwrap();
        let y = g.from_f64(&values(b.iter().product(), seed ^ 1, false), &b, DType::F64).unwrap();
        let z = x.add(y).unwrap();
        // Expected shape: numpy's rule, computed independently here.
        let r = a.len().max(b.len());
        let pad = |s: &[usize]| { let mut v = vec![1; r - s.len()]; v.extend_from_slice(s); v };
        let (pa, pb) = (pad(&a), pad(&b));
        let want: Vec<usize> = pa.iter().zip(&pb).map(|(&p, &q)| p.max(q)).collect();
        prop_assert_eq!(z.shape().to_vec(), want.clone());
        // Every element equals the sum of the elements it broadcasts from.
        let (xv, yv, zv) = (x.to_vec_f64().unwrap(), y.to_vec_f64().unwrap(), z.to_vec_f64().unwrap());
        let strides = |s: &[usize]| { let mut st = vec![0; r]; let mut acc = 1; for d in (0..r).rev() { st[d] = if s[d] == 1 { 0 } else { acc }; acc *= s[d]; } st };
        let (sa, sb) = (strides(&pa), strides(&pb));
        for (flat, zval) in zv.iter().enumerate() {
            let mut rem = flat; let (mut ia, mut ib) = (0, 0);
            for d in (0..r).rev() { let c = rem % want[d]; rem /= want[d]; ia += c * sa[d]; ib += c * sb[d]; }
            prop_assert!((zval - (xv[ia] + yv[ib])).abs() < 1e-12);
        }
    }

    /// Every public row of the binary table (a new row is drawn the moment it exists), each
    /// operand drawn inside the row's domain; comparisons pass through with zero gradients.
    #[test]
    fn binary_grads_match_finite_differences((a, b) in broadcast_pair(), op in public_binary_op(), seed in any::<u64>()) {
        let (da, db) = op.domain();
        let ins = [
            host(&a, seed, da == Domain::Positive),
            host(&b, seed.rotate_left(17), db == Domain::Positive),
        ];
        let r = gradcheck(check_fn(move |_, x| x[0].binary(op, x[1])), &ins, GradcheckOptions::default()).unwrap();
        prop_assert!(r.passed, "{} {:?} {:?}: {}", op.name(), a, b, r);
    }

    #[test]
    fn random_chains_match_finite_differences(chain in prop::collection::vec(0usize..10, 1..12), seed in any::<u64>()) {
        let shape = [2usize, 3];
        let ins = [host(&shape, seed, false), host(&shape, seed ^ 99, false)];
        let steps = chain.clone();
        let f = check_fn(move |_, x| {
            let mut h = x[0];
            for &s in &steps {
                h = match s {
                    0 => h.tanh()?,
                    1 => h.sigmoid()?,
                    2 => h.mul(x[1])?,
                    3 => h.add(x[1].sin()?)?,
                    4 => h.scale(0.7)?.shift(0.1)?,
                    5 => h.softmax(1)?,
                    6 => h.matmul(x[1].t()?)?.matmul(x[1])?.scale(0.2)?,
                    7 => h.sum_axes(&[0], true)?.broadcast_to(&[2, 3])?,
                    8 => h.unary(UnaryOp::Gelu)?,
                    _ => h.t()?.reshape(&[2, 3])?,
                };
            }
            Ok(h)
        });
        let r = gradcheck(f, &ins, GradcheckOptions::default()).unwrap();
        prop_assert!(r.passed, "{:?}: {}", chain, r);
    }
}
