//! Trains a small CNN (or an MLP) on Fashion-MNIST on the CPU, reports test accuracy each
//! epoch, saves a resumable checkpoint after each epoch, and at the end reloads it into a fresh
//! model and evaluates again.
//!
//! ```text
//! cargo run --release --example fashion_mnist -- [--data DIR] [--model cnn|mlp]
//!     [--epochs 2] [--batch 64] [--lr 2e-3] [--schedule cosine|constant] [--channels 32,64]
//!     [--limit N] [--seed 0] [--checkpoint PATH] [--resume] [--until EPOCH] [--init PATH]
//!     [--order shuffled|fixed] [--steps N] [--log-every N] [--precision f32|bf16|f16]
//!     [--plot fashion_mnist.png]
//! ```
//!
//! The checkpoint holds the model, Adam's state and the progress (steps and epochs done, the
//! data order's generator, the curves so far); `--resume` continues from the last finished epoch
//! to `--epochs` and ends with the weights an uninterrupted run would have (`--until EPOCH`
//! stops early, as an interruption would).
//!
//! `--init` starts from weights in a safetensors file (PyTorch's `state_dict` names), `--order
//! fixed` feeds the training images in file order, `--steps` stops after that many steps (and
//! anneals over them) and `--log-every` prints the loss of every N-th step: with
//! `scripts/torch_fashion_mnist.py --init` they run the same training as PyTorch from the same
//! initial weights, step for step.
//!
//! `--precision bf16` runs the forward and the evaluation under bf16 autocast (convolutions and
//! linear layers in bf16, the weights, their gradients and Adam in f32); `--precision f16` the
//! same in f16 with loss scaling.
//!
//! The data are the IDX files of Debian's `dataset-fashion-mnist` package
//! (`/usr/share/datasets/fashion-mnist/` by default). The CNN is
//! conv3×3(1→32)-relu-maxpool2-conv3×3(32→64)-relu-maxpool2-linear(3136→128)-relu-linear(128→10),
//! trained with Adam (batch 64), its learning rate annealed from 2e-3 to 0 along a cosine over
//! the run's steps (`--schedule constant --lr 1e-3` is PyTorch's plain recipe).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use arenagrad::nn::checkpoint::{self, Progress};
use arenagrad::nn::data::Dataset;
use arenagrad::nn::optim::{Adam, AdamConfig, CosineAnnealingLr, LrSchedule, Optimizer};
use arenagrad::nn::{loss, metrics, Flatten, Linear, Module, NnError, ReLU, Rng, Sequential};
use arenagrad::prelude::*;

#[path = "common/fashion.rs"]
mod fashion;
#[path = "common/font.rs"]
mod font;
#[path = "common/precision.rs"]
mod precision;
#[path = "common/setup.rs"]
mod setup;
use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use precision::Precision;
use setup::{positive, positive_real};

/// Trains a CNN (or an MLP) on Fashion-MNIST on the CPU and reports test accuracy per epoch.
#[derive(Debug, Parser)]
#[command(name = "fashion_mnist")]
struct Args {
    /// Folder with train-/t10k-{images-idx3,labels-idx1}-ubyte.gz
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    data: PathBuf,
    /// Network to train
    #[arg(long, value_enum, default_value_t = ModelKind::Cnn)]
    model: ModelKind,
    /// Passes over the training images
    #[arg(long, default_value_t = 2, value_parser = positive)]
    epochs: usize,
    /// Images per step
    #[arg(long, default_value_t = 64, value_parser = positive)]
    batch: usize,
    /// Adam's learning rate (the schedule's start)
    #[arg(long, default_value_t = 2e-3, value_parser = positive_real)]
    lr: f64,
    /// Learning-rate schedule over the run's steps
    #[arg(long, value_enum, default_value_t = Schedule::Cosine)]
    schedule: Schedule,
    /// The CNN's channels: C1,C2 (C2 defaults to 2·C1)
    #[arg(long, default_value = "32,64", value_parser = parse_channels)]
    channels: (usize, usize),
    /// Train on the first N images only
    #[arg(long, value_parser = positive)]
    limit: Option<usize>,
    /// Seed of the weights, the data order and the graph's generator
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to save the model, the optimiser state and the progress after each epoch (and
    /// reload the model from at the end)
    #[arg(long, default_value_os_t = std::env::temp_dir().join("arenagrad-fashion-mnist.safetensors"))]
    checkpoint: PathBuf,
    /// Continue from --checkpoint after its last epoch (model, optimiser, steps, data order):
    /// the same command with --resume gives the weights of an uninterrupted run
    #[arg(long)]
    resume: bool,
    /// Stop after this epoch, as if interrupted (the schedule still spans --epochs)
    #[arg(long, value_parser = positive)]
    until: Option<usize>,
    /// Start from the weights in this safetensors file (PyTorch's state_dict names)
    #[arg(long)]
    init: Option<PathBuf>,
    /// Order of the training images in each epoch
    #[arg(long, value_enum, default_value_t = Order::Shuffled)]
    order: Order,
    /// Stop after N steps (and anneal over them)
    #[arg(long, value_parser = positive)]
    steps: Option<usize>,
    /// Print the loss of every N-th step
    #[arg(long, value_parser = positive)]
    log_every: Option<usize>,
    /// The forward's precision: f32, or bf16/f16 autocast (f16 with loss scaling)
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    precision: Precision,
    /// Where to write the training curves (PNG)
    #[arg(long, default_value = "fashion_mnist.png")]
    plot: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModelKind {
    Cnn,
    Mlp,
}

impl ModelKind {
    fn name(self) -> &'static str {
        match self {
            ModelKind::Cnn => "cnn",
            ModelKind::Mlp => "mlp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Schedule {
    /// Cosine annealing to 0 over the run's steps
    Cosine,
    /// The same rate throughout (PyTorch's plain recipe, with --lr 1e-3)
    Constant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Order {
    /// A fresh shuffle per epoch, from the seed
    Shuffled,
    /// File order
    Fixed,
}

fn parse_channels(s: &str) -> Result<(usize, usize), String> {
    let v = s
        .split(',')
        .map(|c| {
            c.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{c}` is not a channel count"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match v[..] {
        [c1] if c1 > 0 => Ok((c1, 2 * c1)),
        [c1, c2] if c1 > 0 && c2 > 0 => Ok((c1, c2)),
        _ => Err("expected C1 or C1,C2, each at least 1".into()),
    }
}

fn build(model: ModelKind, channels: (usize, usize), rng: &mut Rng) -> Result<Sequential, NnError> {
    Ok(match model {
        ModelKind::Mlp => Sequential::new()
            .add(Flatten::new())
            .add(Linear::new(784, 256, rng)?)
            .add(ReLU)
            .add(Linear::new(256, 128, rng)?)
            .add(ReLU)
            .add(Linear::new(128, 10, rng)?),
        ModelKind::Cnn => fashion::cnn(channels, rng)?,
    })
}

/// The training curves: the running loss per step (left) and the test accuracy after each
/// epoch (right).
fn plot(
    loss: &[f64],
    acc: &[(usize, f64)],
    per_epoch: usize,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    font::register()?;
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(760);
    let steps = loss.len().max(1);
    let top = loss.iter().cloned().fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let mut lc = ChartBuilder::on(&left)
        .caption("Training loss (running mean)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0..steps, 0.0..top)?;
    lc.configure_mesh()
        .x_desc(format!("step ({per_epoch} per epoch)"))
        .y_desc("cross-entropy")
        .label_style(("sans-serif", 15))
        .draw()?;
    lc.draw_series(LineSeries::new(loss.iter().copied().enumerate(), BLUE))?;
    let epochs = acc.last().map_or(1, |a| a.0).max(1);
    let (lo, hi) = acc
        .iter()
        .fold((100.0f64, 0.0f64), |(lo, hi), a| (lo.min(a.1), hi.max(a.1)));
    let (lo, hi) = ((lo - 2.0).max(0.0), (hi + 2.0).min(100.0));
    let mut ac = ChartBuilder::on(&right)
        .caption("Test accuracy", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.5f64..epochs as f64 + 0.5, lo..hi.max(lo + 1.0))?;
    ac.configure_mesh()
        .x_desc("epoch")
        .y_desc("accuracy, %")
        .x_labels(epochs.min(20))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    ac.draw_series(LineSeries::new(
        acc.iter().map(|&(e, a)| (e as f64, a)),
        RED,
    ))?;
    ac.draw_series(
        acc.iter()
            .map(|&(e, a)| Circle::new((e as f64, a), 5, RED.filled())),
    )?;
    ac.draw_series(acc.iter().map(|&(e, a)| {
        Text::new(
            format!("  {a:.2}%"),
            (e as f64, a),
            ("sans-serif", 16).into_font().color(&BLACK),
        )
    }))?;
    root.present()?;
    Ok(())
}

fn evaluate(
    model: &Sequential,
    g: &mut Graph,
    test: &Dataset,
    precision: Precision,
) -> Result<f64, NnError> {
    let mut correct = 0;
    // Modest batches: the arena holds every intermediate of an iteration until its reset.
    for batch in test.batches(250)? {
        let (x, y) = batch?;
        let n = {
            let _ng = g.no_grad();
            let _mixed = precision.autocast(g)?;
            let logits = model.forward(g, g.from_host(&x)?)?;
            metrics::correct(logits, &y)?
        };
        correct += n;
        g.reset();
    }
    Ok(correct as f64 / test.len() as f64)
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

/// The history's series in the checkpoint's progress record.
const LOSS: &str = "loss";
const ACCURACY: &str = "accuracy";

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Every argument is checked before any work.
    setup::check_writable("the plot", "--plot", &args.plot)?;
    setup::check_writable("the checkpoint", "--checkpoint", &args.checkpoint)?;
    if args.resume && !args.checkpoint.is_file() {
        return Err(setup::fail(format!(
            "cannot resume: there is no checkpoint at {} (leave out --resume to start a run)",
            args.checkpoint.display()
        )));
    }
    setup::check_until(args.until, args.epochs, "--epochs")?;
    if args.resume && args.init.is_some() {
        return Err(setup::fail(
            "--init and --resume both give the starting weights: pass one of them",
        ));
    }
    let (train, test) = fashion::datasets(&args.data, args.limit, false)?;
    let mut rng = Rng::seed(args.seed);
    let mut model = build(args.model, args.channels, &mut rng)?;
    if let Some(init) = &args.init {
        checkpoint::load(&model, init)?;
    }
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(args.lr))?;
    let per_epoch = train.len().div_ceil(args.batch);
    let total = args
        .steps
        .unwrap_or(usize::MAX)
        .min(args.epochs * per_epoch);
    let cosine = CosineAnnealingLr::new(args.lr, total.max(1), 0.0)?;
    let mut scaler = args.precision.scaler()?;
    let mut step = 0usize;
    // For the picture: the running loss at each step, the test accuracy after each epoch.
    let (mut loss_curve, mut acc_curve) = (Vec::new(), Vec::<(usize, f64)>::new());
    if args.resume {
        let p = checkpoint::load_training(&args.checkpoint, &model, &mut opt)?;
        step = p.step as usize;
        if let (Some(s), Some(state)) = (scaler.as_mut(), p.scaler) {
            s.load_state(state)?;
        }
        if let Some(r) = p.rng {
            rng = r;
        }
        loss_curve = p.history.get(LOSS).cloned().unwrap_or_default();
        acc_curve = p
            .history
            .get(ACCURACY)
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(e, &a)| (e + 1, a))
            .collect();
        let done = acc_curve.len();
        if done >= args.until.unwrap_or(args.epochs) || step >= total {
            return Err(setup::fail(format!(
                "{} is after epoch {done} (step {step}): nothing is left to train up to \
                 epoch {}{} (pass more)",
                args.checkpoint.display(),
                args.until.unwrap_or(args.epochs),
                args.steps
                    .map_or(String::new(), |n| format!(" and --steps {n}"))
            )));
        }
        println!(
            "resumed from {} after epoch {done} (step {step})",
            args.checkpoint.display()
        );
    }
    let mut running = loss_curve.last().copied().unwrap_or(0.0);
    let mut g = Graph::new();
    g.seed(args.seed);
    println!(
        "arenagrad fashion-mnist: model {} ({} parameters), {} train / {} test images, batch {}, Adam lr {}{}, {}, {} threads",
        args.model.name(),
        model.num_parameters(),
        train.len(),
        test.len(),
        args.batch,
        args.lr,
        if args.schedule == Schedule::Cosine {
            " (cosine to 0)"
        } else {
            ""
        },
        args.precision.describe(),
        g.threads()
    );
    for epoch in acc_curve.len() + 1..=args.until.unwrap_or(args.epochs) {
        if step >= total {
            break; // --steps reached
        }
        model.train();
        let batches = if args.order == Order::Fixed {
            train.batches(args.batch)?
        } else {
            train.shuffled_batches(args.batch, &mut rng)?
        };
        let bar = ProgressBar::new(batches.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(epoch.to_string());
        // Without a terminal the bar draws nothing: plain lines instead, about ten per epoch.
        let plain = !std::io::stderr().is_terminal();
        let every = (batches.len() / 10).max(1);
        let total_batches = batches.len();
        let t0 = Instant::now();
        let mut seen = 0usize;
        for (k, batch) in batches.enumerate() {
            if step >= total {
                break;
            }
            let (x, y) = batch?;
            if args.schedule == Schedule::Cosine {
                cosine.apply(&mut opt, step)?;
            }
            opt.zero_grad();
            let lv = {
                let _mixed = args.precision.autocast(&g)?;
                let logits = model.forward(&g, g.from_host(&x)?)?;
                precision::backward(loss::cross_entropy(logits, &y)?, scaler.as_ref())?
            };
            g.reset();
            precision::step(&mut opt, scaler.as_mut(), None)?;
            if args.log_every.is_some_and(|e| step.is_multiple_of(e)) {
                bar.suspend(|| println!("step {step} loss {lv:.6}"));
            }
            step += 1;
            seen += y.len();
            // One running mean over the whole run (the first step starts it).
            running = if loss_curve.is_empty() {
                lv
            } else {
                0.98 * running + 0.02 * lv
            };
            loss_curve.push(running);
            if plain && (k + 1) % every == 0 {
                eprintln!(
                    "epoch {epoch}: step {}/{total_batches}  loss {running:.4}  {:.0} img/s",
                    k + 1,
                    seen as f64 / t0.elapsed().as_secs_f64()
                );
            }
            if k % 10 == 0 {
                bar.set_message(format!(
                    "loss {running:.4}  {:.0} img/s",
                    seen as f64 / t0.elapsed().as_secs_f64()
                ));
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        let secs = t0.elapsed().as_secs_f64();
        model.eval();
        let acc = evaluate(&model, &mut g, &test, args.precision)?;
        acc_curve.push((epoch, acc * 100.0));
        // A checkpoint after every epoch: an interrupted run resumes from the last.
        let progress = Progress {
            step: step as u64,
            rng: Some(rng.clone()),
            history: [
                (LOSS.to_string(), loss_curve.clone()),
                (
                    ACCURACY.to_string(),
                    acc_curve.iter().map(|a| a.1).collect(),
                ),
            ]
            .into(),
            scaler: scaler.as_ref().map(|s| s.state()),
            plateau: None,
        };
        checkpoint::save_training(&args.checkpoint, &model, &opt, &progress).map_err(|e| {
            setup::write_failed("the checkpoint", "--checkpoint", &args.checkpoint, e)
        })?;
        println!(
            "epoch {epoch}: loss {running:.4}  test accuracy {:.2}%  {secs:.1} s/epoch  ({:.0} img/s)",
            acc * 100.0,
            seen as f64 / secs
        );
    }
    plot(&loss_curve, &acc_curve, per_epoch, &args.plot)
        .map_err(|e| setup::write_failed("the plot", "--plot", &args.plot, e))?;
    println!(
        "wrote {} (training loss per step, test accuracy per epoch)",
        args.plot.display()
    );
    println!(
        "saved {} after epoch {} (model, optimiser state and progress: --resume continues from it)",
        args.checkpoint.display(),
        acc_curve.len()
    );
    let mut fresh = build(args.model, args.channels, &mut Rng::seed(args.seed + 1))?;
    let mut fresh_opt = Adam::new(fresh.parameters(), AdamConfig::new(args.lr))?;
    checkpoint::load_training(&args.checkpoint, &fresh, &mut fresh_opt)?;
    fresh.eval();
    let acc = evaluate(&fresh, &mut g, &test, args.precision)?;
    println!(
        "checkpoint {} reloaded into a fresh model: test accuracy {:.2}%",
        args.checkpoint.display(),
        acc * 100.0
    );
    Ok(())
}
