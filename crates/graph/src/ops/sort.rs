//! Sorting and top-k along an axis: the order is found on the values (read to the host), and
//! the values come out through [`Tensor::gather`], so that their gradient flows back to the
//! entries they came from. Indices are `usize`s in the output's row-major layout.

use std::cmp::Ordering;

use crate::error::{GraphError, Result};
use crate::shape::norm_axis;
use crate::Tensor;

/// `a` before `b` when sorting ascending: NaN after every number (PyTorch sorts NaN as the
/// largest), −0 and +0 equal, and equal values in index order (a stable sort).
fn ascending(a: (f64, usize), b: (f64, usize)) -> Ordering {
    let by_value = match (a.0.is_nan(), b.0.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal),
    };
    by_value.then(a.1.cmp(&b.1))
}

/// `a` before `b` when sorting descending: NaN first, equal values still in index order.
fn descending(a: (f64, usize), b: (f64, usize)) -> Ordering {
    ascending((b.0, a.1), (a.0, b.1))
}

/// The layout of `axis` in a row-major shape: (outer count, axis length, inner count).
fn layout(shape: &[usize], ax: usize) -> (usize, usize, usize) {
    let outer = shape[..ax].iter().product();
    let inner = shape[ax + 1..].iter().product();
    (outer, shape[ax], inner)
}

impl<'g> Tensor<'g> {
    /// The values sorted along `axis` and where each came from (PyTorch's
    /// `torch.sort(x, dim, descending, stable=True)`): equal values keep their order, NaN counts
    /// as the largest value. The indices (`usize`, the output's row-major layout) index the
    /// input along `axis`; the values are gathered, so their gradient reaches the input.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[1.0, 3.0, 3.0, f64::NAN, 2.0], &[5], DType::F32)?;
    /// let (v, i) = x.sort(0, true)?;
    /// assert_eq!(i, [3, 1, 2, 4, 0]);
    /// assert!(v.to_vec::<f32>()?[0].is_nan());
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn sort(self, axis: isize, descending_order: bool) -> Result<(Tensor<'g>, Vec<usize>)> {
        let shape = self.try_shape()?;
        let ax = norm_axis("sort", axis, &shape)?;
        let n = shape[ax];
        self.ordered(ax, n, descending_order)
    }

    /// Where the sorted values come from ([`Tensor::sort`]'s indices, without the values).
    pub fn argsort(self, axis: isize, descending_order: bool) -> Result<Vec<usize>> {
        let shape = self.try_shape()?;
        let ax = norm_axis("argsort", axis, &shape)?;
        Ok(self.order_indices(ax, shape[ax], descending_order)?.0)
    }

    /// The `k` largest values along `axis` (the smallest unless `largest`), in order, and their
    /// indices (PyTorch's `torch.topk`, its values sorted): NaN counts as the largest value,
    /// and among equal values the earlier comes first (PyTorch leaves that order to its
    /// kernel). For a `k` much smaller than the axis it scans once against the `k`-th best so
    /// far. The values are gathered: their gradient reaches the input.
    ///
    /// Errors: `k` past the axis is a `BadArgument`.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[0.5, 2.0, -1.0, 2.0, 7.0], &[5], DType::F32)?;
    /// let (v, i) = x.topk(3, -1, true)?;
    /// assert_eq!((v.to_vec::<f32>()?, i), (vec![7.0, 2.0, 2.0], vec![4, 1, 3]));
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn topk(self, k: usize, axis: isize, largest: bool) -> Result<(Tensor<'g>, Vec<usize>)> {
        let shape = self.try_shape()?;
        let ax = norm_axis("topk", axis, &shape)?;
        if k > shape[ax] {
            return Err(GraphError::BadArgument {
                op: "topk",
                what: "k must not exceed the size of the axis",
            });
        }
        self.ordered(ax, k, largest)
    }

    /// The first `k` entries along `ax` in the order (descending when `desc`), gathered.
    fn ordered(self, ax: usize, k: usize, desc: bool) -> Result<(Tensor<'g>, Vec<usize>)> {
        let (idx, out_shape) = self.order_indices(ax, k, desc)?;
        let values = self.gather(ax as isize, &idx, &out_shape)?;
        Ok((values, idx))
    }

    /// The indices of the first `k` entries along `ax` in the order, row-major in the output's
    /// shape (which it returns too).
    fn order_indices(self, ax: usize, k: usize, desc: bool) -> Result<(Vec<usize>, Vec<usize>)> {
        let shape = self.try_shape()?.to_vec();
        let (outer, n, inner) = layout(&shape, ax);
        let mut out_shape = shape.clone();
        out_shape[ax] = k;
        if outer == 0 || inner == 0 || k == 0 {
            // Nothing to order (an empty tensor's other extents may be huge: no row buffer).
            return Ok((Vec::new(), out_shape));
        }
        if inner == 1 && k.saturating_mul(8) < n {
            // Rows along the last axis and few picked: one scan per row of the values as
            // stored (f32 ones compared as f32), against the k-th best so far.
            let idx = if self.dtype() != arenagrad_exec::DType::F32 {
                // f64 as stored; the 16-bit and integer dtypes widened (exactly, below 2⁵³).
                let v = self.to_vec_f64()?;
                v.chunks(n)
                    .flat_map(|row| scan_best(row, k, desc))
                    .collect()
            } else {
                let v = self.to_vec::<f32>()?;
                v.chunks(n)
                    .flat_map(|row| scan_best(row, k, desc))
                    .collect()
            };
            return Ok((idx, out_shape));
        }
        let values = self.to_vec_f64()?;
        let mut idx = vec![0usize; outer * k * inner];
        let cmp = if desc { descending } else { ascending };
        let mut row: Vec<(f64, usize)> = Vec::with_capacity(n);
        for o in 0..outer {
            for i in 0..inner {
                row.clear();
                row.extend((0..n).map(|j| (values[(o * n + j) * inner + i], j)));
                let best = best_k(&mut row, k, cmp);
                for (r, &(_, j)) in best.iter().enumerate() {
                    idx[(o * k + r) * inner + i] = j;
                }
            }
        }
        Ok((idx, out_shape))
    }
}

/// The first `k` of `row` under `cmp`, in order. For a `k` under an eighth of the row, one scan
/// keeps the best `k` so far, sorted, and compares each entry against the worst of them (an
/// entry rarely gets in); otherwise a stable sort.
fn best_k(
    row: &mut [(f64, usize)],
    k: usize,
    cmp: fn((f64, usize), (f64, usize)) -> Ordering,
) -> Vec<(f64, usize)> {
    if k == 0 {
        return Vec::new();
    }
    if k.saturating_mul(8) >= row.len() {
        row.sort_by(|&a, &b| cmp(a, b));
        return row[..k].to_vec();
    }
    let mut best: Vec<(f64, usize)> = row[..k].to_vec();
    best.sort_by(|&a, &b| cmp(a, b));
    for &e in &row[k..] {
        if cmp(e, best[k - 1]) == Ordering::Less {
            let at = best.partition_point(|&b| cmp(b, e) == Ordering::Less);
            best.insert(at, e);
            best.pop();
        }
    }
    best
}

/// A value that may be NaN: f32 or f64.
trait Value: Copy + PartialOrd + Into<f64> {}
impl Value for f32 {}
impl Value for f64 {}

/// The indices of the `k` best entries of `row` in order (largest first when `desc`, NaN the
/// largest, earlier first among equals): the first `k` sorted, then each later entry compared
/// with the worst kept — a block of 16 at a time, skipped whole when none beats it (most
/// entries of a long row do not) — and inserted in order when it does.
fn scan_best<T: Value>(row: &[T], k: usize, desc: bool) -> Vec<usize> {
    let key = |j: usize| (row[j].into(), j);
    let cmp = if desc { descending } else { ascending };
    let mut best: Vec<(f64, usize)> = (0..k).map(key).collect();
    best.sort_by(|&a, &b| cmp(a, b));
    // Whether `x` might beat `worst`: strictly better (a later equal entry loses), NaN beating
    // numbers when descending and losing to them when ascending.
    #[allow(clippy::eq_op)]
    let beats = |x: T, worst: T| -> bool {
        let nan = x != x;
        let worst_nan = worst != worst;
        if desc {
            (nan && !worst_nan) || x > worst
        } else {
            (!nan && worst_nan) || x < worst
        }
    };
    let to_t = |b: (f64, usize)| row[b.1];
    let mut worst = to_t(best[k - 1]);
    let mut j = k;
    while j < row.len() {
        let end = (j + 16).min(row.len());
        let block = &row[j..end];
        let any = block.iter().fold(false, |acc, &x| acc | beats(x, worst));
        if any {
            for (o, &x) in block.iter().enumerate() {
                if beats(x, worst) {
                    let e = key(j + o);
                    let at = best.partition_point(|&b| cmp(b, e) == Ordering::Less);
                    best.insert(at, e);
                    best.pop();
                    worst = to_t(best[k - 1]);
                }
            }
        }
        j = end;
    }
    best.into_iter().map(|(_, j)| j).collect()
}
