//! Optimisers against hand-computed updates on scalars, plus clipping and schedules.

use arenagrad_nn::optim::{
    clip_grad_norm, clip_grad_value, Adam, AdamConfig, AdamW, CosineAnnealingLr, LrSchedule,
    Optimizer, ParamGroup, RmsProp, RmsPropConfig, Sgd, SgdConfig, StepLr, WarmupCosineLr,
};
use arenagrad_nn::{Graph, HostTensor, NnError, Parameter};

fn scalar(v: f64) -> Parameter {
    Parameter::new("p", HostTensor::new(vec![v], &[1]).unwrap())
}

fn scalar32(v: f32) -> Parameter {
    Parameter::new("p", HostTensor::new(vec![v], &[1]).unwrap())
}

fn value(p: &Parameter) -> f64 {
    p.value().to_f64_vec()[0]
}

/// Accumulates the gradient of `p²` (that is, `2p`).
fn backward_square(p: &Parameter) {
    let g = Graph::new();
    let t = g.param(p).unwrap();
    t.square().unwrap().sum().unwrap().backward().unwrap();
}

/// Accumulates the gradient of `c·p` (that is, `c`).
fn backward_linear(p: &Parameter, c: f64) {
    let g = Graph::new();
    let t = g.param(p).unwrap();
    t.scale(c).unwrap().sum().unwrap().backward().unwrap();
}

fn run(opt: &mut dyn Optimizer, p: &Parameter, steps: usize, grad: fn(&Parameter)) -> Vec<f64> {
    (0..steps)
        .map(|_| {
            opt.zero_grad();
            grad(p);
            opt.step().unwrap();
            value(p)
        })
        .collect()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

#[test]
fn sgd_plain_and_weight_decay() {
    let p = scalar(1.0);
    let mut opt = Sgd::new([p.clone()], SgdConfig::new(0.1)).unwrap();
    // p ← p − 0.1·2p = 0.8p
    close(
        &run(&mut opt, &p, 3, backward_square),
        &[0.8, 0.64, 0.512],
        1e-15,
    );
    let p = scalar(1.0);
    let mut opt = Sgd::new([p.clone()], SgdConfig::new(0.1).weight_decay(0.1)).unwrap();
    // d = 2p + 0.1p; p ← p − 0.21p = 0.79p
    close(
        &run(&mut opt, &p, 2, backward_square),
        &[0.79, 0.6241],
        1e-15,
    );
}

/// A parameter large enough to be split across threads takes the same step in every element,
/// at every chunk's seam: the gradient of `Σ p²` is `2p`, so `p ← p − lr·(2p + wd·p)`.
#[test]
fn a_large_parameter_split_across_threads_takes_every_elements_own_step() {
    let n = 300_001;
    let init: Vec<f64> = (0..n).map(|i| (i % 1000) as f64 / 1000.0 - 0.5).collect();
    let p = Parameter::new("p", HostTensor::new(init.clone(), &[n]).unwrap());
    let mut opt = Sgd::new([p.clone()], SgdConfig::new(0.1).weight_decay(0.01)).unwrap();
    opt.zero_grad();
    backward_square(&p);
    opt.step().unwrap();
    let got = p.value().to_f64_vec();
    for (i, (&v, &x)) in got.iter().zip(&init).enumerate() {
        assert_eq!(v, x - 0.1 * (2.0 * x + 0.01 * x), "element {i}");
    }
}

#[test]
fn sgd_groups_take_their_own_rate_and_decay_and_follow_a_schedule() {
    let (a, b) = (scalar(1.0), scalar(1.0));
    let groups = [
        ParamGroup::new([a.clone()]),
        ParamGroup::new([b.clone()]).lr(0.2).weight_decay(0.0),
    ];
    let mut opt = Sgd::with_groups(groups, SgdConfig::new(0.1).weight_decay(0.1)).unwrap();
    for p in [&a, &b] {
        backward_square(p);
    }
    opt.step().unwrap();
    // a: d = 2a + 0.1a, a ← a − 0.1·2.1a = 0.79; b: b ← b − 0.2·2b = 0.6.
    close(&[value(&a), value(&b)], &[0.79, 0.6], 1e-15);
    // A schedule halving the optimiser's rate halves each group's.
    opt.set_learning_rate(0.05).unwrap();
    assert_eq!(opt.group_options(1), (0.1, 0.0));
    opt.zero_grad();
    backward_square(&b);
    opt.step().unwrap();
    close(&[value(&b)], &[0.6 - 0.1 * 1.2], 1e-15);
    // A parameter in two groups is refused by name.
    let twice = [ParamGroup::new([a.clone()]), ParamGroup::new([a.clone()])];
    let e = Sgd::with_groups(twice, SgdConfig::new(0.1)).unwrap_err();
    assert!(e.to_string().starts_with("Sgd"), "{e}");
}

#[test]
fn sgd_momentum_by_hand() {
    let p = scalar(1.0);
    let mut opt = Sgd::new([p.clone()], SgdConfig::new(0.1).momentum(0.9)).unwrap();
    // g=2, b=2, p=0.8; g=1.6, b=3.4, p=0.46; g=0.92, b=3.98, p=0.062
    close(
        &run(&mut opt, &p, 3, backward_square),
        &[0.8, 0.46, 0.062],
        1e-15,
    );
    close(
        &opt.momentum_buffer(0).unwrap().to_f64_vec(),
        &[3.98],
        1e-15,
    );
}

#[test]
fn sgd_nesterov_by_hand() {
    let p = scalar(1.0);
    let mut opt = Sgd::new(
        [p.clone()],
        SgdConfig::new(0.1).momentum(0.9).nesterov(true),
    )
    .unwrap();
    // g=2, b=2, d=2+1.8=3.8, p=0.62; g=1.24, b=3.04, d=1.24+2.736=3.976, p=0.2224
    close(
        &run(&mut opt, &p, 2, backward_square),
        &[0.62, 0.2224],
        1e-15,
    );
}

#[test]
fn sgd_dampening_and_weight_decay_with_momentum() {
    let p = scalar(1.0);
    let mut opt = Sgd::new(
        [p.clone()],
        SgdConfig::new(0.1).momentum(0.9).dampening(0.5),
    )
    .unwrap();
    // The first buffer is the gradient undamped: b=2, p=0.8; g=1.6, b=1.8+0.8=2.6, p=0.54
    close(&run(&mut opt, &p, 2, backward_square), &[0.8, 0.54], 1e-15);
    let p = scalar(1.0);
    let mut opt = Sgd::new(
        [p.clone()],
        SgdConfig::new(0.1).momentum(0.5).weight_decay(0.5),
    )
    .unwrap();
    // d = 2p + 0.5p = 2.5p. d=2.5, b=2.5, p=0.75; d=1.875, b=1.25+1.875=3.125, p=0.4375
    close(
        &run(&mut opt, &p, 2, backward_square),
        &[0.75, 0.4375],
        1e-15,
    );
}

#[test]
fn sgd_bad_options_are_typed() {
    for cfg in [
        SgdConfig::new(-0.1),
        SgdConfig::new(f64::NAN),
        SgdConfig::new(0.1).nesterov(true),
        SgdConfig::new(0.1)
            .momentum(0.9)
            .dampening(0.1)
            .nesterov(true),
        SgdConfig::new(0.1).weight_decay(-1.0),
    ] {
        assert!(matches!(
            Sgd::new([scalar(1.0)], cfg),
            Err(NnError::InvalidConfig {
                component: "Sgd",
                ..
            })
        ));
    }
}

/// Textbook Adam, written independently of the implementation.
// The textbook's hyperparameters spelled out, independent of the crate's config types.
#[allow(clippy::too_many_arguments)]
fn adam_reference(
    p0: f64,
    grads: impl Fn(f64) -> f64,
    lr: f64,
    (b1, b2): (f64, f64),
    eps: f64,
    wd: f64,
    decoupled: bool,
    steps: usize,
) -> Vec<f64> {
    let (mut p, mut m, mut v) = (p0, 0.0, 0.0);
    let mut out = vec![];
    for t in 1..=steps {
        let mut g = grads(p);
        if decoupled {
            p *= 1.0 - lr * wd;
        } else {
            g += wd * p;
        }
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        let mh = m / (1.0 - b1.powi(t as i32));
        let vh = v / (1.0 - b2.powi(t as i32));
        p -= lr * mh / (vh.sqrt() + eps);
        out.push(p);
    }
    out
}

#[test]
fn adam_by_hand() {
    let p = scalar(1.0);
    let mut opt = Adam::new([p.clone()], AdamConfig::new(0.1)).unwrap();
    let got = run(&mut opt, &p, 3, backward_square);
    // Step 1: m̂ = g, v̂ = g², so p = 1 − 0.1·2/(2 + 1e-8).
    assert!((got[0] - (1.0 - 0.1 * 2.0 / (2.0 + 1e-8))).abs() < 1e-15);
    // Step 2 by hand: g = 1.8, m = 0.36, v = 0.007236, m̂ = 0.36/0.19, v̂ = 0.007236/0.001999.
    let p1 = got[0];
    let g2 = 2.0 * p1;
    let m2 = 0.9 * 0.2 + 0.1 * g2;
    let v2 = 0.999 * 0.004 + 0.001 * g2 * g2;
    let p2 = p1 - 0.1 * (m2 / 0.19) / ((v2 / 0.001_999).sqrt() + 1e-8);
    assert!((got[1] - p2).abs() < 1e-13, "{} vs {p2}", got[1]);
    let want = adam_reference(1.0, |p| 2.0 * p, 0.1, (0.9, 0.999), 1e-8, 0.0, false, 3);
    close(&got, &want, 1e-13);
    let st = opt.state(0).unwrap();
    assert_eq!(st.step, 3);
    assert!(st.max_exp_avg_sq.is_none());
}

#[test]
fn adam_constant_gradient_moves_lr_per_step() {
    let p = scalar(1.0);
    let mut opt = Adam::new([p.clone()], AdamConfig::new(0.1)).unwrap();
    let got = run(&mut opt, &p, 3, |p| backward_linear(p, 1.0));
    // With a constant gradient m̂ = v̂ = 1: each step moves lr/(1 + eps).
    let s = 0.1 / (1.0 + 1e-8);
    close(&got, &[1.0 - s, 1.0 - 2.0 * s, 1.0 - 3.0 * s], 1e-12);
}

#[test]
fn adam_l2_weight_decay_and_amsgrad() {
    let p = scalar(1.0);
    let mut opt = Adam::new([p.clone()], AdamConfig::new(0.05).weight_decay(0.1)).unwrap();
    let got = run(&mut opt, &p, 3, backward_square);
    let want = adam_reference(1.0, |p| 2.0 * p, 0.05, (0.9, 0.999), 1e-8, 0.1, false, 3);
    close(&got, &want, 1e-13);
    // AMSGrad with a shrinking gradient: v̂ uses the running maximum of v.
    let p = scalar(1.0);
    let mut opt = Adam::new(
        [p.clone()],
        AdamConfig::new(0.1).betas(0.5, 0.5).amsgrad(true),
    )
    .unwrap();
    let got = run(&mut opt, &p, 2, backward_square);
    // step 1: g=2, m=1, v=2, vmax=2; m̂=2, v̂=4: p = 1 − 0.1·2/(2+ε) ≈ 0.9
    // step 2: g=1.8, m=1.4, v=0.5·2+0.5·3.24=2.62, vmax=2.62; m̂=1.4/0.75, v̂=2.62/0.75
    let p1: f64 = 1.0 - 0.1 * 2.0 / (2.0 + 1e-8);
    let g2 = 2.0 * p1;
    let (m2, v2) = (0.5 + 0.5 * g2, 1.0 + 0.5 * g2 * g2);
    let p2 = p1 - 0.1 * (m2 / 0.75) / ((v2 / 0.75).sqrt() + 1e-8);
    close(&got, &[p1, p2], 1e-13);
    // A gradient that drops: the maximum is kept, so the step is smaller than plain Adam's.
    let q = scalar(1.0);
    let mut ams = Adam::new([q.clone()], AdamConfig::new(0.1).amsgrad(true)).unwrap();
    let r = scalar(1.0);
    let mut plain = Adam::new([r.clone()], AdamConfig::new(0.1)).unwrap();
    for c in [10.0, 0.1] {
        for (o, x) in [(&mut ams, &q), (&mut plain, &r)] {
            o.zero_grad();
            backward_linear(x, c);
            o.step().unwrap();
        }
    }
    assert!(value(&q) > value(&r));
}

/// A parameter large enough for its update to be split across threads, next to the same values
/// and gradients as parameters too small to split: AdamW (with weight decay) and Adam with L2
/// decay give them the same bits, step after step. On one thread too the check runs, and the
/// chunks' offsets of values, gradients and moments must agree for it to pass.
#[test]
fn a_large_parameter_updated_on_threads_has_the_bits_of_small_ones() {
    let (n, small) = (300_007usize, 997usize);
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 1001) as f32 - 500.0) * 1e-3)
        .collect();
    let grads: Vec<f32> = (0..n)
        .map(|i| ((i * 53 % 997) as f32 - 498.0) * 1e-4)
        .collect();
    let pieces = |v: &[f32]| -> Vec<HostTensor> {
        v.chunks(small)
            .map(|c| HostTensor::new(c.to_vec(), &[c.len()]).unwrap())
            .collect()
    };
    for decoupled in [true, false] {
        let big = Parameter::new("big", HostTensor::new(values.clone(), &[n]).unwrap());
        let parts: Vec<Parameter> = pieces(&values)
            .into_iter()
            .map(|t| Parameter::new("part", t))
            .collect();
        let cfg = AdamConfig::new(1e-2).weight_decay(0.1);
        let (mut a, mut b): (Box<dyn Optimizer>, Box<dyn Optimizer>) = if decoupled {
            (
                Box::new(AdamW::new([big.clone()], cfg).unwrap()),
                Box::new(AdamW::new(parts.clone(), cfg).unwrap()),
            )
        } else {
            (
                Box::new(Adam::new([big.clone()], cfg).unwrap()),
                Box::new(Adam::new(parts.clone(), cfg).unwrap()),
            )
        };
        for step in 0..3 {
            // A gradient that changes from step to step.
            let g: Vec<f32> = grads.iter().map(|&x| x * (step + 1) as f32).collect();
            big.set_grad(Some(HostTensor::new(g.clone(), &[n]).unwrap()))
                .unwrap();
            for (p, t) in parts.iter().zip(pieces(&g)) {
                p.set_grad(Some(t)).unwrap();
            }
            a.step().unwrap();
            b.step().unwrap();
        }
        let got = big.value().to_f64_vec();
        let want: Vec<f64> = parts.iter().flat_map(|p| p.value().to_f64_vec()).collect();
        assert_eq!(got.len(), want.len());
        let differ = got
            .iter()
            .zip(&want)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(differ, 0, "decoupled {decoupled}: {differ} values differ");
        assert!(got.iter().zip(&values).any(|(x, &v)| *x != f64::from(v)));
    }
}

#[test]
fn adamw_by_hand() {
    let p = scalar(1.0);
    let mut opt = AdamW::new([p.clone()], AdamConfig::new(0.1).weight_decay(0.1)).unwrap();
    let got = run(&mut opt, &p, 3, |p| backward_linear(p, 1.0));
    // p·(1 − 0.01) − 0.1/(1 + ε) each step
    let s = 0.1 / (1.0 + 1e-8);
    let p1 = 0.99 - s;
    let p2 = p1 * 0.99 - s;
    let p3 = p2 * 0.99 - s;
    close(&got, &[p1, p2, p3], 1e-12);
    assert!((got[2] - 0.673_289).abs() < 1e-6);
    let p = scalar(1.0);
    let mut opt = AdamW::new([p.clone()], AdamConfig::adamw(0.01)).unwrap();
    assert_eq!(opt.config().weight_decay, 0.01);
    let got = run(&mut opt, &p, 3, backward_square);
    let want = adam_reference(1.0, |p| 2.0 * p, 0.01, (0.9, 0.999), 1e-8, 0.01, true, 3);
    close(&got, &want, 1e-13);
}

#[test]
fn optimisers_work_on_f32_parameters() {
    let p = scalar32(1.0);
    let mut opt = Sgd::new([p.clone()], SgdConfig::new(0.1).momentum(0.9)).unwrap();
    let got = run(&mut opt, &p, 3, backward_square);
    close(&got, &[0.8, 0.46, 0.062], 1e-6);
    assert_eq!(p.dtype(), arenagrad_nn::DType::F32);
    let p = scalar32(1.0);
    let mut opt = Adam::new([p.clone()], AdamConfig::new(0.1)).unwrap();
    let got = run(&mut opt, &p, 3, backward_square);
    let want = adam_reference(1.0, |p| 2.0 * p, 0.1, (0.9, 0.999), 1e-8, 0.0, false, 3);
    close(&got, &want, 1e-6);
    assert_eq!(
        opt.state(0).unwrap().exp_avg.dtype(),
        arenagrad_nn::DType::F32,
        "state is kept in the parameter's dtype"
    );
}

#[test]
fn parameters_without_gradients_are_skipped_and_shared_ones_updated_once() {
    let (a, b) = (scalar(1.0), scalar(1.0));
    let mut opt = Sgd::new(
        [a.clone(), b.clone(), a.clone()],
        SgdConfig::new(0.1).weight_decay(0.5),
    )
    .unwrap();
    assert_eq!(opt.parameters().len(), 2);
    backward_square(&a);
    opt.step().unwrap();
    assert!((value(&a) - (1.0 - 0.1 * 2.5)).abs() < 1e-15);
    assert_eq!(
        value(&b),
        1.0,
        "no gradient, no update (not even weight decay)"
    );
    opt.zero_grad();
    assert!(a.grad().is_none());
    opt.set_learning_rate(0.5).unwrap();
    assert_eq!(opt.learning_rate(), 0.5);
}

#[test]
fn clipping() {
    let a = Parameter::new("a", HostTensor::new(vec![3.0f64], &[1]).unwrap());
    let b = Parameter::new("b", HostTensor::new(vec![4.0f32], &[1]).unwrap());
    let none = Parameter::new("n", HostTensor::new(vec![1.0f64], &[1]).unwrap());
    backward_linear(&a, 3.0);
    backward_linear(&b, 4.0);
    let ps = [a.clone(), b.clone(), none.clone()];
    let n = clip_grad_norm(&ps, 10.0).unwrap();
    assert_eq!(n, 5.0);
    assert_eq!(
        a.grad().unwrap().to_f64_vec(),
        vec![3.0],
        "under the limit: untouched"
    );
    let n = clip_grad_norm(&ps, 1.0).unwrap();
    assert_eq!(n, 5.0);
    let k = 1.0 / (5.0 + 1e-6);
    assert!((a.grad().unwrap().to_f64_vec()[0] - 3.0 * k).abs() < 1e-15);
    assert!((b.grad().unwrap().to_f64_vec()[0] - 4.0 * k).abs() < 1e-6);
    assert!(none.grad().is_none());
    clip_grad_value(&ps, 0.5).unwrap();
    assert_eq!(a.grad().unwrap().to_f64_vec(), vec![0.5]);
    assert!(clip_grad_norm(&ps, -1.0).is_err());
}

#[test]
fn schedules() {
    let s = StepLr::new(1.0, 2, 0.5).unwrap();
    let lrs: Vec<f64> = (0..6).map(|e| s.lr_at(e)).collect();
    assert_eq!(lrs, vec![1.0, 1.0, 0.5, 0.5, 0.25, 0.25]);
    let c = CosineAnnealingLr::new(1.0, 4, 0.2).unwrap();
    let lrs: Vec<f64> = (0..=4).map(|e| c.lr_at(e)).collect();
    let half = std::f64::consts::FRAC_1_SQRT_2;
    close(
        &lrs,
        &[
            1.0,
            0.2 + 0.8 * (1.0 + half) / 2.0,
            0.6,
            0.2 + 0.8 * (1.0 - half) / 2.0,
            0.2,
        ],
        1e-15,
    );
    let mut opt = Adam::new([scalar(0.0)], AdamConfig::new(1.0)).unwrap();
    assert_eq!(s.apply(&mut opt, 4).unwrap(), 0.25);
    assert_eq!(opt.learning_rate(), 0.25);
    assert!(StepLr::new(1.0, 0, 0.5).is_err());
    assert!(CosineAnnealingLr::new(1.0, 0, 0.0).is_err());
}

#[test]
fn param_groups_equal_one_optimiser_per_group() {
    // AdamW over two groups (weight decay 0.1 and 0, the second at twice the rate) against two
    // AdamW optimisers, one per group, with those options; then a schedule moves both rates.
    let make = || (scalar(1.5), scalar(-0.7));
    let (a, b) = make();
    let (c, d) = make();
    let mut grouped = AdamW::with_groups(
        [
            ParamGroup::new([a.clone()]),
            ParamGroup::new([b.clone()]).weight_decay(0.0).lr(0.2),
        ],
        AdamConfig::adamw(0.1).weight_decay(0.1),
    )
    .unwrap();
    let mut first = AdamW::new([c.clone()], AdamConfig::adamw(0.1).weight_decay(0.1)).unwrap();
    let mut second = AdamW::new([d.clone()], AdamConfig::adamw(0.2).weight_decay(0.0)).unwrap();
    assert_eq!(grouped.num_groups(), 2);
    assert_eq!(grouped.group_options(1), (0.2, 0.0));
    for step in 0..5 {
        for p in [&a, &b, &c, &d] {
            p.zero_grad();
            backward_square(p);
        }
        grouped.step().unwrap();
        first.step().unwrap();
        second.step().unwrap();
        assert_eq!(value(&a), value(&c), "step {step}");
        assert_eq!(value(&b), value(&d), "step {step}");
        if step == 2 {
            grouped.set_learning_rate(0.05).unwrap();
            first.set_learning_rate(0.05).unwrap();
            second.set_learning_rate(0.1).unwrap();
            assert_eq!(grouped.group_options(1), (0.1, 0.0));
        }
    }
    assert_ne!(value(&a), 1.5);
}

#[test]
fn a_parameter_in_two_groups_is_refused() {
    let p = scalar(1.0);
    let r = AdamW::with_groups(
        [ParamGroup::new([p.clone()]), ParamGroup::new([p])],
        AdamConfig::adamw(0.1),
    );
    assert!(matches!(r, Err(NnError::InvalidConfig { .. })), "{r:?}");
    let r = Adam::with_groups(
        [ParamGroup::new([scalar(1.0)]).lr(0.1)],
        AdamConfig::new(0.0),
    );
    assert!(matches!(r, Err(NnError::InvalidConfig { .. })), "{r:?}");
}

#[test]
fn warmup_cosine_matches_its_formula_at_the_seams() {
    let s = WarmupCosineLr::new(3e-3, 100, 1000, 3e-4).unwrap();
    assert_eq!(s.lr_at(0), 3e-3 / 100.0);
    assert_eq!(s.lr_at(49), 3e-3 * 0.5);
    assert_eq!(s.lr_at(100), 3e-3);
    let mid = s.lr_at(550);
    assert!((mid - (3e-4 + 2.7e-3 / 2.0)).abs() < 1e-15, "{mid}");
    assert!(s.lr_at(999) > 3e-4 && s.lr_at(999) < 3.001e-4);
    assert_eq!(s.lr_at(1000), 3e-4);
    assert!(WarmupCosineLr::new(1e-3, 10, 5, 0.0).is_err());
    assert!(WarmupCosineLr::new(f64::NAN, 0, 5, 0.0).is_err());
    // A zero warmup starts at the base rate.
    assert_eq!(
        WarmupCosineLr::new(1e-3, 0, 10, 0.0).unwrap().lr_at(0),
        1e-3
    );
}

#[test]
fn set_learning_rate_refuses_what_the_constructors_refuse_and_changes_nothing() {
    type Make = fn(Parameter) -> Box<dyn Optimizer>;
    let makers: [(&str, Make); 3] = [
        ("Sgd", |p| {
            Box::new(Sgd::new([p], SgdConfig::new(0.1)).unwrap())
        }),
        ("Adam", |p| {
            Box::new(Adam::new([p], AdamConfig::new(0.1)).unwrap())
        }),
        ("AdamW", |p| {
            Box::new(AdamW::new([p], AdamConfig::adamw(0.1)).unwrap())
        }),
    ];
    for (name, make) in makers {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.5] {
            // The constructor's error, word for word.
            let want = match name {
                "Sgd" => Sgd::new([scalar(1.0)], SgdConfig::new(bad)).unwrap_err(),
                "Adam" => Adam::new([scalar(1.0)], AdamConfig::new(bad)).unwrap_err(),
                _ => AdamW::new([scalar(1.0)], AdamConfig::adamw(bad)).unwrap_err(),
            };
            let p = scalar(1.0);
            let mut opt = make(p.clone());
            let r = opt.set_learning_rate(bad);
            assert_eq!(
                format!("{r:?}"),
                format!("Err({want:?})"),
                "{name}: set_learning_rate({bad})"
            );
            assert_eq!(opt.learning_rate(), 0.1, "{name}: rate changed by {bad}");
            // The next step still descends at the old rate: a finite value below 1.
            backward_square(&p);
            opt.step().unwrap();
            let v = value(&p);
            assert!(v.is_finite() && v < 1.0, "{name} after {bad}: {v}");
        }
    }
    // A group whose rate is a huge multiple of the optimiser's: a finite optimiser rate that
    // makes the group's infinite is refused too.
    let groups = [ParamGroup::new([scalar(1.0)]).lr(1e300)];
    let mut opt = Sgd::with_groups(groups, SgdConfig::new(1e-10)).unwrap();
    let e = opt.set_learning_rate(1e10).unwrap_err();
    assert!(
        matches!(
            e,
            NnError::InvalidConfig {
                component: "Sgd",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(opt.learning_rate(), 1e-10);
}

/// Adam's state for one scalar parameter after one step, with its step counter set to `step`.
fn adam_state_at(step: u64) -> Vec<(String, HostTensor)> {
    let p = scalar(1.0);
    let mut opt = Adam::new([p.clone()], AdamConfig::new(0.1)).unwrap();
    backward_square(&p);
    opt.step().unwrap();
    let mut state = opt.state_tensors().unwrap();
    let halves = vec![(step >> 32) as f64, (step & 0xffff_ffff) as f64];
    let counter = state.iter_mut().find(|(n, _)| n == "0.step").unwrap();
    counter.1 = HostTensor::new(halves, &[2]).unwrap();
    state
}

#[test]
fn an_adam_step_counter_that_cannot_count_another_step_is_refused() {
    for decoupled in [false, true] {
        let p = scalar(1.0);
        let mut opt: Box<dyn Optimizer> = if decoupled {
            Box::new(AdamW::new([p.clone()], AdamConfig::adamw(0.1)).unwrap())
        } else {
            Box::new(Adam::new([p.clone()], AdamConfig::new(0.1)).unwrap())
        };
        // On load: a counter at u64::MAX, refused; the optimiser keeps its (empty) state.
        let e = opt
            .load_state_tensors(&adam_state_at(u64::MAX))
            .unwrap_err();
        assert!(matches!(e, NnError::InvalidConfig { .. }), "{e}");
        assert!(e.to_string().contains("cannot count another"), "{e}");
        assert_eq!(opt.state_tensors().unwrap().len(), 1, "only the rate");

        // One below loads and steps once; the step after that is refused, nothing written.
        opt.load_state_tensors(&adam_state_at(u64::MAX - 1))
            .unwrap();
        backward_square(&p);
        opt.step().unwrap();
        let after_one = value(&p);
        assert!(after_one.is_finite() && after_one < 1.0, "{after_one}");
        let state = opt.state_tensors().unwrap();
        let e = opt.step().unwrap_err();
        assert!(e.to_string().contains("cannot count another"), "{e}");
        assert_eq!(value(&p), after_one, "written before the error");
        assert_eq!(opt.state_tensors().unwrap(), state);
    }
}

#[test]
fn schedules_refuse_non_finite_rates_and_keep_finite_ones_finite() {
    let inf = f64::INFINITY;
    for (base, gamma) in [(inf, 0.5), (1.0, inf), (f64::NAN, 0.5), (1.0, -1.0)] {
        let e = StepLr::new(base, 2, gamma).unwrap_err();
        assert!(
            matches!(
                e,
                NnError::InvalidConfig {
                    component: "StepLr",
                    ..
                }
            ),
            "{e}"
        );
    }
    for (base, eta_min) in [(inf, 0.0), (1.0, inf), (f64::NAN, 0.0), (1.0, f64::NAN)] {
        let e = CosineAnnealingLr::new(base, 4, eta_min).unwrap_err();
        let ok = matches!(
            e,
            NnError::InvalidConfig {
                component: "CosineAnnealingLr",
                ..
            }
        );
        assert!(ok, "{e}");
    }
    // Finite rates near the top of f64's range give finite rates, as PyTorch's formula would
    // with unbounded reals: (base − η_min)·(1 + cos) overflowed before the halving.
    let big = f64::MAX;
    let c = CosineAnnealingLr::new(big, 4, 0.0).unwrap();
    assert_eq!(c.lr_at(0), big);
    assert_eq!(c.lr_at(2), big / 2.0);
    assert_eq!(c.lr_at(4), 0.0);
    let w = WarmupCosineLr::new(big, 4, 8, 0.0).unwrap();
    assert_eq!(w.lr_at(1), big / 2.0);
    assert_eq!(w.lr_at(4), big);
    assert_eq!(w.lr_at(6), big / 2.0);
    // Ordinary values keep PyTorch's bits.
    let c = CosineAnnealingLr::new(0.1, 7, 0.003).unwrap();
    let want = 0.003 + (0.1 - 0.003) * (1.0 + (std::f64::consts::PI * 3.0 / 7.0).cos()) / 2.0;
    assert_eq!(c.lr_at(3), want);
    // A γ above 1 grows past f64's range: the optimiser refuses the infinite rate.
    let s = StepLr::new(1.0, 1, 2.0).unwrap();
    assert_eq!(s.lr_at(3), 8.0);
    assert_eq!(s.lr_at(2000), inf);
    let mut opt = Sgd::new([scalar(1.0)], SgdConfig::new(0.1)).unwrap();
    assert!(s.apply(&mut opt, 2000).is_err());
    assert_eq!(opt.learning_rate(), 0.1);
    assert_eq!(s.apply(&mut opt, 3).unwrap(), 8.0);
}

/// `got` within 1e-7 of PyTorch's f32 results (given as bits): PyTorch's vectorised f32
/// square root is not correctly rounded (0.5+ ulp; ours is), so a step's update can differ in
/// its last bit — seen on the parameter that starts at 0, where that bit shows.
fn close_f32(got: &[f32], want_bits: &[u32]) {
    let want: Vec<f32> = want_bits.iter().map(|&b| f32::from_bits(b)).collect();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-7, "{got:?} vs {want:?}");
    }
}

/// `got` within 1e-15 of PyTorch's f64 results: its vectorised square root (0.5001 ulp) is
/// not always correctly rounded either, in the last bit.
fn close_f64(got: &[f64], want: &[f64]) {
    for (a, b) in got.iter().zip(want) {
        assert!((a - b).abs() <= 1e-15, "{got:?} vs {want:?}");
    }
}

/// RMSprop against PyTorch 2.15's `torch.optim.RMSprop` (its CPU loop): six steps of given
/// gradients: the parameters within 1e-15 in f64 (most bit for bit), within 1e-7 in f32
/// (PyTorch's square roots are not always correctly rounded; ours are).
fn rmsprop_run<T: arenagrad_graph::HostElem>(
    cfg: RmsPropConfig,
    from: &[T],
    grad: impl Fn(usize, usize) -> T,
) -> Vec<T> {
    let p = Parameter::new("p", HostTensor::new(from.to_vec(), &[from.len()]).unwrap());
    let mut opt = RmsProp::new([p.clone()], cfg).unwrap();
    for k in 0..6 {
        let g: Vec<T> = (0..from.len()).map(|i| grad(k, i)).collect();
        p.set_grad(Some(HostTensor::new(g, &[from.len()]).unwrap()))
            .unwrap();
        opt.step().unwrap();
    }
    p.value().as_slice::<T>().unwrap().to_vec()
}

#[test]
fn rmsprop_defaults_matches_pytorch() {
    let cfg = RmsPropConfig::new(0.01);
    let f32s = rmsprop_run(cfg, &[0.5f32, -1.25, 2.0, 0.0, 3.5], |k, i| {
        (((k + i) as f64).sin() * (i + 1) as f64) as f32
    });
    close_f32(
        &f32s,
        &[1054376080, 3215446643, 1073660549, 3149206392, 1080338843],
    );
    let f64s = rmsprop_run(cfg, &[0.5f64, -1.25, 2.0, 0.0, 3.5], |k, i| {
        ((k + i) as f64).sin() * (i + 1) as f64
    });
    close_f64(
        &f64s,
        &[
            0.4228558419147626,
            -1.3111098856370202,
            1.9903111350421416,
            -0.0055260140906818675,
            3.572851667971438,
        ],
    );
}

#[test]
fn rmsprop_momentum_matches_pytorch() {
    let cfg = RmsPropConfig::new(0.01).momentum(0.9);
    let f32s = rmsprop_run(cfg, &[0.5f32, -1.25, 2.0, 0.0, 3.5], |k, i| {
        (((k + i) as f64).sin() * (i + 1) as f64) as f32
    });
    close_f32(
        &f32s,
        &[3172828402, 3219511855, 1072518609, 1039111703, 1082355648],
    );
    let f64s = rmsprop_run(cfg, &[0.5f64, -1.25, 2.0, 0.0, 3.5], |k, i| {
        ((k + i) as f64).sin() * (i + 1) as f64
    });
    close_f64(
        &f64s,
        &[
            -0.03845686875692846,
            -1.7957210952112717,
            1.8541814898307747,
            0.11698549386618151,
            4.107391761814837,
        ],
    );
}

#[test]
fn rmsprop_centered_decay_matches_pytorch() {
    let cfg = RmsPropConfig::new(0.01).centered(true).weight_decay(0.1);
    let f32s = rmsprop_run(cfg, &[0.5f32, -1.25, 2.0, 0.0, 3.5], |k, i| {
        (((k + i) as f64).sin() * (i + 1) as f64) as f32
    });
    close_f32(
        &f32s,
        &[1050786427, 3215295668, 1073462406, 3148808448, 1080262777],
    );
    let f64s = rmsprop_run(cfg, &[0.5f64, -1.25, 2.0, 0.0, 3.5], |k, i| {
        ((k + i) as f64).sin() * (i + 1) as f64
    });
    close_f64(
        &f64s,
        &[
            0.31587587212670215,
            -1.2931122167696016,
            1.966690625473506,
            -0.005340704958514006,
            3.5547162266634826,
        ],
    );
}

#[test]
fn rmsprop_centered_momentum_alpha_matches_pytorch() {
    let cfg = RmsPropConfig::new(0.01)
        .centered(true)
        .momentum(0.5)
        .alpha(0.3);
    let f32s = rmsprop_run(cfg, &[0.5f32, -1.25, 2.0, 0.0, 3.5], |k, i| {
        (((k + i) as f64).sin() * (i + 1) as f64) as f32
    });
    close_f32(
        &f32s,
        &[1054628665, 3215337858, 1073838693, 1021773024, 1080274164],
    );
    let f64s = rmsprop_run(cfg, &[0.5f64, -1.25, 2.0, 0.0, 3.5], |k, i| {
        ((k + i) as f64).sin() * (i + 1) as f64
    });
    close_f64(
        &f64s,
        &[
            0.4303835262469145,
            -1.2981417924723124,
            2.023095406904332,
            0.02820056699452902,
            3.557431669263523,
        ],
    );
}

/// RMSprop's state (squared average, momentum, gradient average) round-trips through
/// `state_tensors`: a fresh optimiser loaded from it takes the same next step, bit for bit;
/// another optimiser's state is refused.
#[test]
fn rmsprop_state_resumes_exactly() {
    let cfg = RmsPropConfig::new(0.02).momentum(0.5).centered(true);
    let start = [0.5f64, -1.0, 2.0];
    let p = Parameter::new("p", HostTensor::new(start.to_vec(), &[3]).unwrap());
    let mut opt = RmsProp::new([p.clone()], cfg).unwrap();
    let grad =
        |k: usize| HostTensor::new(vec![0.3 * k as f64, -0.2, 1.0 / (1 + k) as f64], &[3]).unwrap();
    for k in 0..3 {
        p.set_grad(Some(grad(k))).unwrap();
        opt.step().unwrap();
    }
    let state = opt.state_tensors().unwrap();
    assert_eq!(state.len(), 1 + 3, "lr and the three buffers");
    let q = Parameter::new("q", p.value());
    let mut other = RmsProp::new([q.clone()], cfg).unwrap();
    other.load_state_tensors(&state).unwrap();
    for (param, o) in [(&p, &mut opt), (&q, &mut other)] {
        param.set_grad(Some(grad(3))).unwrap();
        o.step().unwrap();
    }
    assert_eq!(p.value(), q.value());
    let mut sgd = Sgd::new([q], SgdConfig::new(0.1)).unwrap();
    assert!(sgd.load_state_tensors(&state).is_err());
}
