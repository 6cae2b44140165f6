//! Tensors printed as PyTorch prints them (`torch._tensor_str`): `tensor([[ 0.1000, -2.0000],
//! [ 3.0000,  4.0000]])` with one width for every element, four decimals, whole numbers as
//! `1.`, scientific notation when the magnitudes span more than a factor of 1000 (or pass 1e8,
//! or fall below 1e-4), rows wrapped at 80 columns, and a tensor of more than 1000 elements
//! summarised by its first and last three entries along each axis around `...`. The dtype is
//! named when it is not f32, as PyTorch names a dtype other than its default.

use std::fmt::{self, Write};

use arenagrad_exec::DType;

use crate::host::HostTensor;

/// PyTorch's print options: elements past which a tensor is summarised, entries kept at each
/// end of a summarised axis, the line width, the decimals.
const THRESHOLD: usize = 1000;
const EDGE: usize = 3;
const LINE_WIDTH: usize = 80;
const PRECISION: usize = 4;

/// How every element of one tensor is written.
struct Style {
    /// Whole numbers: `3.`.
    int: bool,
    /// Scientific notation: `1.2346e+05`.
    sci: bool,
    /// The widest element's length: all are padded to it.
    width: usize,
    /// Integer (`3`) or boolean (`True`) elements, as PyTorch writes them.
    whole: Option<Whole>,
}

#[derive(Clone, Copy, PartialEq)]
enum Whole {
    Int,
    Bool,
}

impl Style {
    fn of(values: &[f64]) -> Style {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let nonzero: Vec<f64> = finite
            .iter()
            .map(|v| v.abs())
            .filter(|&v| v != 0.0)
            .collect();
        let int = finite.iter().all(|v| v.fract() == 0.0);
        let (lo, hi) = nonzero
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        let sci = !nonzero.is_empty()
            && if int {
                hi / lo > 1000.0 || hi > 1e8
            } else {
                hi / lo > 1000.0 || hi > 1e8 || lo < 1e-4
            };
        let mut style = Style {
            int,
            sci,
            width: 1,
            whole: None,
        };
        // As PyTorch: the width of the nonzero finite values (zeros, infinities and NaN are
        // padded to it, or overflow it).
        style.width = values
            .iter()
            .filter(|v| v.is_finite() && **v != 0.0)
            .map(|&v| style.write(v).chars().count())
            .max()
            .unwrap_or(1);
        style
    }

    /// The style of an integer or boolean tensor's values: each written as it is, padded to
    /// the widest of all (PyTorch counts zeros too here).
    fn whole(values: &[f64], kind: Whole) -> Style {
        let mut style = Style {
            int: true,
            sci: false,
            width: 1,
            whole: Some(kind),
        };
        style.width = values
            .iter()
            .map(|&v| style.write(v).chars().count())
            .max()
            .unwrap_or(1);
        style
    }

    /// `v` as this style writes it, unpadded.
    fn write(&self, v: f64) -> String {
        match self.whole {
            Some(Whole::Bool) => return if v != 0.0 { "True" } else { "False" }.into(),
            Some(Whole::Int) => return format!("{v:.0}"),
            None => {}
        }
        if v.is_nan() {
            return "nan".into();
        }
        if v.is_infinite() {
            return if v > 0.0 { "inf" } else { "-inf" }.into();
        }
        if self.sci {
            let s = format!("{v:.PRECISION$e}");
            // Rust's `1.2346e5` as Python's `1.2346e+05`.
            let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
            let exp: i32 = exp.parse().unwrap_or(0);
            let sign = if exp < 0 { '-' } else { '+' };
            format!("{mantissa}e{sign}{:02}", exp.abs())
        } else if self.int {
            format!("{v:.0}.")
        } else {
            format!("{v:.PRECISION$}")
        }
    }
}

/// The positions kept along an axis of `n` entries (all, or the ends around a gap: `None`).
fn kept(n: usize, summarise: bool) -> Vec<Option<usize>> {
    if summarise && n > 2 * EDGE {
        (0..EDGE)
            .map(Some)
            .chain(std::iter::once(None))
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    }
}

/// Writes the sub-tensor at `offset` of `shape` (row-major `strides`), `indent` columns in.
fn write_nested(
    out: &mut String,
    values: &[f64],
    (shape, strides): (&[usize], &[usize]),
    offset: usize,
    indent: usize,
    style: &Style,
    summarise: bool,
) {
    let Some((&n, rest)) = shape.split_first() else {
        let _ = write!(out, "{:>w$}", style.write(values[offset]), w = style.width);
        return;
    };
    out.push('[');
    if rest.is_empty() {
        // A row: as many elements per line as fit, later lines aligned after the bracket.
        let per_line = (LINE_WIDTH.saturating_sub(indent) / (style.width + 2)).max(1);
        let items: Vec<String> = kept(n, summarise)
            .into_iter()
            .map(|k| match k {
                Some(j) => format!(
                    "{:>w$}",
                    style.write(values[offset + j * strides[0]]),
                    w = style.width
                ),
                // PyTorch's own: " ...", unpadded.
                None => " ...".to_string(),
            })
            .collect();
        for (c, chunk) in items.chunks(per_line).enumerate() {
            if c > 0 {
                out.push_str(",\n");
                out.push_str(&" ".repeat(indent + 1));
            }
            out.push_str(&chunk.join(", "));
        }
    } else {
        let gap = format!(",{}{}", "\n".repeat(rest.len()), " ".repeat(indent + 1));
        for (c, k) in kept(n, summarise).into_iter().enumerate() {
            if c > 0 {
                out.push_str(&gap);
            }
            match k {
                Some(j) => write_nested(
                    out,
                    values,
                    (rest, &strides[1..]),
                    offset + j * strides[0],
                    indent + 1,
                    style,
                    summarise,
                ),
                None => out.push_str("..."),
            }
        }
    }
    out.push(']');
}

/// The values shown of a tensor (all, or the summarised corners), for the style to measure.
fn shown(values: &[f64], shape: &[usize], strides: &[usize], summarise: bool) -> Vec<f64> {
    let mut out = Vec::new();
    let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
    while let Some((axis, offset)) = stack.pop() {
        if axis == shape.len() {
            out.push(values[offset]);
            continue;
        }
        for k in kept(shape[axis], summarise).into_iter().rev().flatten() {
            stack.push((axis + 1, offset + k * strides[axis]));
        }
    }
    out
}

/// Writes `tensor(…)` for a host tensor, with `suffix` (`, requires_grad=True`, …) before
/// the closing parenthesis.
pub(crate) fn write_tensor(
    f: &mut fmt::Formatter<'_>,
    t: &HostTensor,
    suffix: &str,
) -> fmt::Result {
    let shape = t.shape();
    let values = t.to_f64_vec();
    let dtype = match t.dtype() {
        // PyTorch's defaults are not named: float32, int64 and bool.
        DType::F32 | DType::I64 | DType::Bool => String::new(),
        d => format!(", dtype={d}"),
    };
    if values.is_empty() {
        let size = if shape.len() > 1 {
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            format!(", size=({})", dims.join(", "))
        } else {
            String::new()
        };
        return write!(f, "tensor([]{size}{dtype}{suffix})");
    }
    let mut strides = vec![1usize; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * shape[a + 1];
    }
    let summarise = values.len() > THRESHOLD;
    let seen = shown(&values, shape, &strides, summarise);
    let style = match t.dtype() {
        DType::Bool => Style::whole(&seen, Whole::Bool),
        d if d.is_integer() => Style::whole(&seen, Whole::Int),
        _ => Style::of(&seen),
    };
    let mut out = String::from("tensor(");
    write_nested(
        &mut out,
        &values,
        (shape, &strides),
        0,
        "tensor(".len(),
        &style,
        summarise,
    );
    write!(f, "{out}{dtype}{suffix})")
}

impl fmt::Display for HostTensor {
    /// As PyTorch prints a tensor (see the module documentation).
    ///
    /// ```
    /// use arenagrad_graph::{DType, HostTensor};
    /// let t = HostTensor::from_f64(&[0.5, -2.0, 3.25, 1e-2], &[2, 2], DType::F32)?;
    /// assert_eq!(t.to_string(), "tensor([[ 0.5000, -2.0000],\n        [ 3.2500,  0.0100]])");
    /// let i = HostTensor::from_f64(&[1.0, 2.0, 30.0], &[3], DType::F64)?;
    /// assert_eq!(i.to_string(), "tensor([ 1.,  2., 30.], dtype=f64)");
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_tensor(f, self, "")
    }
}

impl fmt::Display for crate::Tensor<'_> {
    /// As PyTorch prints a tensor (see the module documentation), with `requires_grad=True`
    /// on a leaf that requires grad and `grad_fn=<op>` on a result that does; a stale handle
    /// prints `tensor(<stale>)`.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.leaf(&[1.0, 2.0], &[2], DType::F32)?;
    /// assert_eq!(x.to_string(), "tensor([1., 2.], requires_grad=True)");
    /// assert_eq!(x.mul(x)?.to_string(), "tensor([1., 4.], grad_fn=<mul>)");
    /// // More than 1000 elements: the first and last three along each axis.
    /// let big = g.arange(1000.0, 3000.0, 1.0, DType::F32)?.reshape(&[1000, 2])?;
    /// assert_eq!(
    ///     big.to_string(),
    ///     "tensor([[1000., 1001.],\n        [1002., 1003.],\n        [1004., 1005.],\n        \
    ///      ...,\n        [2994., 2995.],\n        [2996., 2997.],\n        [2998., 2999.]])"
    /// );
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = {
            let i = self.g.inner.borrow();
            match i.nodes.get(self.id) {
                None => return f.write_str("tensor(<stale>)"),
                Some(n) if !n.requires_grad => String::new(),
                Some(n) => match &n.op {
                    crate::ops::Op::Leaf | crate::ops::Op::Param(_) => {
                        ", requires_grad=True".to_string()
                    }
                    op => format!(", grad_fn=<{}>", op.name()),
                },
            }
        };
        match self.to_host() {
            Ok(t) => write_tensor(f, &t, &suffix),
            Err(e) => write!(f, "tensor(<{e}>)"),
        }
    }
}
