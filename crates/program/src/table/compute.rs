//! Rows that compute new values from several elements or from constants: `matmul`, `clamp`,
//! `masked_fill`, `layer_norm`, `rms_norm`, `attention`, `one_hot`, `arange`, `conv2d`,
//! `conv_transpose2d`, `conv1d`, `conv_transpose1d`, `where`, `einsum`.

use arenagrad_exec::layout::broadcast_shapes;
use arenagrad_exec::Positive;
use arenagrad_graph::{einsum_shape, AttentionOptions, GraphError, Tensor};

use super::{
    all_ones, count, float, reshape_to, same, subscripts, Arity, Draw, Drawn, Gen, OpRow, Param,
    Refusal, DRAWN_SUBSCRIPTS,
};

/// numpy's matmul operands: a 1-D left operand is a row `[1, k]`, a 1-D right one a column
/// `[k, 1]`.
fn promoted(a: &[usize], b: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let a2 = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2 = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    (a2, b2)
}

/// The shape of `matmul a b` under numpy's rules, and its batch shape, or why not.
fn matmul_shapes(a: &[usize], b: &[usize]) -> Result<(Vec<usize>, Vec<usize>), String> {
    if a.is_empty() || b.is_empty() {
        return Err("expected operands of rank 1 or more".into());
    }
    let (a2, b2) = promoted(a, b);
    let (ra, rb) = (a2.len(), b2.len());
    let (ka, kb) = (a2[ra - 1], b2[rb - 2]);
    if ka != kb {
        return Err(format!(
            "expected the left operand's last extent ({ka}) to equal the right operand's {} \
             extent ({kb})",
            if b.len() == 1 {
                "only"
            } else {
                "second-to-last"
            }
        ));
    }
    let batch = broadcast_shapes(&a2[..ra - 2], &b2[..rb - 2])
        .ok_or("expected batch dimensions that broadcast")?;
    let mut out = batch.clone();
    if a.len() > 1 {
        out.push(a2[ra - 2]);
    }
    if b.len() > 1 {
        out.push(b2[rb - 1]);
    }
    Ok((out, batch))
}

/// The shape of `matmul a b` under numpy's rules, if defined.
fn matmul_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    matmul_shapes(a, b).ok().map(|(out, _)| out)
}

/// `matmul a b`: numpy's matmul (1-D, 2-D, batched with broadcasting).
pub(super) const MATMUL: OpRow = OpRow::new(
    "matmul",
    |s, _| {
        let (a, b) = (s[0], s[1]);
        matmul_shapes(a, b)
            .map(|(out, _)| out)
            .map_err(|why| Refusal::at(1, format!("cannot multiply {a:?} by {b:?}: {why}")))
    },
    |_, x, _| {
        let (a, b) = (x[0].try_shape()?.to_vec(), x[1].try_shape()?.to_vec());
        // Batch dimensions that broadcast from all ones: reshaped to the full batch first, so
        // the backward rule sums no broadcast gradient over all-ones extents (see `sum`'s row).
        if let Ok((out, batch)) = matmul_shapes(&a, &b) {
            let (a2, b2) = promoted(&a, &b);
            let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
            if all_ones(&batch) && (ba != batch.as_slice() || bb != batch.as_slice()) {
                let full = |m: &[usize]| -> Vec<usize> {
                    let mut v = batch.clone();
                    v.extend_from_slice(&m[m.len() - 2..]);
                    v
                };
                let l = reshape_to(x[0], &full(&a2))?;
                let r = reshape_to(x[1], &full(&b2))?;
                return reshape_to(l.matmul(r)?, &out);
            }
        }
        x[0].matmul(x[1])
    },
)
.arity(Arity::Exactly(2))
.work(|s, _, _| {
    let Ok((_, batch)) = matmul_shapes(s[0], s[1]) else {
        return 0;
    };
    let (a2, b2) = promoted(s[0], s[1]);
    let (m, k, n) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
    batch
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .and_then(|x| x.checked_mul(m))
        .and_then(|x| x.checked_mul(n))
        .and_then(|x| x.checked_mul(k))
        .and_then(|x| u64::try_from(x).ok())
        .unwrap_or(u64::MAX)
})
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| {
    let sa = d.shape(d.a).to_vec();
    let r = sa.len();
    if r == 0 {
        return None;
    }
    let b = match d.pick(|s| matmul_shape(&sa, s).is_some_and(|o| d.fits(&o)), d.b) {
        Some(b) => b,
        None => {
            // A fresh input of shape [k, m] to multiply with.
            let shape = vec![sa[r - 1], 1 + usize::from(d.attrs[0]) % d.max_dim.max(1)];
            match matmul_shape(&sa, &shape) {
                Some(s) if d.fits(&s) && d.fits(&shape) => d.fresh_input(shape),
                _ => return None,
            }
        }
    };
    Some((vec![d.a, b], Vec::new()))
}));

/// `clamp a LO HI`: bounded below and above.
pub(super) const CLAMP: OpRow = OpRow::new("clamp", same, |_, x, p| {
    x[0].clamp(Some(p[0].as_f64()), Some(p[1].as_f64()))
})
.params(&[
    float("the lower bound", "LO"),
    float("the upper bound", "HI"),
])
.kinked()
.gen(Gen::Params(|_, t| {
    let lo = -1.5 + f64::from(t[0] % 8) * 0.25;
    Some(vec![lo, lo + 0.25 + f64::from(t[1] % 8) * 0.25])
}));

/// `masked_fill a MASK VALUE`: VALUE where MASK ≠ 0 (MASK broadcasts to a's shape).
pub(super) const MASKED_FILL: OpRow = OpRow::new(
    "masked_fill",
    |s, _| match broadcast_shapes(s[0], s[1]) {
        Some(b) if b == s[0] => Ok(s[0].to_vec()),
        _ => Err(format!("the mask {:?} does not broadcast to {:?}", s[1], s[0]).into()),
    },
    |_, x, p| x[0].masked_fill(x[1].detach()?, p[0].as_f64()),
)
.integers(&[(1, super::MASK)])
.arity(Arity::Exactly(2))
.params(&[float("the fill value", "VALUE")])
.kinked()
.gen(Gen::Params(|_, t| Some(vec![f64::from(t[0] % 5) - 2.0])));

/// Normalised over NDIM trailing axes with a non-negative eps (`layer_norm`, `rms_norm`).
fn trailing(s: &[&[usize]], p: &[Param]) -> Result<Vec<usize>, Refusal> {
    let nd = p[0].as_usize();
    if nd == 0 || nd > s[0].len() {
        return Err(format!(
            "normalizes {nd} trailing axes of shape {:?} (expected 1 to the rank)",
            s[0]
        )
        .into());
    }
    let eps = p[1].as_f64();
    if eps.is_nan() || eps < 0.0 {
        return Err(format!("eps {eps} must be ≥ 0").into());
    }
    Ok(s[0].to_vec())
}

const NORM_PARAMS: [super::ParamSpec; 2] = [
    count("the number of trailing axes", "NDIM"),
    float("eps", "EPS"),
];

/// `layer_norm a NDIM EPS`: over the last NDIM axes, no affine.
pub(super) const LAYER_NORM: OpRow = OpRow::new("layer_norm", trailing, |_, x, p| {
    x[0].layer_norm(p[0].as_usize(), None, None, p[1].as_f64())
})
.params(&NORM_PARAMS)
.gen(Gen::Params(|s, t| {
    // Normalised over at least two elements, so the row is not a constant.
    let nd = 1 + usize::from(t[0]) % s.len().max(1);
    let n: usize = s[s.len().checked_sub(nd)?..].iter().product();
    (!s.is_empty() && n >= 2).then(|| vec![nd as f64, 1e-5])
}));

/// `rms_norm a NDIM EPS`: over the last NDIM axes, no affine.
pub(super) const RMS_NORM: OpRow = OpRow::new("rms_norm", trailing, |_, x, p| {
    x[0].rms_norm(p[0].as_usize(), None, p[1].as_f64())
})
.params(&NORM_PARAMS)
.gen(Gen::Params(|s, t| {
    let nd = 1 + usize::from(t[0]) % s.len().max(1);
    (!s.is_empty()).then(|| vec![nd as f64, 1e-5])
}));

/// `attention q k v CAUSAL`: scaled dot-product attention (CAUSAL 0 or 1).
pub(super) const ATTENTION: OpRow = OpRow::new(
    "attention",
    |s, p| {
        let (q, k, v) = (s[0], s[1], s[2]);
        let r = q.len();
        if r < 2 || k.len() != r || v.len() != r {
            return Err(format!("expected q, k, v of one rank ≥ 2, found {s:?}").into());
        }
        if q[..r - 2] != k[..r - 2] || q[r - 1] != k[r - 1] || v[..r - 1] != k[..r - 1] {
            return Err(format!("q {q:?}, k {k:?}, v {v:?} do not fit together").into());
        }
        if p[0].as_usize() > 1 {
            return Err(format!("causal must be 0 or 1, found {}", p[0]).into());
        }
        let mut o = q.to_vec();
        o[r - 1] = v[r - 1];
        Ok(o)
    },
    |_, x, p| {
        let opts = AttentionOptions {
            causal: p[0].as_usize() == 1,
            ..Default::default()
        };
        x[0].scaled_dot_product_attention(x[1], x[2], opts)
    },
)
.arity(Arity::Exactly(3))
.params(&[count("causal (0 or 1)", "CAUSAL")])
.gen(Gen::Params(|s, t| {
    (s.len() >= 2).then(|| vec![f64::from(t[0] & 1)])
}));

/// `one_hot a CLASSES`: a's values as class indices (no gradient).
pub(super) const ONE_HOT: OpRow = OpRow::new(
    "one_hot",
    |s, p| {
        let mut o = s[0].to_vec();
        o.push(p[0].as_usize());
        Ok(o)
    },
    |g, x, p| {
        let classes = p[0].as_usize();
        let idx = x[0]
            .to_vec_f64()?
            .iter()
            .map(|&f| {
                if f >= 0.0 && f.fract() == 0.0 && f < classes as f64 {
                    Ok(f as usize)
                } else {
                    Err(GraphError::BadArgument {
                        op: "one_hot",
                        what: "an index that is not a whole number below the class count",
                    })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let h = g.one_hot(&idx, classes, x[0].dtype())?;
        let mut shape: Vec<isize> = x[0].shape().iter().map(|&d| d as isize).collect();
        shape.push(isize::try_from(classes).unwrap_or(isize::MAX));
        h.reshape(&shape)
    },
)
.params(&[count("the number of classes", "CLASSES")])
.kinked();

/// `arange a START END STEP`: the values START, START + STEP, ... below END, in `a`'s dtype and
/// on its device (`a`'s values are not read; no gradient flows).
pub(super) const ARANGE: OpRow = OpRow::new(
    "arange",
    |_, p| {
        let (a, b, st) = (p[0].as_f64(), p[1].as_f64(), p[2].as_f64());
        if !(a.is_finite() && b.is_finite() && st.is_finite()) || st == 0.0 {
            return Err(format!("{a} {b} {st}: expected finite bounds and a step ≠ 0").into());
        }
        // The engine's count, and its refusal of a step pointing away from the end.
        let n = ((b - a) / st).ceil();
        if n < 0.0 {
            return Err(format!("{a} {b} {st}: the step points away from the end").into());
        }
        if n > 1e9 {
            return Err(format!("{a} {b} {st} has too many elements").into());
        }
        Ok(vec![n as usize])
    },
    |g, x, p| {
        g.arange(p[0].as_f64(), p[1].as_f64(), p[2].as_f64(), x[0].dtype())?
            .to_device(x[0].device())
    },
)
.params(&[
    float("the start", "START"),
    float("the end", "END"),
    float("the step", "STEP"),
])
.kinked();

/// A convolution row's operands: `x` `[N, C, …]` with `spatial` axes after the channels, or
/// unbatched `[C, …]` as PyTorch takes it (`batched` false), and a weight of rank
/// `spatial + 2`; every extent positive.
struct ConvOperands<'s> {
    batched: bool,
    /// `[N, C, …]` (N = 1 when unbatched).
    x: Vec<usize>,
    w: &'s [usize],
}

fn conv_operands<'s>(s: &[&'s [usize]], spatial: usize) -> Result<ConvOperands<'s>, Refusal> {
    let (x, w) = (s[0], s[1]);
    let x4 = if x.len() == spatial + 2 {
        x.to_vec()
    } else if x.len() == spatial + 1 {
        [&[1][..], x].concat()
    } else {
        let form = if spatial == 1 {
            "[N, C, L] or [C, L]"
        } else {
            "[N, C, H, W] or [C, H, W]"
        };
        return Err(Refusal::at(0, format!("expected {form}, found {x:?}")));
    };
    if w.len() != spatial + 2 {
        return Err(Refusal::at(
            1,
            format!("expected a weight of rank {}, found {w:?}", spatial + 2),
        ));
    }
    if x4.contains(&0) || w.contains(&0) {
        return Err(Refusal::op(format!(
            "{x:?} and {w:?}: every extent must be positive"
        )));
    }
    Ok(ConvOperands {
        batched: x.len() == spatial + 2,
        x: x4,
        w,
    })
}

/// Stride and dilation of a convolution row (parameters 0 and `dil_at`, tokens 2 and
/// `2 + dil_at`), each at least 1, and the groups (the parameter after the dilation), at least 1
/// and dividing `channels`.
fn conv_steps(
    p: &[Param],
    dil_at: usize,
    channels: usize,
) -> Result<(usize, usize, usize), Refusal> {
    let (s, d, g) = (
        p[0].as_usize(),
        p[dil_at].as_usize(),
        p[dil_at + 1].as_usize(),
    );
    if s == 0 {
        return Err(Refusal::at(2, "the stride must be at least 1"));
    }
    if d == 0 {
        return Err(Refusal::at(2 + dil_at, "the dilation must be at least 1"));
    }
    if g == 0 || !channels.is_multiple_of(g) {
        return Err(Refusal::at(
            3 + dil_at,
            format!("{g} groups: expected a divisor of the {channels} input channels"),
        ));
    }
    Ok((s, d, g))
}

/// The output's shape, batched as the input was.
fn conv_out(c: &ConvOperands<'_>, channels: usize, extents: Vec<usize>) -> Vec<usize> {
    let v = [vec![c.x[0], channels], extents].concat();
    if c.batched {
        v
    } else {
        v[1..].to_vec()
    }
}

/// `x` as the engine's batched input (of `spatial` axes), the row's `f` on it, and the result
/// unbatched again.
fn conv_run<'g>(
    x: Tensor<'g>,
    spatial: usize,
    f: impl FnOnce(Tensor<'g>) -> Result<Tensor<'g>, GraphError>,
) -> Result<Tensor<'g>, GraphError> {
    let s = x.try_shape()?;
    if s.len() != spatial + 1 {
        return f(x);
    }
    let y = f(x.unsqueeze(0)?)?;
    y.squeeze(Some(0))
}

/// The shape rule of `conv1d` (`spatial` 1) and `conv2d` (2): PyTorch's, the same stride,
/// padding and dilation along every spatial axis.
fn conv_shape(s: &[&[usize]], p: &[Param], spatial: usize) -> Result<Vec<usize>, Refusal> {
    let c = conv_operands(s, spatial)?;
    let ch = c.x[1];
    let (st, d, g) = conv_steps(p, 2, ch)?;
    let (o, cg) = (c.w[0], c.w[1]);
    if cg.checked_mul(g) != Some(ch) || !o.is_multiple_of(g) {
        return Err(Refusal::at(
            1,
            format!("weight {:?} does not fit {ch} channels in {g} groups", c.w),
        ));
    }
    let pad = p[1].as_usize();
    let extent = |n: usize, k: usize| -> Result<usize, Refusal> {
        let reach = d
            .checked_mul(k - 1)
            .and_then(|v| v.checked_add(1))
            .ok_or_else(|| Refusal::too_large(4, "the dilated kernel overflows"))?;
        let padded = pad
            .checked_mul(2)
            .and_then(|v| v.checked_add(n))
            .filter(|&v| v <= isize::MAX as usize)
            .ok_or_else(|| Refusal::too_large(3, "the padded input overflows"))?;
        if padded < reach {
            return Err(Refusal::op(format!(
                "the kernel ({k}, dilation {d}) reaches past the padded input ({padded})"
            )));
        }
        Ok((padded - reach) / st + 1)
    };
    let extents = (0..spatial)
        .map(|a| extent(c.x[2 + a], c.w[2 + a]))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(conv_out(&c, o, extents))
}

/// The shape rule of `conv_transpose1d` (`spatial` 1) and `conv_transpose2d` (2).
fn conv_transpose_shape(
    s: &[&[usize]],
    p: &[Param],
    spatial: usize,
) -> Result<Vec<usize>, Refusal> {
    let c = conv_operands(s, spatial)?;
    let ch = c.x[1];
    let (st, d, g) = conv_steps(p, 3, ch)?;
    let (wc, og) = (c.w[0], c.w[1]);
    if wc != ch {
        return Err(Refusal::at(
            1,
            format!("weight {:?}: expected {ch} input channels first", c.w),
        ));
    }
    let (pad, op) = (p[1].as_usize(), p[2].as_usize());
    if op >= st && op >= d {
        return Err(Refusal::at(
            4,
            format!("output padding {op}: expected less than the stride or the dilation"),
        ));
    }
    // (n − 1)·s + d·(k − 1) + op + 1 − 2p, positive.
    let extent = |n: usize, k: usize| -> Result<usize, Refusal> {
        let full = (n - 1)
            .checked_mul(st)
            .and_then(|v| v.checked_add(d.checked_mul(k - 1)?))
            .and_then(|v| v.checked_add(op + 1))
            .filter(|&v| v <= isize::MAX as usize)
            .ok_or_else(|| Refusal::too_large(2, "the output's extent overflows"))?;
        match pad.checked_mul(2).and_then(|p2| full.checked_sub(p2)) {
            Some(e) if e > 0 => Ok(e),
            _ => Err(Refusal::at(3, format!("padding {pad} leaves no output"))),
        }
    };
    let o = og
        .checked_mul(g)
        .ok_or_else(|| Refusal::too_large(1, "the output channels overflow"))?;
    let extents = (0..spatial)
        .map(|a| extent(c.x[2 + a], c.w[2 + a]))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(conv_out(&c, o, extents))
}

/// Stride, padding, dilation and groups of a convolution row.
fn conv_params(p: &[Param]) -> (usize, usize, usize, usize) {
    (
        p[0].as_usize(),
        p[1].as_usize(),
        p[2].as_usize(),
        p[3].as_usize(),
    )
}

/// Stride, padding, output padding, dilation and groups of a transposed convolution row.
fn conv_transpose_params(p: &[Param]) -> (usize, usize, usize, usize, usize) {
    (
        p[0].as_usize(),
        p[1].as_usize(),
        p[2].as_usize(),
        p[3].as_usize(),
        p[4].as_usize(),
    )
}

const CONV_PARAMS: &[super::ParamSpec] = &[
    count("the stride", "STRIDE"),
    count("the padding", "PADDING"),
    count("the dilation", "DILATION"),
    count("the groups", "GROUPS"),
];

const CONV_TRANSPOSE_PARAMS: &[super::ParamSpec] = &[
    count("the stride", "STRIDE"),
    count("the padding", "PADDING"),
    count("the output padding", "OUTPUT_PADDING"),
    count("the dilation", "DILATION"),
    count("the groups", "GROUPS"),
];

/// `conv2d x w STRIDE PADDING DILATION GROUPS`: PyTorch's `F.conv2d` without a bias (the same
/// stride, padding and dilation along both axes); `x` `[N, C, H, W]` or `[C, H, W]`, `w`
/// `[O, C/GROUPS, kh, kw]`.
pub(super) const CONV2D: OpRow = OpRow::new(
    "conv2d",
    |s, p| conv_shape(s, p, 2),
    |_, x, p| {
        let (s, pad, d, g) = conv_params(p);
        conv_run(x[0], 2, |x0| x0.conv2d(x[1], (s, s), (pad, pad), (d, d), g))
    },
)
.arity(Arity::Exactly(2))
.params(CONV_PARAMS)
.work(|s, out, _| conv_work(s, out, false))
.gen(Gen::Operands(|d| conv_draw(d, false, 2)));

/// `conv_transpose2d x w STRIDE PADDING OUTPUT_PADDING DILATION GROUPS`: PyTorch's
/// `F.conv_transpose2d` without a bias; `x` `[N, C, H, W]` or `[C, H, W]`, `w`
/// `[C, O/GROUPS, kh, kw]`.
pub(super) const CONV_TRANSPOSE2D: OpRow = OpRow::new(
    "conv_transpose2d",
    |s, p| conv_transpose_shape(s, p, 2),
    |_, x, p| {
        let (s, pad, op, d, g) = conv_transpose_params(p);
        conv_run(x[0], 2, |x0| {
            x0.conv_transpose2d(x[1], None, (s, s), (pad, pad), (op, op), (d, d), g)
        })
    },
)
.arity(Arity::Exactly(2))
.params(CONV_TRANSPOSE_PARAMS)
.work(|s, out, _| conv_work(s, out, true))
.gen(Gen::Operands(|d| conv_draw(d, true, 2)));

/// `conv1d x w STRIDE PADDING DILATION GROUPS`: PyTorch's `F.conv1d` without a bias; `x`
/// `[N, C, L]` or `[C, L]`, `w` `[O, C/GROUPS, k]`.
pub(super) const CONV1D: OpRow = OpRow::new(
    "conv1d",
    |s, p| conv_shape(s, p, 1),
    |_, x, p| {
        let (s, pad, d, g) = conv_params(p);
        conv_run(x[0], 1, |x0| {
            arenagrad_nn::spatial::conv1d(x0, x[1], None, s, pad, d, g).map_err(super::from_nn)
        })
    },
)
.arity(Arity::Exactly(2))
.params(CONV_PARAMS)
.work(|s, out, _| conv_work(s, out, false))
.gen(Gen::Operands(|d| conv_draw(d, false, 1)));

/// `conv_transpose1d x w STRIDE PADDING OUTPUT_PADDING DILATION GROUPS`: PyTorch's
/// `F.conv_transpose1d` without a bias; `x` `[N, C, L]` or `[C, L]`, `w` `[C, O/GROUPS, k]`.
pub(super) const CONV_TRANSPOSE1D: OpRow = OpRow::new(
    "conv_transpose1d",
    |s, p| conv_transpose_shape(s, p, 1),
    |_, x, p| {
        let (s, pad, op, d, g) = conv_transpose_params(p);
        conv_run(x[0], 1, |x0| {
            arenagrad_nn::spatial::conv_transpose1d(x0, x[1], None, s, pad, op, d, g)
                .map_err(super::from_nn)
        })
    },
)
.arity(Arity::Exactly(2))
.params(CONV_TRANSPOSE_PARAMS)
.work(|s, out, _| conv_work(s, out, true))
.gen(Gen::Operands(|d| conv_draw(d, true, 1)));

/// Multiply-adds of a convolution row: each output element of a convolution, or each input
/// element of a transposed one, meets one output (input) channel's share of the weight.
fn conv_work(s: &[&[usize]], out: &[usize], transposed: bool) -> u64 {
    let numel = |v: &[usize]| v.iter().map(|&d| d as u64).fold(1, u64::saturating_mul);
    let share = numel(s[1]) / (s[1].first().copied().unwrap_or(1).max(1) as u64);
    numel(if transposed { s[0] } else { out }).saturating_mul(share)
}

/// Random programs' convolutions: the operand drawn as an unbatched `[C, …]` (or a batch
/// `[N, C, …]`) input of `spatial` axes, a fresh weight of 1 or 2 output channels and a kernel
/// of 1 to 3, with stride, padding, dilation and groups from the attribute bytes, where they
/// fit.
fn conv_draw(d: &mut Draw<'_>, transposed: bool, spatial: usize) -> Option<Drawn> {
    let x = d.shape(d.a).to_vec();
    let ch = match x.len() {
        r if r == spatial + 1 => x[0],
        r if r == spatial + 2 => x[1],
        _ => return None,
    };
    let t = d.attrs;
    let k = 1 + usize::from(t[0]) % 3;
    let s = 1 + usize::from(t[1]) % 2;
    let dil = 1 + usize::from(t[1] >> 4) % 2;
    let pad = usize::from(t[2]) % 2;
    let g = if ch > 1 && t[3] & 1 == 1 && ch.is_multiple_of(2) {
        2
    } else {
        1
    };
    let o = 1 + usize::from(t[3] >> 4) % 2;
    let kernel = vec![k; spatial];
    let (w, params) = if transposed {
        let op = usize::from(t[2] >> 4) % s.max(dil);
        ([vec![ch, o], kernel].concat(), vec![s, pad, op, dil, g])
    } else {
        ([vec![o * g, ch / g], kernel].concat(), vec![s, pad, dil, g])
    };
    // The row's own shape rule says whether these fit, and what comes out.
    let ps: Vec<Param> = params.iter().map(|&v| Param::Count(v)).collect();
    let out = if transposed {
        conv_transpose_shape(&[&x, &w], &ps, spatial)
    } else {
        conv_shape(&[&x, &w], &ps, spatial)
    };
    match out {
        Ok(out) if d.fits(&out) && d.fits(&w) => {}
        _ => return None,
    }
    let wi = d.fresh_input(w);
    Some((
        vec![d.a, wi],
        params.into_iter().map(|v| v as f64).collect(),
    ))
}

/// `where c a b`: a where c ≠ 0, b elsewhere, the three broadcast together (no gradient to c).
pub(super) const WHERE: OpRow = OpRow::new(
    "where",
    |s, _| {
        broadcast_shapes(s[0], s[1])
            .and_then(|o| broadcast_shapes(&o, s[2]))
            .ok_or_else(|| {
                format!(
                    "{:?}, {:?} and {:?} do not broadcast together",
                    s[0], s[1], s[2]
                )
                .into()
            })
    },
    |g, x, _| g.where_cond(x[0], x[1], x[2]),
)
.integers(&[(0, super::CONDITION)])
.arity(Arity::Exactly(3))
.kinked()
.gen(Gen::Operands(|d| {
    let sc = d.shape(d.a).to_vec();
    let a = d.pick(
        |s| broadcast_shapes(&sc, s).is_some_and(|o| d.fits(&o)),
        d.b,
    )?;
    let sa = broadcast_shapes(&sc, d.shape(a))?;
    let b = d.pick(
        |s| broadcast_shapes(&sa, s).is_some_and(|o| d.fits(&o)),
        d.attrs[0],
    )?;
    Some((vec![d.a, a, b], Vec::new()))
}));

/// The subscripts of `einsum`'s one parameter (a statement of the row has one, `accepts`).
fn subscripts_of(p: &[Param]) -> &str {
    p.first().and_then(Param::subscripts).unwrap_or("")
}

/// `einsum a b SUBSCRIPTS`: PyTorch's `torch.einsum(SUBSCRIPTS, a, b)` for the forms that reduce
/// to sums and one (batched) matrix product.
pub(super) const EINSUM: OpRow = OpRow::new(
    "einsum",
    |s, p| {
        let spec = subscripts_of(p);
        einsum_shape(spec, s).map_err(|e| {
            Refusal::at(
                2,
                match e {
                    GraphError::BadArgument { what, .. } => format!("`{spec}`: {what}"),
                    _ => format!(
                        "`{spec}` does not fit operands of shapes {:?} and {:?} (ranks, or the \
                         extents of a shared letter, differ)",
                        s[0], s[1]
                    ),
                },
            )
        })
    },
    |g, x, p| g.einsum(subscripts_of(p), x),
)
.arity(Arity::Exactly(2))
.params(&[subscripts("the subscripts", "SUBSCRIPTS")])
.positive(Positive::IfInput)
.work(|s, _, p| {
    // One multiply-add for every combination of the letters' extents.
    let spec = subscripts_of(p);
    let lhs = spec.split("->").next().unwrap_or("");
    let mut seen: Vec<u8> = Vec::new();
    let mut work: u64 = 1;
    for (letters, shape) in lhs.split(',').zip(s) {
        for (c, &d) in letters.bytes().zip(shape.iter()) {
            if !seen.contains(&c) {
                seen.push(c);
                work = work.saturating_mul(u64::try_from(d).unwrap_or(u64::MAX));
            }
        }
    }
    work
})
.gen(Gen::Operands(|d| {
    let sa = d.shape(d.a).to_vec();
    let fits_a: Vec<usize> = (0..DRAWN_SUBSCRIPTS.len())
        .filter(|&k| {
            let first = DRAWN_SUBSCRIPTS[k].split(',').next().unwrap_or("");
            split_ellipsis(first, &sa).is_some()
        })
        .collect();
    if fits_a.is_empty() {
        return None;
    }
    let k = fits_a[usize::from(d.attrs[0]) % fits_a.len()];
    let spec = DRAWN_SUBSCRIPTS[k];
    let lhs = spec.split("->").next()?;
    let (la, lb) = lhs.split_once(',')?;
    let (letters_a, dims_a) = split_ellipsis(la, &sa)?;
    // The second operand: a letter of the first takes its extent (or, now and then, 1, which
    // broadcasts), a new one an extent drawn; its ellipsis the first's axes, some of them 1.
    let (bits, ones) = (d.attrs[2], d.attrs[3]);
    let mut shape = Vec::new();
    for (j, part) in lb.split("...").enumerate() {
        if j == 1 {
            shape.extend(dims_a.iter().enumerate().map(|(t, &e)| {
                if (ones >> (t % 7)) & 3 == 3 {
                    1
                } else {
                    e
                }
            }));
        }
        for c in part.bytes() {
            let n = shape.len();
            shape.push(match letters_a.iter().find(|(l, _)| *l == c) {
                Some(_) if (bits >> (n % 7)) & 3 == 3 => 1,
                Some(&(_, e)) => e,
                None => 1 + usize::from(d.attrs[1 + n % 3]) % d.max_dim.max(1),
            });
        }
    }
    let out = einsum_shape(spec, &[&sa, &shape]).ok()?;
    if !d.fits(&out) || !d.fits(&shape) {
        return None;
    }
    let b = match d.pick(|s| s == shape.as_slice(), d.b) {
        Some(b) if d.b % 2 == 1 => b,
        _ => d.fresh_input(shape),
    };
    Some((vec![d.a, b], vec![k as f64]))
}));

/// One operand's subscripts `sub` against its shape: each letter's extent, and the axes its
/// ellipsis stands for, or `None` where the rank does not fit the letters.
#[allow(clippy::type_complexity)]
fn split_ellipsis(sub: &str, shape: &[usize]) -> Option<(Vec<(u8, usize)>, Vec<usize>)> {
    let parts: Vec<&str> = sub.split("...").collect();
    let letters = parts.iter().map(|p| p.len()).sum::<usize>();
    let span = match parts.len() {
        1 if shape.len() == letters => 0,
        2 if shape.len() >= letters => shape.len() - letters,
        _ => return None,
    };
    let (before, rest) = shape.split_at(parts[0].len());
    let (ell, after) = rest.split_at(span);
    let mut ext: Vec<(u8, usize)> = parts[0].bytes().zip(before.iter().copied()).collect();
    if let Some(p) = parts.get(1) {
        ext.extend(p.bytes().zip(after.iter().copied()));
    }
    Some((ext, ell.to_vec()))
}
