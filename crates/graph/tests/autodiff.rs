//! PyTorch's autodiff semantics: retain_graph, spent graphs, detach, no_grad, accumulation,
//! zero_grad, several backward passes in one iteration, create_graph, parameters, stale handles.

use std::sync::Arc;

use arenagrad_graph::check::{check_fn, gradcheck, GradcheckOptions};
use arenagrad_graph::{
    grad, BackwardOptions, CustomOp, DType, Graph, GraphError, HostTensor, Parameter, Result,
    Tensor,
};

fn v(t: Tensor<'_>) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

#[test]
fn second_backward_is_a_typed_error_naming_retain_graph() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let y = x.mul(x).unwrap().sum().unwrap();
    y.backward().unwrap();
    let err = y.backward().unwrap_err();
    assert!(matches!(err, GraphError::GraphSpent { .. }), "{err:?}");
    assert!(err.to_string().contains("retain_graph"), "{err}");
}

#[test]
fn retain_graph_allows_a_second_pass_and_grads_accumulate() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let y = x.mul(x).unwrap().sum().unwrap();
    y.backward_with(BackwardOptions {
        retain_graph: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(v(x.grad().unwrap().unwrap()), vec![2.0, 4.0]);
    y.backward().unwrap();
    assert_eq!(v(x.grad().unwrap().unwrap()), vec![4.0, 8.0]);
    x.zero_grad().unwrap();
    assert!(x.grad().unwrap().is_none());
}

#[test]
fn detach_and_no_grad_stop_gradients() {
    let g = Graph::new();
    let x = g.leaf(&[3.0], &[1], DType::F64).unwrap();
    let y = x.mul(x.detach().unwrap()).unwrap().sum().unwrap(); // d/dx (x·c) = c
    y.backward().unwrap();
    assert_eq!(v(x.grad().unwrap().unwrap()), vec![3.0]);
    let z = {
        let _ng = g.no_grad();
        x.exp().unwrap()
    };
    assert!(!z.requires_grad());
    assert!(g.is_grad_enabled());
    assert!(matches!(
        z.sum().unwrap().backward(),
        Err(GraphError::NoGradFn)
    ));
    let before = g.stats().tape_len;
    {
        let _ng = g.no_grad();
        for _ in 0..10 {
            let _ = x.tanh().unwrap();
        }
    }
    assert_eq!(g.stats().tape_len, before, "no_grad recorded nodes");
}

#[test]
fn gan_step_three_backward_passes_in_one_iteration() {
    // Generator G(z) = z·wg, discriminator D(x) = sigmoid(x·wd). As in the PyTorch paper's GAN
    // example: D's loss on real and on detached fake data, then G's loss through D.
    let wg = Parameter::new("wg", HostTensor::new(vec![0.5f64, -0.3], &[2, 1]).unwrap());
    let wd = Parameter::new("wd", HostTensor::new(vec![0.8f64], &[1, 1]).unwrap());
    let g = Graph::new();
    let (gw, dw) = (g.param(&wg).unwrap(), g.param(&wd).unwrap());
    let z = g.from_f64(&[1.0, 2.0], &[1, 2], DType::F64).unwrap();
    let real = g.from_f64(&[1.5], &[1, 1], DType::F64).unwrap();
    let fake = z.matmul(gw).unwrap();
    let d_real = real
        .matmul(dw)
        .unwrap()
        .sigmoid()
        .unwrap()
        .log()
        .unwrap()
        .neg()
        .unwrap()
        .sum()
        .unwrap();
    d_real.backward().unwrap();
    let d_fake = fake
        .detach()
        .unwrap()
        .matmul(dw)
        .unwrap()
        .sigmoid()
        .unwrap()
        .neg()
        .unwrap()
        .shift(1.0)
        .unwrap()
        .log()
        .unwrap()
        .neg()
        .unwrap()
        .sum()
        .unwrap();
    d_fake.backward().unwrap();
    assert!(wg.grad().is_none(), "detach must keep D's loss away from G");
    let gd = wd.grad().unwrap().to_f64_vec()[0];
    // hand-derived: d/dw -log σ(1.5w) = -1.5(1-σ(1.5w)); d/dw -log(1-σ(f w)) = f σ(f w), f = -0.1
    let s = |t: f64| 1.0 / (1.0 + (-t).exp());
    let want = -1.5 * (1.0 - s(1.5 * 0.8)) + (-0.1) * s(-0.1 * 0.8);
    assert!((gd - want).abs() < 1e-12, "{gd} vs {want}");
    wd.zero_grad();
    let g_loss = fake
        .matmul(dw)
        .unwrap()
        .sigmoid()
        .unwrap()
        .log()
        .unwrap()
        .neg()
        .unwrap()
        .sum()
        .unwrap();
    g_loss.backward().unwrap();
    let gg = wg.grad().unwrap().to_f64_vec();
    let want_g0 = -(1.0 - s(-0.1 * 0.8)) * 0.8 * 1.0;
    assert!((gg[0] - want_g0).abs() < 1e-12);
    assert!(
        wd.grad().is_some(),
        "G's backward also reaches D's parameter, as in PyTorch"
    );
}

#[test]
fn parameter_grads_accumulate_across_iterations_until_zero_grad() {
    let p = Parameter::new("w", HostTensor::new(vec![2.0f64], &[1]).unwrap());
    let mut g = Graph::new();
    for _ in 0..3 {
        let w = g.param(&p).unwrap();
        w.mul(w).unwrap().sum().unwrap().backward().unwrap();
        g.reset();
    }
    assert_eq!(p.grad().unwrap().to_f64_vec(), vec![12.0]);
    p.zero_grad();
    assert!(p.grad().is_none());
}

#[test]
fn stale_ids_are_typed_errors_after_reset() {
    let mut g = Graph::new();
    let id = g.randn(&[3], DType::F32).unwrap().id();
    assert!(g.get(id).is_ok());
    g.reset();
    assert!(matches!(g.get(id), Err(GraphError::StaleTensor { .. })));
    let _fresh = g.randn(&[3], DType::F32).unwrap();
    assert!(
        matches!(g.get(id), Err(GraphError::StaleTensor { .. })),
        "a reused slot must not resolve"
    );
    let other = Graph::new();
    let oid = other.randn(&[3], DType::F32).unwrap().id();
    assert!(matches!(g.get(oid), Err(GraphError::StaleTensor { .. })));
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let g = Graph::new();
    let a = g.zeros(&[2, 3], DType::F32).unwrap();
    let b = g.zeros(&[4], DType::F32).unwrap();
    let e = a.add(b).unwrap_err();
    assert!(
        matches!(&e, GraphError::ShapeMismatch { op: "add", lhs, rhs } if lhs == &[2, 3] && rhs == &[4]),
        "{e}"
    );
    assert!(matches!(a.matmul(a), Err(GraphError::MatmulShape { .. })));
    assert!(matches!(
        a.sum_axes(&[2], false),
        Err(GraphError::BadAxis { .. })
    ));
    assert!(matches!(
        a.reshape(&[5, -1]),
        Err(GraphError::BadReshape { .. })
    ));
    assert!(matches!(
        a.permute(&[0, 0]),
        Err(GraphError::BadPermutation { .. })
    ));
    assert!(matches!(a.slice(1, 2, 5), Err(GraphError::BadRange { .. })));
    assert!(matches!(
        a.index_select(0, &[2]),
        Err(GraphError::IndexOutOfRange { .. })
    ));
    let c = g.zeros(&[2, 3], DType::F64).unwrap();
    assert!(matches!(a.add(c), Err(GraphError::DTypeMismatch { .. })));
    assert!(matches!(
        g.from_f64(&[1.0], &[2], DType::F32),
        Err(GraphError::DataLength { .. })
    ));
    assert!(matches!(
        g.zeros(&[usize::MAX, 4], DType::F32),
        Err(GraphError::TooLarge { .. })
    ));
    assert!(matches!(a.item(), Err(GraphError::NotScalar { .. })));
    assert!(matches!(
        a.to_vec::<f64>(),
        Err(GraphError::WrongDType { .. })
    ));
    let other = Graph::new();
    let o = other.zeros(&[2, 3], DType::F32).unwrap();
    assert!(matches!(a.add(o), Err(GraphError::GraphMismatch { .. })));
    assert!(matches!(
        g.concat(&[], 0),
        Err(GraphError::BadArgument { .. })
    ));
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    assert!(matches!(
        x.mul(x).unwrap().backward(),
        Err(GraphError::NotScalar { .. })
    ));
}

#[test]
fn non_scalar_backward_with_explicit_grad() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let y = x.mul(x).unwrap();
    let w = g.from_f64(&[10.0, 100.0], &[2], DType::F64).unwrap();
    y.backward_with(BackwardOptions {
        grad: Some(w),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(v(x.grad().unwrap().unwrap()), vec![20.0, 400.0]);
}

#[test]
fn retain_grad_keeps_an_intermediate_gradient() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let h = x.scale(3.0).unwrap();
    h.retain_grad().unwrap();
    h.mul(h).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(v(h.grad().unwrap().unwrap()), vec![6.0, 12.0]);
    assert_eq!(v(x.grad().unwrap().unwrap()), vec![18.0, 36.0]);
}

#[test]
fn create_graph_makes_grads_differentiable() {
    let g = Graph::new();
    let x = g.leaf(&[0.3, -0.7], &[2], DType::F64).unwrap();
    let y = x.tanh().unwrap().sum().unwrap();
    y.backward_with(BackwardOptions {
        create_graph: true,
        ..Default::default()
    })
    .unwrap();
    let gx = x.grad().unwrap().unwrap();
    assert!(gx.requires_grad());
    x.zero_grad().unwrap();
    gx.sum().unwrap().backward().unwrap();
    let h = v(x.grad().unwrap().unwrap());
    for (k, &x0) in [0.3f64, -0.7].iter().enumerate() {
        let t = x0.tanh();
        let want = -2.0 * t * (1.0 - t * t); // d²/dx² tanh
        assert!((h[k] - want).abs() < 1e-12, "{} vs {want}", h[k]);
    }
}

#[test]
fn gradients_of_unused_inputs_are_none() {
    let g = Graph::new();
    let x = g.leaf(&[1.0], &[1], DType::F64).unwrap();
    let u = g.leaf(&[1.0], &[1], DType::F64).unwrap();
    let r = grad(x.exp().unwrap().sum().unwrap(), &[x, u], Default::default()).unwrap();
    assert!(r[0].is_some() && r[1].is_none());
}

/// x² with a planted wrong derivative (x instead of 2x).
struct WrongSquare;
impl CustomOp for WrongSquare {
    fn name(&self) -> &'static str {
        "wrong_square"
    }
    fn backward<'g>(
        &self,
        _g: &'g Graph,
        inputs: &[Tensor<'g>],
        _out: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>> {
        Ok(vec![Some(gy.mul(inputs[0])?)])
    }
}

/// x² with the right derivative, to show the custom-op path itself is sound.
struct Square;
impl CustomOp for Square {
    fn name(&self) -> &'static str {
        "square"
    }
    fn backward<'g>(
        &self,
        _g: &'g Graph,
        inputs: &[Tensor<'g>],
        _out: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>> {
        Ok(vec![Some(gy.mul(inputs[0])?.scale(2.0)?)])
    }
}

fn custom_square<'g>(g: &'g Graph, x: Tensor<'g>, op: Arc<dyn CustomOp>) -> Result<Tensor<'g>> {
    let value = {
        let _ng = g.no_grad();
        x.mul(x)?
    };
    g.custom(op, &[x], value)
}

/// What an iteration's nodes hold (here a custom op's `Arc`) is let go of at the reset, whether
/// or not backward ran, and the node slots the next iteration writes over start clean.
#[test]
fn reset_lets_go_of_what_the_iteration_held() {
    let op: Arc<dyn CustomOp> = Arc::new(Square);
    let mut g = Graph::new();
    for it in 0..4 {
        let x = g
            .from_slice(&[1.0f64, -2.0], &[2])
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        // Long shapes and input lists spill out of line; they go too.
        let wide = x.reshape(&[1, 1, 1, 1, 2]).unwrap();
        let cat = g.concat(&[x, x, x], 0).unwrap();
        let y = custom_square(&g, x, op.clone()).unwrap();
        assert_eq!(Arc::strong_count(&op), 2);
        if it % 2 == 0 {
            let l = y.add(wide.reshape(&[2]).unwrap()).unwrap().sum().unwrap();
            l.add(cat.sum().unwrap()).unwrap().backward().unwrap();
            assert_eq!(v(x.grad().unwrap().unwrap()), vec![6.0, 0.0]);
        }
        g.reset();
        assert_eq!(Arc::strong_count(&op), 1, "iteration {it}");
    }
}

#[test]
fn gradcheck_catches_a_planted_wrong_backward() {
    let x = [HostTensor::new(vec![0.5f64, -1.25, 2.0], &[3]).unwrap()];
    let good = gradcheck(
        check_fn(|g, xs| custom_square(g, xs[0], Arc::new(Square))),
        &x,
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(good.passed, "{good}");
    let bad = gradcheck(
        check_fn(|g, xs| custom_square(g, xs[0], Arc::new(WrongSquare))),
        &x,
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(
        !bad.passed,
        "the checker accepted a wrong derivative: {bad}"
    );
    // The report names the input and an element whose analytic value is half the numerical one.
    let r = &bad.inputs[0];
    assert!((r.analytic * 2.0 - r.numerical).abs() < 1e-6, "{bad}");
}

#[test]
fn backward_frees_gradient_temporaries() {
    // Peak arena bytes during backward stay well under forward + a full copy of every gradient.
    let mut g = Graph::new();
    let n = if cfg!(miri) { 64 } else { 4096 };
    let x = g.leaf(&vec![0.1; n], &[n], DType::F64).unwrap();
    let mut h = x;
    for _ in 0..50 {
        h = h.tanh().unwrap();
    }
    let loss = h.sum().unwrap();
    let fwd = g.stats().arena.bytes_in_use;
    g.reset_peak_stats();
    loss.backward().unwrap();
    let peak = g.stats().arena.peak_bytes_in_use;
    let per = n * 8;
    assert!(
        peak <= fwd + 4 * per,
        "backward peak {peak} vs forward {fwd}: gradient buffers not recycled"
    );
    g.reset();
}

/// A rule that hands back its gradient in another dtype.
struct WrongDtype;
impl CustomOp for WrongDtype {
    fn name(&self) -> &'static str {
        "wrong_dtype"
    }
    fn backward<'g>(
        &self,
        g: &'g Graph,
        inputs: &[Tensor<'g>],
        _out: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>> {
        let v = gy.mul(inputs[0])?.to_vec_f64()?;
        Ok(vec![Some(g.from_f64(&v, &gy.shape(), DType::F32)?)])
    }
}

#[test]
fn gradients_of_another_dtype_are_typed_errors() {
    let g = Graph::new();
    // An explicit seed must have the root's dtype.
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let y = x.exp().unwrap();
    let seed = g.ones(&[2], DType::F32).unwrap();
    let e = y
        .backward_with(BackwardOptions {
            grad: Some(seed),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        matches!(e, GraphError::DTypeMismatch { op: "backward", .. }),
        "{e}"
    );
    // So must a custom op's gradient for its input.
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let h = x.exp().unwrap();
    let y = custom_square(&g, h, Arc::new(WrongDtype)).unwrap();
    let e = y.sum().unwrap().backward().unwrap_err();
    assert!(
        matches!(
            e,
            GraphError::DTypeMismatch {
                op: "wrong_dtype",
                ..
            }
        ),
        "{e}"
    );
}

/// Backward writes an elementwise op's gradient over the incoming one when it holds the only
/// claim on it; it must never do so over a gradient someone else can still see.
#[test]
fn in_place_gradients_never_overwrite_shared_ones() {
    let close = |a: &[f64], b: &[f64]| {
        a.len() == b.len() && a.iter().zip(b).all(|(p, q)| (p - q).abs() < 1e-12)
    };
    let xs = [0.3f64, -1.1, 0.8];
    let g = Graph::new();

    // A seed passed by the caller is left as it was.
    let x = g.leaf(&xs, &[3], DType::F64).unwrap();
    let seed = g.from_f64(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    x.tanh()
        .unwrap()
        .exp()
        .unwrap()
        .backward_with(BackwardOptions {
            grad: Some(seed),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(v(seed), vec![1.0, 2.0, 3.0]);
    let want: Vec<f64> = xs
        .iter()
        .zip([1.0, 2.0, 3.0])
        .map(|(&x, s)| s * x.tanh().exp() * (1.0 - x.tanh().powi(2)))
        .collect();
    assert!(close(&v(x.grad().unwrap().unwrap()), &want));

    // One gradient reaching two branches (add passes it through to both).
    let x = g.leaf(&xs, &[3], DType::F64).unwrap();
    let a = x.scale(2.0).unwrap();
    let l = a.tanh().unwrap().add(a.sin().unwrap()).unwrap();
    l.sum().unwrap().backward().unwrap();
    let want: Vec<f64> = xs
        .iter()
        .map(|&x| 2.0 * (1.0 - (2.0 * x).tanh().powi(2)) + 2.0 * (2.0 * x).cos())
        .collect();
    assert!(close(&v(x.grad().unwrap().unwrap()), &want));

    // A retained intermediate gradient keeps its value while backward goes on below it, and a
    // reshape's gradient (a view of the incoming one) is not written through.
    let x = g.leaf(&xs, &[3], DType::F64).unwrap();
    let h = x.exp().unwrap();
    h.retain_grad().unwrap();
    let r = h.reshape(&[3, 1]).unwrap().sigmoid().unwrap();
    r.sum().unwrap().backward().unwrap();
    let sig = |t: f64| 1.0 / (1.0 + (-t).exp());
    let gh: Vec<f64> = xs
        .iter()
        .map(|&x| sig(x.exp()) * (1.0 - sig(x.exp())))
        .collect();
    assert!(close(&v(h.grad().unwrap().unwrap()), &gh));
    let gx: Vec<f64> = xs.iter().zip(&gh).map(|(&x, g)| g * x.exp()).collect();
    assert!(close(&v(x.grad().unwrap().unwrap()), &gx));

    // `grad` hands back a captured gradient that later steps must not change.
    let x = g.leaf(&xs, &[3], DType::F64).unwrap();
    let m = x.scale(3.0).unwrap();
    let out = m.tanh().unwrap().sum().unwrap();
    let got = grad(out, &[m, x], BackwardOptions::default()).unwrap();
    let gm: Vec<f64> = xs.iter().map(|&x| 1.0 - (3.0 * x).tanh().powi(2)).collect();
    assert!(close(&v(got[0].unwrap()), &gm));
    let gx: Vec<f64> = gm.iter().map(|g| 3.0 * g).collect();
    assert!(close(&v(got[1].unwrap()), &gx));
}

/// Parameters enter an iteration without a copy and take their gradients without one.
#[test]
fn parameters_are_read_in_place_and_gradients_go_straight_in() {
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(p, q)| (p - q).abs() < 1e-12);
    let w = Parameter::new(
        "w",
        HostTensor::new(vec![1.0f64, -2.0, 0.5, 3.0, 0.25, -1.0], &[2, 3]).unwrap(),
    );
    let xs = [0.5f64, -1.0, 2.0, 1.5];
    // d/dW sum(x·W) = xᵀ·1, by hand.
    let want: Vec<f64> = (0..6)
        .map(|e| {
            let r = e / 3;
            xs[r] + xs[2 + r]
        })
        .collect();
    let mut g = Graph::new();
    {
        let x = g.from_f64(&xs, &[2, 2], DType::F64).unwrap();
        let wt = g.param(&w).unwrap();
        let loss = x.matmul(wt).unwrap().sum().unwrap();
        let before = g.stats().arena.bytes_in_use;
        loss.backward().unwrap();
        // The weight gradient took no arena memory beyond the backward's own temporaries.
        assert_eq!(
            g.stats().arena.bytes_in_use,
            before,
            "weight gradient left in the arena"
        );
        assert!(close(&w.grad().unwrap().to_f64_vec(), &want));
        // The leaf answers with the parameter's gradient.
        assert!(close(&v(wt.grad().unwrap().unwrap()), &want));
        // `grad` returns gradients and leaves the parameter's alone.
        let y2 = x.matmul(wt).unwrap().sum().unwrap();
        let got = grad(y2, &[wt], BackwardOptions::default()).unwrap();
        assert!(close(&v(got[0].unwrap()), &want));
        assert!(close(&w.grad().unwrap().to_f64_vec(), &want));
        // An update while the graph still reads the value copies it: the graph keeps the old.
        w.update(|mut v, _| v.as_mut_slice::<f64>().unwrap()[0] = 100.0);
        assert_eq!(v(wt)[0], 1.0);
        assert_eq!(w.value().to_f64_vec()[0], 100.0);
        // Zeroing through the leaf zeroes the parameter.
        wt.zero_grad().unwrap();
        assert!(w.grad().is_none() && wt.grad().unwrap().is_none());
    }
    g.reset();
    // A second iteration accumulates into the same storage.
    for _ in 0..2 {
        let x = g.from_f64(&xs, &[2, 2], DType::F64).unwrap();
        let wt = g.param(&w).unwrap();
        x.matmul(wt).unwrap().sum().unwrap().backward().unwrap();
        g.reset();
    }
    let twice: Vec<f64> = want.iter().map(|v| 2.0 * v).collect();
    assert!(close(&w.grad().unwrap().to_f64_vec(), &twice));
}

#[test]
fn a_checkpoint_whose_second_run_panics_leaves_the_generator_where_it_was() {
    // The block draws dropout; its second run (in backward) panics. The generator was rewound
    // for that run: left rewound, later draws repeated earlier ones.
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = runs.clone();
    let block: arenagrad_graph::CheckpointFn = Arc::new(move |_g, x| {
        if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            panic!("the block's second run fails");
        }
        x[0].dropout(0.5, true)?.tanh()
    });
    let g = Graph::new();
    g.seed(7);
    let x = g.leaf(&[0.5; 16], &[16], DType::F64).unwrap();
    let y = g.checkpoint(block, &[x]).unwrap();
    let loss = y.sum().unwrap();
    let first = g.rand(&[8], DType::F64).unwrap().to_vec_f64().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loss.backward()));
    assert!(r.is_err(), "the second run panicked");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    let next = g.rand(&[8], DType::F64).unwrap().to_vec_f64().unwrap();
    // Where an unbroken generator would be: the same seed, the same draws, then `next`.
    let h = Graph::new();
    h.seed(7);
    let hx = h.leaf(&[0.5; 16], &[16], DType::F64).unwrap();
    let _ = hx.dropout(0.5, true).unwrap().tanh().unwrap();
    assert_eq!(
        h.rand(&[8], DType::F64).unwrap().to_vec_f64().unwrap(),
        first
    );
    assert_eq!(
        h.rand(&[8], DType::F64).unwrap().to_vec_f64().unwrap(),
        next
    );
    assert_ne!(next, first);
    // And grad mode is as it was.
    assert!(g.is_grad_enabled());
}

#[test]
fn errors_name_the_op_the_user_called() {
    // Ops built of others reported the inner op's name (`max`, `where`, `concat`).
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64).unwrap();
    let e = g.zeros(&[2, 0], DType::F64).unwrap();
    let m3 = g.from_f64(&[1.0, 0.0, 1.0], &[3], DType::Bool).unwrap();
    let x32 = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32)
        .unwrap();
    let op_of = |r: arenagrad_graph::Result<Tensor<'_>>| match r {
        Err(GraphError::BadAxis { op, .. })
        | Err(GraphError::RepeatedAxis { op, .. })
        | Err(GraphError::BadArgument { op, .. })
        | Err(GraphError::DTypeMismatch { op, .. })
        | Err(GraphError::ShapeMismatch { op, .. }) => op,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(op_of(x.logsumexp(&[2], false)), "logsumexp");
    assert_eq!(op_of(x.logsumexp(&[1, -1], false)), "logsumexp");
    assert_eq!(op_of(e.norm(f64::INFINITY, &[1], false)), "norm");
    assert_eq!(op_of(e.norm(f64::INFINITY, &[], false)), "norm");
    assert_eq!(op_of(x.masked_fill(m3, 0.0)), "masked_fill");
    assert_eq!(op_of(g.stack(&[x, x32], 0)), "stack");
    assert_eq!(op_of(g.stack(&[x, x], 3)), "stack");
    assert!(matches!(
        g.stack(&[x, e], 0),
        Err(GraphError::ShapeMismatch { op: "stack", .. })
    ));
}

#[test]
fn reshape_of_an_empty_tensor_refuses_extents_zeros_refuses() {
    // [0, 2^62, 2^62] holds no element, but its strides overflow: zeros refuses it, and so
    // must a reshape into it (which made it).
    let g = Graph::new();
    let e = g.zeros(&[0, 3], DType::F32).unwrap();
    let huge = 1usize << 62;
    assert!(matches!(
        g.zeros(&[0, huge, huge], DType::F32),
        Err(GraphError::TooLarge { op: "full", .. })
    ));
    match e.reshape(&[0, huge as isize, huge as isize]) {
        Err(GraphError::TooLarge { op, shape }) => {
            assert_eq!(op, "reshape");
            assert_eq!(shape, [0, huge, huge]);
        }
        other => panic!("{other:?}"),
    }
    // What zeros accepts, a reshape accepts.
    let big = 1usize << 40;
    assert!(g.zeros(&[0, big], DType::F32).is_ok());
    assert_eq!(
        e.reshape(&[0, big as isize]).unwrap().shape().as_slice(),
        &[0, big]
    );
    assert_eq!(e.shape().as_slice(), &[0, 3]);
}

/// Slices of one tensor (a fused projection's queries, keys and values) add their gradients
/// into the one their input already holds: overlapping and disjoint slices give the summed
/// gradient, in every dtype, and backward holds no zeroed full-size gradient per slice.
#[test]
fn slice_gradients_add_into_the_gradient_already_there() {
    for dtype in [DType::F64, DType::F32, DType::BF16] {
        let mut g = Graph::new();
        // Thin slices of many rows: each slice's own pieces are small beside the full gradient.
        let (rows, cols) = if cfg!(miri) { (64, 16) } else { (64, 1024) };
        let vals: Vec<f64> = (0..rows * cols).map(|k| (k % 7) as f64 * 0.5).collect();
        let x = g.leaf(&vals, &[rows, cols], dtype).unwrap();
        let x = x.set_requires_grad(true).unwrap();
        // Rows 0..2 weighted 1, rows 2..4 weighted 2, rows 1..5 weighted 3 (overlapping the
        // first two), rows 4..6 never read but through the last slice.
        let parts = [(0, 2, 1.0), (2, 4, 2.0), (1, 5, 3.0)];
        let mut loss: Option<Tensor<'_>> = None;
        for &(a, b, w) in &parts {
            let s = x.slice(0, a, b).unwrap().scale(w).unwrap().sum().unwrap();
            loss = Some(match loss {
                None => s,
                Some(l) => l.add(s).unwrap(),
            });
        }
        let loss = loss.unwrap();
        g.reset_peak_stats();
        let before = g.stats().arena.bytes_in_use;
        loss.backward().unwrap();
        let grad = x.grad().unwrap().unwrap().to_vec_f64().unwrap();
        for r in 0..rows {
            let want: f64 = parts
                .iter()
                .filter(|&&(a, b, _)| (a..b).contains(&r))
                .map(|&(_, _, w)| w)
                .sum();
            assert!(
                grad[r * cols..(r + 1) * cols].iter().all(|&v| v == want),
                "{dtype:?}: row {r} of the gradient is not {want}"
            );
        }
        // One full-size gradient (the first slice's), the others added into it: never two
        // full ones at once (the per-slice pieces are each at most 4 of the 64 rows).
        let full = rows * cols * dtype.size();
        let grown = g.stats().arena.peak_bytes_in_use - before;
        assert!(
            grown < 2 * full,
            "{dtype:?}: backward grew the arena by {grown} bytes for a {full}-byte gradient"
        );
        g.reset();
    }
}

/// `x·x` with one tensor on both sides: its gradient is PyTorch's `g·x + g·x` (two edges into
/// `x`, accumulated), bit for bit, also where `g·x` is subnormal or near overflow, in f32 and
/// bf16; and the same as multiplying `x` by a second leaf holding its values.
#[test]
fn a_square_by_mul_has_the_gradient_of_its_two_edges() {
    let xs = [1.5, -3.25, 1e-20, 3.0e38, -0.0, 7.0, 1e-30, -2.5e-3];
    let ws = [0.7, 1.3, 1e-25, 1.0, 2.0, -0.1, 3.0e-9, 11.0];
    for dtype in [DType::F32, DType::BF16] {
        let g = Graph::new();
        let x = g.leaf(&xs, &[8], dtype).unwrap();
        let w = g.from_f64(&ws, &[8], dtype).unwrap();
        let loss = x.mul(x).unwrap().mul(w).unwrap().sum().unwrap();
        let got = grad(loss, &[x], BackwardOptions::default()).unwrap()[0]
            .unwrap()
            .to_vec_f64()
            .unwrap();
        // By hand: each edge's g·x rounded to the dtype, then their sum rounded.
        let (wr, xr) = (w.to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
        let round = |v: f64| match dtype {
            DType::BF16 => f64::from(arenagrad_graph::bf16::from_f32(v as f32).to_f32()),
            _ => f64::from(v as f32),
        };
        let want: Vec<f64> = wr
            .iter()
            .zip(&xr)
            .map(|(&w, &x)| {
                let e = round(w * x);
                round(e + e)
            })
            .collect();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{dtype:?}");
        // The same values through two leaves: each gets one edge, `g·x`.
        let y = g.leaf(&xs, &[8], dtype).unwrap();
        let loss = x.mul(y).unwrap().mul(w).unwrap().sum().unwrap();
        let gs = grad(loss, &[x, y], BackwardOptions::default()).unwrap();
        let (gx, gy) = (gs[0].unwrap(), gs[1].unwrap());
        let two = gx.add(gy).unwrap().to_vec_f64().unwrap();
        assert_eq!(bits(&two), bits(&got), "{dtype:?}, two leaves");
    }
}
