//! index_add, scatter_add and scatter_reduce (sum, mean) against PyTorch: values and both
//! operands' gradients of `Σ w·y` (w = [[1, 2], [3, 4], [5, 6]]), printed by PyTorch 2 in
//! float64 for the inputs below, and finite differences to second order.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_graph::{DType, Graph, GraphError, HostTensor, ScatterReduce, Tensor};

const SELF: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
const SRC: [f64; 8] = [0.5, -1.0, 2.0, 3.0, 4.0, -2.0, 1.0, 1.0];
const W: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
/// `torch.tensor([[2, 0], [0, 0], [2, 1], [2, 2]])`
const IDX2: [i64; 8] = [2, 0, 0, 0, 2, 1, 2, 2];

fn close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() <= 1e-12, "{what}: {got:?} vs {want:?}");
    }
}

/// y = f(self, src), then the gradients of Σ w·y, compared with PyTorch's.
fn check(
    what: &str,
    f: impl for<'g> Fn(&'g Graph, Tensor<'g>, Tensor<'g>) -> Tensor<'g>,
    want: [&[f64]; 3],
) {
    let g = Graph::new();
    let s = g.leaf(&SELF, &[3, 2], DType::F64).unwrap();
    let src = g.leaf(&SRC, &[4, 2], DType::F64).unwrap();
    let y = f(&g, s, src);
    close(what, &y.to_vec::<f64>().unwrap(), want[0]);
    let w = g.from_f64(&W, &[3, 2], DType::F64).unwrap();
    y.mul(w).unwrap().sum().unwrap().backward().unwrap();
    let grad = |t: Tensor<'_>| t.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
    close(&format!("{what} d/dself"), &grad(s), want[1]);
    close(&format!("{what} d/dsrc"), &grad(src), want[2]);
}

#[test]
fn index_add_matches_pytorch() {
    // s.index_add(0, torch.tensor([2, 0, 2, 2]), src)
    check(
        "index_add",
        |g, s, src| {
            let i = g.from_slice(&[2i64, 0, 2, 2], &[4]).unwrap();
            s.index_add(0, i, src).unwrap()
        },
        [
            &[3.0, 5.0, 3.0, 4.0, 10.5, 4.0],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            &[5.0, 6.0, 1.0, 2.0, 5.0, 6.0, 5.0, 6.0],
        ],
    );
}

#[test]
fn scatter_add_matches_pytorch() {
    check(
        "scatter_add",
        |g, s, src| {
            let i = g.from_slice(&IDX2, &[4, 2]).unwrap();
            s.scatter_add(0, i, src).unwrap()
        },
        [
            &[3.0, 4.0, 3.0, 2.0, 10.5, 7.0],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            &[5.0, 2.0, 1.0, 2.0, 5.0, 4.0, 5.0, 6.0],
        ],
    );
}

#[test]
fn scatter_reduce_sum_and_mean_match_pytorch() {
    let third = 1.0 / 3.0;
    let cases: [(ScatterReduce, bool, [&[f64]; 3]); 3] = [
        (
            ScatterReduce::Mean,
            true,
            [
                &[1.5, 1.0 + third, 3.0, 1.0, 2.625, 3.5],
                &[0.5, 2.0 * third, 3.0, 2.0, 1.25, 3.0],
                &[1.25, 2.0 * third, 0.5, 2.0 * third, 1.25, 2.0, 1.25, 3.0],
            ],
        ),
        (
            ScatterReduce::Mean,
            false,
            [
                &[2.0, 1.0, 3.0, -2.0, 1.5 + third, 1.0],
                &[0.0, 0.0, 3.0, 0.0, 0.0, 0.0],
                &[
                    5.0 * third,
                    1.0,
                    1.0,
                    1.0,
                    5.0 * third,
                    4.0,
                    5.0 * third,
                    6.0,
                ],
            ],
        ),
        (
            ScatterReduce::Sum,
            false,
            [
                &[2.0, 2.0, 3.0, -2.0, 5.5, 1.0],
                &[0.0, 0.0, 3.0, 0.0, 0.0, 0.0],
                &[5.0, 2.0, 1.0, 2.0, 5.0, 4.0, 5.0, 6.0],
            ],
        ),
    ];
    for (reduce, include_self, want) in cases {
        check(
            &format!("scatter_reduce {reduce:?} include_self={include_self}"),
            |g, s, src| {
                let i = g.from_slice(&IDX2, &[4, 2]).unwrap();
                s.scatter_reduce(0, i, src, reduce, include_self).unwrap()
            },
            want,
        );
    }
}

#[test]
fn scatter_ops_pass_gradcheck_to_second_order() {
    let inputs = [
        HostTensor::from_f64(&SELF, &[3, 2], DType::F64).unwrap(),
        HostTensor::from_f64(&SRC, &[4, 2], DType::F64).unwrap(),
    ];
    let opts = GradcheckOptions::default();
    let f = check_fn(|g, x| {
        let i = g.from_slice(&IDX2, &[4, 2])?;
        let y = x[0].scatter_reduce(0, i, x[1], ScatterReduce::Mean, false)?;
        // Squared, so that the second derivative is not zero.
        y.mul(y)?.sum()
    });
    let r = gradcheck(f, &inputs, opts).unwrap();
    assert!(r.passed, "{r}");
    let r = gradgradcheck(f, &inputs, opts).unwrap();
    assert!(r.passed, "{r}");
    // The checker catches a wrong rule: the source's gradient doubled by a hook.
    let wrong = check_fn(|g, x| {
        let i = g.from_slice(&[2i64, 0, 2, 2], &[4])?;
        let src = x[1].scale(1.0)?;
        src.register_hook(|gs| Ok(Some(gs.scale(2.0)?)))?;
        let y = x[0].index_add(0, i, src)?;
        y.mul(y)?.sum()
    });
    assert!(!gradcheck(wrong, &inputs, opts).unwrap().passed);
}

#[test]
fn bad_indices_and_shapes_are_typed_errors() {
    let g = Graph::new();
    let s = g.leaf(&SELF, &[3, 2], DType::F64).unwrap();
    let src = g.leaf(&SRC, &[4, 2], DType::F64).unwrap();
    let far = g.from_slice(&[2i64, 0, 3, 2], &[4]).unwrap();
    assert!(matches!(
        s.index_add(0, far, src),
        Err(GraphError::IndexOutOfRange {
            op: "index_add",
            index: 3,
            ..
        })
    ));
    let short = g.from_slice(&[2i64, 0], &[2]).unwrap();
    assert!(matches!(
        s.index_add(0, short, src),
        Err(GraphError::ShapeMismatch {
            op: "index_add",
            ..
        })
    ));
    let neg = g
        .from_slice(&[0i64, 0, -1, 0, 0, 0, 0, 0], &[4, 2])
        .unwrap();
    assert!(matches!(
        s.scatter_add(0, neg, src),
        Err(GraphError::BadArgument {
            op: "scatter_add",
            ..
        })
    ));
    let fl = g.from_slice(&[0.0f64; 8], &[4, 2]).unwrap();
    assert!(matches!(
        s.scatter_add(0, fl, src),
        Err(GraphError::UnsupportedDType {
            op: "scatter_add",
            ..
        })
    ));
    // Nothing the user owns changed.
    assert_eq!(s.to_vec::<f64>().unwrap(), SELF);
}

#[test]
fn scatter_reduce_amax_amin_share_the_gradient_among_ties_as_pytorch() {
    // src with ties against self (5 at [2, 0]) and among itself (3, 3 at [0, 1]).
    let src_ties = [0.5, -1.0, 3.0, 3.0, 4.0, -2.0, 5.0, 1.0];
    type Want = (ScatterReduce, bool, [f64; 6], [f64; 6], [f64; 8]);
    let cases: [Want; 4] = [
        (
            ScatterReduce::Amax,
            true,
            [3.0, 3.0, 3.0, 4.0, 5.0, 6.0],
            [0.0, 0.0, 3.0, 4.0, 2.5, 6.0],
            [0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 2.5, 0.0],
        ),
        (
            ScatterReduce::Amax,
            false,
            [3.0, 3.0, 3.0, -2.0, 5.0, 1.0],
            [0.0, 0.0, 3.0, 0.0, 0.0, 0.0],
            // PyTorch 2.15 gives src[3, 0] 2.5: it counts self's 5 among the ties though
            // self is not included, and half the gradient is lost. All of it is src's here.
            [0.0, 0.0, 1.0, 2.0, 0.0, 4.0, 5.0, 6.0],
        ),
        (
            ScatterReduce::Amin,
            true,
            [1.0, -1.0, 3.0, -2.0, 0.5, 1.0],
            [1.0, 0.0, 3.0, 0.0, 0.0, 0.0],
            [5.0, 2.0, 0.0, 0.0, 0.0, 4.0, 0.0, 6.0],
        ),
        (
            ScatterReduce::Amin,
            false,
            [3.0, -1.0, 3.0, -2.0, 0.5, 1.0],
            [0.0, 0.0, 3.0, 0.0, 0.0, 0.0],
            [5.0, 2.0, 1.0, 0.0, 0.0, 4.0, 0.0, 6.0],
        ),
    ];
    for (reduce, include_self, y_want, ds_want, dsrc_want) in cases {
        let what = format!("{reduce:?} include_self={include_self}");
        let g = Graph::new();
        let s = g.leaf(&SELF, &[3, 2], DType::F64).unwrap();
        let src = g.leaf(&src_ties, &[4, 2], DType::F64).unwrap();
        let i = g.from_slice(&IDX2, &[4, 2]).unwrap();
        let y = s.scatter_reduce(0, i, src, reduce, include_self).unwrap();
        close(&what, &y.to_vec::<f64>().unwrap(), &y_want);
        let w = g.from_f64(&W, &[3, 2], DType::F64).unwrap();
        y.mul(w).unwrap().sum().unwrap().backward().unwrap();
        let grad = |t: Tensor<'_>| t.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
        close(&format!("{what} d/dself"), &grad(s), &ds_want);
        close(&format!("{what} d/dsrc"), &grad(src), &dsrc_want);
    }
    // Without ties the gradient passes finite differences to second order.
    let inputs = [
        HostTensor::from_f64(&SELF, &[3, 2], DType::F64).unwrap(),
        HostTensor::from_f64(&SRC, &[4, 2], DType::F64).unwrap(),
    ];
    let f = check_fn(|g, x| {
        let i = g.from_slice(&IDX2, &[4, 2])?;
        let y = x[0].scatter_reduce(0, i, x[1], ScatterReduce::Amax, true)?;
        y.mul(y)?.sum()
    });
    let opts = GradcheckOptions::default();
    assert!(gradcheck(f, &inputs, opts).unwrap().passed);
    assert!(gradgradcheck(f, &inputs, opts).unwrap().passed);
}

/// An index smaller than `src` (on every axis) and than self off the scatter's axis, as PyTorch
/// allows: self `[3, 4]`, src `[4, 5]`, index `[3, 2]` (`[2, 3]` along axis 1). Values are
/// PyTorch 2's on the whole `src`; gradients of `Σ w·y` PyTorch's through `src`'s leading part
/// of the index's shape (its own backward refuses a smaller index; the elements the index does
/// not reach get zero).
#[test]
fn a_smaller_index_scatters_the_leading_part_as_pytorch() {
    let s_vals: Vec<f64> = (1..=12).map(f64::from).collect();
    let src_vals = [
        0.5, -1.0, 2.0, 3.0, 7.0, 4.0, -2.0, 1.0, 1.0, 9.0, 2.5, 3.5, -4.0, 6.0, 8.0, 1.5, -0.5,
        0.25, 2.0, 5.0,
    ];
    let w_vals: Vec<f64> = (1..=12).map(|k| f64::from(k) * 0.5 - 2.0).collect();
    // (what, axis, scatter_reduce's reduction and include_self or scatter_add, [y, d/dself,
    // d/dsrc])
    type Case = (
        &'static str,
        isize,
        Option<(ScatterReduce, bool)>,
        [&'static [f64]; 3],
    );
    let cases: [Case; 10] = [
        (
            "scatter_add",
            0,
            None,
            [
                &[
                    5.0, -1.0, 3.0, 4.0, 5.0, 9.5, 7.0, 8.0, 12.0, 10.0, 11.0, 12.0,
                ],
                &[
                    -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
                ],
                &[
                    2.5, -1.0, 0.0, 0.0, 0.0, -1.5, -1.0, 0.0, 0.0, 0.0, 2.5, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_add along axis 1",
            1,
            None,
            [
                &[
                    3.0, 2.0, 3.0, 3.5, 3.0, 10.0, 7.0, 9.0, 9.0, 10.0, 11.0, 12.0,
                ],
                &[
                    -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
                ],
                &[
                    0.0, 0.0, -1.5, 0.0, 0.0, 1.0, 0.5, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_reduce sum include_self=true",
            0,
            Some((ScatterReduce::Sum, true)),
            [
                &[
                    5.0, -1.0, 3.0, 4.0, 5.0, 9.5, 7.0, 8.0, 12.0, 10.0, 11.0, 12.0,
                ],
                &[
                    -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
                ],
                &[
                    2.5, -1.0, 0.0, 0.0, 0.0, -1.5, -1.0, 0.0, 0.0, 0.0, 2.5, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_reduce sum include_self=false",
            0,
            Some((ScatterReduce::Sum, false)),
            [
                &[
                    4.0, -3.0, 3.0, 4.0, 5.0, 3.5, 7.0, 8.0, 3.0, 10.0, 11.0, 12.0,
                ],
                &[0.0, 0.0, -0.5, 0.0, 0.5, 0.0, 1.5, 2.0, 0.0, 3.0, 3.5, 4.0],
                &[
                    2.5, -1.0, 0.0, 0.0, 0.0, -1.5, -1.0, 0.0, 0.0, 0.0, 2.5, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_reduce mean include_self=true",
            0,
            Some((ScatterReduce::Mean, true)),
            [
                &[
                    2.5,
                    -0.3333333333333333,
                    3.0,
                    4.0,
                    5.0,
                    4.75,
                    7.0,
                    8.0,
                    4.0,
                    10.0,
                    11.0,
                    12.0,
                ],
                &[
                    -0.75,
                    -0.3333333333333333,
                    -0.5,
                    0.0,
                    0.5,
                    0.5,
                    1.5,
                    2.0,
                    0.8333333333333334,
                    3.0,
                    3.5,
                    4.0,
                ],
                &[
                    0.8333333333333334,
                    -0.3333333333333333,
                    0.0,
                    0.0,
                    0.0,
                    -0.75,
                    -0.3333333333333333,
                    0.0,
                    0.0,
                    0.0,
                    0.8333333333333334,
                    0.5,
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                ],
            ],
        ),
        (
            "scatter_reduce mean include_self=false",
            0,
            Some((ScatterReduce::Mean, false)),
            [
                &[
                    4.0, -1.5, 3.0, 4.0, 5.0, 3.5, 7.0, 8.0, 1.5, 10.0, 11.0, 12.0,
                ],
                &[0.0, 0.0, -0.5, 0.0, 0.5, 0.0, 1.5, 2.0, 0.0, 3.0, 3.5, 4.0],
                &[
                    1.25, -0.5, 0.0, 0.0, 0.0, -1.5, -0.5, 0.0, 0.0, 0.0, 1.25, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_reduce amax include_self=true",
            0,
            Some((ScatterReduce::Amax, true)),
            [
                &[
                    4.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0,
                ],
                &[
                    -0.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
                ],
                &[
                    0.0, -0.0, 0.0, 0.0, 0.0, -1.5, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_reduce amax include_self=false",
            0,
            Some((ScatterReduce::Amax, false)),
            [
                &[
                    4.0, -1.0, 3.0, 4.0, 5.0, 3.5, 7.0, 8.0, 2.5, 10.0, 11.0, 12.0,
                ],
                &[0.0, 0.0, -0.5, 0.0, 0.5, 0.0, 1.5, 2.0, 0.0, 3.0, 3.5, 4.0],
                &[
                    0.0, -1.0, 0.0, 0.0, 0.0, -1.5, -0.0, 0.0, 0.0, 0.0, 2.5, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_reduce amin include_self=true",
            0,
            Some((ScatterReduce::Amin, true)),
            [
                &[
                    1.0, -2.0, 3.0, 4.0, 5.0, 3.5, 7.0, 8.0, 0.5, 10.0, 11.0, 12.0,
                ],
                &[
                    -1.5, -0.0, -0.5, 0.0, 0.5, 0.0, 1.5, 2.0, 0.0, 3.0, 3.5, 4.0,
                ],
                &[
                    2.5, -0.0, 0.0, 0.0, 0.0, -0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
        (
            "scatter_reduce amin include_self=false",
            0,
            Some((ScatterReduce::Amin, false)),
            [
                &[
                    4.0, -2.0, 3.0, 4.0, 5.0, 3.5, 7.0, 8.0, 0.5, 10.0, 11.0, 12.0,
                ],
                &[0.0, 0.0, -0.5, 0.0, 0.5, 0.0, 1.5, 2.0, 0.0, 3.0, 3.5, 4.0],
                &[
                    2.5, -0.0, 0.0, 0.0, 0.0, -1.5, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0,
                    0.0, 0.0, 0.0, 0.0, 0.0,
                ],
            ],
        ),
    ];
    for (what, axis, reduce, want) in cases {
        let g = Graph::new();
        let s = g.leaf(&s_vals, &[3, 4], DType::F64).unwrap();
        let src = g.leaf(&src_vals, &[4, 5], DType::F64).unwrap();
        let i = if axis == 0 {
            g.from_slice(&[2i64, 0, 0, 0, 2, 1], &[3, 2]).unwrap()
        } else {
            g.from_slice(&[3i64, 3, 0, 1, 0, 3], &[2, 3]).unwrap()
        };
        let y = match reduce {
            None => s.scatter_add(axis, i, src).unwrap(),
            Some((r, include_self)) => s.scatter_reduce(axis, i, src, r, include_self).unwrap(),
        };
        assert_eq!(y.shape().as_slice(), &[3, 4], "{what}");
        close(what, &y.to_vec::<f64>().unwrap(), want[0]);
        let w = g.from_f64(&w_vals, &[3, 4], DType::F64).unwrap();
        y.mul(w).unwrap().sum().unwrap().backward().unwrap();
        let grad = |t: Tensor<'_>| t.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
        close(&format!("{what} d/dself"), &grad(s), want[1]);
        close(&format!("{what} d/dsrc"), &grad(src), want[2]);
    }
}

/// gather with an index smaller than self off its axis (PyTorch's rule): self `[3, 4]`, index
/// `[2, 3]` along axis 1 reads self's leading `[2, 4]`; values and the gradient of `Σ w·y`
/// printed by PyTorch 2.
#[test]
fn gather_with_a_smaller_index_reads_the_leading_part_as_pytorch() {
    let g = Graph::new();
    let s_vals: Vec<f64> = (1..=12).map(f64::from).collect();
    let s = g.leaf(&s_vals, &[3, 4], DType::F64).unwrap();
    let i = g.from_slice(&[3i64, 0, 0, 1, 2, 3], &[2, 3]).unwrap();
    let y = s.gather_by(1, i).unwrap();
    assert_eq!(y.shape().as_slice(), &[2, 3]);
    close(
        "gather",
        &y.to_vec::<f64>().unwrap(),
        &[4.0, 1.0, 1.0, 6.0, 7.0, 8.0],
    );
    let w = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64)
        .unwrap();
    y.mul(w).unwrap().sum().unwrap().backward().unwrap();
    let ds = s.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
    close(
        "gather d/dself",
        &ds,
        &[5.0, 0.0, 0.0, 1.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0],
    );
    // An index larger than self off the axis, or of another rank, is a shape mismatch.
    for (shape, vals) in [([4usize, 1usize], vec![0i64; 4]), ([1, 5], vec![0; 5])] {
        let i = g.from_slice(&vals, &shape).unwrap();
        let r = s.gather_by(if shape[0] == 4 { 1 } else { 0 }, i);
        assert!(
            matches!(r, Err(GraphError::ShapeMismatch { op: "gather", .. })),
            "{r:?}"
        );
    }
}

/// An index larger than `src`, or than self off the scatter's axis, is refused with a typed
/// error naming the op, and nothing is recorded.
#[test]
fn an_index_larger_than_src_or_self_is_refused() {
    let g = Graph::new();
    let s = g.zeros(&[3, 4], DType::F64).unwrap();
    let src = g.ones(&[2, 2], DType::F64).unwrap();
    let big = g.zeros(&[2, 3], DType::I64).unwrap();
    let wide = g.zeros(&[2, 5], DType::I64).unwrap();
    let flat = g.zeros(&[2], DType::I64).unwrap();
    let (src25, src46) = (
        g.ones(&[2, 5], DType::F64).unwrap(),
        g.ones(&[4, 6], DType::F64).unwrap(),
    );
    for (i, src) in [(big, src), (wide, src25), (wide, src46), (flat, src)] {
        let before = g.stats().nodes;
        for r in [
            s.scatter_add(0, i, src),
            s.scatter_reduce(0, i, src, ScatterReduce::Mean, true),
        ] {
            assert!(matches!(r, Err(GraphError::ShapeMismatch { .. })), "{r:?}");
        }
        assert_eq!(g.stats().nodes, before, "a refusal records nothing");
    }
}

/// An index the same all across each slice off the scatter's axis (PyTorch's
/// `dst.unsqueeze(1).expand(-1, F)`, message passing's sum) takes the slice path; its values
/// and gradients are the definition's, along either axis, as are those of the same index with
/// one entry changed (the element path); such an index with a row out of range, or negative,
/// is still refused naming `scatter_add`, and nothing changes.
#[test]
fn an_index_constant_off_the_axis_scatters_whole_slices() {
    let (e, n, f) = (7usize, 4usize, 3usize);
    let dst = [2usize, 0, 3, 2, 2, 1, 0];
    let src_v: Vec<f64> = (0..e * f).map(|k| (k as f64) * 0.25 - 1.5).collect();
    let self_v: Vec<f64> = (0..n * f).map(|k| (k as f64) * 0.5 + 0.125).collect();
    let w: Vec<f64> = (0..n * f).map(|k| ((k * 5) % 7) as f64 - 3.0).collect();
    for changed in [false, true] {
        // Axis 0: self [n, f], src and index [e, f].
        let mut idx: Vec<i64> = (0..e * f).map(|k| dst[k / f] as i64).collect();
        if changed {
            idx[4] = 1;
        }
        let mut want = self_v.clone();
        for (k, &i) in idx.iter().enumerate() {
            want[i as usize * f + k % f] += src_v[k];
        }
        let g = Graph::new();
        let s = g.leaf(&self_v, &[n, f], DType::F64).unwrap();
        let src = g.leaf(&src_v, &[e, f], DType::F64).unwrap();
        let i = g.from_slice(&idx, &[e, f]).unwrap();
        let y = s.scatter_add(0, i, src).unwrap();
        assert_eq!(y.to_vec::<f64>().unwrap(), want, "changed {changed}");
        let wt = g.from_f64(&w, &[n, f], DType::F64).unwrap();
        y.mul(wt).unwrap().sum().unwrap().backward().unwrap();
        let gsrc: Vec<f64> = (0..e * f).map(|k| w[idx[k] as usize * f + k % f]).collect();
        assert_eq!(src.grad().unwrap().unwrap().to_vec::<f64>().unwrap(), gsrc);
        assert_eq!(s.grad().unwrap().unwrap().to_vec::<f64>().unwrap(), w);
        // Axis 1: the transposed layout, self [f, n], src and index [f, e].
        let idx_t: Vec<i64> = (0..f * e).map(|k| idx[(k % e) * f + k / e]).collect();
        let src_t: Vec<f64> = (0..f * e).map(|k| src_v[(k % e) * f + k / e]).collect();
        let self_t: Vec<f64> = (0..f * n).map(|k| self_v[(k % n) * f + k / n]).collect();
        let want_t: Vec<f64> = (0..f * n).map(|k| want[(k % n) * f + k / n]).collect();
        let st = g.leaf(&self_t, &[f, n], DType::F64).unwrap();
        let it = g.from_slice(&idx_t, &[f, e]).unwrap();
        let srct = g.leaf(&src_t, &[f, e], DType::F64).unwrap();
        let yt = st.scatter_add(1, it, srct).unwrap();
        assert_eq!(
            yt.to_vec::<f64>().unwrap(),
            want_t,
            "axis 1, changed {changed}"
        );
    }
    let g = Graph::new();
    let s = g.leaf(&self_v, &[n, f], DType::F64).unwrap();
    let src = g.leaf(&src_v, &[e, f], DType::F64).unwrap();
    for (bad, refused) in [(4i64, "out of range"), (-1, "negative")] {
        let idx: Vec<i64> = (0..e * f)
            .map(|k| if k / f == 3 { bad } else { dst[k / f] as i64 })
            .collect();
        let i = g.from_slice(&idx, &[e, f]).unwrap();
        let err = s.scatter_add(0, i, src).unwrap_err();
        assert!(
            matches!(
                err,
                GraphError::IndexOutOfRange {
                    op: "scatter_add",
                    ..
                } | GraphError::BadArgument {
                    op: "scatter_add",
                    ..
                }
            ),
            "{refused}: {err:?}"
        );
    }
    assert_eq!(s.to_vec::<f64>().unwrap(), self_v);
}

/// `scatter_reduce`'s sum and mean over an index constant off the axis (the slice path, as
/// `scatter_add`'s) give the values and gradients of the same index read element by element
/// (as `i32`, which takes the element path), with and without self, along either axis; a row
/// nothing lands on keeps self's value. An index with a row out of range is still refused.
#[test]
fn scatter_reduce_over_an_index_constant_off_the_axis_is_the_element_path() {
    let (e, n, f) = (6usize, 5usize, 3usize);
    let dst = [2i64, 0, 3, 2, 2, 0]; // row 1 and 4 receive nothing
    let src_v: Vec<f64> = (0..e * f).map(|k| (k as f64) * 0.25 - 1.5).collect();
    let self_v: Vec<f64> = (0..n * f).map(|k| (k as f64) * 0.5 + 0.125).collect();
    let w: Vec<f64> = (0..n * f).map(|k| ((k * 5) % 7) as f64 - 3.0).collect();
    for axis in [0usize, 1] {
        // Along axis 1 the transposed layout: self [f, n], src and index [f, e].
        let (sshape, ishape) = if axis == 0 {
            ([n, f], [e, f])
        } else {
            ([f, n], [f, e])
        };
        let idx: Vec<i64> = (0..e * f)
            .map(|k| if axis == 0 { dst[k / f] } else { dst[k % e] })
            .collect();
        for reduce in [ScatterReduce::Sum, ScatterReduce::Mean] {
            for include_self in [true, false] {
                let run = |narrow: bool| {
                    let g = Graph::new();
                    let s = g.leaf(&self_v, &sshape, DType::F64).unwrap();
                    let src = g.leaf(&src_v, &ishape, DType::F64).unwrap();
                    let i = if narrow {
                        let v: Vec<i32> = idx.iter().map(|&k| k as i32).collect();
                        g.from_slice(&v, &ishape).unwrap()
                    } else {
                        g.from_slice(&idx, &ishape).unwrap()
                    };
                    let y = s
                        .scatter_reduce(axis as isize, i, src, reduce, include_self)
                        .unwrap();
                    let wt = g.from_f64(&w, &sshape, DType::F64).unwrap();
                    y.mul(wt).unwrap().sum().unwrap().backward().unwrap();
                    let grad = |t: Tensor<'_>| t.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
                    (y.to_vec::<f64>().unwrap(), grad(s), grad(src))
                };
                let (slices, elements) = (run(false), run(true));
                let what = format!("axis {axis} {reduce:?} include_self {include_self}");
                close(&format!("{what} values"), &slices.0, &elements.0);
                close(&format!("{what} self grad"), &slices.1, &elements.1);
                close(&format!("{what} src grad"), &slices.2, &elements.2);
                // Rows 1 and 4 keep self's values.
                for row in [1usize, 4] {
                    for c in 0..f {
                        let at = if axis == 0 { row * f + c } else { c * n + row };
                        assert_eq!(slices.0[at], self_v[at], "{what}: row {row}");
                    }
                }
            }
        }
    }
    let g = Graph::new();
    let s = g.leaf(&self_v, &[n, f], DType::F64).unwrap();
    let src = g.leaf(&src_v, &[e, f], DType::F64).unwrap();
    let bad: Vec<i64> = (0..e * f)
        .map(|k| if k / f == 2 { 5 } else { dst[k / f] })
        .collect();
    let i = g.from_slice(&bad, &[e, f]).unwrap();
    let err = s
        .scatter_reduce(0, i, src, ScatterReduce::Mean, false)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::IndexOutOfRange {
                op: "scatter_reduce",
                ..
            }
        ),
        "{err:?}"
    );
}
