//! Recurrent cells and layers with PyTorch's gate orders, parameter names and initialisation, so
//! that a PyTorch state dict loads by name.
//!
//! A cell is one step, called from an ordinary Rust loop (a sequence of any length, one
//! document at a time, a recursion over a tree). A layer runs a whole sequence: its input
//! projections for every position in one GEMM, then the recurrence — for the LSTM one fused
//! node per layer and direction ([`Tensor::lstm_sequence`]), for the GRU and the Elman RNN a
//! loop of fused steps. Batches of sequences of different lengths run each to its own length
//! ([`LSTM::forward_with`]'s `lengths`), as PyTorch's packed sequences. Run for inference
//! (grad mode off), an LSTM layer makes its projections a piece of a long sequence at a time,
//! each piece in a scope of its own: the same result, without four times the output held.

use arenagrad_graph::{DType, Graph, LstmSequenceOptions, Parameter, Tensor};

use crate::error::{config, input_shape, NnError, Result};
use crate::init::{Init, Nonlinearity};
use crate::module::{Module, Visitor};
use crate::Rng;

/// Options of the recurrent cells and layers (PyTorch's constructor arguments).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RnnConfig {
    /// Stacked layers (default 1; layers only).
    pub num_layers: usize,
    /// Add the biases `bias_ih`, `bias_hh` (default true).
    pub bias: bool,
    /// Inputs and outputs `[batch, time, features]` instead of `[time, batch, features]`
    /// (default false; layers only).
    pub batch_first: bool,
    /// Dropout on each layer's output but the last's, in training mode (default 0).
    pub dropout: f64,
    /// A second direction over each sequence reversed, its outputs beside the first's (default
    /// false; layers only).
    pub bidirectional: bool,
    /// The Elman RNN's nonlinearity (default tanh).
    pub nonlinearity: Nonlinearity,
    /// The parameters' dtype (default f32).
    pub dtype: DType,
    /// Run the LSTM's recurrence as a loop of steps instead of one fused node per layer: slower,
    /// but twice differentiable (`create_graph`). Default false.
    pub unfused: bool,
}

impl Default for RnnConfig {
    fn default() -> Self {
        RnnConfig {
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
            bidirectional: false,
            nonlinearity: Nonlinearity::Tanh,
            dtype: DType::F32,
            unfused: false,
        }
    }
}

/// One direction of one layer: `weight_ih [G·h, in]`, `weight_hh [G·h, h]`, `bias_ih`, `bias_hh`
/// `[G·h]`, for `G` gates.
#[derive(Debug)]
struct Weights {
    w_ih: Parameter,
    w_hh: Parameter,
    b_ih: Option<Parameter>,
    b_hh: Option<Parameter>,
}

impl Weights {
    /// PyTorch's initialisation: every parameter `U(−1/√h, 1/√h)`.
    fn new(
        gates: usize,
        input: usize,
        hidden: usize,
        cfg: &RnnConfig,
        rng: &mut Rng,
    ) -> Result<Self> {
        let k = 1.0 / (hidden as f64).sqrt();
        let init = Init::Uniform { low: -k, high: k };
        let mut make = |name: &str, shape: &[usize]| -> Result<Parameter> {
            Ok(Parameter::new(name, init.tensor(shape, cfg.dtype, rng)?))
        };
        let w_ih = make("weight_ih", &[gates * hidden, input])?;
        let w_hh = make("weight_hh", &[gates * hidden, hidden])?;
        let (b_ih, b_hh) = if cfg.bias {
            (
                Some(make("bias_ih", &[gates * hidden])?),
                Some(make("bias_hh", &[gates * hidden])?),
            )
        } else {
            (None, None)
        };
        Ok(Weights {
            w_ih,
            w_hh,
            b_ih,
            b_hh,
        })
    }

    fn visit(&self, v: &mut Visitor<'_>, suffix: &str) {
        v.param(&format!("weight_ih{suffix}"), &self.w_ih);
        v.param(&format!("weight_hh{suffix}"), &self.w_hh);
        if let (Some(bi), Some(bh)) = (&self.b_ih, &self.b_hh) {
            v.param(&format!("bias_ih{suffix}"), bi);
            v.param(&format!("bias_hh{suffix}"), bh);
        }
    }

    fn hidden(&self) -> usize {
        self.w_hh.shape()[1]
    }

    fn input(&self) -> usize {
        self.w_ih.shape()[1]
    }

    /// `x·W_ihᵀ + b` for rows `x` `[n, in]`, with `b` = `b_ih` (+ `b_hh` when `fold_hh`).
    fn input_proj<'g>(&self, g: &'g Graph, x: Tensor<'g>, fold_hh: bool) -> Result<Tensor<'g>> {
        let w = g.param(&self.w_ih)?;
        Ok(match (&self.b_ih, &self.b_hh) {
            (Some(bi), Some(bh)) => {
                let b = if fold_hh {
                    g.param(bi)?.add(g.param(bh)?)?
                } else {
                    g.param(bi)?
                };
                b.addmm_t(x, w, false, true)?
            }
            _ => x.matmul_t(w, false, true)?,
        })
    }

    /// `h·W_hhᵀ + b_hh`.
    fn hidden_proj<'g>(&self, g: &'g Graph, h: Tensor<'g>) -> Result<Tensor<'g>> {
        let w = g.param(&self.w_hh)?;
        Ok(match &self.b_hh {
            Some(bh) => g.param(bh)?.addmm_t(h, w, false, true)?,
            None => h.matmul_t(w, false, true)?,
        })
    }

    /// `x·W_ihᵀ + b_ih + h·W_hhᵀ + b_hh`: an LSTM or Elman step's pre-activations.
    fn both<'g>(&self, g: &'g Graph, x: Tensor<'g>, h: Tensor<'g>) -> Result<Tensor<'g>> {
        let gi = self.input_proj(g, x, true)?;
        Ok(gi.addmm_t(h, g.param(&self.w_hh)?, false, true)?)
    }
}

/// The error for an Elman nonlinearity other than tanh and relu (PyTorch's `ValueError`).
fn elman_refused(op: &'static str, f: Nonlinearity) -> NnError {
    config(
        op,
        format!(
            "unknown nonlinearity '{}': an Elman RNN applies 'tanh' or 'relu'",
            f.name()
        ),
    )
}

/// `Ok` for the nonlinearities an Elman cell applies.
fn check_elman(op: &'static str, f: Nonlinearity) -> Result<()> {
    match f {
        Nonlinearity::Tanh | Nonlinearity::ReLU => Ok(()),
        other => Err(elman_refused(op, other)),
    }
}

fn check_features(op: &'static str, cfg: &RnnConfig, input: usize, hidden: usize) -> Result<()> {
    if input == 0 || hidden == 0 {
        return Err(config(
            op,
            format!("sizes must be positive, got input {input}, hidden {hidden}"),
        ));
    }
    if !(0.0..1.0).contains(&cfg.dropout) {
        return Err(config(
            op,
            format!("dropout must be in [0, 1), got {}", cfg.dropout),
        ));
    }
    if cfg.num_layers == 0 {
        return Err(config(op, "num_layers must be positive"));
    }
    Ok(())
}

/// A step's input `[batch, in]` checked against the cell, and its state (zeros when `None`).
fn step_input<'g>(
    op: &'static str,
    g: &'g Graph,
    w: &Weights,
    x: Tensor<'g>,
    h: Option<Tensor<'g>>,
) -> Result<(usize, Tensor<'g>)> {
    let s = x.try_shape()?;
    if s.len() != 2 || s[1] != w.input() {
        return Err(input_shape(op, &format!("[batch, {}]", w.input()), &s));
    }
    let h = match h {
        Some(h) => h,
        None => g
            .zeros(&[s[0], w.hidden()], x.dtype())?
            .to_device(x.device())?,
    };
    Ok((s[0], h))
}

/// A cell type: its weights for `$gates` gates, constructors and size.
macro_rules! cell {
    ($(#[$doc:meta])* $t:ident, $gates:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $t {
            w: Weights,
            // What the Elman cell applies (the LSTM's and GRU's gates are their own).
            #[allow(dead_code)]
            nonlinearity: Nonlinearity,
        }

        impl $t {
            /// An f32 cell with biases (tanh for the Elman cell), initialised as PyTorch's.
            pub fn new(input: usize, hidden: usize, rng: &mut Rng) -> Result<Self> {
                Self::with_config(input, hidden, RnnConfig::default(), rng)
            }

            /// A cell with the given options (`bias`, `dtype`, and the Elman cell's
            /// `nonlinearity` apply).
            pub fn with_config(
                input: usize,
                hidden: usize,
                cfg: RnnConfig,
                rng: &mut Rng,
            ) -> Result<Self> {
                check_features(stringify!($t), &cfg, input, hidden)?;
                if $gates == 1 {
                    check_elman(stringify!($t), cfg.nonlinearity)?;
                }
                Ok($t {
                    w: Weights::new($gates, input, hidden, &cfg, rng)?,
                    nonlinearity: cfg.nonlinearity,
                })
            }

            /// Hidden units.
            pub fn hidden_size(&self) -> usize {
                self.w.hidden()
            }
        }
    };
}

cell!(
    /// An LSTM step (PyTorch's `LSTMCell`): `weight_ih [4h, in]`, `weight_hh [4h, h]`, gate order
    /// `[i, f, g, o]`.
    ///
    /// ```
    /// use arenagrad_nn::{DType, Graph, LSTMCell, Rng};
    /// let cell = LSTMCell::new(3, 5, &mut Rng::seed(0))?;
    /// let g = Graph::new();
    /// let mut state = None;
    /// for _ in 0..4 {
    ///     let x = g.ones(&[2, 3], DType::F32)?;
    ///     state = Some(cell.forward(&g, x, state)?);
    /// }
    /// let (h, _c) = state.unwrap();
    /// assert_eq!(h.shape().as_slice(), &[2, 5]);
    /// # Ok::<(), arenagrad_nn::NnError>(())
    /// ```
    LSTMCell,
    4
);

impl LSTMCell {
    /// One step from `x` `[batch, in]` and the state `(h, c)` (zeros when `None`): the new
    /// `(h, c)`.
    pub fn forward<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        state: Option<(Tensor<'g>, Tensor<'g>)>,
    ) -> Result<(Tensor<'g>, Tensor<'g>)> {
        let (h, c) = state.unzip();
        let (_, h) = step_input("LSTMCell", g, &self.w, x, h)?;
        let c = match c {
            Some(c) => c,
            None => h.scale(0.0)?,
        };
        Ok(self.w.both(g, x, h)?.lstm_cell(c)?)
    }
}

cell!(
    /// A GRU step (PyTorch's `GRUCell`): `weight_ih [3h, in]`, `weight_hh [3h, h]`, gate order
    /// `[r, z, n]`.
    GRUCell,
    3
);

impl GRUCell {
    /// One step from `x` `[batch, in]` and `h` (zeros when `None`): the new `h`.
    pub fn forward<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        h: Option<Tensor<'g>>,
    ) -> Result<Tensor<'g>> {
        let (_, h) = step_input("GRUCell", g, &self.w, x, h)?;
        let gi = self.w.input_proj(g, x, false)?;
        Ok(gi.gru_cell(self.w.hidden_proj(g, h)?, h)?)
    }
}

cell!(
    /// An Elman RNN step (PyTorch's `RNNCell`): `h' = tanh(x·W_ihᵀ + b_ih + h·W_hhᵀ + b_hh)` (or
    /// relu).
    RNNCell,
    1
);

impl RNNCell {
    /// One step from `x` `[batch, in]` and `h` (zeros when `None`): the new `h`.
    pub fn forward<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        h: Option<Tensor<'g>>,
    ) -> Result<Tensor<'g>> {
        let (_, h) = step_input("RNNCell", g, &self.w, x, h)?;
        elman(self.w.both(g, x, h)?, self.nonlinearity)
    }
}

fn elman(z: Tensor<'_>, f: Nonlinearity) -> Result<Tensor<'_>> {
    match f {
        Nonlinearity::Tanh => Ok(z.tanh()?),
        Nonlinearity::ReLU => Ok(z.relu()?),
        // Refused when the cell was made (`check_elman`).
        other => Err(elman_refused("RNNCell", other)),
    }
}

macro_rules! cell_module {
    ($t:ty) => {
        impl Module for $t {
            /// One step from a zero state (a cell is called with its state by its own
            /// `forward`; this is for visiting and loading parameters).
            fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
                Ok(<$t>::forward(self, g, x, None)?.into_h())
            }
            fn visit(&self, v: &mut Visitor<'_>) {
                self.w.visit(v, "");
            }
        }
    };
}

/// The hidden state of a step's result.
trait IntoH<'g> {
    fn into_h(self) -> Tensor<'g>;
}
impl<'g> IntoH<'g> for Tensor<'g> {
    fn into_h(self) -> Tensor<'g> {
        self
    }
}
impl<'g> IntoH<'g> for (Tensor<'g>, Tensor<'g>) {
    fn into_h(self) -> Tensor<'g> {
        self.0
    }
}
cell_module!(LSTMCell);
cell_module!(GRUCell);
cell_module!(RNNCell);

/// What a layer's forward returns: the output at every position `[time, batch, D·h]` (or
/// batch first), and the final states `[layers·D, batch, h]` (`D` = 2 when bidirectional);
/// `c_n` for the LSTM only.
#[derive(Debug, Clone, Copy)]
pub struct RnnOutput<'g> {
    /// The last layer's hidden state at every position (zero past a sequence's length).
    pub output: Tensor<'g>,
    /// Each layer's and direction's final hidden state, at each sequence's own end.
    pub h_n: Tensor<'g>,
    /// The LSTM's final cell states (`None` for the GRU and the RNN).
    pub c_n: Option<Tensor<'g>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Lstm,
    Gru,
    Elman(Nonlinearity),
}

impl Kind {
    fn gates(self) -> usize {
        match self {
            Kind::Lstm => 4,
            Kind::Gru => 3,
            Kind::Elman(_) => 1,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Lstm => "LSTM",
            Kind::Gru => "GRU",
            Kind::Elman(_) => "RNN",
        }
    }
}

/// The stacked layers shared by [`LSTM`], [`GRU`] and [`RNN`].
#[derive(Debug)]
struct Stack {
    kind: Kind,
    /// `layers[l][d]`: layer `l`, direction `d`.
    layers: Vec<Vec<Weights>>,
    cfg: RnnConfig,
    training: bool,
}

impl Stack {
    fn new(kind: Kind, input: usize, hidden: usize, cfg: RnnConfig, rng: &mut Rng) -> Result<Self> {
        check_features(kind.name(), &cfg, input, hidden)?;
        let dirs = if cfg.bidirectional { 2 } else { 1 };
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let inp = if l == 0 { input } else { dirs * hidden };
                (0..dirs)
                    .map(|_| Weights::new(kind.gates(), inp, hidden, &cfg, rng))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Stack {
            kind,
            layers,
            cfg,
            training: true,
        })
    }

    fn visit(&self, v: &mut Visitor<'_>) {
        for (l, dirs) in self.layers.iter().enumerate() {
            for (d, w) in dirs.iter().enumerate() {
                let rev = if d == 1 { "_reverse" } else { "" };
                w.visit(v, &format!("_l{l}{rev}"));
            }
        }
    }

    fn hidden(&self) -> usize {
        self.layers[0][0].hidden()
    }

    fn forward<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        h0: Option<Tensor<'g>>,
        c0: Option<Tensor<'g>>,
        lengths: Option<&[usize]>,
    ) -> Result<RnnOutput<'g>> {
        let op = self.kind.name();
        let input = self.layers[0][0].input();
        let s = x.try_shape()?;
        if s.len() != 3 || s[2] != input {
            let want = if self.cfg.batch_first {
                format!("[batch, time, {input}]")
            } else {
                format!("[time, batch, {input}]")
            };
            return Err(input_shape(op, &want, &s));
        }
        let x = if self.cfg.batch_first {
            x.transpose(0, 1)?
        } else {
            x
        };
        let (t, b) = if self.cfg.batch_first {
            (s[1], s[0])
        } else {
            (s[0], s[1])
        };
        let (hd, dirs) = (self.hidden(), self.layers[0].len());
        let states = self.layers.len() * dirs;
        let zeros = || -> Result<Tensor<'g>> {
            Ok(g.zeros(&[states, b, hd], x.dtype())?
                .to_device(x.device())?)
        };
        let want = [states, b, hd];
        let h0 = match h0 {
            Some(h) => h,
            None => zeros()?,
        };
        let c0 = match (self.kind, c0) {
            (Kind::Lstm, Some(c)) => Some(c),
            (Kind::Lstm, None) => Some(zeros()?),
            _ => None,
        };
        for s0 in [Some(h0), c0].into_iter().flatten() {
            let got = s0.try_shape()?;
            if got[..] != want {
                return Err(input_shape(op, &format!("{want:?} initial state"), &got));
            }
        }
        // Sort the batch longest first when the lengths are not; undo it at the end.
        let order: Option<Vec<usize>> = match lengths {
            Some(l) if l.len() != b => {
                return Err(config(
                    op,
                    format!("{} lengths for a batch of {b}", l.len()),
                ));
            }
            Some(l) if l.iter().any(|&v| v > t) => {
                return Err(config(
                    op,
                    format!("lengths {l:?} exceed the sequence's {t}"),
                ));
            }
            Some(l) if l.windows(2).any(|w| w[0] < w[1]) => {
                let mut o: Vec<usize> = (0..b).collect();
                o.sort_by_key(|&r| std::cmp::Reverse(l[r]));
                Some(o)
            }
            _ => None,
        };
        let sorted: Option<Vec<usize>> = match (&order, lengths) {
            (Some(o), Some(l)) => Some(o.iter().map(|&r| l[r]).collect()),
            (None, Some(l)) => Some(l.to_vec()),
            _ => None,
        };
        let (mut x, mut h0, mut c0) = (x, h0, c0);
        if let Some(o) = &order {
            x = x.index_select(1, o)?;
            h0 = h0.index_select(1, o)?;
            c0 = c0.map(|c| c.index_select(1, o)).transpose()?;
        }
        let (mut hn, mut cn) = (Vec::new(), Vec::new());
        for (l, layer) in self.layers.iter().enumerate() {
            let in_f = x.try_shape()?[2];
            let rows = x.reshape(&[(t * b) as isize, in_f as isize])?;
            let mut outs = Vec::new();
            for (d, w) in layer.iter().enumerate() {
                let k = (l * dirs + d) as isize;
                let pick = |s: Tensor<'g>| -> Result<Tensor<'g>> {
                    Ok(s.slice(0, k as usize, k as usize + 1)?
                        .reshape(&[b as isize, hd as isize])?)
                };
                let (hs, cs) = (pick(h0)?, c0.map(pick).transpose()?);
                let opts = LstmSequenceOptions {
                    lengths: sorted.as_deref(),
                    reverse: d == 1,
                    unfused: self.cfg.unfused,
                };
                let (y, h, c) = match (self.kind, cs) {
                    (Kind::Lstm, Some(cs)) => match inference_pieces(g, x, t, b, hd) {
                        Some(per) => {
                            let (y, h, c) =
                                lstm_by_pieces(g, w, rows, (hs, cs), [t, b, hd], per, opts)?;
                            (y, h, Some(c))
                        }
                        None => {
                            let gi = w.input_proj(g, rows, true)?;
                            let gi = gi.reshape(&[t as isize, b as isize, (4 * hd) as isize])?;
                            let (y, h, c) = gi.lstm_sequence(g.param(&w.w_hh)?, hs, cs, opts)?;
                            (y, h, Some(c))
                        }
                    },
                    (kind, _) => {
                        let gi = w.input_proj(g, rows, !matches!(kind, Kind::Gru))?;
                        let (y, h) = steps(g, w, kind, gi, hs, [t, b], &opts)?;
                        (y, h, None)
                    }
                };
                outs.push(y);
                hn.push(h);
                cn.extend(c);
            }
            x = if outs.len() == 1 {
                outs[0]
            } else {
                g.concat(&outs, 2)?
            };
            if l + 1 < self.layers.len() {
                x = x.dropout(self.cfg.dropout, self.training)?;
            }
        }
        let stack = |v: &[Tensor<'g>]| -> Result<Tensor<'g>> {
            let s = g.stack(v, 0)?;
            Ok(match &order {
                Some(o) => s.index_select(1, &inverse(o))?,
                None => s,
            })
        };
        let h_n = stack(&hn)?;
        let c_n = if cn.is_empty() {
            None
        } else {
            Some(stack(&cn)?)
        };
        if let Some(o) = &order {
            x = x.index_select(1, &inverse(o))?;
        }
        let output = if self.cfg.batch_first {
            x.transpose(0, 1)?
        } else {
            x
        };
        Ok(RnnOutput { output, h_n, c_n })
    }
}

/// Bytes of input projections an LSTM layer makes at once when it runs for inference.
const INFERENCE_PIECE_BYTES: usize = 4 << 20;

/// Positions per piece when an LSTM layer runs for inference (nothing recorded) over a sequence
/// whose input projections `[t, b, 4h]` would take more than [`INFERENCE_PIECE_BYTES`]; `None`
/// to run it whole. Training keeps the whole projection (backward reads it); inference need
/// not: the projections of a validation batch of long documents were four times the layer's
/// output, held until the batch's scope ended.
fn inference_pieces(g: &Graph, x: Tensor<'_>, t: usize, b: usize, hd: usize) -> Option<usize> {
    if g.is_grad_enabled() || x.device() != arenagrad_graph::Device::Cpu {
        return None;
    }
    let row = b * 4 * hd * x.dtype().size();
    let per = (INFERENCE_PIECE_BYTES / row.max(1)).max(1);
    (per < t).then_some(per)
}

/// One LSTM layer's direction for inference, `per` positions at a time: each piece's input
/// projections and recurrence in a scope of their own, its output written into `y` in place,
/// its final states carried to the next piece (from the last piece to the first when the
/// direction runs reversed). A row's length is cut to each piece (lengths sorted longest first
/// stay so): inside a piece it runs to its own end, and a piece it does not reach passes its
/// state on unchanged, so the result is the whole sequence's. `(h0, c0)` are the initial states.
fn lstm_by_pieces<'g>(
    g: &'g Graph,
    w: &Weights,
    rows: Tensor<'g>,
    (h0, c0): (Tensor<'g>, Tensor<'g>),
    [t, b, hd]: [usize; 3],
    per: usize,
    opts: LstmSequenceOptions<'_>,
) -> Result<(Tensor<'g>, Tensor<'g>, Tensor<'g>)> {
    let y = g.zeros(&[t, b, hd], rows.dtype())?;
    let (mut h, mut c) = (h0, c0);
    let mut starts: Vec<usize> = (0..t).step_by(per).collect();
    if opts.reverse {
        starts.reverse();
    }
    for p0 in starts {
        let p1 = (p0 + per).min(t);
        let lengths: Option<Vec<usize>> = opts.lengths.map(|l| {
            l.iter()
                .map(|&v| v.saturating_sub(p0).min(p1 - p0))
                .collect()
        });
        (h, c) = g.try_scope(|g| -> Result<(Tensor<'g>, Tensor<'g>)> {
            let gi = w.input_proj(g, rows.slice(0, p0 * b, p1 * b)?, true)?;
            let gi = gi.reshape(&[(p1 - p0) as isize, b as isize, (4 * hd) as isize])?;
            let piece = LstmSequenceOptions {
                lengths: lengths.as_deref(),
                ..opts
            };
            let (yp, hp, cp) = gi.lstm_sequence(g.param(&w.w_hh)?, h, c, piece)?;
            y.slice_write(0, p0, yp)?;
            Ok((hp, cp))
        })?;
    }
    Ok((y, h, c))
}

fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; order.len()];
    for (k, &r) in order.iter().enumerate() {
        inv[r] = k;
    }
    inv
}

/// A GRU or Elman direction as a loop of fused steps over `gi` `[t·b, G·h]`
/// ([`Graph::recurrence`]) of `t` positions of `b` rows: the outputs `[t, b, h]` (zero past each
/// length) and the final state.
fn steps<'g>(
    g: &'g Graph,
    w: &Weights,
    kind: Kind,
    gi: Tensor<'g>,
    h0: Tensor<'g>,
    [t, b]: [usize; 2],
    opts: &LstmSequenceOptions<'_>,
) -> Result<(Tensor<'g>, Tensor<'g>)> {
    let full = vec![t; b];
    let lengths = opts.lengths.unwrap_or(&full);
    let step = |x: Tensor<'g>, s: &[Tensor<'g>]| -> Result<Vec<Tensor<'g>>> {
        let hp = s[0];
        Ok(vec![match kind {
            Kind::Gru => x.gru_cell(w.hidden_proj(g, hp)?, hp)?,
            Kind::Elman(f) => elman(x.addmm_t(hp, g.param(&w.w_hh)?, false, true)?, f)?,
            Kind::Lstm => return Err(config("LSTM", "an LSTM runs lstm_sequence, not steps")),
        }])
    };
    let (out, last) = g.recurrence(gi, vec![h0], t, lengths, opts.reverse, step)?;
    Ok((out, last[0]))
}

macro_rules! layer {
    ($(#[$doc:meta])* $t:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $t {
            stack: Stack,
        }

        impl $t {
            /// One layer of f32 with biases, initialised as PyTorch's.
            pub fn new(input: usize, hidden: usize, rng: &mut Rng) -> Result<Self> {
                Self::with_config(input, hidden, RnnConfig::default(), rng)
            }

            /// Layers with the given options.
            pub fn with_config(input: usize, hidden: usize, cfg: RnnConfig, rng: &mut Rng) -> Result<Self> {
                let kind = match $kind {
                    Kind::Elman(_) => {
                        check_elman(stringify!($t), cfg.nonlinearity)?;
                        Kind::Elman(cfg.nonlinearity)
                    }
                    k => k,
                };
                Ok($t {
                    stack: Stack::new(kind, input, hidden, cfg, rng)?,
                })
            }

            /// Hidden units.
            pub fn hidden_size(&self) -> usize {
                self.stack.hidden()
            }

            /// The options it was made with.
            pub fn config(&self) -> &RnnConfig {
                &self.stack.cfg
            }
        }

        impl Module for $t {
            /// The output at every position, from zero initial states.
            fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Result<Tensor<'g>> {
                Ok(self.stack.forward(g, x, None, None, None)?.output)
            }
            fn visit(&self, v: &mut Visitor<'_>) {
                self.stack.visit(v);
            }
            fn set_training(&mut self, training: bool) {
                self.stack.training = training;
            }
        }
    };
}

layer!(
    /// A stacked LSTM over sequences (PyTorch's `nn.LSTM`): parameters `weight_ih_l{k}`,
    /// `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}` (and `…_reverse` for the second
    /// direction). Each layer and direction is one fused node ([`Tensor::lstm_sequence`]).
    ///
    /// ```
    /// use arenagrad_nn::{DType, Graph, Rng, RnnConfig, LSTM};
    /// let cfg = RnnConfig { num_layers: 2, bidirectional: true, ..Default::default() };
    /// let lstm = LSTM::with_config(3, 4, cfg, &mut Rng::seed(0))?;
    /// let g = Graph::new();
    /// let x = g.ones(&[5, 2, 3], DType::F32)?; // [time, batch, features]
    /// // The second sequence is 2 long: its outputs stop there, its final state is at step 2.
    /// let out = lstm.forward_with(&g, x, None, Some(&[5, 2]))?;
    /// assert_eq!(out.output.shape().as_slice(), &[5, 2, 8]);
    /// assert_eq!(out.h_n.shape().as_slice(), &[4, 2, 4]);
    /// # Ok::<(), arenagrad_nn::NnError>(())
    /// ```
    LSTM,
    Kind::Lstm
);

layer!(
    /// A stacked GRU over sequences (PyTorch's `nn.GRU`), its parameters named as the
    /// [`LSTM`]'s; each step is one fused node ([`Tensor::gru_cell`]).
    GRU,
    Kind::Gru
);

layer!(
    /// A stacked Elman RNN over sequences (PyTorch's `nn.RNN`), tanh or relu.
    RNN,
    Kind::Elman(Nonlinearity::Tanh)
);

impl LSTM {
    /// The sequence `x` from the initial states `(h0, c0)` `[layers·D, batch, h]` (zeros when
    /// `None`), each batch row running to its own length when `lengths` are given (in any
    /// order; PyTorch's `pack_padded_sequence` with `enforce_sorted=False`).
    pub fn forward_with<'g>(
        &self,
        g: &'g Graph,
        x: Tensor<'g>,
        state: Option<(Tensor<'g>, Tensor<'g>)>,
        lengths: Option<&[usize]>,
    ) -> Result<RnnOutput<'g>> {
        let (h0, c0) = state.unzip();
        self.stack.forward(g, x, h0, c0, lengths)
    }
}

/// `forward_with` of the layers whose state is `h` alone.
macro_rules! forward_with_h {
    ($($t:ident),*) => {$(
        impl $t {
            /// The sequence `x` from `h0` `[layers·D, batch, h]` (zeros when `None`), each batch
            /// row running to its own length when `lengths` are given (in any order).
            pub fn forward_with<'g>(
                &self,
                g: &'g Graph,
                x: Tensor<'g>,
                h0: Option<Tensor<'g>>,
                lengths: Option<&[usize]>,
            ) -> Result<RnnOutput<'g>> {
                self.stack.forward(g, x, h0, None, lengths)
            }
        }
    )*};
}
forward_with_h!(GRU, RNN);
