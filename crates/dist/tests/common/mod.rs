//! What the data-parallel tests train: a small CNN of the Fashion-MNIST example's shape on
//! seeded 28×28 images, 64 examples a step, and the single-process references.
#![allow(dead_code)]

use arenagrad_graph::HostTensor;
use arenagrad_nn::optim::{Optimizer, Sgd, SgdConfig};
use arenagrad_nn::{
    loss, Conv2d, Conv2dConfig, Flatten, Graph, Linear, MaxPool2d, Module, ReLU, Rng, Sequential,
};

pub const BATCH: usize = 64;
pub const STEPS: usize = 50;

pub fn cnn() -> Sequential {
    let mut rng = Rng::seed(7);
    let same = Conv2dConfig::default().padding(1);
    Sequential::new()
        .add(Conv2d::with_config(1, 4, (3, 3), same, &mut rng).unwrap())
        .add(ReLU)
        .add(MaxPool2d::new((2, 2)).unwrap())
        .add(Conv2d::with_config(4, 8, (3, 3), same, &mut rng).unwrap())
        .add(ReLU)
        .add(MaxPool2d::new((2, 2)).unwrap())
        .add(Flatten::new())
        .add(Linear::new(8 * 7 * 7, 32, &mut rng).unwrap())
        .add(ReLU)
        .add(Linear::new(32, 10, &mut rng).unwrap())
}

pub fn sgd(model: &impl Module) -> Sgd {
    Sgd::new(model.parameters(), SgdConfig::new(0.05).momentum(0.9)).unwrap()
}

/// Rows `rows` of step `step`'s batch of 64: images and labels.
pub fn batch(step: usize, rows: std::ops::Range<usize>) -> (Vec<f32>, Vec<usize>) {
    let mut rng = Rng::seed(1000 + step as u64);
    let images: Vec<f32> = (0..BATCH * 784).map(|_| rng.normal() as f32).collect();
    let labels: Vec<usize> = (0..BATCH).map(|_| rng.below(10)).collect();
    (
        images[rows.start * 784..rows.end * 784].to_vec(),
        labels[rows].to_vec(),
    )
}

/// Forward and backward of `model` on rows `rows` of step `step`'s batch (mean loss over them).
pub fn backward(model: &impl Module, g: &mut Graph, step: usize, rows: std::ops::Range<usize>) {
    let n = rows.len();
    let (x, y) = batch(step, rows);
    let xt = g.from_slice(&x, &[n, 1, 28, 28]).unwrap();
    loss::cross_entropy(model.forward(g, xt).unwrap(), &y)
        .unwrap()
        .backward()
        .unwrap();
    g.reset();
}

/// The parameters' values, flat, in order.
pub fn weights(model: &impl Module) -> Vec<Vec<f32>> {
    model
        .parameters()
        .iter()
        .map(|p| p.value().as_slice::<f32>().unwrap().to_vec())
        .collect()
}

/// The bare module (no wrapper) after `steps` steps on rows 0..32 of each batch.
pub fn bare(steps: usize) -> Vec<Vec<f32>> {
    let model = cnn();
    let mut opt = sgd(&model);
    let mut g = Graph::with_threads(1);
    for step in 0..steps {
        opt.zero_grad();
        backward(&model, &mut g, step, 0..32);
        opt.step().unwrap();
    }
    weights(&model)
}

/// One process, batch 64 in one pass: what two ranks of 32 equal up to f32 rounding.
pub fn one_process_batch_64() -> Vec<Vec<f32>> {
    let model = cnn();
    let mut opt = sgd(&model);
    let mut g = Graph::with_threads(1);
    for step in 0..STEPS {
        opt.zero_grad();
        backward(&model, &mut g, step, 0..BATCH);
        opt.step().unwrap();
    }
    weights(&model)
}

/// One process, the two halves' gradients computed apart and combined as a rank-order
/// all-reduce does (`(g0 + g1) / 2`): what two ranks equal bit for bit.
pub fn one_process_two_halves() -> Vec<Vec<f32>> {
    let model = cnn();
    let mut opt = sgd(&model);
    let mut g = Graph::with_threads(1);
    let params = model.parameters();
    for step in 0..STEPS {
        let mut halves = Vec::new();
        for h in 0..2 {
            opt.zero_grad();
            backward(&model, &mut g, step, h * 32..(h + 1) * 32);
            halves.push(
                params
                    .iter()
                    .map(|p| p.grad().unwrap().as_slice::<f32>().unwrap().to_vec())
                    .collect::<Vec<_>>(),
            );
        }
        for (k, p) in params.iter().enumerate() {
            let avg: Vec<f32> = halves[0][k]
                .iter()
                .zip(&halves[1][k])
                .map(|(a, b)| (a + b) / 2.0)
                .collect();
            p.set_grad(Some(HostTensor::new(avg, &p.shape()).unwrap()))
                .unwrap();
        }
        opt.step().unwrap();
    }
    weights(&model)
}

/// Asserts two sets of weights equal bit for bit, saying by how much they differ if not.
#[track_caller]
pub fn assert_same(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert!(
        a == b,
        "{what}: the weights differ by up to {:e} of the largest",
        max_rel_diff(a, b)
    );
}

/// The largest difference between two sets of weights, relative to the largest weight.
pub fn max_rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let mut worst = 0.0f64;
    for (x, y) in a.iter().zip(b) {
        let scale = x.iter().fold(1e-3f64, |m, v| m.max(v.abs() as f64));
        for (u, v) in x.iter().zip(y) {
            worst = worst.max((*u as f64 - *v as f64).abs() / scale);
        }
    }
    worst
}
