//! Rearranging entries, each composed of [`Tensor::index_select`] or [`Tensor::reshape`] (their
//! gradients add back into the entries copied): PyTorch's `flip`, `roll`, `repeat`,
//! `repeat_interleave`, `squeeze` and `unsqueeze`.

use crate::error::{GraphError, Result};
use crate::shape::norm_axis;
use crate::Tensor;

impl<'g> Tensor<'g> {
    /// The entries in reverse order along each of `axes` (PyTorch's `flip`).
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32)?;
    /// assert_eq!(x.flip(&[1])?.to_vec::<f32>()?, [3.0, 2.0, 1.0, 6.0, 5.0, 4.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn flip(self, axes: &[isize]) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        let mut y = self;
        for &a in axes {
            let ax = norm_axis("flip", a, &shape)?;
            let n = shape[ax];
            let idx = index_list("flip", &shape, n, |j| n - 1 - j)?;
            y = y.index_select(ax as isize, &idx)?;
        }
        Ok(y)
    }

    /// The entries shifted by `shift` along `axis`, those pushed off one end coming back at the
    /// other (PyTorch's `roll(shifts, dims)`; a negative shift goes the other way).
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.from_f64(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F32)?;
    /// assert_eq!(x.roll(1, 0)?.to_vec::<f32>()?, [4.0, 1.0, 2.0, 3.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn roll(self, shift: isize, axis: isize) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        let ax = norm_axis("roll", axis, &shape)?;
        let n = shape[ax];
        if n == 0 {
            return Ok(self);
        }
        let s = shift.rem_euclid(n as isize) as usize;
        let idx = index_list("roll", &shape, n, |j| (j + n - s) % n)?;
        self.index_select(ax as isize, &idx)
    }

    /// The tensor tiled `reps[i]` times along axis `i` (PyTorch's `Tensor.repeat`): `reps` has
    /// at least as many entries as the tensor has axes, extra leading ones adding axes.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.from_f64(&[1.0, 2.0], &[2], DType::F32)?;
    /// let y = x.repeat(&[2, 2])?;
    /// assert_eq!(y.shape().as_slice(), &[2, 4]);
    /// assert_eq!(y.to_vec::<f32>()?, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn repeat(self, reps: &[usize]) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        if reps.len() < shape.len() {
            return Err(GraphError::BadArgument {
                op: "repeat",
                what: "the repeats must be at least as many as the axes",
            });
        }
        let extra = reps.len() - shape.len();
        let full: Vec<isize> = std::iter::repeat_n(1, extra)
            .chain(shape.iter().map(|&d| d as isize))
            .collect();
        // The output's extents and size, checked before any index list is made.
        let too_large = || GraphError::TooLarge {
            op: "repeat",
            shape: shape.to_vec(),
        };
        let out = full
            .iter()
            .zip(reps)
            .map(|(&d, &r)| (d as usize).checked_mul(r).ok_or_else(too_large))
            .collect::<Result<Vec<usize>>>()?;
        crate::shape::checked_numel("repeat", &out)?;
        let mut y = self.reshape(&full)?;
        for (ax, &r) in reps.iter().enumerate() {
            let n = full[ax] as usize;
            if r == 1 {
                continue;
            }
            let len = n.checked_mul(r).ok_or_else(|| GraphError::TooLarge {
                op: "repeat",
                shape: shape.to_vec(),
            })?;
            let idx = index_list("repeat", &shape, len, |j| j % n.max(1))?;
            y = y.index_select(ax as isize, &idx)?;
        }
        Ok(y)
    }

    /// Each entry along `axis` repeated `n` times in place (PyTorch's
    /// `repeat_interleave(n, dim)`).
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.from_f64(&[1.0, 2.0], &[2], DType::F32)?;
    /// assert_eq!(x.repeat_interleave(3, 0)?.to_vec::<f32>()?, [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn repeat_interleave(self, n: usize, axis: isize) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        let ax = norm_axis("repeat_interleave", axis, &shape)?;
        let len = shape[ax]
            .checked_mul(n)
            .ok_or_else(|| GraphError::TooLarge {
                op: "repeat_interleave",
                shape: shape.to_vec(),
            })?;
        let idx = index_list("repeat_interleave", &shape, len, |j| j / n.max(1))?;
        self.index_select(ax as isize, &idx)
    }

    /// A new axis of extent 1 at `axis` (PyTorch's `unsqueeze`; −1 is after the last).
    pub fn unsqueeze(self, axis: isize) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        let rank = shape.len() as isize;
        let at = if axis < 0 { axis + rank + 1 } else { axis };
        if !(0..=rank).contains(&at) {
            return Err(GraphError::BadAxis {
                op: "unsqueeze",
                axis,
                shape: shape.to_vec(),
            });
        }
        let mut s: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
        s.insert(at as usize, 1);
        self.reshape(&s)
    }

    /// Without the axis `axis` when its extent is 1 (itself otherwise), or without every axis
    /// of extent 1 for `None` (PyTorch's `squeeze`).
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.zeros(&[1, 3, 1], DType::F32)?;
    /// assert_eq!(x.squeeze(None)?.shape().as_slice(), &[3]);
    /// assert_eq!(x.squeeze(Some(1))?.shape().as_slice(), &[1, 3, 1]);
    /// assert_eq!(x.unsqueeze(-1)?.shape().as_slice(), &[1, 3, 1, 1]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn squeeze(self, axis: Option<isize>) -> Result<Tensor<'g>> {
        let shape = self.try_shape()?;
        let keep: Vec<isize> = match axis {
            None => shape
                .iter()
                .filter(|&&d| d != 1)
                .map(|&d| d as isize)
                .collect(),
            Some(a) => {
                let ax = norm_axis("squeeze", a, &shape)?;
                shape
                    .iter()
                    .enumerate()
                    .filter(|&(i, &d)| i != ax || d != 1)
                    .map(|(_, &d)| d as isize)
                    .collect()
            }
        };
        self.reshape(&keep)
    }
}

/// The `n` indices `f(0), …, f(n − 1)` of a rearrangement, reserved fallibly: an extent past
/// memory (an empty tensor may have one) is [`GraphError::OutOfMemory`] naming `op` and the
/// tensor's `shape`, never an abort.
fn index_list(
    op: &'static str,
    shape: &[usize],
    n: usize,
    f: impl Fn(usize) -> usize,
) -> Result<Vec<usize>> {
    let mut v = crate::host::try_vec(op, shape, n)?;
    v.extend((0..n).map(f));
    Ok(v)
}
