//! Trains an MLP classifier on a tabular dataset read from a CSV file: scikit-learn's bundled
//! wine, breast-cancer or iris data (Debian's `python3-sklearn` package ships them as CSV), or
//! any CSV of numeric features with a label column.
//!
//! ```text
//! cargo run --release --example tabular -- [--data wine|breast-cancer|iris|FILE.csv]
//!     [--label last|N|NAME] [--epochs 20] [--batch 16] [--lr 3e-3] [--hidden 32]
//!     [--test-fraction 0.2] [--seed 0]
//! ```
//!
//! The rows are shuffled with the seed and split into training and test rows; each feature is
//! standardised with the training rows' mean and standard deviation; the net is
//! linear-relu-linear-relu-linear, trained with Adam on the cross-entropy.

use std::path::PathBuf;
use std::time::Instant;

use arenagrad::nn::data::{CsvOptions, LabelColumn, Standardize, TabularDataset};
use arenagrad::nn::optim::{Adam, AdamConfig, Optimizer};
use arenagrad::nn::{loss, metrics, Linear, Module, NnError, ReLU, Rng, Sequential};
use arenagrad::prelude::*;

#[path = "common/setup.rs"]
mod setup;
use clap::Parser;

/// Where Debian's python3-sklearn puts scikit-learn's bundled datasets.
const SKLEARN_DATA: &str = "/usr/lib/python3/dist-packages/sklearn/datasets/data";

/// Trains an MLP on a tabular (CSV) dataset and reports its test accuracy.
#[derive(Parser, Debug)]
#[command(name = "tabular")]
struct Args {
    /// `wine`, `breast-cancer` or `iris` (scikit-learn's files, from Debian's python3-sklearn),
    /// or the path of a CSV file whose first line is a header.
    #[arg(long, default_value = "wine")]
    data: String,
    /// The label's column: `last`, a position from 0, or a name in the header.
    #[arg(long, default_value = "last")]
    label: String,
    /// Passes over the training rows.
    #[arg(long, default_value_t = 20, value_parser = setup::positive)]
    epochs: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 16, value_parser = setup::positive)]
    batch: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 3e-3, value_parser = setup::positive_real)]
    lr: f64,
    /// Width of the two hidden layers.
    #[arg(long, default_value_t = 32, value_parser = setup::positive)]
    hidden: usize,
    /// The share of rows held out for testing (above 0, below 1).
    #[arg(long, default_value_t = 0.2, value_parser = test_fraction)]
    test_fraction: f64,
    /// Seed of the split, the weights and the batch order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn source(data: &str) -> (PathBuf, bool) {
    let bundled = |file: &str| (PathBuf::from(SKLEARN_DATA).join(file), true);
    match data {
        "wine" => bundled("wine_data.csv"),
        "breast-cancer" => bundled("breast_cancer.csv"),
        "iris" => bundled("iris.csv"),
        path => (PathBuf::from(path), false),
    }
}

fn accuracy(model: &Sequential, g: &mut Graph, ds: &TabularDataset) -> Result<f64, NnError> {
    let (x, y) = ds.batch(&(0..ds.len()).collect::<Vec<_>>())?;
    let correct = {
        let _ng = g.no_grad();
        metrics::correct(model.forward(g, g.from_host(&x)?)?, &y)?
    };
    g.reset();
    Ok(correct as f64 / ds.len().max(1) as f64)
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn test_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a share above 0 and below 1")),
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let (path, bundled) = source(&args.data);
    if !path.exists() {
        if bundled {
            eprintln!(
                "{} not found.\nscikit-learn's datasets come with Debian's python3-sklearn; install it with:  {}\n\
                 (or pass --data FILE.csv)",
                path.display(),
                setup::apt_install("python3-sklearn")
            );
            std::process::exit(2);
        }
        return Err(setup::fail(format!(
            "there is no file {} (--data takes wine, breast-cancer, iris or a CSV file)",
            path.display()
        )));
    }
    if path.is_dir() {
        return Err(setup::fail(format!(
            "{} is a folder; --data takes wine, breast-cancer, iris or a CSV file",
            path.display()
        )));
    }
    let label = match args.label.as_str() {
        "last" => LabelColumn::Last,
        s => s
            .parse()
            .map_or_else(|_| LabelColumn::Name(s.to_owned()), LabelColumn::Index),
    };
    let opts = CsvOptions {
        label,
        ..CsvOptions::default()
    };
    let all = TabularDataset::from_csv(&path, &opts)?;
    let mut rng = Rng::seed(args.seed);
    let n_test = (all.len() as f64 * args.test_fraction).round() as usize;
    if n_test == 0 || n_test == all.len() {
        return Err(setup::fail(format!(
            "--test-fraction {} of {} rows leaves {} rows to test and {} to train: both need \
             at least one",
            args.test_fraction,
            all.len(),
            n_test,
            all.len() - n_test
        )));
    }
    let (test, train) = all.shuffled(&mut rng).split_at(n_test);
    let scale = Standardize::fit(&train)?;
    let (train, test) = (scale.transform(&train)?, scale.transform(&test)?);
    let (f, h, c) = (all.n_features(), args.hidden, all.num_classes());
    println!(
        "arenagrad tabular: {} ({} rows: {} train / {} test), {f} features, {c} classes, \
         MLP {f}-{h}-{h}-{c}, Adam lr {}, batch {}",
        path.display(),
        all.len(),
        train.len(),
        test.len(),
        args.lr,
        args.batch
    );
    let model = Sequential::new()
        .add(Linear::new(f, h, &mut rng)?)
        .add(ReLU)
        .add(Linear::new(h, h, &mut rng)?)
        .add(ReLU)
        .add(Linear::new(h, c, &mut rng)?);
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(args.lr))?;
    let mut g = Graph::new();
    let start = Instant::now();
    let every = (args.epochs / 6).max(1);
    for epoch in 1..=args.epochs {
        let (mut sum, mut rows) = (0.0, 0);
        for batch in train.shuffled_batches(args.batch, &mut rng)? {
            let (x, y) = batch?;
            opt.zero_grad();
            let l = loss::cross_entropy(model.forward(&g, g.from_host(&x)?)?, &y)?;
            l.backward()?;
            sum += l.item()? * y.len() as f64;
            rows += y.len();
            g.reset();
            opt.step()?;
        }
        if epoch % every == 0 || epoch == args.epochs {
            println!(
                "epoch {epoch:>3}: loss {:.4}  train accuracy {:.2}%  test accuracy {:.2}%",
                sum / rows.max(1) as f64,
                100.0 * accuracy(&model, &mut g, &train)?,
                100.0 * accuracy(&model, &mut g, &test)?
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} epochs in {:.1} ms ({:.1} µs per step)",
        args.epochs,
        1e3 * secs,
        1e6 * secs / (args.epochs * train.len().div_ceil(args.batch)).max(1) as f64
    );
    Ok(())
}
