//! A run resumes exactly: training 2N steps, and training N, saving with
//! `checkpoint::save_training`, loading into fresh objects and training N more, end with the
//! same weights bit for bit — for Adam (AMSGrad, weight decay), AdamW and SGD with momentum, a
//! cosine schedule and shuffled batches. A checkpoint that does not fit changes nothing.

use arenagrad_nn::checkpoint::{self, Progress};
use arenagrad_nn::optim::{
    Adam, AdamConfig, AdamW, CosineAnnealingLr, LrSchedule, Optimizer, Sgd, SgdConfig,
};
use arenagrad_nn::{loss, Graph, HostTensor, Linear, Module, NnError, Rng, Sequential, Tanh};

const STEPS: u64 = 12;

fn data() -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::seed(11);
    let x: Vec<f32> = (0..64 * 3)
        .map(|_| rng.uniform_range(-1.0, 1.0) as f32)
        .collect();
    let y: Vec<f32> = x.chunks(3).map(|r| (r[0] * r[1] - r[2]).sin()).collect();
    (x, y)
}

fn model(seed: u64) -> Sequential {
    let mut rng = Rng::seed(seed);
    Sequential::new()
        .add(Linear::new(3, 16, &mut rng).unwrap())
        .add(Tanh)
        .add(Linear::new(16, 1, &mut rng).unwrap())
}

type MakeOpt = fn(&Sequential) -> Box<dyn Optimizer>;

fn optimisers() -> [(&'static str, MakeOpt); 3] {
    [
        ("adam", |m| {
            let cfg = AdamConfig::new(0.05).weight_decay(0.01).amsgrad(true);
            Box::new(Adam::new(m.parameters(), cfg).unwrap())
        }),
        ("adamw", |m| {
            Box::new(AdamW::new(m.parameters(), AdamConfig::adamw(0.05)).unwrap())
        }),
        ("sgd", |m| {
            let cfg = SgdConfig::new(0.1).momentum(0.9).nesterov(true);
            Box::new(Sgd::new(m.parameters(), cfg).unwrap())
        }),
    ]
}

/// Steps `from..to`: the schedule's rate, a batch of 8 rows drawn by `rng`, MSE, a step.
fn train(m: &Sequential, opt: &mut dyn Optimizer, rng: &mut Rng, from: u64, to: u64) {
    let (x, y) = data();
    let sched = CosineAnnealingLr::new(0.05, 2 * STEPS as usize, 0.001).unwrap();
    let mut g = Graph::new();
    for step in from..to {
        opt.set_learning_rate(sched.lr_at(step as usize)).unwrap();
        let mut rows: Vec<usize> = (0..64).collect();
        rng.shuffle(&mut rows);
        let bx: Vec<f32> = rows[..8]
            .iter()
            .flat_map(|&r| x[3 * r..3 * r + 3].to_vec())
            .collect();
        let by: Vec<f32> = rows[..8].iter().map(|&r| y[r]).collect();
        let xt = g.from_host(&HostTensor::new(bx, &[8, 3]).unwrap()).unwrap();
        let yt = g.from_host(&HostTensor::new(by, &[8, 1]).unwrap()).unwrap();
        let l = loss::mse_loss(m.forward(&g, xt).unwrap(), yt).unwrap();
        l.backward().unwrap();
        g.reset();
        opt.step().unwrap();
        opt.zero_grad();
    }
}

fn weights(m: &Sequential) -> Vec<Vec<u32>> {
    m.parameters()
        .iter()
        .map(|p| {
            p.value()
                .to_f64_vec()
                .iter()
                .map(|&v| (v as f32).to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn training_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for (name, make) in optimisers() {
        // 2N steps in one go.
        let m = model(1);
        let mut opt = make(&m);
        let mut rng = Rng::seed(5);
        train(&m, opt.as_mut(), &mut rng, 0, 2 * STEPS);
        let straight = weights(&m);

        // N steps, saved; fresh objects (other weights, another seed), loaded; N more.
        let m = model(1);
        let mut opt = make(&m);
        let mut rng = Rng::seed(5);
        train(&m, opt.as_mut(), &mut rng, 0, STEPS);
        let path = dir.path().join(format!("{name}.safetensors"));
        let progress = Progress {
            step: STEPS,
            rng: Some(rng.clone()),
            history: [
                ("loss".to_string(), vec![0.5, 0.25, f64::MAX]),
                ("none".to_string(), vec![]),
            ]
            .into(),
            // A loss scaler's state rides along (an f16 run resumes at its scale).
            scaler: Some(arenagrad_nn::optim::GradScalerState {
                scale: 1024.0,
                growth_tracker: 17,
            }),
            // So does a plateau scheduler's.
            plateau: Some(arenagrad_nn::optim::PlateauState {
                best: 0.125,
                num_bad_epochs: 3,
                cooldown_counter: 1,
                last_epoch: 40,
            }),
        };
        checkpoint::save_training(&path, &m, opt.as_ref(), &progress).unwrap();

        let fresh = model(99);
        let mut fresh_opt = make(&fresh);
        let got = checkpoint::load_training(&path, &fresh, fresh_opt.as_mut()).unwrap();
        assert_eq!(got, progress, "{name}: progress");
        let mut rng = got.rng.unwrap();
        train(&fresh, fresh_opt.as_mut(), &mut rng, got.step, 2 * STEPS);
        assert_eq!(weights(&fresh), straight, "{name}: resumed weights differ");

        // Without the optimiser's state the run is not the same: the test can tell.
        let cold = model(99);
        checkpoint::load_state_dict(
            &cold,
            checkpoint::load_tensors(&path)
                .unwrap()
                .into_iter()
                .filter_map(|(n, t)| n.strip_prefix("model/").map(|n| (n.to_string(), t)))
                .collect(),
            true,
            &path,
        )
        .unwrap();
        let mut cold_opt = make(&cold);
        let mut rng = Rng::seed(5);
        train(&cold, cold_opt.as_mut(), &mut rng, STEPS, 2 * STEPS);
        assert_ne!(
            weights(&cold),
            straight,
            "{name}: a cold optimiser gave the same weights"
        );
    }
}

#[test]
fn a_checkpoint_that_does_not_fit_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(1);
    let mut adam = Adam::new(m.parameters(), AdamConfig::new(0.05)).unwrap();
    let mut rng = Rng::seed(5);
    train(&m, &mut adam, &mut rng, 0, 3);
    let path = dir.path().join("adam.safetensors");
    let progress = Progress {
        step: 3,
        ..Progress::default()
    };
    checkpoint::save_training(&path, &m, &adam, &progress).unwrap();

    // An SGD over the same parameters cannot take Adam's state; a wider model cannot take the
    // weights. Either way neither the module nor the optimiser moves.
    let other = model(2);
    let before = weights(&other);
    let mut sgd = Sgd::new(other.parameters(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    let sgd_before = sgd.state_tensors().unwrap();
    let e = checkpoint::load_training(&path, &other, &mut sgd).unwrap_err();
    assert!(matches!(e, NnError::InvalidConfig { .. }), "{e}");
    assert_eq!(weights(&other), before);
    assert_eq!(sgd.state_tensors().unwrap(), sgd_before);

    let mut rng = Rng::seed(3);
    let wide = Sequential::new()
        .add(Linear::new(3, 17, &mut rng).unwrap())
        .add(Tanh)
        .add(Linear::new(17, 1, &mut rng).unwrap());
    let mut wide_adam = Adam::new(wide.parameters(), AdamConfig::new(0.05)).unwrap();
    let wide_before = weights(&wide);
    let e = checkpoint::load_training(&path, &wide, &mut wide_adam).unwrap_err();
    assert!(
        matches!(
            e,
            NnError::InvalidConfig { .. } | NnError::StateMismatch { .. }
        ),
        "{e}"
    );
    assert_eq!(weights(&wide), wide_before);
    assert_eq!(
        wide_adam.state_tensors().unwrap().len(),
        1,
        "only the learning rate"
    );
}
