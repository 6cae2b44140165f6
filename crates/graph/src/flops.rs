//! Counting floating-point work: each op's forward as it runs, each node's backward as its rule
//! runs, per op kind, since the graph's last reset (one iteration's work).
//!
//! The counts are formulas of the shapes, not instruction counts: a matrix product `[m, k]·[k,
//! n]` is `2·m·n·k` (a multiply and an add per term, PyTorch's convention), its backward that
//! once more for each operand that needs a gradient; a convolution is the GEMM it lowers to;
//! attention its two products (`4·l·s·d` a head) and the softmax between. Elementwise ops count
//! one per output element (a softmax five, a normalisation seven), reductions one per input
//! element; moving data (reshape, slice, concat, gather, …) counts nothing. Work inside a
//! backward rule counts once, as that node's backward, whatever ops the rule runs; a
//! checkpointed block's second run, a forward, counts as forward work.

use crate::ops::Op;
use arenagrad_exec::cpu::ReduceOp;
use arenagrad_exec::{BinaryOp, UnaryOp};

/// One op kind's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpFlops {
    /// The op's name, as errors and the program format spell it.
    pub op: &'static str,
    /// Floating-point operations of its forward runs.
    pub forward: u64,
    /// Of its backward rules.
    pub backward: u64,
}

/// The floating-point work since the graph's last reset, per op kind ([`crate::Graph::stats`]).
///
/// ```
/// use arenagrad_graph::{DType, Graph};
/// let g = Graph::new();
/// let a = g.leaf(&[1.0; 6], &[2, 3], DType::F32)?;
/// let b = g.leaf(&[1.0; 12], &[3, 4], DType::F32)?;
/// a.matmul(b)?.sum()?.backward()?;
/// let f = g.stats().flops;
/// let mm = f.of("matmul").unwrap();
/// assert_eq!(mm.forward, 2 * 2 * 3 * 4); // 2·m·n·k
/// assert_eq!(mm.backward, 2 * mm.forward); // one product for each operand's gradient
/// assert_eq!(f.of("sum").unwrap().forward, 8); // one per element summed
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlopStats {
    /// Each op kind that did work, in the order it first did.
    pub by_op: Vec<OpFlops>,
}

impl FlopStats {
    /// Forward work, all ops.
    pub fn forward(&self) -> u64 {
        self.by_op.iter().map(|o| o.forward).sum()
    }

    /// Backward work, all ops.
    pub fn backward(&self) -> u64 {
        self.by_op.iter().map(|o| o.backward).sum()
    }

    /// Forward and backward.
    pub fn total(&self) -> u64 {
        self.forward() + self.backward()
    }

    /// One op kind's counts, if it did any work.
    pub fn of(&self, op: &str) -> Option<OpFlops> {
        self.by_op.iter().copied().find(|o| o.op == op)
    }
}

/// The graph's running counts: the elementwise ops (the most frequent, and the cheapest, so
/// their count must cost next to nothing) in tables indexed by their code, the others by name.
#[derive(Debug)]
pub(crate) struct FlopCounter {
    stats: FlopStats,
    unary: Vec<[u64; 2]>,
    binary: Vec<[u64; 2]>,
}

impl Default for FlopCounter {
    fn default() -> Self {
        FlopCounter {
            stats: FlopStats::default(),
            unary: vec![[0; 2]; UnaryOp::KINDS.len()],
            binary: vec![[0; 2]; BinaryOp::KINDS.len()],
        }
    }
}

impl FlopCounter {
    /// A unary op's work: `side` 0 forward, 1 backward.
    #[inline(always)]
    pub fn unary(&mut self, op: UnaryOp, side: usize, n: u64) {
        if let Some(c) = self.unary.get_mut(op.code() as usize) {
            c[side] += n;
        }
    }

    /// A binary op's work.
    #[inline(always)]
    pub fn binary(&mut self, op: BinaryOp, side: usize, n: u64) {
        if let Some(c) = self.binary.get_mut(op.code() as usize) {
            c[side] += n;
        }
    }

    #[inline]
    pub fn add(&mut self, op: &'static str, forward: u64, backward: u64) {
        if forward == 0 && backward == 0 {
            return;
        }
        // Few kinds per graph: a short scan for the name's pointer (an op's name is one
        // literal), then for its bytes.
        let by = &mut self.stats.by_op;
        let at = by
            .iter()
            .position(|o| std::ptr::eq(o.op, op))
            .or_else(|| by.iter().position(|o| o.op == op));
        match at {
            Some(k) => {
                by[k].forward += forward;
                by[k].backward += backward;
            }
            None => by.push(OpFlops {
                op,
                forward,
                backward,
            }),
        }
    }

    pub fn clear(&mut self) {
        self.stats.by_op.clear();
        self.unary.iter_mut().for_each(|c| *c = [0; 2]);
        self.binary.iter_mut().for_each(|c| *c = [0; 2]);
    }

    pub fn stats(&self) -> FlopStats {
        let mut all = FlopCounter {
            stats: self.stats.clone(),
            unary: Vec::new(),
            binary: Vec::new(),
        };
        for (op, c) in UnaryOp::KINDS.iter().zip(&self.unary) {
            all.add(op.name(), c[0], c[1]);
        }
        for (op, c) in BinaryOp::KINDS.iter().zip(&self.binary) {
            all.add(op.name(), c[0], c[1]);
        }
        all.stats
    }
}

/// What a node's count needs: its output's shape and each input's shape and whether it needs a
/// gradient.
pub(crate) struct Shapes<'a> {
    pub out: &'a [usize],
    pub inputs: &'a [(&'a [usize], bool)],
}

fn numel(s: &[usize]) -> u64 {
    s.iter().map(|&d| d as u64).product()
}

/// `(m, k, n, batch)` of a product of `a` and `b`, transposed as asked (the batch of the
/// larger operand; a matmul takes the output's, which broadcasting may make larger still).
fn mkn(a: &[usize], b: &[usize], ta: bool, tb: bool) -> (u64, u64, u64, u64) {
    let r = a.len();
    if r < 2 || b.len() < 2 {
        return (0, 0, 0, 0);
    }
    let (m, k) = if ta {
        (a[r - 1], a[r - 2])
    } else {
        (a[r - 2], a[r - 1])
    };
    let rb = b.len();
    let n = if tb { b[rb - 2] } else { b[rb - 1] };
    let batch = numel(&a[..r - 2]).max(numel(&b[..rb - 2]));
    (m as u64, k as u64, n as u64, batch)
}

/// `(forward, backward)` of one node. The backward figure is what its rule does when it runs.
pub(crate) fn of(op: &Op, s: &Shapes<'_>) -> (u64, u64) {
    let out = numel(s.out);
    let input = |k: usize| s.inputs.get(k).map_or(0, |x| numel(x.0));
    let needs = |k: usize| s.inputs.get(k).is_some_and(|x| x.1);
    // Per input that needs a gradient, `each` of work.
    let per_needing = |each: u64| (0..s.inputs.len()).filter(|&k| needs(k)).count() as u64 * each;
    match op {
        Op::Leaf
        | Op::Param(_)
        | Op::Reshape
        | Op::Permute(_)
        | Op::BroadcastTo
        | Op::Concat { .. }
        | Op::Slice { .. }
        | Op::SliceBackward { .. }
        | Op::IndexSelect { .. }
        | Op::IndexAdd { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Unfold(_)
        | Op::Fold(_)
        | Op::UnfoldBatch(_)
        | Op::FoldBatch(_)
        | Op::MaxPool2d { .. }
        | Op::MaxPool2dBackward { .. }
        | Op::ToDevice { .. }
        | Op::Cast { .. }
        | Op::Checkpoint(_)
        | Op::Custom(_) => (0, 0),
        Op::Unary(_) | Op::Dropout { .. } | Op::Cumsum { .. } => (out, per_needing(out)),
        Op::Binary(_) | Op::Where => (out, per_needing(out)),
        Op::Reduce { op, .. } => {
            let x = input(0);
            let back = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Max => x,
            };
            (x, if needs(0) { back } else { 0 })
        }
        Op::Softmax { .. } => (5 * out, per_needing(4 * out)),
        Op::CrossEntropy { .. } => (input(0), per_needing(input(0))),
        Op::Norm(_) => (7 * out, 10 * out),
        Op::Matmul { ta, tb } => {
            let (a, b) = (s.inputs[0].0, s.inputs[1].0);
            let (m, k, n, _) = mkn(a, b, *ta, *tb);
            // The batch as broadcast: the output's matrices.
            let batch = out.checked_div(m * n).unwrap_or(0);
            let f = 2 * batch * m * k * n;
            (f, per_needing(f))
        }
        Op::Addmm { ta, tb } => {
            let (m, k, n, _) = mkn(s.inputs[1].0, s.inputs[2].0, *ta, *tb);
            let f = 2 * m * k * n;
            let back = if needs(0) { m * n } else { 0 }
                + if needs(1) { f } else { 0 }
                + if needs(2) { f } else { 0 };
            (f + m * n, back)
        }
        Op::ConvPatches(_) | Op::ConvTranspose(_) => {
            // [x, w [o, k], bias?]: the product of w (or wᵀ) and each image's patches, over
            // the [n, o, l] side — a convolution's output, a transposed convolution's input
            // (the fold's additions are not counted, as a convolution's im2col is not).
            let k = s.inputs[1].0.get(1).copied().unwrap_or(0) as u64;
            let side = match op {
                Op::ConvPatches(_) => out,
                _ => input(0),
            };
            let f = 2 * k * side;
            let bias = if s.inputs.len() > 2 { out } else { 0 };
            let back = if needs(0) { f } else { 0 }
                + if needs(1) { f } else { 0 }
                + if needs(2) { out } else { 0 };
            (f + bias, back)
        }
        Op::Conv2d { n, l } => {
            // [w [o, k], cols [k, n·l], bias?] → [n, o, l]
            let w = s.inputs[0].0;
            let (o, k) = (w[0] as u64, w.get(1).copied().unwrap_or(0) as u64);
            let cols = (*n * *l) as u64;
            let f = 2 * o * k * cols;
            let bias = if s.inputs.len() > 2 { o * cols } else { 0 };
            let back = if needs(0) { f } else { 0 }
                + if needs(1) { f } else { 0 }
                + if needs(2) { bias } else { 0 };
            (f + bias, back)
        }
        Op::Attention(a) => {
            // q [.., l, d], k [.., s, d], v [.., s, dv] (or their packed form): the node's
            // problem.
            let dims = &a.dims;
            let (l, d, sl, dv) = (
                dims.lq as u64,
                dims.d as u64,
                dims.lk as u64,
                dims.dv as u64,
            );
            let heads = dims.bh as u64;
            let scores = heads * l * sl;
            let f = 2 * scores * d + 2 * scores * dv + 5 * scores;
            // Backward recomputes the scores and makes the four products of the gradients.
            let b = 2 * scores * d + 4 * scores * d + 4 * scores * dv + 5 * scores;
            (f, b)
        }
        Op::LstmCell { .. } => (out * 10, out * 12),
        Op::GruCell { .. } => (out * 12, out * 16),
        Op::LstmSeq(n) => {
            // The steps each row takes (none past its length).
            let steps: u64 = n.lengths.iter().map(|&l| l as u64).sum();
            let h = n.dims.h as u64;
            let gemm = 2 * steps * 4 * h * h;
            (gemm + 20 * steps * h, 2 * gemm + 24 * steps * h)
        }
    }
}
