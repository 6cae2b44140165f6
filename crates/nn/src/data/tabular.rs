//! Tabular data: rows of float features with an integer class label each, from memory or from
//! CSV files (feature `csv`), with the same seeded shuffled batches as [`super::Dataset`] and a
//! standardising transform fitted on the training rows.

#[cfg(feature = "csv")]
use std::path::Path;

use arenagrad_graph::{DType, HostTensor};

use super::{no_class_count, try_vec, Batches, Samples};
use crate::error::{NnError, Result};
use crate::Rng;

/// A classification dataset of feature rows (`f64`, row-major `[len, n_features]`) and class
/// labels. Batches come as `[B, n_features]` tensors of the dataset's dtype (`f32` unless
/// [`TabularDataset::with_dtype`] says otherwise).
///
/// ```
/// use arenagrad_nn::data::{Standardize, TabularDataset};
/// use arenagrad_nn::Rng;
/// let ds = TabularDataset::new(vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0], vec![0, 1, 0, 1], 2)?;
/// let (train, test) = ds.split_at(3);
/// let scale = Standardize::fit(&train)?; // statistics of the training rows only
/// let (train, test) = (scale.transform(&train)?, scale.transform(&test)?);
/// assert!((train.features()[0] + 1.224744871391589).abs() < 1e-12);
/// let mut rng = Rng::seed(0);
/// for batch in train.shuffled_batches(2, &mut rng)? {
///     let (x, y) = batch?;
///     assert_eq!(x.shape(), &[y.len(), 2]);
/// }
/// assert_eq!(test.len(), 1);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TabularDataset {
    features: Vec<f64>,
    labels: Vec<usize>,
    n_features: usize,
    class_names: Vec<String>,
    dtype: DType,
}

fn bad(reason: String) -> NnError {
    NnError::BadData {
        what: "TabularDataset",
        reason,
    }
}

impl TabularDataset {
    /// A dataset from row-major features (`labels.len()` rows of `n_features`) and labels.
    /// A feature that is NaN or infinite is refused, naming its row and column: one such value
    /// would turn every loss it touches into NaN.
    pub fn new(features: Vec<f64>, labels: Vec<usize>, n_features: usize) -> Result<Self> {
        if n_features == 0 || labels.len().checked_mul(n_features) != Some(features.len()) {
            return Err(bad(format!(
                "{} feature values for {} labels of {n_features} features",
                features.len(),
                labels.len()
            )));
        }
        if let Some(k) = labels.iter().position(|&l| l == usize::MAX) {
            return Err(bad(no_class_count(&format!("row {k}'s label"))));
        }
        if let Some(k) = features.iter().position(|v| !v.is_finite()) {
            return Err(bad(format!(
                "row {} column {} is {} (features must be finite)",
                k / n_features,
                k % n_features,
                features[k]
            )));
        }
        Ok(TabularDataset {
            features,
            labels,
            n_features,
            class_names: Vec::new(),
            dtype: DType::F32,
        })
    }

    /// The same rows, batched as `dtype` tensors.
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Features per row.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// The dtype of the batches.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// All features, row-major.
    pub fn features(&self) -> &[f64] {
        &self.features
    }

    /// The labels.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    /// The classes' names when the labels were read as names (label `k` is `class_names()[k]`,
    /// the names in sorted order); empty when they were numbers.
    pub fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// The number of classes: the names read, or one more than the largest label.
    pub fn num_classes(&self) -> usize {
        let labelled = self.labels.iter().max().map_or(0, |m| {
            m.checked_add(1)
                .expect("invariant: a label of usize::MAX is refused by TabularDataset::new")
        });
        self.class_names.len().max(labelled)
    }

    fn rows(&self, range: std::ops::Range<usize>) -> TabularDataset {
        TabularDataset {
            features: self.features[range.start * self.n_features..range.end * self.n_features]
                .to_vec(),
            labels: self.labels[range].to_vec(),
            n_features: self.n_features,
            class_names: self.class_names.clone(),
            dtype: self.dtype,
        }
    }

    /// The first `n` rows and the rest (`n` is clamped to the length). Shuffle first
    /// ([`TabularDataset::shuffled`]) when the file is sorted by class.
    pub fn split_at(&self, n: usize) -> (TabularDataset, TabularDataset) {
        let n = n.min(self.len());
        (self.rows(0..n), self.rows(n..self.len()))
    }

    /// The rows in an order drawn from `rng`.
    pub fn shuffled(&self, rng: &mut Rng) -> TabularDataset {
        // The same draws as `permutation`; this copy of the dataset is infallible as a whole.
        let mut order: Vec<usize> = (0..self.len()).collect();
        rng.shuffle(&mut order);
        let f = self.n_features;
        TabularDataset {
            features: order
                .iter()
                .flat_map(|&i| self.features[i * f..(i + 1) * f].iter().copied())
                .collect(),
            labels: order.iter().map(|&i| self.labels[i]).collect(),
            n_features: f,
            class_names: self.class_names.clone(),
            dtype: self.dtype,
        }
    }

    /// The rows `indices` as a `[B, n_features]` tensor and their labels.
    pub fn batch(&self, indices: &[usize]) -> Result<(HostTensor, Vec<usize>)> {
        const OP: &str = "TabularDataset::batch";
        let f = self.n_features;
        let shape = [indices.len(), f];
        let n =
            indices
                .len()
                .checked_mul(f)
                .ok_or_else(|| arenagrad_graph::GraphError::TooLarge {
                    op: OP,
                    shape: shape.to_vec(),
                })?;
        let mut x = try_vec(OP, &shape, n)?;
        let mut y = try_vec(OP, &shape, indices.len())?;
        for &i in indices {
            if i >= self.len() {
                return Err(NnError::IndexOutOfRange {
                    op: "TabularDataset::batch",
                    position: y.len(),
                    index: i,
                    bound: self.len(),
                });
            }
            x.extend_from_slice(&self.features[i * f..(i + 1) * f]);
            y.push(self.labels[i]);
        }
        Ok((
            HostTensor::from_f64(&x, &[indices.len(), f], self.dtype)?,
            y,
        ))
    }

    /// Mini-batches in order (the last one smaller if `batch_size` does not divide the length).
    pub fn batches(&self, batch_size: usize) -> Result<Batches<'_, TabularDataset>> {
        Batches::new(self, (0..self.len()).collect(), batch_size)
    }

    /// Mini-batches in an order shuffled by `rng` (a fresh order per call: call it once per
    /// epoch with the same generator, and a seed fixes every epoch's order).
    pub fn shuffled_batches(
        &self,
        batch_size: usize,
        rng: &mut Rng,
    ) -> Result<Batches<'_, TabularDataset>> {
        Batches::new(self, rng.permutation(self.len())?, batch_size)
    }
}

impl Samples for TabularDataset {
    fn len(&self) -> usize {
        TabularDataset::len(self)
    }

    fn batch(&self, indices: &[usize]) -> Result<(HostTensor, Vec<usize>)> {
        TabularDataset::batch(self, indices)
    }
}

/// Standardisation: each feature shifted by its mean and divided by its standard deviation
/// (the population's, as scikit-learn's `StandardScaler`), both measured on the rows it was
/// fitted on. A feature that is constant there is only shifted (divided by 1), not turned into
/// NaN.
#[derive(Debug, Clone, PartialEq)]
pub struct Standardize {
    mean: Vec<f64>,
    std: Vec<f64>,
}

impl Standardize {
    /// Measures each feature's mean and standard deviation over `ds` (two passes, in `f64`).
    pub fn fit(ds: &TabularDataset) -> Result<Self> {
        if ds.is_empty() {
            return Err(bad("Standardize::fit needs at least one row".into()));
        }
        let f = ds.n_features;
        let n = ds.len() as f64;
        let mut mean = vec![0.0; f];
        for row in ds.features.chunks_exact(f) {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += v;
            }
        }
        mean.iter_mut().for_each(|m| *m /= n);
        let mut var = vec![0.0; f];
        for row in ds.features.chunks_exact(f) {
            for ((s, v), m) in var.iter_mut().zip(row).zip(&mean) {
                *s += (v - m) * (v - m);
            }
        }
        let std = var
            .into_iter()
            .map(|s| {
                let sd = (s / n).sqrt();
                if sd > 0.0 {
                    sd
                } else {
                    1.0
                }
            })
            .collect();
        Ok(Standardize { mean, std })
    }

    /// The fitted means.
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }

    /// The fitted standard deviations (1 where the feature was constant).
    pub fn std(&self) -> &[f64] {
        &self.std
    }

    /// `ds` with every feature standardised; an error if `ds` has a different number of
    /// features than the rows this was fitted on.
    pub fn transform(&self, ds: &TabularDataset) -> Result<TabularDataset> {
        if ds.n_features != self.mean.len() {
            return Err(bad(format!(
                "Standardize fitted on {} features applied to rows of {}",
                self.mean.len(),
                ds.n_features
            )));
        }
        let mut out = ds.clone();
        for row in out.features.chunks_exact_mut(ds.n_features) {
            for ((v, m), s) in row.iter_mut().zip(&self.mean).zip(&self.std) {
                *v = (*v - m) / s;
            }
        }
        Ok(out)
    }
}

/// Which column of a CSV file holds the label.
#[cfg(feature = "csv")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelColumn {
    /// The last column.
    Last,
    /// The column at this position (from 0).
    Index(usize),
    /// The column with this name in the header.
    Name(String),
}

/// How to read a CSV file into a [`TabularDataset`].
#[cfg(feature = "csv")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// Whether the first line is a header (read for [`LabelColumn::Name`], never as data; it may
    /// have a different number of fields than the rows). Default `true`.
    pub has_header: bool,
    /// The field separator. Default `b','`.
    pub delimiter: u8,
    /// The label's column. Default [`LabelColumn::Last`].
    pub label: LabelColumn,
}

#[cfg(feature = "csv")]
impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            has_header: true,
            delimiter: b',',
            label: LabelColumn::Last,
        }
    }
}

#[cfg(feature = "csv")]
impl TabularDataset {
    /// Reads a CSV file: every column but the label's is a feature (a number), and the label is
    /// a non-negative integer or, when any label is not one, a class name (names are numbered in
    /// sorted order; see [`TabularDataset::class_names`]). Fields are trimmed; empty lines are
    /// skipped. A malformed file is an [`NnError::Csv`] naming the line and the column.
    pub fn from_csv(path: impl AsRef<Path>, opts: &CsvOptions) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| NnError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_csv_reader(std::io::BufReader::new(file), path, opts)
    }

    /// [`TabularDataset::from_csv`] from any reader; `path` names the source in errors.
    pub fn from_csv_reader(
        r: impl std::io::Read,
        path: impl AsRef<Path>,
        opts: &CsvOptions,
    ) -> Result<Self> {
        let path = path.as_ref();
        let err = |line: u64, reason: String| NnError::Csv {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(opts.has_header)
            .delimiter(opts.delimiter)
            .trim(csv::Trim::All)
            .flexible(true)
            .from_reader(r);
        let header: Vec<String> = if opts.has_header {
            let h = reader
                .headers()
                .map_err(|e| err(e.position().map_or(1, |p| p.line()), e.to_string()))?;
            h.iter().map(str::to_owned).collect()
        } else {
            Vec::new()
        };
        let mut features = Vec::new();
        let mut label_text = Vec::new();
        let mut width = None;
        let mut label_at = 0;
        for record in reader.records() {
            let record =
                record.map_err(|e| err(e.position().map_or(0, |p| p.line()), e.to_string()))?;
            let line = record.position().map_or(0, |p| p.line());
            let w = *width.get_or_insert(record.len());
            if record.len() != w {
                return Err(err(
                    line,
                    format!("{} fields, but the first row has {w}", record.len()),
                ));
            }
            if label_text.is_empty() {
                if w < 2 {
                    return Err(err(
                        line,
                        "a row needs a label and at least one feature".into(),
                    ));
                }
                label_at = match &opts.label {
                    LabelColumn::Last => w - 1,
                    LabelColumn::Index(i) if *i < w => *i,
                    LabelColumn::Index(i) => {
                        return Err(err(
                            line,
                            format!("label column {i} is past the row's {w} fields"),
                        ))
                    }
                    LabelColumn::Name(name) => match header.iter().position(|h| h == name) {
                        Some(i) if i < w => i,
                        _ => {
                            return Err(err(
                                1,
                                format!("no label column named {name:?} in the header {header:?}"),
                            ))
                        }
                    },
                };
            }
            for (c, field) in record.iter().enumerate() {
                if c == label_at {
                    label_text.push((line, field.to_owned()));
                    continue;
                }
                let column = header
                    .get(c)
                    .map_or_else(|| format!("column {c}"), |h| format!("column {c} ({h:?})"));
                let v: f64 = field
                    .parse()
                    .map_err(|_| err(line, format!("{column}: {field:?} is not a number")))?;
                if !v.is_finite() {
                    return Err(err(line, format!("{column}: {field:?} is not finite")));
                }
                features.push(v);
            }
        }
        let Some(w) = width else {
            return Err(err(1, "no rows".into()));
        };
        let numeric: Option<Vec<usize>> = label_text.iter().map(|(_, t)| t.parse().ok()).collect();
        let (labels, class_names) = match numeric {
            Some(l) => {
                if let Some(k) = l.iter().position(|&v| v == usize::MAX) {
                    let (line, text) = &label_text[k];
                    return Err(err(*line, no_class_count(&format!("label {text:?}"))));
                }
                (l, Vec::new())
            }
            None => {
                let mut names: Vec<String> = label_text.iter().map(|(_, t)| t.clone()).collect();
                names.sort();
                names.dedup();
                if let Some((line, _)) = label_text.iter().find(|(_, t)| t.is_empty()) {
                    return Err(err(*line, "empty label".into()));
                }
                let labels = label_text
                    .iter()
                    .map(|(_, t)| {
                        names
                            .binary_search(t)
                            .expect("every label is among the names")
                    })
                    .collect();
                (labels, names)
            }
        };
        let mut ds = TabularDataset::new(features, labels, w - 1)?;
        ds.class_names = class_names;
        Ok(ds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standardize_centres_and_scales_with_constant_columns_kept_finite() {
        let ds = TabularDataset::new(vec![1.0, 5.0, 3.0, 5.0], vec![0, 1], 2).unwrap();
        let s = Standardize::fit(&ds).unwrap();
        assert_eq!(s.mean(), &[2.0, 5.0]);
        assert_eq!(s.std(), &[1.0, 1.0]);
        assert_eq!(s.transform(&ds).unwrap().features(), &[-1.0, 0.0, 1.0, 0.0]);
        let other = TabularDataset::new(vec![1.0], vec![0], 1).unwrap();
        assert!(s.transform(&other).is_err());
    }

    #[test]
    fn non_finite_features_are_refused_with_their_place() {
        let e = TabularDataset::new(vec![1.0, 2.0, f64::NAN, 4.0], vec![0, 1], 2).unwrap_err();
        assert!(e.to_string().contains("row 1 column 0"), "{e}");
    }
}
