//! Losses against hand-computed values and gradients, and against finite differences.

use arenagrad_graph::check::{check_fn, gradcheck, GradcheckOptions};
use arenagrad_graph::{grad as autograd, BackwardOptions};
use arenagrad_nn::loss::{self, CrossEntropyOptions, Reduction};
use arenagrad_nn::{DType, Graph, GraphError, HostTensor, NnError, Tensor};

fn f64s(t: Tensor<'_>) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

fn graph_err(e: NnError) -> GraphError {
    match e {
        NnError::Graph(e) => e,
        other => panic!("{other}"),
    }
}

fn ht(v: &[f64], shape: &[usize]) -> HostTensor {
    HostTensor::new(v.to_vec(), shape).unwrap()
}

#[test]
fn mse_values_reductions_and_gradient() {
    let g = Graph::new();
    let p = g.leaf(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let t = g.from_f64(&[1.0, 0.0, 5.0], &[3], DType::F64).unwrap();
    let l = loss::mse_loss(p, t).unwrap();
    assert!((l.item().unwrap() - 8.0 / 3.0).abs() < 1e-15);
    assert_eq!(
        loss::mse_loss_with(p, t, Reduction::Sum)
            .unwrap()
            .item()
            .unwrap(),
        8.0
    );
    assert_eq!(
        f64s(loss::mse_loss_with(p, t, Reduction::None).unwrap()),
        vec![0.0, 4.0, 4.0]
    );
    l.backward().unwrap();
    // d/dp mean((p − t)²) = 2(p − t)/3
    close(
        &f64s(p.grad().unwrap().unwrap()),
        &[0.0, 4.0 / 3.0, -4.0 / 3.0],
        1e-15,
    );
    let other = g.zeros(&[2], DType::F64).unwrap();
    assert!(matches!(
        loss::mse_loss(p, other),
        Err(NnError::InputShape { op: "mse_loss", .. })
    ));
}

#[test]
fn cross_entropy_values_and_gradient() {
    let g = Graph::new();
    let x = g
        .leaf(&[2.0, 0.0, 0.0, 0.0, 3.0, 0.0], &[2, 3], DType::F64)
        .unwrap();
    let l = loss::cross_entropy(x, &[0, 1]).unwrap();
    let l0 = (1.0 + 2.0 * (-2f64).exp()).ln();
    let l1 = (1.0 + 2.0 * (-3f64).exp()).ln();
    assert!((l.item().unwrap() - (l0 + l1) / 2.0).abs() < 1e-14);
    l.backward().unwrap();
    // (softmax − onehot) / N
    let s0 = [2f64.exp(), 1.0, 1.0].map(|e| e / (2f64.exp() + 2.0));
    let s1 = [1.0, 3f64.exp(), 1.0].map(|e| e / (3f64.exp() + 2.0));
    let want = [
        (s0[0] - 1.0) / 2.0,
        s0[1] / 2.0,
        s0[2] / 2.0,
        s1[0] / 2.0,
        (s1[1] - 1.0) / 2.0,
        s1[2] / 2.0,
    ];
    close(&f64s(x.grad().unwrap().unwrap()), &want, 1e-14);
    let none = loss::cross_entropy_with(
        x,
        &[0, 1],
        CrossEntropyOptions {
            reduction: Reduction::None,
            ..Default::default()
        },
    )
    .unwrap();
    close(&f64s(none), &[l0, l1], 1e-14);
}

#[test]
fn cross_entropy_label_smoothing() {
    let g = Graph::new();
    let x = g.from_f64(&[2.0, 0.0, 0.0], &[1, 3], DType::F64).unwrap();
    let l = loss::cross_entropy_with(
        x,
        &[0],
        CrossEntropyOptions {
            label_smoothing: 0.3,
            reduction: Reduction::Mean,
            ignore_index: None,
        },
    )
    .unwrap();
    // lsm = [2 − L, −L, −L], L = log(e² + 2): 0.7·(L − 2) + 0.3·(L − 2/3) = L − 1.6
    let big_l = (2f64.exp() + 2.0).ln();
    assert!((l.item().unwrap() - (big_l - 1.6)).abs() < 1e-14);
    assert!(matches!(
        loss::cross_entropy_with(
            x,
            &[0],
            CrossEntropyOptions {
                label_smoothing: 1.5,
                ..Default::default()
            }
        ),
        Err(NnError::InvalidConfig { .. })
    ));
}

#[test]
fn cross_entropy_spatial_and_unbatched() {
    let g = Graph::new();
    // [N=1, C=2, d=2]: targets per position.
    let x = g
        .from_f64(&[1.0, 0.0, 0.0, 2.0], &[1, 2, 2], DType::F64)
        .unwrap();
    let l = loss::cross_entropy_with(
        x,
        &[0, 1],
        CrossEntropyOptions {
            reduction: Reduction::None,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(l.shape().as_slice(), &[1, 2]);
    // position 0: logits (1, 0), target 0; position 1: logits (0, 2), target 1
    let want0 = (1.0 + (-1f64).exp()).ln();
    let want1 = (1.0 + (-2f64).exp()).ln();
    close(&f64s(l), &[want0, want1], 1e-14);
    let v = g.from_f64(&[0.0, 0.0], &[2], DType::F64).unwrap();
    assert!((loss::cross_entropy(v, &[1]).unwrap().item().unwrap() - 2f64.ln()).abs() < 1e-15);
}

#[test]
fn cross_entropy_bad_targets_are_typed() {
    let g = Graph::new();
    let x = g.zeros(&[2, 3], DType::F32).unwrap();
    assert!(matches!(
        loss::cross_entropy(x, &[0, 3]),
        Err(NnError::IndexOutOfRange {
            position: 1,
            index: 3,
            bound: 3,
            ..
        })
    ));
    assert!(matches!(
        loss::cross_entropy(x, &[0]),
        Err(NnError::TargetCount {
            predictions: 2,
            targets: 1,
            ..
        })
    ));
    assert!(matches!(
        loss::nll_loss(g.scalar(1.0, DType::F32).unwrap(), &[0]),
        Err(NnError::InputShape { .. })
    ));
}

#[test]
fn nll_values() {
    let g = Graph::new();
    let lp = g
        .from_f64(&[-0.5, -1.0, -2.0, -0.1], &[2, 2], DType::F64)
        .unwrap();
    assert!((loss::nll_loss(lp, &[1, 0]).unwrap().item().unwrap() - 1.5).abs() < 1e-15);
    assert_eq!(
        loss::nll_loss_with(lp, &[1, 0], Reduction::Sum)
            .unwrap()
            .item()
            .unwrap(),
        3.0
    );
    // NLL of log_softmax is cross-entropy.
    let x = g
        .from_f64(&[0.3, -1.2, 2.0, 0.5, 0.0, -0.7], &[2, 3], DType::F64)
        .unwrap();
    let a = loss::nll_loss(x.log_softmax(-1).unwrap(), &[2, 0])
        .unwrap()
        .item()
        .unwrap();
    let b = loss::cross_entropy(x, &[2, 0]).unwrap().item().unwrap();
    assert!((a - b).abs() < 1e-15);
}

#[test]
fn bce_with_logits_is_stable_and_exact_at_zero() {
    let g = Graph::new();
    let x = g
        .leaf(&[0.0, 100.0, -100.0, 2.0, 800.0, -800.0], &[6], DType::F64)
        .unwrap();
    let y = g
        .from_f64(&[1.0, 1.0, 0.0, 0.0, 0.0, 1.0], &[6], DType::F64)
        .unwrap();
    let per = f64s(loss::bce_with_logits_with(x, y, Reduction::None).unwrap());
    let want = [
        2f64.ln(),
        (-100f64).exp(),
        (-100f64).exp(),
        2.0 + (1.0 + (-2f64).exp()).ln(),
        800.0,
        800.0,
    ];
    close(&per, &want, 1e-14);
    assert!(per.iter().all(|v| v.is_finite()));
    let l = loss::bce_with_logits(x, y).unwrap();
    l.backward().unwrap();
    let s = |v: f64| 1.0 / (1.0 + (-v).exp());
    let want_g: Vec<f64> = [
        (0.0, 1.0),
        (100.0, 1.0),
        (-100.0, 0.0),
        (2.0, 0.0),
        (800.0, 0.0),
        (-800.0, 1.0),
    ]
    .iter()
    .map(|&(x, y)| (s(x) - y) / 6.0)
    .collect();
    let gx = f64s(x.grad().unwrap().unwrap());
    close(&gx, &want_g, 1e-15);
    assert_eq!(gx[0], -0.5 / 6.0, "σ(0) − 1 exactly at the kink of |x|");
    // f32 does not overflow either.
    let xf = g.from_f64(&[90.0, -90.0], &[2], DType::F32).unwrap();
    let yf = g.from_f64(&[0.0, 1.0], &[2], DType::F32).unwrap();
    assert_eq!(
        loss::bce_with_logits_with(xf, yf, Reduction::Sum)
            .unwrap()
            .item()
            .unwrap(),
        180.0
    );
}

#[test]
fn losses_gradcheck() {
    let x = ht(
        &[
            0.3, -1.2, 2.0, 0.5, 0.0, -0.7, 1.1, 0.2, -0.4, 0.9, -2.0, 0.6,
        ],
        &[4, 3],
    );
    let targets = [2usize, 0, 1, 1];
    let opts = GradcheckOptions::default();
    let ce = gradcheck(
        check_fn(|_g, xs| loss::cross_entropy(xs[0], &targets).map_err(graph_err)),
        std::slice::from_ref(&x),
        opts,
    )
    .unwrap();
    assert!(ce.passed, "{ce}");
    let smooth = gradcheck(
        check_fn(|_g, xs| {
            loss::cross_entropy_with(
                xs[0],
                &targets,
                CrossEntropyOptions {
                    label_smoothing: 0.2,
                    reduction: Reduction::Sum,
                    ignore_index: None,
                },
            )
            .map_err(graph_err)
        }),
        std::slice::from_ref(&x),
        opts,
    )
    .unwrap();
    assert!(smooth.passed, "{smooth}");
    let nll = gradcheck(
        check_fn(|_g, xs| loss::nll_loss(xs[0], &targets).map_err(graph_err)),
        std::slice::from_ref(&x),
        opts,
    )
    .unwrap();
    assert!(nll.passed, "{nll}");
    let t = ht(
        &[0.0, 1.0, 0.5, 1.0, 0.0, 0.2, 0.9, 1.0, 0.0, 0.3, 1.0, 0.7],
        &[4, 3],
    );
    let mse = gradcheck(
        check_fn(|_g, xs| loss::mse_loss(xs[0], xs[1]).map_err(graph_err)),
        &[x.clone(), t.clone()],
        opts,
    )
    .unwrap();
    assert!(mse.passed, "{mse}");
    // BCE with respect to both logits and targets.
    let bce = gradcheck(
        check_fn(|_g, xs| loss::bce_with_logits(xs[0], xs[1]).map_err(graph_err)),
        &[x, t],
        opts,
    )
    .unwrap();
    assert!(bce.passed, "{bce}");
}

#[test]
fn bce_second_derivative() {
    use arenagrad_graph::check::gradgradcheck;
    let x = ht(&[0.3, -1.2, 2.0, 0.5], &[4]);
    let t = ht(&[0.0, 1.0, 0.5, 1.0], &[4]);
    let r = gradgradcheck(
        check_fn(|_g, xs| loss::bce_with_logits(xs[0], xs[1]).map_err(graph_err)),
        &[x, t],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(r.passed, "{r}");
}

/// The mean cross-entropy of host logits runs as one fused op; it must give what the composed
/// form (`log_softmax`, then `nll_loss`) gives — value and gradient, in both types — and its
/// create_graph rule must be right to second order.
#[test]
fn fused_cross_entropy_matches_the_composed_form() {
    let (m, c) = (7, 5);
    let v: Vec<f64> = (0..m * c)
        .map(|i| ((i * 37) % 23) as f64 * 0.4 - 4.0)
        .collect();
    let targets = [4usize, 0, 2, 2, 1, 3, 0];
    for (dtype, tol) in [(DType::F64, 1e-14), (DType::F32, 2e-6)] {
        let g = Graph::new();
        // (fused?, create_graph?) → (loss, gradient of 3·loss).
        let run = |fused: bool, create_graph: bool| {
            let x = g
                .from_f64(&v, &[m, c], dtype)
                .unwrap()
                .set_requires_grad(true)
                .unwrap();
            let l = if fused {
                loss::cross_entropy(x, &targets).unwrap()
            } else {
                loss::nll_loss(x.log_softmax(-1).unwrap(), &targets).unwrap()
            };
            let opts = BackwardOptions {
                create_graph,
                ..Default::default()
            };
            let gx = autograd(l.scale(3.0).unwrap(), &[x], opts).unwrap()[0].unwrap();
            (l.item().unwrap(), gx.to_vec_f64().unwrap())
        };
        let (lc, gc) = run(false, false);
        for create_graph in [false, true] {
            let (lf, gf) = run(true, create_graph);
            assert!(
                (lf - lc).abs() <= tol * lc.abs(),
                "{dtype:?}: loss {lf} vs {lc}"
            );
            for (a, b) in gf.iter().zip(&gc) {
                assert!(
                    (a - b).abs() <= tol * 3.0,
                    "{dtype:?}, create_graph {create_graph}: gradient {a} vs {b}"
                );
            }
        }
    }
    let r = arenagrad_graph::check::gradgradcheck(
        check_fn(|_g, xs| loss::cross_entropy(xs[0], &targets).map_err(graph_err)),
        &[ht(&v, &[m, c])],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(r.passed, "{r}");
}

/// The fused cross-entropy keeps its precision for large logits (PyTorch: loss ln 2, gradient
/// ±1/4 for two rows of equal logits), in f32, by the fused and the `create_graph` paths.
#[test]
fn cross_entropy_is_precise_for_large_logits() {
    for v in [1e4, 1e6, 1e7, 3e7] {
        for create in [false, true] {
            let g = Graph::new();
            let x = g.leaf(&[v; 4], &[2, 2], DType::F32).unwrap();
            let l = loss::cross_entropy(x, &[0, 1]).unwrap();
            let lv = l.item().unwrap() as f32;
            assert!(
                (lv - std::f32::consts::LN_2).abs() <= f32::EPSILON,
                "loss at {v}: {lv}"
            );
            let gx = if create {
                let opts = BackwardOptions {
                    create_graph: true,
                    ..Default::default()
                };
                autograd(l, &[x], opts).unwrap()[0].unwrap()
            } else {
                l.backward().unwrap();
                x.grad().unwrap().unwrap()
            };
            assert_eq!(
                gx.to_vec::<f32>().unwrap(),
                vec![-0.25, 0.25, 0.25, -0.25],
                "gradient at {v} (create_graph {create})"
            );
        }
    }
}
