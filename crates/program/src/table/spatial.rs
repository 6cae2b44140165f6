//! Rows of `torch.nn.functional`'s ops for images and sequences, run by the `nn` crate's
//! functions of the same names: `pad` (and `pad_reflect`, `pad_replicate`, `pad_circular`),
//! `interpolate_nearest`, `interpolate_bilinear`, `adaptive_avg_pool2d`, `adaptive_max_pool2d`,
//! `group_norm`, `instance_norm`.

use arenagrad_exec::Positive;
use arenagrad_graph::{GraphError, Tensor};
use arenagrad_nn::spatial::{self, Interpolation, PadMode};

use super::{count, flag_at, float, from_nn, Draw, Drawn, Gen, OpRow, Param, ParamSpec, Refusal};

/// How a `pad` row fills the border (its mode less the constant, which is a parameter).
#[derive(Clone, Copy, PartialEq)]
enum Border {
    Constant,
    Reflect,
    Replicate,
    Circular,
}

/// The pads of a row's statement: parameters from `first` on, flat as PyTorch's `F.pad` takes
/// them (`before, after` of the last axis, then of the one before it, …).
fn pad_shape(
    s: &[usize],
    p: &[Param],
    first: usize,
    border: Border,
) -> Result<Vec<usize>, Refusal> {
    let pads = &p[first..];
    // Token of parameter k: the operand is token 0.
    let token = |k: usize| 1 + first + k;
    if !pads.len().is_multiple_of(2) {
        return Err(Refusal::op(format!(
            "{} pads: expected pairs (before, after)",
            pads.len()
        )));
    }
    let r = s.len();
    if pads.len() / 2 > r {
        return Err(Refusal::at(
            token(0),
            format!(
                "{} pairs of pads for shape {s:?} of rank {r}",
                pads.len() / 2
            ),
        ));
    }
    let mut out = s.to_vec();
    for (k, pair) in pads.chunks(2).enumerate() {
        let axis = r - 1 - k;
        let n = s[axis];
        let (before, after) = (pair[0].as_usize(), pair[1].as_usize());
        if before == 0 && after == 0 {
            continue;
        }
        let misfit = match border {
            Border::Constant => None,
            Border::Reflect => (before >= n || after >= n).then_some("each pad below the extent"),
            Border::Circular => (before > n || after > n).then_some("each pad at most the extent"),
            Border::Replicate => (n == 0).then_some("a non-empty axis"),
        };
        if let Some(want) = misfit {
            return Err(Refusal::at(
                token(2 * k),
                format!("pads ({before}, {after}) on axis {axis} of extent {n}: expected {want}"),
            ));
        }
        out[axis] = n
            .checked_add(before)
            .and_then(|v| v.checked_add(after))
            .filter(|&v| v <= isize::MAX as usize)
            .ok_or_else(|| Refusal::too_large(token(2 * k), "the padded extent overflows"))?;
    }
    Ok(out)
}

/// The pads as `nn::spatial::pad` takes them.
fn pairs(pads: &[Param]) -> Vec<(usize, usize)> {
    pads.chunks(2)
        .map(|c| (c[0].as_usize(), c[1].as_usize()))
        .collect()
}

fn run_pad<'g>(x: Tensor<'g>, pads: &[Param], mode: PadMode) -> Result<Tensor<'g>, GraphError> {
    spatial::pad(x, &pairs(pads), mode).map_err(from_nn)
}

const PAD: ParamSpec = count("a pad", "P");

/// Random pads for a shape: one or two pairs of 0 to 2 from the attribute bytes (none for a
/// 0-D shape), where `border` allows them.
fn gen_pads(s: &[usize], t: [u8; 4], border: Border) -> Option<Vec<f64>> {
    if s.is_empty() {
        return None;
    }
    let n_pairs = 1 + usize::from(t[0]) % s.len().min(2);
    let pads: Vec<f64> = (0..2 * n_pairs)
        .map(|i| f64::from((t[1 + i / 2] >> (4 * (i % 2))) % 3))
        .collect();
    let ps: Vec<Param> = pads.iter().map(|&v| Param::Count(v as usize)).collect();
    pad_shape(s, &ps, 0, border).ok()?;
    Some(pads)
}

/// `pad a VALUE P...`: PyTorch's `F.pad(a, (P...), value=VALUE)`, the border constant.
pub(super) const PAD_CONSTANT: OpRow = OpRow::new(
    "pad",
    |s, p| pad_shape(s[0], p, 1, Border::Constant),
    |_, x, p| run_pad(x[0], &p[1..], PadMode::Constant(p[0].as_f64())),
)
.params(&[float("the fill value", "VALUE")])
.rest(PAD)
.gen(Gen::Params(|s, t| {
    const VALUES: [f64; 4] = [0.0, 0.5, -1.5, 2.0];
    let pads = gen_pads(s, t, Border::Constant)?;
    Some([vec![VALUES[usize::from(t[0] >> 4) % 4]], pads].concat())
}));

/// `pad_reflect a P...`: `F.pad(a, (P...), mode="reflect")`, the input mirrored about its edge
/// (each pad below its axis's extent).
pub(super) const PAD_REFLECT: OpRow = OpRow::new(
    "pad_reflect",
    |s, p| pad_shape(s[0], p, 0, Border::Reflect),
    |_, x, p| run_pad(x[0], p, PadMode::Reflect),
)
.rest(PAD)
.positive(Positive::IfInput)
.gen(Gen::Params(|s, t| gen_pads(s, t, Border::Reflect)));

/// `pad_replicate a P...`: `F.pad(a, (P...), mode="replicate")`, the edge repeated.
pub(super) const PAD_REPLICATE: OpRow = OpRow::new(
    "pad_replicate",
    |s, p| pad_shape(s[0], p, 0, Border::Replicate),
    |_, x, p| run_pad(x[0], p, PadMode::Replicate),
)
.rest(PAD)
.positive(Positive::IfInput)
.gen(Gen::Params(|s, t| gen_pads(s, t, Border::Replicate)));

/// `pad_circular a P...`: `F.pad(a, (P...), mode="circular")`, the input wrapped around (each
/// pad at most its axis's extent).
pub(super) const PAD_CIRCULAR: OpRow = OpRow::new(
    "pad_circular",
    |s, p| pad_shape(s[0], p, 0, Border::Circular),
    |_, x, p| run_pad(x[0], p, PadMode::Circular),
)
.rest(PAD)
.positive(Positive::IfInput)
.gen(Gen::Params(|s, t| gen_pads(s, t, Border::Circular)));

/// What a resampling takes: `[N, C, H, W]` images (`axes` 2) or `[N, C, L]` sound (1).
fn layout(axes: usize) -> &'static str {
    if axes == 2 {
        "[N, C, H, W]"
    } else {
        "[N, C, L]"
    }
}

/// An operand with `axes` non-empty resampled axes after `[N, C]` ([`layout`]), or why a
/// resampling refuses it.
fn to_resample(s: &[usize], axes: usize) -> Result<(), Refusal> {
    if s.len() != 2 + axes {
        return Err(Refusal::at(
            0,
            format!("expected {}, found {s:?}", layout(axes)),
        ));
    }
    if s[2..].contains(&0) {
        return Err(Refusal::at(0, format!("cannot resample the empty {s:?}")));
    }
    Ok(())
}

/// An operand with `axes` resampled axes ([`layout`]) resampled to the sizes in the first
/// `axes` parameters, or why not.
fn resample_shape(s: &[usize], p: &[Param], axes: usize) -> Result<Vec<usize>, Refusal> {
    to_resample(s, axes)?;
    let size: Vec<usize> = p[..axes].iter().map(|q| q.as_usize()).collect();
    if let Some(k) = size.iter().position(|&o| o == 0) {
        return Err(Refusal::at(1 + k, format!("cannot resample to {size:?}")));
    }
    Ok([&s[..2], &size[..]].concat())
}

/// Random resampling: a value of [`layout`]`(axes)` with non-empty resampled axes (the operand
/// drawn, else one made so far, else a fresh `[1, 2, 3, 3]` or `[1, 2, 5]` input), to 1 to 5
/// entries an axis (1 to 9 for sound).
fn gen_resample(d: &mut Draw<'_>, align: bool, axes: usize) -> Option<Drawn> {
    let fits = |s: &[usize]| s.len() == 2 + axes && !s[2..].contains(&0);
    let x = if fits(d.shape(d.a)) {
        d.a
    } else if let Some(i) = d.pick(fits, d.b) {
        i
    } else if axes == 2 {
        d.fresh_input(vec![1, 2, 3, 3])
    } else {
        d.fresh_input(vec![1, 2, 5])
    };
    let t = d.attrs;
    let most = if axes == 2 { 5 } else { 9 };
    let size: Vec<usize> = t[..axes]
        .iter()
        .map(|&a| 1 + usize::from(a) % most)
        .collect();
    let out = [&d.shape(x)[..2], &size[..]].concat();
    if !d.fits(&out) {
        return None;
    }
    let mut params: Vec<f64> = size.iter().map(|&o| o as f64).collect();
    if align {
        params.push(f64::from(t[2] & 1));
    }
    Some((vec![x], params))
}

const SIZE: [ParamSpec; 2] = [count("the rows", "H"), count("the columns", "W")];

/// `interpolate_nearest a H W`: `F.interpolate(a, size=(H, W), mode="nearest")` of an
/// `[N, C, H, W]` operand.
pub(super) const INTERPOLATE_NEAREST: OpRow = OpRow::new(
    "interpolate_nearest",
    |s, p| resample_shape(s[0], p, 2),
    |_, x, p| {
        let size = (p[0].as_usize(), p[1].as_usize());
        spatial::interpolate(x[0], size, Interpolation::Nearest).map_err(from_nn)
    },
)
.params(&SIZE)
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_resample(d, false, 2)));

/// `interpolate_bilinear a H W ALIGN_CORNERS`: `F.interpolate(a, size=(H, W),
/// mode="bilinear", align_corners=ALIGN_CORNERS)` (0 or 1).
pub(super) const INTERPOLATE_BILINEAR: OpRow = OpRow::new(
    "interpolate_bilinear",
    |s, p| {
        flag_at(p[2], 3, "align_corners")?;
        resample_shape(s[0], p, 2)
    },
    |_, x, p| {
        let size = (p[0].as_usize(), p[1].as_usize());
        let mode = Interpolation::Bilinear {
            align_corners: p[2].as_usize() == 1,
        };
        spatial::interpolate(x[0], size, mode).map_err(from_nn)
    },
)
.params(&[SIZE[0], SIZE[1], count("align_corners", "ALIGN_CORNERS")])
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_resample(d, true, 2)));

/// An operand with `axes` resampled axes ([`layout`]) resampled by the factors in the first
/// `axes` parameters (PyTorch's `⌊n·s⌋` each), or why not.
fn rescale_shape(s: &[usize], p: &[Param], axes: usize) -> Result<Vec<usize>, Refusal> {
    to_resample(s, axes)?;
    let mut out = s[..2].to_vec();
    for (k, (&extent, f)) in s[2..].iter().zip(p.iter().map(|q| q.as_f64())).enumerate() {
        let o = (extent as f64 * f).floor();
        // Up to 2⁵³, where a float still counts exactly; the limits refuse far less.
        if !(f.is_finite() && f > 0.0 && (1.0..=9_007_199_254_740_992.0).contains(&o)) {
            return Err(Refusal::at(
                1 + k,
                format!(
                    "the factor {f} leaves {o} of an axis of {extent}: a factor must be \
                     positive and finite and leave at least one entry"
                ),
            ));
        }
        out.push(o as usize);
    }
    Ok(out)
}

/// Random resampling by factors: as [`gen_resample`], the factors drawn from a few PyTorch
/// users write (up and down, whole and fractional).
fn gen_rescale(d: &mut Draw<'_>, align: bool, axes: usize) -> Option<Drawn> {
    const FACTORS: [f64; 8] = [0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5];
    let (x, mut params) = gen_resample(d, align, axes)?;
    let s = d.shape(x[0]).to_vec();
    let t = d.attrs;
    let mut out = s[..2].to_vec();
    for k in 0..axes {
        let f = FACTORS[usize::from(t[k]) % FACTORS.len()];
        let o = (s[2 + k] as f64 * f).floor();
        if o < 1.0 {
            return None;
        }
        out.push(o as usize);
        params[k] = f;
    }
    d.fits(&out).then_some((x, params))
}

const FACTORS: [ParamSpec; 2] = [
    float("the rows' factor", "SH"),
    float("the columns' factor", "SW"),
];

/// `interpolate_nearest_scale a SH SW`: `F.interpolate(a, scale_factor=(SH, SW),
/// mode="nearest")` of an `[N, C, H, W]` operand (positions mapped by the factors).
pub(super) const INTERPOLATE_NEAREST_SCALE: OpRow = OpRow::new(
    "interpolate_nearest_scale",
    |s, p| rescale_shape(s[0], p, 2),
    |_, x, p| {
        let f = (p[0].as_f64(), p[1].as_f64());
        spatial::interpolate_scale(x[0], f, Interpolation::Nearest).map_err(from_nn)
    },
)
.params(&FACTORS)
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_rescale(d, false, 2)));

/// `interpolate_bilinear_scale a SH SW ALIGN_CORNERS`: `F.interpolate(a, scale_factor=(SH,
/// SW), mode="bilinear", align_corners=ALIGN_CORNERS)` (0 or 1).
pub(super) const INTERPOLATE_BILINEAR_SCALE: OpRow = OpRow::new(
    "interpolate_bilinear_scale",
    |s, p| {
        flag_at(p[2], 3, "align_corners")?;
        rescale_shape(s[0], p, 2)
    },
    |_, x, p| {
        let f = (p[0].as_f64(), p[1].as_f64());
        let mode = Interpolation::Bilinear {
            align_corners: p[2].as_usize() == 1,
        };
        spatial::interpolate_scale(x[0], f, mode).map_err(from_nn)
    },
)
.params(&[
    FACTORS[0],
    FACTORS[1],
    count("align_corners", "ALIGN_CORNERS"),
])
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_rescale(d, true, 2)));

const LENGTH: ParamSpec = count("the length", "L");
const FACTOR: ParamSpec = float("the factor", "S");

/// `interpolate_nearest1d a L`: `F.interpolate(a, size=L, mode="nearest")` of `[N, C, L]`
/// sound.
pub(super) const INTERPOLATE_NEAREST1D: OpRow = OpRow::new(
    "interpolate_nearest1d",
    |s, p| resample_shape(s[0], p, 1),
    |_, x, p| {
        spatial::interpolate1d(x[0], p[0].as_usize(), Interpolation::Nearest).map_err(from_nn)
    },
)
.params(&[LENGTH])
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_resample(d, false, 1)));

/// `interpolate_linear a L ALIGN_CORNERS`: `F.interpolate(a, size=L, mode="linear",
/// align_corners=ALIGN_CORNERS)` (0 or 1) of `[N, C, L]` sound.
pub(super) const INTERPOLATE_LINEAR: OpRow = OpRow::new(
    "interpolate_linear",
    |s, p| {
        flag_at(p[1], 2, "align_corners")?;
        resample_shape(s[0], p, 1)
    },
    |_, x, p| {
        let mode = Interpolation::Linear {
            align_corners: p[1].as_usize() == 1,
        };
        spatial::interpolate1d(x[0], p[0].as_usize(), mode).map_err(from_nn)
    },
)
.params(&[LENGTH, count("align_corners", "ALIGN_CORNERS")])
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_resample(d, true, 1)));

/// `interpolate_nearest1d_scale a S`: `F.interpolate(a, scale_factor=S, mode="nearest")` of
/// `[N, C, L]` sound (positions mapped by the factor).
pub(super) const INTERPOLATE_NEAREST1D_SCALE: OpRow = OpRow::new(
    "interpolate_nearest1d_scale",
    |s, p| rescale_shape(s[0], p, 1),
    |_, x, p| {
        spatial::interpolate1d_scale(x[0], p[0].as_f64(), Interpolation::Nearest).map_err(from_nn)
    },
)
.params(&[FACTOR])
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_rescale(d, false, 1)));

/// `interpolate_linear_scale a S ALIGN_CORNERS`: `F.interpolate(a, scale_factor=S,
/// mode="linear", align_corners=ALIGN_CORNERS)` (0 or 1) of `[N, C, L]` sound.
pub(super) const INTERPOLATE_LINEAR_SCALE: OpRow = OpRow::new(
    "interpolate_linear_scale",
    |s, p| {
        flag_at(p[1], 2, "align_corners")?;
        rescale_shape(s[0], p, 1)
    },
    |_, x, p| {
        let mode = Interpolation::Linear {
            align_corners: p[1].as_usize() == 1,
        };
        spatial::interpolate1d_scale(x[0], p[0].as_f64(), mode).map_err(from_nn)
    },
)
.params(&[FACTOR, count("align_corners", "ALIGN_CORNERS")])
.positive(Positive::IfInput)
.gen(Gen::Operands(|d| gen_rescale(d, true, 1)));

/// An adaptive pooling's output: `[N, C, H, W]` or unbatched `[C, H, W]` (as PyTorch takes
/// both) pooled into `H × W` windows.
fn adaptive_shape(s: &[usize], p: &[Param]) -> Result<Vec<usize>, Refusal> {
    if !(3..=4).contains(&s.len()) {
        return Err(Refusal::at(
            0,
            format!("expected [N, C, H, W] or [C, H, W], found {s:?}"),
        ));
    }
    let (oh, ow) = (p[0].as_usize(), p[1].as_usize());
    let r = s.len();
    if s[r - 2] == 0 || s[r - 1] == 0 {
        return Err(Refusal::at(0, format!("cannot pool the empty image {s:?}")));
    }
    if oh == 0 || ow == 0 {
        return Err(Refusal::at(
            if oh == 0 { 1 } else { 2 },
            format!("cannot pool into {oh}×{ow}"),
        ));
    }
    let mut out = s.to_vec();
    out[r - 2] = oh;
    out[r - 1] = ow;
    Ok(out)
}

/// `f` on `x` batched (an unbatched `[C, H, W]` as `[1, C, H, W]`), the result unbatched again.
fn on_image<'g>(
    x: Tensor<'g>,
    f: impl FnOnce(Tensor<'g>) -> arenagrad_nn::Result<Tensor<'g>>,
) -> Result<Tensor<'g>, GraphError> {
    if x.try_shape()?.len() != 3 {
        return f(x).map_err(from_nn);
    }
    f(x.unsqueeze(0)?).map_err(from_nn)?.squeeze(Some(0))
}

/// Random adaptive pooling of a rank-3 or rank-4 operand into 1 to 4 rows and columns.
fn gen_adaptive(s: &[usize], t: [u8; 4]) -> Option<Vec<f64>> {
    let sizes = vec![f64::from(1 + t[0] % 4), f64::from(1 + t[1] % 4)];
    let ps: Vec<Param> = sizes.iter().map(|&v| Param::Count(v as usize)).collect();
    adaptive_shape(s, &ps).ok()?;
    Some(sizes)
}

/// `adaptive_avg_pool2d a H W`: `F.adaptive_avg_pool2d(a, (H, W))`, `a` `[N, C, H, W]` or
/// `[C, H, W]`.
pub(super) const ADAPTIVE_AVG_POOL2D: OpRow = OpRow::new(
    "adaptive_avg_pool2d",
    |s, p| adaptive_shape(s[0], p),
    |_, x, p| {
        let size = (p[0].as_usize(), p[1].as_usize());
        on_image(x[0], |x| spatial::adaptive_avg_pool2d(x, size))
    },
)
.params(&SIZE)
.positive(Positive::IfInput)
.gen(Gen::Params(gen_adaptive));

/// `adaptive_max_pool2d a H W`: `F.adaptive_max_pool2d(a, (H, W))` (values only).
pub(super) const ADAPTIVE_MAX_POOL2D: OpRow = OpRow::new(
    "adaptive_max_pool2d",
    |s, p| adaptive_shape(s[0], p),
    |_, x, p| {
        let size = (p[0].as_usize(), p[1].as_usize());
        on_image(x[0], |x| spatial::adaptive_max_pool2d(x, size))
    },
)
.params(&SIZE)
.kinked()
.positive(Positive::IfInput)
.gen(Gen::Params(gen_adaptive));

/// `[N, C, …]`, of rank at least 2, or why not.
fn channels(s: &[usize]) -> Result<usize, Refusal> {
    if s.len() < 2 {
        return Err(Refusal::at(
            0,
            format!("expected [N, C, …] of rank at least 2, found {s:?}"),
        ));
    }
    Ok(s[1])
}

/// An epsilon (argument token `k`) as the normalisation takes it: a number, not negative.
fn check_eps(p: Param, k: usize) -> Result<(), Refusal> {
    let eps = p.as_f64();
    if eps.is_nan() || eps < 0.0 {
        return Err(Refusal::at(k, format!("eps {eps} must be ≥ 0")));
    }
    Ok(())
}

/// `group_norm a GROUPS EPS`: `F.group_norm(a, GROUPS, eps=EPS)` without weight and bias, `a`
/// `[N, C, …]` with `C` a multiple of GROUPS.
pub(super) const GROUP_NORM: OpRow = OpRow::new(
    "group_norm",
    |s, p| {
        let c = channels(s[0])?;
        let g = p[0].as_usize();
        if g == 0 || !c.is_multiple_of(g) {
            return Err(Refusal::at(
                1,
                format!(
                    "{g} groups: expected a divisor of the {c} channels of {:?}",
                    s[0]
                ),
            ));
        }
        check_eps(p[1], 2)?;
        Ok(s[0].to_vec())
    },
    |_, x, p| {
        spatial::group_norm(x[0], p[0].as_usize(), None, None, p[1].as_f64()).map_err(from_nn)
    },
)
.params(&[count("the groups", "GROUPS"), float("epsilon", "EPS")])
.gen(Gen::Params(|s, t| {
    let c = *s.get(1)?;
    // A divisor of the channels, over at least two elements (else the output is constant).
    let divisors: Vec<usize> = (1..=c).filter(|g| c.is_multiple_of(*g)).collect();
    let g = *divisors.get(usize::from(t[0]) % divisors.len().max(1))?;
    let per: usize = s[2..].iter().product::<usize>() * (c / g);
    (per >= 2).then(|| vec![g as f64, 1e-5])
}));

/// `instance_norm a EPS`: `F.instance_norm(a, eps=EPS)` without running statistics, weight or
/// bias: each sample's channel normalised over its positions.
pub(super) const INSTANCE_NORM: OpRow = OpRow::new(
    "instance_norm",
    |s, p| {
        channels(s[0])?;
        check_eps(p[0], 1)?;
        Ok(s[0].to_vec())
    },
    |_, x, p| spatial::instance_norm(x[0], None, None, p[0].as_f64()).map_err(from_nn),
)
.params(&[float("epsilon", "EPS")])
.gen(Gen::Params(|s, _| {
    let per: usize = s.get(2..)?.iter().product();
    (s.len() >= 2 && per >= 2).then(|| vec![1e-5])
}));
