//! Ops for images, sound and U-Nets, composed of the graph's (so that their gradients, twice
//! differentiable where those are, their CUDA paths and their dtypes come with them): padding,
//! resampling, adaptive average pooling, group and instance normalisation, 1-D convolution.
//! Each follows PyTorch's `torch.nn.functional` of the same name, index rules included.

use arenagrad_graph::{DType, Graph, HostTensor, Parameter, Tensor};

use crate::error::{config, input_shape, Result};
use crate::init::Init;
use crate::module::{Module, Visitor};
use crate::Rng;

/// How [`pad`] fills the border.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PadMode {
    /// A constant value (PyTorch's `"constant"`).
    Constant(f64),
    /// The input mirrored about its edge, the edge not repeated (`"reflect"`): each pad must be
    /// shorter than its axis.
    Reflect,
    /// The edge repeated (`"replicate"`).
    Replicate,
    /// The input wrapped around (`"circular"`): each pad at most its axis.
    Circular,
}

/// `x` padded on its last axes, `pads[0]` (before, after) for the last axis, `pads[1]` for the
/// one before it, … (PyTorch's `F.pad(x, (l, r, t, b, …), mode)`). The non-constant modes pick
/// entries by index, so their gradient adds the border's back into the entries it copied.
///
/// ```
/// use arenagrad_nn::spatial::{pad, PadMode};
/// use arenagrad_nn::{DType, Graph};
/// let g = Graph::new();
/// let x = g.from_f64(&[1.0, 2.0, 3.0], &[1, 3], DType::F32)?;
/// assert_eq!(pad(x, &[(2, 1)], PadMode::Reflect)?.to_vec::<f32>()?, [3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
/// assert_eq!(pad(x, &[(1, 2)], PadMode::Circular)?.to_vec::<f32>()?, [3.0, 1.0, 2.0, 3.0, 1.0, 2.0]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn pad<'g>(x: Tensor<'g>, pads: &[(usize, usize)], mode: PadMode) -> Result<Tensor<'g>> {
    let shape = x.try_shape()?;
    if pads.len() > shape.len() {
        return Err(input_shape(
            "pad",
            &format!(
                "a tensor of rank ≥ {} for {} pairs of pads",
                pads.len(),
                pads.len()
            ),
            &shape,
        ));
    }
    let mut y = x;
    for (k, &(before, after)) in pads.iter().enumerate() {
        let axis = shape.len() - 1 - k;
        let n = shape[axis];
        if before == 0 && after == 0 {
            continue;
        }
        let index = |i: isize| -> Option<usize> {
            let n = n as isize;
            let j = match mode {
                PadMode::Reflect => {
                    if i < 0 {
                        -i
                    } else if i >= n {
                        2 * (n - 1) - i
                    } else {
                        i
                    }
                }
                PadMode::Replicate => i.clamp(0, n - 1),
                PadMode::Circular => i.rem_euclid(n),
                PadMode::Constant(_) => i,
            };
            (0..n).contains(&j).then_some(j as usize)
        };
        y = match mode {
            PadMode::Constant(v) => {
                let g = y.graph();
                let ys = y.try_shape()?;
                let side = |w: usize| -> Result<Option<Tensor<'g>>> {
                    if w == 0 {
                        return Ok(None);
                    }
                    let mut s = ys.to_vec();
                    s[axis] = w;
                    Ok(Some(g.full(&s, v, y.dtype())?))
                };
                let parts: Vec<Tensor<'g>> = [side(before)?, Some(y), side(after)?]
                    .into_iter()
                    .flatten()
                    .collect();
                g.concat(&parts, axis as isize)?
            }
            _ => {
                let too_wide = match mode {
                    PadMode::Reflect => before >= n || after >= n,
                    PadMode::Circular => before > n || after > n,
                    _ => n == 0,
                };
                if too_wide {
                    return Err(config(
                        "pad",
                        format!(
                            "{mode:?} padding of ({before}, {after}) does not fit an axis of \
                             {n} (reflect: each pad below the size; circular: at most it; \
                             replicate: a non-empty axis)"
                        ),
                    ));
                }
                let idx: Vec<usize> = (-(before as isize)..(n + after) as isize)
                    .map(|i| index(i).expect("invariant: pads checked against the axis"))
                    .collect();
                y.index_select(axis as isize, &idx)?
            }
        };
    }
    Ok(y)
}

/// How [`interpolate`] and [`interpolate1d`] resample. Linear and bilinear take floating
/// inputs (an integer one is an `UnsupportedDType` naming `interpolate`); nearest any dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Interpolation {
    /// The nearest input entry below (PyTorch's `"nearest"`): source index `⌊dst·scale⌋`,
    /// `scale` = `in/out` or `1/scale_factor`, as PyTorch's forward computes it, which depends
    /// on the output's size: for images up to 128 for height plus width, in f32 whatever the
    /// dtype, an axis kept or doubled copied or halved exactly (`nearest_idx`); for larger
    /// images and for sound at every size, the product `dst·scale` in the input's precision,
    /// rounded to f32 before the floor (`floorf`), by the formula alone (a factor of 1.1 that
    /// keeps 5 rows reads rows 0, 0, 1, 2, 3). PyTorch's backward takes the first rule at
    /// every size, so for large images and for sound its gradient can give an entry's share to
    /// the neighbour its forward did not read; ours is the gradient of the forward.
    Nearest,
    /// Linear along the one axis of `[N, C, L]` sound (PyTorch's `"linear"`), with
    /// `align_corners` as [`Interpolation::Bilinear`]'s; for [`interpolate1d`] alone, as
    /// PyTorch takes `"linear"` for 3-D inputs only.
    Linear {
        /// The first and last entries of input and output aligned.
        align_corners: bool,
    },
    /// Linear in each axis of `[N, C, H, W]` images (`"bilinear"`), with PyTorch's
    /// `align_corners` (false: pixel centres, `src = (dst + 0.5)·scale − 0.5` clamped at 0,
    /// `scale` = `in/out` or `1/scale_factor`, an axis of unchanged size copied; true:
    /// corners, `src = dst·(in − 1)/(out − 1)`), in the input's precision (f32 for the 16-bit
    /// dtypes); the lower entry `⌊src⌋` taken of `src` rounded to f32 (PyTorch's `floorf`),
    /// the weight `src − ⌊src⌋` clamped to `[0, 1]`.
    Bilinear {
        /// The corners of input and output aligned.
        align_corners: bool,
    },
}

/// How [`sources`] computes: the mode, whether the arithmetic rounds to f32 (every dtype but
/// f64, as PyTorch's kernels compute), and whether PyTorch's nearest forward takes its generic
/// path (images whose height plus width is above 128, and sound).
#[derive(Clone, Copy)]
struct Rule {
    mode: Interpolation,
    f32_math: bool,
    large: bool,
}

impl Rule {
    /// Whether an axis of `n` resampled to `n` (by `factor`, if given) is a copy.
    fn copies(self, factor: Option<f64>) -> bool {
        !(self.large && factor.is_some() && self.mode == Interpolation::Nearest)
    }
}

/// For each output position along an axis of `n_in` resampled to `n_out`: the two source
/// indices and the second one's weight. `factor` is the scale factor a caller gave (PyTorch
/// then maps positions by `1/factor`, not by `in/out`).
fn sources(
    n_in: usize,
    n_out: usize,
    rule: Rule,
    factor: Option<f64>,
) -> Result<Vec<(usize, usize, f64)>> {
    let f32_round = |v: f64| f64::from(v as f32);
    let round = |v: f64| if rule.f32_math { f32_round(v) } else { v };
    // PyTorch's `compute_scales_value`: `1/factor` (in f64, then the kernel's precision) where
    // a factor was given, the sizes' ratio where not.
    let scale = |round: &dyn Fn(f64) -> f64| match factor {
        Some(f) => round(1.0 / f),
        None => round(n_in as f64 / n_out as f64),
    };
    let mut out = Vec::new();
    if out.try_reserve_exact(n_out).is_err() {
        return Err(arenagrad_graph::GraphError::TooLarge {
            op: "interpolate",
            shape: vec![n_out],
        }
        .into());
    }
    out.extend((0..n_out).map(|d| match rule.mode {
        Interpolation::Nearest => {
            let i = if rule.large {
                // The generic forward: the input's precision, the formula alone, and the
                // product rounded to f32 before `floorf` (an f64 `98·(2/196)` a hair under 1
                // reads entry 1).
                (f32_round(round(d as f64 * scale(&round))).floor() as usize).min(n_in - 1)
            } else if n_out == n_in {
                d
            } else if n_out == 2 * n_in {
                d >> 1
            } else {
                // `nearest_idx`: a float scale and `floorf(dst·scale)`, f64 inputs too.
                let scale = scale(&f32_round);
                (f32_round(d as f64 * scale).floor() as usize).min(n_in - 1)
            };
            (i, i, 0.0)
        }
        Interpolation::Bilinear { align_corners } | Interpolation::Linear { align_corners } => {
            let src = if align_corners {
                if n_out > 1 {
                    round(round((n_in - 1) as f64 / (n_out - 1) as f64) * d as f64)
                } else {
                    0.0
                }
            } else {
                round(round(scale(&round) * (d as f64 + 0.5)) - 0.5).max(0.0)
            };
            // PyTorch's `guard_index_and_lambda`: `floorf` (an f64 source a hair under an
            // integer takes that integer, its weight clamped to 0), the weight clamped.
            let i0 = (f32_round(src).floor() as usize).min(n_in - 1);
            let i1 = (i0 + 1).min(n_in - 1);
            (i0, i1, round((src - i0 as f64).clamp(0.0, 1.0)))
        }
    }));
    Ok(out)
}

/// Images `x` (`[N, C, H, W]`) resampled to `size` (height, width), as PyTorch's
/// `F.interpolate(x, size, mode)`: picked by index (nearest) or blended from the two nearest
/// entries along each axis, height first (bilinear), so that the gradient flows back to the
/// entries each output read.
///
/// ```
/// use arenagrad_nn::spatial::{interpolate, Interpolation};
/// use arenagrad_nn::{DType, Graph};
/// let g = Graph::new();
/// let x = g.from_f64(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], DType::F32)?;
/// let up = interpolate(x, (4, 4), Interpolation::Nearest)?;
/// assert_eq!(up.to_vec::<f32>()?[..4], [1.0, 1.0, 2.0, 2.0]);
/// let smooth = interpolate(x, (3, 3), Interpolation::Bilinear { align_corners: true })?;
/// assert_eq!(smooth.to_vec::<f32>()?[4], 2.5); // the centre
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn interpolate<'g>(
    x: Tensor<'g>,
    size: (usize, usize),
    mode: Interpolation,
) -> Result<Tensor<'g>> {
    let [h, w] = image_size("interpolate", x, mode)?;
    if size.0 == 0 || size.1 == 0 || h == 0 || w == 0 {
        return Err(config(
            "interpolate",
            format!("cannot resample {h}×{w} to {}×{}", size.0, size.1),
        ));
    }
    let large = size.0.saturating_add(size.1) > 128;
    resample(x, [(h, size.0, None), (w, size.1, None)], mode, large)
}

/// Images `x` (`[N, C, H, W]`) resampled by `scale_factor` (height, width), as PyTorch's
/// `F.interpolate(x, scale_factor=(sh, sw), mode)`: the output is `⌊H·sh⌋ × ⌊W·sw⌋`, and its
/// positions map back to the input's by the factors themselves (`src = dst/s`, not
/// `dst·H/⌊H·s⌋`), so a fractional factor reads the entries PyTorch's does. (PyTorch's
/// `recompute_scale_factor=True` maps by the sizes: that is [`interpolate`] to the computed
/// size.) A factor must be positive and finite and leave each axis at least one entry.
///
/// ```
/// use arenagrad_nn::spatial::{interpolate_scale, Interpolation};
/// use arenagrad_nn::{DType, Graph};
/// let g = Graph::new();
/// let x = g.from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1, 1, 1, 5], DType::F32)?;
/// let y = interpolate_scale(x, (1.0, 1.5), Interpolation::Bilinear { align_corners: false })?;
/// assert_eq!(y.shape()[3], 7); // ⌊5·1.5⌋
/// assert_eq!(y.to_vec::<f32>()?[1], 1.5); // src = (1 + 0.5)/1.5 − 0.5 = 0.5
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn interpolate_scale<'g>(
    x: Tensor<'g>,
    scale_factor: (f64, f64),
    mode: Interpolation,
) -> Result<Tensor<'g>> {
    let [h, w] = image_size("interpolate", x, mode)?;
    match (scaled(h, scale_factor.0), scaled(w, scale_factor.1)) {
        (Some(oh), Some(ow)) => resample(
            x,
            [(h, oh, Some(scale_factor.0)), (w, ow, Some(scale_factor.1))],
            mode,
            oh.saturating_add(ow) > 128,
        ),
        _ => Err(config(
            "interpolate",
            format!(
                "cannot resample {h}×{w} by the factors {scale_factor:?}: each must be positive \
                 and finite and leave each axis at least one entry"
            ),
        )),
    }
}

/// `⌊n·f⌋` for a positive finite factor `f` that leaves at least one entry and an addressable
/// count; `None` otherwise.
fn scaled(n: usize, f: f64) -> Option<usize> {
    let out = (f.is_finite() && f > 0.0).then(|| (n as f64 * f).floor())?;
    (out >= 1.0 && out <= isize::MAX as f64).then_some(out as usize)
}

/// The height and width of an `[N, C, H, W]` operand of `op`, resampled by `mode` (nearest or
/// bilinear: PyTorch takes `"linear"` for 3-D inputs only).
fn image_size(op: &'static str, x: Tensor<'_>, mode: Interpolation) -> Result<[usize; 2]> {
    let s = x.try_shape()?;
    match (&s[..], mode) {
        (_, Interpolation::Linear { .. }) => Err(config(
            op,
            format!(
                "linear resampling is for [N, C, L] sound (interpolate1d); an input of shape \
                 {s:?} takes Nearest or Bilinear"
            ),
        )),
        (&[_, _, h, w], _) => Ok([h, w]),
        _ => Err(input_shape(op, "[N, C, H, W]", &s)),
    }
}

/// The length of an `[N, C, L]` operand of `op`, resampled by `mode` (nearest or linear).
fn sound_length(op: &'static str, x: Tensor<'_>, mode: Interpolation) -> Result<usize> {
    let s = x.try_shape()?;
    match (&s[..], mode) {
        (_, Interpolation::Bilinear { .. }) => Err(config(
            op,
            format!(
                "bilinear resampling is for [N, C, H, W] images (interpolate); an input of \
                 shape {s:?} takes Nearest or Linear"
            ),
        )),
        (&[_, _, l], _) => Ok(l),
        _ => Err(input_shape(op, "[N, C, L]", &s)),
    }
}

/// Sound `x` (`[N, C, L]`) resampled to `len` entries, as PyTorch's
/// `F.interpolate(x, size=len, mode)` with `mode` `"nearest"` or `"linear"`
/// ([`Interpolation::Nearest`] or [`Interpolation::Linear`]): PyTorch's index rules for 3-D
/// inputs (nearest by its generic path at every size), the gradient flowing back to the
/// entries each output read.
///
/// ```
/// use arenagrad_nn::spatial::{interpolate1d, Interpolation};
/// use arenagrad_nn::{DType, Graph};
/// let g = Graph::new();
/// let x = g.from_f64(&[1.0, 2.0, 4.0], &[1, 1, 3], DType::F32)?;
/// let y = interpolate1d(x, 5, Interpolation::Linear { align_corners: true })?;
/// assert_eq!(y.to_vec::<f32>()?, [1.0, 1.5, 2.0, 3.0, 4.0]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn interpolate1d<'g>(x: Tensor<'g>, len: usize, mode: Interpolation) -> Result<Tensor<'g>> {
    let l = sound_length("interpolate", x, mode)?;
    if len == 0 || l == 0 {
        return Err(config(
            "interpolate",
            format!("cannot resample a length of {l} to {len}"),
        ));
    }
    resample_sound(x, l, len, None, mode)
}

/// Sound `x` (`[N, C, L]`) resampled by `scale_factor`, as PyTorch's
/// `F.interpolate(x, scale_factor=s, mode)` (`"nearest"` or `"linear"`): the output is
/// `⌊L·s⌋` long and its positions map back by the factor itself, as
/// [`interpolate_scale`]'s. The factor must be positive and finite and leave at least one
/// entry.
///
/// ```
/// use arenagrad_nn::spatial::{interpolate1d_scale, Interpolation};
/// use arenagrad_nn::{DType, Graph};
/// let g = Graph::new();
/// let x = g.from_f64(&[0.0, 1.0, 2.0, 3.0, 4.0], &[1, 1, 5], DType::F32)?;
/// // A factor of 1.1 keeps 5 entries; nearest maps them back by 1/1.1, as PyTorch does.
/// let y = interpolate1d_scale(x, 1.1, Interpolation::Nearest)?;
/// assert_eq!(y.to_vec::<f32>()?, [0.0, 0.0, 1.0, 2.0, 3.0]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn interpolate1d_scale<'g>(
    x: Tensor<'g>,
    scale_factor: f64,
    mode: Interpolation,
) -> Result<Tensor<'g>> {
    let l = sound_length("interpolate", x, mode)?;
    match scaled(l, scale_factor) {
        Some(len) => resample_sound(x, l, len, Some(scale_factor), mode),
        None => Err(config(
            "interpolate",
            format!(
                "cannot resample a length of {l} by the factor {scale_factor}: it must be \
                 positive and finite and leave at least one entry"
            ),
        )),
    }
}

/// `[N, C, L]` sound resampled along its length as an image one entry high: PyTorch's 1-D
/// kernels take the generic path at every size.
fn resample_sound<'g>(
    x: Tensor<'g>,
    l: usize,
    len: usize,
    factor: Option<f64>,
    mode: Interpolation,
) -> Result<Tensor<'g>> {
    let s = x.try_shape()?;
    let image = x.reshape(&[s[0] as isize, s[1] as isize, 1, l as isize])?;
    let y = resample(image, [(1, 1, None), (l, len, factor)], mode, true)?;
    Ok(y.reshape(&[s[0] as isize, s[1] as isize, len as isize])?)
}

/// `x` resampled along its height and width, each axis's `(in, out, the factor given)`, by
/// PyTorch's generic nearest path where `large`; sizes checked by the caller.
fn resample<'g>(
    x: Tensor<'g>,
    [(h, oh, fh), (w, ow, fw)]: [(usize, usize, Option<f64>); 2],
    mode: Interpolation,
    large: bool,
) -> Result<Tensor<'g>> {
    let s = x.try_shape()?;
    // The output must be addressable before any position is computed (a factor of 10¹⁸ asks
    // for far more than memory holds): the graph's own bound on a tensor's size.
    let numel = [s[0], s[1], oh, ow]
        .iter()
        .try_fold(1u128, |a, &d| a.checked_mul(d.max(1) as u128));
    if numel.is_none_or(|n| n.saturating_mul(8) > isize::MAX as u128) {
        return Err(arenagrad_graph::GraphError::TooLarge {
            op: "interpolate",
            shape: vec![s[0], s[1], oh, ow],
        }
        .into());
    }
    if mode != Interpolation::Nearest && !x.dtype().is_float() {
        // Weights between entries need a floating dtype: PyTorch refuses linear resampling of
        // integer sound, and its rounded u8 bilinear is not reproduced (cast to a float first).
        return Err(arenagrad_graph::GraphError::UnsupportedDType {
            op: "interpolate",
            dtype: x.dtype(),
        }
        .into());
    }
    let rule = Rule {
        mode,
        f32_math: x.dtype() != DType::F64,
        large,
    };
    let mut y = x;
    // One axis at a time, the one whose resampled intermediate is smaller first (rows first on
    // a tie): the intermediate is then no larger than the input or the output, whatever the
    // sizes (rows first, a 1 × 4096 image became 4096 × 4096 on its way to 4096 × 1). Products
    // of sizes bounded above fit in u128.
    let axes = if oh as u128 * w as u128 <= h as u128 * ow as u128 {
        [(2usize, h, oh, fh), (3, w, ow, fw)]
    } else {
        [(3, w, ow, fw), (2usize, h, oh, fh)]
    };
    for (axis, n_in, n_out, factor) in axes {
        if n_out == n_in && rule.copies(factor) {
            // A copy (PyTorch's rules above).
            continue;
        }
        let src = sources(n_in, n_out, rule, factor)?;
        let lo: Vec<usize> = src.iter().map(|s| s.0).collect();
        let a = y.index_select(axis as isize, &lo)?;
        y = match mode {
            Interpolation::Nearest => a,
            Interpolation::Bilinear { .. } | Interpolation::Linear { .. } => {
                let hi: Vec<usize> = src.iter().map(|s| s.1).collect();
                let b = y.index_select(axis as isize, &hi)?;
                let lam: Vec<f64> = src.iter().map(|s| s.2).collect();
                let keep: Vec<f64> = lam.iter().map(|l| 1.0 - l).collect();
                let mut shape = vec![1usize; 4];
                shape[axis] = n_out;
                let g = y.graph();
                let (l1, l0) = (
                    g.from_f64(&lam, &shape, y.dtype())?,
                    g.from_f64(&keep, &shape, y.dtype())?,
                );
                a.mul(l0)?.add(b.mul(l1)?)?
            }
        };
    }
    Ok(y)
}

/// `[out, n]`: row `i` averages the window `⌊i·n/out⌋ .. ⌈(i + 1)·n/out⌉` (PyTorch's adaptive
/// pooling windows).
fn pooling_matrix(n: usize, out: usize) -> Vec<f64> {
    let mut m = vec![0.0; out * n];
    for i in 0..out {
        let (a, b) = window(i, n, out);
        for j in a..b {
            m[i * n + j] = 1.0 / (b - a) as f64;
        }
    }
    m
}

/// The window `i` of `out` along an axis of `n` (PyTorch's adaptive pooling bounds).
fn window(i: usize, n: usize, out: usize) -> (usize, usize) {
    ((i * n) / out, ((i + 1) * n).div_ceil(out))
}

/// The maximum of each of `size` windows of `x` (`[N, C, H, W]`), placed as in
/// [`adaptive_avg_pool2d`] (PyTorch's `F.adaptive_max_pool2d`). Each window's gradient goes to
/// its first maximum in row-major order (the first NaN where there is one), as PyTorch's: the
/// windows' maxima are taken along the width first, then along the height, each keeping the
/// first (a row-major scan's choice).
pub fn adaptive_max_pool2d<'g>(x: Tensor<'g>, size: (usize, usize)) -> Result<Tensor<'g>> {
    let s = x.try_shape()?;
    let [_, _, h, w] = s[..] else {
        return Err(input_shape("adaptive_max_pool2d", "[N, C, H, W]", &s));
    };
    let (oh, ow) = size;
    if oh == 0 || ow == 0 || h == 0 || w == 0 {
        return Err(config(
            "adaptive_max_pool2d",
            format!("cannot pool {h}×{w} into {oh}×{ow}"),
        ));
    }
    let g = x.graph();
    let along = |t: Tensor<'g>, axis: usize, n: usize, out: usize| -> Result<Tensor<'g>> {
        let parts = (0..out)
            .map(|i| {
                let (a, b) = window(i, n, out);
                Ok(t.slice(axis as isize, a, b)?
                    .max_dim(axis as isize, true)?
                    .0)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(g.concat(&parts, axis as isize)?)
    };
    along(along(x, 3, w, ow)?, 2, h, oh)
}

/// The mean of each of `size` windows of `x` (`[N, C, H, W]`) that tile it as PyTorch's
/// `F.adaptive_avg_pool2d` places them (window `i` of an axis of `n`: `⌊i·n/out⌋` to
/// `⌈(i + 1)·n/out⌉`, overlapping where `n` does not divide): two matrix products with the
/// windows' averaging matrices. `(1, 1)` is global average pooling.
pub fn adaptive_avg_pool2d<'g>(x: Tensor<'g>, size: (usize, usize)) -> Result<Tensor<'g>> {
    let s = x.try_shape()?;
    let [n, c, h, w] = s[..] else {
        return Err(input_shape("adaptive_avg_pool2d", "[N, C, H, W]", &s));
    };
    let (oh, ow) = size;
    if oh == 0 || ow == 0 || h == 0 || w == 0 {
        return Err(config(
            "adaptive_avg_pool2d",
            format!("cannot pool {h}×{w} into {oh}×{ow}"),
        ));
    }
    let g = x.graph();
    // The averaging matrices hold `ow·w + oh·h` values: past the input's and the output's
    // elements together (a 1 × 65 536 row pooled into 65 536 windows: a 2^32 matrix), each
    // window's mean is taken by itself instead, as the maximum's are.
    let (numel_in, numel_out) = (n * c * h * w, n * c * oh * ow);
    let matrices = ow.saturating_mul(w).saturating_add(oh.saturating_mul(h));
    if matrices > numel_in.saturating_add(numel_out) {
        let along = |t: Tensor<'g>, axis: usize, n: usize, out: usize| -> Result<Tensor<'g>> {
            let parts = (0..out)
                .map(|i| {
                    let (a, b) = window(i, n, out);
                    Ok(t.slice(axis as isize, a, b)?
                        .mean_axes(&[axis as isize], true)?)
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(g.concat(&parts, axis as isize)?)
        };
        return along(along(x, 3, w, ow)?, 2, h, oh);
    }
    let dt = x.dtype();
    let pw = g.from_f64(&pooling_matrix(w, ow), &[ow, w], dt)?;
    let ph = g.from_f64(&pooling_matrix(h, oh), &[oh, h], dt)?;
    let (n, c, h) = (n as isize, c as isize, h as isize);
    let rows = x
        .reshape(&[n * c * h, w as isize])?
        .matmul_t(pw, false, true)?;
    let cols = rows
        .reshape(&[n * c, h, ow as isize])?
        .permute(&[0, 2, 1])?
        .reshape(&[n * c * ow as isize, h])?
        .matmul_t(ph, false, true)?;
    Ok(cols
        .reshape(&[n, c, ow as isize, oh as isize])?
        .permute(&[0, 1, 3, 2])?)
}

/// Group normalisation (PyTorch's `F.group_norm`): `x` `[N, C, …]` with its channels in
/// `groups` groups, each sample's group normalised over its channels and positions (biased
/// variance, `eps`), then `weight` and `bias` (`[C]`) per channel: [`Tensor::group_norm`], with
/// an error naming the input's shape when the groups do not divide its channels.
pub fn group_norm<'g>(
    x: Tensor<'g>,
    groups: usize,
    weight: Option<Tensor<'g>>,
    bias: Option<Tensor<'g>>,
    eps: f64,
) -> Result<Tensor<'g>> {
    let s = x.try_shape()?;
    if s.len() < 2 || groups == 0 || !s[1].is_multiple_of(groups) {
        return Err(input_shape(
            "group_norm",
            &format!("[N, C, …] with C a multiple of {groups} groups"),
            &s,
        ));
    }
    Ok(x.group_norm(groups, weight, bias, eps)?)
}

/// Instance normalisation (PyTorch's `F.instance_norm` without running statistics): each
/// sample's channel normalised over its positions — [`group_norm`] with a group per channel.
pub fn instance_norm<'g>(
    x: Tensor<'g>,
    weight: Option<Tensor<'g>>,
    bias: Option<Tensor<'g>>,
    eps: f64,
) -> Result<Tensor<'g>> {
    let c = x.try_shape()?.get(1).copied().unwrap_or(0);
    group_norm(x, c.max(1), weight, bias, eps)
}

/// A 1-D convolution (PyTorch's `F.conv1d`): `x` `[N, C, L]`, `weight` `[O, C/groups, K]`,
/// `bias` `[O]`; the 2-D convolution of a height-1 image.
#[allow(clippy::too_many_arguments)]
pub fn conv1d<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Option<Tensor<'g>>,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Result<Tensor<'g>> {
    as_height_one("conv1d", x, weight, |x4, w4| {
        crate::functional::conv2d(
            x4,
            w4,
            bias,
            (1, stride),
            (0, padding),
            (1, dilation),
            groups,
        )
    })
}

/// A 1-D op as its 2-D form on a height-1 image: `x` `[N, C, L]` and `weight` `[A, B, K]`
/// reshaped to `[N, C, 1, L]` and `[A, B, 1, K]`, `f` run on them, its `[N', C', 1, L']`
/// output reshaped back.
fn as_height_one<'g>(
    op: &'static str,
    x: Tensor<'g>,
    weight: Tensor<'g>,
    f: impl FnOnce(Tensor<'g>, Tensor<'g>) -> Result<Tensor<'g>>,
) -> Result<Tensor<'g>> {
    let (xs, ws) = (x.try_shape()?, weight.try_shape()?);
    let (&[n, c, _], &[a, b, k]) = (&xs[..], &ws[..]) else {
        return Err(input_shape(op, "x [N, C, L] and a weight [·, ·, K]", &xs));
    };
    let x4 = x.reshape(&[n as isize, c as isize, 1, -1])?;
    let w4 = weight.reshape(&[a as isize, b as isize, 1, k as isize])?;
    let y = f(x4, w4)?;
    let ys = y.try_shape()?;
    Ok(y.reshape(&[ys[0] as isize, ys[1] as isize, ys[3] as isize])?)
}

/// Group normalisation as a layer (PyTorch's `nn.GroupNorm(num_groups, num_channels)`):
/// `weight` 1 and `bias` 0 per channel, ε 1e-5; see [`group_norm`].
#[derive(Debug)]
pub struct GroupNorm {
    groups: usize,
    eps: f64,
    weight: Option<Parameter>,
    bias: Option<Parameter>,
}

impl GroupNorm {
    /// `channels` in `groups` groups, with the affine parameters, in f32.
    pub fn new(groups: usize, channels: usize) -> Result<Self> {
        Self::with_options(groups, channels, 1e-5, true, DType::F32)
    }

    /// With ε, with or without the affine parameters, in `dtype`.
    pub fn with_options(
        groups: usize,
        channels: usize,
        eps: f64,
        affine: bool,
        dtype: DType,
    ) -> Result<Self> {
        let eps_ok = eps > 0.0;
        if groups == 0 || channels == 0 || !channels.is_multiple_of(groups) || !eps_ok {
            return Err(config(
                "GroupNorm",
                format!("{channels} channels do not split into {groups} groups (or eps {eps} ≤ 0)"),
            ));
        }
        let p = |name: &str, v: f64| -> Result<Parameter> {
            Ok(Parameter::new(
                name,
                HostTensor::full(&[channels], v, dtype)?,
            ))
        };
        Ok(GroupNorm {
            groups,
            eps,
            weight: if affine {
                Some(p("weight", 1.0)?)
            } else {
                None
            },
            bias: if affine { Some(p("bias", 0.0)?) } else { None },
        })
    }
}

impl Module for GroupNorm {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let w = self.weight.as_ref().map(|p| g.param(p)).transpose()?;
        let b = self.bias.as_ref().map(|p| g.param(p)).transpose()?;
        group_norm(x, self.groups, w, b, self.eps)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        if let Some(p) = &self.weight {
            v.param("weight", p);
        }
        if let Some(p) = &self.bias {
            v.param("bias", p);
        }
    }
}

/// Instance normalisation of images as a layer (PyTorch's `nn.InstanceNorm2d(C)`: no affine
/// parameters and no running statistics by default); see [`instance_norm`].
#[derive(Debug)]
pub struct InstanceNorm2d(GroupNorm);

impl InstanceNorm2d {
    /// Over `channels`, without affine parameters (PyTorch's default), ε 1e-5.
    pub fn new(channels: usize) -> Result<Self> {
        Ok(InstanceNorm2d(GroupNorm::with_options(
            channels,
            channels,
            1e-5,
            false,
            DType::F32,
        )?))
    }

    /// With per-channel `weight` and `bias` (`affine=True`).
    pub fn affine(channels: usize) -> Result<Self> {
        Ok(InstanceNorm2d(GroupNorm::with_options(
            channels,
            channels,
            1e-5,
            true,
            DType::F32,
        )?))
    }
}

impl Module for InstanceNorm2d {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let s = x.try_shape()?;
        if s.len() != 4 {
            return Err(input_shape("InstanceNorm2d", "[N, C, H, W]", &s));
        }
        self.0.forward(g, x)
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        self.0.visit(v);
    }
}

/// A 1-D convolution layer (PyTorch's `nn.Conv1d`): `weight` `[out, in/groups, kernel]` and
/// `bias` `[out]`, drawn as PyTorch draws them; see [`conv1d`].
#[derive(Debug)]
pub struct Conv1d {
    weight: Parameter,
    bias: Option<Parameter>,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
}

impl Conv1d {
    /// `in_channels` → `out_channels` with a kernel of `kernel`, stride 1, no padding, a bias.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        rng: &mut Rng,
    ) -> Result<Self> {
        Self::with_options(in_channels, out_channels, kernel, (1, 0, 1, 1), true, rng)
    }

    /// With `(stride, padding, dilation, groups)` and with or without a bias, in f32.
    pub fn with_options(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        (stride, padding, dilation, groups): (usize, usize, usize, usize),
        bias: bool,
        rng: &mut Rng,
    ) -> Result<Self> {
        let ok = groups > 0
            && in_channels.is_multiple_of(groups)
            && out_channels.is_multiple_of(groups)
            && kernel > 0
            && stride > 0
            && dilation > 0;
        if !ok {
            return Err(config(
                "Conv1d",
                format!(
                    "{in_channels} → {out_channels} channels in {groups} groups, kernel \
                     {kernel}, stride {stride}, dilation {dilation}: channels must split into \
                     the groups and the sizes be positive"
                ),
            ));
        }
        let (weight, bias) = crate::init::weight_and_bias(
            &[out_channels, in_channels / groups, kernel],
            (Init::PYTORCH_DEFAULT, Init::PYTORCH_DEFAULT),
            bias,
            DType::F32,
            rng,
        )?;
        Ok(Conv1d {
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
        })
    }
}

impl Module for Conv1d {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let b = self.bias.as_ref().map(|p| g.param(p)).transpose()?;
        conv1d(
            x,
            g.param(&self.weight)?,
            b,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        )
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}

/// Adaptive average pooling to a fixed `(height, width)` (PyTorch's `nn.AdaptiveAvgPool2d`);
/// see [`adaptive_avg_pool2d`].
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveAvgPool2d(pub (usize, usize));

impl Module for AdaptiveAvgPool2d {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        adaptive_avg_pool2d(x, self.0)
    }
}

/// Adaptive max pooling as a layer (PyTorch's `nn.AdaptiveMaxPool2d(size)`); see
/// [`adaptive_max_pool2d`].
#[derive(Debug, Clone, Copy)]
pub struct AdaptiveMaxPool2d(pub (usize, usize));

impl Module for AdaptiveMaxPool2d {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        adaptive_max_pool2d(x, self.0)
    }
}

/// What an [`Upsample`] resamples to: PyTorch's `size` or its `scale_factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Resize {
    /// A fixed output `(height, width)` for images; see [`interpolate`].
    Size(usize, usize),
    /// A fixed output length for `[N, C, L]` sound; see [`interpolate1d`].
    Length(usize),
    /// Factors on height and width, the output `⌊H·sh⌋ × ⌊W·sw⌋`; see [`interpolate_scale`].
    /// Sound takes one factor (the two equal, as [`Upsample::scale`] makes them); see
    /// [`interpolate1d_scale`].
    Scale(f64, f64),
}

/// Resampling of images or sound as a layer (PyTorch's `nn.Upsample(size=…)` or
/// `nn.Upsample(scale_factor=…)`, with `mode` and `align_corners`): `[N, C, H, W]` images
/// by [`interpolate`], `[N, C, L]` sound by [`interpolate1d`].
///
/// ```
/// use arenagrad_nn::spatial::{Interpolation, Upsample};
/// use arenagrad_nn::{DType, Graph, Module};
/// let g = Graph::new();
/// let x = g.zeros(&[1, 3, 8, 8], DType::F32)?;
/// let up = Upsample::scale(2.0, Interpolation::Nearest);
/// assert_eq!(up.forward(&g, x)?.shape()[..], [1, 3, 16, 16]);
/// let down = Upsample::scale(0.75, Interpolation::Bilinear { align_corners: false });
/// assert_eq!(down.forward(&g, x)?.shape()[..], [1, 3, 6, 6]);
/// let fixed = Upsample::size((5, 7), Interpolation::Nearest);
/// assert_eq!(fixed.forward(&g, x)?.shape()[..], [1, 3, 5, 7]);
/// let sound = g.zeros(&[2, 1, 100], DType::F32)?;
/// let linear = Upsample::scale(1.5, Interpolation::Linear { align_corners: false });
/// assert_eq!(linear.forward(&g, sound)?.shape()[..], [2, 1, 150]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Upsample {
    /// The output size or the factors.
    pub to: Resize,
    /// Nearest, or bilinear for images, linear for sound.
    pub mode: Interpolation,
}

impl Upsample {
    /// By one factor on every axis, an image's two or sound's one (PyTorch's
    /// `nn.Upsample(scale_factor=factor, mode=…)`).
    pub fn scale(factor: f64, mode: Interpolation) -> Self {
        Upsample {
            to: Resize::Scale(factor, factor),
            mode,
        }
    }

    /// To a fixed `(height, width)` (PyTorch's `nn.Upsample(size=…, mode=…)`).
    pub fn size(size: (usize, usize), mode: Interpolation) -> Self {
        Upsample {
            to: Resize::Size(size.0, size.1),
            mode,
        }
    }

    /// To a fixed length for `[N, C, L]` sound (PyTorch's `nn.Upsample(size=len, mode=…)` on
    /// a 3-D input).
    pub fn length(len: usize, mode: Interpolation) -> Self {
        Upsample {
            to: Resize::Length(len),
            mode,
        }
    }
}

impl Module for Upsample {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let sound = x.try_shape()?.len() == 3;
        match (self.to, sound) {
            (Resize::Size(h, w), false) => interpolate(x, (h, w), self.mode),
            (Resize::Scale(sh, sw), false) => interpolate_scale(x, (sh, sw), self.mode),
            (Resize::Length(len), true) => interpolate1d(x, len, self.mode),
            // One factor, NaN included (refused there as a factor).
            (Resize::Scale(s, t), true) if s.to_bits() == t.to_bits() => {
                interpolate1d_scale(x, s, self.mode)
            }
            (to, _) => Err(config(
                "Upsample",
                format!(
                    "{to:?} does not fit an input of shape {:?}: images [N, C, H, W] take a \
                     size (height, width) or two factors, sound [N, C, L] a length or one factor",
                    x.try_shape()?
                ),
            )),
        }
    }
}

/// A 2-D transposed convolution (PyTorch's `F.conv_transpose2d`, the gradient of a
/// convolution with respect to its input): `x` `[N, C_in, H, W]`, `weight`
/// `[C_in, C_out/groups, kh, kw]` (PyTorch's layout), `bias` `[C_out]`; the output is
/// `(H − 1)·stride − 2·padding + dilation·(kh − 1) + output_padding + 1` high (likewise wide).
/// It runs [`Tensor::conv_transpose2d`](arenagrad_graph::Tensor::conv_transpose2d): the
/// weight's patches of every input pixel folded (col2im) into the output.
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose2d<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Option<Tensor<'g>>,
    stride: (usize, usize),
    padding: (usize, usize),
    output_padding: (usize, usize),
    dilation: (usize, usize),
    groups: usize,
) -> Result<Tensor<'g>> {
    let (xs, ws) = (x.try_shape()?, weight.try_shape()?);
    let (&[_, cin, h, w], &[wcin, _, _, _]) = (&xs[..], &ws[..]) else {
        return Err(input_shape(
            "conv_transpose2d",
            "x [N, C_in, H, W] and weight [C_in, C_out/groups, kh, kw]",
            &xs,
        ));
    };
    let sizes_ok = groups > 0
        && cin == wcin
        && cin.is_multiple_of(groups)
        && stride.0 > 0
        && stride.1 > 0
        && dilation.0 > 0
        && dilation.1 > 0
        && h > 0
        && w > 0;
    // PyTorch: output padding must be smaller than either the stride or the dilation.
    let out_pad_ok = (output_padding.0 < stride.0 || output_padding.0 < dilation.0)
        && (output_padding.1 < stride.1 || output_padding.1 < dilation.1);
    if !sizes_ok || !out_pad_ok {
        return Err(config(
            "conv_transpose2d",
            format!(
                "input {xs:?}, weight {ws:?}, stride {stride:?}, dilation {dilation:?}, output \
                 padding {output_padding:?}, groups {groups}: the channels must match and split \
                 into the groups, the sizes be positive, the output padding below the stride \
                 or the dilation"
            ),
        ));
    }
    // The graph's op: one product of the weight with the inputs and a fold (col2im) of its
    // patches into the output (for a kernel equal to the stride, a U-Net's upsampling, the
    // windows do not overlap and the fold only places them).
    Ok(x.conv_transpose2d(
        weight,
        bias,
        stride,
        padding,
        output_padding,
        dilation,
        groups,
    )?)
}

/// A 1-D transposed convolution (PyTorch's `F.conv_transpose1d`): `x` `[N, C_in, L]`,
/// `weight` `[C_in, C_out/groups, K]`; [`conv_transpose2d`] of a height-1 image.
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose1d<'g>(
    x: Tensor<'g>,
    weight: Tensor<'g>,
    bias: Option<Tensor<'g>>,
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
    groups: usize,
) -> Result<Tensor<'g>> {
    as_height_one("conv_transpose1d", x, weight, |x4, w4| {
        conv_transpose2d(
            x4,
            w4,
            bias,
            (1, stride),
            (0, padding),
            (0, output_padding),
            (1, dilation),
            groups,
        )
    })
}

/// A 2-D transposed convolution layer (PyTorch's `nn.ConvTranspose2d`): `weight`
/// `[in, out/groups, kh, kw]` and `bias` `[out]`, drawn as PyTorch draws them (its fans read
/// from that layout); see [`conv_transpose2d`].
#[derive(Debug)]
pub struct ConvTranspose2d {
    weight: Parameter,
    bias: Option<Parameter>,
    stride: (usize, usize),
    padding: (usize, usize),
    output_padding: (usize, usize),
    dilation: (usize, usize),
    groups: usize,
}

/// Options of a [`ConvTranspose2d`] (PyTorch's defaults by [`Default`]: stride 1, no padding,
/// dilation 1, one group, a bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvTransposeConfig {
    /// The stride.
    pub stride: (usize, usize),
    /// The padding taken off each side.
    pub padding: (usize, usize),
    /// Added to the output's bottom and right.
    pub output_padding: (usize, usize),
    /// The kernel's dilation.
    pub dilation: (usize, usize),
    /// Channel groups.
    pub groups: usize,
    /// Whether there is a bias.
    pub bias: bool,
}

impl Default for ConvTransposeConfig {
    fn default() -> Self {
        ConvTransposeConfig {
            stride: (1, 1),
            padding: (0, 0),
            output_padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
            bias: true,
        }
    }
}

impl ConvTranspose2d {
    /// `in_channels` → `out_channels` with a `kernel`, options `cfg`, in f32.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: (usize, usize),
        cfg: ConvTransposeConfig,
        rng: &mut Rng,
    ) -> Result<Self> {
        let (weight, bias) = transposed_weights(
            "ConvTranspose2d",
            (in_channels, out_channels),
            &[kernel.0, kernel.1],
            (cfg.groups, cfg.bias),
            rng,
        )?;
        Ok(ConvTranspose2d {
            weight,
            bias,
            stride: cfg.stride,
            padding: cfg.padding,
            output_padding: cfg.output_padding,
            dilation: cfg.dilation,
            groups: cfg.groups,
        })
    }
}

/// A transposed convolution's weight `[in, out/groups, kernel…]` and bias `[out]`, both drawn
/// as PyTorch draws them: from the weight's fans, read from that layout (its fan-in is
/// `out/groups · Πkernel`).
fn transposed_weights(
    op: &'static str,
    (in_channels, out_channels): (usize, usize),
    kernel: &[usize],
    (groups, bias): (usize, bool),
    rng: &mut Rng,
) -> Result<(Parameter, Option<Parameter>)> {
    let g = groups;
    if g == 0
        || !in_channels.is_multiple_of(g)
        || !out_channels.is_multiple_of(g)
        || kernel.contains(&0)
    {
        return Err(config(
            op,
            format!(
                "{in_channels} → {out_channels} channels in {g} groups with kernel {kernel:?}: \
                 the channels must split into the groups and the kernel be positive"
            ),
        ));
    }
    let mut shape = vec![in_channels, out_channels / g];
    shape.extend_from_slice(kernel);
    let (weight, _) = crate::init::weight_and_bias(
        &shape,
        (Init::PYTORCH_DEFAULT, Init::PYTORCH_DEFAULT),
        false,
        DType::F32,
        rng,
    )?;
    let bias = if bias {
        let b = Init::PYTORCH_DEFAULT.tensor_with_fans(
            &[out_channels],
            crate::init::fans(&shape),
            DType::F32,
            rng,
        )?;
        Some(Parameter::new("bias", b))
    } else {
        None
    };
    Ok((weight, bias))
}

impl Module for ConvTranspose2d {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let b = self.bias.as_ref().map(|p| g.param(p)).transpose()?;
        conv_transpose2d(
            x,
            g.param(&self.weight)?,
            b,
            self.stride,
            self.padding,
            self.output_padding,
            self.dilation,
            self.groups,
        )
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}

/// Options of a [`ConvTranspose1d`] (PyTorch's defaults by [`Default`]: stride 1, no padding,
/// dilation 1, one group, a bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvTranspose1dConfig {
    /// The stride.
    pub stride: usize,
    /// The padding taken off each end.
    pub padding: usize,
    /// Added to the output's end.
    pub output_padding: usize,
    /// The kernel's dilation.
    pub dilation: usize,
    /// Channel groups.
    pub groups: usize,
    /// Whether there is a bias.
    pub bias: bool,
}

impl Default for ConvTranspose1dConfig {
    fn default() -> Self {
        ConvTranspose1dConfig {
            stride: 1,
            padding: 0,
            output_padding: 0,
            dilation: 1,
            groups: 1,
            bias: true,
        }
    }
}

/// A 1-D transposed convolution layer (PyTorch's `nn.ConvTranspose1d`): `weight`
/// `[in, out/groups, kernel]` and `bias` `[out]`, drawn as PyTorch draws them; see
/// [`conv_transpose1d`]. It takes `[N, C_in, L]` to `[N, C_out, L']`,
/// `L' = (L − 1)·stride − 2·padding + dilation·(kernel − 1) + output_padding + 1`.
///
/// ```
/// use arenagrad_nn::spatial::{ConvTranspose1d, ConvTranspose1dConfig};
/// use arenagrad_nn::{DType, Graph, Module, Rng};
/// let cfg = ConvTranspose1dConfig { stride: 2, padding: 1, ..Default::default() };
/// let up = ConvTranspose1d::new(8, 4, 4, cfg, &mut Rng::seed(0))?;
/// let g = Graph::new();
/// let x = g.randn(&[2, 8, 100], DType::F32)?;
/// assert_eq!(up.forward(&g, x)?.shape()[..], [2, 4, 200]);
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct ConvTranspose1d {
    weight: Parameter,
    bias: Option<Parameter>,
    cfg: ConvTranspose1dConfig,
}

impl ConvTranspose1d {
    /// `in_channels` → `out_channels` with a `kernel`, options `cfg`, in f32.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        cfg: ConvTranspose1dConfig,
        rng: &mut Rng,
    ) -> Result<Self> {
        let (weight, bias) = transposed_weights(
            "ConvTranspose1d",
            (in_channels, out_channels),
            &[kernel],
            (cfg.groups, cfg.bias),
            rng,
        )?;
        Ok(ConvTranspose1d { weight, bias, cfg })
    }
}

impl Module for ConvTranspose1d {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
        let b = self.bias.as_ref().map(|p| g.param(p)).transpose()?;
        let c = self.cfg;
        conv_transpose1d(
            x,
            g.param(&self.weight)?,
            b,
            c.stride,
            c.padding,
            c.output_padding,
            c.dilation,
            c.groups,
        )
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        v.param("weight", &self.weight);
        if let Some(b) = &self.bias {
            v.param("bias", b);
        }
    }
}
