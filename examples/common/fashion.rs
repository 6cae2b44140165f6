//! The Fashion-MNIST files, and the CNN the Fashion-MNIST examples train. An example that uses
//! it declares `mod setup` too.

use std::path::Path;

use arenagrad::nn::data::Dataset;
use arenagrad::nn::{
    Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, NnError, ReLU, Rng, Sequential,
};

/// The training and test sets in `dir` (the first `limit` images of each, if given). Without
/// the files it says how to install them — unless `quiet` (the ranks but the first of a
/// data-parallel run) — and exits with status 2.
pub fn datasets(
    dir: &Path,
    limit: Option<usize>,
    quiet: bool,
) -> Result<(Dataset, Dataset), NnError> {
    if !dir.join("train-images-idx3-ubyte.gz").exists() {
        if !quiet {
            eprintln!(
                "Fashion-MNIST not found in {}.\nInstall it with:  {}\n\
                 (or pass --data DIR with train-/t10k-{{images-idx3,labels-idx1}}-ubyte.gz)",
                dir.display(),
                super::setup::apt_install("dataset-fashion-mnist")
            );
        }
        std::process::exit(2);
    }
    let load = |prefix: &str| {
        Dataset::from_idx_files(
            dir.join(format!("{prefix}-images-idx3-ubyte.gz")),
            dir.join(format!("{prefix}-labels-idx1-ubyte.gz")),
        )
    };
    let (mut train, mut test) = (load("train")?, load("t10k")?);
    if let Some(n) = limit {
        train = train.take(n);
        test = test.take(n.min(test.len()));
    }
    Ok((train, test))
}

/// conv3×3(1→c1)-relu-maxpool2-conv3×3(c1→c2)-relu-maxpool2-linear(c2·7·7→128)-relu-linear(128→10).
pub fn cnn((c1, c2): (usize, usize), rng: &mut Rng) -> Result<Sequential, NnError> {
    let same = Conv2dConfig::default().padding(1);
    Ok(Sequential::new()
        .add(Conv2d::with_config(1, c1, (3, 3), same, rng)?)
        .add(ReLU)
        .add(MaxPool2d::new((2, 2))?)
        .add(Conv2d::with_config(c1, c2, (3, 3), same, rng)?)
        .add(ReLU)
        .add(MaxPool2d::new((2, 2))?)
        .add(Flatten::new())
        .add(Linear::new(c2 * 7 * 7, 128, rng)?)
        .add(ReLU)
        .add(Linear::new(128, 10, rng)?))
}
