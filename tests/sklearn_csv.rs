//! The CSV loader on real files: scikit-learn's bundled datasets as Debian's python3-sklearn
//! installs them. Their sizes and class counts are the published ones (UCI's wine: 59/71/48;
//! Wisconsin breast cancer: 212 malignant, 357 benign; Fisher's iris: 50 of each).
//!
//! Skipped, with the reason shown, when the package is not installed — unless
//! `ARENAGRAD_REQUIRE_DATA=1` (CI sets it), when a missing file fails the test.

use std::path::Path;

use arenagrad::graph::testing::{skip_or_fail, REQUIRE_DATA};
use arenagrad::nn::data::{CsvOptions, Standardize, TabularDataset};

const DIR: &str = "/usr/lib/python3/dist-packages/sklearn/datasets/data";

fn load(file: &str) -> Option<TabularDataset> {
    let path = Path::new(DIR).join(file);
    if !path.exists() {
        skip_or_fail(
            REQUIRE_DATA,
            format_args!(
                "{} is not installed (Debian: python3-sklearn)",
                path.display()
            ),
        );
        return None;
    }
    Some(TabularDataset::from_csv(&path, &CsvOptions::default()).unwrap())
}

fn class_counts(ds: &TabularDataset) -> Vec<usize> {
    let mut c = vec![0; ds.num_classes()];
    for &l in ds.labels() {
        c[l] += 1;
    }
    c
}

#[test]
fn wine() {
    let Some(ds) = load("wine_data.csv") else {
        return;
    };
    assert_eq!((ds.len(), ds.n_features()), (178, 13));
    assert_eq!(class_counts(&ds), [59, 71, 48]);
    // The first row as the file has it: alcohol 14.23 … proline 1065.
    assert_eq!(ds.features()[0], 14.23);
    assert_eq!(ds.features()[12], 1065.0);
    // Alcohol's mean over the dataset, as its documentation gives it (13.0).
    let s = Standardize::fit(&ds).unwrap();
    assert!((s.mean()[0] - 13.0).abs() < 0.01, "{}", s.mean()[0]);
}

#[test]
fn breast_cancer() {
    let Some(ds) = load("breast_cancer.csv") else {
        return;
    };
    assert_eq!((ds.len(), ds.n_features()), (569, 30));
    assert_eq!(class_counts(&ds), [212, 357]);
}

#[test]
fn iris() {
    let Some(ds) = load("iris.csv") else {
        return;
    };
    assert_eq!((ds.len(), ds.n_features()), (150, 4));
    assert_eq!(class_counts(&ds), [50, 50, 50]);
    assert_eq!(&ds.features()[..4], &[5.1, 3.5, 1.4, 0.2]);
}
