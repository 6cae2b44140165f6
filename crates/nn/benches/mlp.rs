//! One training step of an MLP (forward, cross-entropy, backward, SGD update) at two sizes:
//! 784-512-512-10 with batch 128, and 64-64-64-10 with batch 32, in f32.
//! `cargo bench -p arenagrad-nn --bench mlp`.
#![allow(missing_docs)] // criterion's macros generate undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

use arenagrad_nn::optim::{Optimizer, Sgd, SgdConfig};
use arenagrad_nn::{loss, Graph, HostTensor, Linear, Module, ReLU, Rng, Sequential};

fn mlp(sizes: &[usize], rng: &mut Rng) -> Sequential {
    let mut m = Sequential::new();
    for (k, w) in sizes.windows(2).enumerate() {
        m.push(Linear::new(w[0], w[1], rng).unwrap());
        if k + 2 < sizes.len() {
            m.push(ReLU);
        }
    }
    m
}

fn train_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("mlp_train_step");
    group.sample_size(30);
    for (sizes, batch) in [
        (&[784usize, 512, 512, 10][..], 128usize),
        (&[64, 64, 64, 10][..], 32),
    ] {
        let label = format!(
            "{}_b{batch}",
            sizes
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join("-")
        );
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            let mut rng = Rng::seed(0);
            let model = mlp(sizes, &mut rng);
            let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.01).momentum(0.9)).unwrap();
            let x = HostTensor::new(
                (0..batch * sizes[0])
                    .map(|_| rng.uniform() as f32)
                    .collect::<Vec<f32>>(),
                &[batch, sizes[0]],
            )
            .unwrap();
            let classes = sizes[sizes.len() - 1];
            let y: Vec<usize> = (0..batch).map(|_| rng.below(classes)).collect();
            let mut g = Graph::new();
            b.iter(|| {
                opt.zero_grad();
                let xt = g.from_host(&x).unwrap();
                let l = loss::cross_entropy(model.forward(&g, xt).unwrap(), &y).unwrap();
                l.backward().unwrap();
                std::hint::black_box(l.item().unwrap());
                g.reset();
                opt.step().unwrap();
            });
        });
    }
    group.finish();
}

criterion_group!(benches, train_step);
criterion_main!(benches);
