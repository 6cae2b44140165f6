//! Recurrent cells, fused: the gate nonlinearities and the state update of an LSTM or GRU step
//! in one pass over each row, and the LSTM over a whole sequence with its backward through time.
//!
//! Gate order is PyTorch's: `[i, f, g, o]` for the LSTM, `[r, z, n]` for the GRU, each block
//! `h` wide. The sigmoid is `1/(1 + e^−x)` through the vectorised `exp`, so saturated gates
//! give exact 0 and 1 and NaN propagates.
//!
//! The sequence kernel keeps, for every position it processed, the row's gate activations,
//! `tanh(c)`, and the previous cell and hidden states (`7h` values: [`LSTM_SAVED`]); backward
//! walks the steps in reverse with one matrix–vector product per step for the hidden state's
//! gradient, and the recurrent weight's gradient is one GEMM over all positions at the end.
//! Sequences may end early: lengths sorted longest first, row `b` takes part in steps
//! `0..len[b]` and its state is carried unchanged past its end (PyTorch's packed sequences).

use super::matmul::{gemm, Gemm, MatView, SMALL_M};
use crate::Float;

/// Values kept per processed position and hidden unit by [`lstm_seq_forward`]:
/// `i, f, g, o, tanh(c), c_prev, h_prev`.
pub const LSTM_SAVED: usize = 7;

/// The LSTM gates of one row in place: pre-activations `[i f g o]` become `σ(i), σ(f),
/// tanh(g), σ(o)`. `tmp` is scratch of the row's length.
#[inline]
fn lstm_gates<T: Float>(z: &mut [T], tmp: &mut [T], h: usize) {
    for (t, &v) in tmp.iter_mut().zip(z.iter()) {
        *t = -v;
    }
    T::exp_into(&tmp[..2 * h], &mut z[..2 * h]);
    T::exp_into(&tmp[3 * h..], &mut z[3 * h..]);
    for v in &mut tmp[2 * h..3 * h] {
        *v = -*v;
    }
    T::tanh_into(&tmp[2 * h..3 * h], &mut z[2 * h..3 * h]);
    let (if_, go) = z.split_at_mut(2 * h);
    for v in if_.iter_mut().chain(go[h..].iter_mut()) {
        *v = T::ONE / (T::ONE + *v);
    }
}

/// The new cell state of one row from its activated gates `a = [i f g o]` and `c_prev`.
#[inline(always)]
fn lstm_c<T: Float>(a: &[T], cp: T, h: usize, j: usize) -> T {
    a[h + j] * cp + a[j] * a[2 * h + j]
}

/// One LSTM step's gradients for a row: from the activations `a`, `tanh(c)` and `c_prev`, and
/// the gradients `dh`, `dc` arriving at the step's `h` and `c`, writes the pre-activation
/// gradients into `dz` (4h) and returns nothing; `dc_prev` is `dcp` (h) when given.
#[inline]
#[allow(clippy::too_many_arguments)]
fn lstm_row_backward<T: Float>(
    a: &[T],
    tc: &[T],
    cp: &[T],
    dh: &[T],
    dc: &[T],
    dz: &mut [T],
    mut dcp: Option<&mut [T]>,
    h: usize,
) {
    for j in 0..h {
        let (i, f, g, o) = (a[j], a[h + j], a[2 * h + j], a[3 * h + j]);
        let t = tc[j];
        let dcj = dc[j] + dh[j] * o * (T::ONE - t * t);
        dz[j] = dcj * g * i * (T::ONE - i);
        dz[h + j] = dcj * cp[j] * f * (T::ONE - f);
        dz[2 * h + j] = dcj * i * (T::ONE - g * g);
        dz[3 * h + j] = dh[j] * t * o * (T::ONE - o);
        if let Some(d) = dcp.as_deref_mut() {
            d[j] = dcj * f;
        }
    }
}

/// An LSTM cell over `rows` rows: `z` `[rows, 4h]` pre-activations, `cp` `[rows, h]` the previous
/// cell state; writes `saved` `[rows, 5h]` = activations and `tanh(c)`.
pub fn lstm_cell_forward<T: Float>(z: &[T], cp: &[T], h: usize, saved: &mut [T]) {
    let rows = cp.len() / h.max(1);
    let mut tmp = vec![T::ZERO; 4 * h];
    let mut c = vec![T::ZERO; h];
    for r in 0..rows {
        let s = &mut saved[r * 5 * h..(r + 1) * 5 * h];
        let (a, tc) = s.split_at_mut(4 * h);
        a.copy_from_slice(&z[r * 4 * h..(r + 1) * 4 * h]);
        lstm_gates(a, &mut tmp, h);
        for (j, cj) in c.iter_mut().enumerate() {
            *cj = lstm_c(a, cp[r * h + j], h, j);
        }
        T::tanh_into(&c, tc);
    }
}

/// The cell's output `[2, rows, h]`: `h = o·tanh(c)` then `c`, from [`lstm_cell_forward`]'s
/// `saved`.
pub fn lstm_cell_output<T: Float>(saved: &[T], cp: &[T], h: usize, out: &mut [T]) {
    let rows = cp.len() / h.max(1);
    let (hs, cs) = out.split_at_mut(rows * h);
    for r in 0..rows {
        let s = &saved[r * 5 * h..(r + 1) * 5 * h];
        for j in 0..h {
            hs[r * h + j] = s[3 * h + j] * s[4 * h + j];
            cs[r * h + j] = lstm_c(s, cp[r * h + j], h, j);
        }
    }
}

/// The cell's gradient for its pre-activations `dz` `[rows, 4h]`, given `gy` `[2, rows, h]`.
pub fn lstm_cell_grad_gates<T: Float>(gy: &[T], saved: &[T], cp: &[T], h: usize, dz: &mut [T]) {
    let rows = cp.len() / h.max(1);
    let (dh, dc) = gy.split_at(rows * h);
    for r in 0..rows {
        let s = &saved[r * 5 * h..(r + 1) * 5 * h];
        let row = r * h..(r + 1) * h;
        lstm_row_backward(
            &s[..4 * h],
            &s[4 * h..],
            &cp[row.clone()],
            &dh[row.clone()],
            &dc[row],
            &mut dz[r * 4 * h..(r + 1) * 4 * h],
            None,
            h,
        );
    }
}

/// The cell's gradient for the previous cell state `[rows, h]`.
pub fn lstm_cell_grad_c<T: Float>(gy: &[T], saved: &[T], h: usize, dcp: &mut [T]) {
    let rows = dcp.len() / h.max(1);
    let (dh, dc) = gy.split_at(rows * h);
    for r in 0..rows {
        let s = &saved[r * 5 * h..(r + 1) * 5 * h];
        for j in 0..h {
            let (f, o, t) = (s[h + j], s[3 * h + j], s[4 * h + j]);
            let k = r * h + j;
            dcp[k] = (dc[k] + dh[k] * o * (T::ONE - t * t)) * f;
        }
    }
}

/// A GRU cell over `rows` rows: `gi = x·W_ihᵀ + b_ih` and `gh = h·W_hhᵀ + b_hh` (`[rows, 3h]`,
/// PyTorch's `[r z n]`); writes `saved` `[rows, 3h]` = `r, z, n`.
pub fn gru_cell_forward<T: Float>(gi: &[T], gh: &[T], h: usize, saved: &mut [T]) {
    let rows = gi.len() / (3 * h).max(1);
    let mut tmp = vec![T::ZERO; 3 * h];
    for r in 0..rows {
        let (gi, gh) = (
            &gi[r * 3 * h..(r + 1) * 3 * h],
            &gh[r * 3 * h..(r + 1) * 3 * h],
        );
        let s = &mut saved[r * 3 * h..(r + 1) * 3 * h];
        for j in 0..2 * h {
            tmp[j] = -(gi[j] + gh[j]);
        }
        T::exp_into(&tmp[..2 * h], &mut s[..2 * h]);
        for v in &mut s[..2 * h] {
            *v = T::ONE / (T::ONE + *v);
        }
        for j in 0..h {
            tmp[2 * h + j] = gi[2 * h + j] + s[j] * gh[2 * h + j];
        }
        T::tanh_into(&tmp[2 * h..], &mut s[2 * h..]);
    }
}

/// The GRU cell's output `h' = (1 − z)·n + z·h`.
pub fn gru_cell_output<T: Float>(saved: &[T], hp: &[T], h: usize, out: &mut [T]) {
    let rows = hp.len() / h.max(1);
    for r in 0..rows {
        let s = &saved[r * 3 * h..(r + 1) * 3 * h];
        for j in 0..h {
            let (z, n) = (s[h + j], s[2 * h + j]);
            out[r * h + j] = (T::ONE - z) * n + z * hp[r * h + j];
        }
    }
}

/// The GRU cell's gradient for `gi` (`[rows, 3h]`) given `gy` (`[rows, h]`); the gradient for
/// `gh` is the same but for its `n` block, multiplied by `r` ([`gru_cell_grad_gh`]).
pub fn gru_cell_grad_gi<T: Float>(
    gy: &[T],
    saved: &[T],
    gh: &[T],
    hp: &[T],
    h: usize,
    dgi: &mut [T],
) {
    let rows = hp.len() / h.max(1);
    for r in 0..rows {
        let s = &saved[r * 3 * h..(r + 1) * 3 * h];
        let ghr = &gh[r * 3 * h..(r + 1) * 3 * h];
        let d = &mut dgi[r * 3 * h..(r + 1) * 3 * h];
        for j in 0..h {
            let (rr, z, n) = (s[j], s[h + j], s[2 * h + j]);
            let g = gy[r * h + j];
            let dn = g * (T::ONE - z) * (T::ONE - n * n);
            let dz = g * (hp[r * h + j] - n) * z * (T::ONE - z);
            let dr = dn * ghr[2 * h + j] * rr * (T::ONE - rr);
            d[j] = dr;
            d[h + j] = dz;
            d[2 * h + j] = dn;
        }
    }
}

/// The GRU cell's gradient for `gh` from the one for `gi`.
pub fn gru_cell_grad_gh<T: Float>(dgi: &[T], saved: &[T], h: usize, dgh: &mut [T]) {
    dgh.copy_from_slice(dgi);
    let rows = dgi.len() / (3 * h).max(1);
    for r in 0..rows {
        for j in 0..h {
            dgh[r * 3 * h + 2 * h + j] *= saved[r * 3 * h + j];
        }
    }
}

/// The GRU cell's gradient for the previous hidden state: `gy·z`.
pub fn gru_cell_grad_h<T: Float>(gy: &[T], saved: &[T], h: usize, dh: &mut [T]) {
    let rows = dh.len() / h.max(1);
    for r in 0..rows {
        for j in 0..h {
            dh[r * h + j] = gy[r * h + j] * saved[r * 3 * h + h + j];
        }
    }
}

/// Zeros the positions of `buf` (`[t, b, w]`) past each row's length: the ones the sequence
/// kernels do not write.
fn zero_past_lengths<T: Float>(buf: &mut [T], d: &LstmDims, lengths: &[usize], w: usize) {
    for (r, &len) in lengths.iter().enumerate() {
        for p in len..d.t {
            buf[(p * d.b + r) * w..(p * d.b + r + 1) * w].fill(T::ZERO);
        }
    }
}

/// `w` (`rows × cols`, row-major) transposed.
fn transposed<T: Float>(w: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut t = vec![T::ZERO; w.len()];
    super::transpose::transpose(w, rows, cols, cols, &mut t);
    t
}

/// The sizes of an LSTM over a sequence: `t` positions, `b` rows, `h` hidden units; `reverse`
/// runs each row from its last position to its first.
#[derive(Debug, Clone, Copy)]
pub struct LstmDims {
    /// Positions (the longest length).
    pub t: usize,
    /// Rows of the batch.
    pub b: usize,
    /// Hidden units.
    pub h: usize,
    /// Whether each row runs backwards over its own length.
    pub reverse: bool,
}

impl LstmDims {
    /// Rows taking part in step `s`: the prefix whose length exceeds `s` (lengths are sorted
    /// longest first).
    fn active(&self, lengths: &[usize], s: usize) -> usize {
        lengths.partition_point(|&l| l > s)
    }
    /// The position row `r` (of length `len`) processes at step `s`.
    #[inline(always)]
    fn pos(&self, len: usize, s: usize) -> usize {
        if self.reverse {
            len - 1 - s
        } else {
            s
        }
    }
}

/// Row blocks for the threads: independent rows of a batch run their whole recurrence on their
/// own thread (no synchronisation per step); a batch of a few rows is one block, its products
/// split by columns instead. `[r0, r1, …, b]`.
fn row_blocks(b: usize, threads: usize) -> Vec<usize> {
    let t = if b > SMALL_M {
        threads.clamp(1, b / SMALL_M)
    } else {
        1
    };
    let per = b.div_ceil(t);
    let mut bounds: Vec<usize> = (0..b).step_by(per.max(1)).collect();
    bounds.push(b);
    bounds
}

/// `buf` (`[t, b, w]`) as each row block's `t` runs, one per position.
fn by_blocks<'a, T>(
    buf: &'a mut [T],
    b: usize,
    w: usize,
    bounds: &[usize],
) -> Vec<Vec<&'a mut [T]>> {
    let blocks = bounds.len() - 1;
    let mut out: Vec<Vec<&mut [T]>> = (0..blocks).map(|_| Vec::new()).collect();
    if b * w == 0 {
        return out;
    }
    for pos in buf.chunks_mut(b * w) {
        let mut rest = pos;
        for (j, o) in out.iter_mut().enumerate() {
            let (head, tail) = rest.split_at_mut((bounds[j + 1] - bounds[j]) * w);
            o.push(head);
            rest = tail;
        }
    }
    out
}

/// One row block's share of a sequence pass: its first row, its runs of a `[t, b, ·]` buffer,
/// and its rows of the two `[b, h]` states.
struct Block<'a, T> {
    r0: usize,
    runs: Vec<&'a mut [T]>,
    h: &'a mut [T],
    c: &'a mut [T],
}

/// Runs `f` on each block, each on its own thread when there are several.
fn per_block<'a, T: Float>(
    runs: Vec<Vec<&'a mut [T]>>,
    h: &'a mut [T],
    c: &'a mut [T],
    bounds: &[usize],
    width: usize,
    f: impl Fn(&mut Block<'a, T>) + Sync,
) {
    let mut blocks = Vec::new();
    let (mut h, mut c) = (h, c);
    for (j, runs) in runs.into_iter().enumerate() {
        let rows = bounds[j + 1] - bounds[j];
        let (hb, ht) = h.split_at_mut(rows * width);
        let (cb, ct) = c.split_at_mut(rows * width);
        (h, c) = (ht, ct);
        blocks.push(Block {
            r0: bounds[j],
            runs,
            h: hb,
            c: cb,
        });
    }
    if blocks.len() == 1 {
        f(&mut blocks[0]);
    } else {
        super::thread_pool::for_each_owned(blocks, |_, blk| f(blk));
    }
}

/// The LSTM over a sequence. `gi` `[t, b, 4h]`: the input projections with both biases; `w`
/// `[4h, h]`: the recurrent weight; `h0`, `c0` `[b, h]`. Writes `saved` `[t, b, 7h]` (zeros at
/// positions past a row's length) and the final states `hn`, `cn` `[b, h]`.
#[allow(clippy::too_many_arguments)]
pub fn lstm_seq_forward<T: Float + Gemm>(
    d: &LstmDims,
    lengths: &[usize],
    gi: &[T],
    w: &[T],
    h0: &[T],
    c0: &[T],
    saved: &mut [T],
    hn: &mut [T],
    cn: &mut [T],
    threads: usize,
) {
    let (b, h) = (d.b, d.h);
    let k = LSTM_SAVED * h;
    zero_past_lengths(saved, d, lengths, k);
    hn.copy_from_slice(h0);
    cn.copy_from_slice(c0);
    let bounds = row_blocks(b, threads);
    // wᵀ as an h×4h view: at a few rows, read in place (each column a contiguous row of w,
    // the dot-product path, split by columns across the threads); otherwise copied once into
    // row-major order, which the GEMM kernel reads without packing it at every step.
    let copy;
    let (wt, gemm_threads) = if b <= SMALL_M {
        (MatView::row_major(w, 0, h, true), threads)
    } else {
        copy = transposed(w, 4 * h, h);
        (MatView::row_major(&copy, 0, 4 * h, false), 1)
    };
    let runs = by_blocks(saved, b, k, &bounds);
    per_block(runs, hn, cn, &bounds, h, |blk| {
        let rows = blk.h.len() / h.max(1);
        let mut z = vec![T::ZERO; rows * 4 * h];
        let mut tmp = vec![T::ZERO; 4 * h];
        let mut c = vec![T::ZERO; h];
        for s in 0..d.t {
            let nb = d.active(lengths, s).saturating_sub(blk.r0).min(rows);
            if nb == 0 {
                break;
            }
            let hs = MatView::row_major(&*blk.h, 0, h, false);
            gemm(nb, h, 4 * h, hs, wt, &mut z, 0, false, gemm_threads);
            for r in 0..nb {
                let row = blk.r0 + r;
                let p = d.pos(lengths[row], s);
                let zr = &mut z[r * 4 * h..(r + 1) * 4 * h];
                let g = &gi[(p * b + row) * 4 * h..(p * b + row + 1) * 4 * h];
                for (zv, &gv) in zr.iter_mut().zip(g) {
                    *zv += gv;
                }
                lstm_gates(zr, &mut tmp, h);
                let sv = &mut blk.runs[p][r * k..(r + 1) * k];
                let (hr, cr) = (
                    &mut blk.h[r * h..(r + 1) * h],
                    &mut blk.c[r * h..(r + 1) * h],
                );
                for (j, cj) in c.iter_mut().enumerate() {
                    *cj = lstm_c(zr, cr[j], h, j);
                }
                sv[..4 * h].copy_from_slice(zr);
                sv[5 * h..6 * h].copy_from_slice(cr);
                sv[6 * h..].copy_from_slice(hr);
                T::tanh_into(&c, &mut sv[4 * h..5 * h]);
                cr.copy_from_slice(&c);
                for j in 0..h {
                    hr[j] = zr[3 * h + j] * sv[4 * h + j];
                }
            }
        }
    });
}

/// The LSTM's outputs `[t + 2, b, h]`: `h` at every position (zero past a row's length), then
/// `hn` and `cn`.
pub fn lstm_seq_output<T: Float>(
    d: &LstmDims,
    lengths: &[usize],
    saved: &[T],
    hn: &[T],
    cn: &[T],
    y: &mut [T],
) {
    let (b, h) = (d.b, d.h);
    let k = LSTM_SAVED * h;
    for p in 0..d.t {
        for (r, &len) in lengths.iter().enumerate() {
            let yr = &mut y[(p * b + r) * h..(p * b + r + 1) * h];
            if p < len {
                let sv = &saved[(p * b + r) * k..(p * b + r + 1) * k];
                for j in 0..h {
                    yr[j] = sv[3 * h + j] * sv[4 * h + j];
                }
            } else {
                yr.fill(T::ZERO);
            }
        }
    }
    y[d.t * b * h..(d.t + 1) * b * h].copy_from_slice(hn);
    y[(d.t + 1) * b * h..].copy_from_slice(cn);
}

/// Backward through time: from `gy` `[t + 2, b, h]` (the outputs', `hn`'s and `cn`'s
/// gradients), writes the input projections' gradient `dgi` `[t, b, 4h]` and the initial
/// states' `dh0`, `dc0` `[b, h]`.
#[allow(clippy::too_many_arguments)]
pub fn lstm_seq_backward<T: Float + Gemm>(
    d: &LstmDims,
    lengths: &[usize],
    gy: &[T],
    saved: &[T],
    w: &[T],
    dgi: &mut [T],
    dh0: &mut [T],
    dc0: &mut [T],
    threads: usize,
) {
    let (b, h) = (d.b, d.h);
    let k = LSTM_SAVED * h;
    zero_past_lengths(dgi, d, lengths, 4 * h);
    dh0.copy_from_slice(&gy[d.t * b * h..(d.t + 1) * b * h]);
    dc0.copy_from_slice(&gy[(d.t + 1) * b * h..]);
    let bounds = row_blocks(b, threads);
    // At a few rows, w stored transposed (h×4h, row-major), so that dz·w reads each output's
    // column as a contiguous run (the dot-product path); otherwise w as it is, row-major.
    let copy;
    let (wview, gemm_threads) = if b <= SMALL_M {
        copy = transposed(w, 4 * h, h);
        (MatView::row_major(&copy, 0, 4 * h, true), threads)
    } else {
        (MatView::row_major(w, 0, h, false), 1)
    };
    let runs = by_blocks(dgi, b, 4 * h, &bounds);
    per_block(runs, dh0, dc0, &bounds, h, |blk| {
        let rows = blk.h.len() / h.max(1);
        let mut dz = vec![T::ZERO; rows * 4 * h];
        let mut dhr = vec![T::ZERO; h];
        let mut dcr = vec![T::ZERO; h];
        for s in (0..d.t).rev() {
            let nb = d.active(lengths, s).saturating_sub(blk.r0).min(rows);
            if nb == 0 {
                continue;
            }
            for r in 0..nb {
                let row = blk.r0 + r;
                let p = d.pos(lengths[row], s);
                let at = (p * b + row) * h;
                for j in 0..h {
                    dhr[j] = blk.h[r * h + j] + gy[at + j];
                }
                dcr.copy_from_slice(&blk.c[r * h..(r + 1) * h]);
                let sv = &saved[(p * b + row) * k..(p * b + row + 1) * k];
                let dzr = &mut dz[r * 4 * h..(r + 1) * 4 * h];
                lstm_row_backward(
                    &sv[..4 * h],
                    &sv[4 * h..5 * h],
                    &sv[5 * h..6 * h],
                    &dhr,
                    &dcr,
                    dzr,
                    Some(&mut blk.c[r * h..(r + 1) * h]),
                    h,
                );
                blk.runs[p][r * 4 * h..(r + 1) * 4 * h].copy_from_slice(dzr);
            }
            let dzs = MatView::row_major(&dz, 0, 4 * h, false);
            gemm(nb, 4 * h, h, dzs, wview, blk.h, 0, false, gemm_threads);
        }
    });
}

/// The recurrent weight's gradient `[4h, h]`: `Σ dz_pᵀ·h_prev_p` over every position, one GEMM.
pub fn lstm_seq_grad_weight<T: Float + Gemm>(
    d: &LstmDims,
    dgi: &[T],
    saved: &[T],
    dw: &mut [T],
    threads: usize,
) {
    let h = d.h;
    let rows = d.t * d.b;
    let a = MatView::row_major(dgi, 0, 4 * h, true);
    let hp = MatView {
        data: saved,
        offset: 6 * h,
        rs: LSTM_SAVED * h,
        cs: 1,
    };
    gemm(4 * h, rows, h, a, hp, dw, 0, false, threads);
}
