//! Scaled dot-product attention, fused, in the FlashAttention scheme on the host.
//!
//! For each of `bh` independent heads, `softmax(q·kᵀ·scale + mask)·v` is computed a tile of
//! queries against a tile of keys at a time with a running (online) softmax, so the `lq × lk`
//! score matrix never exists whole: the forward keeps the output and each query row's log-sum-
//! exp, and backward recomputes each tile's probabilities from them. Memory beyond the inputs and
//! outputs is a few tiles per thread, linear in the sequence length instead of quadratic.
//!
//! Tiles are 32 queries by 32 keys: at a 128-token causal context that skips 6 of 16 tile pairs
//! (64-wide tiles skip 1 of 4), measured 12% faster on the character GPT's attention. Up to 256
//! keys are one block (a plain softmax, no online rescaling); without a causal mask, up to 128
//! queries then go at a time, so that a head's keys meet one product per 128 queries rather
//! than one per 32.
//!
//! Dropout on the attention weights draws its keep/drop decisions from a counter-based hash of
//! `(seed, head, row, column)`, so backward regenerates exactly the forward's mask in any tile
//! order without storing it.

use super::cast::Storage;
use super::matmul::{dot_lanes, gemm, Gemm, MatView, Mnk, SMALL_M};
use crate::Float;

/// Queries and keys per tile.
pub const TILE: usize = 32;

/// The problem: `bh` heads of `lq` queries and `lk` keys, key width `d`, value width `dv`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnDims {
    /// Independent heads (batch × heads).
    pub bh: usize,
    /// Queries per head.
    pub lq: usize,
    /// Keys (and values) per head.
    pub lk: usize,
    /// Query and key width.
    pub d: usize,
    /// Value width.
    pub dv: usize,
    /// The factor on `q·kᵀ` (usually `1/√d`).
    pub scale: f64,
    /// Query `i` sees keys `j ≤ i` only (PyTorch's `is_causal`, aligned top-left).
    pub causal: bool,
    /// The probability of dropping an attention weight (0 for none).
    pub dropout: f64,
    /// The dropout hash's seed.
    pub seed: u64,
}

/// An additive mask on the scores, broadcast over heads: head `h`'s entry `(i, j)` is
/// `data[offsets[h] + i·rs + j·cs]` (strides 0 where the mask is broadcast).
#[derive(Debug, Clone, Copy)]
pub struct AttnMask<'a, T> {
    /// The mask's elements.
    pub data: &'a [T],
    /// Each head's first element.
    pub offsets: &'a [usize],
    /// The stride between query rows.
    pub rs: usize,
    /// The stride between key columns.
    pub cs: usize,
}

/// The inputs of attention: queries `q` `[bh, lq, d]`, keys `k` `[bh, lk, d]`, values `v`
/// `[bh, lk, dv]` (all heads, row-major), and the additive mask when there is one.
#[derive(Debug, Clone, Copy)]
pub struct AttnInputs<'a, T> {
    /// Queries.
    pub q: &'a [T],
    /// Keys.
    pub k: &'a [T],
    /// Values.
    pub v: &'a [T],
    /// The mask on the scores (indexed by the global head: `offsets[h]`).
    pub mask: Option<&'a AttnMask<'a, T>>,
    /// The head `q`, `k` and `v` (and backward's `o`, `lse` and `go`) start at: head `h`'s rows
    /// are their part `h − first` (0 when they hold every head).
    pub first: usize,
}

/// What backward reads of the forward, all heads: the output `o` `[bh, lq, dv]`, each query
/// row's log-sum-exp `lse` `[bh, lq]`, and the output's gradient `go` `[bh, lq, dv]`.
#[derive(Debug, Clone, Copy)]
pub struct AttnSaved<'a, T, L = T> {
    /// The forward's output.
    pub o: &'a [T],
    /// The forward's log-sum-exp per query row (f32 beside 16-bit tensors).
    pub lse: &'a [L],
    /// The output's gradient.
    pub go: &'a [T],
}

/// The gradients backward writes for a run of heads: `dq` `[heads, lq, d]`, `dk` `[heads, lk,
/// d]`, `dv` `[heads, lk, dv]`.
#[derive(Debug)]
pub struct AttnGrads<'a, T> {
    /// The queries' gradient.
    pub dq: &'a mut [T],
    /// The keys' gradient.
    pub dk: &'a mut [T],
    /// The values' gradient.
    pub dv: &'a mut [T],
}

/// Whether dropout keeps weight `(h, i, j)`: [`super::dropout::keeps`] of the weight's
/// row-major position among all heads' `lq × lk` weights.
#[inline(always)]
pub fn keeps(dims: &AttnDims, h: usize, i: usize, j: usize) -> bool {
    let c = ((h * dims.lq + i) * dims.lk + j) as u64;
    super::dropout::keeps(dims.seed, c, dims.dropout)
}

/// Scores of one tile into `s` (`bq × bk`, row-major): `q·kᵀ·scale + mask`, −∞ where causal
/// hides a key. `kt` is the tile's keys transposed (`d × bk`), made once by the caller for
/// every query tile that meets them: the product would otherwise transpose them for each.
#[inline(always)]
fn scores<T: Float + Gemm>(
    dims: &AttnDims,
    inputs: &AttnInputs<'_, T>,
    h: usize,
    (i0, bq): (usize, usize),
    (j0, bk): (usize, usize),
    kt: MatView<'_, T>,
    s: &mut [T],
) {
    let AttnInputs { q, mask, .. } = *inputs;
    let (d, lq) = (dims.d, dims.lq);
    let hx = h - inputs.first;
    gemm(
        Mnk::new(bq, d, bk),
        MatView::row_major(q, (hx * lq + i0) * d, d, false),
        kt,
        s,
        false,
        1,
    );
    let scale = T::from_f64(dims.scale);
    for r in 0..bq {
        let row = &mut s[r * bk..(r + 1) * bk];
        match mask {
            // A mask row laid out along the keys (a key-padding mask): one vector loop.
            Some(m) if m.cs == 1 => {
                let at = m.offsets[h] + (i0 + r) * m.rs + j0;
                for (v, &x) in row.iter_mut().zip(&m.data[at..at + bk]) {
                    *v = *v * scale + x;
                }
            }
            Some(m) => {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = *v * scale + m.data[m.offsets[h] + (i0 + r) * m.rs + (j0 + c) * m.cs];
                }
            }
            None => row.iter_mut().for_each(|v| *v *= scale),
        }
        if dims.causal {
            // Keys past query i0 + r are hidden.
            let first_hidden = (i0 + r + 1).saturating_sub(j0).min(bk);
            row[first_hidden..].fill(T::neg_infinity());
        }
    }
}

/// Rows `j0..j0 + bk` of head `hx`'s `[l, w]` block of `x` transposed into `out` (`w × bk`,
/// row-major), returned as the product's view of them.
#[inline(always)]
fn transposed_rows<'o, T: Float + Gemm>(
    x: &[T],
    (hx, l, w): (usize, usize, usize),
    (j0, bk): (usize, usize),
    out: &'o mut Vec<T>,
) -> MatView<'o, T> {
    out.resize(w * bk, T::ZERO);
    T::transpose(&x[(hx * l + j0) * w..], bk, w, w, &mut out[..w * bk]);
    MatView::row_major(&out[..w * bk], 0, bk, false)
}

/// The largest head (`d · lk` elements) whose keys the forward transposes whole, once: 4 MiB of
/// f32 per thread.
const TRANSPOSED_HEAD_MAX: usize = 1 << 20;

/// Rows `j0..` of head `hx`'s `[l, w]` block of `x` as a product reads them transposed, for a
/// tile of `bq` queries: `pre`, those rows transposed once by the caller, for a tile of more than
/// [`SMALL_M`] queries; otherwise the rows where they lie, read transposed, as before the
/// transposes left the loop (a product of so few rows takes its dot-product path on them, and
/// keeps the sums it had).
#[inline(always)]
fn tile_rows<'a, T>(
    pre: Option<MatView<'a, T>>,
    x: &'a [T],
    (hx, l, w): (usize, usize, usize),
    j0: usize,
    bq: usize,
) -> MatView<'a, T> {
    match pre {
        Some(v) if bq > SMALL_M => v,
        _ => MatView::row_major(x, (hx * l + j0) * w, w, true),
    }
}

/// Tiles `(start, len)` of `0..n`.
fn tiles(n: usize) -> impl Iterator<Item = (usize, usize)> {
    blocks(n, TILE)
}

/// Blocks `(start, len)` of `0..n`, `width` wide (the last one shorter).
fn blocks(n: usize, width: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(width).map(move |s| (s, width.min(n - s)))
}

/// The largest of `start` and `row`, NaN if any is NaN (PyTorch's max propagates NaN): in
/// eight interleaved lanes, a vectorisable order (the same result as a scan, max being exact).
#[inline(always)]
fn row_max<T: Float>(start: T, row: &[T]) -> T {
    let mut lanes = [start; 8];
    let mut nan = start.to_f64().is_nan();
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            // `x != x` only for NaN: noted apart, so the lanes stay plain maxima.
            #[allow(clippy::eq_op)]
            let x_nan = x != x;
            nan |= x_nan;
            *l = if x > *l { x } else { *l };
        }
    }
    let mut m = start;
    for &x in lanes.iter().chain(chunks.remainder()) {
        #[allow(clippy::eq_op)]
        let x_nan = x != x;
        nan |= x_nan;
        if x > m {
            m = x;
        }
    }
    if nan {
        T::from_f64(f64::NAN)
    } else {
        m
    }
}

/// The sum of `row` in f64, in eight interleaved lanes then pairwise (a vectorisable order,
/// the same at every vector width).
#[inline(always)]
fn sum_f64<T: Float>(row: &[T]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x.to_f64();
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|x| x.to_f64()).sum();
    ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
        + tail
}

/// Up to this many keys, the forward takes them in one block per query tile: one product for
/// the scores and one for the output, a plain softmax, none of the online rescaling.
const KEYS_IN_ONE_BLOCK: usize = 256;

/// The most queries the forward takes at a time against one block of keys (no causal mask):
/// their scores, `QUERIES_IN_ONE_BLOCK × KEYS_IN_ONE_BLOCK` values (128 KB in f32), stay in the
/// level-2 cache.
const QUERIES_IN_ONE_BLOCK: usize = 128;

/// The forward for heads `h0..h0 + o.len()/(lq·dv)`: `o` (`[heads, lq, dv]`) and `lse`
/// (`[heads, lq]`) are those heads' parts of the outputs.
pub fn attention_forward<T: Float + Gemm>(
    dims: &AttnDims,
    inputs: &AttnInputs<'_, T>,
    h0: usize,
    o: &mut [T],
    lse: &mut [T],
) {
    // Compiled for the widest vector unit: the tiles' elementwise loops (the same operations in
    // the same order at every level).
    super::wide::wide(
        o.len(),
        #[inline(always)]
        || forward_heads(dims, inputs, h0, o, lse),
    )
}

#[inline(always)]
fn forward_heads<T: Float + Gemm>(
    dims: &AttnDims,
    inputs: &AttnInputs<'_, T>,
    h0: usize,
    o: &mut [T],
    lse: &mut [T],
) {
    let v = inputs.v;
    let (lq, lk, dv) = (dims.lq, dims.lk, dims.dv);
    if lq == 0 {
        return;
    }
    if lk == 0 {
        // No keys: the weights are empty and the output is an empty sum, 0 (PyTorch's math).
        o.fill(T::ZERO);
        lse.fill(T::neg_infinity());
        return;
    }
    let heads = lse.len() / lq;
    let keep_scale = T::from_f64(1.0 / (1.0 - dims.dropout));
    let threshold = super::dropout::threshold(dims.dropout);
    // Keys in blocks of `kb`: all of them when few, else tiles with the online softmax.
    let kb = if lk <= KEYS_IN_ONE_BLOCK { lk } else { TILE };
    // Queries in tiles of `qt`: without a causal mask to skip tiles by, as many as share one
    // block of keys (up to QUERIES_IN_ONE_BLOCK), so that each head's keys go through one
    // product for its scores instead of one per tile of 32 queries.
    let qt = if kb == lk && !dims.causal {
        lq.clamp(TILE, QUERIES_IN_ONE_BLOCK)
    } else {
        TILE
    };
    let mut s = vec![T::ZERO; qt * kb];
    let mut tmp = vec![T::ZERO; kb];
    let mut kept = vec![T::ZERO; kb];
    let mut m = vec![T::ZERO; qt];
    let mut l = vec![0.0f64; qt];
    let mut kt = Vec::new();
    for hl in 0..heads {
        let h = h0 + hl;
        let hx = h - inputs.first;
        // The head's keys transposed once (`d × lk`), for every tile of queries (not for a few
        // queries, nor for a head too large to copy).
        let keys = (lq > SMALL_M && dims.d * lk <= TRANSPOSED_HEAD_MAX)
            .then(|| transposed_rows(inputs.k, (hx, lk, dims.d), (0, lk), &mut kt));
        for (i0, bq) in blocks(lq, qt) {
            let acc = &mut o[(hl * lq + i0) * dv..(hl * lq + i0 + bq) * dv];
            acc.fill(T::ZERO);
            m[..bq].fill(T::neg_infinity());
            l[..bq].fill(0.0);
            for (j0, bk) in blocks(lk, kb) {
                if dims.causal && j0 > i0 + bq - 1 {
                    break;
                }
                // Causal: no key past the tile's last query.
                let bk = if dims.causal {
                    bk.min(i0 + bq - j0)
                } else {
                    bk
                };
                let st = &mut s[..bq * bk];
                let pre = keys.map(|k| MatView { offset: j0, ..k });
                let kt = tile_rows(pre, inputs.k, (hx, lk, dims.d), j0, bq);
                scores(dims, inputs, h, (i0, bq), (j0, bk), kt, st);
                for r in 0..bq {
                    let row = &mut st[r * bk..(r + 1) * bk];
                    let mt = row_max(m[r], row);
                    if mt == T::neg_infinity() {
                        // Every key so far hidden: nothing to add.
                        row.fill(T::ZERO);
                        continue;
                    }
                    let alpha = (m[r] - mt).exp();
                    m[r] = mt;
                    for (t, &x) in tmp.iter_mut().zip(row.iter()) {
                        *t = x - mt;
                    }
                    T::exp_into(&tmp[..bk], row);
                    let sum = sum_f64(row);
                    if dims.dropout > 0.0 {
                        let kept = &mut kept[..bk];
                        let at = ((h * lq + i0 + r) * lk + j0) as u64;
                        super::dropout::keep_scales(dims.seed, at, threshold, keep_scale, kept);
                        for (x, &k) in row.iter_mut().zip(kept.iter()) {
                            *x = if k != T::ZERO { *x * k } else { T::ZERO };
                        }
                    }
                    l[r] = l[r] * alpha.to_f64() + sum;
                    if alpha != T::ONE {
                        for a in &mut acc[r * dv..(r + 1) * dv] {
                            *a *= alpha;
                        }
                    }
                }
                gemm(
                    Mnk::new(bq, bk, dv),
                    MatView::row_major(&*st, 0, bk, false),
                    MatView::row_major(v, (hx * lk + j0) * dv, dv, false),
                    acc,
                    true,
                    1,
                );
            }
            for r in 0..bq {
                if l[r] == 0.0 {
                    // Every key hidden: PyTorch's safe softmax gives weights of 0, so 0 out.
                    acc[r * dv..(r + 1) * dv].fill(T::ZERO);
                    lse[hl * lq + i0 + r] = T::neg_infinity();
                    continue;
                }
                let inv = T::from_f64(1.0 / l[r]);
                for a in &mut acc[r * dv..(r + 1) * dv] {
                    *a *= inv;
                }
                lse[hl * lq + i0 + r] = m[r] + T::from_f64(l[r].ln());
            }
        }
    }
}

/// The gradients for heads `h0..h0 + heads`: `grads` holds those heads' parts, overwritten.
pub fn attention_backward<T: Float + Gemm>(
    dims: &AttnDims,
    inputs: &AttnInputs<'_, T>,
    saved: &AttnSaved<'_, T>,
    (h0, heads): (usize, usize),
    grads: AttnGrads<'_, T>,
) {
    // As the forward: compiled for the widest vector unit.
    super::wide::wide(
        grads.dq.len(),
        #[inline(always)]
        || backward_heads(dims, inputs, saved, (h0, heads), grads),
    )
}

#[inline(always)]
fn backward_heads<T: Float + Gemm>(
    dims: &AttnDims,
    inputs: &AttnInputs<'_, T>,
    saved: &AttnSaved<'_, T>,
    (h0, heads): (usize, usize),
    grads: AttnGrads<'_, T>,
) {
    let AttnInputs { q, k, v, .. } = *inputs;
    let AttnSaved { o, lse, go } = *saved;
    let AttnGrads { dq, dk, dv: dv_out } = grads;
    let (lq, lk, d, dv) = (dims.lq, dims.lk, dims.d, dims.dv);
    dq.fill(T::ZERO);
    dk.fill(T::ZERO);
    dv_out.fill(T::ZERO);
    if lq == 0 || lk == 0 {
        return;
    }
    let keep_scale = T::from_f64(1.0 / (1.0 - dims.dropout));
    let threshold = super::dropout::threshold(dims.dropout);
    let scale = T::from_f64(dims.scale);
    let mut kept = [T::ZERO; TILE * TILE];
    let mut p = [T::ZERO; TILE * TILE];
    let mut pd = [T::ZERO; TILE * TILE];
    let mut dp = [T::ZERO; TILE * TILE];
    let mut delta = vec![T::ZERO; lq];
    let (mut kt, mut vt) = (Vec::new(), Vec::new());
    for hl in 0..heads {
        let h = h0 + hl;
        let hx = h - inputs.first;
        // D_i = Σ dO_i·O_i, each row's sum in order; eight rows at a time, whose sums are
        // independent chains of additions (one row's chain waits on each addition).
        for (i0, ds) in (0..lq).step_by(8).zip(delta.chunks_mut(8)) {
            let mut acc = [0.0f64; 8];
            let rows = &go[(hx * lq + i0) * dv..(hx * lq + i0 + ds.len()) * dv];
            let outs = &o[(hx * lq + i0) * dv..(hx * lq + i0 + ds.len()) * dv];
            for c in 0..dv {
                for (r, a) in acc[..ds.len()].iter_mut().enumerate() {
                    *a += (rows[r * dv + c] * outs[r * dv + c]).to_f64();
                }
            }
            for (di, a) in ds.iter_mut().zip(acc) {
                *di = T::from_f64(a);
            }
        }
        let dq_h = &mut dq[hl * lq * d..(hl + 1) * lq * d];
        let dk_h = &mut dk[hl * lk * d..(hl + 1) * lk * d];
        let dv_h = &mut dv_out[hl * lk * dv..(hl + 1) * lk * dv];
        for (j0, bk) in tiles(lk) {
            // The tile's keys and values transposed once, for every tile of queries.
            let many = lq > SMALL_M;
            let keys = many.then(|| transposed_rows(k, (hx, lk, d), (j0, bk), &mut kt));
            let values = many.then(|| transposed_rows(v, (hx, lk, dv), (j0, bk), &mut vt));
            for (i0, bq) in tiles(lq) {
                if dims.causal && j0 > i0 + bq - 1 {
                    continue;
                }
                let pt = &mut p[..bq * bk];
                let keys_t = tile_rows(keys, k, (hx, lk, d), j0, bq);
                scores(dims, inputs, h, (i0, bq), (j0, bk), keys_t, pt);
                let pdt = &mut pd[..bq * bk];
                for r in 0..bq {
                    let l = lse[hx * lq + i0 + r];
                    for (t, x) in pdt[r * bk..(r + 1) * bk].iter_mut().zip(&pt[r * bk..]) {
                        *t = *x - l;
                    }
                }
                T::exp_into(pdt, pt);
                for r in 0..bq {
                    if lse[hx * lq + i0 + r] == T::neg_infinity() {
                        // A row with every key hidden has weights 0 (not −∞ − −∞).
                        pt[r * bk..(r + 1) * bk].fill(T::ZERO);
                    }
                }
                let kept = &mut kept[..bq * bk];
                if dims.dropout == 0.0 {
                    pdt.copy_from_slice(pt);
                } else {
                    // The forward's keep decisions for this tile, as multipliers, used twice.
                    for (r, row) in kept.chunks_exact_mut(bk).enumerate() {
                        let at = ((h * lq + i0 + r) * lk + j0) as u64;
                        super::dropout::keep_scales(dims.seed, at, threshold, keep_scale, row);
                    }
                    for ((x, &p), &k) in pdt.iter_mut().zip(pt.iter()).zip(kept.iter()) {
                        *x = if k != T::ZERO { p * k } else { T::ZERO };
                    }
                }
                // dV_j += P̃ᵀ·dO_i.
                gemm(
                    Mnk::new(bk, bq, dv),
                    MatView::row_major(&*pdt, 0, bk, true),
                    MatView::row_major(go, (hx * lq + i0) * dv, dv, false),
                    &mut dv_h[j0 * dv..],
                    true,
                    1,
                );
                // dP̃ = dO_i·V_jᵀ.
                let dpt = &mut dp[..bq * bk];
                gemm(
                    Mnk::new(bq, dv, bk),
                    MatView::row_major(go, (hx * lq + i0) * dv, dv, false),
                    tile_rows(values, v, (hx, lk, dv), j0, bq),
                    dpt,
                    false,
                    1,
                );
                // dS = P∘(dP − D)·scale, with dP the dropout mask applied to dP̃: row by row
                // over zipped slices, selects rather than branches (vector loops; indexing
                // the three tiles element by element kept it scalar).
                let rows = dpt.chunks_exact_mut(bk).zip(pt.chunks_exact(bk));
                for (r, (drow, prow)) in rows.enumerate() {
                    let di = delta[i0 + r];
                    if dims.dropout != 0.0 {
                        for (g, &k) in drow.iter_mut().zip(&kept[r * bk..(r + 1) * bk]) {
                            *g = if k != T::ZERO { *g * k } else { T::ZERO };
                        }
                    }
                    for (g, &pv) in drow.iter_mut().zip(prow) {
                        // A hidden key's weight is exactly 0, and so is its gradient.
                        *g = if pv == T::ZERO {
                            T::ZERO
                        } else {
                            pv * (*g - di) * scale
                        };
                    }
                }
                // dQ_i += dS·K_j; dK_j += dSᵀ·Q_i.
                gemm(
                    Mnk::new(bq, bk, d),
                    MatView::row_major(&*dpt, 0, bk, false),
                    MatView::row_major(k, (hx * lk + j0) * d, d, false),
                    &mut dq_h[i0 * d..],
                    true,
                    1,
                );
                gemm(
                    Mnk::new(bk, bq, d),
                    MatView::row_major(&*dpt, 0, bk, true),
                    MatView::row_major(q, (hx * lq + i0) * d, d, false),
                    &mut dk_h[j0 * d..],
                    true,
                    1,
                );
            }
        }
    }
}

/// Elements of f32 scratch a 16-bit run widens a group of heads into (about 256 KiB: the
/// group's operands stay in the cache between widening and use).
const HALF_GROUP_ELEMS: usize = 1 << 16;

/// Heads of `per_head` elements each per group of a 16-bit run (at least 1).
fn half_group(per_head: usize) -> usize {
    (HALF_GROUP_ELEMS / per_head.max(1)).max(1)
}

/// `x`'s heads `first..first + n` (each `per` elements) widened into `buf`, which is returned
/// (resized).
fn widen_heads<'b, H: Storage>(
    x: &[H],
    (first, n, per): (usize, usize, usize),
    buf: &'b mut Vec<f32>,
) -> &'b [f32] {
    buf.resize(n * per, 0.0);
    H::load_f32(&x[first * per..(first + n) * per], buf);
    buf
}

/// Where the 16-bit kernels read their operands' heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfLayout {
    /// Each operand its own `[heads, rows, width]` slice, head after head from
    /// [`AttnInputs::first`].
    Heads,
    /// `q`, `k` and `v` are one packed `[b, l, 3, heads, d]` buffer (a fused projection's
    /// output, `lq == lk == l`, `d == dv`) and backward's `o` and `go` are `[b, l, heads, d]`
    /// (the heads merged back): each head's rows read where they lie, with no copy of the
    /// heads gathered first. `first` is 0: head `g` is sequence `g / heads`, head `g % heads`.
    Packed {
        /// Heads per position.
        heads: usize,
    },
}

impl HalfLayout {
    /// `x`'s heads `first..first + n` of `rows` rows of `width` values each, widened into
    /// `buf` as `[n, rows, width]` (which is returned, resized): `part` of `parts` at each
    /// position of a packed layout (0 of 3 for the queries, 1 for the keys, 2 for the values,
    /// 0 of 1 for a merged output), or the heads' own slice.
    fn widen<'b, H: Storage>(
        self,
        x: &[H],
        (part, parts): (usize, usize),
        (first, n, rows, width): (usize, usize, usize, usize),
        buf: &'b mut Vec<f32>,
    ) -> &'b [f32] {
        let heads = match self {
            HalfLayout::Heads => return widen_heads(x, (first, n, rows * width), buf),
            HalfLayout::Packed { heads } => heads,
        };
        buf.resize(n * rows * width, 0.0);
        if buf.is_empty() {
            return buf;
        }
        // Compiled for the widest vector unit: bf16's widening inlines into the row loop.
        super::wide::wide(
            buf.len(),
            #[inline(always)]
            || {
                for (hl, dst) in buf.chunks_exact_mut(rows * width).enumerate() {
                    let (b, h) = ((first + hl) / heads, (first + hl) % heads);
                    for (r, row) in dst.chunks_exact_mut(width).enumerate() {
                        let at = (((b * rows + r) * parts + part) * heads + h) * width;
                        H::load_block(&x[at..at + width], row);
                    }
                }
            },
        );
        buf
    }
}

/// The packed layout's terms: every head from the first (`inputs.first` is 0), as many keys as
/// queries, values as wide as keys, and at least one head per position.
fn packed_checks<H>(dims: &AttnDims, inputs: &AttnInputs<'_, H>, layout: HalfLayout) {
    if let HalfLayout::Packed { heads } = layout {
        assert!(
            heads > 0 && inputs.first == 0 && dims.lq == dims.lk && dims.d == dims.dv,
            "invariant: a packed layout holds all of a self-attention's heads, d == dv"
        );
    }
}

/// A 16-bit mask widened whole (masks are broadcast: any head may read any element).
fn widen_mask<'a, H: Storage>(
    mask: Option<&AttnMask<'a, H>>,
) -> Option<(Vec<f32>, AttnMask<'a, H>)> {
    mask.map(|m| {
        let mut w = vec![0f32; m.data.len()];
        H::load_f32(m.data, &mut w);
        (w, *m)
    })
}

/// The widened mask as the f32 kernels read it.
fn widened_view<'w, H>(wm: &'w Option<(Vec<f32>, AttnMask<'w, H>)>) -> Option<AttnMask<'w, f32>> {
    wm.as_ref().map(|(w, m)| AttnMask {
        data: w.as_slice(),
        offsets: m.offsets,
        rs: m.rs,
        cs: m.cs,
    })
}

/// [`attention_forward`] for 16-bit storage: heads `h0..h0 + o.len()/(lq·dv)` in groups, each
/// group's queries, keys and values widened to f32, run by the f32 kernel, and its output
/// rounded once; `lse` stays f32. The values of the f32 kernel on the widened tensors, rounded.
/// The operands lie as `layout` says; `o` and `lse` are the heads' parts (`[heads, lq, dv]`
/// from `h0`) either way.
pub fn attention_forward_half<H: Storage>(
    dims: &AttnDims,
    inputs: &AttnInputs<'_, H>,
    layout: HalfLayout,
    h0: usize,
    o: &mut [H],
    lse: &mut [f32],
) {
    let (lq, lk, d, dv) = (dims.lq, dims.lk, dims.d, dims.dv);
    packed_checks(dims, inputs, layout);
    if lq == 0 {
        return;
    }
    let heads = lse.len() / lq;
    let wm = widen_mask(inputs.mask);
    let mask = widened_view(&wm);
    let group = half_group(lq * (d + dv) + lk * (d + dv));
    let (mut qw, mut kw, mut vw, mut ow) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for g0 in (0..heads).step_by(group) {
        let n = group.min(heads - g0);
        let first = h0 + g0;
        let at = first - inputs.first;
        let wide = AttnInputs {
            q: layout.widen(inputs.q, (0, 3), (at, n, lq, d), &mut qw),
            k: layout.widen(inputs.k, (1, 3), (at, n, lk, d), &mut kw),
            v: layout.widen(inputs.v, (2, 3), (at, n, lk, dv), &mut vw),
            mask: mask.as_ref(),
            first,
        };
        ow.resize(n * lq * dv, 0.0);
        attention_forward(
            dims,
            &wide,
            first,
            &mut ow,
            &mut lse[g0 * lq..(g0 + n) * lq],
        );
        H::store_f32(&ow, &mut o[g0 * lq * dv..(g0 + n) * lq * dv]);
    }
}

/// [`attention_backward`] for 16-bit storage: heads in groups, each group's operands and saved
/// tensors widened to f32 (the log-sum-exp is f32 already), run by the f32 kernel, and its
/// gradients rounded once. The operands and the saved output and its gradient lie as `layout`
/// says; `grads` are the heads' parts (`[heads, l, width]` from `h0`) either way.
pub fn attention_backward_half<H: Storage>(
    dims: &AttnDims,
    inputs: &AttnInputs<'_, H>,
    saved: &AttnSaved<'_, H, f32>,
    layout: HalfLayout,
    (h0, heads): (usize, usize),
    grads: AttnGrads<'_, H>,
) {
    let (lq, lk, d, dv) = (dims.lq, dims.lk, dims.d, dims.dv);
    packed_checks(dims, inputs, layout);
    if lq == 0 || lk == 0 {
        // No weights: every gradient is 0 (the run's parts, whatever its head count).
        let zero = H::narrow(0.0);
        grads.dq.fill(zero);
        grads.dk.fill(zero);
        grads.dv.fill(zero);
        return;
    }
    let wm = widen_mask(inputs.mask);
    let mask = widened_view(&wm);
    let group = half_group(2 * (lq * (d + dv) + lk * (d + dv)));
    let mut w: [Vec<f32>; 5] = Default::default();
    let (mut dq, mut dk, mut dvv) = (Vec::new(), Vec::new(), Vec::new());
    for g0 in (0..heads).step_by(group) {
        let n = group.min(heads - g0);
        let first = h0 + g0;
        let at = first - inputs.first;
        let [qw, kw, vw, ow, gw] = &mut w;
        let wide = AttnInputs {
            q: layout.widen(inputs.q, (0, 3), (at, n, lq, d), qw),
            k: layout.widen(inputs.k, (1, 3), (at, n, lk, d), kw),
            v: layout.widen(inputs.v, (2, 3), (at, n, lk, dv), vw),
            mask: mask.as_ref(),
            first,
        };
        let kept = AttnSaved {
            o: layout.widen(saved.o, (0, 1), (at, n, lq, dv), ow),
            lse: &saved.lse[at * lq..(at + n) * lq],
            go: layout.widen(saved.go, (0, 1), (at, n, lq, dv), gw),
        };
        dq.resize(n * lq * d, 0.0);
        dk.resize(n * lk * d, 0.0);
        dvv.resize(n * lk * dv, 0.0);
        let out = AttnGrads {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dvv,
        };
        attention_backward(dims, &wide, &kept, (first, n), out);
        H::store_f32(&dq, &mut grads.dq[g0 * lq * d..(g0 + n) * lq * d]);
        H::store_f32(&dk, &mut grads.dk[g0 * lk * d..(g0 + n) * lk * d]);
        H::store_f32(&dvv, &mut grads.dv[g0 * lk * dv..(g0 + n) * lk * dv]);
    }
}

/// The problem of [`attend_cache`]: a few new queries per head over the first `len` positions
/// of a key/value cache that holds `cap`.
#[derive(Debug, Clone, Copy)]
pub struct CacheDims {
    /// Sequences.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads, dividing `heads`: query head `h` reads key/value head
    /// `h / (heads / kv_heads)` (grouped-query attention; `heads` of them is plain attention).
    pub kv_heads: usize,
    /// Queries per head.
    pub new: usize,
    /// Positions attended: the cache's first `len`.
    pub len: usize,
    /// Positions the cache holds (its third extent).
    pub cap: usize,
    /// Query and key width.
    pub d: usize,
    /// Value width.
    pub dv: usize,
    /// The factor on `q·kᵀ`.
    pub scale: f64,
    /// Query `i` sees keys `j ≤ len − new + i` only (the queries are the cache's last `new`
    /// positions); otherwise all `len`.
    pub causal: bool,
}

impl CacheDims {
    /// Multiply-adds of the problem (for the choice of threads).
    fn work(&self) -> usize {
        self.batch * self.heads * self.new * self.len * (self.d + self.dv)
    }
}

/// Work from which [`attend_cache`] splits its heads across threads.
const CACHE_PAR_MIN: usize = 1 << 16;

/// Attention of `q` (`[batch, heads, new, d]`) over the first `len` positions of the cache `k`
/// (`[batch, kv_heads, cap, d]`) and `v` (`[batch, kv_heads, cap, dv]`), read where they lie:
/// `o` (`[batch, heads, new, dv]`) gets softmax(scale·q·kᵀ)·v per head, a row whose keys are all
/// hidden (−∞ scores) 0, a NaN score NaN. Positions past `len` are never read. The threads take
/// query heads, each reading the key/value head it attends to.
pub fn attend_cache<T: Float>(
    p: &CacheDims,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &mut [T],
    threads: usize,
) {
    let Some(group) = cache_checks(p, q.len(), (k.len(), v.len()), o.len()) else {
        return;
    };
    let CacheDims {
        new,
        len,
        cap,
        d,
        dv,
        ..
    } = *p;
    let o = &mut o[..p.batch * p.heads * new * dv];
    super::par::par_rows_mut(o, new * dv, cache_threads(p, threads), 0, |bh, out| {
        super::wide::wide(
            len * (d + dv),
            #[inline(always)]
            || {
                let kvh = kv_head(p, group, bh);
                let qs = &q[bh * new * d..][..new * d];
                let keys = Direct(&k[kvh * cap * d..][..len * d]);
                let values = Direct(&v[kvh * cap * dv..][..len * dv]);
                attend_head(p, qs, (keys, values), out);
            },
        )
    });
}

/// The key/value head (over the batch) that query head `bh` (over the batch) attends to.
fn kv_head(p: &CacheDims, group: usize, bh: usize) -> usize {
    let (b, h) = (bh / p.heads, bh % p.heads);
    b * p.kv_heads + h / group
}

/// The checks of [`attend_cache`] on the problem and its operands' lengths; the query heads per
/// key/value head, or `None` when there is nothing to compute.
fn cache_checks(p: &CacheDims, q: usize, (k, v): (usize, usize), o: usize) -> Option<usize> {
    let CacheDims {
        batch,
        heads,
        kv_heads,
        new,
        len,
        cap,
        d,
        dv,
        ..
    } = *p;
    assert!(kv_heads > 0 && heads % kv_heads == 0 && new <= len && len <= cap);
    assert!(q >= batch * heads * new * d && o >= batch * heads * new * dv);
    assert!(k >= batch * kv_heads * cap * d && v >= batch * kv_heads * cap * dv);
    (new > 0 && dv > 0).then_some(heads / kv_heads)
}

/// The threads [`attend_cache`] splits a problem over.
fn cache_threads(p: &CacheDims, threads: usize) -> usize {
    if p.work() >= CACHE_PAR_MIN {
        threads
    } else {
        1
    }
}

/// The rows of a key/value head as [`attend_head`] reads them: row `j` (of `w` elements) in
/// `T`, where it lies or converted into `buf`.
trait Rows<T> {
    fn row<'s>(&'s self, j: usize, w: usize, buf: &'s mut [T]) -> &'s [T];
}

/// Rows stored in the kernel's type, read where they lie.
struct Direct<'a, T>(&'a [T]);

impl<T: Copy> Rows<T> for Direct<'_, T> {
    #[inline(always)]
    fn row<'s>(&'s self, j: usize, w: usize, _buf: &'s mut [T]) -> &'s [T] {
        &self.0[j * w..][..w]
    }
}

/// 16-bit rows, each widened to f32 as it is read (in the kernel's vector loop for bf16): the
/// cache is read once, in its own bytes, with no f32 copy of it.
struct Widened<'a, H>(&'a [H]);

impl<H: Storage> Rows<f32> for Widened<'_, H> {
    #[inline(always)]
    fn row<'s>(&'s self, j: usize, w: usize, buf: &'s mut [f32]) -> &'s [f32] {
        let buf = &mut buf[..w];
        H::load_block(&self.0[j * w..][..w], buf);
        buf
    }
}

/// One query head's part of [`attend_cache`]: its queries `qs` (`[new, d]`) over the first `len`
/// keys and values of its key/value head (`[len, d]`, `[len, dv]`), into `out` (`[new, dv]`).
#[inline(always)]
fn attend_head<T: Float>(
    p: &CacheDims,
    qs: &[T],
    (keys, values): (impl Rows<T>, impl Rows<T>),
    out: &mut [T],
) {
    let CacheDims {
        new, len, d, dv, ..
    } = *p;
    let scale = T::from_f64(p.scale);
    let mut s = vec![T::ZERO; len];
    let mut tmp = vec![T::ZERO; len];
    let mut buf = vec![T::ZERO; d.max(dv)];
    for (i, oi) in out.chunks_exact_mut(dv).enumerate() {
        let qi = &qs[i * d..][..d];
        let limit = if p.causal { len - new + i + 1 } else { len };
        let row = &mut s[..limit];
        for (j, sj) in row.iter_mut().enumerate() {
            *sj = dot_lanes(qi, keys.row(j, d, &mut buf)) * scale;
        }
        oi.fill(T::ZERO);
        let m = row_max(T::neg_infinity(), row);
        if m == T::neg_infinity() {
            // Every key hidden: PyTorch's safe softmax gives weights of 0, so 0 out.
            continue;
        }
        for (t, &x) in tmp.iter_mut().zip(row.iter()) {
            *t = x - m;
        }
        T::exp_into(&tmp[..limit], row);
        let inv = T::from_f64(1.0 / sum_f64(row));
        for (j, &w) in row.iter().enumerate() {
            for (a, &x) in oi.iter_mut().zip(values.row(j, dv, &mut buf)) {
                *a += w * x;
            }
        }
        for a in oi.iter_mut() {
            *a *= inv;
        }
    }
}

/// Up to this many new queries, [`attend_cache_half`] widens each cached row as it reads it
/// (a token's step reads each row once per query); past it, it widens its key/value head's
/// rows once into f32 copies first (a prompt's step would widen every row once per query).
const WIDEN_AS_READ_MAX: usize = 4;

/// [`attend_cache`] for 16-bit storage: each thread widens its query head's queries to f32 and
/// its key/value head's cached rows — each as it reads it for a few new queries (up to four),
/// once into f32 copies for more — runs the f32 kernel's arithmetic on them and rounds its
/// outputs once: the values of the f32 kernel on the widened tensors, rounded. (Widening every
/// head's cache into f32 copies on the calling thread before the kernel took a tenth of a bf16
/// GPT-2 token there, the other thread waiting.)
pub fn attend_cache_half<H: Storage>(
    p: &CacheDims,
    q: &[H],
    k: &[H],
    v: &[H],
    o: &mut [H],
    threads: usize,
) {
    let Some(group) = cache_checks(p, q.len(), (k.len(), v.len()), o.len()) else {
        return;
    };
    let CacheDims {
        new,
        len,
        cap,
        d,
        dv,
        ..
    } = *p;
    let o = &mut o[..p.batch * p.heads * new * dv];
    let widen = |x: &[H]| {
        let mut w = vec![0f32; x.len()];
        H::load_f32(x, &mut w);
        w
    };
    super::par::par_rows_mut(o, new * dv, cache_threads(p, threads), 0, |bh, out| {
        let kvh = kv_head(p, group, bh);
        let qs = widen(&q[bh * new * d..][..new * d]);
        let (keys, values) = (
            &k[kvh * cap * d..][..len * d],
            &v[kvh * cap * dv..][..len * dv],
        );
        let mut ow = vec![0f32; out.len()];
        if new <= WIDEN_AS_READ_MAX {
            super::wide::wide(
                len * (d + dv),
                #[inline(always)]
                || attend_head(p, &qs, (Widened(keys), Widened(values)), &mut ow),
            );
        } else {
            let (kw, vw) = (widen(keys), widen(values));
            super::wide::wide(
                len * (d + dv),
                #[inline(always)]
                || attend_head(p, &qs, (Direct(&kw), Direct(&vw)), &mut ow),
            );
        }
        H::store_f32(&ow, out);
    });
}
