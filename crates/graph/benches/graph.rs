//! Criterion benchmarks of the graph, grouped by family: tiny-op overhead (W2), GEMM through the
//! graph, and the randn-matmul loop. `cargo bench -p arenagrad-graph`.
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

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = tiny_ops, gemm, leak_check
}
criterion_main!(benches);
