//! End-to-end training on fixed synthetic data: reaches a known loss, and a seed fixes every
//! loss bit for bit.

use arenagrad_nn::data::Dataset;
use arenagrad_nn::optim::{
    clip_grad_norm, Adam, AdamConfig, AdamW, CosineAnnealingLr, LrSchedule, Optimizer, Sgd,
    SgdConfig,
};
use arenagrad_nn::{
    checkpoint, loss, metrics, BatchNorm2d, Conv2d, Conv2dConfig, DType, Dropout, Flatten, Graph,
    HostTensor, Linear, MaxPool2d, Module, ReLU, Rng, Sequential, Tanh,
};

/// 128 points in [−1, 1]², labelled by the sign of x·y (not linearly separable).
fn xor_data(seed: u64) -> (HostTensor, Vec<usize>) {
    let mut rng = Rng::seed(seed);
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for _ in 0..128 {
        let (a, b) = (rng.uniform_range(-1.0, 1.0), rng.uniform_range(-1.0, 1.0));
        xs.extend([a as f32, b as f32]);
        ys.push(usize::from(a * b > 0.0));
    }
    (HostTensor::new(xs, &[128, 2]).unwrap(), ys)
}

fn train_mlp(seed: u64, steps: usize) -> Vec<f64> {
    let (x, y) = xor_data(7);
    let mut rng = Rng::seed(seed);
    let model = Sequential::new()
        .add(Linear::new(2, 32, &mut rng).unwrap())
        .add(ReLU)
        .add(Linear::new(32, 2, &mut rng).unwrap());
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(0.02)).unwrap();
    let mut g = Graph::new();
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        opt.zero_grad();
        let xt = g.from_host(&x).unwrap();
        let l = loss::cross_entropy(model.forward(&g, xt).unwrap(), &y).unwrap();
        l.backward().unwrap();
        losses.push(l.item().unwrap());
        g.reset();
        opt.step().unwrap();
    }
    losses
}

#[test]
fn mlp_with_adam_reaches_a_known_loss_deterministically() {
    let a = train_mlp(1, 400);
    let b = train_mlp(1, 400);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b), "same seed, same losses bit for bit");
    assert!(a[0] > 0.6, "starts near ln 2: {}", a[0]);
    let last = a[a.len() - 1];
    assert!(last < 0.03, "final loss {last}");
    let c = train_mlp(2, 400);
    assert_ne!(bits(&a), bits(&c), "another seed, another run");
    assert!(c[c.len() - 1] < 0.03, "final loss {}", c[c.len() - 1]);
}

/// 64 synthetic 8×8 images: class 0 has a bright vertical bar, class 1 a horizontal one, each
/// at a random position, on noise.
fn bars(seed: u64) -> Dataset {
    let mut rng = Rng::seed(seed);
    let mut px = Vec::new();
    let mut labels = Vec::new();
    for i in 0..64 {
        let class = i % 2;
        let at = rng.below(8);
        for r in 0..8 {
            for c in 0..8 {
                let on = if class == 0 { c == at } else { r == at };
                let noise = rng.below(60) as u8;
                px.push(if on { 255 - noise } else { noise });
            }
        }
        labels.push(class);
    }
    Dataset::new(px, labels, &[8, 8]).unwrap()
}

fn train_cnn(seed: u64, epochs: usize) -> (Vec<f64>, Sequential) {
    let ds = bars(3);
    let mut rng = Rng::seed(seed);
    let model = Sequential::new()
        .add(
            Conv2d::with_config(1, 4, (3, 3), Conv2dConfig::default().padding(1), &mut rng)
                .unwrap(),
        )
        .add(BatchNorm2d::new(4).unwrap())
        .add(ReLU)
        .add(MaxPool2d::new((2, 2)).unwrap())
        .add(Flatten::new())
        .add(Dropout::new(0.1).unwrap())
        .add(Linear::new(64, 2, &mut rng).unwrap());
    let mut opt = AdamW::new(model.parameters(), AdamConfig::adamw(0.01)).unwrap();
    let sched = CosineAnnealingLr::new(0.01, epochs, 0.001).unwrap();
    let mut g = Graph::new();
    g.seed(seed);
    let mut losses = Vec::new();
    for epoch in 0..epochs {
        sched.apply(&mut opt, epoch).unwrap();
        for b in ds.shuffled_batches(16, &mut rng).unwrap() {
            let (x, y) = b.unwrap();
            opt.zero_grad();
            let xt = g.from_host(&x).unwrap();
            let l = loss::cross_entropy(model.forward(&g, xt).unwrap(), &y).unwrap();
            l.backward().unwrap();
            losses.push(l.item().unwrap());
            g.reset();
            clip_grad_norm(opt.parameters(), 5.0).unwrap();
            opt.step().unwrap();
        }
    }
    (losses, model)
}

fn accuracy(model: &Sequential, ds: &Dataset) -> f64 {
    let g = Graph::new();
    let (x, y) = ds.batch(&(0..ds.len()).collect::<Vec<_>>()).unwrap();
    let logits = model.forward(&g, g.from_host(&x).unwrap()).unwrap();
    metrics::accuracy(logits, &y).unwrap()
}

#[test]
fn small_cnn_learns_and_is_reproducible() {
    let (a, mut model) = train_cnn(5, 12);
    let (b, _) = train_cnn(5, 12);
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let first: f64 = a[..4].iter().sum::<f64>() / 4.0;
    let last: f64 = a[a.len() - 4..].iter().sum::<f64>() / 4.0;
    assert!(last < first * 0.5, "{first} → {last}");
    model.eval();
    let acc = accuracy(&model, &bars(3));
    assert!(acc >= 0.95, "accuracy {acc}");
    // A checkpoint restores the trained model exactly (running statistics included).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cnn.safetensors");
    checkpoint::save(&model, &path).unwrap();
    let (_, mut fresh) = train_cnn(6, 1);
    fresh.eval();
    checkpoint::load(&fresh, &path).unwrap();
    assert_eq!(accuracy(&fresh, &bars(3)), acc);
}

#[test]
fn sgd_regression_in_f64_converges_to_the_least_squares_solution() {
    // y = 2·x₀ − 3·x₁ + 0.5 exactly: a linear layer must find the weights.
    let mut rng = Rng::seed(4);
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for _ in 0..32 {
        let (a, b) = (rng.normal(), rng.normal());
        xs.extend([a, b]);
        ys.push(2.0 * a - 3.0 * b + 0.5);
    }
    let fc = Linear::with_config(
        2,
        1,
        arenagrad_nn::LinearConfig {
            dtype: DType::F64,
            ..Default::default()
        },
        &mut rng,
    )
    .unwrap();
    let model = Sequential::new().add(fc);
    let mut opt = Sgd::new(
        model.parameters(),
        SgdConfig::new(0.1).momentum(0.9).nesterov(true),
    )
    .unwrap();
    let mut g = Graph::new();
    for _ in 0..300 {
        opt.zero_grad();
        let x = g.from_f64(&xs, &[32, 2], DType::F64).unwrap();
        let y = g.from_f64(&ys, &[32, 1], DType::F64).unwrap();
        loss::mse_loss(model.forward(&g, x).unwrap(), y)
            .unwrap()
            .backward()
            .unwrap();
        g.reset();
        opt.step().unwrap();
    }
    let w = model.named_parameters();
    let wv = w[0].1.value().to_f64_vec();
    let bv = w[1].1.value().to_f64_vec();
    assert!(
        (wv[0] - 2.0).abs() < 1e-9 && (wv[1] + 3.0).abs() < 1e-9,
        "{wv:?}"
    );
    assert!((bv[0] - 0.5).abs() < 1e-9, "{bv:?}");
    // tanh as a module in an f64 network runs as well.
    let g = Graph::new();
    let t = Tanh
        .forward(&g, g.zeros(&[1], DType::F64).unwrap())
        .unwrap();
    assert_eq!(t.item().unwrap(), 0.0);
}
