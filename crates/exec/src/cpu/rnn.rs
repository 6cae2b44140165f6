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

use std::sync::Mutex;

use super::chain_gemm::chain_gemm;
use super::lockstep::{lockstep, LineAligned, Shared};
use super::matmul::{gemm, Gemm, MatView, Mnk};
use crate::Float;

/// Values kept per processed position and hidden unit by [`lstm_seq_forward`]:
/// `i, f, g, o, tanh(c), c_prev, h_prev`.
pub const LSTM_SAVED: usize = 7;

/// The LSTM gates of one row in place: pre-activations `[i f g o]` become `σ(i), σ(f),
/// tanh(g), σ(o)`. `tmp` is scratch of the row's length.
#[inline(always)]
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
    // Two loops rather than one over a chain of the two runs, which does not vectorise.
    let (if_, go) = z.split_at_mut(2 * h);
    for v in if_ {
        *v = T::ONE / (T::ONE + *v);
    }
    for v in &mut go[h..] {
        *v = T::ONE / (T::ONE + *v);
    }
}

/// The new cell state of one row from its activated gates `a = [i f g o]` and `c_prev`.
#[inline(always)]
fn lstm_c<T: Float>(a: &[T], cp: T, h: usize, j: usize) -> T {
    a[h + j] * cp + a[j] * a[2 * h + j]
}

/// What one row's LSTM step kept for backward, for some `w` of its hidden units: each field `w`
/// wide.
#[derive(Clone, Copy)]
struct RowRecord<'a, T> {
    /// The gates' activations `σ(i), σ(f), tanh(g), σ(o)`.
    gates: [&'a [T]; 4],
    /// `tanh(c)`.
    tc: &'a [T],
    /// `c_prev`.
    cp: &'a [T],
}

impl<'a, T> RowRecord<'a, T> {
    /// Units `u0..u0 + w` of a record laid out in blocks of `h` (`[i f g o tanh(c) c_prev …]`,
    /// a sequence pass's [`LSTM_SAVED`] values).
    #[inline(always)]
    fn units(sv: &'a [T], h: usize, u0: usize, w: usize) -> Self {
        let col = |blk: usize| &sv[blk * h + u0..blk * h + u0 + w];
        RowRecord {
            gates: [col(0), col(1), col(2), col(3)],
            tc: col(4),
            cp: col(5),
        }
    }
}

/// `s` as its first `N` runs of `w`.
#[inline(always)]
fn runs_mut<T, const N: usize>(s: &mut [T], w: usize) -> [&mut [T]; N] {
    let mut rest = s;
    std::array::from_fn(|_| {
        let (run, tail) = std::mem::take(&mut rest).split_at_mut(w);
        rest = tail;
        run
    })
}

/// One LSTM step's gradients for `dh.len()` units of a row: from what the step kept and the
/// gradients `dh` and `dc` arriving at the step's `h` and `c`, writes the four gates'
/// pre-activation gradients into `out[g]` (and again into `out[4 + g]` when `N` is 8), and
/// turns `dc` into the gradient at `c_prev`. The cell and both divisions of the sequence pass
/// run these operations, in this order, so their gradients have the same bits.
#[inline(always)]
fn lstm_gate_grads<T: Float, const N: usize>(
    rec: RowRecord<'_, T>,
    dh: &[T],
    dc: &mut [T],
    mut out: [&mut [T]; N],
) {
    let [ai, af, ag, ao] = rec.gates;
    let (tc, cp) = (rec.tc, rec.cp);
    for j in 0..dh.len() {
        let (i, f, g, o) = (ai[j], af[j], ag[j], ao[j]);
        let t = tc[j];
        let dcj = dc[j] + dh[j] * o * (T::ONE - t * t);
        let d = [
            dcj * g * i * (T::ONE - i),
            dcj * cp[j] * f * (T::ONE - f),
            dcj * i * (T::ONE - g * g),
            dh[j] * t * o * (T::ONE - o),
        ];
        for (x, run) in out.iter_mut().enumerate() {
            run[j] = d[x % 4];
        }
        dc[j] = dcj * f;
    }
}

/// One row's LSTM step for `w` hidden units, after its pre-activations `z` (`[i f g o]`, 4w):
/// activates the gates in place, turns the cell state `c` into the new one (through `cnew`,
/// scratch), writes `tanh(c)` into `tc` and the new hidden state into `h`; `tmp` is scratch of
/// `z`'s length. Both divisions of the sequence pass run these operations, in this order, so
/// their states have the same bits; each keeps its record around it.
#[inline(always)]
fn lstm_step_row<T: Float>(
    z: &mut [T],
    tmp: &mut [T],
    (c, cnew): (&mut [T], &mut [T]),
    tc: &mut [T],
    h: &mut [T],
) {
    let w = c.len();
    lstm_gates(z, tmp, w);
    for (j, cj) in cnew.iter_mut().enumerate() {
        *cj = lstm_c(z, c[j], w, j);
    }
    T::tanh_into(cnew, tc);
    c.copy_from_slice(cnew);
    for j in 0..w {
        h[j] = z[3 * w + j] * tc[j];
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
        lstm_cell_row(&z[r * 4 * h..], &cp[r * h..], h, &mut tmp, &mut c, s);
    }
}

/// One row of [`lstm_cell_forward`]: its `5h` saved values `s` from its pre-activations `z`
/// and previous cell state `cp` (each read from its start); `tmp` (4h) and `c` (h) scratch.
#[inline(always)]
fn lstm_cell_row<T: Float>(z: &[T], cp: &[T], h: usize, tmp: &mut [T], c: &mut [T], s: &mut [T]) {
    let (a, tc) = s.split_at_mut(4 * h);
    a.copy_from_slice(&z[..4 * h]);
    lstm_gates(a, tmp, h);
    for (j, cj) in c.iter_mut().enumerate() {
        *cj = lstm_c(a, cp[j], h, j);
    }
    T::tanh_into(c, tc);
}

/// The cell's output `[2, rows, h]` (as [`lstm_cell_output`]) keeping nothing for backward:
/// each row's activations live in one row of scratch. The same bits as [`lstm_cell_forward`]
/// then [`lstm_cell_output`].
pub fn lstm_cell_infer<T: Float>(z: &[T], cp: &[T], h: usize, out: &mut [T]) {
    let rows = cp.len() / h.max(1);
    let mut tmp = vec![T::ZERO; 4 * h];
    let mut c = vec![T::ZERO; h];
    let mut s = vec![T::ZERO; 5 * h];
    let (hs, cs) = out.split_at_mut(rows * h);
    for r in 0..rows {
        let cpr = &cp[r * h..(r + 1) * h];
        lstm_cell_row(&z[r * 4 * h..], cpr, h, &mut tmp, &mut c, &mut s);
        for j in 0..h {
            hs[r * h + j] = s[3 * h + j] * s[4 * h + j];
            cs[r * h + j] = lstm_c(&s, cpr[j], h, j);
        }
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
    // The gradient at `c_prev`, computed on the way and dropped (`lstm_cell_grad_c` is its op).
    let mut dcr = vec![T::ZERO; h];
    for r in 0..rows {
        let s = &saved[r * 5 * h..(r + 1) * 5 * h];
        let row = r * h..(r + 1) * h;
        // The cell keeps `[i f g o tanh(c)]`, and `c_prev` is its input.
        let col = |blk: usize| &s[blk * h..(blk + 1) * h];
        let rec = RowRecord {
            gates: [col(0), col(1), col(2), col(3)],
            tc: col(4),
            cp: &cp[row.clone()],
        };
        dcr.copy_from_slice(&dc[row.clone()]);
        let out: [&mut [T]; 4] = runs_mut(&mut dz[r * 4 * h..(r + 1) * 4 * h], h);
        lstm_gate_grads(rec, &dh[row], &mut dcr, out);
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
        gru_cell_row(gi, gh, h, &mut tmp, &mut saved[r * 3 * h..(r + 1) * 3 * h]);
    }
}

/// The GRU cell's output `h'` keeping nothing for backward (each row's `r, z, n` in one row
/// of scratch): the same bits as [`gru_cell_forward`] then [`gru_cell_output`].
pub fn gru_cell_infer<T: Float>(gi: &[T], gh: &[T], hp: &[T], h: usize, out: &mut [T]) {
    let rows = hp.len() / h.max(1);
    let mut tmp = vec![T::ZERO; 3 * h];
    let mut s = vec![T::ZERO; 3 * h];
    for r in 0..rows {
        let row = r * 3 * h..(r + 1) * 3 * h;
        gru_cell_row(&gi[row.clone()], &gh[row], h, &mut tmp, &mut s);
        gru_cell_output(&s, &hp[r * h..(r + 1) * h], h, &mut out[r * h..(r + 1) * h]);
    }
}

/// One row of [`gru_cell_forward`]: `r, z, n` into `s` (3h); `tmp` (3h) scratch.
#[inline(always)]
fn gru_cell_row<T: Float>(gi: &[T], gh: &[T], h: usize, tmp: &mut [T], s: &mut [T]) {
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

/// The fixed inputs of an LSTM sequence pass: its sizes, each row's length (sorted longest
/// first, none past `dims.t`), and the recurrent weight `w` `[4h, h]`.
#[derive(Debug, Clone, Copy)]
pub struct LstmSeq<'a, T> {
    /// The sizes.
    pub dims: LstmDims,
    /// Each row's length.
    pub lengths: &'a [usize],
    /// The recurrent weight.
    pub w: &'a [T],
}

/// A hidden state and a cell state, each `[b, h]`: a pass's initial states.
#[derive(Debug, Clone, Copy)]
pub struct LstmStates<'a, T> {
    /// The hidden state.
    pub h: &'a [T],
    /// The cell state.
    pub c: &'a [T],
}

/// A hidden state and a cell state (or their gradients), each `[b, h]`, written by a pass.
#[derive(Debug)]
pub struct LstmStatesMut<'a, T> {
    /// The hidden state.
    pub h: &'a mut [T],
    /// The cell state.
    pub c: &'a mut [T],
}

/// Hidden units a thread takes at the least: below this a step's share is too small to repay
/// the threads' meeting.
const MIN_SLOT_UNITS: usize = 32;

/// How the hidden units are divided between the threads of a sequence pass: `[0, u1, …, h]`,
/// blocks of whole multiples of 16 units (a vector's width) but for the last. Each thread
/// keeps its block for the whole sequence, forward and backward, so that its share of the
/// recurrent weight (a quarter of a megabyte per 64 units at h = 256) stays in its core's
/// cache from one step to the next.
fn unit_slots(h: usize, threads: usize) -> Vec<usize> {
    let slots = threads.clamp(1, (h / MIN_SLOT_UNITS).max(1));
    split_bounds(h, h.div_ceil(slots).div_ceil(16) * 16)
}

/// `[0, per, 2·per, …, n]`: `n` items in blocks of `per` (the last may be shorter; no block for
/// no items).
fn split_bounds(n: usize, per: usize) -> Vec<usize> {
    let mut bounds: Vec<usize> = (0..n).step_by(per.max(1)).collect();
    bounds.push(n);
    bounds
}

/// Columns `u0..u1` of the `[rows, h]` matrix `src`, as a `[rows, u1 − u0]` matrix: a slot's
/// units of a state.
fn columns<T: Float>(src: &[T], h: usize, u0: usize, u1: usize) -> Vec<T> {
    let rows = src.len() / h.max(1);
    let mut out = Vec::with_capacity(rows * (u1 - u0));
    for r in 0..rows {
        out.extend_from_slice(&src[r * h + u0..r * h + u1]);
    }
    out
}

/// Writes the `[rows, u1 − u0]` matrix `part` back as columns `u0..u1` of `dst` (`[rows, h]`).
fn put_columns<T: Float>(dst: &mut [T], h: usize, u0: usize, u1: usize, part: &[T]) {
    let wd = u1 - u0;
    for r in 0..dst.len() / h.max(1) {
        dst[r * h + u0..r * h + u1].copy_from_slice(&part[r * wd..(r + 1) * wd]);
    }
}

fn lock<S>(m: &Mutex<S>) -> std::sync::MutexGuard<'_, S> {
    // A unit that panicked stops the whole pass (`lockstep` re-raises it), so a poisoned state
    // is never used again.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One thread's share of a forward pass: its units' rows of the recurrent weight, transposed
/// (per gate `[h, width]`), their cell states, and scratch.
struct FwdSlot<T> {
    wt: Vec<T>,
    hloc: Vec<T>,
    c: Vec<T>,
    z: Vec<T>,
    tmp: Vec<T>,
    cnew: Vec<T>,
    /// `tanh(c)` of a row's units when no record is kept (it is written into the record
    /// otherwise).
    tc: Vec<T>,
}

/// What a forward pass writes besides the final states: the record backward reads (`[t, b,
/// 7h]`, [`LSTM_SAVED`]), or only the output (`[t, b, h]`) when nothing will be differentiated.
enum Sink<'a, T> {
    Record(&'a mut [T]),
    Output(&'a mut [T]),
}

impl<'a, T> Sink<'a, T> {
    /// The sink's buffer and the values it keeps per position and row.
    fn parts(self, h: usize) -> (&'a mut [T], usize, bool) {
        match self {
            Sink::Record(s) => (s, LSTM_SAVED * h, true),
            Sink::Output(y) => (y, h, false),
        }
    }
}

/// Rows per thread from which a batch is divided between the threads by rows (each running its
/// rows' whole recurrence, with no meeting per step) rather than by hidden units. Below it, a
/// thread reading the whole recurrent weight at every step for its few rows costs more than
/// the meeting; above it, the per-step products are large enough to hide the weight's reads
/// (measured at h = 256 on two cores: units ahead up to 16 rows, even at 24, rows ahead at 32).
const ROWS_PER_THREAD: usize = 12;

/// Row blocks for the threads when the batch has [`ROWS_PER_THREAD`] rows for each of at
/// least two of them: `[r0, r1, …, b]`; otherwise `None` (divide by hidden units).
fn row_blocks(b: usize, threads: usize) -> Option<Vec<usize>> {
    let t = threads.min(b / ROWS_PER_THREAD);
    if t < 2 {
        return None;
    }
    Some(split_bounds(b, b.div_ceil(t)))
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

/// Runs `f` on each block, each on its own thread.
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
    super::thread_pool::for_each_owned(blocks, |_, blk| f(blk));
}

/// The LSTM over a sequence. `gi` `[t, b, 4h]`: the input projections with both biases;
/// `init`: the initial states. Writes `saved` `[t, b, 7h]` (zeros at positions past a row's
/// length) and the final states into `last`.
///
/// Each pre-activation is one fused chain over the hidden units ([`chain_gemm`]), so the bits
/// do not depend on how the work is divided between threads. A batch with rows enough for
/// every thread is divided by rows (each thread runs its rows' whole recurrence); a smaller one
/// by hidden units, blocks of at least 32 that each thread keeps forward and backward, the
/// threads advancing through the steps together ([`lockstep`]), each
/// multiplying the whole previous hidden state by its own units' rows of `w`.
pub fn lstm_seq_forward<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gi: &[T],
    init: LstmStates<'_, T>,
    saved: &mut [T],
    last: LstmStatesMut<'_, T>,
    threads: usize,
) {
    forward(seq, gi, init, Sink::Record(saved), last, threads);
}

/// [`lstm_seq_forward`] keeping no record, for a pass that will not be differentiated: writes
/// the output `y` `[t, b, h]` (zeros past each row's length) and the final states, the same
/// bits as [`lstm_seq_forward`] then [`lstm_seq_output`], in a seventh of the memory.
pub fn lstm_seq_infer<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gi: &[T],
    init: LstmStates<'_, T>,
    y: &mut [T],
    last: LstmStatesMut<'_, T>,
    threads: usize,
) {
    forward(seq, gi, init, Sink::Output(y), last, threads);
}

fn forward<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gi: &[T],
    init: LstmStates<'_, T>,
    sink: Sink<'_, T>,
    last: LstmStatesMut<'_, T>,
    threads: usize,
) {
    let (d, lengths) = (&seq.dims, seq.lengths);
    if d.b * d.h == 0 {
        // No row or no unit: the sink, `hn` and `cn` are empty, and the steps are not walked
        // (a sequence of 2^40 empty steps took hours).
        return;
    }
    let (buf, k, record) = sink.parts(d.h);
    zero_past_lengths(buf, d, lengths, k);
    let sink = if record {
        Sink::Record(buf)
    } else {
        Sink::Output(buf)
    };
    last.h.copy_from_slice(init.h);
    last.c.copy_from_slice(init.c);
    match row_blocks(d.b, threads) {
        Some(bounds) => forward_by_rows(seq, gi, sink, last, &bounds),
        None => forward_by_units(seq, gi, init, sink, last, threads),
    }
}

/// [`lstm_seq_forward`] over row blocks, one per thread; `states` holds the initial states
/// and becomes the final ones.
fn forward_by_rows<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gi: &[T],
    sink: Sink<'_, T>,
    states: LstmStatesMut<'_, T>,
    bounds: &[usize],
) {
    let (d, lengths, w) = (&seq.dims, seq.lengths, seq.w);
    let LstmStatesMut { h: hn, c: cn } = states;
    let (b, h) = (d.b, d.h);
    let (buf, k, record) = sink.parts(h);
    // wᵀ, `[h, 4h]`, read by every thread at every step.
    let mut wt = vec![T::ZERO; w.len()];
    T::transpose(w, 4 * h, h, h, &mut wt);
    let runs = by_blocks(buf, b, k, bounds);
    per_block(runs, hn, cn, bounds, h, |blk| {
        let rows = blk.h.len() / h.max(1);
        let mut z = vec![T::ZERO; rows * 4 * h];
        let mut tmp = vec![T::ZERO; 4 * h];
        let mut c = vec![T::ZERO; h];
        let mut tcl = vec![T::ZERO; if record { 0 } else { h }];
        for s in 0..d.t {
            let nb = d.active(lengths, s).saturating_sub(blk.r0).min(rows);
            if nb == 0 {
                break;
            }
            chain_gemm(
                Mnk::new(nb, h, 4 * h),
                (blk.h, h),
                (&wt, 4 * h),
                (&mut z, 4 * h),
            );
            // The rows' gate arithmetic at the widest vector width (the same operations at any).
            super::wide::wide(
                nb * 4 * h,
                #[inline(always)]
                || {
                    for r in 0..nb {
                        let row = blk.r0 + r;
                        let p = d.pos(lengths[row], s);
                        let zr = &mut z[r * 4 * h..(r + 1) * 4 * h];
                        let g = &gi[(p * b + row) * 4 * h..(p * b + row + 1) * 4 * h];
                        for (zv, &gv) in zr.iter_mut().zip(g) {
                            *zv += gv;
                        }
                        let sv = &mut blk.runs[p][r * k..(r + 1) * k];
                        let (hr, cr) = (
                            &mut blk.h[r * h..(r + 1) * h],
                            &mut blk.c[r * h..(r + 1) * h],
                        );
                        if record {
                            // `c_prev` and `h_prev`, before the step replaces them.
                            sv[5 * h..6 * h].copy_from_slice(cr);
                            sv[6 * h..].copy_from_slice(hr);
                        }
                        let tc = if record {
                            &mut sv[4 * h..5 * h]
                        } else {
                            &mut tcl[..]
                        };
                        lstm_step_row(zr, &mut tmp, (cr, &mut c), tc, hr);
                        if record {
                            sv[..4 * h].copy_from_slice(zr);
                        } else {
                            // The output row, as `lstm_seq_output` reads it from the record.
                            sv.copy_from_slice(hr);
                        }
                    }
                },
            );
        }
    });
}

/// [`lstm_seq_forward`] divided by hidden units.
fn forward_by_units<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gi: &[T],
    init: LstmStates<'_, T>,
    sink: Sink<'_, T>,
    last: LstmStatesMut<'_, T>,
    threads: usize,
) {
    let (d, lengths, w) = (&seq.dims, seq.lengths, seq.w);
    let LstmStates { h: h0, c: c0 } = init;
    let LstmStatesMut { h: hn, c: cn } = last;
    let (b, h) = (d.b, d.h);
    let (buf, k, record) = sink.parts(h);
    let bounds = unit_slots(h, threads);
    let slots: Vec<Mutex<FwdSlot<T>>> = bounds
        .windows(2)
        .map(|u| {
            let wd = u[1] - u[0];
            Mutex::new(FwdSlot {
                wt: Vec::new(),
                hloc: vec![T::ZERO; b * h],
                c: columns(c0, h, u[0], u[1]),
                z: vec![T::ZERO; b * 4 * wd],
                tmp: vec![T::ZERO; 4 * wd],
                cnew: vec![T::ZERO; wd],
                tc: vec![T::ZERO; if record { 0 } else { wd }],
            })
        })
        .collect();
    // The hidden state of the step before and of this one, alternating halves.
    let mut hbuf = LineAligned::zeros(2 * b * h);
    let hbuf = hbuf.as_mut_slice();
    hbuf[b * h..].copy_from_slice(h0);
    let hs = Shared::new(hbuf);
    let sv = Shared::new(buf);
    let (hns, cns) = (Shared::new(hn), Shared::new(cn));
    lockstep(slots.len(), d.t, &|q, s| {
        let mut st = lock(&slots[q]);
        let FwdSlot {
            wt,
            hloc,
            c,
            z,
            tmp,
            cnew,
            tc: tcl,
        } = &mut *st;
        let (u0, u1) = (bounds[q], bounds[q + 1]);
        let wd = u1 - u0;
        if wt.is_empty() {
            // Packed here, by the thread that will read it at every step.
            wt.resize(4 * h * wd, T::ZERO);
            for g in 0..4 {
                T::transpose(
                    &w[(g * h + u0) * h..],
                    wd,
                    h,
                    h,
                    &mut wt[g * h * wd..(g + 1) * h * wd],
                );
            }
        }
        let nb = d.active(lengths, s);
        if nb == 0 {
            return;
        }
        // SAFETY: this half of `hbuf` was written by the previous step's units (all finished:
        // `lockstep`) and is written next by the following step's, which start only after
        // every slot has finished this one; meanwhile it is only read.
        let hshared = unsafe { hs.part(((s + 1) % 2) * b * h, nb * h) };
        // Copied first: half of it was just written on another core, and one copy fetches
        // those lines all at once where the product's element-by-element reads would wait
        // for each in turn.
        let hprev = &mut hloc[..nb * h];
        hprev.copy_from_slice(hshared);
        let hprev = &*hprev;
        for g in 0..4 {
            chain_gemm(
                Mnk::new(nb, h, wd),
                (hprev, h),
                (&wt[g * h * wd..], wd),
                (&mut z[g * wd..], 4 * wd),
            );
        }
        // The rows' gate arithmetic at the widest vector width (the same operations at any).
        super::wide::wide(
            nb * 4 * wd,
            #[inline(always)]
            || {
                for (r, &len) in lengths.iter().enumerate().take(nb) {
                    let p = d.pos(len, s);
                    let zr = &mut z[r * 4 * wd..(r + 1) * 4 * wd];
                    let g_at = (p * b + r) * 4 * h;
                    for g in 0..4 {
                        let gv = &gi[g_at + g * h + u0..g_at + g * h + u1];
                        for (zv, &x) in zr[g * wd..(g + 1) * wd].iter_mut().zip(gv) {
                            *zv += x;
                        }
                    }
                    let cr = &mut c[r * wd..(r + 1) * wd];
                    let at = (p * b + r) * k;
                    let tc: &mut [T] = if record {
                        // SAFETY: in step s only this slot writes its units' columns of the record of row r
                        // at position p (each row visits each position once), and no unit reads them.
                        let (tc, cp, hp) = unsafe {
                            (
                                sv.part_mut(at + 4 * h + u0, wd),
                                sv.part_mut(at + 5 * h + u0, wd),
                                sv.part_mut(at + 6 * h + u0, wd),
                            )
                        };
                        cp.copy_from_slice(cr);
                        hp.copy_from_slice(&hprev[r * h + u0..r * h + u1]);
                        tc
                    } else {
                        &mut tcl[..]
                    };
                    // SAFETY: this slot's units of row r in this step's half of `hbuf`: written here
                    // alone, read by the next step (after `lockstep`'s meeting).
                    let hr = unsafe { hs.part_mut((s % 2) * b * h + r * h + u0, wd) };
                    lstm_step_row(zr, tmp, (cr, cnew), tc, hr);
                    if record {
                        for g in 0..4 {
                            // SAFETY: this slot's units of gate g in row r's record at position
                            // p: written here alone (each row visits each position once), read
                            // by no unit.
                            unsafe { sv.part_mut(at + g * h + u0, wd) }
                                .copy_from_slice(&zr[g * wd..(g + 1) * wd]);
                        }
                    }
                    if !record {
                        // SAFETY: this slot's units of the output row r at position p: written
                        // here alone (each row visits each position once), read by no unit.
                        unsafe { sv.part_mut(at + u0, wd) }.copy_from_slice(hr);
                    }
                    if s + 1 == len {
                        // SAFETY: row r ends here; only this slot writes its units of the row's final
                        // states, once.
                        unsafe {
                            hns.part_mut(r * h + u0, wd).copy_from_slice(hr);
                            cns.part_mut(r * h + u0, wd).copy_from_slice(cr);
                        }
                    }
                }
            },
        );
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
    if b * h == 0 {
        // `y` is empty: no walk over the positions.
        return;
    }
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

/// One thread's share of a backward pass: the gradients arriving at its units' hidden and cell
/// states, and scratch.
struct BwdSlot<T> {
    dzloc: Vec<T>,
    dh: Vec<T>,
    dc: Vec<T>,
    dhr: Vec<T>,
}

/// Backward through time: from `gy` `[t + 2, b, h]` (the outputs', `hn`'s and `cn`'s
/// gradients) and the forward's `saved`, writes the input projections' gradient `dgi` `[t, b,
/// 4h]` and the initial states' gradients into `d0`.
///
/// The work is divided as forward; each gradient of the previous hidden state is one fused
/// chain over all 4h gates, whatever the division.
pub fn lstm_seq_backward<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gy: &[T],
    saved: &[T],
    dgi: &mut [T],
    d0: LstmStatesMut<'_, T>,
    threads: usize,
) {
    let (d, lengths) = (&seq.dims, seq.lengths);
    let LstmStatesMut { h: dh0, c: dc0 } = d0;
    let (b, h, t) = (d.b, d.h, d.t);
    if b * h == 0 {
        // Every gradient here is empty: no walk over the steps.
        return;
    }
    zero_past_lengths(dgi, d, lengths, 4 * h);
    dh0.copy_from_slice(&gy[t * b * h..(t + 1) * b * h]);
    dc0.copy_from_slice(&gy[(t + 1) * b * h..]);
    let d0 = LstmStatesMut { h: dh0, c: dc0 };
    match row_blocks(b, threads) {
        Some(bounds) => backward_by_rows(seq, gy, saved, dgi, d0, &bounds),
        None => backward_by_units(seq, gy, saved, dgi, d0, threads),
    }
}

/// [`lstm_seq_backward`] over row blocks, one per thread; `dh0`, `dc0` hold the final states'
/// gradients and become the initial ones'.
fn backward_by_rows<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gy: &[T],
    saved: &[T],
    dgi: &mut [T],
    d0: LstmStatesMut<'_, T>,
    bounds: &[usize],
) {
    let (d, lengths, w) = (&seq.dims, seq.lengths, seq.w);
    let LstmStatesMut { h: dh0, c: dc0 } = d0;
    let (b, h) = (d.b, d.h);
    let k = LSTM_SAVED * h;
    let runs = by_blocks(dgi, b, 4 * h, bounds);
    per_block(runs, dh0, dc0, bounds, h, |blk| {
        let rows = blk.h.len() / h.max(1);
        let mut dz = vec![T::ZERO; rows * 4 * h];
        let mut dhr = vec![T::ZERO; h];
        for s in (0..d.t).rev() {
            let nb = d.active(lengths, s).saturating_sub(blk.r0).min(rows);
            if nb == 0 {
                continue;
            }
            // The rows' gate arithmetic at the widest vector width (the same operations at any).
            super::wide::wide(
                nb * 4 * h,
                #[inline(always)]
                || {
                    for r in 0..nb {
                        let row = blk.r0 + r;
                        let p = d.pos(lengths[row], s);
                        let at = (p * b + row) * h;
                        for j in 0..h {
                            dhr[j] = blk.h[r * h + j] + gy[at + j];
                        }
                        let sv = &saved[(p * b + row) * k..(p * b + row + 1) * k];
                        // The gate gradients into the rows' product operand and into `dgi`.
                        let [zi, zf, zg, zo] = runs_mut(&mut dz[r * 4 * h..(r + 1) * 4 * h], h);
                        let [yi, yf, yg, yo] =
                            runs_mut(&mut blk.runs[p][r * 4 * h..(r + 1) * 4 * h], h);
                        lstm_gate_grads(
                            RowRecord::units(sv, h, 0, h),
                            &dhr,
                            &mut blk.c[r * h..(r + 1) * h],
                            [zi, zf, zg, zo, yi, yf, yg, yo],
                        );
                    }
                },
            );
            chain_gemm(Mnk::new(nb, 4 * h, h), (&dz, 4 * h), (w, h), (blk.h, h));
        }
    });
}

/// [`lstm_seq_backward`] divided by hidden units: at each step a thread turns the gradients at
/// its units into their gates' pre-activation gradients; after the threads meet, it takes its
/// units' part of the previous hidden state's gradient from all of them, `dz·w[:, units]` (its
/// block of `w`'s columns, read in place and kept in its core's cache over the steps).
fn backward_by_units<T: Float + Gemm>(
    seq: &LstmSeq<'_, T>,
    gy: &[T],
    saved: &[T],
    dgi: &mut [T],
    d0: LstmStatesMut<'_, T>,
    threads: usize,
) {
    let (d, lengths, w) = (&seq.dims, seq.lengths, seq.w);
    let LstmStatesMut { h: dh0, c: dc0 } = d0;
    let (b, h, t) = (d.b, d.h, d.t);
    let k = LSTM_SAVED * h;
    let bounds = unit_slots(h, threads);
    let slots: Vec<Mutex<BwdSlot<T>>> = bounds
        .windows(2)
        .map(|u| {
            let wd = u[1] - u[0];
            Mutex::new(BwdSlot {
                dzloc: vec![T::ZERO; b * 4 * h],
                dh: columns(dh0, h, u[0], u[1]),
                dc: columns(dc0, h, u[0], u[1]),
                dhr: vec![T::ZERO; wd],
            })
        })
        .collect();
    // Each step's gate gradients of the active rows, `[b, 4h]`, alternating halves.
    let mut dzbuf = LineAligned::zeros(2 * b * 4 * h);
    let dzs = Shared::new(dzbuf.as_mut_slice());
    let dgs = Shared::new(dgi);
    let dzs_or_dgs = |dz: bool| if dz { &dzs } else { &dgs };
    // Unit u: the product of step t − u (for u ≥ 1), then the gates of step t − u − 1 (u < t).
    lockstep(bounds.len() - 1, t + 1, &|q, u| {
        let mut st = lock(&slots[q]);
        let BwdSlot { dzloc, dh, dc, dhr } = &mut *st;
        let (u0, u1) = (bounds[q], bounds[q + 1]);
        let wd = u1 - u0;
        if u >= 1 {
            let s = t - u;
            let nb = d.active(lengths, s);
            if nb > 0 {
                // SAFETY: written by step s's gates in the unit before (all finished:
                // `lockstep`); the next write of this half is step s − 2's gates, in the unit
                // after this one, past the next meeting.
                let dzp = unsafe { dzs.part((s % 2) * b * 4 * h, nb * 4 * h) };
                // Copied first, as the hidden state forward.
                let dzl = &mut dzloc[..nb * 4 * h];
                dzl.copy_from_slice(dzp);
                chain_gemm(
                    Mnk::new(nb, 4 * h, wd),
                    (dzl, 4 * h),
                    (&w[u0..], h),
                    (dh, wd),
                );
            }
        }
        if u < t {
            let s = t - 1 - u;
            let nb = d.active(lengths, s);
            // The rows' gate arithmetic at the widest vector width (the same operations at any).
            super::wide::wide(
                nb * 4 * wd,
                #[inline(always)]
                || {
                    for (r, &len) in lengths.iter().enumerate().take(nb) {
                        let p = d.pos(len, s);
                        let at = (p * b + r) * h;
                        for j in 0..wd {
                            dhr[j] = dh[r * wd + j] + gy[at + u0 + j];
                        }
                        let sv = &saved[(p * b + r) * k..(p * b + r + 1) * k];
                        let out: [&mut [T]; 8] = std::array::from_fn(|x| {
                            let g = x % 4;
                            let at = if x < 4 {
                                (s % 2) * b * 4 * h + r * 4 * h
                            } else {
                                (p * b + r) * 4 * h
                            };
                            // SAFETY: this slot's units of row r, gate g: in `dzbuf`'s half for
                            // step s (read by the product after the next meeting; its last
                            // readers, step s + 2's product, finished before the last one) and
                            // in `dgi` at the row's position p (visited once); the eight parts
                            // are disjoint.
                            unsafe { dzs_or_dgs(x < 4).part_mut(at + g * h + u0, wd) }
                        });
                        lstm_gate_grads(
                            RowRecord::units(sv, h, u0, wd),
                            dhr,
                            &mut dc[r * wd..(r + 1) * wd],
                            out,
                        );
                    }
                },
            );
        }
    });
    for (q, slot) in slots.into_iter().enumerate() {
        let st = slot.into_inner().unwrap_or_else(|e| e.into_inner());
        let (u0, u1) = (bounds[q], bounds[q + 1]);
        put_columns(dh0, h, u0, u1, &st.dh);
        put_columns(dc0, h, u0, u1, &st.dc);
    }
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
    if rows * h == 0 {
        // No position of any row (the sum is empty), or no unit (`dw` is).
        dw.fill(T::ZERO);
        return;
    }
    let a = MatView::row_major(dgi, 0, 4 * h, true);
    let hp = MatView {
        data: saved,
        offset: 6 * h,
        rs: LSTM_SAVED * h,
        cs: 1,
    };
    gemm(Mnk::new(4 * h, rows, h), a, hp, dw, false, threads);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64, scale: f64) -> Vec<f32> {
        crate::cpu::test_data::values(len, seed, scale)
    }

    /// Forward and backward of one sequence pass: `saved`, the final states, `dgi` and the
    /// initial states' gradients.
    fn pass(d: &LstmDims, lengths: &[usize], threads: usize) -> Vec<Vec<f32>> {
        let (t, b, h) = (d.t, d.b, d.h);
        let gi = data(t * b * 4 * h, 1, 1.0);
        let w = data(4 * h * h, 2, 0.2);
        let (h0, c0) = (data(b * h, 3, 1.0), data(b * h, 4, 1.0));
        let gy = data((t + 2) * b * h, 5, 1.0);
        let mut saved = vec![f32::NAN; t * b * LSTM_SAVED * h];
        let (mut hn, mut cn) = (vec![0.0; b * h], vec![0.0; b * h]);
        let seq = LstmSeq {
            dims: *d,
            lengths,
            w: &w,
        };
        let init = LstmStates { h: &h0, c: &c0 };
        let last = LstmStatesMut {
            h: &mut hn,
            c: &mut cn,
        };
        lstm_seq_forward(&seq, &gi, init, &mut saved, last, threads);
        let mut dgi = vec![f32::NAN; t * b * 4 * h];
        let (mut dh0, mut dc0) = (vec![0.0; b * h], vec![0.0; b * h]);
        let d0 = LstmStatesMut {
            h: &mut dh0,
            c: &mut dc0,
        };
        lstm_seq_backward(&seq, &gy, &saved, &mut dgi, d0, threads);
        vec![saved, hn, cn, dgi, dh0, dc0]
    }

    /// The cells without a record give the recorded forward's bits.
    #[test]
    fn cells_without_a_record_have_the_recorded_output() {
        let (rows, h) = (3, 5);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let (z, cp) = (data(rows * 4 * h, 1, 2.0), data(rows * h, 2, 1.0));
        let mut saved = vec![f32::NAN; rows * 5 * h];
        lstm_cell_forward(&z, &cp, h, &mut saved);
        let mut want = vec![f32::NAN; 2 * rows * h];
        lstm_cell_output(&saved, &cp, h, &mut want);
        let mut got = vec![f32::NAN; 2 * rows * h];
        lstm_cell_infer(&z, &cp, h, &mut got);
        assert_eq!(bits(&got), bits(&want));
        let (gi, gh) = (data(rows * 3 * h, 3, 2.0), data(rows * 3 * h, 4, 2.0));
        let mut saved = vec![f32::NAN; rows * 3 * h];
        gru_cell_forward(&gi, &gh, h, &mut saved);
        let mut want = vec![f32::NAN; rows * h];
        gru_cell_output(&saved, &cp, h, &mut want);
        let mut got = vec![f32::NAN; rows * h];
        gru_cell_infer(&gi, &gh, &cp, h, &mut got);
        assert_eq!(bits(&got), bits(&want));
    }

    /// Without a record, the output and final states are the recorded pass's bits, in both
    /// divisions and at one and two threads, every position written (zeros past a length).
    #[test]
    fn a_pass_without_a_record_has_the_recorded_passs_output() {
        // Under Miri one small case of each division (the interpreter is slow).
        let cases: &[(usize, usize, &[usize], bool)] = if cfg!(miri) {
            &[(1, 64, &[2], true), (24, 2, &[2; 24], false)]
        } else {
            &[
                (2, 64, &[3, 2], false),
                (2, 40, &[3, 0], true),
                (25, 4, &[3; 25], false),
                (
                    26,
                    3,
                    &[
                        4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0,
                        0,
                    ],
                    true,
                ),
            ]
        };
        for &(b, h, lengths, reverse) in cases {
            let d = LstmDims {
                t: lengths[0],
                b,
                h,
                reverse,
            };
            let t = d.t;
            let gi = data(t * b * 4 * h, 1, 1.0);
            let w = data(4 * h * h, 2, 0.2);
            let (h0, c0) = (data(b * h, 3, 1.0), data(b * h, 4, 1.0));
            for threads in [1, 2] {
                let mut saved = vec![f32::NAN; t * b * LSTM_SAVED * h];
                let (mut hn, mut cn) = (vec![0.0; b * h], vec![0.0; b * h]);
                let seq = LstmSeq {
                    dims: d,
                    lengths,
                    w: &w,
                };
                let init = LstmStates { h: &h0, c: &c0 };
                let last = LstmStatesMut {
                    h: &mut hn,
                    c: &mut cn,
                };
                lstm_seq_forward(&seq, &gi, init, &mut saved, last, threads);
                let mut want = vec![f32::NAN; (t + 2) * b * h];
                lstm_seq_output(&d, lengths, &saved, &hn, &cn, &mut want);
                let mut y = vec![f32::NAN; t * b * h];
                let (mut hn2, mut cn2) = (vec![f32::NAN; b * h], vec![f32::NAN; b * h]);
                let last = LstmStatesMut {
                    h: &mut hn2,
                    c: &mut cn2,
                };
                lstm_seq_infer(&seq, &gi, init, &mut y, last, threads);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                y.extend_from_slice(&hn2);
                y.extend_from_slice(&cn2);
                assert_eq!(bits(&y), bits(&want), "b {b}, h {h}, {threads} threads");
            }
        }
    }

    /// Divided by hidden units (a small batch, two threads meeting at every step) and by rows
    /// (enough rows for each thread), the passes give one thread's bits, every position written.
    #[test]
    fn a_pass_divided_between_threads_has_one_threads_bits() {
        let cases: &[(usize, usize, &[usize], bool)] = if cfg!(miri) {
            &[(1, 64, &[2], true), (24, 2, &[2; 24], true)]
        } else {
            &[
                (2, 64, &[3, 2], false),
                (2, 64, &[3, 0], true),
                (
                    25,
                    4,
                    &[
                        3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0,
                    ],
                    true,
                ),
            ]
        };
        for &(b, h, lengths, reverse) in cases {
            let d = LstmDims {
                t: lengths[0],
                b,
                h,
                reverse,
            };
            let one = pass(&d, lengths, 1);
            assert!(one.iter().flatten().all(|v| v.is_finite()));
            let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
                v.iter()
                    .map(|x| x.iter().map(|f| f.to_bits()).collect())
                    .collect()
            };
            assert_eq!(
                bits(&pass(&d, lengths, 2)),
                bits(&one),
                "b {b}, h {h}, reverse {reverse}: two threads"
            );
            // And at every vector width this CPU has (the products are fused chains at every
            // width, the gate arithmetic the same operations).
            if !cfg!(miri) {
                use super::super::wide::{level_lock, set_simd, simd, simd_available, Simd};
                let _levels = level_lock();
                let before = simd();
                for level in [Simd::Baseline, Simd::Avx2, Simd::Avx512] {
                    if level > simd_available() {
                        continue;
                    }
                    set_simd(level);
                    let got = pass(&d, lengths, 2);
                    set_simd(before);
                    assert_eq!(bits(&got), bits(&one), "b {b}, h {h}, {level:?}");
                }
            }
        }
    }
}
