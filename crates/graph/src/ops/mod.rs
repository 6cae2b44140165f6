//! The op set. One file per family: each holds the forward methods, the shape rules and the
//! backward rule side by side, so a reader sees an op and its derivative together.
//!
//! Backward rules are written in differentiable tensor ops, so that with `create_graph` they
//! record a graph of their own and higher-order gradients follow. Without `create_graph` (grad mode
//! off), the hot rules take a fused path instead — one kernel computing `gy · f'(x)` — since nothing
//! needs to be differentiated again.
//!
//! Adding an elementwise op: a row in `arenagrad_exec::ops` and its `create_graph` arm in
//! `unary.rs`. Adding another op: a variant of [`Op`] (its name in [`Op::name`], whether it holds
//! heap memory in [`Op::holds_heap`]), a forward method in the family's file that computes the
//! output and calls `Inner::push`, and its backward rule there, called from [`backward`]; and
//! its FLOP count in `crate::flops`. All four matches (`holds_heap`, `name`, `backward` and the
//! count) are exhaustive, with no catch-all, so the compiler lists what is missing.

use std::sync::Arc;

use arenagrad_exec::cpu::ReduceOp;
use arenagrad_exec::{BinaryOp, UnaryOp};
use smallvec::SmallVec;

use crate::error::{GraphError, Result};
use crate::graph::NodeId;
use crate::{Graph, Parameter, Tensor};

pub(crate) mod attention;
pub(crate) mod binary;
pub(crate) mod checkpoint;
pub(crate) mod conv;
pub(crate) mod custom;
pub(crate) mod einsum;
pub(crate) mod half;
pub(crate) mod integer;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod rearrange;
pub(crate) mod reduce;
pub(crate) mod rnn;
pub(crate) mod shape;
pub(crate) mod softmax;
pub(crate) mod sort;
pub(crate) mod unary;

/// What produced a node, with what its backward rule needs besides the inputs and the output.
#[derive(Clone)]
pub(crate) enum Op {
    /// A leaf: user data, a constant, or anything made while not recording.
    Leaf,
    /// A leaf holding a parameter's value; its gradient is accumulated into the parameter.
    Param(Parameter),
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Sum or max over the masked axes.
    Reduce {
        op: ReduceOp,
        mask: Arc<[bool]>,
        keepdim: bool,
    },
    /// Batched matrix product of op(a)·op(b), where op transposes the last two axes when set.
    Matmul {
        ta: bool,
        tb: bool,
    },
    /// A host convolution's product over a batch, image-major: inputs `[w [o, k], cols [k, n·l]]`
    /// and optionally a bias `[o]`; output `[n, o, l]` (see [`conv`]).
    Conv2d {
        n: usize,
        l: usize,
    },
    /// `c + op(a)·op(b)` for matrices; inputs are `[c, a, b]` (see [`Tensor::addmm_t`]).
    Addmm {
        ta: bool,
        tb: bool,
    },
    Reshape,
    Permute(Arc<[usize]>),
    BroadcastTo,
    Concat {
        axis: usize,
    },
    Slice {
        axis: usize,
        start: usize,
    },
    /// Slice's adjoint: zeros of the output's shape with the input placed at `start`.
    SliceBackward {
        axis: usize,
        start: usize,
    },
    IndexSelect {
        axis: usize,
        idx: Arc<[usize]>,
    },
    /// Index-select's adjoint.
    IndexAdd {
        axis: usize,
        idx: Arc<[usize]>,
    },
    Gather {
        axis: usize,
        idx: Arc<[usize]>,
    },
    /// Gather's adjoint.
    ScatterAdd {
        axis: usize,
        idx: Arc<[usize]>,
    },
    Softmax {
        axis: usize,
        log: bool,
    },
    /// Layer or RMS normalisation over trailing axes, or group normalisation; inputs `[x,
    /// weight?, bias?]` (see [`norm`]).
    Norm(norm::NormNode),
    /// Scaled dot-product attention; inputs `[q, k, v, mask?]` (see [`attention`]).
    Attention(Arc<attention::AttnNode>),
    /// A fused LSTM step; inputs `[z, c_prev]`, output `[2, b, h]` = `h', c'` (see [`rnn`]).
    /// `saved` (the activations) is `None` when the step is not recorded: nothing is kept for
    /// a backward that cannot come, and the op is only counted.
    LstmCell {
        saved: Option<arenagrad_alloc::BufId>,
    },
    /// A fused GRU step; inputs `[gi, gh, h]`; `saved` as [`Op::LstmCell`]'s.
    GruCell {
        saved: Option<arenagrad_alloc::BufId>,
    },
    /// An LSTM over a sequence; inputs `[gi, w_hh, h0, c0]`, output `[t + 2, b, h]`.
    LstmSeq(Arc<rnn::LstmSeqNode>),
    /// Inverted dropout with the decisions of `seed`; its backward is the same dropout of the
    /// gradient.
    Dropout {
        p: f64,
        seed: u64,
    },
    /// Running sums along `axis`, from the end when `reverse` (the adjoint of the other).
    Cumsum {
        axis: usize,
        reverse: bool,
    },
    /// The mean cross-entropy of `[m, c]` rows against `targets`; inputs are `[rows, lsm]`, the
    /// rows' log-softmax (see [`softmax`]).
    CrossEntropy {
        targets: Arc<[usize]>,
    },
    /// `cond ? a : b`; inputs are `[cond, a, b]`.
    Where,
    /// im2col over `[N, C, H, W]` and its adjoint col2im; see [`conv`].
    Unfold(Arc<arenagrad_exec::cpu::Window>),
    Fold(Arc<arenagrad_exec::cpu::Window>),
    /// im2col of a whole batch into one `[C·kh·kw, N·L]` matrix (images side by side), and its
    /// adjoint; how a convolution on the host becomes one GEMM.
    UnfoldBatch(Arc<arenagrad_exec::cpu::Window>),
    FoldBatch(Arc<arenagrad_exec::cpu::Window>),
    /// A host transposed convolution in one node: inputs `[x [n, o, h, w], w [o, k], bias?]`,
    /// the window that of the convolution it transposes (over the output); see
    /// [`conv`]'s `host_conv`.
    ConvTranspose(Arc<arenagrad_exec::cpu::Window>),
    /// A host convolution in one node that keeps no patch matrix: inputs `[x [n, c, h, w],
    /// w [o, k], bias?]`, output `[n, o, l]`; see [`conv`]'s `host_conv`.
    ConvPatches(Arc<arenagrad_exec::cpu::Window>),
    /// `out[i] = x[idx[i]]` over flat indices kept in the arena (max pooling), and its adjoint.
    MaxPool2d {
        idx: arenagrad_alloc::BufId,
    },
    MaxPool2dBackward {
        idx: arenagrad_alloc::BufId,
    },
    /// A user-defined op.
    Custom(Arc<dyn custom::CustomOp>),
    /// A checkpointed block: backward runs it again (see [`checkpoint`]).
    Checkpoint(Arc<checkpoint::CheckpointNode>),
    /// A copy from another device.
    ToDevice {
        from: crate::Device,
    },
    /// A conversion from another dtype.
    Cast {
        from: arenagrad_exec::DType,
    },
}

impl Op {
    /// Whether the op holds heap memory (an `Arc`), which the node store lets go of at the
    /// reset. Exhaustive, so that a new variant has to say.
    #[inline(always)]
    pub fn holds_heap(&self) -> bool {
        match self {
            Op::Leaf
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Matmul { .. }
            | Op::Conv2d { .. }
            | Op::Addmm { .. }
            | Op::Reshape
            | Op::BroadcastTo
            | Op::Concat { .. }
            | Op::Slice { .. }
            | Op::SliceBackward { .. }
            | Op::Softmax { .. }
            | Op::Cumsum { .. }
            | Op::Dropout { .. }
            | Op::Norm(_)
            | Op::LstmCell { .. }
            | Op::GruCell { .. }
            | Op::Where
            | Op::MaxPool2d { .. }
            | Op::MaxPool2dBackward { .. }
            | Op::ToDevice { .. }
            | Op::Cast { .. } => false,
            Op::Param(_)
            | Op::Reduce { .. }
            | Op::Permute(_)
            | Op::IndexSelect { .. }
            | Op::IndexAdd { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Unfold(_)
            | Op::Fold(_)
            | Op::UnfoldBatch(_)
            | Op::FoldBatch(_)
            | Op::ConvTranspose(_)
            | Op::ConvPatches(_)
            | Op::CrossEntropy { .. }
            | Op::Attention(_)
            | Op::LstmSeq(_)
            | Op::Checkpoint(_)
            | Op::Custom(_) => true,
        }
    }

    /// The op's name, as errors and the program format spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf => "leaf",
            Op::Param(_) => "param",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Reduce {
                op: ReduceOp::Sum, ..
            } => "sum",
            Op::Reduce {
                op: ReduceOp::Max, ..
            } => "max",
            Op::Matmul { .. } => "matmul",
            Op::Addmm { .. } => "addmm",
            Op::Conv2d { .. } => "conv2d",
            Op::Reshape => "reshape",
            Op::Permute(_) => "permute",
            Op::BroadcastTo => "broadcast",
            Op::Concat { .. } => "concat",
            Op::Slice { .. } => "slice",
            Op::SliceBackward { .. } => "slice_backward",
            Op::IndexSelect { .. } => "index_select",
            Op::IndexAdd { .. } => "index_add",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Softmax { log: false, .. } => "softmax",
            Op::Softmax { log: true, .. } => "log_softmax",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::Attention(_) => "scaled_dot_product_attention",
            Op::Dropout { .. } => "dropout",
            Op::Norm(n) if n.rms => "rms_norm",
            Op::Norm(n) if n.group => "group_norm",
            Op::Norm(_) => "layer_norm",
            Op::LstmCell { .. } => "lstm_cell",
            Op::GruCell { .. } => "gru_cell",
            Op::LstmSeq(_) => "lstm_sequence",
            Op::Cumsum { reverse: false, .. } => "cumsum",
            Op::Cumsum { reverse: true, .. } => "cumsum_reverse",
            Op::Where => "where",
            Op::Custom(c) => c.name(),
            Op::Checkpoint(_) => "checkpoint",
            Op::Unfold(_) => "unfold",
            Op::Fold(_) => "fold",
            Op::UnfoldBatch(_) => "unfold_batch",
            Op::FoldBatch(_) => "fold_batch",
            Op::ConvTranspose(_) => "conv_transpose2d",
            Op::ConvPatches(_) => "conv2d",
            Op::MaxPool2d { .. } => "max_pool2d",
            Op::MaxPool2dBackward { .. } => "max_pool2d_backward",
            Op::ToDevice { .. } => "to_device",
            Op::Cast { .. } => "to_dtype",
        }
    }
}

/// What a backward rule sees.
pub(crate) struct Ctx<'g> {
    pub g: &'g Graph,
    /// The node's output.
    pub out: Tensor<'g>,
    /// The node's inputs.
    pub inputs: SmallVec<[NodeId; 2]>,
    /// The gradient arriving at the output.
    pub gy: Tensor<'g>,
    /// Whether the rule's ops are being recorded (higher-order gradients).
    pub create_graph: bool,
    /// Whether a rule may add a parameter's gradient straight into the parameter (a plain
    /// backward: nothing recorded, no gradients asked for by [`crate::grad`]).
    pub into_params: bool,
}

impl<'g> Ctx<'g> {
    pub fn input(&self, k: usize) -> Tensor<'g> {
        self.g.handle(self.inputs[k])
    }
}

/// Gradients for each input (None: no gradient flows to that input).
pub(crate) type Grads<'g> = SmallVec<[Option<Tensor<'g>>; 3]>;

/// Runs the backward rule of `op`. Exhaustive, with no catch-all: a new variant without a rule
/// does not compile.
pub(crate) fn backward<'g>(op: &Op, c: &Ctx<'g>) -> Result<Grads<'g>> {
    match op {
        Op::Leaf | Op::Param(_) => Ok(SmallVec::new()),
        Op::Unary(u) => unary::backward(*u, c),
        Op::Binary(b) => binary::backward(*b, c),
        Op::Reduce { op, mask, keepdim } => reduce::backward(*op, mask, *keepdim, c),
        Op::Matmul { ta, tb } => matmul::backward(*ta, *tb, c),
        Op::Addmm { ta, tb } => matmul::addmm_backward(*ta, *tb, c),
        Op::Conv2d { n, l } => conv::conv_gemm_backward(*n, *l, c),
        Op::Softmax { axis, log } => softmax::backward(*axis, *log, c),
        Op::CrossEntropy { targets } => softmax::cross_entropy_backward(targets, c),
        Op::Norm(n) => norm::backward(n, c),
        Op::Dropout { p, seed } => Ok(smallvec::smallvec![Some(c.gy.dropout_seeded(*p, *seed)?)]),
        Op::Attention(a) => attention::backward(a, c),
        Op::LstmCell { saved } => rnn::lstm_cell_backward(*saved, c),
        Op::GruCell { saved } => rnn::gru_cell_backward(*saved, c),
        Op::LstmSeq(n) => rnn::lstm_seq_backward(n, c),
        Op::Cumsum { axis, reverse } => Ok(smallvec::smallvec![Some(c.gy.scan(*axis, !*reverse)?)]),
        Op::Where => binary::select_backward(c),
        Op::Custom(op) => custom::backward(op, c),
        // The backward walk runs the block again instead (`autodiff`).
        Op::Checkpoint(_) => Err(GraphError::BadArgument {
            op: "checkpoint",
            what: "a checkpoint's gradient comes from running its block again",
        }),
        Op::Unfold(w) => conv::unfold_backward(w, c),
        Op::Fold(w) => conv::fold_backward(w, c),
        Op::UnfoldBatch(w) => conv::unfold_batch_backward(w, c),
        Op::FoldBatch(w) => conv::fold_batch_backward(w, c),
        Op::ConvTranspose(w) => conv::conv_transpose_backward(w, c),
        Op::ConvPatches(w) => conv::conv_patches_backward(w, c),
        Op::MaxPool2d { idx } => conv::take_backward(*idx, c),
        Op::MaxPool2dBackward { idx } => conv::put_backward(*idx, c),
        Op::ToDevice { from } => Ok(smallvec::smallvec![Some(c.gy.to_device(*from)?)]),
        Op::Cast { from } => half::cast_backward(*from, c),
        Op::Reshape => shape::reshape_backward(c),
        Op::Permute(p) => shape::permute_backward(p, c),
        Op::BroadcastTo => shape::broadcast_backward(c),
        Op::Concat { axis } => shape::concat_backward(*axis, c),
        Op::Slice { axis, start } => shape::slice_backward(*axis, *start, c),
        Op::SliceBackward { axis, start } => shape::slice_backward_backward(*axis, *start, c),
        Op::IndexSelect { axis, idx } => shape::index_select_backward(*axis, idx, c),
        Op::IndexAdd { axis, idx } => shape::index_add_backward(*axis, idx, c),
        Op::Gather { axis, idx } => shape::gather_backward(*axis, idx, c),
        Op::ScatterAdd { axis, idx } => shape::scatter_add_backward(*axis, idx, c),
    }
}

/// Checks that two tensors can meet in one op: same graph, device and dtype.
pub(crate) fn check_pair(op: &'static str, a: &Tensor<'_>, b: &Tensor<'_>) -> Result<()> {
    let (da, db) = pair_dtypes(op, a, b)?;
    if da != db {
        return Err(GraphError::DTypeMismatch {
            op,
            lhs: da,
            rhs: db,
        });
    }
    Ok(())
}

/// The two operands' dtypes, once they are known to be of one graph and on one device.
pub(crate) fn pair_dtypes(
    op: &'static str,
    a: &Tensor<'_>,
    b: &Tensor<'_>,
) -> Result<(arenagrad_exec::DType, arenagrad_exec::DType)> {
    a.g.owns(op, b)?;
    let (da, db) = {
        let i = a.g.inner.borrow();
        let (na, nb) = (i.node(op, a.id)?, i.node(op, b.id)?);
        if na.device() != nb.device() {
            return Err(GraphError::DeviceMismatch {
                op,
                lhs: na.device(),
                rhs: nb.device(),
            });
        }
        (na.dtype, nb.dtype)
    };
    Ok((da, db))
}
