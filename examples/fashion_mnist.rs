//! Trains a small CNN (or an MLP) on Fashion-MNIST on the CPU, reports test accuracy each
//! epoch, saves a checkpoint, reloads it into a fresh model and evaluates again.
//!
//! ```text
//! cargo run --release --example fashion_mnist -- [--data DIR] [--model cnn|mlp]
//!     [--epochs 2] [--batch 64] [--lr 2e-3] [--schedule cosine|constant] [--channels 32,64]
//!     [--limit N] [--seed 0] [--checkpoint PATH] [--init PATH] [--order shuffled|fixed]
//!     [--steps N] [--log-every N]
//! ```
//!
//! `--init` starts from weights in a safetensors file (PyTorch's `state_dict` names), `--order
//! fixed` feeds the training images in file order, `--steps` stops after that many steps (and
//! anneals over them) and `--log-every` prints the loss of every N-th step: with
//! `scripts/torch_fashion_mnist.py --init` they run the same training as PyTorch from the same
//! initial weights, step for step.
//!
//! The data are the IDX files of Debian's `dataset-fashion-mnist` package
//! (`/usr/share/datasets/fashion-mnist/` by default). The CNN is
//! conv3×3(1→32)-relu-maxpool2-conv3×3(32→64)-relu-maxpool2-linear(3136→128)-relu-linear(128→10),
//! trained with Adam (batch 64), its learning rate annealed from 2e-3 to 0 along a cosine over
//! the run's steps (`--schedule constant --lr 1e-3` is PyTorch's plain recipe).

use std::path::{Path, PathBuf};
use std::time::Instant;

use arenagrad::nn::data::Dataset;
use arenagrad::nn::optim::{Adam, AdamConfig, CosineAnnealingLr, LrSchedule, Optimizer};
use arenagrad::nn::{
    checkpoint, loss, metrics, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, NnError,
    ReLU, Rng, Sequential,
};
use arenagrad::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};

struct Args {
    data: PathBuf,
    model: String,
    epochs: usize,
    batch: usize,
    lr: f64,
    cosine: bool,
    channels: (usize, usize),
    limit: Option<usize>,
    seed: u64,
    checkpoint: PathBuf,
    init: Option<PathBuf>,
    fixed_order: bool,
    steps: Option<usize>,
    log_every: Option<usize>,
}

fn parse_args() -> Args {
    let mut a = Args {
        data: PathBuf::from("/usr/share/datasets/fashion-mnist"),
        model: "cnn".into(),
        epochs: 2,
        batch: 64,
        lr: 2e-3,
        cosine: true,
        channels: (32, 64),
        limit: None,
        seed: 0,
        checkpoint: std::env::temp_dir().join("arenagrad-fashion-mnist.safetensors"),
        init: None,
        fixed_order: false,
        steps: None,
        log_every: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let value = |i: usize| -> &str {
        args.get(i + 1).map(String::as_str).unwrap_or_else(|| {
            eprintln!("missing value after {}", args[i]);
            std::process::exit(2)
        })
    };
    let num = |s: &str| -> usize {
        s.parse().unwrap_or_else(|_| {
            eprintln!("not a number: {s}");
            std::process::exit(2)
        })
    };
    while i < args.len() {
        match args[i].as_str() {
            "--data" => a.data = PathBuf::from(value(i)),
            "--model" => a.model = value(i).to_string(),
            "--epochs" => a.epochs = num(value(i)),
            "--batch" => a.batch = num(value(i)),
            "--lr" => {
                a.lr = value(i).parse().unwrap_or_else(|_| {
                    eprintln!("not a learning rate: {}", value(i));
                    std::process::exit(2)
                })
            }
            "--schedule" => {
                a.cosine = match value(i) {
                    "cosine" => true,
                    "constant" => false,
                    other => {
                        eprintln!("--schedule is cosine or constant, not {other}");
                        std::process::exit(2)
                    }
                }
            }
            "--limit" => a.limit = Some(num(value(i))),
            "--seed" => a.seed = num(value(i)) as u64,
            "--checkpoint" => a.checkpoint = PathBuf::from(value(i)),
            "--init" => a.init = Some(PathBuf::from(value(i))),
            "--order" => a.fixed_order = value(i) == "fixed",
            "--steps" => a.steps = Some(num(value(i))),
            "--log-every" => a.log_every = Some(num(value(i)).max(1)),
            "--channels" => {
                let v: Vec<usize> = value(i).split(',').map(num).collect();
                a.channels = (v[0], *v.get(1).unwrap_or(&(2 * v[0])));
            }
            "-h" | "--help" => {
                println!(
                    "{}",
                    include_str!("fashion_mnist.rs")
                        .lines()
                        .take(10)
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown argument {other} (try --help)");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    a
}

fn build(model: &str, (c1, c2): (usize, usize), rng: &mut Rng) -> Result<Sequential, NnError> {
    let same = Conv2dConfig::default().padding(1);
    Ok(match model {
        "mlp" => Sequential::new()
            .add(Flatten::new())
            .add(Linear::new(784, 256, rng)?)
            .add(ReLU)
            .add(Linear::new(256, 128, rng)?)
            .add(ReLU)
            .add(Linear::new(128, 10, rng)?),
        _ => Sequential::new()
            .add(Conv2d::with_config(1, c1, (3, 3), same, rng)?)
            .add(ReLU)
            .add(MaxPool2d::new((2, 2))?)
            .add(Conv2d::with_config(c1, c2, (3, 3), same, rng)?)
            .add(ReLU)
            .add(MaxPool2d::new((2, 2))?)
            .add(Flatten::new())
            .add(Linear::new(c2 * 7 * 7, 128, rng)?)
            .add(ReLU)
            .add(Linear::new(128, 10, rng)?),
    })
}

fn evaluate(model: &Sequential, g: &mut Graph, test: &Dataset) -> Result<f64, NnError> {
    let mut correct = 0;
    // Modest batches: the arena holds every intermediate of an iteration until its reset.
    for (x, y) in test.batches(250)? {
        let n = {
            let _ng = g.no_grad();
            let logits = model.forward(g, g.from_host(&x)?)?;
            metrics::correct(logits, &y)?
        };
        correct += n;
        g.reset();
    }
    Ok(correct as f64 / test.len() as f64)
}

fn load(dir: &Path, prefix: &str) -> Result<Dataset, NnError> {
    Dataset::from_idx_files(
        dir.join(format!("{prefix}-images-idx3-ubyte.gz")),
        dir.join(format!("{prefix}-labels-idx1-ubyte.gz")),
    )
}

/// Whether the process runs as root (Linux: the real uid in /proc/self/status is 0).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn main() -> Result<(), NnError> {
    let args = parse_args();
    if !args.data.join("train-images-idx3-ubyte.gz").exists() {
        // As root (where `sudo` may not exist) the command runs as it is; otherwise through sudo.
        let sudo = if running_as_root() { "" } else { "sudo " };
        eprintln!(
            "Fashion-MNIST not found in {}.\nInstall it with:  {sudo}apt-get update && {sudo}apt-get install -y dataset-fashion-mnist\n\
             (or pass --data DIR with train-/t10k-{{images-idx3,labels-idx1}}-ubyte.gz)",
            args.data.display()
        );
        std::process::exit(2);
    }
    let mut train = load(&args.data, "train")?;
    let mut test = load(&args.data, "t10k")?;
    if let Some(n) = args.limit {
        train = train.take(n);
        test = test.take(n.min(test.len()));
    }
    let mut rng = Rng::seed(args.seed);
    let mut model = build(&args.model, args.channels, &mut rng)?;
    if let Some(init) = &args.init {
        checkpoint::load(&model, init)?;
    }
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(args.lr))?;
    let per_epoch = train.len().div_ceil(args.batch.max(1));
    let total = args
        .steps
        .unwrap_or(usize::MAX)
        .min(args.epochs * per_epoch);
    let cosine = CosineAnnealingLr::new(args.lr, total.max(1), 0.0)?;
    let mut step = 0usize;
    let mut g = Graph::new();
    g.seed(args.seed);
    println!(
        "arenagrad fashion-mnist: model {} ({} parameters), {} train / {} test images, batch {}, Adam lr {}{}, {} threads",
        args.model,
        model.num_parameters(),
        train.len(),
        test.len(),
        args.batch,
        args.lr,
        if args.cosine { " (cosine to 0)" } else { "" },
        g.threads()
    );
    for epoch in 1..=args.epochs {
        model.train();
        let batches = if args.fixed_order {
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
        let t0 = Instant::now();
        let (mut seen, mut running) = (0usize, 0.0f64);
        for (k, (x, y)) in batches.enumerate() {
            if args.steps.is_some_and(|n| step >= n) {
                break;
            }
            if args.cosine {
                cosine.apply(&mut opt, step);
            }
            opt.zero_grad();
            let logits = model.forward(&g, g.from_host(&x)?)?;
            let l = loss::cross_entropy(logits, &y)?;
            l.backward()?;
            let lv = l.item()?;
            g.reset();
            opt.step()?;
            if args.log_every.is_some_and(|e| step.is_multiple_of(e)) {
                bar.suspend(|| println!("step {step} loss {lv:.6}"));
            }
            step += 1;
            seen += y.len();
            running = if k == 0 {
                lv
            } else {
                0.98 * running + 0.02 * lv
            };
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
        let acc = evaluate(&model, &mut g, &test)?;
        println!(
            "epoch {epoch}: loss {running:.4}  test accuracy {:.2}%  {secs:.1} s/epoch  ({:.0} img/s)",
            acc * 100.0,
            seen as f64 / secs
        );
    }
    checkpoint::save(&model, &args.checkpoint)?;
    let mut fresh = build(&args.model, args.channels, &mut Rng::seed(args.seed + 1))?;
    checkpoint::load(&fresh, &args.checkpoint)?;
    fresh.eval();
    let acc = evaluate(&fresh, &mut g, &test)?;
    println!(
        "checkpoint {} reloaded into a fresh model: test accuracy {:.2}%",
        args.checkpoint.display(),
        acc * 100.0
    );
    Ok(())
}
