//! Criterion benchmarks of the graph, grouped by family: tiny-op overhead (W2), GEMM through the
//! graph, the randn-matmul loop, and one image's im2col and col2im (the host convolutions' patch
//! walks). `cargo bench -p arenagrad-graph [-- im2col]`.
#![allow(missing_docs)] // criterion's macros generate undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use arenagrad_graph::{DType, Graph};

fn tiny_ops(c: &mut Criterion) {
    let mut group = c.benchmark_group("tiny_op_chain");
    let len = 10_000u64;
    group.throughput(Throughput::Elements(len));
    for n in [1usize, 16] {
        group.bench_with_input(BenchmarkId::new("fwd_bwd", n), &n, |b, &n| {
            let mut g = Graph::with_threads(1);
            b.iter(|| {
                let x = g
                    .ones(&[n], DType::F32)
                    .unwrap()
                    .set_requires_grad(true)
                    .unwrap();
                let mut h = x;
                for k in 0..len {
                    h = match k % 3 {
                        0 => h.scale(1.0001).unwrap(),
                        1 => h.shift(0.0001).unwrap(),
                        _ => h.tanh().unwrap(),
                    };
                }
                h.sum().unwrap().backward().unwrap();
                g.reset();
            });
        });
    }
    group.finish();
}

fn gemm(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul");
    group.sample_size(10);
    let n = 1024usize;
    group.throughput(Throughput::Elements((2 * n * n * n) as u64));
    group.bench_function("f32_1024", |b| {
        let mut g = Graph::new();
        b.iter(|| {
            let a = g.randn(&[n, n], DType::F32).unwrap();
            std::hint::black_box(a.matmul(a).unwrap());
            g.reset();
        });
    });
    group.finish();
}

fn leak_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("leak_check");
    group.sample_size(10);
    for n in [128usize, 1024] {
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            let mut g = Graph::new();
            b.iter(|| {
                let x = g
                    .randn(&[n, n], DType::F32)
                    .unwrap()
                    .set_requires_grad(true)
                    .unwrap();
                x.matmul(x).unwrap().sum().unwrap().backward().unwrap();
                g.reset();
            });
        });
    }
    group.finish();
}

/// One image's im2col and col2im at the diffusion example's convolution shapes (3×3, padding 1,
/// at 28², 14² and 7²) and at a transposed convolution's (kernel 4, stride 2, over its 28²
/// output), f32.
fn im2col(c: &mut Criterion) {
    use arenagrad_graph::exec::cpu::{self, Window};
    let mut group = c.benchmark_group("im2col");
    for (ch, hw, k, s) in [
        (32, 28, 3, 1),
        (64, 14, 3, 1),
        (128, 7, 3, 1),
        (32, 28, 4, 2),
    ] {
        let win = Window {
            c: ch,
            h: hw,
            w: hw,
            kh: k,
            kw: k,
            sh: s,
            sw: s,
            ph: 1,
            pw: 1,
            dh: 1,
            dw: 1,
        };
        let (ho, wo) = win.out_hw().expect("a valid window");
        let x: Vec<f32> = (0..ch * hw * hw).map(|i| i as f32).collect();
        let mut cols = vec![0f32; win.patch_len() * ho * wo];
        let name = format!("c{ch}_{hw}x{hw}_k{k}_s{s}");
        group.throughput(Throughput::Elements(cols.len() as u64));
        group.bench_function(BenchmarkId::new("im2col", &name), |b| {
            b.iter(|| {
                cpu::im2col(&x, &win, 0.0, &mut cols);
                std::hint::black_box(&cols);
            })
        });
        let mut y = vec![0f32; x.len()];
        group.bench_function(BenchmarkId::new("col2im", &name), |b| {
            b.iter(|| {
                cpu::col2im(&cols, &win, &mut y);
                std::hint::black_box(&y);
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = tiny_ops, gemm, leak_check, im2col
}
criterion_main!(benches);
