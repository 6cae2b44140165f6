//! The Fashion-MNIST CNN trained data-parallel: every rank holds the model, reads its own share
//! of each epoch (a distributed sampler) and averages gradients with the others in buckets that
//! start all-reducing during backward. Rank 0 prints, evaluates and writes the checkpoint.
//!
//! ```text
//! # two ranks on one machine (as root, add --allow-run-as-root):
//! cargo build --release --features mpi --example ddp_fashion_mnist
//! mpirun -np 2 --oversubscribe target/release/examples/ddp_fashion_mnist
//! # one process, no MPI:
//! cargo run --release --example ddp_fashion_mnist
//!     [--data DIR] [--epochs 1] [--batch 32] [--lr 2e-3] [--channels 32,64] [--limit N]
//!     [--seed 0] [--bucket-mb 25] [--log-every 100] [--checkpoint PATH]
//! ```
//!
//! `--batch` is each rank's: N ranks step on N × batch examples. Each logged step shows where a
//! rank's time went: forward, backward, and the wait after backward for the gradient
//! all-reduces still in flight (what overlapping them with backward saves). The data are
//! Debian's `dataset-fashion-mnist`, as `fashion_mnist`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arenagrad::dist::{
    Communicator, DataParallel, DdpConfig, DistError, DistributedSampler, Local, Reduce,
};
use arenagrad::nn::data::Dataset;
use arenagrad::nn::optim::{Adam, AdamConfig, CosineAnnealingLr, LrSchedule, Optimizer};
use arenagrad::nn::{checkpoint, loss, metrics, Module, Rng, Sequential};
use arenagrad::prelude::*;

#[path = "common/fashion.rs"]
mod fashion;
#[path = "common/setup.rs"]
mod setup;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "ddp_fashion_mnist")]
struct Args {
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    data: PathBuf,
    #[arg(long, default_value_t = 1, value_parser = setup::positive)]
    epochs: usize,
    /// Examples per step on each rank.
    #[arg(long, default_value_t = 32, value_parser = setup::positive)]
    batch: usize,
    #[arg(long, default_value_t = 2e-3, value_parser = setup::positive_real)]
    lr: f64,
    #[arg(long, default_value = "32,64", value_parser = channels)]
    channels: (usize, usize),
    /// Train on the first N images (and test on as many).
    #[arg(long, value_parser = setup::positive)]
    limit: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Gradient bucket size, MiB (the first bucket is at most 1 MiB).
    #[arg(long, default_value_t = 25.0, value_parser = setup::positive_real)]
    bucket_mb: f64,
    #[arg(long, default_value_t = 100, value_parser = setup::positive)]
    log_every: usize,
    #[arg(long, default_value_os_t = std::env::temp_dir().join("arenagrad-ddp-fashion-mnist.safetensors"))]
    checkpoint: PathBuf,
}

fn channels(s: &str) -> Result<(usize, usize), String> {
    let v: Vec<usize> = s
        .split(',')
        .map(|c| {
            c.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{c}` is not a channel count"))
        })
        .collect::<Result<_, _>>()?;
    match v[..] {
        [c1, c2] if c1 > 0 && c2 > 0 => Ok((c1, c2)),
        _ => Err("expected C1,C2, each at least 1".into()),
    }
}

/// The world this process belongs to: MPI's when `mpirun` started it, else its own.
fn communicator() -> Result<Arc<dyn Communicator>, DistError> {
    #[cfg(feature = "mpi")]
    if arenagrad::dist::launched_by_mpi() {
        let mpi = arenagrad::dist::ProcessGroup::mpi(arenagrad::dist::MpiConfig::default())?;
        return Ok(Arc::new(mpi));
    }
    #[cfg(not(feature = "mpi"))]
    if arenagrad::dist::launched_by_mpi() {
        return Err(DistError::BadArgument {
            op: "ddp_fashion_mnist",
            what: "started by mpirun, but built without MPI: build with `--features mpi`".into(),
        });
    }
    Ok(Arc::new(Local))
}

/// Test accuracy over all ranks: each evaluates its share, the counts are summed.
fn evaluate(
    model: &DataParallel<Sequential>,
    g: &mut Graph,
    test: &Dataset,
    comm: &dyn Communicator,
) -> Result<f64, DistError> {
    let share = DistributedSampler::new(test.len(), comm, 0)
        .shuffle(false)
        .drop_last(true)
        .indices(0)?;
    let mut correct = 0usize;
    for rows in share.chunks(250) {
        let (x, y) = test.batch(rows)?;
        {
            let _ng = g.no_grad();
            let logits = model.forward(g, g.from_host(&x)?)?;
            correct += metrics::correct(logits, &y)?;
        }
        g.reset();
    }
    let all = comm.all_reduce(
        HostData::F64(vec![correct as f64, share.len() as f64]),
        Reduce::Sum,
    )?;
    let v = all.to_f64_vec();
    Ok(v[0] / v[1].max(1.0))
}

/// Where a rank's step time went, summed over the steps since the last report.
#[derive(Default)]
struct Times {
    steps: usize,
    forward: Duration,
    backward: Duration,
    wait: Duration,
    in_backward: usize,
    buckets: usize,
}

fn ms(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e3 / n.max(1) as f64
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Checked on every rank before any work, so that all of them stop (rather than the others
    // waiting for rank 0 until the timeout).
    setup::check_writable("the checkpoint", "--checkpoint", &args.checkpoint)?;
    let comm = communicator()?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let main = rank == 0;
    let (train, test) = fashion::datasets(&args.data, args.limit, !main)?;
    let mut rng = Rng::seed(args.seed);
    let config = DdpConfig {
        bucket_bytes: (args.bucket_mb * (1 << 20) as f64) as usize,
        first_bucket_bytes: ((args.bucket_mb * (1 << 20) as f64) as usize).min(1 << 20),
        ..DdpConfig::default()
    };
    let model = DataParallel::new(
        fashion::cnn(args.channels, &mut rng)?,
        Arc::clone(&comm),
        config,
    )?;
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(args.lr))?;
    let sampler = DistributedSampler::new(train.len(), comm.as_ref(), args.seed);
    let per_epoch = sampler.num_samples().div_ceil(args.batch.max(1));
    let cosine = CosineAnnealingLr::new(args.lr, (args.epochs * per_epoch).max(1), 0.0)?;
    let mut g = Graph::new();
    g.seed(args.seed + rank as u64);
    if main {
        println!(
            "arenagrad ddp fashion-mnist: {world} rank{} over {} ({} thread{} each), CNN of {} \
             parameters in {} gradient bucket{}, {} train / {} test images, batch {} per rank \
             ({} a step), Adam lr {} (cosine to 0)",
            if world == 1 { "" } else { "s" },
            comm.backend(),
            g.threads(),
            if g.threads() == 1 { "" } else { "s" },
            model.num_parameters(),
            model.buckets(),
            if model.buckets() == 1 { "" } else { "s" },
            train.len(),
            test.len(),
            args.batch,
            args.batch * world,
            args.lr
        );
        println!(
            "{:>6} {:>8} {:>11} {:>12} {:>14} {:>12}",
            "step", "loss", "forward ms", "backward ms", "comm wait ms", "in backward"
        );
    }
    let mut step = 0usize;
    let t_all = Instant::now();
    let mut times = Times::default();
    let mut total = Times::default();
    let mut running = 0.0f64;
    for epoch in 0..args.epochs {
        let order = sampler.indices(epoch as u64)?;
        for rows in order.chunks(args.batch) {
            opt.set_learning_rate(cosine.lr_at(step))?;
            opt.zero_grad();
            let (x, y) = train.batch(rows)?;
            let t0 = Instant::now();
            let l = loss::cross_entropy(model.forward(&g, g.from_host(&x)?)?, &y)?;
            let t1 = Instant::now();
            l.backward()?;
            let t2 = Instant::now();
            running += l.item()?;
            g.reset();
            let stats = model.step(&mut opt)?;
            step += 1;
            for t in [&mut times, &mut total] {
                t.steps += 1;
                t.forward += t1 - t0;
                t.backward += t2 - t1;
                t.wait += stats.wait;
                t.in_backward += stats.started_in_backward;
                t.buckets += stats.buckets;
            }
            if step.is_multiple_of(args.log_every) || step == args.epochs * per_epoch {
                // Every rank takes part: the loss shown is the mean over the ranks.
                let mean = comm.all_reduce(
                    HostData::F64(vec![running / times.steps as f64]),
                    Reduce::Mean,
                )?;
                if main {
                    println!(
                        "{step:>6} {:>8.4} {:>11.2} {:>12.2} {:>14.3} {:>11.0}%",
                        mean.to_f64_vec()[0],
                        ms(times.forward, times.steps),
                        ms(times.backward, times.steps),
                        ms(times.wait, times.steps),
                        100.0 * times.in_backward as f64 / times.buckets.max(1) as f64
                    );
                }
                times = Times::default();
                running = 0.0;
            }
        }
        let acc = evaluate(&model, &mut g, &test, comm.as_ref())?;
        if main {
            println!("epoch {}: test accuracy {:.2}%", epoch + 1, 100.0 * acc);
        }
    }
    let secs = t_all.elapsed().as_secs_f64();
    model
        .on_main(|| checkpoint::save(model.module(), &args.checkpoint))
        .map_err(|e| setup::write_failed("the checkpoint", "--checkpoint", &args.checkpoint, e))?;
    if main {
        println!(
            "{step} steps in {secs:.1} s: {:.0} images/s over {world} rank{}; per step \
             forward {:.2} ms, backward {:.2} ms, waiting for gradients after backward {:.3} ms \
             ({:.0}% of buckets started during backward)",
            (step * args.batch * world) as f64 / secs,
            if world == 1 { "" } else { "s" },
            ms(total.forward, total.steps),
            ms(total.backward, total.steps),
            ms(total.wait, total.steps),
            100.0 * total.in_backward as f64 / total.buckets.max(1) as f64
        );
        println!(
            "checkpoint (rank 0's, loads on any number of ranks): {}",
            args.checkpoint.display()
        );
    }
    Ok(())
}
