//! The reductions and scans attention models use, against values PyTorch 2.15 printed for the
//! same inputs (float64): `min`, `max_dim`/`min_dim` with their indices, `argmax`/`argmin`, the
//! vector norms with their gradients at zero and at ties, `cumsum`, strided slicing; and each
//! checked against finite differences in f64, also with `create_graph`.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_graph::{DType, Graph, GraphError, HostTensor, Tensor};

const NAN: f64 = f64::NAN;

fn same(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

/// d out / d x, through a plain backward.
fn grad_of(out: Tensor<'_>, x: Tensor<'_>) -> Vec<f64> {
    out.backward().unwrap();
    x.grad().unwrap().unwrap().to_vec_f64().unwrap()
}

#[test]
fn max_and_min_along_an_axis_give_pytorchs_values_and_indices() {
    let g = Graph::new();
    #[rustfmt::skip]
    let v = [
        1.0, 3.0, 3.0, -2.0,
        NAN, 0.0, 5.0, NAN,
        -1.0, -4.0, -4.0, 2.0,
    ];
    for dtype in [DType::F32, DType::F64] {
        let x = g.leaf(&v, &[3, 4], dtype).unwrap();
        let (m, i) = x.max_dim(1, false).unwrap();
        assert_eq!(m.shape().as_slice(), &[3]);
        same(&m.to_vec_f64().unwrap(), &[3.0, NAN, 2.0]);
        assert_eq!(i, [1, 0, 3], "first maximum on ties, the first NaN");
        let (m, i) = x.min_dim(1, true).unwrap();
        assert_eq!(m.shape().as_slice(), &[3, 1]);
        same(&m.to_vec_f64().unwrap(), &[-2.0, NAN, -4.0]);
        assert_eq!(i, [3, 0, 1]);
        let (m, i) = x.max_dim(0, false).unwrap();
        same(&m.to_vec_f64().unwrap(), &[NAN, 3.0, 5.0, NAN]);
        assert_eq!(i, [1, 0, 1, 1]);
        assert_eq!(x.argmax().unwrap(), 4);
        assert_eq!(x.argmin().unwrap(), 4);
        assert_eq!(x.argmax_axis(1).unwrap(), [1, 0, 3]);
        assert_eq!(x.argmin_axis(0).unwrap(), [1, 2, 2, 1]);
        assert_eq!(x.argmin_axis(-1).unwrap(), [3, 0, 1]);
    }
}

#[test]
fn max_dim_sends_the_gradient_to_its_index_and_min_splits_ties() {
    let g = Graph::new();
    let y = g
        .leaf(
            &[1.0, 3.0, 3.0, -2.0, 0.0, -4.0, -4.0, 2.0],
            &[2, 4],
            DType::F64,
        )
        .unwrap();
    let (m, _) = y.max_dim(1, false).unwrap();
    assert_eq!(
        grad_of(m.sum().unwrap(), y),
        [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    );
    let y = y.detach().unwrap().set_requires_grad(true).unwrap();
    assert_eq!(
        grad_of(y.min().unwrap(), y),
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0]
    );
    assert_eq!(y.min().unwrap().item().unwrap(), -4.0);
    same(
        &y.min_axes(&[0], false).unwrap().to_vec_f64().unwrap(),
        &[0.0, -4.0, -4.0, -2.0],
    );
}

#[test]
fn extremes_of_an_empty_axis_are_errors_naming_the_op() {
    let g = Graph::new();
    let e = g.zeros(&[2, 0], DType::F32).unwrap();
    for (want, r) in [
        ("max_dim", e.max_dim(1, false).map(|_| ())),
        ("min_dim", e.min_dim(-1, false).map(|_| ())),
        ("argmax", e.argmax_axis(1).map(|_| ())),
        ("min", e.min().map(|_| ())),
    ] {
        match r {
            Err(GraphError::BadArgument { op, .. }) => assert_eq!(op, want),
            other => panic!("{want}: {other:?}"),
        }
    }
    assert!(matches!(
        e.max_dim(2, false),
        Err(GraphError::BadAxis { op: "max_dim", .. })
    ));
}

#[test]
fn norms_match_pytorch_with_zero_rows_and_ties() {
    let g = Graph::new();
    let v = [3.0, -4.0, 0.0, 0.0, 0.0, 0.0, -2.0, 2.0, 1.0];
    let w = g.from_f64(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    // torch.linalg.vector_norm(z, ord=p, dim=1), and z.grad of (norm · [1, 2, 3]).sum().
    #[rustfmt::skip]
    let cases: [(f64, [f64; 3], [f64; 9]); 4] = [
        (1.0, [7.0, 0.0, 5.0], [1.0, -1.0, 0.0, 0.0, 0.0, 0.0, -3.0, 3.0, 3.0]),
        (2.0, [5.0, 0.0, 3.0], [0.6, -0.8, 0.0, 0.0, 0.0, 0.0, -2.0, 2.0, 1.0]),
        (f64::INFINITY, [4.0, 0.0, 2.0], [0.0, -1.0, 0.0, 0.0, 0.0, 0.0, -1.5, 1.5, 0.0]),
        (3.0, [4.497_941_445_275_415, 0.0, 2.571_281_590_658_235], [
            0.444_851_351_730_535_6, -0.790_846_847_520_952_1, 0.0, 0.0, 0.0, 0.0,
            -1.815_022_299_288_166_4, 1.815_022_299_288_166_4, 0.453_755_574_822_041_6,
        ]),
    ];
    for (p, norm, grad) in cases {
        let z = g.leaf(&v, &[3, 3], DType::F64).unwrap();
        let n = z.norm(p, &[1], false).unwrap();
        same(&n.to_vec_f64().unwrap(), &norm);
        same(&grad_of(n.mul(w).unwrap().sum().unwrap(), z), &grad);
    }
    let z = g.leaf(&v, &[3, 3], DType::F64).unwrap();
    let n = z.norm(2.0, &[], false).unwrap();
    assert_eq!(n.shape().len(), 0);
    same(&[n.item().unwrap()], &[5.830_951_894_845_301]);
    assert_eq!(z.norm(2.0, &[1], true).unwrap().shape().as_slice(), &[3, 1]);
    for bad in [0.0, -1.0, NAN] {
        assert!(matches!(
            z.norm(bad, &[], false),
            Err(GraphError::BadArgument { op: "norm", .. })
        ));
    }
}

#[test]
fn norms_below_one_give_a_zero_gradient_at_a_zero_entry() {
    // torch.linalg.vector_norm(x, ord=0.5, dim=1) of [[4, 0, -1], [0, 0, 0]]: [9, 0]; its
    // gradient |x|^(p−1)·sign(x)·n^(1−p) = 3/√|x|·sign(x) off zero, and 0 at a zero entry
    // (|0|^(−0.5) = inf times sign(0) = 0 was NaN here).
    let v = [4.0, 0.0, -1.0, 0.0, 0.0, 0.0];
    let want = [1.5, 0.0, -3.0, 0.0, 0.0, 0.0];
    for dtype in [DType::F64, DType::F32] {
        for create in [false, true] {
            let g = Graph::new();
            let x = g.leaf(&v, &[2, 3], dtype).unwrap();
            let n = x.norm(0.5, &[1], false).unwrap();
            same(&n.to_vec_f64().unwrap(), &[9.0, 0.0]);
            let gx = if create {
                let opts = arenagrad_graph::BackwardOptions {
                    create_graph: true,
                    ..Default::default()
                };
                arenagrad_graph::grad(n.sum().unwrap(), &[x], opts).unwrap()[0]
                    .unwrap()
                    .to_vec_f64()
                    .unwrap()
            } else {
                grad_of(n.sum().unwrap(), x)
            };
            same(&gx, &want);
        }
    }
    // The second derivative exists off zero and stays finite at a zero entry.
    let g = Graph::new();
    let x = g.leaf(&v[..3], &[3], DType::F64).unwrap();
    let opts = arenagrad_graph::BackwardOptions {
        create_graph: true,
        ..Default::default()
    };
    let gx =
        arenagrad_graph::grad(x.norm(0.5, &[], false).unwrap(), &[x], opts).unwrap()[0].unwrap();
    let ggx = grad_of(gx.sum().unwrap(), x);
    assert!(ggx.iter().all(|v| v.is_finite()), "{ggx:?}");
    assert_eq!(ggx[1], 0.0);
}

#[test]
fn norm_gradients_pass_finite_differences_and_second_order() {
    let opts = GradcheckOptions::default();
    let x = [HostTensor::from_f64(
        &[0.3, -1.2, 0.8, 2.1, -0.4, 1.7, -0.9, 0.5],
        &[2, 4],
        DType::F64,
    )
    .unwrap()];
    for p in [1.0, 2.0, f64::INFINITY, 3.0, 1.5] {
        let f = check_fn(move |_, x| x[0].norm(p, &[1], false)?.mul(x[0].sum_axes(&[1], false)?));
        let r = gradcheck(f, &x, opts).unwrap();
        assert!(r.passed, "norm p = {p}: {r}");
        if p.is_finite() && p != 1.0 {
            let r = gradgradcheck(f, &x, opts).unwrap();
            assert!(r.passed, "norm p = {p}, second order: {r}");
        }
    }
}

#[test]
fn cumsum_matches_pytorch_and_its_gradient_runs_from_the_end() {
    let g = Graph::new();
    for dtype in [DType::F32, DType::F64] {
        let c = g
            .leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], dtype)
            .unwrap();
        same(
            &c.cumsum(1).unwrap().to_vec_f64().unwrap(),
            &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0],
        );
        same(
            &c.cumsum(0).unwrap().to_vec_f64().unwrap(),
            &[1.0, 2.0, 3.0, 5.0, 7.0, 9.0],
        );
        let w = g.from_f64(&[1.0, 2.0, 3.0], &[1, 3], dtype).unwrap();
        let out = c.cumsum(-1).unwrap().mul(w).unwrap().sum().unwrap();
        same(&grad_of(out, c), &[6.0, 5.0, 3.0, 6.0, 5.0, 3.0]);
    }
    let opts = GradcheckOptions::default();
    let x = [HostTensor::from_f64(&[0.3, -1.2, 0.8, 2.1, -0.4, 1.7], &[3, 2], DType::F64).unwrap()];
    for axis in [0, 1] {
        let f = check_fn(move |_, x| x[0].cumsum(axis)?.mul(x[0])?.tanh());
        let r = gradcheck(f, &x, opts).unwrap();
        assert!(r.passed, "cumsum axis {axis}: {r}");
        let r = gradgradcheck(f, &x, opts).unwrap();
        assert!(r.passed, "cumsum axis {axis}, second order: {r}");
    }
    let e = g.zeros(&[0, 3], DType::F32).unwrap();
    assert_eq!(e.cumsum(0).unwrap().shape().as_slice(), &[0, 3]);
    assert!(matches!(
        e.cumsum(2),
        Err(GraphError::BadAxis { op: "cumsum", .. })
    ));
}

#[test]
fn strided_slices_take_every_step_th_entry() {
    let g = Graph::new();
    let a = g
        .leaf(
            &(0..10).map(f64::from).collect::<Vec<_>>(),
            &[10],
            DType::F64,
        )
        .unwrap();
    // a[1:8:3] and a[0:10:4] in PyTorch.
    assert_eq!(
        a.slice_step(0, 1, 8, 3).unwrap().to_vec_f64().unwrap(),
        [1.0, 4.0, 7.0]
    );
    assert_eq!(
        a.slice_step(0, 0, 10, 4).unwrap().to_vec_f64().unwrap(),
        [0.0, 4.0, 8.0]
    );
    assert_eq!(a.slice_step(0, 5, 5, 2).unwrap().shape().as_slice(), &[0]);
    assert_eq!(
        grad_of(a.slice_step(-1, 1, 8, 3).unwrap().sum().unwrap(), a),
        [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    );
    assert!(matches!(
        a.slice_step(0, 0, 4, 0),
        Err(GraphError::BadArgument {
            op: "slice_step",
            ..
        })
    ));
    assert!(matches!(
        a.slice_step(0, 2, 11, 2),
        Err(GraphError::BadRange {
            op: "slice_step",
            ..
        })
    ));
}
