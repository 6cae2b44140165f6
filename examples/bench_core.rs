//! Prints the engine's speed figures as a table, on the workloads of docs/performance.md's comparison with
//! PyTorch (`scripts/compare_torch.py` runs both): W1 the randn-matmul loop at 1024×1024, W2 tiny-op overhead, W3/W4 MLP training
//! steps (ReLU, cross-entropy, plain SGD lr 0.01, median of 50 steps after 5 warm-up), and GEMM;
//! then one training step of the Fashion-MNIST example's CNN (Adam, batch 64, random images);
//! causal self-attention at the character GPT's size (`[32, 4, 128, 32]`, f32), forward and
//! backward, fused and as the composed formula; and the character GPT of the `char_gpt`
//! example: a training step, its peak memory, and generation at batch 1; W5/W6 an LSTM (input
//! 128, hidden 256, sequence 64, batch 1 and 32) trained by SGD, as one fused layer and as a loop
//! of cells; gradient checkpointing on an 8-block residual MLP; the bf16 matrix product beside the
//! f32 one.
//!
//! The scatter rows: message passing's sum, `index_add` of 10⁶ edge messages `[E, 64]` into 10⁵
//! nodes, forward and backward; the same by `scatter_add` over the index expanded to `[E, 64]`;
//! and the mean aggregation, `scatter_reduce` "mean" over that index.
//!
//! The convt rows: a U-Net's upsampling, `ConvTranspose2d` 64→32 at 14×14 → 28×28, batch 64,
//! forward and backward, with kernel 4, stride 2, padding 1 (DDPM's) and kernel 2, stride 2.
//!
//! The conv rows: the DDPM U-Net's 3×3 convolutions (padding 1) at its three resolutions,
//! `Conv2d` 32→32 at 28×28, 64→64 at 14×14 and 64→64 at 7×7, batch 64, forward and backward.
//!
//! The ew rows: elementwise ops at the char GPT's MLP size, GELU and dropout (p = 0.1) on
//! `[4096, 512]` in f32 and bf16, forward and backward (of the output's sum).
//!
//! `cargo run --release --example bench_core [-- --quick] [--only w1,w2,w3,w4,cnn,attn,gpt,lstm,w5,w6,ckpt,bf16,amp,topk,scatter,convt,conv,ew] [--busy-thread]`
//! Threads: `ARENAGRAD_NUM_THREADS` (default: the CPUs this process may use). `--busy-thread`
//! keeps one more thread of the process busy all along, as an application's own work would
//! (`scripts/contention.py` measures the slowdown it causes).

use std::time::Instant;

use arenagrad::exec::cpu::bf16::{bf16, gemm_bf16_on, to_bf16, Bf16Kernel};
use arenagrad::exec::cpu::{gemm, MatView, Mnk};
use arenagrad::nn::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use arenagrad::nn::{
    loss, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ReLU, Rng, Sequential,
};
use arenagrad::prelude::*;

/// The round whose ratio (the first field) is the median of the rounds'.
fn median_by_ratio(mut v: Vec<(f64, f64, f64, f64, f64, f64)>) -> (f64, f64, f64, f64, f64, f64) {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v[v.len() / 2]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// W2: a chain of `len` ops (`x*1.0001`, `x+0.0001`, `tanh`) on `n` elements, forward + backward.
fn tiny_chain(g: &mut Graph, n: usize, len: usize, reps: usize) -> (f64, f64) {
    let mut fwd = Vec::new();
    let mut tot = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
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
        let l = h.sum().unwrap();
        let t1 = Instant::now();
        l.backward().unwrap();
        let t2 = Instant::now();
        std::hint::black_box(x.grad().unwrap());
        g.reset();
        fwd.push((t1 - t0).as_secs_f64());
        tot.push((t2 - t0).as_secs_f64());
    }
    (
        median(fwd) * 1e9 / len as f64,
        median(tot) * 1e9 / len as f64,
    )
}

fn gemm_graph(g: &mut Graph, n: usize, reps: usize) -> f64 {
    let mut t = Vec::new();
    for _ in 0..reps {
        let a = g.randn(&[n, n], DType::F32).unwrap();
        let b = g.randn(&[n, n], DType::F32).unwrap();
        let t0 = Instant::now();
        std::hint::black_box(a.matmul(b).unwrap());
        t.push(t0.elapsed().as_secs_f64());
        g.reset();
    }
    2.0 * (n as f64).powi(3) / median(t) / 1e9
}

fn gemm_raw(n: usize, threads: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.1).collect();
    let b = a.clone();
    let mut c = vec![0.0f32; n * n];
    gemm_gflops(n, reps, || {
        let (a, b) = (
            MatView::row_major(&a, 0, n, false),
            MatView::row_major(&b, 0, n, false),
        );
        gemm(Mnk::new(n, n, n), a, b, &mut c, false, threads);
    })
}

/// GFLOP/s of an `n³` product run by `product`: the median of `reps` runs after a first.
fn gemm_gflops(n: usize, reps: usize, mut product: impl FnMut()) -> f64 {
    let mut t = Vec::new();
    for _ in 0..reps + 1 {
        let t0 = Instant::now();
        product();
        t.push(t0.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / median(t[1..].to_vec()) / 1e9
}

/// GFLOP/s of the bf16 product `n³` (f32 accumulation) on `kernel`, over `threads`,
/// median of `reps`.
fn gemm_bf16_raw(kernel: Bf16Kernel, n: usize, threads: usize, reps: usize) -> f64 {
    let a: Vec<bf16> = (0..n * n).map(|i| to_bf16((i % 7) as f32 * 0.1)).collect();
    let b = a.clone();
    let mut c = vec![0.0f32; n * n];
    let gflops = gemm_gflops(n, reps, || {
        let (a, b) = (
            MatView::row_major(&a, 0, n, false),
            MatView::row_major(&b, 0, n, false),
        );
        gemm_bf16_on(kernel, Mnk::new(n, n, n), a, b, &mut c, false, threads);
    });
    std::hint::black_box(&c);
    gflops
}

/// The bf16 product beside the f32 one, 1024³, in the same run: the kernel in use (see
/// `ARENAGRAD_BF16`) on one thread and on all, and every other kernel this CPU has on one.
fn bf16_rows(threads: usize, quick: bool) {
    let reps = if quick { 3 } else { 10 };
    let kernel = Bf16Kernel::best();
    let f1 = gemm_raw(1024, 1, reps);
    let b1 = gemm_bf16_raw(kernel, 1024, 1, reps);
    let ft = gemm_raw(1024, threads, reps);
    let bt = gemm_bf16_raw(kernel, 1024, threads, reps);
    println!("| bf16 GEMM 1024³ (f32 accumulation), 1 thread, {kernel:?} | {b1:.0} GFLOP/s ({:.2}× f32's {f1:.0}) | |", b1 / f1);
    println!("| bf16 GEMM 1024³ (f32 accumulation), over {threads} threads, {kernel:?} | {bt:.0} GFLOP/s ({:.2}× f32's {ft:.0}) | ≥ 1.8× f32 |", bt / ft);
    let others: Vec<String> = [
        Bf16Kernel::Amx,
        Bf16Kernel::Avx512Bf16,
        Bf16Kernel::Avx512,
        Bf16Kernel::Avx2,
    ]
    .into_iter()
    .filter(|&k| k != kernel && k.available())
    .map(|k| format!("{k:?} {:.0}", gemm_bf16_raw(k, 1024, 1, reps)))
    .collect();
    if !others.is_empty() {
        println!(
            "| bf16 GEMM 1024³, 1 thread, the other kernels here | {} GFLOP/s | |",
            others.join(", ")
        );
    }
}

/// The randn-matmul loop; returns (ms/iter, ms of randn alone, ms of 3 bare GEMMs + randn).
fn randn_matmul_loop(g: &mut Graph, n: usize, iters: usize) -> (f64, f64, f64) {
    let mut t = Vec::new();
    for _ in 0..iters {
        let t0 = Instant::now();
        let x = g
            .randn(&[n, n], DType::F32)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        x.matmul(x).unwrap().sum().unwrap().backward().unwrap();
        std::hint::black_box(x.grad().unwrap());
        g.reset();
        t.push(t0.elapsed().as_secs_f64());
    }
    let mut r = Vec::new();
    let mut bare = Vec::new();
    let threads = g.threads();
    let mut c = vec![0.0f32; n * n];
    for _ in 0..iters {
        let t0 = Instant::now();
        let x = g.randn(&[n, n], DType::F32).unwrap();
        let xv = x.to_vec::<f32>().unwrap();
        let t1 = Instant::now();
        for _ in 0..3 {
            gemm(
                Mnk::new(n, n, n),
                MatView::row_major(&xv, 0, n, false),
                MatView::row_major(&xv, 0, n, false),
                &mut c,
                false,
                threads,
            );
        }
        let t2 = Instant::now();
        g.reset();
        r.push((t1 - t0).as_secs_f64());
        bare.push((t2 - t0).as_secs_f64());
    }
    std::hint::black_box(&c);
    (median(t) * 1e3, median(r) * 1e3, median(bare) * 1e3)
}

/// Memory of one training step, in bytes.
struct StepMemory {
    /// Arena bytes in use after the forward pass (parameter copies, input, activations).
    after_forward: usize,
    /// The arena's peak during the step.
    arena_peak: usize,
    /// Parameter bytes (the gradients, held by the parameters, are as many).
    params: usize,
}

/// W3/W4: one MLP training step; returns (ms/step, fwd, bwd, opt) and the last step's memory.
fn mlp_step(dims: &[usize], batch: usize) -> ((f64, f64, f64, f64), StepMemory) {
    let mut rng = Rng::seed(0);
    let mut model = Sequential::new();
    for (k, w) in dims.windows(2).enumerate() {
        model.push(Linear::new(w[0], w[1], &mut rng).unwrap());
        if k + 2 < dims.len() {
            model.push(ReLU);
        }
    }
    let opt = Sgd::new(model.parameters(), SgdConfig::new(0.01)).unwrap();
    let classes = dims[dims.len() - 1];
    train_step(
        &model,
        Box::new(opt),
        (&[batch, dims[0]], None),
        classes,
        55,
        &mut rng,
    )
}

/// The Fashion-MNIST example's CNN (conv3×3(1→32)-relu-maxpool2-conv3×3(32→64)-relu-maxpool2-
/// linear(3136→128)-relu-linear(128→10)), one Adam step on a batch of 64 random images; with
/// `precision`, its forward under autocast to that dtype.
fn cnn_step(precision: Option<DType>) -> ((f64, f64, f64, f64), StepMemory) {
    let mut rng = Rng::seed(0);
    let same = Conv2dConfig::default().padding(1);
    let model = Sequential::new()
        .add(Conv2d::with_config(1, 32, (3, 3), same, &mut rng).unwrap())
        .add(ReLU)
        .add(MaxPool2d::new((2, 2)).unwrap())
        .add(Conv2d::with_config(32, 64, (3, 3), same, &mut rng).unwrap())
        .add(ReLU)
        .add(MaxPool2d::new((2, 2)).unwrap())
        .add(Flatten::new())
        .add(Linear::new(64 * 7 * 7, 128, &mut rng).unwrap())
        .add(ReLU)
        .add(Linear::new(128, 10, &mut rng).unwrap());
    let opt = Adam::new(model.parameters(), AdamConfig::new(1e-3)).unwrap();
    let shape = [64, 1, 28, 28];
    train_step(&model, Box::new(opt), (&shape, precision), 10, 35, &mut rng)
}

/// Median (ms/step, fwd, bwd, opt) of `steps - 5` training steps (after 5 warm-up steps) of
/// `model` on one random batch of `in_shape` (the forward under autocast to `precision` when
/// given), and the last step's memory.
fn train_step(
    model: &Sequential,
    mut opt: Box<dyn Optimizer>,
    (in_shape, precision): (&[usize], Option<DType>),
    classes: usize,
    steps: usize,
    rng: &mut Rng,
) -> ((f64, f64, f64, f64), StepMemory) {
    let batch = in_shape[0];
    let x: Vec<f32> = (0..in_shape.iter().product::<usize>())
        .map(|_| rng.normal() as f32)
        .collect();
    let y: Vec<usize> = (0..batch).map(|_| rng.below(classes)).collect();
    let mut g = Graph::new();
    let (mut t, mut f, mut b, mut o) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut mem = StepMemory {
        after_forward: 0,
        arena_peak: 0,
        params: model.num_parameters() * 4,
    };
    for s in 0..steps {
        g.reset_peak_stats();
        let t0 = Instant::now();
        opt.zero_grad();
        let xt = g.from_slice(&x, in_shape).unwrap();
        let l = {
            let _mixed = precision.map(|d| g.autocast(d).unwrap());
            loss::cross_entropy(model.forward(&g, xt).unwrap(), &y).unwrap()
        };
        let t1 = Instant::now();
        mem.after_forward = g.stats().arena.bytes_in_use;
        l.backward().unwrap();
        let t2 = Instant::now();
        mem.arena_peak = g.stats().arena.peak_bytes_in_use;
        std::hint::black_box(l.item().unwrap());
        g.reset();
        opt.step().unwrap();
        let t3 = Instant::now();
        if s >= 5 {
            t.push((t3 - t0).as_secs_f64() * 1e3);
            f.push((t1 - t0).as_secs_f64() * 1e3);
            b.push((t2 - t1).as_secs_f64() * 1e3);
            o.push((t3 - t2).as_secs_f64() * 1e3);
        }
    }
    ((median(t), median(f), median(b), median(o)), mem)
}

/// The engine's speed figures as a table (W1 randn-matmul loop and GEMM, W2 tiny ops, W3/W4
/// MLP steps, a step of the Fashion-MNIST example's CNN).
#[derive(Debug, clap::Parser)]
#[command(name = "bench_core")]
struct Args {
    /// Fewer repetitions (a rough figure fast)
    #[arg(long)]
    quick: bool,
    /// Only these workloads, comma-separated: w1 (randn-matmul loop and GEMM), w2, w3, w4, cnn,
    /// attn, gpt, lstm (W5 and W6, fused and as cells, and a long stream), w5 and w6 (the fused
    /// layer alone), ckpt, bf16 (the bf16 product), amp (the GPT step under bf16 autocast)
    #[arg(long, value_delimiter = ',', value_parser = ["w1", "w2", "w3", "w4", "cnn", "attn", "gpt", "lstm", "w5", "w6", "ckpt", "bf16", "amp", "topk", "scatter", "convt", "conv", "ew"])]
    only: Vec<String>,
    /// Keep one more thread busy (a loop of arithmetic) while the workloads run, as an
    /// application's own thread would
    #[arg(long)]
    busy_thread: bool,
}

/// A thread that does arithmetic until the process ends: the application's own work beside the
/// engine's.
fn start_busy_thread() {
    std::thread::spawn(|| {
        let mut x = 1u64;
        loop {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
    });
}

fn main() {
    use clap::Parser;
    let args = Args::parse();
    let quick = args.quick;
    let run = |w: &str| args.only.is_empty() || args.only.iter().any(|x| x == w);
    if args.busy_thread {
        start_busy_thread();
    }
    let mut g = Graph::new();
    let threads = g.threads();
    let reps = if quick { 5 } else { 20 };
    let busy = if args.busy_thread {
        ", beside a busy application thread"
    } else {
        ""
    };
    // Which vectorised build the loops run (figures from different machines differ by it).
    let simd = arenagrad::exec::cpu::simd();
    println!("arenagrad core benchmarks ({threads} threads{busy}, {simd:?} loops)\n");
    println!("| workload | figure | target |");
    println!("|---|---|---|");
    if run("w2") {
        let (f16, t16) = tiny_chain(&mut g, 16, 10_000, reps);
        println!(
            "| W2 tiny-op chain, 16 elements, fwd+bwd | {t16:.1} ns/op (fwd {f16:.1}) | < 60 |"
        );
        let (f1, t1) = tiny_chain(&mut g, 1, 10_000, reps);
        println!("| W2 tiny-op chain, 1 element, fwd+bwd | {t1:.1} ns/op (fwd {f1:.1}) | < 30 |");
    }
    if run("w1") {
        w1(&mut g, threads, quick);
    }
    if run("bf16") {
        bf16_rows(threads, quick);
    }
    if run("w3") {
        w3();
    }
    if run("w4") {
        w4();
    }
    if run("cnn") {
        let ((ms, f, b, o), _) = cnn_step(None);
        println!(
            "| Fashion-MNIST CNN 32/64, b64 Adam step (random data) | {ms:.2} ms (fwd {f:.2}, bwd {b:.2}, opt {o:.2}) | |"
        );
    }
    if run("gpt") {
        let (ms, f, b, o, mem) = gpt_step(if quick { 8 } else { 20 }, None);
        println!(
            "| char GPT step (4×128, ctx 128, b32, AdamW, clip) | {ms:.1} ms (fwd {f:.1}, bwd {b:.1}, opt {o:.1}) | |"
        );
        println!(
            "| char GPT step peak memory | {:.1} MiB arena + {:.1} MiB params/grads/Adam = {:.2}× (params + grads + Adam + saved activations {:.1} MiB) | ≤ 1.3× |",
            mem.0 as f64 / 1048576.0,
            mem.1 as f64 / 1048576.0,
            (mem.0 + mem.1) as f64 / (mem.1 + mem.2) as f64,
            mem.2 as f64 / 1048576.0
        );
        if let Some(hwm) = rss("VmHWM:") {
            let base = (mem.1 + mem.2) as f64;
            println!(
                "| char GPT process resident memory at a step's end (high-water mark, first steps included) | {:.1} MiB = {:.2}× ({:.1} MiB = {:.2}×) params + grads + Adam + saved activations | ≤ 1.3× |",
                mem.3 as f64 / 1048576.0,
                mem.3 as f64 / base,
                hwm as f64 / 1048576.0,
                hwm as f64 / base
            );
        }
        let (tps, before, after) = gpt_generate(if quick { 300 } else { 2000 });
        println!("| char GPT generation, batch 1, key/value cache | {tps:.0} tokens/s | |");
        println!(
            "| char GPT generation, resident memory before → after | {:.1} → {:.1} MiB (one iteration, a scope per token) | flat |",
            before as f64 / 1048576.0,
            after as f64 / 1048576.0
        );
    }
    if run("amp") {
        // The f32 and the autocast runs alternate, a few steps each, and the ratio is the
        // median of the rounds' own: this machine's speed drifts within a minute.
        let rounds = if quick { 2 } else { 4 };
        let steps = if quick { 4 } else { 6 };
        let mut gpt = Vec::new();
        let (mut f32_mem, mut mem) = Default::default();
        for _ in 0..rounds {
            let (f32_ms, _, _, _, m32) = gpt_step(steps, None);
            let (ms, f, b, o, m) = gpt_step(steps, Some(DType::BF16));
            (f32_mem, mem) = (m32, m);
            gpt.push((ms / f32_ms, ms, f, b, o, f32_ms));
        }
        let (ratio, ms, f, b, o, f32_ms) = median_by_ratio(gpt);
        println!(
            "| char GPT step under bf16 autocast | {ms:.1} ms (fwd {f:.1}, bwd {b:.1}, opt {o:.1}) = {ratio:.2}× the f32 step's {f32_ms:.1} ms | ≤ 0.65× |"
        );
        let mut cnn = Vec::new();
        for _ in 0..rounds {
            let ((cnn32, ..), _) = cnn_step(None);
            let ((ms, f, b, o), _) = cnn_step(Some(DType::BF16));
            cnn.push((ms / cnn32, ms, f, b, o, cnn32));
        }
        let (ratio, ms, f, b, o, cnn32) = median_by_ratio(cnn);
        println!(
            "| Fashion-MNIST CNN step under bf16 autocast | {ms:.2} ms (fwd {f:.2}, bwd {b:.2}, opt {o:.2}) = {ratio:.2}× the f32 step's {cnn32:.2} ms | ≤ 0.7× |"
        );
        let mib = |b: usize| b as f64 / 1048576.0;
        println!(
            "| char GPT step under bf16 autocast, peak arena (after the forward) | {:.1} MiB ({:.1}) = {:.2}× the f32 step's {:.1} MiB ({:.1}) | ≤ 0.6× |",
            mib(mem.0),
            mib(mem.2),
            mem.0 as f64 / f32_mem.0 as f64,
            mib(f32_mem.0),
            mib(f32_mem.2)
        );
    }
    if run("lstm") {
        let steps = if quick { 8 } else { 30 };
        for batch in [1, 32] {
            let w = if batch == 1 { "W5" } else { "W6" };
            let fused = lstm_step(batch, false, steps);
            let cells = lstm_step(batch, true, steps);
            println!(
                "| {w} LSTM 128→256, seq 64, batch {batch}, SGD step, nn::LSTM (fused) | {:.3} ms ({:.1} GFLOP/s) | |",
                fused.0, fused.1
            );
            println!(
                "| {w} LSTM 128→256, seq 64, batch {batch}, SGD step, LSTMCell loop | {:.3} ms ({:.1} GFLOP/s) | |",
                cells.0, cells.1
            );
        }
        let n = if quick { 20_000 } else { 100_000 };
        let (before, after, secs) = tbptt_stream(n);
        println!(
            "| LSTM truncated BPTT over a {n}-step stream (64 a piece, state carried detached), resident memory after the first piece → at the end | {:.1} → {:.1} MiB ({:.1} s) | flat |",
            before as f64 / 1048576.0,
            after as f64 / 1048576.0,
            secs
        );
    }
    for (w, batch) in [("w5", 1), ("w6", 32)] {
        if !run("lstm") && args.only.iter().any(|x| x == w) {
            let steps = if quick { 8 } else { 30 };
            let fused = lstm_step(batch, false, steps);
            println!(
                "| {} LSTM 128→256, seq 64, batch {batch}, SGD step, nn::LSTM (fused) | {:.3} ms ({:.1} GFLOP/s) | |",
                w.to_uppercase(),
                fused.0,
                fused.1
            );
        }
    }
    if run("ckpt") {
        let steps = if quick { 5 } else { 20 };
        let (plain_ms, saved, plain_peak) = checkpoint_step(false, steps);
        let (ck_ms, _, ck_peak) = checkpoint_step(true, steps);
        println!(
            "| 8-block residual MLP 512→2048→512, b256, SGD step, without checkpointing | {plain_ms:.1} ms, peak {:.1} MiB (saved activations {:.1} MiB) | |",
            plain_peak as f64 / 1048576.0,
            saved as f64 / 1048576.0
        );
        println!(
            "| the same with each block checkpointed | {ck_ms:.1} ms = {:.2}×, peak {:.1} MiB = {:.0}% of the saved activations without | ≤ 1.4×, ≤ 40% |",
            ck_ms / plain_ms,
            ck_peak as f64 / 1048576.0,
            100.0 * ck_peak as f64 / saved as f64
        );
    }
    if run("topk") {
        println!(
            "| top-k 50 of 50,000 logits, batch 1 (sampling) | {:.1} µs | |",
            topk_micros(if quick { 50 } else { 500 })
        );
    }
    if run("convt") {
        let reps = if quick { 3 } else { 20 };
        println!(
            "| convt: ConvTranspose2d 64→32 k4 s2 p1, 14²→28², b64, fwd+bwd | {:.2} ms | |",
            convt_ms((4, 1), reps)
        );
        println!(
            "| convt: ConvTranspose2d 64→32 k2 s2, 14²→28², b64, fwd+bwd | {:.2} ms | |",
            convt_ms((2, 0), reps)
        );
    }
    if run("conv") {
        let reps = if quick { 3 } else { 20 };
        for (c, hw) in [(32, 28), (64, 14), (64, 7)] {
            println!(
                "| conv: Conv2d {c}→{c} 3×3 p1, {hw}², b64, fwd+bwd | {:.2} ms | |",
                conv_ms(c, hw, reps)
            );
        }
    }
    if run("scatter") {
        let reps = if quick { 3 } else { 10 };
        println!(
            "| scatter: index_add of 10^6 edges x 64 into 10^5 nodes, fwd+bwd | {:.1} ms | |",
            scatter_ms(reps, Scatter::IndexAdd)
        );
        println!(
            "| scatter_add of the same, the index expanded to [10^6, 64], fwd+bwd | {:.1} ms | |",
            scatter_ms(reps, Scatter::Add)
        );
        println!(
            "| scatter_reduce mean of the same (include_self false), fwd+bwd | {:.1} ms | |",
            scatter_ms(reps, Scatter::Mean)
        );
    }
    if run("ew") {
        let reps = if quick { 10 } else { 60 };
        for dtype in [DType::F32, DType::BF16] {
            for (op, dropout) in [("GELU", false), ("dropout 0.1", true)] {
                let ms = elementwise_ms(dtype, dropout, reps);
                println!("| ew: {op} [4096, 512] {dtype:?} fwd+bwd | {ms:.2} ms | |");
            }
        }
    }
    if run("attn") {
        let reps = if quick { 5 } else { 30 };
        let (fused, peak_f) = attention_step(true, reps);
        let (naive, peak_n) = attention_step(false, reps);
        println!(
            "| causal attention [32, 4, 128, 32] fwd+bwd, fused | {fused:.2} ms (peak {:.1} MiB) | |",
            peak_f as f64 / 1048576.0
        );
        println!(
            "| causal attention, composed (matmul, mask, softmax, matmul) | {naive:.2} ms (peak {:.1} MiB) | |",
            peak_n as f64 / 1048576.0
        );
    }
}

/// How [`scatter_ms`] adds the messages into the nodes.
#[derive(Clone, Copy, PartialEq)]
enum Scatter {
    /// `index_add(0, dst, msgs)`.
    IndexAdd,
    /// `scatter_add(0, dst expanded to [10⁶, 64], msgs)`.
    Add,
    /// `scatter_reduce(0, dst expanded, msgs, "mean", include_self=False)` (message passing's
    /// mean aggregation).
    Mean,
}

/// Median ms of message passing's sum: `zeros[N, 64].index_add(0, dst, msgs)` for 10⁶ random
/// destinations among 10⁵ nodes and messages `[10⁶, 64]` (f32, requiring grad), or the same
/// through `scatter_add` or `scatter_reduce`'s mean over `dst` expanded to `[10⁶, 64]`
/// ([`Scatter`]), then `Σ out²` backward (so the gradient is not a constant), the graph reset
/// after each.
fn scatter_ms(reps: usize, how: Scatter) -> f64 {
    use arenagrad::graph::ScatterReduce;
    let (e, n, f) = (1_000_000usize, 100_000usize, 64usize);
    let mut g = Graph::new();
    let mut rng = Rng::seed(7);
    let dst: Vec<i64> = (0..e).map(|_| (rng.next_u64() % n as u64) as i64).collect();
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps + 2 {
        // The inputs are made outside the timed part, as PyTorch's are.
        let idx = g.from_slice(&dst, &[e]).expect("dst");
        let msgs = g.randn(&[e, f], DType::F32).expect("msgs");
        let msgs = msgs.set_requires_grad(true).expect("leaf");
        // PyTorch's `dst.unsqueeze(1).expand(-1, F)` (a view there, made outside its timing).
        let wide = (how != Scatter::IndexAdd).then(|| {
            idx.reshape(&[e as isize, 1])
                .and_then(|i| i.broadcast_to(&[e, f]))
                .expect("expand")
        });
        let t = Instant::now();
        let nodes = g.zeros(&[n, f], DType::F32).expect("nodes");
        let out = match (how, wide) {
            (Scatter::Add, Some(w)) => nodes.scatter_add(0, w, msgs).expect("scatter_add"),
            (Scatter::Mean, Some(w)) => nodes
                .scatter_reduce(0, w, msgs, ScatterReduce::Mean, false)
                .expect("scatter_reduce"),
            _ => nodes.index_add(0, idx, msgs).expect("index_add"),
        };
        let l = out.mul(out).and_then(|o| o.sum()).expect("loss");
        l.backward().expect("backward");
        std::hint::black_box(msgs.grad().expect("grad"));
        times.push(t.elapsed().as_secs_f64() * 1e3);
        g.reset();
    }
    median(times[2..].to_vec())
}

/// Median ms of a 3×3 convolution `c`→`c` with padding 1 on `[64, c, hw, hw]` f32, forward and
/// `Σ y²` backward to the input and the weights.
fn conv_ms(c: usize, hw: usize, reps: usize) -> f64 {
    let mut rng = Rng::seed(3);
    let cfg = Conv2dConfig::default().padding(1);
    let layer = Conv2d::with_config(c, c, (3, 3), cfg, &mut rng).expect("layer");
    layer_step_ms(&layer, &[64, c, hw, hw], reps)
}

/// Median ms of a transposed convolution 64→32 (kernel `k`, stride 2, padding `p`) on
/// `[64, 64, 14, 14]` f32, forward and `Σ y²` backward to the input and the weights.
fn convt_ms((k, p): (usize, usize), reps: usize) -> f64 {
    use arenagrad::nn::{ConvTranspose2d, ConvTransposeConfig};
    let mut rng = Rng::seed(3);
    let cfg = ConvTransposeConfig {
        stride: (2, 2),
        padding: (p, p),
        ..Default::default()
    };
    let layer = ConvTranspose2d::new(64, 32, (k, k), cfg, &mut rng).expect("layer");
    layer_step_ms(&layer, &[64, 64, 14, 14], reps)
}

/// Median ms of `layer` on a random f32 input of `shape` that requires grad, forward and `Σ y²`
/// backward (the input made outside the timed part, as PyTorch's are), after 3 warm-up steps.
/// `y²` is `square`, the op of PyTorch's `y ** 2` on the other side.
fn layer_step_ms(layer: &dyn Module, shape: &[usize], reps: usize) -> f64 {
    let mut g = Graph::new();
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps + 3 {
        let x = g.randn(shape, DType::F32).expect("x");
        let x = x.set_requires_grad(true).expect("leaf");
        let t = Instant::now();
        let y = layer.forward(&g, x).expect("forward");
        y.square()
            .and_then(|s| s.sum())
            .expect("loss")
            .backward()
            .expect("backward");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        layer.zero_grad();
        g.reset();
    }
    median(times[3..].to_vec())
}

/// Median µs of `Tensor::topk(50)` over 50,000 random f32 logits `[1, 50000]` (values and
/// indices, no gradient recorded), each in its own scope.
fn topk_micros(reps: usize) -> f64 {
    let g = Graph::new();
    let _ng = g.no_grad();
    let logits = g.randn(&[1, 50_000], DType::F32).expect("logits");
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps + 10 {
        let t = Instant::now();
        g.scope(|_| {
            let (v, i) = logits.topk(50, -1, true)?;
            std::hint::black_box((v.id(), i));
            Ok(())
        })
        .expect("topk");
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    median(times[10..].to_vec())
}

/// W5/W6: median ms and GFLOP/s of an SGD step (lr 0.01) of an LSTM 128→256 over 64 random
/// positions at `batch`, the loss the mean square of the last hidden state against a random
/// target: one fused `nn::LSTM` layer, or a Rust loop of `LSTMCell` steps. The GFLOP count is
/// the matrix products' (forward 2·4h·(in + h) per row and step, backward twice that).
fn lstm_step(batch: usize, cells: bool, steps: usize) -> (f64, f64) {
    use arenagrad::nn::{LSTMCell, LSTM};
    let (t, i, h) = (64usize, 128usize, 256usize);
    let mut rng = Rng::seed(0);
    let x: Vec<f32> = (0..t * batch * i).map(|_| rng.normal() as f32).collect();
    let y: Vec<f32> = (0..batch * h).map(|_| rng.normal() as f32).collect();
    let layer = LSTM::new(i, h, &mut Rng::seed(1)).unwrap();
    let cell = LSTMCell::new(i, h, &mut Rng::seed(1)).unwrap();
    let params = if cells {
        cell.parameters()
    } else {
        layer.parameters()
    };
    let mut opt = Sgd::new(params, SgdConfig::new(0.01)).unwrap();
    let mut g = Graph::new();
    let mut times = Vec::new();
    for s in 0..steps + 3 {
        let t0 = Instant::now();
        opt.zero_grad();
        let xs = g.from_slice(&x, &[t, batch, i]).unwrap();
        let target = g.from_slice(&y, &[batch, h]).unwrap();
        let last = if cells {
            let mut state = None;
            for p in 0..t {
                let xt = xs
                    .slice(0, p, p + 1)
                    .unwrap()
                    .reshape(&[batch as isize, i as isize])
                    .unwrap();
                state = Some(cell.forward(&g, xt, state).unwrap());
            }
            state.unwrap().0
        } else {
            let out = layer.forward_with(&g, xs, None, None).unwrap();
            out.h_n.reshape(&[batch as isize, h as isize]).unwrap()
        };
        let l = loss::mse_loss(last, target).unwrap();
        l.backward().unwrap();
        std::hint::black_box(l.item().unwrap());
        g.reset();
        opt.step().unwrap();
        if s >= 3 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let ms = median(times);
    let flops = 3.0 * 2.0 * (4 * h * (i + h) * t * batch) as f64;
    (ms, flops / (ms * 1e-3) / 1e9)
}

/// Truncated backpropagation through time over a stream of `n` random steps: an LSTM 128→256
/// at batch 1, 64 steps a piece (an SGD step and a reset each), the state carried into the next
/// piece as plain numbers. Resident memory after the first piece and at the end, and seconds.
fn tbptt_stream(n: usize) -> (usize, usize, f64) {
    use arenagrad::nn::LSTM;
    let (t, i, h) = (64usize, 128usize, 256usize);
    let mut rng = Rng::seed(0);
    let x: Vec<f32> = (0..t * i).map(|_| rng.normal() as f32).collect();
    let y: Vec<f32> = (0..t * h).map(|_| rng.normal() as f32).collect();
    let layer = LSTM::new(i, h, &mut Rng::seed(1)).unwrap();
    let mut opt = Sgd::new(layer.parameters(), SgdConfig::new(0.01)).unwrap();
    let mut g = Graph::new();
    let mut state: Option<(HostTensor, HostTensor)> = None;
    let mut before = 0;
    let t0 = Instant::now();
    for piece in 0..n / t {
        opt.zero_grad();
        let xs = g.from_slice(&x, &[t, 1, i]).unwrap();
        let s = state
            .as_ref()
            .map(|(hs, cs)| (g.from_host(hs).unwrap(), g.from_host(cs).unwrap()));
        let out = layer.forward_with(&g, xs, s, None).unwrap();
        let target = g.from_slice(&y, &[t, 1, h]).unwrap();
        loss::mse_loss(out.output, target)
            .unwrap()
            .backward()
            .unwrap();
        state = Some((
            out.h_n.to_host().unwrap(),
            out.c_n.unwrap().to_host().unwrap(),
        ));
        g.reset();
        opt.step().unwrap();
        if piece == 0 {
            before = rss("VmRSS:").unwrap_or(0);
        }
    }
    (
        before,
        rss("VmRSS:").unwrap_or(0),
        t0.elapsed().as_secs_f64(),
    )
}

/// An 8-block residual MLP (each block Linear 512→2048, GELU, Linear 2048→512) at batch 256:
/// the median ms of an SGD step, the arena's bytes after the forward (the activations kept for
/// backward, inputs and parameters' copies included) and its peak, with or without each block
/// checkpointed.
fn checkpoint_step(checkpointed: bool, steps: usize) -> (f64, usize, usize) {
    use arenagrad::nn::{functional as F, GELU};
    use std::sync::Arc;
    let (width, batch) = (512usize, 256usize);
    let mut rng = Rng::seed(0);
    let blocks: Vec<Arc<Sequential>> = (0..8)
        .map(|_| {
            Arc::new(
                Sequential::new()
                    .add(Linear::new(width, 4 * width, &mut rng).unwrap())
                    .add(GELU)
                    .add(Linear::new(4 * width, width, &mut rng).unwrap()),
            )
        })
        .collect();
    let params: Vec<_> = blocks.iter().flat_map(|b| b.parameters()).collect();
    let mut opt = Sgd::new(params, SgdConfig::new(0.01)).unwrap();
    let x: Vec<f32> = (0..batch * width).map(|_| rng.normal() as f32).collect();
    let mut g = Graph::new();
    let (mut times, mut saved, mut peak) = (Vec::new(), 0, 0);
    for s in 0..steps + 3 {
        g.reset_peak_stats();
        let t0 = Instant::now();
        opt.zero_grad();
        let mut h = g.from_slice(&x, &[batch, width]).unwrap();
        for b in &blocks {
            let y = if checkpointed {
                F::checkpoint(&g, b, h).unwrap()
            } else {
                b.forward(&g, h).unwrap()
            };
            h = y.add(h).unwrap();
        }
        let l = h.square().unwrap().mean().unwrap();
        saved = g.stats().arena.bytes_in_use;
        l.backward().unwrap();
        peak = g.stats().arena.peak_bytes_in_use;
        g.reset();
        opt.step().unwrap();
        if s >= 3 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    (median(times), saved, peak)
}

/// The char_gpt example's model, step and data shape: random bytes (the figure is speed).
fn gpt_model() -> arenagrad::nn::Gpt {
    arenagrad::nn::Gpt::new(arenagrad::nn::GptConfig::char_default(), &mut Rng::seed(0)).unwrap()
}

/// Median (ms/step, fwd, bwd, opt) of training steps of the char GPT, and memory: the arena's
/// peak, the bytes of parameters + gradients + Adam's two moments, and of the activations
/// saved after the forward (the arena's bytes in use then).
/// With `precision`, the forward runs under autocast to that dtype.
fn gpt_step(
    steps: usize,
    precision: Option<DType>,
) -> (f64, f64, f64, f64, (usize, usize, usize, usize)) {
    use arenagrad::nn::optim::{clip_grad_norm, AdamConfig, AdamW};
    let model = gpt_model();
    let mut opt = AdamW::with_groups(
        model.param_groups(0.1),
        AdamConfig::adamw(3e-3).weight_decay(0.1),
    )
    .unwrap();
    let (b, t) = (32usize, 128usize);
    let mut rng = Rng::seed(1);
    let x: Vec<usize> = (0..b * t).map(|_| rng.below(256)).collect();
    let y: Vec<usize> = (0..b * t).map(|_| rng.below(256)).collect();
    let mut g = Graph::new();
    let (mut tt, mut f, mut bw, mut o) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut peak, mut saved, mut resident) = (0, 0, 0);
    for s in 0..steps + 3 {
        g.reset_peak_stats();
        let t0 = Instant::now();
        opt.zero_grad();
        let l = {
            let _mixed = precision.map(|d| g.autocast(d).unwrap());
            model.loss(&g, &x, &y, b, t).unwrap()
        };
        let t1 = Instant::now();
        saved = g.stats().arena.bytes_in_use;
        l.backward().unwrap();
        let t2 = Instant::now();
        peak = g.stats().arena.peak_bytes_in_use;
        // Resident memory at the step's end, before the reset: the arena at its fullest.
        resident = rss("VmRSS:").unwrap_or(0);
        std::hint::black_box(l.item().unwrap());
        g.reset();
        clip_grad_norm(opt.parameters(), 1.0).unwrap();
        opt.step().unwrap();
        let t3 = Instant::now();
        if s >= 3 {
            tt.push((t3 - t0).as_secs_f64() * 1e3);
            f.push((t1 - t0).as_secs_f64() * 1e3);
            bw.push((t2 - t1).as_secs_f64() * 1e3);
            o.push((t3 - t2).as_secs_f64() * 1e3);
        }
    }
    let state = model.num_parameters() * 4 * 4;
    (
        median(tt),
        median(f),
        median(bw),
        median(o),
        (peak, state, saved, resident),
    )
}

/// A line of Linux's `/proc/self/status` in bytes: `VmRSS:` (resident now), `VmHWM:` (its
/// high-water mark).
fn rss(key: &str) -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Tokens/s of the char GPT generating `n` tokens at batch 1 with its key/value cache, and the
/// process's resident bytes before and after (all `n` in one iteration).
fn gpt_generate(n: usize) -> (f64, usize, usize) {
    let mut model = gpt_model();
    model.eval();
    let mut g = Graph::new();
    let prompt: Vec<usize> = b"The meaning of life is"
        .iter()
        .map(|&c| usize::from(c))
        .collect();
    let sampling = arenagrad::nn::Sampling {
        temperature: 0.8,
        top_k: Some(40),
        top_p: None,
    };
    let mut rng = Rng::seed(0);
    let _ = model.generate(&g, &prompt, 10, sampling, &mut rng).unwrap();
    g.reset();
    let before = rss("VmRSS:").unwrap_or(0);
    let t0 = Instant::now();
    let out = model.generate(&g, &prompt, n, sampling, &mut rng).unwrap();
    let tps = out.len() as f64 / t0.elapsed().as_secs_f64();
    (tps, before, rss("VmRSS:").unwrap_or(0))
}

/// Median ms of `op(x).sum()` forward and backward for `x` of `[4096, 512]` in `dtype`
/// (requiring grad; made outside the timed part), `op` GELU or dropout with p = 0.1.
fn elementwise_ms(dtype: DType, dropout: bool, reps: usize) -> f64 {
    let mut g = Graph::new();
    let mut times = Vec::with_capacity(reps);
    for rep in 0..reps + 3 {
        let x = g.randn(&[4096, 512], DType::F32).expect("x");
        let x = x.to_dtype(dtype).expect("cast").detach().expect("detach");
        let x = x.set_requires_grad(true).expect("leaf");
        let t = Instant::now();
        let y = if dropout {
            x.dropout(0.1, true).expect("dropout")
        } else {
            x.gelu().expect("gelu")
        };
        y.sum().expect("sum").backward().expect("backward");
        if rep >= 3 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        g.reset();
    }
    median(times)
}

/// Median ms of forward + backward of causal self-attention, `[32, 4, 128, 32]` f32 (fused or
/// composed), and the arena's peak bytes in the step.
fn attention_step(fused: bool, reps: usize) -> (f64, usize) {
    let (b, h, l, d) = (32usize, 4usize, 128usize, 32usize);
    let mut rng = Rng::seed(0);
    let n = b * h * l * d;
    let data: Vec<Vec<f32>> = (0..3)
        .map(|_| (0..n).map(|_| rng.normal() as f32).collect())
        .collect();
    let mut g = Graph::new();
    let mut times = Vec::new();
    let mut peak = 0;
    for _ in 0..reps + 3 {
        g.reset_peak_stats();
        let t0 = Instant::now();
        let t: Vec<Tensor<'_>> = data
            .iter()
            .map(|v| {
                g.from_slice(v, &[b, h, l, d])
                    .unwrap()
                    .set_requires_grad(true)
                    .unwrap()
            })
            .collect();
        let o = if fused {
            let opts = AttentionOptions {
                causal: true,
                ..Default::default()
            };
            t[0].scaled_dot_product_attention(t[1], t[2], opts).unwrap()
        } else {
            let s = t[0]
                .matmul(t[1].transpose(-2, -1).unwrap())
                .unwrap()
                .scale(1.0 / (d as f64).sqrt())
                .unwrap();
            let hide = g.full(&[l, l], 1.0, DType::F32).unwrap().triu(1).unwrap();
            let s = s.masked_fill(hide, f64::NEG_INFINITY).unwrap();
            s.softmax(-1).unwrap().matmul(t[2]).unwrap()
        };
        o.sum().unwrap().backward().unwrap();
        std::hint::black_box(t[0].grad().unwrap());
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        peak = g.stats().arena.peak_bytes_in_use;
        g.reset();
    }
    (median(times[3..].to_vec()), peak)
}

fn w1(g: &mut Graph, threads: usize, quick: bool) {
    let gg = gemm_graph(g, 1024, if quick { 3 } else { 10 });
    println!("| f32 GEMM 1024³ through the graph | {gg:.0} GFLOP/s | ≥ 250 |");
    let g1 = gemm_raw(1024, 1, if quick { 3 } else { 10 });
    let gt = gemm_raw(1024, threads, if quick { 3 } else { 10 });
    println!("| raw GEMM kernel, 1 thread | {g1:.0} GFLOP/s | |");
    println!("| raw GEMM kernel, row-split over {threads} threads | {gt:.0} GFLOP/s | |");
    let (ms, randn, bare) = randn_matmul_loop(g, 1024, if quick { 5 } else { 30 });
    println!("| randn-matmul loop 1024², randn+matmul+sum+backward | {ms:.1} ms/iter (randn {randn:.1}) | ≤ 30 |");
    println!(
        "| 3 bare GEMMs + randn (same run) | {bare:.1} ms/iter; graph overhead {:+.1}% | ≤ +15% |",
        (ms / bare - 1.0) * 100.0
    );
}

fn w3() {
    let ((w3, f3, b3, o3), m3) = mlp_step(&[784, 512, 512, 10], 128);
    println!("| W3 MLP 784-512-512-10 b128 SGD step | {w3:.2} ms (fwd {f3:.2}, bwd {b3:.2}, opt {o3:.2}) | ≤ 3.0 |");
    // Peak of the step: the arena's peak plus the parameters and their gradients, which live
    // outside it (the arena reads parameters in place); against parameters + gradients +
    // optimiser state (plain SGD: none) + activations (what the arena holds after forward).
    let mb = |b: usize| b as f64 / (1 << 20) as f64;
    let peak = m3.arena_peak + 2 * m3.params;
    let activations = m3.after_forward;
    let floor = 2 * m3.params + activations;
    println!(
        "| W3 step peak memory | {:.2} MiB (arena {:.2} + parameters and gradients {:.2}) = {:.2}× the {:.2} MiB of parameters, gradients and activations | ≤ 1.2× |",
        mb(peak),
        mb(m3.arena_peak),
        mb(2 * m3.params),
        peak as f64 / floor as f64,
        mb(floor)
    );
}

fn w4() {
    let ((w4, f4, b4, o4), _) = mlp_step(&[64, 64, 64, 10], 32);
    println!(
        "| W4 MLP 64-64-64-10 b32 SGD step | {:.1} µs (fwd {:.1}, bwd {:.1}, opt {:.1}) | ≤ 20 |",
        w4 * 1e3,
        f4 * 1e3,
        b4 * 1e3,
        o4 * 1e3
    );
}
