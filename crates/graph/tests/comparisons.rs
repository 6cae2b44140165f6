//! Masks and the tensors attention is built from, against PyTorch's conventions: comparisons
//! (`eq`, `ne`, `lt`, `le`, `gt`, `ge`) giving 0/1 masks that never require grad, NaN comparing
//! false (but for `ne`), broadcasting; `masked_fill` passing the gradient where the mask is zero,
//! also with `-inf` under a softmax; `tril`/`triu`, `arange` and `one_hot`.

use arenagrad_graph::check::{check_fn, gradcheck, GradcheckOptions};
use arenagrad_graph::{DType, Graph, GraphError, HostTensor, Result, Tensor};

const NAN: f64 = f64::NAN;

type Cmp = for<'g> fn(Tensor<'g>, Tensor<'g>) -> Result<Tensor<'g>>;

#[test]
fn comparisons_follow_ieee_with_nan_comparing_false() {
    let g = Graph::new();
    let a = [1.0, NAN, 2.0, NAN, -0.0, 3.0];
    let b = [1.0, 1.0, NAN, NAN, 0.0, 2.0];
    // PyTorch 2.15 (torch.eq/ne/lt/le/gt/ge on these float64 tensors).
    let cases: [(&str, Cmp, [f64; 6]); 6] = [
        ("eq", |a, b| a.eq(b), [1., 0., 0., 0., 1., 0.]),
        ("ne", |a, b| a.ne(b), [0., 1., 1., 1., 0., 1.]),
        ("lt", |a, b| a.lt(b), [0., 0., 0., 0., 0., 0.]),
        ("le", |a, b| a.le(b), [1., 0., 0., 0., 1., 0.]),
        ("gt", |a, b| a.gt(b), [0., 0., 0., 0., 0., 1.]),
        ("ge", |a, b| a.ge(b), [1., 0., 0., 0., 1., 1.]),
    ];
    for dtype in [DType::F32, DType::F64] {
        let x = g.leaf(&a, &[6], dtype).unwrap();
        let y = g.leaf(&b, &[6], dtype).unwrap();
        for (name, f, want) in &cases {
            let m = f(x, y).unwrap();
            assert_eq!(m.to_vec_f64().unwrap(), want, "{name} {dtype:?}");
            assert!(!m.requires_grad(), "{name}: a mask never requires grad");
        }
    }
}

#[test]
fn comparisons_broadcast_and_refuse_mismatched_shapes() {
    let g = Graph::new();
    let col = g.from_f64(&[1.0, 2.0], &[2, 1], DType::F64).unwrap();
    let row = g.from_f64(&[0.0, 1.0, 2.0], &[3], DType::F64).unwrap();
    let m = col.gt(row).unwrap();
    assert_eq!(m.shape().as_slice(), &[2, 3]);
    assert_eq!(m.to_vec_f64().unwrap(), [1., 0., 0., 1., 1., 0.]);
    let bad = g.from_f64(&[0.0; 4], &[4], DType::F64).unwrap();
    match row.lt(bad) {
        Err(GraphError::ShapeMismatch { op, lhs, rhs }) => {
            assert_eq!((op, lhs, rhs), ("lt", vec![3], vec![4]));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_mask_stops_the_gradient_and_the_other_factor_carries_it() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, -2.0, 3.0], &[3], DType::F64).unwrap();
    let zero = g.scalar(0.0, DType::F64).unwrap();
    // relu by hand: x · (x > 0); d/dx = (x > 0), nothing through the mask.
    x.mul(x.gt(zero).unwrap())
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [1.0, 0.0, 1.0]
    );
}

#[test]
fn masked_fill_values_and_gradient() {
    let g = Graph::new();
    let x = g
        .leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64)
        .unwrap();
    // A [3] mask broadcast over the rows.
    let mask = g.from_f64(&[0.0, 1.0, 0.0], &[3], DType::F64).unwrap();
    let y = x.masked_fill(mask, -7.5).unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), [1., -7.5, 3., 4., -7.5, 6.]);
    y.sum().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [1., 0., 1., 1., 0., 1.]
    );
    // Against finite differences, with a weighting so the check sees each element.
    let report = gradcheck(
        check_fn(|g, xs| {
            let m = g.from_f64(&[1.0, 0.0, 0.0, 1.0], &[2, 2], DType::F64)?;
            let w = g.from_f64(&[0.5, -1.0, 2.0, 3.0], &[2, 2], DType::F64)?;
            xs[0].masked_fill(m, 2.0)?.mul(xs[0])?.mul(w)?.sum()
        }),
        &[HostTensor::from_f64(&[0.3, -0.7, 1.1, 0.4], &[2, 2], DType::F64).unwrap()],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(report.passed, "{report}");
}

#[test]
fn masked_fill_with_minus_infinity_under_softmax_is_a_causal_mask() {
    let g = Graph::new();
    let s = g.leaf(&[0.5, 1.0, -1.0, 2.0], &[2, 2], DType::F64).unwrap();
    // Row 0 may not see column 1.
    let future = g
        .from_f64(&[0.0, 1.0, 0.0, 0.0], &[2, 2], DType::F64)
        .unwrap();
    let p = s
        .masked_fill(future, f64::NEG_INFINITY)
        .unwrap()
        .softmax(1)
        .unwrap();
    let v = p.to_vec_f64().unwrap();
    assert_eq!(&v[..2], &[1.0, 0.0]);
    let e = (-1.0f64).exp() / ((-1.0f64).exp() + 2.0f64.exp());
    assert!(
        (v[2] - e).abs() < 1e-15 && (v[3] - (1.0 - e)).abs() < 1e-15,
        "{v:?}"
    );
    // The gradient is finite, and zero at the masked entry and in the fully decided row.
    let w = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)
        .unwrap();
    p.mul(w).unwrap().sum().unwrap().backward().unwrap();
    let gs = s.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
    assert_eq!(&gs[..2], &[0.0, 0.0]);
    // Row 1: softmax's Jacobian by hand, p_j (w_j − Σ p w).
    let mean = e * 3.0 + (1.0 - e) * 4.0;
    assert!((gs[2] - e * (3.0 - mean)).abs() < 1e-14, "{gs:?}");
    assert!((gs[3] - (1.0 - e) * (4.0 - mean)).abs() < 1e-14, "{gs:?}");
}

#[test]
fn masked_fill_refuses_a_mask_that_would_grow_the_tensor() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let wide = g.from_f64(&[0.0; 6], &[3, 2], DType::F64).unwrap();
    match x.masked_fill(wide, 0.0) {
        Err(GraphError::ShapeMismatch { op, lhs, rhs }) => {
            assert_eq!((op, lhs, rhs), ("masked_fill", vec![2], vec![3, 2]));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tril_and_triu_zero_exactly_and_mask_the_gradient() {
    let g = Graph::new();
    let n = f64::NAN;
    #[rustfmt::skip]
    let m = [
        1.0, n,   3.0, 4.0,
        5.0, 6.0, n,   8.0,
        9.0, 10., 11., f64::INFINITY,
    ];
    let x = g.leaf(&m, &[3, 4], DType::F64).unwrap();
    // torch.tril / torch.triu of the same matrix.
    #[rustfmt::skip]
    let cases: [(&str, isize, [f64; 12]); 4] = [
        ("tril", 0, [1., 0., 0., 0., 5., 6., 0., 0., 9., 10., 11., 0.]),
        ("tril", -1, [0., 0., 0., 0., 5., 0., 0., 0., 9., 10., 0., 0.]),
        ("triu", 1, [0., n, 3., 4., 0., 0., n, 8., 0., 0., 0., f64::INFINITY]),
        ("triu", 0, [1., n, 3., 4., 0., 6., n, 8., 0., 0., 11., f64::INFINITY]),
    ];
    for (op, k, want) in cases {
        let y = if op == "tril" { x.tril(k) } else { x.triu(k) }.unwrap();
        let got = y.to_vec_f64().unwrap();
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
        assert!(same, "{op}({k}): {got:?} vs {want:?}");
    }
    x.tril(0).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [1., 0., 0., 0., 1., 1., 0., 0., 1., 1., 1., 0.]
    );
    // Batched: the last two dimensions.
    let b = g.from_f64(&[1.0; 8], &[2, 2, 2], DType::F32).unwrap();
    assert_eq!(
        b.triu(0).unwrap().to_vec_f64().unwrap(),
        [1., 1., 0., 1., 1., 1., 0., 1.]
    );
    let v = g.from_f64(&[1.0; 3], &[3], DType::F32).unwrap();
    assert!(matches!(
        v.tril(0),
        Err(GraphError::BadArgument { op: "tril", .. })
    ));
}

#[test]
fn arange_counts_as_pytorch_and_refuses_bad_steps() {
    let g = Graph::new();
    let v = |t: Tensor<'_>| t.to_vec_f64().unwrap();
    assert_eq!(
        v(g.arange(0.0, 5.0, 1.0, DType::F64).unwrap()),
        [0., 1., 2., 3., 4.]
    );
    // ⌈(1 − 0) / 0.3⌉ = 4 values, as torch.arange(0, 1, 0.3).
    let a = v(g.arange(0.0, 1.0, 0.3, DType::F64).unwrap());
    assert_eq!(a.len(), 4);
    assert!((a[3] - 0.9).abs() < 1e-15);
    assert_eq!(
        v(g.arange(5.0, 0.0, -2.0, DType::F32).unwrap()),
        [5., 3., 1.]
    );
    assert!(v(g.arange(2.0, 2.0, 1.0, DType::F64).unwrap()).is_empty());
    for (start, end, step) in [(0.0, 1.0, 0.0), (0.0, 1.0, -1.0), (0.0, f64::NAN, 1.0)] {
        assert!(
            matches!(
                g.arange(start, end, step, DType::F64),
                Err(GraphError::BadArgument { op: "arange", .. })
            ),
            "{start} {end} {step}"
        );
    }
}

#[test]
fn one_hot_rows_and_an_out_of_range_label() {
    let g = Graph::new();
    let t = g.one_hot(&[2, 0, 1], 3, DType::F32).unwrap();
    assert_eq!(t.shape().as_slice(), &[3, 3]);
    assert_eq!(
        t.to_vec_f64().unwrap(),
        [0., 0., 1., 1., 0., 0., 0., 1., 0.]
    );
    match g.one_hot(&[0, 3], 3, DType::F32) {
        Err(GraphError::IndexOutOfRange { op, index, .. }) => {
            assert_eq!((op, index), ("one_hot", 3))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn clamp_follows_pytorch_at_the_bounds_and_at_nan() {
    let g = Graph::new();
    let x = g
        .leaf(&[-2.0, -1.0, 0.0, 1.0, 2.0, NAN], &[6], DType::F64)
        .unwrap();
    // torch.clamp(x, -1, 1) and its gradient: the bounds pass it, NaN does not.
    let y = x.clamp(Some(-1.0), Some(1.0)).unwrap();
    let v = y.to_vec_f64().unwrap();
    assert_eq!(&v[..5], &[-1.0, -1.0, 0.0, 1.0, 1.0]);
    assert!(v[5].is_nan());
    y.sum().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [0., 1., 1., 1., 0., 0.]
    );
    let lo = x.clamp(Some(0.5), None).unwrap().to_vec_f64().unwrap();
    assert_eq!(&lo[..5], &[0.5, 0.5, 0.5, 1.0, 2.0]);
    let hi = x.clamp(None, Some(0.0)).unwrap().to_vec_f64().unwrap();
    assert_eq!(&hi[..5], &[-2.0, -1.0, 0.0, 0.0, 0.0]);
    // min > max: everything is max, and no gradient passes.
    let g2 = Graph::new();
    let z = g2.leaf(&[-3.0, 0.0, 3.0], &[3], DType::F32).unwrap();
    let w = z.clamp(Some(2.0), Some(1.0)).unwrap();
    assert_eq!(w.to_vec_f64().unwrap(), [1.0, 1.0, 1.0]);
    w.sum().unwrap().backward().unwrap();
    assert_eq!(
        z.grad().unwrap().unwrap().to_vec::<f32>().unwrap(),
        [0.0; 3]
    );
    // Away from the bounds, against finite differences.
    let report = gradcheck(
        check_fn(|g, xs| {
            let w = g.from_f64(&[0.5, -1.0, 2.0, 3.0], &[4], DType::F64)?;
            xs[0]
                .clamp(Some(-0.5), Some(0.8))?
                .mul(xs[0])?
                .mul(w)?
                .sum()
        }),
        &[HostTensor::from_f64(&[-0.9, -0.2, 0.3, 1.4], &[4], DType::F64).unwrap()],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(report.passed, "{report}");
}

#[test]
fn logsumexp_is_stable_and_its_gradient_is_the_softmax() {
    let g = Graph::new();
    let x = g
        .leaf(&[1000.0, 1000.0, -1.0, 2.0], &[2, 2], DType::F64)
        .unwrap();
    let y = x.logsumexp(&[1], false).unwrap();
    assert_eq!(y.shape().as_slice(), &[2]);
    let v = y.to_vec_f64().unwrap();
    assert!((v[0] - (1000.0 + 2f64.ln())).abs() < 1e-12, "{v:?}");
    let want1 = ((-1f64).exp() + 2f64.exp()).ln();
    assert!((v[1] - want1).abs() < 1e-14, "{v:?}");
    assert_eq!(x.logsumexp(&[1], true).unwrap().shape().as_slice(), &[2, 1]);
    assert_eq!(
        x.logsumexp(&[], false).unwrap().shape().as_slice(),
        &[] as &[usize]
    );
    // Infinite and NaN slices, as torch.logsumexp.
    let s = g
        .from_f64(
            &[
                f64::NEG_INFINITY,
                f64::NEG_INFINITY,
                f64::INFINITY,
                1.0,
                NAN,
                1.0,
            ],
            &[3, 2],
            DType::F64,
        )
        .unwrap()
        .logsumexp(&[1], false)
        .unwrap()
        .to_vec_f64()
        .unwrap();
    assert_eq!(&s[..2], &[f64::NEG_INFINITY, f64::INFINITY]);
    assert!(s[2].is_nan());
    let report = gradcheck(
        check_fn(|g, xs| {
            let w = g.from_f64(&[0.5, -1.0, 2.0], &[3], DType::F64)?;
            xs[0].logsumexp(&[0], false)?.mul(w)?.sum()
        }),
        &[HostTensor::from_f64(&[0.3, -0.7, 1.1, 0.4, 2.0, -1.5], &[2, 3], DType::F64).unwrap()],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(report.passed, "{report}");
}

#[test]
fn stack_split_chunk_and_unbind_follow_pytorch() {
    let g = Graph::new();
    let a = g.leaf(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let b = g.leaf(&[4.0, 5.0, 6.0], &[3], DType::F64).unwrap();
    let s0 = g.stack(&[a, b], 0).unwrap();
    assert_eq!(s0.shape().as_slice(), &[2, 3]);
    assert_eq!(s0.to_vec_f64().unwrap(), [1., 2., 3., 4., 5., 6.]);
    let s1 = g.stack(&[a, b], -1).unwrap();
    assert_eq!(s1.shape().as_slice(), &[3, 2]);
    assert_eq!(s1.to_vec_f64().unwrap(), [1., 4., 2., 5., 3., 6.]);
    let w = g
        .from_f64(&[1., 2., 3., 4., 5., 6.], &[3, 2], DType::F64)
        .unwrap();
    s1.mul(w).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(
        a.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [1., 3., 5.]
    );
    assert_eq!(
        b.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [2., 4., 6.]
    );
    let short = g.from_f64(&[1.0, 2.0], &[2], DType::F64).unwrap();
    assert!(matches!(
        g.stack(&[a, short], 0),
        Err(GraphError::ShapeMismatch { op: "stack", .. })
    ));
    assert!(matches!(
        g.stack(&[a], 2),
        Err(GraphError::BadAxis { op: "stack", .. })
    ));

    let x = g
        .from_f64(
            &(0..10).map(f64::from).collect::<Vec<_>>(),
            &[2, 5],
            DType::F64,
        )
        .unwrap();
    let sizes = |ts: Vec<Tensor<'_>>| ts.iter().map(|t| t.shape()[1]).collect::<Vec<_>>();
    // torch.chunk(x, 3, 1) → 2, 2, 1; torch.chunk(x, 4, 1) → 2, 2, 1 (only three pieces).
    assert_eq!(sizes(x.chunk(3, 1).unwrap()), [2, 2, 1]);
    assert_eq!(sizes(x.chunk(4, 1).unwrap()), [2, 2, 1]);
    assert_eq!(sizes(x.chunk(5, 1).unwrap()), [1, 1, 1, 1, 1]);
    let parts = x.split(&[1, 4], -1).unwrap();
    assert_eq!(parts[0].to_vec_f64().unwrap(), [0., 5.]);
    assert_eq!(
        parts[1].to_vec_f64().unwrap(),
        [1., 2., 3., 4., 6., 7., 8., 9.]
    );
    assert!(matches!(
        x.split(&[2, 2], 1),
        Err(GraphError::BadArgument { op: "split", .. })
    ));
    assert!(matches!(
        x.chunk(0, 1),
        Err(GraphError::BadArgument { op: "chunk", .. })
    ));
    let empty = g.from_f64(&[], &[0, 3], DType::F64).unwrap();
    assert_eq!(empty.chunk(3, 0).unwrap().len(), 3);

    let rows = x.unbind(0).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].shape().as_slice(), &[5]);
    assert_eq!(rows[1].to_vec_f64().unwrap(), [5., 6., 7., 8., 9.]);
    // Gradients of split pieces land in their places.
    let y = g.leaf(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F64).unwrap();
    let p = y.split(&[3, 1], 0).unwrap();
    p[0].scale(2.0)
        .unwrap()
        .sum()
        .unwrap()
        .add(p[1].scale(-1.0).unwrap().sum().unwrap())
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(
        y.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        [2., 2., 2., -1.]
    );
}

#[test]
fn chunking_an_empty_axis_into_too_many_pieces_is_an_error_not_a_panic() {
    // Found by the build_run fuzzer: n empty pieces were a `vec![0; n]`, which panics on a
    // capacity overflow for a count like usize::MAX.
    let g = Graph::new();
    let e = g.zeros(&[2, 0], DType::F32).unwrap();
    assert!(matches!(
        e.chunk(usize::MAX, 1),
        Err(GraphError::TooLarge { op: "chunk", .. })
    ));
    assert_eq!(e.chunk(3, 1).unwrap().len(), 3);
}
