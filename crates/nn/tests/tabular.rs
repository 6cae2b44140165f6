//! Tabular datasets from CSV text: what is read, what is refused (with the line and the
//! column), the seeded batches, and standardisation.

use arenagrad_nn::data::{CsvOptions, LabelColumn, Standardize, TabularDataset};
use arenagrad_nn::{DType, NnError, Rng};

fn read(text: &str, opts: &CsvOptions) -> Result<TabularDataset, NnError> {
    TabularDataset::from_csv_reader(text.as_bytes(), "test.csv", opts)
}

const FLOWERS: &str = "\
sepal_length, sepal_width, species, petal_length
5.1, 3.5, setosa, 1.4
7.0, 3.2, versicolor, 4.7

6.3, 3.3, virginica, 6.0
4.9, 3.0, setosa, 1.4
";

#[test]
fn names_become_sorted_class_numbers_and_the_rest_features() {
    let opts = CsvOptions {
        label: LabelColumn::Name("species".into()),
        ..CsvOptions::default()
    };
    let ds = read(FLOWERS, &opts).unwrap();
    assert_eq!(ds.len(), 4, "the empty line is skipped");
    assert_eq!(ds.n_features(), 3);
    assert_eq!(ds.class_names(), &["setosa", "versicolor", "virginica"]);
    assert_eq!(ds.labels(), &[0, 1, 2, 0]);
    assert_eq!(ds.num_classes(), 3);
    assert_eq!(
        ds.features(),
        &[5.1, 3.5, 1.4, 7.0, 3.2, 4.7, 6.3, 3.3, 6.0, 4.9, 3.0, 1.4]
    );
    // The same column by position.
    let by_index = CsvOptions {
        label: LabelColumn::Index(2),
        ..CsvOptions::default()
    };
    assert_eq!(read(FLOWERS, &by_index).unwrap(), ds);
}

#[test]
fn numeric_labels_and_a_header_of_another_width_as_scikit_learn_writes_them() {
    // scikit-learn's bundled CSVs start with "n_samples,n_features,class names…".
    let text = "3,2,class_0,class_1,class_2,class_3\n0.5,1.5,2\n-1,2e-3,0\n4,5,3\n";
    let ds = read(text, &CsvOptions::default()).unwrap();
    assert_eq!(ds.labels(), &[2, 0, 3]);
    assert!(ds.class_names().is_empty());
    assert_eq!(ds.num_classes(), 4);
    assert_eq!(ds.features(), &[0.5, 1.5, -1.0, 2e-3, 4.0, 5.0]);
    // Without a header, semicolons.
    let opts = CsvOptions {
        has_header: false,
        delimiter: b';',
        label: LabelColumn::Index(0),
    };
    let ds = read("1;0.25;8\n0;0.5;9\n", &opts).unwrap();
    assert_eq!(ds.labels(), &[1, 0]);
    assert_eq!(ds.features(), &[0.25, 8.0, 0.5, 9.0]);
}

fn csv_error(text: &str, opts: &CsvOptions) -> (u64, String) {
    match read(text, opts) {
        Err(NnError::Csv { line, reason, path }) => {
            assert_eq!(path.to_str(), Some("test.csv"));
            (line, reason)
        }
        other => panic!("expected a CSV error, got {other:?}"),
    }
}

#[test]
fn malformed_files_are_refused_naming_the_line_and_column() {
    let d = CsvOptions::default();
    let (line, why) = csv_error("a,b,y\n1,2,0\n3,x,1\n", &d);
    assert_eq!(line, 3);
    assert!(
        why.contains("column 1 (\"b\")") && why.contains("\"x\""),
        "{why}"
    );
    let (line, why) = csv_error("a,b,y\n1,2,0\n3,1\n", &d);
    assert_eq!(line, 3);
    assert!(why.contains("2 fields") && why.contains("3"), "{why}");
    let (line, why) = csv_error("a,b,y\n1,NaN,0\n", &d);
    assert_eq!(line, 2);
    assert!(why.contains("not finite"), "{why}");
    let (_, why) = csv_error("a,b,y\n", &d);
    assert!(why.contains("no rows"), "{why}");
    let (_, why) = csv_error("a\n1\n", &d);
    assert!(why.contains("at least one feature"), "{why}");
    let named = CsvOptions {
        label: LabelColumn::Name("label".into()),
        ..CsvOptions::default()
    };
    let (line, why) = csv_error("a,b,y\n1,2,0\n", &named);
    assert_eq!(line, 1);
    assert!(why.contains("\"label\""), "{why}");
    let past = CsvOptions {
        label: LabelColumn::Index(5),
        ..CsvOptions::default()
    };
    let (_, why) = csv_error("a,b,y\n1,2,0\n", &past);
    assert!(why.contains("label column 5"), "{why}");
    let (line, why) = csv_error("a,y\n1,cat\n2,\n", &d);
    assert_eq!(line, 3);
    assert!(why.contains("empty label"), "{why}");
    // A missing file is an I/O error naming it.
    let e = TabularDataset::from_csv("/nonexistent/data.csv", &d).unwrap_err();
    assert!(matches!(e, NnError::Io { .. }) && e.to_string().contains("/nonexistent/data.csv"));
}

#[test]
fn a_label_with_no_class_count_is_refused_not_wrapped_to_zero_classes() {
    // One more than usize::MAX classes cannot be counted: refused where the label is read.
    let max = usize::MAX.to_string();
    let (line, why) = csv_error(&format!("a,y\n1,0\n2,{max}\n"), &CsvOptions::default());
    assert_eq!(line, 3);
    assert!(why.contains(&max), "{why}");
    let e = TabularDataset::new(vec![1.0, 2.0], vec![0, usize::MAX], 1).unwrap_err();
    assert!(
        matches!(&e, NnError::BadData { reason, .. } if reason.contains("row 1")),
        "{e}"
    );
    // One below is a count of usize::MAX classes.
    let ds = read(
        &format!("a,y\n1,0\n2,{}\n", usize::MAX - 1),
        &CsvOptions::default(),
    )
    .unwrap();
    assert_eq!(ds.num_classes(), usize::MAX);
}

#[test]
fn seeded_batches_cover_every_row_once_in_the_dataset_dtype() {
    let n = 10;
    let features: Vec<f64> = (0..2 * n).map(|v| v as f64).collect();
    let labels: Vec<usize> = (0..n).collect();
    let ds = TabularDataset::new(features, labels, 2)
        .unwrap()
        .with_dtype(DType::F64);
    let order = |seed| {
        let mut rng = Rng::seed(seed);
        let mut seen = Vec::new();
        for b in ds.shuffled_batches(4, &mut rng).unwrap() {
            let (x, y) = b.unwrap();
            assert_eq!(x.dtype(), DType::F64);
            assert_eq!(x.shape(), &[y.len(), 2]);
            let v = x.to_f64_vec();
            for (r, &label) in y.iter().enumerate() {
                // Each row travels with its own label.
                assert_eq!(v[2 * r], 2.0 * label as f64);
            }
            seen.extend(y);
        }
        seen
    };
    let a = order(3);
    assert_eq!(a, order(3), "a seed fixes the order");
    assert_ne!(a, order(4));
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    assert_eq!(ds.batches(4).unwrap().len(), 3);
    assert_eq!(ds.batches(4).unwrap().drop_last(true).len(), 2);
    assert!(ds.batch(&[0, n]).is_err());
}

#[test]
fn standardisation_fitted_on_the_training_rows_only() {
    let mut rng = Rng::seed(1);
    let n = 200;
    let features: Vec<f64> = (0..n)
        .flat_map(|_| [10.0 + 3.0 * rng.normal(), -5.0 + 0.01 * rng.normal(), 7.0])
        .collect();
    let ds = TabularDataset::new(features, vec![0; n], 3).unwrap();
    let (train, test) = ds.shuffled(&mut rng).split_at(150);
    assert_eq!((train.len(), test.len()), (150, 50));
    let s = Standardize::fit(&train).unwrap();
    let t = s.transform(&train).unwrap();
    for c in 0..2 {
        let col: Vec<f64> = t.features().iter().skip(c).step_by(3).copied().collect();
        let mean = col.iter().sum::<f64>() / col.len() as f64;
        let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / col.len() as f64;
        assert!(
            mean.abs() < 1e-12 && (var - 1.0).abs() < 1e-12,
            "{c}: {mean} {var}"
        );
    }
    // The constant column is centred, not divided by zero.
    assert!(t.features().iter().skip(2).step_by(3).all(|&v| v == 0.0));
    // The test rows use the training statistics: their means are near, not exactly, 0.
    let u = s.transform(&test).unwrap();
    let m0 = u.features().iter().step_by(3).sum::<f64>() / 50.0;
    assert!(m0.abs() > 1e-9 && m0.abs() < 0.5, "{m0}");
    assert!(Standardize::fit(&ds.split_at(0).0).is_err());
}
