//! Every op of the format in bf16 and f16, forward and backward, against the op in f32 on the
//! same (rounded) inputs with its results rounded: within PyTorch's test tolerances for those
//! dtypes (bf16: atol 1e-2, rtol 1.6e-2; f16: atol 1e-3, rtol 1e-3). Programs of several ops
//! then run in both dtypes, as the random programs do in f32 and f64.

use arenagrad_graph::{DType, HostTensor};
use arenagrad_program::generate::{self, GenConfig, LeafChoice, OpChoice};
use arenagrad_program::{Expr, Program, RunOptions, RunResult};

/// PyTorch's `assert_close` tolerances for the dtype: (atol, rtol).
fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::BF16 => (1e-2, 1.6e-2),
        DType::F16 => (1e-3, 1e-3),
        _ => (0.0, 0.0),
    }
}

/// The program with every leaf's values rounded to `dtype`, so that the f32 run sees exactly
/// the inputs the 16-bit run does.
fn rounded(p: &Program, dtype: DType) -> Program {
    let mut q = Program::new();
    for s in p.statements() {
        let mut e = s.expr.clone();
        if let Expr::Leaf {
            values: Some(v), ..
        } = &mut e
        {
            let t = HostTensor::from_f64(v, &[v.len()], dtype).unwrap();
            *v = t.to_f64_vec();
        }
        q.push(&s.name, e).unwrap();
    }
    q
}

fn run(p: &Program, dtype: DType) -> RunResult {
    let opts = RunOptions {
        dtype,
        threads: Some(1),
        ..RunOptions::default()
    };
    p.run(&opts)
        .unwrap_or_else(|e| panic!("{dtype}:\n{p}\n{e}"))
}

/// Each of `got`'s elements against `want`'s rounded to `dtype`: NaN where it is NaN, an
/// infinity where it is, and within the tolerance elsewhere. The worst excess, if any.
fn compare(got: &HostTensor, want: &HostTensor, dtype: DType) -> Result<(), String> {
    assert_eq!(got.dtype(), dtype);
    let want = want.to_dtype(dtype).unwrap().to_f64_vec();
    let got = got.to_f64_vec();
    if got.len() != want.len() {
        return Err(format!("{} elements, want {}", got.len(), want.len()));
    }
    let (atol, rtol) = tolerance(dtype);
    for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        if !ok {
            return Err(format!("element {k}: {g} against {w}"));
        }
    }
    Ok(())
}

/// The 16-bit run of `p` against its f32 run on the same inputs; `Err` naming what differs.
fn agree(p: &Program, dtype: DType) -> Result<(), String> {
    let q = rounded(p, dtype);
    let (half, full) = (run(&q, dtype), run(&q, DType::F32));
    compare(&half.output.tensor, &full.output.tensor, dtype)
        .map_err(|e| format!("output {}: {e}", half.output.name))?;
    for (h, f) in half.grads.iter().zip(&full.grads) {
        compare(&h.tensor, &f.tensor, dtype).map_err(|e| format!("gradient of {}: {e}", h.name))?;
    }
    Ok(())
}

/// Leaves of a few shapes for the generator to pick operands from: two of rank 2, one of rank
/// 1, a scalar and one of rank 3 (a `[2, 3, 3]` image for the convolutions), inputs and a const; all
/// positive when `seed` is odd (for the ops defined on positive numbers).
fn leaves(seed: u64) -> Vec<LeafChoice> {
    let positive = if seed % 2 == 1 { 2 } else { 0 };
    [vec![3, 4], vec![3, 4], vec![4], vec![], vec![1, 2, 2]]
        .into_iter()
        .enumerate()
        .map(|(k, dims)| LeafChoice {
            dims,
            kind: positive | u8::from(k == 2),
            seed: seed * 31 + k as u64,
        })
        .collect()
}

/// The ops the generator does not draw (they take index-like values), written out.
const WRITTEN: &[(&str, &str)] = &[
    ("one_hot", "q = const 5 : 0 2 1 3 2\nt = one_hot q 4\n"),
    ("arange", "a = input 2 : 0.5 1\nt = arange a -1.5 3 0.75\n"),
];

#[test]
fn every_op_in_bf16_and_f16_agrees_with_f32_rounded() {
    let all = generate::all_ops();
    let mut seen = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for &op in all {
        let cfg = GenConfig {
            ops: vec![op],
            ..GenConfig::all()
        };
        for trial in 0..6u8 {
            let choice = OpChoice {
                op: 0,
                a: trial,
                b: trial.wrapping_mul(7).wrapping_add(1),
                attrs: [trial, trial.wrapping_mul(3), 1 + trial, 2],
            };
            let p = generate::well_typed(&leaves(u64::from(trial)), &[choice], &cfg);
            let Some(last) = p.statements().last() else {
                continue;
            };
            if last.expr.op_name() != op {
                continue;
            }
            seen.insert(op);
            for dtype in [DType::BF16, DType::F16] {
                if let Err(e) = agree(&p, dtype) {
                    failures.push(format!("{op} in {dtype}: {e}\n{p}"));
                }
            }
        }
    }
    for &(op, text) in WRITTEN {
        let p = Program::parse(text).unwrap();
        seen.insert(op);
        for dtype in [DType::BF16, DType::F16] {
            if let Err(e) = agree(&p, dtype) {
                failures.push(format!("{op} in {dtype}: {e}\n{p}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let missing: Vec<_> = all.iter().filter(|o| !seen.contains(*o)).collect();
    assert!(missing.is_empty(), "ops never generated: {missing:?}");
}

/// The comparison fails a 16-bit run that is off by more than the tolerance: a planted
/// result (the f32 run's output scaled by 1 + 3·rtol) is refused, one within it passes.
#[test]
fn the_comparison_refuses_a_result_outside_the_tolerance() {
    let want = HostTensor::from_f64(&[1.0, -2.5, 40.0], &[3], DType::F32).unwrap();
    for dtype in [DType::BF16, DType::F16] {
        let (_, rtol) = tolerance(dtype);
        let off = want
            .to_f64_vec()
            .iter()
            .map(|x| x * (1.0 + 3.0 * rtol))
            .collect::<Vec<_>>();
        let got = HostTensor::from_f64(&off, &[3], dtype).unwrap();
        assert!(compare(&got, &want, dtype).is_err(), "{dtype}");
        let same = want.to_dtype(dtype).unwrap();
        assert!(compare(&same, &want, dtype).is_ok(), "{dtype}");
        let nan = HostTensor::from_f64(&[f64::NAN, -2.5, 40.0], &[3], dtype).unwrap();
        assert!(compare(&nan, &want, dtype).is_err(), "{dtype}: NaN for 1");
    }
}

/// Programs of up to four ops from the smooth set (whose errors do not blow up at kinks), in
/// both 16-bit dtypes: every output and gradient is stored in the dtype and finite where the
/// f32 run's is, and the program's result stays within a few roundings of f32's.
#[test]
fn random_programs_run_in_16_bit_dtypes() {
    let cfg = GenConfig::smooth();
    let mut ran = 0;
    for seed in 0..40u64 {
        let ops: Vec<OpChoice> = (0..4u8)
            .map(|k| {
                let s = (seed as u8).wrapping_mul(13).wrapping_add(k * 29);
                OpChoice {
                    op: s.wrapping_mul(5),
                    a: s,
                    b: s.wrapping_add(k),
                    attrs: [s, k, s >> 2, 1],
                }
            })
            .collect();
        let p = generate::well_typed(&leaves(seed), &ops, &cfg);
        for dtype in [DType::BF16, DType::F16] {
            let q = rounded(&p, dtype);
            let (half, full) = (run(&q, dtype), run(&q, DType::F32));
            assert_eq!(half.dtype, dtype);
            let pairs = std::iter::once((&half.output, &full.output))
                .chain(half.grads.iter().zip(&full.grads));
            for (h, f) in pairs {
                assert_eq!(h.tensor.dtype(), dtype, "{}\n{p}", h.name);
                let (hv, fv) = (h.tensor.to_f64_vec(), f.tensor.to_f64_vec());
                for (a, b) in hv.iter().zip(&fv) {
                    if b.is_finite() && b.abs() < 1e3 {
                        let tol = 0.1 + 0.1 * b.abs();
                        assert!(
                            (a - b).abs() <= tol,
                            "{dtype} {}: {a} against f32's {b}\n{p}",
                            h.name
                        );
                    }
                }
            }
            ran += 1;
        }
    }
    assert_eq!(ran, 80);
}
