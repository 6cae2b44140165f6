//! The fused `layer_norm` and `rms_norm` against values PyTorch 2.15 printed for the same inputs
//! (float64, a constant row included, where only `eps` keeps the result finite), against finite
//! differences in f64 for the input, the weight and the bias, and to second order through the
//! `create_graph` rule; and the fused `group_norm` against the same normalisation written in
//! ops, finite differences and second order.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_graph::{DType, Graph, GraphError, HostTensor, Tensor};

const X: [f64; 12] = [
    0.3, -1.2, 0.8, 2.1, -0.4, 1.7, -0.9, 0.5, 0.0, 1.0, 1.0, 1.0,
];
const W: [f64; 3] = [1.5, -0.5, 2.0];
const B: [f64; 3] = [0.1, 0.2, -0.3];
/// The weights of the scalar loss `(y · C).sum()`.
const C: [f64; 12] = [1., 2., 3., -1., 0.5, 2., 0.3, -0.7, 1.1, 2., -1., 0.5];

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{got:?}\nvs {want:?}"
        );
    }
}

fn grad_of(t: Tensor<'_>) -> Vec<f64> {
    t.grad().unwrap().unwrap().to_vec_f64().unwrap()
}

#[test]
fn layer_norm_matches_pytorch_values_and_gradients() {
    let g = Graph::new();
    let x = g.leaf(&X, &[2, 2, 3], DType::F64).unwrap();
    let w = g.leaf(&W, &[3], DType::F64).unwrap();
    let b = g.leaf(&B, &[3], DType::F64).unwrap();
    let c = g.from_f64(&C, &[2, 2, 3], DType::F64).unwrap();
    let y = x.layer_norm(1, Some(w), Some(b), 1e-5).unwrap();
    #[rustfmt::skip]
    close(&y.to_vec_f64().unwrap(), &[
        0.688344332275582, 0.886401720988179, 1.661147774251939, 1.42243343323253,
        0.899217677341338, 0.733626131721977, -1.885222333979997, -0.34665542529884,
        0.16034141077797, 0.1, 0.2, -0.3,
    ], 1e-12);
    y.mul(c).unwrap().sum().unwrap().backward().unwrap();
    #[rustfmt::skip]
    close(&grad_of(x), &[
        -1.9913025683310037, 0.4977713341271137, 1.4935312342038896, -2.3453803301888128,
        -0.44674344541537203, 2.7921237756041846, -0.7259589680123633, -1.306708651494207,
        2.0326676195065714, 474.34164902525686, -316.2277660168379, -158.11388300841895,
    ], 1e-9);
    close(
        &grad_of(w),
        &[-0.8864372007672983, -4.210142156712428, 4.22853556902777],
        1e-12,
    );
    close(&grad_of(b), &[2.3, 0.8, 6.6], 1e-12);
}

#[test]
fn layer_norm_over_two_axes_without_affine_matches_pytorch() {
    let g = Graph::new();
    let x = g.leaf(&X, &[2, 2, 3], DType::F64).unwrap();
    let c = g.from_f64(&C, &[2, 2, 3], DType::F64).unwrap();
    let y = x.layer_norm(2, None, None, 1e-5).unwrap();
    #[rustfmt::skip]
    close(&y.to_vec_f64().unwrap(), &[
        -0.21905313627581888, -1.5333719539307318, 0.21905313627581882, 1.3581294449100767,
        -0.8324019178481116, 1.0076444268687665, -1.9069056761464973, 0.09534528380732475,
        -0.6197443447476116, 0.8104349123622613, 0.8104349123622613, 0.8104349123622613,
    ], 1e-12);
    y.mul(c).unwrap().sum().unwrap().backward().unwrap();
    #[rustfmt::skip]
    close(&grad_of(x), &[
        -0.2954338417792449, 0.12249447030347294, 1.6097526594341585, -1.4979178523611265,
        -0.947406089740476, 1.0085106541432174, -0.14301695060871206, -1.5231409575771284,
        1.0333048301701226, 2.3562199116700486, -1.93431785965957, 0.2109510260052393,
    ], 1e-10);
}

#[test]
fn rms_norm_matches_pytorch_values_and_gradients() {
    let g = Graph::new();
    let x = g.leaf(&X, &[2, 2, 3], DType::F64).unwrap();
    let w = g.leaf(&W, &[3], DType::F64).unwrap();
    let c = g.from_f64(&C, &[2, 2, 3], DType::F64).unwrap();
    let y = x.rms_norm(1, Some(w), 1e-6).unwrap();
    #[rustfmt::skip]
    close(&y.to_vec_f64().unwrap(), &[
        0.5291063503854034, 0.7054751338472046, 1.8812670235925457, 1.997568496114785,
        0.1268297457850657, 2.1561056783461168, -2.2711240102203223, -0.4205785204111708,
        0.0, 1.4999992500005623, -0.4999997500001875, 1.99999900000075,
    ], 1e-12);
    y.mul(c).unwrap().sum().unwrap().backward().unwrap();
    #[rustfmt::skip]
    close(&grad_of(x), &[
        0.7152296957780027, 3.018040665614695, 4.258862968232022, -1.6206492638985086,
        -0.031027435467424314, 1.9946784919547058, 0.42851489398433257, 0.771324618995514,
        3.701090979618303, 1.5000007499983123, -0.9999980000026248, -0.49999825000243736,
    ], 1e-10);
    close(
        &grad_of(w),
        &[0.5667994341370979, -4.537539709749898, 5.478005963735122],
        1e-12,
    );
}

#[test]
fn f32_agrees_with_f64_to_single_precision() {
    let g = Graph::new();
    for rms in [false, true] {
        let run = |dtype| {
            let x = g.leaf(&X, &[4, 3], dtype).unwrap();
            let w = g.leaf(&W, &[3], dtype).unwrap();
            let y = if rms {
                x.rms_norm(1, Some(w), 1e-5).unwrap()
            } else {
                x.layer_norm(1, Some(w), None, 1e-5).unwrap()
            };
            let c = g.from_f64(&C, &[4, 3], dtype).unwrap();
            y.mul(c).unwrap().sum().unwrap().backward().unwrap();
            [y.to_vec_f64().unwrap(), grad_of(x), grad_of(w)]
        };
        let (a, b) = (run(DType::F32), run(DType::F64));
        for (p, q) in a.iter().zip(&b) {
            close(p, q, 1e-4);
        }
    }
}

#[test]
fn gradients_pass_finite_differences_and_second_order() {
    let opts = GradcheckOptions::default();
    let xs = [
        HostTensor::from_f64(&X[..9], &[3, 3], DType::F64).unwrap(),
        HostTensor::from_f64(&W, &[3], DType::F64).unwrap(),
        HostTensor::from_f64(&B, &[3], DType::F64).unwrap(),
    ];
    // tanh after the norm, so that the second derivative is not trivially zero.
    let ln = check_fn(|_, x| x[0].layer_norm(1, Some(x[1]), Some(x[2]), 1e-5)?.tanh());
    let rms = check_fn(|_, x| x[0].rms_norm(1, Some(x[1]), 1e-5)?.add(x[2])?.tanh());
    let r = gradcheck(ln, &xs, opts).unwrap();
    assert!(r.passed, "layer_norm: {r}");
    let r = gradgradcheck(ln, &xs, opts).unwrap();
    assert!(r.passed, "layer_norm, second order: {r}");
    let r = gradcheck(rms, &xs, opts).unwrap();
    assert!(r.passed, "rms_norm: {r}");
    let r = gradgradcheck(rms, &xs, opts).unwrap();
    assert!(r.passed, "rms_norm, second order: {r}");
    let two = check_fn(|_, x| {
        x[0].reshape(&[1, 3, 3])?
            .layer_norm(2, None, None, 0.0)?
            .sin()
    });
    let r = gradcheck(two, &xs[..1], opts).unwrap();
    assert!(r.passed, "layer_norm over two axes: {r}");
}

#[test]
fn bad_arguments_are_errors_naming_the_op() {
    let g = Graph::new();
    let x = g.leaf(&X, &[4, 3], DType::F64).unwrap();
    let w4 = g.from_f64(&[1.0; 4], &[4], DType::F64).unwrap();
    let w32 = g.from_f64(&W, &[3], DType::F32).unwrap();
    assert!(matches!(
        x.layer_norm(1, Some(w4), None, 1e-5),
        Err(GraphError::ShapeMismatch {
            op: "layer_norm",
            ..
        })
    ));
    assert!(matches!(
        x.rms_norm(1, Some(w32), 1e-5),
        Err(GraphError::DTypeMismatch { op: "rms_norm", .. })
    ));
    for (ndim, eps) in [(0, 1e-5), (3, 1e-5), (1, f64::NAN), (1, -1.0)] {
        assert!(matches!(
            x.layer_norm(ndim, None, None, eps),
            Err(GraphError::BadArgument {
                op: "layer_norm",
                ..
            })
        ));
    }
}

/// A normalised axis of length 0 (rows of no elements): empty outputs and gradients, the
/// affine parameters' gradients empty too — as PyTorch, whose `layer_norm` over a `[3, 0]` input
/// returns an empty tensor and empty gradients — never a panic.
#[test]
fn an_empty_normalised_axis_gives_empty_gradients() {
    let g = Graph::new();
    let x = g.leaf(&[], &[3, 0], DType::F64).unwrap();
    let w = g.leaf(&[], &[0], DType::F64).unwrap();
    let b = g.leaf(&[], &[0], DType::F64).unwrap();
    for rms in [false, true] {
        let y = if rms {
            x.rms_norm(1, Some(w), 1e-5).unwrap()
        } else {
            x.layer_norm(1, Some(w), Some(b), 1e-5).unwrap()
        };
        assert_eq!(y.shape()[..], [3, 0]);
        y.sum().unwrap().backward().unwrap();
        for t in [x, w] {
            assert!(t.grad().unwrap().unwrap().to_vec_f64().unwrap().is_empty());
        }
    }
}

/// Group normalisation written out as PyTorch's reference does it: each sample's group as a
/// row through `layer_norm`, then the per-channel weight and bias.
fn group_norm_in_ops<'g>(
    x: Tensor<'g>,
    groups: usize,
    w: Option<Tensor<'g>>,
    b: Option<Tensor<'g>>,
) -> Tensor<'g> {
    let s = x.shape();
    let full: Vec<isize> = s.iter().map(|&d| d as isize).collect();
    let mut per = vec![1isize; s.len()];
    per[1] = s[1] as isize;
    let mut y = x
        .reshape(&[s[0] as isize, groups as isize, -1])
        .unwrap()
        .layer_norm(1, None, None, 1e-5)
        .unwrap()
        .reshape(&full)
        .unwrap();
    if let Some(w) = w {
        y = y.mul(w.reshape(&per).unwrap()).unwrap();
    }
    if let Some(b) = b {
        y = y.add(b.reshape(&per).unwrap()).unwrap();
    }
    y
}

/// The fused `group_norm` (one op) gives the values and gradients of the same normalisation
/// written in ops, in f64 to rounding, with and without weight and bias, on a batch large
/// enough to be split across threads and on one of a single position per channel; in f32 it
/// agrees with f64 to single precision.
#[test]
fn group_norm_equals_layer_norm_over_groups_then_the_channel_affine() {
    for (shape, groups, threads) in [
        (vec![2usize, 6, 5, 3], 3usize, 1usize),
        (vec![3, 4, 1], 2, 2),
        (vec![4, 8, 40, 60], 4, 2),
        (vec![2, 6, 7], 6, 3),
    ] {
        let n: usize = shape.iter().product();
        let c = shape[1];
        let xs: Vec<f64> = (0..n)
            .map(|i| ((i * 37 % 101) as f64 - 50.0) / 17.0)
            .collect();
        let cs: Vec<f64> = (0..n)
            .map(|i| ((i * 53 % 89) as f64 - 44.0) / 29.0)
            .collect();
        let ws: Vec<f64> = (0..c).map(|i| 0.5 + i as f64 / 3.0).collect();
        let bs: Vec<f64> = (0..c).map(|i| i as f64 / 7.0 - 0.4).collect();
        for affine in [true, false] {
            let run = |fused: bool, dtype| {
                let g = Graph::with_threads(threads);
                let x = g.leaf(&xs, &shape, dtype).unwrap();
                let w = g.leaf(&ws, &[c], dtype).unwrap();
                let b = g.leaf(&bs, &[c], dtype).unwrap();
                let (w, b) = if affine {
                    (Some(w), Some(b))
                } else {
                    (None, None)
                };
                let y = if fused {
                    x.group_norm(groups, w, b, 1e-5).unwrap()
                } else {
                    group_norm_in_ops(x, groups, w, b)
                };
                let cw = g.from_f64(&cs, &shape, dtype).unwrap();
                y.mul(cw).unwrap().sum().unwrap().backward().unwrap();
                let mut out = vec![y.to_vec_f64().unwrap(), grad_of(x)];
                if let (Some(w), Some(b)) = (w, b) {
                    out.extend([grad_of(w), grad_of(b)]);
                }
                out
            };
            let (fused, in_ops) = (run(true, DType::F64), run(false, DType::F64));
            assert_eq!(fused.len(), if affine { 4 } else { 2 });
            for (p, q) in fused.iter().zip(&in_ops) {
                close(p, q, 1e-11);
            }
            for (p, q) in run(true, DType::F32).iter().zip(&fused) {
                close(p, q, 1e-4);
            }
        }
    }
}

#[test]
fn group_norm_passes_finite_differences_and_second_order() {
    let opts = GradcheckOptions::default();
    let xs = [
        HostTensor::from_f64(&X, &[2, 3, 2], DType::F64).unwrap(),
        HostTensor::from_f64(&W, &[3], DType::F64).unwrap(),
        HostTensor::from_f64(&B, &[3], DType::F64).unwrap(),
    ];
    for groups in [1, 3] {
        let f = check_fn(|_, x| {
            x[0].group_norm(groups, Some(x[1]), Some(x[2]), 1e-5)?
                .tanh()
        });
        let r = gradcheck(f, &xs, opts).unwrap();
        assert!(r.passed, "group_norm, {groups} groups: {r}");
        let r = gradgradcheck(f, &xs, opts).unwrap();
        assert!(r.passed, "group_norm, {groups} groups, second order: {r}");
    }
}

#[test]
fn group_norm_bad_arguments_are_errors_naming_the_op() {
    let g = Graph::new();
    let x = g.leaf(&X, &[2, 3, 2], DType::F64).unwrap();
    let w4 = g.from_f64(&[1.0; 4], &[4], DType::F64).unwrap();
    let w32 = g.from_f64(&W, &[3], DType::F32).unwrap();
    assert!(matches!(
        x.group_norm(3, Some(w4), None, 1e-5),
        Err(GraphError::ShapeMismatch {
            op: "group_norm",
            ..
        })
    ));
    assert!(matches!(
        x.group_norm(3, None, Some(w32), 1e-5),
        Err(GraphError::DTypeMismatch {
            op: "group_norm",
            ..
        })
    ));
    let flat = g.leaf(&X, &[12], DType::F64).unwrap();
    let no_channels = g.leaf(&[], &[2, 0, 3], DType::F64).unwrap();
    let ints = g.from_f64(&X, &[2, 3, 2], DType::I64).unwrap();
    assert!(matches!(
        ints.group_norm(3, None, None, 1e-5),
        Err(GraphError::UnsupportedDType {
            op: "group_norm",
            ..
        })
    ));
    for (t, groups, eps) in [
        (x, 2, 1e-5),
        (x, 0, 1e-5),
        (flat, 1, 1e-5),
        (x, 3, -1.0),
        (no_channels, 4, 1e-5),
    ] {
        assert!(matches!(
            t.group_norm(groups, None, None, eps),
            Err(GraphError::BadArgument {
                op: "group_norm",
                ..
            })
        ));
    }
}
