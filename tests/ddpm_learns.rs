//! The DDPM example's U-Net learns to predict the noise added to real Fashion-MNIST images in a
//! short run (narrower, on 512 images), and its `Module::forward`, which has no time step,
//! is a typed error rather than a wrong answer.

#[allow(dead_code)]
#[path = "../examples/ddpm.rs"]
mod ddpm;

use std::path::Path;

use arenagrad::graph::testing::{skip_or_fail, REQUIRE_DATA};
use arenagrad::nn::data::Dataset;
use arenagrad::nn::optim::{Adam, AdamConfig};
use arenagrad::nn::{Module, Rng};
use arenagrad::{DType, Graph};

const DATA: &str = "/usr/share/datasets/fashion-mnist";

#[test]
#[cfg_attr(miri, ignore)]
fn a_short_run_learns_to_predict_the_noise() {
    let images = Path::new(DATA).join("train-images-idx3-ubyte.gz");
    if !images.exists() {
        skip_or_fail(
            REQUIRE_DATA,
            format_args!("{DATA} is not installed (Debian: dataset-fashion-mnist)"),
        );
        return;
    }
    let train = Dataset::from_idx_files(images, Path::new(DATA).join("train-labels-idx1-ubyte.gz"))
        .unwrap()
        .take(512);
    let mut rng = Rng::seed(1);
    let model = ddpm::UNet::new(16, &mut rng).unwrap();
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(2e-3)).unwrap();
    let sched = ddpm::Schedule::linear();
    let mut g = Graph::new();
    let mut losses = Vec::new();
    for step in 0..80 {
        let at = (step * 32) % 512;
        let order: Vec<usize> = (at..at + 32).collect();
        let (x, _) = train.batch_raw(&order).unwrap();
        losses.push(ddpm::train_step(&mut g, &model, &mut opt, &sched, &x, &mut rng).unwrap());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (first, last) = (mean(&losses[..5]), mean(&losses[70..]));
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // Predicting zeros scores 1 (the noise's variance); the trained net does far better.
    assert!(first > 0.5 && last < 0.3, "first {first}, last {last}");
    // One input is not enough for a model that needs a time step.
    let x = g.zeros(&[1, 1, 28, 28], DType::F32).unwrap();
    assert!(model.forward(&g, x).is_err());
    let eps = model.predict_noise(&g, x, &[999]).unwrap();
    assert_eq!(eps.shape().to_vec(), [1, 1, 28, 28]);
}
