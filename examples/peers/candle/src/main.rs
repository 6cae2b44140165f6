//! candle on the workloads of arenagrad's `bench_core`, printing rows in the same format (and with
//! the same row names) so that `scripts/compare_torch.py --candle` can put them side by side:
//!
//! * W1: x = randn(1024, 1024) as a variable; (x @ x).sum().backward(); median ms per iteration.
//! * W2: a chain of 10 000 ops x*1.0001, x+0.0001, tanh (in turn) on 16 (and 1) ones, summed and
//!   backpropagated; ns per op.
//! * W3 / W4: an MLP (784-512-512-10 batch 128 / 64-64-64-10 batch 32) with ReLU, cross-entropy and
//!   SGD (lr 0.01): one training step, median of 50 after 5 warm-up steps.
//!
//! Threads: candle's CPU kernels use rayon, so `RAYON_NUM_THREADS` sets them.
//!
//! `cargo run --release --manifest-path examples/peers/candle/Cargo.toml [-- --quick]`

use std::time::Instant;

use candle_core::{DType, Device, Module, Result, Tensor, Var};
use candle_nn::{Optimizer, VarBuilder, VarMap};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn w1(dev: &Device, iters: usize) -> Result<f64> {
    let mut t = Vec::new();
    for _ in 0..iters + 2 {
        let t0 = Instant::now();
        let x = Var::randn(0f32, 1f32, (1024, 1024), dev)?;
        let grads = x.matmul(&x)?.sum_all()?.backward()?;
        std::hint::black_box(grads.get(&x));
        t.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(t[2..].to_vec()) * 1e3)
}

fn w2(dev: &Device, n: usize, reps: usize) -> Result<f64> {
    let len = 10_000;
    let mut t = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        let x = Var::ones(n, DType::F32, dev)?;
        let mut h = x.as_tensor().clone();
        for k in 0..len {
            h = match k % 3 {
                0 => h.affine(1.0001, 0.0)?,
                1 => h.affine(1.0, 0.0001)?,
                _ => h.tanh()?,
            };
        }
        let grads = h.sum_all()?.backward()?;
        std::hint::black_box(grads.get(&x));
        t.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(t) * 1e9 / len as f64)
}

fn mlp(dev: &Device, dims: &[usize], batch: usize) -> Result<f64> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, dev);
    let layers = dims
        .windows(2)
        .enumerate()
        .map(|(k, w)| candle_nn::linear(w[0], w[1], vb.pp(format!("l{k}"))))
        .collect::<Result<Vec<_>>>()?;
    let mut opt = candle_nn::SGD::new(varmap.all_vars(), 0.01)?;
    let x = Tensor::randn(0f32, 1f32, (batch, dims[0]), dev)?;
    let classes = dims[dims.len() - 1] as u32;
    let y = Tensor::from_vec(
        (0..batch as u32).map(|i| (i * 7 + 3) % classes).collect(),
        batch,
        dev,
    )?;
    let mut t = Vec::new();
    for s in 0..55 {
        let t0 = Instant::now();
        let mut h = x.clone();
        for (k, l) in layers.iter().enumerate() {
            h = l.forward(&h)?;
            if k + 1 < layers.len() {
                h = h.relu()?;
            }
        }
        let loss = candle_nn::loss::cross_entropy(&h, &y)?;
        opt.backward_step(&loss)?;
        if s >= 5 {
            t.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(t))
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let dev = Device::Cpu;
    println!("| workload | figure (candle {}) |", "0.11.1");
    println!("|---|---|");
    let ms = w1(&dev, if quick { 5 } else { 30 })?;
    println!("| randn-matmul loop 1024², randn+matmul+sum+backward | {ms:.1} ms/iter |");
    let reps = if quick { 3 } else { 7 };
    let t16 = w2(&dev, 16, reps)?;
    println!("| W2 tiny-op chain, 16 elements, fwd+bwd | {t16:.1} ns/op |");
    let t1 = w2(&dev, 1, reps)?;
    println!("| W2 tiny-op chain, 1 element, fwd+bwd | {t1:.1} ns/op |");
    let w3 = mlp(&dev, &[784, 512, 512, 10], 128)?;
    println!(
        "| W3 MLP 784-512-512-10 b128 SGD step | {:.2} ms |",
        w3 * 1e3
    );
    let w4 = mlp(&dev, &[64, 64, 64, 10], 32)?;
    println!("| W4 MLP 64-64-64-10 b32 SGD step | {:.1} µs |", w4 * 1e6);
    Ok(())
}
