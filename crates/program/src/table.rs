//! The format's table of ops with numeric parameters: one row per op — its operands, its
//! parameters, its shape rule, how it runs, whether it is smooth and how random programs draw
//! its parameters — read by the parser, the printer, shape inference, the runner, the generator
//! and the fuzzers alike. A new graph op joins the format as one row here (and a reference case
//! in the tests).
//!
//! Every row is written `NAME a [b ...] P...`: the operands by name, then the parameters as
//! numbers (integers where the row says so).

use arenagrad_graph::{AttentionOptions, Graph, GraphError, Tensor};

use crate::infer::norm_axis;

/// What kind of number a parameter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A whole number, negative allowed (an axis, a diagonal offset).
    Int,
    /// A non-negative whole number (a count, an index).
    Count,
    /// Any number (`inf`, `-inf` and `nan` included).
    Float,
}

/// The shape rule: the output's shape from the operands' shapes and the parameters, or why the
/// op does not apply.
pub type ShapeFn = fn(&[&[usize]], &[f64]) -> Result<Vec<usize>, String>;
/// The forward, recorded: the output from the operands and the parameters.
pub type RunFn = for<'g> fn(&'g Graph, &[Tensor<'g>], &[f64]) -> Result<Tensor<'g>, GraphError>;
/// Random parameters for an operand of this shape (the op's every operand is that operand), from
/// four attribute bytes; `None` where the op cannot apply to such an operand.
pub type GenFn = fn(&[usize], [u8; 4]) -> Option<Vec<f64>>;

/// One op of the table.
pub struct OpRow {
    /// The name in programs.
    pub name: &'static str,
    /// Operands (tensors, by name).
    pub arity: usize,
    /// Its parameters, in order: what each is called in messages, and its kind.
    pub params: &'static [(&'static str, ParamKind)],
    /// Differentiable everywhere on the values random programs generate.
    pub smooth: bool,
    /// See [`ShapeFn`].
    pub shape: ShapeFn,
    /// See [`RunFn`].
    pub run: RunFn,
    /// See [`GenFn`]; `None`: random programs do not draw the op.
    pub gen: Option<GenFn>,
}

impl std::fmt::Debug for OpRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The row called `name`.
pub fn op_row(name: &str) -> Option<&'static OpRow> {
    OPS.iter().find(|r| r.name == name)
}

fn axis(s: &[usize], a: f64) -> Result<usize, String> {
    norm_axis(a as i64, s.len()).ok_or_else(|| format!("axis {a} is out of range for shape {s:?}"))
}

fn ax(a: f64) -> isize {
    a as isize
}

fn bad(what: &'static str) -> GraphError {
    GraphError::BadArgument {
        op: "program",
        what,
    }
}

fn without(s: &[usize], d: usize) -> Vec<usize> {
    let mut v = s.to_vec();
    v.remove(d);
    v
}

/// An axis of a non-empty rank from an attribute byte (sometimes written negative).
fn gen_axis(s: &[usize], t: u8) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let d = usize::from(t >> 1) % s.len();
    Some(if t & 1 == 1 {
        d as f64 - s.len() as f64
    } else {
        d as f64
    })
}

/// One axis parameter (the rows that reduce or scan along an axis).
fn gen_one_axis(s: &[usize], t: [u8; 4]) -> Option<Vec<f64>> {
    Some(vec![gen_axis(s, t[0])?])
}

/// A diagonal offset in -2..=2, for operands of rank 2 or more (`tril`, `triu`).
fn gen_diagonal(s: &[usize], t: [u8; 4]) -> Option<Vec<f64>> {
    (s.len() >= 2).then(|| vec![f64::from(t[0] % 5) - 2.0])
}

fn same(s: &[&[usize]], _p: &[f64]) -> Result<Vec<usize>, String> {
    Ok(s[0].to_vec())
}

fn same_operands(s: &[&[usize]]) -> Result<(), String> {
    if s.iter().all(|x| *x == s[0]) {
        Ok(())
    } else {
        Err(format!("expected operands of one shape, found {s:?}"))
    }
}

fn reduce_axis(s: &[&[usize]], p: &[f64]) -> Result<Vec<usize>, String> {
    let d = axis(s[0], p[p.len() - 1])?;
    if s[0][d] == 0 {
        return Err(format!(
            "axis {} of shape {:?} is empty",
            p[p.len() - 1],
            s[0]
        ));
    }
    Ok(without(s[0], d))
}

fn rank2(s: &[&[usize]], _p: &[f64]) -> Result<Vec<usize>, String> {
    if s[0].len() < 2 {
        return Err(format!("expected rank 2 or more, found shape {:?}", s[0]));
    }
    Ok(s[0].to_vec())
}

fn trailing(s: &[&[usize]], p: &[f64]) -> Result<Vec<usize>, String> {
    let nd = p[0] as usize;
    if nd == 0 || nd > s[0].len() {
        return Err(format!(
            "normalizes {nd} trailing axes of shape {:?} (expected 1 to the rank)",
            s[0]
        ));
    }
    if p[1].is_nan() || p[1] < 0.0 {
        return Err(format!("eps {} must be ≥ 0", p[1]));
    }
    Ok(s[0].to_vec())
}

fn pieces(s: &[usize], d: usize, size: usize) -> usize {
    s[d].div_ceil(size.max(1))
}

/// The table.
pub const OPS: &[OpRow] = &[
    OpRow {
        name: "cumsum",
        arity: 1,
        params: &[("the axis", ParamKind::Int)],
        smooth: true,
        // A scalar scans as one element (axis 0 or -1), as the engine's (PyTorch's) cumsum.
        shape: |s, p| {
            if s[0].is_empty() {
                return axis(&[1], p[0])
                    .map(|_| Vec::new())
                    .map_err(|_| format!("axis {} is out of range for a scalar", p[0]));
            }
            axis(s[0], p[0]).map(|_| s[0].to_vec())
        },
        run: |_, x, p| x[0].cumsum(ax(p[0])),
        gen: Some(gen_one_axis),
    },
    OpRow {
        name: "logsumexp",
        arity: 1,
        params: &[("the axis", ParamKind::Int)],
        smooth: true,
        // An empty axis is allowed: the engine gives −∞ there (PyTorch's answer).
        shape: |s, p| axis(s[0], p[0]).map(|d| without(s[0], d)),
        run: |_, x, p| x[0].logsumexp(&[ax(p[0])], false),
        gen: Some(gen_one_axis),
    },
    OpRow {
        name: "min",
        arity: 1,
        params: &[("the axis", ParamKind::Int)],
        smooth: false,
        shape: reduce_axis,
        run: |_, x, p| x[0].min_axes(&[ax(p[0])], false),
        gen: Some(gen_one_axis),
    },
    OpRow {
        name: "max_dim",
        arity: 1,
        params: &[("the axis", ParamKind::Int)],
        smooth: false,
        shape: reduce_axis,
        run: |_, x, p| Ok(x[0].max_dim(ax(p[0]), false)?.0),
        gen: Some(gen_one_axis),
    },
    OpRow {
        name: "norm",
        arity: 1,
        params: &[
            ("the order p", ParamKind::Float),
            ("the axis", ParamKind::Int),
        ],
        smooth: false,
        shape: |s, p| {
            if p[0].is_nan() || p[0] <= 0.0 {
                return Err(format!("the order p must be > 0, found {}", p[0]));
            }
            let d = axis(s[0], p[1])?;
            if p[0] == f64::INFINITY && s[0][d] == 0 {
                // The engine refuses it, as PyTorch: the largest of no magnitudes.
                return Err(format!(
                    "the inf norm over axis {} of shape {:?}, which is empty",
                    p[1], s[0]
                ));
            }
            Ok(without(s[0], d))
        },
        run: |_, x, p| x[0].norm(p[0], &[ax(p[1])], false),
        gen: Some(|s, t| {
            const P: [f64; 4] = [1.0, 2.0, f64::INFINITY, 3.0];
            Some(vec![P[usize::from(t[1]) % 4], gen_axis(s, t[0])?])
        }),
    },
    OpRow {
        name: "clamp",
        arity: 1,
        params: &[
            ("the lower bound", ParamKind::Float),
            ("the upper bound", ParamKind::Float),
        ],
        smooth: false,
        shape: same,
        run: |_, x, p| x[0].clamp(Some(p[0]), Some(p[1])),
        gen: Some(|_, t| {
            let lo = -1.5 + f64::from(t[0] % 8) * 0.25;
            Some(vec![lo, lo + 0.25 + f64::from(t[1] % 8) * 0.25])
        }),
    },
    OpRow {
        name: "tril",
        arity: 1,
        params: &[("the diagonal", ParamKind::Int)],
        smooth: true,
        shape: rank2,
        run: |_, x, p| x[0].tril(p[0] as isize),
        gen: Some(gen_diagonal),
    },
    OpRow {
        name: "triu",
        arity: 1,
        params: &[("the diagonal", ParamKind::Int)],
        smooth: true,
        shape: rank2,
        run: |_, x, p| x[0].triu(p[0] as isize),
        gen: Some(gen_diagonal),
    },
    OpRow {
        name: "masked_fill",
        arity: 2,
        params: &[("the fill value", ParamKind::Float)],
        smooth: false,
        shape: |s, _| match arenagrad_exec::layout::broadcast_shapes(s[0], s[1]) {
            Some(b) if b == s[0] => Ok(s[0].to_vec()),
            _ => Err(format!(
                "the mask {:?} does not broadcast to {:?}",
                s[1], s[0]
            )),
        },
        run: |_, x, p| x[0].masked_fill(x[1].detach()?, p[0]),
        gen: Some(|_, t| Some(vec![f64::from(t[0] % 5) - 2.0])),
    },
    OpRow {
        name: "layer_norm",
        arity: 1,
        params: &[
            ("the number of trailing axes", ParamKind::Count),
            ("eps", ParamKind::Float),
        ],
        smooth: true,
        shape: trailing,
        run: |_, x, p| x[0].layer_norm(p[0] as usize, None, None, p[1]),
        gen: Some(|s, t| {
            // Normalised over at least two elements, so the row is not a constant.
            let nd = 1 + usize::from(t[0]) % s.len().max(1);
            let n: usize = s[s.len().checked_sub(nd)?..].iter().product();
            (!s.is_empty() && n >= 2).then(|| vec![nd as f64, 1e-5])
        }),
    },
    OpRow {
        name: "rms_norm",
        arity: 1,
        params: &[
            ("the number of trailing axes", ParamKind::Count),
            ("eps", ParamKind::Float),
        ],
        smooth: true,
        shape: trailing,
        run: |_, x, p| x[0].rms_norm(p[0] as usize, None, p[1]),
        gen: Some(|s, t| {
            let nd = 1 + usize::from(t[0]) % s.len().max(1);
            (!s.is_empty()).then(|| vec![nd as f64, 1e-5])
        }),
    },
    OpRow {
        name: "attention",
        arity: 3,
        params: &[("causal (0 or 1)", ParamKind::Count)],
        smooth: true,
        shape: |s, p| {
            let (q, k, v) = (s[0], s[1], s[2]);
            let r = q.len();
            if r < 2 || k.len() != r || v.len() != r {
                return Err(format!("expected q, k, v of one rank ≥ 2, found {s:?}"));
            }
            if q[..r - 2] != k[..r - 2] || q[r - 1] != k[r - 1] || v[..r - 1] != k[..r - 1] {
                return Err(format!("q {q:?}, k {k:?}, v {v:?} do not fit together"));
            }
            if p[0] != 0.0 && p[0] != 1.0 {
                return Err(format!("causal must be 0 or 1, found {}", p[0]));
            }
            let mut o = q.to_vec();
            o[r - 1] = v[r - 1];
            Ok(o)
        },
        run: |_, x, p| {
            let opts = AttentionOptions {
                causal: p[0] == 1.0,
                ..Default::default()
            };
            x[0].scaled_dot_product_attention(x[1], x[2], opts)
        },
        gen: Some(|s, t| (s.len() >= 2).then(|| vec![f64::from(t[0] & 1)])),
    },
    OpRow {
        name: "stack",
        arity: 2,
        params: &[("the axis", ParamKind::Int)],
        smooth: true,
        shape: |s, p| {
            same_operands(s)?;
            let r = s[0].len() + 1;
            let d = norm_axis(p[0] as i64, r)
                .ok_or_else(|| format!("axis {} is out of range for rank {r}", p[0]))?;
            let mut o = s[0].to_vec();
            o.insert(d, s.len());
            Ok(o)
        },
        run: |g, x, p| g.stack(x, ax(p[0])),
        gen: Some(|s, t| {
            let r = s.len() + 1;
            Some(vec![(usize::from(t[0]) % r) as f64])
        }),
    },
    OpRow {
        name: "slice_step",
        arity: 1,
        params: &[
            ("the axis", ParamKind::Int),
            ("the start", ParamKind::Count),
            ("the end", ParamKind::Count),
            ("the step", ParamKind::Count),
        ],
        smooth: true,
        shape: |s, p| {
            let d = axis(s[0], p[0])?;
            let (start, end, step) = (p[1] as usize, p[2] as usize, p[3] as usize);
            if step == 0 || start > end || end > s[0][d] {
                return Err(format!(
                    "slice_step {start}..{end} by {step} does not fit axis {} of {:?}",
                    p[0], s[0]
                ));
            }
            let mut o = s[0].to_vec();
            o[d] = (end - start).div_ceil(step);
            Ok(o)
        },
        run: |_, x, p| x[0].slice_step(ax(p[0]), p[1] as usize, p[2] as usize, p[3] as usize),
        gen: Some(|s, t| {
            let a = gen_axis(s, t[0])?;
            let ext = s[norm_axis(a as i64, s.len())?];
            let start = usize::from(t[1]) % ext.max(1);
            Some(vec![a, start as f64, ext as f64, f64::from(1 + t[2] % 3)])
        }),
    },
    OpRow {
        name: "chunk",
        arity: 1,
        params: &[
            ("the number of chunks", ParamKind::Count),
            ("the axis", ParamKind::Int),
            ("which chunk", ParamKind::Count),
        ],
        smooth: true,
        shape: |s, p| {
            let d = axis(s[0], p[1])?;
            let (n, k) = (p[0] as usize, p[2] as usize);
            if n == 0 {
                return Err("chunk: the number of chunks must be ≥ 1".into());
            }
            let size = s[0][d].div_ceil(n);
            let count = if s[0][d] == 0 {
                n
            } else {
                pieces(s[0], d, size)
            };
            if k >= count {
                return Err(format!("chunk {k} of {count} along axis {}", p[1]));
            }
            let mut o = s[0].to_vec();
            o[d] = if s[0][d] == 0 {
                0
            } else {
                size.min(s[0][d] - k * size)
            };
            Ok(o)
        },
        // The k-th piece alone (a slice), never all n of them: n may be huge on an empty axis.
        run: |_, x, p| {
            let s = x[0].try_shape()?;
            let d = norm_axis(p[1] as i64, s.len()).ok_or(bad("axis out of range"))?;
            let (n, k) = (p[0] as usize, p[2] as usize);
            let size = s[d].div_ceil(n.max(1));
            let start = k.saturating_mul(size).min(s[d]);
            x[0].slice(d as isize, start, start.saturating_add(size).min(s[d]))
        },
        gen: Some(|s, t| {
            let a = gen_axis(s, t[0])?;
            let ext = s[norm_axis(a as i64, s.len())?];
            let n = 1 + usize::from(t[1]) % 3;
            let size = ext.div_ceil(n);
            let count = if ext == 0 {
                n
            } else {
                ext.div_ceil(size.max(1))
            };
            Some(vec![n as f64, a, (usize::from(t[2]) % count) as f64])
        }),
    },
    OpRow {
        name: "split",
        arity: 1,
        params: &[
            ("the piece size", ParamKind::Count),
            ("the axis", ParamKind::Int),
            ("which piece", ParamKind::Count),
        ],
        smooth: true,
        shape: |s, p| {
            let d = axis(s[0], p[1])?;
            let (size, k) = (p[0] as usize, p[2] as usize);
            if size == 0 {
                return Err("split: the piece size must be ≥ 1".into());
            }
            let count = pieces(s[0], d, size).max(1);
            if k >= count {
                return Err(format!("piece {k} of {count} along axis {}", p[1]));
            }
            let mut o = s[0].to_vec();
            o[d] = size.min(s[0][d].saturating_sub(k * size));
            Ok(o)
        },
        // The k-th piece alone (a slice).
        run: |_, x, p| {
            let s = x[0].try_shape()?;
            let d = norm_axis(p[1] as i64, s.len()).ok_or(bad("axis out of range"))?;
            let (size, k) = (p[0] as usize, p[2] as usize);
            let start = k.saturating_mul(size).min(s[d]);
            x[0].slice(d as isize, start, start.saturating_add(size).min(s[d]))
        },
        gen: Some(|s, t| {
            let a = gen_axis(s, t[0])?;
            let ext = s[norm_axis(a as i64, s.len())?];
            let size = 1 + usize::from(t[1]) % ext.max(1);
            let count = ext.div_ceil(size).max(1);
            Some(vec![size as f64, a, (usize::from(t[2]) % count) as f64])
        }),
    },
    OpRow {
        name: "unbind",
        arity: 1,
        params: &[
            ("the axis", ParamKind::Int),
            ("which slice", ParamKind::Count),
        ],
        smooth: true,
        shape: |s, p| {
            let d = axis(s[0], p[0])?;
            if p[1] as usize >= s[0][d] {
                return Err(format!("slice {} of {} along axis {}", p[1], s[0][d], p[0]));
            }
            Ok(without(s[0], d))
        },
        // The k-th slice alone.
        run: |_, x, p| {
            let s = x[0].try_shape()?;
            let d = norm_axis(p[0] as i64, s.len()).ok_or(bad("axis out of range"))?;
            let k = p[1] as usize;
            let mut out: Vec<isize> = s.iter().map(|&e| e as isize).collect();
            out.remove(d);
            x[0].slice(d as isize, k, k + 1)?.reshape(&out)
        },
        gen: Some(|s, t| {
            let a = gen_axis(s, t[0])?;
            let ext = s[norm_axis(a as i64, s.len())?];
            (ext > 0).then(|| vec![a, (usize::from(t[1]) % ext) as f64])
        }),
    },
    OpRow {
        name: "one_hot",
        arity: 1,
        params: &[("the number of classes", ParamKind::Count)],
        smooth: false,
        shape: |s, p| {
            let mut o = s[0].to_vec();
            o.push(p[0] as usize);
            Ok(o)
        },
        run: |g, x, p| {
            let v = x[0].to_vec_f64()?;
            let idx = v
                .iter()
                .map(|&f| {
                    if f >= 0.0 && f.fract() == 0.0 && f < p[0] {
                        Ok(f as usize)
                    } else {
                        Err(GraphError::BadArgument {
                            op: "one_hot",
                            what: "an index that is not a whole number below the class count",
                        })
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            let h = g.one_hot(&idx, p[0] as usize, x[0].dtype())?;
            let mut shape: Vec<isize> = x[0].shape().iter().map(|&d| d as isize).collect();
            shape.push(p[0] as isize);
            h.reshape(&shape)
        },
        gen: None,
    },
    // `arange a START END STEP`: the values START, START + STEP, ... below END, in `a`'s dtype
    // and on its device (`a`'s values are not read; no gradient flows).
    OpRow {
        name: "arange",
        arity: 1,
        params: &[
            ("the start", ParamKind::Float),
            ("the end", ParamKind::Float),
            ("the step", ParamKind::Float),
        ],
        smooth: false,
        shape: |_, p| {
            let (a, b, st) = (p[0], p[1], p[2]);
            if !(a.is_finite() && b.is_finite() && st.is_finite()) || st == 0.0 {
                return Err(format!(
                    "arange {a} {b} {st}: expected finite bounds and a step ≠ 0"
                ));
            }
            // The engine's count, and its refusal of a step pointing away from the end.
            let n = ((b - a) / st).ceil();
            if n < 0.0 {
                return Err(format!(
                    "arange {a} {b} {st}: the step points away from the end"
                ));
            }
            if n > 1e9 {
                return Err(format!("arange {a} {b} {st} has too many elements"));
            }
            Ok(vec![n as usize])
        },
        run: |g, x, p| {
            g.arange(p[0], p[1], p[2], x[0].dtype())?
                .to_device(x[0].device())
        },
        gen: None,
    },
];
