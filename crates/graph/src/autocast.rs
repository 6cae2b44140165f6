//! Mixed precision as a scope on the graph: PyTorch's `torch.autocast("cpu", dtype=...)`.
//!
//! Inside [`Graph::autocast`], each op runs in the precision its row of [`AUTOCAST_OPS`] gives:
//!
//! * **lower** — matrix products, linear layers (`addmm`), convolutions and attention: operands
//!   stored in `f32` (or the other 16-bit dtype) are cast to the scope's dtype, and the op runs
//!   there (bf16 products multiply bf16 pairs and accumulate in f32) and stores its result in it;
//! * **f32** — losses (`cross_entropy`) run in f32 on operands widened to it, so a loss and its
//!   gradient are never rounded to 16 bits;
//! * everything else runs in its operands' dtype, and operands of different dtypes meet in the
//!   wider ([`crate::DType::promote`]): a bf16 activation plus an f32 residual is f32. Norms,
//!   softmax and reductions on 16-bit operands compute their statistics in f32 and round once.
//!
//! Parameters stay f32 (the master weights): a parameter's 16-bit copy is made once per
//! iteration and reused by every op that reads it (a weight tied between two layers, a
//! recurrent weight read at every step), and its gradient arrives f32 through the cast. Backward
//! runs each op in the dtype its forward ran in, whether or not it is inside the scope.
//!
//! PyTorch's CPU lists (`aten/src/ATen/autocast_mode.cpp`) put the same products, convolutions
//! and attention in their lower-precision list and losses in their f32 list; like ours they
//! leave `layer_norm`, `softmax` and reductions to run in their input's dtype (its CUDA lists
//! put those in f32; on the CPU their kernels compute in f32 internally, as ours do).

use arenagrad_exec::DType;

use crate::error::{GraphError, Result};
use crate::graph::NodeId;
use crate::ops::Op;
use crate::{Graph, Tensor};

/// The precision an op runs in under autocast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastPolicy {
    /// In the scope's 16-bit dtype.
    Lower,
    /// In f32.
    F32,
}

/// The ops autocast changes, with their policy and the PyTorch op of the same list. Every op
/// not listed runs in its operands' dtype (promoting where they differ).
pub const AUTOCAST_OPS: &[(&str, CastPolicy, &str)] = &[
    ("matmul", CastPolicy::Lower, "mm, bmm, matmul"),
    ("addmm", CastPolicy::Lower, "addmm, linear"),
    ("conv2d", CastPolicy::Lower, "conv2d"),
    (
        "scaled_dot_product_attention",
        CastPolicy::Lower,
        "scaled_dot_product_attention",
    ),
    (
        "cross_entropy",
        CastPolicy::F32,
        "cross_entropy_loss, nll_loss",
    ),
];

/// A parameter's (or a grad-requiring leaf's) cast made in this iteration, for reuse.
pub(crate) struct CachedCast {
    /// The leaf cast: a parameter by identity, another leaf by id.
    source: CastSource,
    dtype: DType,
    /// Whether it was made recording (a copy made under `no_grad` has no path back).
    recorded: bool,
    cast: NodeId,
}

enum CastSource {
    Param(crate::Parameter),
    Leaf(NodeId),
}

/// Turns autocast off again (or back to the enclosing scope's) when dropped.
#[must_use = "autocast ends when the guard drops"]
pub struct AutocastGuard<'g> {
    g: &'g Graph,
    prev: Option<DType>,
}

impl Drop for AutocastGuard<'_> {
    fn drop(&mut self) {
        self.g.inner().autocast = self.prev;
    }
}

impl Graph {
    /// Runs the ops made until the guard drops in mixed precision (see the module
    /// documentation): `dtype` is [`DType::BF16`] or [`DType::F16`].
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let x = g.randn(&[4, 8], DType::F32)?;
    /// let w = g.randn(&[8, 3], DType::F32)?.set_requires_grad(true)?;
    /// let loss = {
    ///     let _mixed = g.autocast(DType::BF16)?;
    ///     let y = x.matmul(w)?; // in bf16
    ///     assert_eq!(y.dtype(), DType::BF16);
    ///     y.cross_entropy_mean(&[0, 2, 1, 1])? // in f32
    /// };
    /// assert_eq!(loss.dtype(), DType::F32);
    /// loss.backward()?;
    /// assert_eq!(w.grad()?.unwrap().dtype(), DType::F32); // the master weight's gradient
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn autocast(&self, dtype: DType) -> Result<AutocastGuard<'_>> {
        if !dtype.is_half() {
            return Err(GraphError::UnsupportedDType {
                op: "autocast",
                dtype,
            });
        }
        let mut i = self.inner();
        let prev = i.autocast.replace(dtype);
        Ok(AutocastGuard { g: self, prev })
    }

    /// No autocast until the guard drops: an op run on widened operands ([`Tensor::lower`]) runs
    /// in f32 as asked, its inner products not cast down again.
    pub(crate) fn suspend_autocast(&self) -> AutocastGuard<'_> {
        let prev = self.inner().autocast.take();
        AutocastGuard { g: self, prev }
    }

    /// The dtype of the autocast scope in force, if any.
    pub fn autocast_dtype(&self) -> Option<DType> {
        self.inner.borrow().autocast
    }

    /// The scope's dtype where it applies to an op now: inside a scope, outside backward.
    fn autocast_now(&self) -> Option<DType> {
        let i = self.inner.borrow();
        if i.in_backward {
            None
        } else {
            i.autocast
        }
    }
}

impl<'g> Tensor<'g> {
    /// Under autocast, `xs` cast for an op of the lower-precision list: those stored in another
    /// 16-bit dtype or in f32 to the scope's dtype (f64 is left alone, as in PyTorch). `None`
    /// where autocast is off or nothing needs a cast.
    pub(crate) fn autocast_lower<const N: usize>(
        g: &'g Graph,
        xs: [Option<Tensor<'g>>; N],
    ) -> Result<Option<[Option<Tensor<'g>>; N]>> {
        let Some(dtype) = g.autocast_now() else {
            return Ok(None);
        };
        let eligible = |d: DType| d != dtype && d != DType::F64;
        Self::cast_where(xs, dtype, eligible)
    }

    /// Under autocast, `xs` widened for an op of the f32 list (16-bit operands to f32); `None`
    /// where autocast is off or nothing needs a cast.
    pub(crate) fn autocast_f32<const N: usize>(
        g: &'g Graph,
        xs: [Option<Tensor<'g>>; N],
    ) -> Result<Option<[Option<Tensor<'g>>; N]>> {
        if g.autocast_now().is_none() {
            return Ok(None);
        }
        Self::cast_where(xs, DType::F32, DType::is_half)
    }

    fn cast_where<const N: usize>(
        xs: [Option<Tensor<'g>>; N],
        dtype: DType,
        eligible: impl Fn(DType) -> bool,
    ) -> Result<Option<[Option<Tensor<'g>>; N]>> {
        let mut cast = [false; N];
        for (c, x) in cast.iter_mut().zip(&xs) {
            if let Some(x) = x {
                *c = eligible(x.dtype_of("autocast")?);
            }
        }
        if !cast.contains(&true) {
            return Ok(None);
        }
        let mut out = xs;
        for (x, c) in out.iter_mut().zip(cast) {
            if let (Some(x), true) = (x, c) {
                *x = x.cast_cached(dtype)?;
            }
        }
        Ok(Some(out))
    }

    /// This tensor as an operand of an op on autocast's f32 list: inside an autocast scope, a
    /// 16-bit tensor widened to f32; otherwise the tensor itself. What the losses do to their
    /// operands, for a loss or an op of your own to do the same.
    pub fn autocast_f32_operand(self) -> Result<Tensor<'g>> {
        match Self::autocast_f32(self.g, [Some(self)])? {
            Some([Some(x)]) => Ok(x),
            _ => Ok(self),
        }
    }

    /// `self.to_dtype(dtype)`, made once per iteration for a parameter's leaf or another leaf
    /// that requires grad (PyTorch's autocast weight cache).
    fn cast_cached(self, dtype: DType) -> Result<Tensor<'g>> {
        let source = {
            let i = self.g.inner.borrow();
            let n = i.node("autocast", self.id)?;
            match &n.op {
                Op::Param(p) => Some(CastSource::Param(p.clone())),
                Op::Leaf if n.requires_grad => Some(CastSource::Leaf(self.id)),
                _ => None,
            }
        };
        let Some(source) = source else {
            return self.to_dtype(dtype);
        };
        let recorded = self.g.is_grad_enabled();
        let hit = {
            let i = self.g.inner.borrow();
            i.cast_cache
                .iter()
                .find(|c| c.dtype == dtype && c.recorded == recorded && c.source.is(&source))
                .map(|c| c.cast)
                .filter(|&id| i.nodes.contains_key(id))
        };
        if let Some(id) = hit {
            return Ok(self.g.handle(id));
        }
        let cast = self.to_dtype(dtype)?;
        self.g.inner().cast_cache.push(CachedCast {
            source,
            dtype,
            recorded,
            cast: cast.id,
        });
        Ok(cast)
    }
}

impl CastSource {
    fn is(&self, other: &CastSource) -> bool {
        match (self, other) {
            (CastSource::Param(a), CastSource::Param(b)) => a.same(b),
            (CastSource::Leaf(a), CastSource::Leaf(b)) => a == b,
            _ => false,
        }
    }
}
