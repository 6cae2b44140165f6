//! Convolution, pooling and dropout: values by hand, gradients by finite differences.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_graph::{device_test, DType, Graph, GraphError, HostTensor};

fn ht(shape: &[usize], seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| (((i as u64 + 1) * (seed * 2 + 7)) % 23) as f64 / 7.0 - 1.5 + i as f64 * 1e-3)
        .collect();
    HostTensor::new::<f64>(v, shape).unwrap()
}

/// Direct convolution, the definition, as an independent reference.
// The definition's parameters spelled out, independent of the crate's `Window`.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    s: usize,
    p: usize,
    d: usize,
    groups: usize,
) -> (Vec<f64>, [usize; 4]) {
    let [n, c, h, wd] = xs;
    let [o, cg, kh, kw] = ws;
    let ho = (h + 2 * p - d * (kh - 1) - 1) / s + 1;
    let wo = (wd + 2 * p - d * (kw - 1) - 1) / s + 1;
    let og = o / groups;
    let mut y = vec![0.0; n * o * ho * wo];
    for b in 0..n {
        for oc in 0..o {
            let grp = oc / og;
            for i in 0..ho {
                for j in 0..wo {
                    let mut acc = 0.0;
                    for ci in 0..cg {
                        let ic = grp * cg + ci;
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let ih = (i * s + ki * d) as isize - p as isize;
                                let iw = (j * s + kj * d) as isize - p as isize;
                                if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < wd {
                                    acc += x[((b * c + ic) * h + ih as usize) * wd + iw as usize]
                                        * w[((oc * cg + ci) * kh + ki) * kw + kj];
                                }
                            }
                        }
                    }
                    y[((b * o + oc) * ho + i) * wo + j] = acc;
                }
            }
        }
    }
    (y, [n, o, ho, wo])
}

device_test! {
fn conv2d_matches_the_definition(dev) {
    let g = Graph::on(dev).unwrap();
    for (xs, ws, s, p, d, groups) in [
        ([2, 3, 5, 6], [4, 3, 3, 3], 1, 0, 1, 1),
        ([1, 4, 7, 7], [6, 2, 3, 2], 2, 1, 1, 2),
        ([2, 2, 8, 8], [2, 1, 3, 3], 1, 2, 2, 2),
    ] {
        let x = ht(&xs, 1);
        let w = ht(&ws, 2);
        let (want, oshape) = conv_ref(&x.to_f64_vec(), xs, &w.to_f64_vec(), ws, s, p, d, groups);
        let y = g
            .from_host(&x)
            .unwrap()
            .conv2d(g.from_host(&w).unwrap(), (s, s), (p, p), (d, d), groups)
            .unwrap();
        assert_eq!(y.shape().as_slice(), &oshape);
        for (a, b) in y.to_vec_f64().unwrap().iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
        // The same with a bias: each output channel moved by its own value.
        let bias: Vec<f64> = (0..ws[0]).map(|c| c as f64 * 0.5 - 1.0).collect();
        let yb = g
            .from_host(&x)
            .unwrap()
            .conv2d_bias(
                g.from_host(&w).unwrap(),
                Some(g.from_f64(&bias, &[ws[0]], DType::F64).unwrap()),
                (s, s),
                (p, p),
                (d, d),
                groups,
            )
            .unwrap();
        let plane = oshape[2] * oshape[3];
        for (e, (a, b)) in yb.to_vec_f64().unwrap().iter().zip(&want).enumerate() {
            let c = (e / plane) % ws[0];
            assert!((a - b - bias[c]).abs() < 1e-12, "{a} vs {b} + {}", bias[c]);
        }
    }
    // A bias that is not [out_channels] is a typed error naming the op.
    let x = g.from_host(&ht(&[1, 2, 4, 4], 1)).unwrap();
    let w = g.from_host(&ht(&[3, 2, 3, 3], 2)).unwrap();
    let b = g.from_f64(&[0.0; 2], &[2], DType::F64).unwrap();
    assert!(matches!(
        x.conv2d_bias(w, Some(b), (1, 1), (0, 0), (1, 1), 1),
        Err(GraphError::ShapeMismatch { op: "conv2d", .. })
    ));
}
}

device_test! {
fn conv2d_grads(dev) {
    let o = GradcheckOptions {
        device: dev,
        ..GradcheckOptions::default()
    };
    let r = gradcheck(
        check_fn(|_, x| x[0].conv2d(x[1], (1, 1), (1, 1), (1, 1), 1)),
        &[ht(&[2, 2, 4, 4], 3), ht(&[3, 2, 3, 3], 4)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradcheck(
        check_fn(|_, x| x[0].conv2d(x[1], (2, 1), (0, 1), (1, 2), 2)),
        &[ht(&[1, 4, 5, 5], 5), ht(&[2, 2, 2, 2], 6)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradgradcheck(
        check_fn(|_, x| x[0].conv2d(x[1], (1, 1), (0, 0), (1, 1), 1)?.tanh()),
        &[ht(&[1, 1, 3, 3], 7), ht(&[1, 1, 2, 2], 8)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    // With a bias: first and second derivatives, several images and channels.
    let r = gradcheck(
        check_fn(|_, x| x[0].conv2d_bias(x[1], Some(x[2]), (1, 1), (1, 1), (1, 1), 1)),
        &[ht(&[3, 2, 4, 3], 9), ht(&[4, 2, 3, 3], 10), ht(&[4], 11)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradgradcheck(
        check_fn(|_, x| {
            x[0].conv2d_bias(x[1], Some(x[2]), (1, 1), (1, 1), (1, 1), 1)?
                .tanh()
        }),
        &[ht(&[2, 1, 3, 3], 12), ht(&[2, 1, 2, 2], 13), ht(&[2], 14)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    // Second derivatives with groups: two groups of two channels (stride and dilation), and
    // depthwise (a group per channel, two outputs each) with a bias and padding.
    let r = gradgradcheck(
        check_fn(|_, x| x[0].conv2d(x[1], (2, 1), (0, 1), (1, 2), 2)?.tanh()),
        &[ht(&[1, 4, 5, 5], 15), ht(&[2, 2, 2, 2], 16)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradgradcheck(
        check_fn(|_, x| {
            x[0].conv2d_bias(x[1], Some(x[2]), (1, 1), (1, 1), (1, 1), 3)?
                .tanh()
        }),
        &[ht(&[2, 3, 3, 3], 17), ht(&[6, 1, 2, 2], 18), ht(&[6], 19)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
}
}

/// Transposed convolution by its definition: each input pixel `(iy, ix)` adds its channels times
/// the kernel at output `(iy·s − p + ky·d, ix·s − p + kx·d)`; `ws` is `[C_in, C_out/groups, kh,
/// kw]`, `op` the output padding (the output's extra rows and columns at the end).
#[allow(clippy::too_many_arguments)]
fn conv_transpose_ref(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    s: (usize, usize),
    p: (usize, usize),
    op: (usize, usize),
    d: (usize, usize),
    groups: usize,
) -> (Vec<f64>, [usize; 4]) {
    let [n, c, h, wd] = xs;
    let [_, og, kh, kw] = ws;
    let cg = c / groups;
    let ho = (h - 1) * s.0 + d.0 * (kh - 1) + op.0 + 1 - 2 * p.0;
    let wo = (wd - 1) * s.1 + d.1 * (kw - 1) + op.1 + 1 - 2 * p.1;
    let o = og * groups;
    let mut y = vec![0.0; n * o * ho * wo];
    for b in 0..n {
        for ic in 0..c {
            let grp = ic / cg;
            for iy in 0..h {
                for ix in 0..wd {
                    let v = x[((b * c + ic) * h + iy) * wd + ix];
                    for oc in 0..og {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let oy = (iy * s.0 + ky * d.0) as isize - p.0 as isize;
                                let ox = (ix * s.1 + kx * d.1) as isize - p.1 as isize;
                                if oy < 0 || ox < 0 || oy as usize >= ho || ox as usize >= wo {
                                    continue;
                                }
                                let out =
                                    ((b * o + grp * og + oc) * ho + oy as usize) * wo + ox as usize;
                                y[out] += v * w[((ic * og + oc) * kh + ky) * kw + kx];
                            }
                        }
                    }
                }
            }
        }
    }
    (y, [n, o, ho, wo])
}

device_test! {
fn conv_transpose2d_matches_the_definition(dev) {
    let g = Graph::on(dev).unwrap();
    // (input, weight, stride, padding, output padding, dilation, groups): a U-Net's k4 s2 p1,
    // kernel = stride, uneven strides with output padding, groups with dilation, padding wider
    // than the kernel's reach on one side, and an output padding past the stride (below the
    // dilation), which adds windows of zero input.
    type Case = ([usize; 4], [usize; 4], (usize, usize), (usize, usize), (usize, usize), (usize, usize), usize);
    let cases: [Case; 6] = [
        ([2, 3, 4, 5], [3, 2, 4, 4], (2, 2), (1, 1), (0, 0), (1, 1), 1),
        ([2, 2, 3, 3], [2, 3, 2, 2], (2, 2), (0, 0), (0, 0), (1, 1), 1),
        ([1, 2, 3, 4], [2, 2, 3, 2], (2, 3), (1, 0), (1, 2), (1, 1), 1),
        ([2, 4, 3, 3], [4, 1, 2, 3], (2, 1), (0, 2), (0, 0), (2, 3), 2),
        ([1, 1, 4, 4], [1, 1, 3, 3], (3, 3), (2, 2), (0, 0), (1, 1), 1),
        ([1, 2, 3, 4], [2, 2, 2, 3], (1, 2), (0, 1), (2, 1), (3, 2), 1),
    ];
    for (xs, ws, s, p, op, d, groups) in cases {
        let (x, w) = (ht(&xs, 1), ht(&ws, 2));
        let (want, oshape) =
            conv_transpose_ref(&x.to_f64_vec(), xs, &w.to_f64_vec(), ws, s, p, op, d, groups);
        let bias: Vec<f64> = (0..oshape[1]).map(|c| c as f64 * 0.5 - 1.0).collect();
        let b = g.from_f64(&bias, &[oshape[1]], DType::F64).unwrap();
        for with_bias in [None, Some(b)] {
            let y = g
                .from_host(&x)
                .unwrap()
                .conv_transpose2d(g.from_host(&w).unwrap(), with_bias, s, p, op, d, groups)
                .unwrap();
            assert_eq!(y.shape().as_slice(), &oshape, "{xs:?} {ws:?}");
            let plane = oshape[2] * oshape[3];
            for (e, (a, b)) in y.to_vec_f64().unwrap().iter().zip(&want).enumerate() {
                let shift = with_bias.map_or(0.0, |_| bias[(e / plane) % oshape[1]]);
                assert!((a - b - shift).abs() < 1e-12, "{xs:?} {ws:?} at {e}: {a} vs {b}");
            }
        }
    }
}
}

device_test! {
fn conv_transpose2d_grads(dev) {
    let o = GradcheckOptions {
        device: dev,
        ..GradcheckOptions::default()
    };
    // Batch-wide (no groups) and per-image (groups) paths, with a bias and an output padding
    // past the stride; second derivatives through a tanh.
    let r = gradcheck(
        check_fn(|_, x| x[0].conv_transpose2d(x[1], Some(x[2]), (2, 2), (1, 1), (1, 0), (1, 1), 1)),
        &[ht(&[2, 2, 3, 3], 3), ht(&[2, 3, 3, 3], 4), ht(&[3], 5)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradcheck(
        check_fn(|_, x| x[0].conv_transpose2d(x[1], None, (1, 2), (0, 1), (1, 1), (2, 2), 2)),
        &[ht(&[1, 4, 3, 3], 6), ht(&[4, 1, 2, 2], 7)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradgradcheck(
        check_fn(|_, x| {
            x[0].conv_transpose2d(x[1], Some(x[2]), (2, 2), (1, 1), (0, 0), (1, 1), 1)?
                .tanh()
        }),
        &[ht(&[1, 2, 2, 2], 8), ht(&[2, 1, 3, 3], 9), ht(&[1], 10)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    // Second derivatives with two groups, dilation and an output padding.
    let r = gradgradcheck(
        check_fn(|_, x| {
            x[0].conv_transpose2d(x[1], Some(x[2]), (2, 1), (0, 1), (1, 0), (1, 2), 2)?
                .tanh()
        }),
        &[ht(&[1, 4, 2, 3], 11), ht(&[4, 1, 2, 2], 12), ht(&[2], 13)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
}
}

/// Refusals name the op and record nothing: channels that differ, groups that do not divide
/// them, a bias of another length, an output padding at both the stride and the dilation,
/// padding that leaves no output, sizes that overflow.
#[test]
fn conv_transpose2d_refuses_bad_arguments() {
    let g = Graph::new();
    let x = g.ones(&[1, 2, 3, 3], DType::F64).unwrap();
    let w = g.ones(&[2, 1, 2, 2], DType::F64).unwrap();
    let m = usize::MAX;
    let refused = |r: arenagrad_graph::Result<arenagrad_graph::Tensor<'_>>| match r {
        Err(GraphError::BadArgument { op, .. }) | Err(GraphError::ShapeMismatch { op, .. }) => {
            op == "conv_transpose2d"
        }
        Err(GraphError::TooLarge { .. }) => true,
        other => panic!("{other:?}"),
    };
    let w3 = g.ones(&[3, 1, 2, 2], DType::F64).unwrap();
    let b3 = g.ones(&[3], DType::F64).unwrap();
    let nodes = g.stats().nodes;
    assert!(refused(x.conv_transpose2d(
        w3,
        None,
        (1, 1),
        (0, 0),
        (0, 0),
        (1, 1),
        1
    )));
    assert!(refused(x.conv_transpose2d(
        w,
        None,
        (1, 1),
        (0, 0),
        (0, 0),
        (1, 1),
        3
    )));
    assert!(refused(x.conv_transpose2d(
        w,
        Some(b3),
        (1, 1),
        (0, 0),
        (0, 0),
        (1, 1),
        1
    )));
    assert!(refused(x.conv_transpose2d(
        w,
        None,
        (2, 2),
        (0, 0),
        (2, 0),
        (2, 2),
        1
    )));
    assert!(refused(x.conv_transpose2d(
        w,
        None,
        (1, 1),
        (2, 2),
        (0, 0),
        (1, 1),
        1
    )));
    assert!(refused(x.conv_transpose2d(
        w,
        None,
        (0, 1),
        (0, 0),
        (0, 0),
        (1, 1),
        1
    )));
    assert!(refused(x.conv_transpose2d(
        w,
        None,
        (m, 1),
        (0, 0),
        (0, 0),
        (1, 1),
        1
    )));
    assert!(refused(x.conv_transpose2d(
        w,
        None,
        (1, 1),
        (0, 0),
        (m - 1, 0),
        (m, 1),
        1
    )));
    assert_eq!(g.stats().nodes, nodes, "a refused call records nothing");
}

device_test! {
fn pooling_values_and_grads(dev) {
    let g = Graph::on(dev).unwrap();
    let x = g
        .from_f64(
            &(0..16).map(f64::from).collect::<Vec<_>>(),
            &[1, 1, 4, 4],
            DType::F64,
        )
        .unwrap();
    assert_eq!(
        x.max_pool2d((2, 2), (2, 2), (0, 0))
            .unwrap()
            .to_vec_f64()
            .unwrap(),
        vec![5.0, 7.0, 13.0, 15.0]
    );
    assert_eq!(
        x.avg_pool2d((2, 2), (2, 2), (0, 0))
            .unwrap()
            .to_vec_f64()
            .unwrap(),
        vec![2.5, 4.5, 10.5, 12.5]
    );
    let neg = x.neg().unwrap();
    // Padding never wins a max, even when every value is negative.
    let mp = neg.max_pool2d((3, 3), (2, 2), (1, 1)).unwrap();
    assert_eq!(mp.to_vec_f64().unwrap(), vec![0.0, -1.0, -4.0, -5.0]);
    // Average pooling counts the zero padding.
    let ap = x
        .avg_pool2d((3, 3), (2, 2), (1, 1))
        .unwrap()
        .to_vec_f64()
        .unwrap();
    assert!((ap[0] - (0.0 + 1.0 + 4.0 + 5.0) / 9.0).abs() < 1e-12);
    let o = GradcheckOptions {
        device: dev,
        ..GradcheckOptions::default()
    };
    let r = gradcheck(
        check_fn(|_, x| x[0].max_pool2d((2, 2), (2, 2), (0, 0))),
        &[ht(&[2, 2, 4, 6], 9)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradcheck(
        check_fn(|_, x| x[0].max_pool2d((3, 3), (2, 2), (1, 1))),
        &[ht(&[1, 2, 5, 5], 10)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let r = gradcheck(
        check_fn(|_, x| x[0].avg_pool2d((2, 3), (1, 2), (1, 1))),
        &[ht(&[2, 1, 4, 5], 11)],
        o,
    )
    .unwrap();
    assert!(r.passed, "{r}");
    assert!(x.max_pool2d((5, 5), (1, 1), (0, 0)).is_err());
    assert!(x.avg_pool2d((2, 2), (0, 1), (0, 0)).is_err());
}
}

device_test! {
fn dropout_scales_survivors_and_is_identity_in_eval(dev) {
    let g = Graph::on(dev).unwrap();
    g.seed(3);
    let x = g.ones(&[10_000], DType::F64).unwrap();
    let y = x.dropout(0.25, true).unwrap().to_vec_f64().unwrap();
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    assert!(y
        .iter()
        .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-12));
    assert!((7200..7800).contains(&kept), "{kept}");
    assert_eq!(
        x.dropout(0.25, false).unwrap().to_vec_f64().unwrap(),
        vec![1.0; 10_000]
    );
    assert_eq!(
        x.dropout(1.0, true).unwrap().to_vec_f64().unwrap(),
        vec![0.0; 10_000]
    );
    assert!(x.dropout(1.5, true).is_err());
}
}

device_test! {
fn dropout_backward_replays_the_forwards_mask_to_second_order(dev) {
    let g = Graph::on(dev).unwrap();
    g.seed(11);
    let v: Vec<f64> = (0..5000).map(|k| (k as f64 * 0.37).sin()).collect();
    let x = g.leaf(&v, &[50, 100], DType::F64).unwrap();
    let y = x.dropout(0.4, true).unwrap();
    let w = g.from_f64(&v, &[50, 100], DType::F64).unwrap();
    let l = y.mul(y).unwrap().mul(w).unwrap().sum().unwrap();
    let gr = arenagrad_graph::grad(
        l,
        &[x],
        arenagrad_graph::BackwardOptions {
            create_graph: true,
            ..Default::default()
        },
    )
    .unwrap()[0]
        .unwrap();
    // d/dx Σ w·(m·x)² = 2·w·m²·x with m the mask times 1/(1 − p), read off the forward.
    let yv = y.to_vec_f64().unwrap();
    let gv = gr.to_vec_f64().unwrap();
    let s = 1.0 / 0.6;
    for k in 0..v.len() {
        let m = if yv[k] == 0.0 && v[k] != 0.0 { 0.0 } else { s };
        let want = 2.0 * v[k] * m * m * v[k];
        assert!((gv[k] - want).abs() < 1e-9, "{k}: {} vs {want}", gv[k]);
    }
    // Second order: d/dx Σ gr = 2·w·m², the same mask again.
    let h = arenagrad_graph::grad(gr.sum().unwrap(), &[x], Default::default()).unwrap()[0]
        .unwrap()
        .to_vec_f64()
        .unwrap();
    for k in 0..v.len() {
        let m = if yv[k] == 0.0 && v[k] != 0.0 { 0.0 } else { s };
        assert!((h[k] - 2.0 * v[k] * m * m).abs() < 1e-9);
    }
    // The same seed, the same mask, whatever the device.
    g.seed(11);
    assert_eq!(x.dropout(0.4, true).unwrap().to_vec_f64().unwrap(), yv);
}
}

/// Window arithmetic that overflows (a dilated kernel, padding, patch length) is refused, never
/// wrapped into an output larger than the input.
#[test]
fn overflowing_windows_are_refused() {
    let g = Graph::new();
    let x = g.ones(&[1, 1, 4, 4], DType::F32).unwrap();
    let w = g.ones(&[1, 1, 2, 2], DType::F32).unwrap();
    let m = usize::MAX;
    let bad = |r: arenagrad_graph::Result<arenagrad_graph::Tensor<'_>>| match r {
        Err(GraphError::BadArgument { op, .. }) => {
            op == "conv2d" || op == "unfold" || op.ends_with("pool2d")
        }
        Err(GraphError::TooLarge { .. }) => true,
        other => panic!("{other:?}"),
    };
    let nodes = g.stats().nodes;
    for (s, p, d) in [
        ((1, 1), (0, 0), (m, 1)),
        ((1, 1), (0, 0), (1, m)),
        ((1, 1), (0, 0), (m / 2 + 1, 1)),
        ((1, 1), (m, 0), (1, 1)),
        ((1, 1), (m / 2, 0), (1, 1)),
        ((1, 1), (0, m / 4), (1, 1)),
    ] {
        assert!(bad(x.conv2d(w, s, p, d, 1)), "{s:?} {p:?} {d:?}");
        assert!(bad(x.unfold2d((2, 2), s, p, d)), "{s:?} {p:?} {d:?}");
    }
    assert_eq!(g.stats().nodes, nodes, "a refused window records nothing");
    // A huge stride is fine: one output position.
    let y = x.conv2d(w, (m, m), (0, 0), (1, 1), 1).unwrap();
    assert_eq!(y.shape().as_slice(), &[1, 1, 1, 1]);
    // Kernels whose patch length overflows.
    assert!(bad(x.unfold2d((m, 2), (1, 1), (0, 0), (1, 1))));
    assert!(bad(x.max_pool2d((m, m), (1, 1), (0, 0))));
    assert!(bad(x.max_pool2d((2, 2), (1, 1), (m, 0))));
    assert!(bad(x.avg_pool2d((2, 2), (1, 1), (0, m))));
}
