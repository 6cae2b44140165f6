//! Recurrent cells and the LSTM over a sequence, each one recorded op.
//!
//! [`Tensor::lstm_cell`] and [`Tensor::gru_cell`] fuse a step's gate nonlinearities and state
//! update (the matrix products before them are ordinary `addmm`s); [`Tensor::lstm_sequence`]
//! runs the recurrence over a whole sequence in one node, so that backward through time makes
//! one matrix–vector product per step and the recurrent weight's gradient is one GEMM.
//!
//! On the host the forward keeps each step's gate activations (and the sequence op its previous
//! states) in the arena beside the output — only when the op is recorded: under `no_grad`, or
//! when no input requires grad, a forward-only kernel keeps nothing. Under `create_graph` the cells' rules are written in
//! tensor ops, so they can be differentiated again; the sequence op's is not (as PyTorch's cuDNN
//! LSTM) and says so: the cell loop differentiates twice. On a CUDA device each op is the same
//! formula composed of tensor ops.

use std::sync::Arc;

use arenagrad_alloc::BufId;
use arenagrad_exec::cpu::rnn::{self as k, LstmDims, LSTM_SAVED};
use smallvec::smallvec;

use super::half::promoted_of;
use super::{check_pair, Ctx, Grads, Op};
use crate::error::{GraphError, Result};
use crate::host::try_filled;
use crate::shape::Shape;
use crate::{Device, Graph, Tensor};

/// What an LSTM-over-a-sequence node keeps besides its inputs `[gi, w_hh, h0, c0]`.
pub(crate) struct LstmSeqNode {
    pub dims: LstmDims,
    /// Each row's length, longest first.
    pub lengths: Arc<[usize]>,
    /// `[t, b, 7h]`, see [`LSTM_SAVED`]; `None` when the op is not recorded (its node is then
    /// only counted, [`crate::flops`]).
    pub saved: Option<BufId>,
}

fn shape_of<'g>(op: &'static str, t: &Tensor<'g>, rank: usize) -> Result<Vec<usize>> {
    let s = t.try_shape()?;
    if s.len() != rank {
        return Err(GraphError::BadArgument {
            op,
            what: match rank {
                2 => "expects matrices (states [batch, hidden], weights [gates·hidden, hidden])",
                _ => "expects [time, batch, 4·hidden] input projections",
            },
        });
    }
    Ok(s.to_vec())
}

fn mismatch(op: &'static str, lhs: &[usize], rhs: &[usize]) -> GraphError {
    GraphError::ShapeMismatch {
        op,
        lhs: lhs.to_vec(),
        rhs: rhs.to_vec(),
    }
}

/// Options of [`Tensor::lstm_sequence`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LstmSequenceOptions<'a> {
    /// Each batch row's length (all ≤ the sequence's, longest first), as PyTorch's packed
    /// sequences: a row takes part in its first `len` steps, its output is zero past them and
    /// its final state is the one at its own end. `None`: every row runs the whole sequence.
    pub lengths: Option<&'a [usize]>,
    /// Run each row from its last position to its first (a bidirectional layer's second
    /// direction).
    pub reverse: bool,
    /// Compose the recurrence of elementary ops (`addmm` and [`Tensor::lstm_cell`] per step)
    /// instead of one fused node: slower, but its backward can be recorded (`create_graph`).
    /// A CUDA device always runs this form.
    pub unfused: bool,
}

impl<'g> Tensor<'g> {
    /// One LSTM step from its gate pre-activations: `self` is `[b, 4h]` = `x·W_ihᵀ + b_ih +
    /// h·W_hhᵀ + b_hh` in PyTorch's gate order `[i, f, g, o]`, `c` the previous cell state
    /// `[b, h]`. Returns the new `(h, c)`: `c' = σ(f)·c + σ(i)·tanh(g)`, `h' = σ(o)·tanh(c')`.
    pub fn lstm_cell(self, c: Tensor<'g>) -> Result<(Tensor<'g>, Tensor<'g>)> {
        let op = "lstm_cell";
        if Tensor::any_half(&[Some(self), Some(c)])? {
            let out = promoted_of(op, &[self, c])?;
            let (z, c) = (self.widened(out)?, c.widened(out)?);
            let (h, c) = {
                let _f32 = self.g.suspend_autocast();
                z.lstm_cell(c)?
            };
            return Ok((h.to_dtype(out)?, c.to_dtype(out)?));
        }
        check_pair(op, &self, &c)?;
        let (zs, cs) = (shape_of(op, &self, 2)?, shape_of(op, &c, 2)?);
        if zs[0] != cs[0] || zs[1] != 4 * cs[1] {
            return Err(mismatch(op, &zs, &cs));
        }
        let (b, h) = (cs[0], cs[1]);
        let both = if self.device() == Device::Cpu {
            let mut guard = self.g.inner();
            let i = &mut *guard;
            let (dtype, zb) = {
                let n = i.node(op, self.id)?;
                (n.dtype, n.buf)
            };
            let cb = i.node(op, c.id)?.buf;
            let shape: Shape = smallvec![2, b, h];
            let inputs = [self.id, c.id];
            let id = if i.records(&inputs) {
                let saved = i.alloc(op, dtype, b * 5 * h)?;
                let out = i.alloc(op, dtype, 2 * b * h)?;
                with_float!(dtype, T, {
                    let (s, [z, cp]) = i.split_mut::<T, 2>(op, saved, [zb, cb])?;
                    k::lstm_cell_forward(z, cp, h, s);
                    let (o, [s, cp]) = i.split_mut::<T, 2>(op, out, [saved, cb])?;
                    k::lstm_cell_output(s, cp, h, o);
                });
                i.push(
                    shape,
                    dtype,
                    out,
                    Op::LstmCell { saved: Some(saved) },
                    &inputs,
                )
            } else {
                // Nothing will be differentiated: no record of the activations.
                let out = i.alloc(op, dtype, 2 * b * h)?;
                with_float!(dtype, T, {
                    let (o, [z, cp]) = i.split_mut::<T, 2>(op, out, [zb, cb])?;
                    k::lstm_cell_infer(z, cp, h, o);
                });
                i.push(shape, dtype, out, Op::LstmCell { saved: None }, &inputs)
            };
            drop(guard);
            self.g.handle(id)
        } else {
            let (h2, c2) = lstm_cell_composed(self, c)?;
            self.g.stack(&[h2, c2], 0)?
        };
        let mut parts = both.unbind(0)?.into_iter();
        match (parts.next(), parts.next()) {
            (Some(h), Some(c)) => Ok((h, c)),
            _ => unreachable!("a [2, b, h] tensor unbinds into two"),
        }
    }

    /// One GRU step: `self` is `gi = x·W_ihᵀ + b_ih`, `gh = h·W_hhᵀ + b_hh` (both `[b, 3h]`, gate
    /// order `[r, z, n]`), `h` the previous state `[b, h]`. Returns PyTorch's `h' = (1 − z)·n +
    /// z·h` with `r = σ(gi_r + gh_r)`, `z = σ(gi_z + gh_z)`, `n = tanh(gi_n + r·gh_n)`.
    pub fn gru_cell(self, gh: Tensor<'g>, h: Tensor<'g>) -> Result<Tensor<'g>> {
        let op = "gru_cell";
        if Tensor::any_half(&[Some(self), Some(gh), Some(h)])? {
            return Tensor::lower([self, gh, h], |[x, gh, h]| x.gru_cell(gh, h));
        }
        check_pair(op, &self, &gh)?;
        check_pair(op, &self, &h)?;
        let (is, gs, hs) = (
            shape_of(op, &self, 2)?,
            shape_of(op, &gh, 2)?,
            shape_of(op, &h, 2)?,
        );
        if is != gs {
            return Err(mismatch(op, &is, &gs));
        }
        if is[0] != hs[0] || is[1] != 3 * hs[1] {
            return Err(mismatch(op, &is, &hs));
        }
        if self.device() != Device::Cpu {
            return gru_cell_composed(self, gh, h);
        }
        let (b, hd) = (hs[0], hs[1]);
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (dtype, ib) = {
            let n = i.node(op, self.id)?;
            (n.dtype, n.buf)
        };
        let (gb, hb) = (i.node(op, gh.id)?.buf, i.node(op, h.id)?.buf);
        let shape: Shape = smallvec![b, hd];
        let inputs = [self.id, gh.id, h.id];
        let out = i.alloc(op, dtype, b * hd)?;
        let id = if i.records(&inputs) {
            let saved = i.alloc(op, dtype, b * 3 * hd)?;
            with_float!(dtype, T, {
                let (s, [gi, ghs]) = i.split_mut::<T, 2>(op, saved, [ib, gb])?;
                k::gru_cell_forward(gi, ghs, hd, s);
                let (o, [s, hp]) = i.split_mut::<T, 2>(op, out, [saved, hb])?;
                k::gru_cell_output(s, hp, hd, o);
            });
            i.push(
                shape,
                dtype,
                out,
                Op::GruCell { saved: Some(saved) },
                &inputs,
            )
        } else {
            // Nothing will be differentiated: no record of the gates.
            with_float!(dtype, T, {
                let (o, [gi, ghs, hp]) = i.split_mut::<T, 3>(op, out, [ib, gb, hb])?;
                k::gru_cell_infer(gi, ghs, hp, hd, o);
            });
            i.push(shape, dtype, out, Op::GruCell { saved: None }, &inputs)
        };
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// An LSTM over a whole sequence as one op (cuDNN's shape of the computation): `self` is
    /// the input projections `gi = x·W_ihᵀ + b_ih + b_hh`, `[t, b, 4h]`; `w_hh` `[4h, h]`; `h0`,
    /// `c0` `[b, h]`. Returns `(output [t, b, h], h_n, c_n)`, the hidden state at every position
    /// and the final states.
    ///
    /// Backward through the fused node cannot be recorded (`create_graph` is an error naming
    /// the op, as for PyTorch's cuDNN LSTM); [`LstmSequenceOptions::unfused`] composes the
    /// same recurrence of steps that can be.
    pub fn lstm_sequence(
        self,
        w_hh: Tensor<'g>,
        h0: Tensor<'g>,
        c0: Tensor<'g>,
        opts: LstmSequenceOptions<'_>,
    ) -> Result<(Tensor<'g>, Tensor<'g>, Tensor<'g>)> {
        let op = "lstm_sequence";
        if Tensor::any_half(&[Some(self), Some(w_hh), Some(h0), Some(c0)])? {
            let out = promoted_of(op, &[self, w_hh, h0, c0])?;
            let wide = [self, w_hh, h0, c0].map(|t| t.widened(out));
            let [x, w, h, c] = wide;
            let (x, w, h, c) = (x?, w?, h?, c?);
            let (y, h, c) = {
                let _f32 = self.g.suspend_autocast();
                x.lstm_sequence(w, h, c, opts)?
            };
            return Ok((y.to_dtype(out)?, h.to_dtype(out)?, c.to_dtype(out)?));
        }
        for t in [&w_hh, &h0, &c0] {
            check_pair(op, &self, t)?;
        }
        let gs = shape_of(op, &self, 3)?;
        let (ws, hs, cs) = (
            shape_of(op, &w_hh, 2)?,
            shape_of(op, &h0, 2)?,
            shape_of(op, &c0, 2)?,
        );
        let (t, b, hd) = (gs[0], gs[1], hs[1]);
        if hs != cs {
            return Err(mismatch(op, &hs, &cs));
        }
        if gs[1] != hs[0] || gs[2] != 4 * hd {
            return Err(mismatch(op, &gs, &hs));
        }
        if ws != [4 * hd, hd] {
            return Err(mismatch(op, &ws, &[4 * hd, hd]));
        }
        // No row or no hidden unit: nothing to compute, however long the sequence. The kernels
        // return at once (no walk over t steps of nothing), and no list is made per row.
        let empty = b == 0 || hd == 0;
        let lengths: Arc<[usize]> = match opts.lengths {
            None if empty => Arc::from(&[][..]),
            None => vec![t; b].into(),
            Some(l) => {
                if l.len() != b {
                    return Err(GraphError::ShapeMismatch {
                        op,
                        lhs: gs.clone(),
                        rhs: vec![l.len()],
                    });
                }
                if l.iter().any(|&v| v > t) {
                    return Err(GraphError::BadArgument {
                        op,
                        what: "a length exceeds the sequence's",
                    });
                }
                if l.windows(2).any(|w| w[0] < w[1]) {
                    return Err(GraphError::BadArgument {
                        op,
                        what: "lengths must be sorted longest first",
                    });
                }
                l.into()
            }
        };
        let dims = LstmDims {
            t,
            b,
            h: hd,
            reverse: opts.reverse,
        };
        if hd == 0 && (opts.unfused || self.device() != Device::Cpu) {
            // Every tensor here is empty: the inputs are the outputs' values (the composed form
            // would walk t steps of empty ops).
            return Ok((self, h0, c0));
        }
        let y = if self.device() == Device::Cpu && !opts.unfused {
            let mut guard = self.g.inner();
            let i = &mut *guard;
            let (dtype, gib) = {
                let n = i.node(op, self.id)?;
                (n.dtype, n.buf)
            };
            let [wb, h0b, c0b] = [w_hh.id, h0.id, c0.id].map(|id| i.node(op, id).map(|n| n.buf));
            let (wb, h0b, c0b) = (wb?, h0b?, c0b?);
            let inputs = [self.id, w_hh.id, h0.id, c0.id];
            if !i.records(&inputs) {
                // Nothing will be differentiated: no record (seven values per unit and
                // position), and the output and final states written where they are returned
                // (no copies sliced from one buffer).
                let y = i.alloc(op, dtype, t * b * hd)?;
                let (hnb, cnb) = (i.alloc(op, dtype, b * hd)?, i.alloc(op, dtype, b * hd)?);
                let threads = i.threads;
                with_float!(dtype, T, {
                    let mut hn = vec![<T as arenagrad_exec::Float>::ZERO; b * hd];
                    let mut cn = vec![<T as arenagrad_exec::Float>::ZERO; b * hd];
                    let (ys, [gi, w, h0s, c0s]) =
                        i.split_mut::<T, 4>(op, y, [gib, wb, h0b, c0b])?;
                    let seq = k::LstmSeq {
                        dims,
                        lengths: &lengths,
                        w,
                    };
                    let init = k::LstmStates { h: h0s, c: c0s };
                    let last = k::LstmStatesMut {
                        h: &mut hn,
                        c: &mut cn,
                    };
                    k::lstm_seq_infer(&seq, gi, init, ys, last, threads);
                    i.split_mut::<T, 0>(op, hnb, [])?.0.copy_from_slice(&hn);
                    i.split_mut::<T, 0>(op, cnb, [])?.0.copy_from_slice(&cn);
                });
                let node = LstmSeqNode {
                    dims,
                    lengths,
                    saved: None,
                };
                // Pushed as the op (counted, not recorded), the final states as constants.
                let y = i.push(
                    smallvec![t, b, hd],
                    dtype,
                    y,
                    Op::LstmSeq(Arc::new(node)),
                    &inputs,
                );
                let hn = i.push(smallvec![b, hd], dtype, hnb, Op::Leaf, &inputs);
                let cn = i.push(smallvec![b, hd], dtype, cnb, Op::Leaf, &inputs);
                drop(guard);
                return Ok((self.g.handle(y), self.g.handle(hn), self.g.handle(cn)));
            }
            let saved = i.alloc(op, dtype, t * b * LSTM_SAVED * hd)?;
            let out = i.alloc(op, dtype, (t + 2) * b * hd)?;
            let threads = i.threads;
            with_float!(dtype, T, {
                let mut hn = vec![<T as arenagrad_exec::Float>::ZERO; b * hd];
                let mut cn = vec![<T as arenagrad_exec::Float>::ZERO; b * hd];
                let (s, [gi, w, h0s, c0s]) = i.split_mut::<T, 4>(op, saved, [gib, wb, h0b, c0b])?;
                let seq = k::LstmSeq {
                    dims,
                    lengths: &lengths,
                    w,
                };
                let init = k::LstmStates { h: h0s, c: c0s };
                let last = k::LstmStatesMut {
                    h: &mut hn,
                    c: &mut cn,
                };
                k::lstm_seq_forward(&seq, gi, init, s, last, threads);
                let (y, [s]) = i.split_mut::<T, 1>(op, out, [saved])?;
                k::lstm_seq_output(&dims, &lengths, s, &hn, &cn, y);
            });
            let node = LstmSeqNode {
                dims,
                lengths,
                saved: Some(saved),
            };
            let shape: Shape = smallvec![t + 2, b, hd];
            let id = i.push(shape, dtype, out, Op::LstmSeq(Arc::new(node)), &inputs);
            drop(guard);
            self.g.handle(id)
        } else {
            lstm_sequence_composed(self, w_hh, h0, c0, &dims, &lengths)?
        };
        Ok((
            y.slice(0, 0, t)?,
            y.slice(0, t, t + 1)?.reshape(&[b as isize, hd as isize])?,
            y.slice(0, t + 1, t + 2)?
                .reshape(&[b as isize, hd as isize])?,
        ))
    }
}

/// Splits `[b, k·h]` into its `k` gate blocks.
fn gates<'g>(z: Tensor<'g>, k: usize) -> Result<Vec<Tensor<'g>>> {
    z.chunk(k, -1)
}

/// The LSTM's activated gates `[i, f, g, o]` and new cell state, in tensor ops.
fn lstm_gates_composed<'g>(z: Tensor<'g>, c: Tensor<'g>) -> Result<([Tensor<'g>; 4], Tensor<'g>)> {
    let a = gates(z, 4)?;
    let (i, f, g, o) = (
        a[0].sigmoid()?,
        a[1].sigmoid()?,
        a[2].tanh()?,
        a[3].sigmoid()?,
    );
    let c2 = f.mul(c)?.add(i.mul(g)?)?;
    Ok(([i, f, g, o], c2))
}

/// The LSTM cell in tensor ops: `(h', c')`.
fn lstm_cell_composed<'g>(z: Tensor<'g>, c: Tensor<'g>) -> Result<(Tensor<'g>, Tensor<'g>)> {
    let ([_, _, _, o], c2) = lstm_gates_composed(z, c)?;
    Ok((o.mul(c2.tanh()?)?, c2))
}

/// The GRU cell in tensor ops.
fn gru_cell_composed<'g>(gi: Tensor<'g>, gh: Tensor<'g>, h: Tensor<'g>) -> Result<Tensor<'g>> {
    let (a, b) = (gates(gi, 3)?, gates(gh, 3)?);
    let r = a[0].add(b[0])?.sigmoid()?;
    let z = a[1].add(b[1])?.sigmoid()?;
    let n = a[2].add(r.mul(b[2])?)?.tanh()?;
    // (1 − z)·n + z·h = n + z·(h − n)
    n.add(z.mul(h.sub(n)?)?)
}

/// The sequence op in tensor ops (a CUDA device's forward, or asked for by
/// [`LstmSequenceOptions::unfused`]): [`Graph::recurrence`] with an LSTM step.
fn lstm_sequence_composed<'g>(
    gi: Tensor<'g>,
    w: Tensor<'g>,
    h0: Tensor<'g>,
    c0: Tensor<'g>,
    d: &LstmDims,
    lengths: &[usize],
) -> Result<Tensor<'g>> {
    let (t, b, hd) = (d.t, d.b, d.h);
    let g = gi.g;
    let flat = gi.reshape(&[(t * b) as isize, (4 * hd) as isize])?;
    let step = |x: Tensor<'g>, s: &[Tensor<'g>]| -> Result<Vec<Tensor<'g>>> {
        let (h, c) = x.addmm_t(s[0], w, false, true)?.lstm_cell(s[1])?;
        Ok(vec![h, c])
    };
    let (out, last) = g.recurrence(flat, vec![h0, c0], t, lengths, d.reverse, step)?;
    let end: Vec<Tensor<'g>> = last
        .iter()
        .map(|s| s.reshape(&[1, b as isize, hd as isize]))
        .collect::<Result<_>>()?;
    g.concat(&[out, end[0], end[1]], 0)
}

impl Graph {
    /// A recurrence over a batch of sequences, each running to its own length, as a Rust loop
    /// of steps (what the recurrent layers' step-by-step forms are made of). `inputs` holds
    /// each position's rows, `[t·b, k]` position-major; `state` the initial states, each `[b,
    /// ·]`; `lengths` each row's length, longest first (`b` of them, each ≤ `t`). At each step
    /// `step(x, states)` gets the rows still inside their lengths (the first `nb`) and their
    /// states, and returns their new states, the first of which is the step's output (`[nb,
    /// h]`). With `reverse` each row runs from its last position to its first.
    ///
    /// Returns the outputs `[t, b, h]` (zero past each row's length) and the final states, each
    /// at its row's own end.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph, GraphError};
    /// let g = Graph::new();
    /// // A running sum over two sequences of lengths 3 and 1.
    /// let x = g.from_f64(&[1.0, 10.0, 2.0, 0.0, 3.0, 0.0], &[6, 1], DType::F64)?;
    /// let h0 = g.zeros(&[2, 1], DType::F64)?;
    /// let (out, last) = g.recurrence(x, vec![h0], 3, &[3, 1], false, |x, s| {
    ///     Ok::<_, GraphError>(vec![s[0].add(x)?])
    /// })?;
    /// assert_eq!(out.to_vec::<f64>()?, vec![1.0, 10.0, 3.0, 0.0, 6.0, 0.0]);
    /// assert_eq!(last[0].to_vec::<f64>()?, vec![6.0, 10.0]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn recurrence<'g, E, F>(
        &'g self,
        inputs: Tensor<'g>,
        state: Vec<Tensor<'g>>,
        t: usize,
        lengths: &[usize],
        reverse: bool,
        mut step: F,
    ) -> std::result::Result<(Tensor<'g>, Vec<Tensor<'g>>), E>
    where
        E: From<GraphError>,
        F: FnMut(Tensor<'g>, &[Tensor<'g>]) -> std::result::Result<Vec<Tensor<'g>>, E>,
    {
        let op = "recurrence";
        self.owns(op, &inputs)?;
        self.owns_all(op, &state)?;
        let b = lengths.len();
        let rows = inputs.try_shape()?;
        if rows.len() != 2 || t.checked_mul(b) != Some(rows[0]) {
            return Err(GraphError::ShapeMismatch {
                op,
                lhs: rows.to_vec(),
                rhs: vec![t, b],
            }
            .into());
        }
        if state.is_empty()
            || lengths.iter().any(|&l| l > t)
            || lengths.windows(2).any(|w| w[0] < w[1])
        {
            return Err(GraphError::BadArgument {
                op,
                what: "needs a state, and lengths of at most t, longest first",
            }
            .into());
        }
        for s0 in &state {
            if s0.try_shape()?.first() != Some(&b) {
                return Err(GraphError::ShapeMismatch {
                    op,
                    lhs: s0.try_shape()?.to_vec(),
                    rhs: vec![b],
                }
                .into());
            }
        }
        let mut state = state;
        // At least one node a step (its rows' index_select): more steps than an iteration can
        // hold (2^40 of zero-width inputs, say) are an error before the walk, not an abort or
        // a panic hours into it.
        let steps = lengths.first().copied().unwrap_or(0);
        self.inner().reserve_nodes(op, steps, &[t, b])?;
        let mut outs = Vec::new();
        // For each (position, row), the index of its output among the steps' outputs stacked;
        // past the row's length, the zero row appended last.
        let mut at = try_filled(op, t * b, usize::MAX, &[t, b])?;
        let mut count = 0;
        for s in 0..t {
            let nb = lengths.partition_point(|&l| l > s);
            if nb == 0 {
                break;
            }
            let idx: Vec<usize> = (0..nb)
                .map(|r| {
                    let p = if reverse { lengths[r] - 1 - s } else { s };
                    at[p * b + r] = count + r;
                    p * b + r
                })
                .collect();
            count += nb;
            let running: Vec<Tensor<'g>> = if nb == b {
                state.clone()
            } else {
                state
                    .iter()
                    .map(|v| v.slice(0, 0, nb))
                    .collect::<Result<_>>()?
            };
            let new = step(inputs.index_select(0, &idx)?, &running)?;
            if new.len() != state.len() {
                return Err(GraphError::BadArgument {
                    op,
                    what: "the step returned another number of states than it was given",
                }
                .into());
            }
            outs.push(new[0]);
            state = if nb == b {
                new
            } else {
                new.iter()
                    .zip(&state)
                    .map(|(n, old)| self.concat(&[*n, old.slice(0, nb, b)?], 0))
                    .collect::<Result<_>>()?
            };
        }
        let out_shape = state[0].try_shape()?;
        let width = out_shape[1..].iter().product::<usize>();
        let (dtype, dev) = (state[0].dtype(), state[0].device());
        outs.push(
            self.full_on(&[1, width], 0.0, dtype, dev)?.reshape(
                &std::iter::once(1)
                    .chain(out_shape[1..].iter().copied())
                    .map(|d| d as isize)
                    .collect::<Vec<_>>(),
            )?,
        );
        for v in &mut at {
            if *v == usize::MAX {
                *v = count;
            }
        }
        let idx = at;
        let out = self.concat(&outs, 0)?.index_select(0, &idx)?;
        let shape: Vec<isize> = [t, b]
            .into_iter()
            .chain(out_shape[1..].iter().copied())
            .map(|d| d as isize)
            .collect();
        Ok((out.reshape(&shape)?, state))
    }
}

/// The LSTM cell's rule in tensor ops: `(dz, dc_prev)` from the gradients of `h'` and `c'`.
fn lstm_cell_grad_composed<'g>(
    z: Tensor<'g>,
    c: Tensor<'g>,
    dh: Tensor<'g>,
    dc: Tensor<'g>,
) -> Result<(Tensor<'g>, Tensor<'g>)> {
    let ([i, f, g, o], c2) = lstm_gates_composed(z, c)?;
    let tc = c2.tanh()?;
    let one_minus_sq = |v: Tensor<'g>| v.mul(v)?.neg()?.shift(1.0);
    let dsig = |v: Tensor<'g>| v.mul(v.neg()?.shift(1.0)?);
    let dct = dc.add(dh.mul(o)?.mul(one_minus_sq(tc)?)?)?;
    let dz = z.g.concat(
        &[
            dct.mul(g)?.mul(dsig(i)?)?,
            dct.mul(c)?.mul(dsig(f)?)?,
            dct.mul(i)?.mul(one_minus_sq(g)?)?,
            dh.mul(tc)?.mul(dsig(o)?)?,
        ],
        -1,
    )?;
    Ok((dz, dct.mul(f)?))
}

/// The GRU cell's rule in tensor ops: `(dgi, dgh, dh)`.
fn gru_cell_grad_composed<'g>(
    gi: Tensor<'g>,
    gh: Tensor<'g>,
    h: Tensor<'g>,
    gy: Tensor<'g>,
) -> Result<(Tensor<'g>, Tensor<'g>, Tensor<'g>)> {
    let (a, b) = (gates(gi, 3)?, gates(gh, 3)?);
    let r = a[0].add(b[0])?.sigmoid()?;
    let z = a[1].add(b[1])?.sigmoid()?;
    let n = a[2].add(r.mul(b[2])?)?.tanh()?;
    let dsig = |v: Tensor<'g>| v.mul(v.neg()?.shift(1.0)?);
    let dn = gy
        .mul(z.neg()?.shift(1.0)?)?
        .mul(n.mul(n)?.neg()?.shift(1.0)?)?;
    let dz = gy.mul(h.sub(n)?)?.mul(dsig(z)?)?;
    let dr = dn.mul(b[2])?.mul(dsig(r)?)?;
    let dgi = gi.g.concat(&[dr, dz, dn], -1)?;
    let dgh = gi.g.concat(&[dr, dz, dn.mul(r)?], -1)?;
    Ok((dgi, dgh, gy.mul(z)?))
}

pub(crate) fn lstm_cell_backward<'g>(saved: Option<BufId>, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (z, cp) = (c.input(0), c.input(1));
    if c.create_graph {
        let s = c.gy.try_shape()?;
        let (b, h) = (s[1] as isize, s[2] as isize);
        let dh = c.gy.slice(0, 0, 1)?.reshape(&[b, h])?;
        let dc = c.gy.slice(0, 1, 2)?.reshape(&[b, h])?;
        let (dz, dcp) = lstm_cell_grad_composed(z, cp, dh, dc)?;
        return Ok(smallvec![Some(dz), Some(dcp)]);
    }
    let op = "lstm_cell";
    let saved = saved.expect("invariant: a recorded LSTM step keeps its activations");
    let zshape = z.try_shape()?;
    let cshape = cp.try_shape()?;
    let h = cshape[1];
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let (dtype, cb) = {
        let n = i.node(op, cp.id)?;
        (n.dtype, n.buf)
    };
    let gb = i.node(op, c.gy.id)?.buf;
    let dz = i.alloc(op, dtype, zshape.iter().product())?;
    let dcp = i.alloc(op, dtype, cshape.iter().product())?;
    with_float!(dtype, T, {
        let (d, [gy, s, cps]) = i.split_mut::<T, 3>(op, dz, [gb, saved, cb])?;
        k::lstm_cell_grad_gates(gy, s, cps, h, d);
        let (d, [gy, s]) = i.split_mut::<T, 2>(op, dcp, [gb, saved])?;
        k::lstm_cell_grad_c(gy, s, h, d);
    });
    let dz = i.push_on(Device::Cpu, zshape, dtype, dz, Op::Leaf, &[]);
    let dcp = i.push_on(Device::Cpu, cshape, dtype, dcp, Op::Leaf, &[]);
    drop(guard);
    Ok(smallvec![Some(c.g.handle(dz)), Some(c.g.handle(dcp))])
}

pub(crate) fn gru_cell_backward<'g>(saved: Option<BufId>, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (gi, gh, hp) = (c.input(0), c.input(1), c.input(2));
    if c.create_graph {
        let (a, b, d) = gru_cell_grad_composed(gi, gh, hp, c.gy)?;
        return Ok(smallvec![Some(a), Some(b), Some(d)]);
    }
    let op = "gru_cell";
    let saved = saved.expect("invariant: a recorded GRU step keeps its gates");
    let gshape = gi.try_shape()?;
    let hshape = hp.try_shape()?;
    let h = hshape[1];
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let dtype = i.node(op, gi.id)?.dtype;
    let [ghb, hb, gb] = [gh.id, hp.id, c.gy.id].map(|id| i.node(op, id).map(|n| n.buf));
    let (ghb, hb, gb) = (ghb?, hb?, gb?);
    let n3: usize = gshape.iter().product();
    let dgi = i.alloc(op, dtype, n3)?;
    let dgh = i.alloc(op, dtype, n3)?;
    let dh = i.alloc(op, dtype, hshape.iter().product())?;
    with_float!(dtype, T, {
        let (d, [gy, s, ghs, hps]) = i.split_mut::<T, 4>(op, dgi, [gb, saved, ghb, hb])?;
        k::gru_cell_grad_gi(gy, s, ghs, hps, h, d);
        let (d, [dgis, s]) = i.split_mut::<T, 2>(op, dgh, [dgi, saved])?;
        k::gru_cell_grad_gh(dgis, s, h, d);
        let (d, [gy, s]) = i.split_mut::<T, 2>(op, dh, [gb, saved])?;
        k::gru_cell_grad_h(gy, s, h, d);
    });
    let dgi = i.push_on(Device::Cpu, gshape.clone(), dtype, dgi, Op::Leaf, &[]);
    let dgh = i.push_on(Device::Cpu, gshape, dtype, dgh, Op::Leaf, &[]);
    let dh = i.push_on(Device::Cpu, hshape, dtype, dh, Op::Leaf, &[]);
    drop(guard);
    Ok(smallvec![
        Some(c.g.handle(dgi)),
        Some(c.g.handle(dgh)),
        Some(c.g.handle(dh))
    ])
}

pub(crate) fn lstm_seq_backward<'g>(nd: &LstmSeqNode, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let op = "lstm_sequence";
    if c.create_graph {
        return Err(GraphError::BadArgument {
            op,
            what: "backward through the fused LSTM cannot be recorded (create_graph); \
                   ask for LstmSequenceOptions::unfused to differentiate it twice",
        });
    }
    let (gi, w, h0) = (c.input(0), c.input(1), c.input(2));
    let (gshape, wshape, hshape) = (gi.try_shape()?, w.try_shape()?, h0.try_shape()?);
    let d = nd.dims;
    let saved = nd
        .saved
        .expect("invariant: a recorded LSTM sequence keeps its record");
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let (dtype, wb) = {
        let n = i.node(op, w.id)?;
        (n.dtype, n.buf)
    };
    let gb = i.node(op, c.gy.id)?.buf;
    let threads = i.threads;
    let dgi = i.alloc(op, dtype, gshape.iter().product())?;
    let dw = i.alloc(op, dtype, wshape.iter().product())?;
    let dh0 = i.alloc(op, dtype, d.b * d.h)?;
    let dc0 = i.alloc(op, dtype, d.b * d.h)?;
    with_float!(dtype, T, {
        let mut dhs = vec![<T as arenagrad_exec::Float>::ZERO; d.b * d.h];
        let mut dcs = vec![<T as arenagrad_exec::Float>::ZERO; d.b * d.h];
        let (dg, [gy, s, ws]) = i.split_mut::<T, 3>(op, dgi, [gb, saved, wb])?;
        let seq = k::LstmSeq {
            dims: d,
            lengths: &nd.lengths,
            w: ws,
        };
        let d0 = k::LstmStatesMut {
            h: &mut dhs,
            c: &mut dcs,
        };
        k::lstm_seq_backward(&seq, gy, s, dg, d0, threads);
        let (dws, [dg, s]) = i.split_mut::<T, 2>(op, dw, [dgi, saved])?;
        k::lstm_seq_grad_weight(&d, dg, s, dws, threads);
        let (o, []) = i.split_mut::<T, 0>(op, dh0, [])?;
        o.copy_from_slice(&dhs);
        let (o, []) = i.split_mut::<T, 0>(op, dc0, [])?;
        o.copy_from_slice(&dcs);
    });
    let dgi = i.push_on(Device::Cpu, gshape, dtype, dgi, Op::Leaf, &[]);
    let dw = i.push_on(Device::Cpu, wshape, dtype, dw, Op::Leaf, &[]);
    let dh0 = i.push_on(Device::Cpu, hshape.clone(), dtype, dh0, Op::Leaf, &[]);
    let dc0 = i.push_on(Device::Cpu, hshape, dtype, dc0, Op::Leaf, &[]);
    drop(guard);
    Ok(smallvec![
        Some(c.g.handle(dgi)),
        Some(c.g.handle(dw)),
        Some(c.g.handle(dh0)),
        Some(c.g.handle(dc0))
    ])
}
