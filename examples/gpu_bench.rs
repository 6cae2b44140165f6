//! GPU workloads, one line of figures each (the PyTorch scripts in `scripts/torch_*.py` print the
//! same lines):
//!
//! ```text
//! cargo run --release --features cuda --example gpu_bench -- info
//! cargo run --release --features cuda --example gpu_bench -- leak-check --n 4096 --iters 50
//! cargo run --release --features cuda --example gpu_bench -- mlp --batch 1024 --steps 50
//! cargo run --release --features cuda --example gpu_bench -- queue --width 1024 --ops 100
//! ```
//!
//! * `info`: the NVRTC and driver versions, and each device with how its kernels were built
//!   (machine code for its architecture, or PTX and why).
//! * `leak-check`: a leak check, `x = randn(n, n, requires_grad)`,
//!   `(x @ x).sum().backward()`, with the caching allocator's `num_device_alloc` after the first
//!   and after the last iteration (a steady loop must not grow it).
//! * `mlp`: a 784-512-512-10 ReLU MLP training step (cross-entropy, SGD) and the peak of device
//!   memory held by tensors.
//! * `queue`: the host time spent queueing a recorded forward pass of `ops` ops (alternating a
//!   `width`×`width` matmul and tanh on a 4096×`width` batch that requires grad) against the
//!   GPU time of that work, measured with CUDA events.
use std::process::ExitCode;
use std::time::Instant;

use arenagrad::nn::optim::{Optimizer, Sgd, SgdConfig};
use arenagrad::nn::{loss, Linear, Module, ReLU, Rng, Sequential};
use arenagrad::prelude::*;

fn arg(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(k) => match args.get(k + 1).map(|v| v.parse::<usize>()) {
            // A device is an ordinal from 0; every other flag is a count of at least 1.
            Some(Ok(n)) if n > 0 || name == "--device" => Ok(n),
            Some(Ok(_)) => Err(format!("{name} needs a whole number of at least 1, not 0")),
            Some(Err(_)) => Err(format!(
                "{name} needs a whole number, not `{}`",
                args[k + 1]
            )),
            None => Err(format!("{name} needs a whole number after it")),
        },
    }
}

fn alloc_count(dev: Device) -> Result<u64, GraphError> {
    Ok(arenagrad::memory_stats(dev)?
        .get("num_device_alloc")
        .copied()
        .unwrap_or(0))
}

fn leak_check(dev: Device, n: usize, iters: usize) -> Result<(), GraphError> {
    let mut g = Graph::on(dev)?;
    let step = |g: &mut Graph| -> Result<(), GraphError> {
        let x = g.randn(&[n, n], DType::F32)?.set_requires_grad(true)?;
        x.matmul(x)?.sum()?.backward()?;
        g.reset();
        Ok(())
    };
    step(&mut g)?;
    arenagrad::synchronize(dev)?;
    let first = alloc_count(dev)?;
    let t = Instant::now();
    for _ in 1..iters {
        step(&mut g)?;
    }
    arenagrad::synchronize(dev)?;
    let ms = t.elapsed().as_secs_f64() * 1e3 / (iters.max(2) - 1) as f64;
    println!(
        "leak_check n={n} iters={iters} ms_per_iter={ms:.3} num_device_alloc_first={first} num_device_alloc_last={}",
        alloc_count(dev)?
    );
    Ok(())
}

fn mlp(dev: Device, batch: usize, steps: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng::seed(0);
    let mut model = Sequential::new();
    model.push(Linear::new(784, 512, &mut rng)?);
    model.push(ReLU);
    model.push(Linear::new(512, 512, &mut rng)?);
    model.push(ReLU);
    model.push(Linear::new(512, 10, &mut rng)?);
    let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.01))?;
    let x = HostTensor::new(
        (0..batch * 784)
            .map(|_| rng.uniform() as f32)
            .collect::<Vec<f32>>(),
        &[batch, 784],
    )?;
    let y: Vec<usize> = (0..batch).map(|_| rng.below(10)).collect();
    let mut g = Graph::on(dev)?;
    let mut step = |g: &mut Graph| -> Result<(), Box<dyn std::error::Error>> {
        opt.zero_grad();
        let xt = g.from_host(&x)?;
        let l = loss::cross_entropy(model.forward(g, xt)?, &y)?;
        l.backward()?;
        g.reset();
        opt.step()?;
        Ok(())
    };
    for _ in 0..5 {
        step(&mut g)?;
    }
    arenagrad::synchronize(dev)?;
    arenagrad::reset_peak_stats(dev)?;
    let t = Instant::now();
    for _ in 0..steps {
        step(&mut g)?;
    }
    arenagrad::synchronize(dev)?;
    let ms = t.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64;
    let peak = arenagrad::memory_stats(dev)?
        .get("allocated_bytes.all.peak")
        .copied()
        .unwrap_or(0);
    println!("mlp batch={batch} ms_per_step={ms:.3} peak_allocated_bytes={peak}");
    Ok(())
}

#[cfg(feature = "cuda")]
fn queue(dev: Device, width: usize, ops: usize) -> Result<(), Box<dyn std::error::Error>> {
    let Device::Cuda(ordinal) = dev else {
        return Err("queue needs a CUDA device".into());
    };
    let backend = arenagrad::exec::cuda::CudaBackend::get(ordinal)?;
    let mut g = Graph::on(dev)?;
    let layers = ops.div_ceil(2);
    let run = |g: &mut Graph, time: bool| -> Result<(f64, f64), Box<dyn std::error::Error>> {
        let ws = (0..layers)
            .map(|_| {
                g.randn(&[width, width], DType::F32)?
                    .scale(1.0 / (width as f64).sqrt())
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Recorded for backward, as a training forward is.
        let mut x = g
            .randn(&[4096, width], DType::F32)?
            .set_requires_grad(true)?;
        arenagrad::synchronize(dev)?;
        let start = backend.record_event()?;
        let t = Instant::now();
        for (k, w) in ws.iter().enumerate() {
            x = x.matmul(*w)?;
            if 2 * k + 1 < ops {
                x = x.tanh()?;
            }
        }
        let host = t.elapsed().as_secs_f64() * 1e3;
        let end = backend.record_event()?;
        end.synchronize()?;
        let gpu = f64::from(start.elapsed_ms(&end)?);
        g.reset();
        Ok(if time { (host, gpu) } else { (0.0, 0.0) })
    };
    run(&mut g, false)?;
    let (host, gpu) = run(&mut g, true)?;
    println!(
        "queue width={width} ops={ops} host_ms={host:.3} gpu_ms={gpu:.3} ratio={:.4}",
        host / gpu
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn queue(_dev: Device, _width: usize, _ops: usize) -> Result<(), Box<dyn std::error::Error>> {
    Err("queue times CUDA events: build with --features cuda".into())
}

/// The NVRTC and driver versions, then each device with how its kernels were built.
#[cfg(feature = "cuda")]
fn info() -> Result<(), Box<dyn std::error::Error>> {
    use arenagrad::exec::cuda;
    println!("info {}", cuda::versions());
    let n = cuda::device_count()?;
    for o in 0..n {
        let be = cuda::CudaBackend::get(o)?;
        println!(
            "info cuda:{o} {}: kernels as {}",
            be.name(),
            be.kernel_image()
        );
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn info() -> Result<(), Box<dyn std::error::Error>> {
    Err("built without the `cuda` feature: rebuild with --features cuda".into())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let dev = Device::Cuda(arg(&args, "--device", 0)?);
        match args.first().map(String::as_str) {
            Some("leak-check") => leak_check(dev, arg(&args, "--n", 4096)?, arg(&args, "--iters", 50)?)?,
            Some("mlp") => mlp(dev, arg(&args, "--batch", 1024)?, arg(&args, "--steps", 50)?)?,
            Some("queue") => queue(dev, arg(&args, "--width", 1024)?, arg(&args, "--ops", 100)?)?,
            Some("info") => info()?,
            _ => return Err("usage: gpu_bench info|leak-check|mlp|queue [--n N --iters N | --batch N --steps N | --width N --ops N] [--device ORDINAL]".into()),
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
