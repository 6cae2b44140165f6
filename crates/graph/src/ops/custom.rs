//! User-defined ops: a forward computed with any tensor code, and a backward rule supplied by the
//! user. This is how an application adds a fused op without touching the engine, and how tests
//! plant a deliberately wrong rule to prove the gradient checker catches it.

use std::sync::Arc;

use super::{check_pair, Ctx, Grads, Op};
use crate::error::{GraphError, Result};
use crate::shape::copy_of;
use crate::{Graph, Tensor};

/// The backward rule of a user-defined op.
///
/// The forward is ordinary tensor code run under [`Graph::no_grad`]; [`Graph::custom`] records
/// its result as one node whose backward is this rule. [`crate::check::gradcheck`] tells whether
/// the rule is right:
///
/// ```
/// use std::sync::Arc;
/// use arenagrad_graph::check::{check_fn, gradcheck, GradcheckOptions};
/// use arenagrad_graph::{CustomOp, DType, Graph, HostTensor, Result, Tensor};
///
/// /// y = x³, with its derivative 3x² written by hand (or, with `wrong`, 2x²).
/// struct Cube {
///     wrong: bool,
/// }
///
/// impl CustomOp for Cube {
///     fn name(&self) -> &'static str {
///         "cube"
///     }
///     fn backward<'g>(
///         &self,
///         _g: &'g Graph,
///         inputs: &[Tensor<'g>],
///         _output: Tensor<'g>,
///         gy: Tensor<'g>,
///     ) -> Result<Vec<Option<Tensor<'g>>>> {
///         let x = inputs[0];
///         let k = if self.wrong { 2.0 } else { 3.0 };
///         Ok(vec![Some(x.mul(x)?.scale(k)?.mul(gy)?)])
///     }
/// }
///
/// fn cube<'g>(g: &'g Graph, x: Tensor<'g>, wrong: bool) -> Result<Tensor<'g>> {
///     let value = {
///         let _no_grad = g.no_grad();
///         x.mul(x)?.mul(x)?
///     };
///     g.custom(Arc::new(Cube { wrong }), &[x], value)
/// }
///
/// let g = Graph::new();
/// let x = g.leaf(&[2.0, -1.0], &[2], DType::F64)?;
/// cube(&g, x, false)?.sum()?.backward()?;
/// assert_eq!(x.grad()?.unwrap().to_vec::<f64>()?, vec![12.0, 3.0]);
///
/// let at = [HostTensor::from_f64(&[0.3, -1.2, 0.7], &[3], DType::F64)?];
/// let right = gradcheck(check_fn(|g, xs| cube(g, xs[0], false)), &at, GradcheckOptions::default())?;
/// assert!(right.passed, "{right}");
/// let wrong = gradcheck(check_fn(|g, xs| cube(g, xs[0], true)), &at, GradcheckOptions::default())?;
/// assert!(!wrong.passed, "the checker must catch 2x²");
/// # Ok::<(), arenagrad_graph::GraphError>(())
/// ```
pub trait CustomOp: Send + Sync {
    /// The op's name (for errors and graph dumps).
    fn name(&self) -> &'static str;
    /// Gradients for each input given the output's gradient `gy`; `None` for inputs that get none.
    /// Written in tensor ops, the rule is differentiable itself under `create_graph`.
    fn backward<'g>(
        &self,
        g: &'g Graph,
        inputs: &[Tensor<'g>],
        output: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>>;
}

impl Graph {
    /// Records `value` (computed by the caller, typically under [`Graph::no_grad`]) as the output
    /// of `op` applied to `inputs`; backward will call `op.backward`.
    pub fn custom<'g>(
        &'g self,
        op: Arc<dyn CustomOp>,
        inputs: &[Tensor<'g>],
        value: Tensor<'g>,
    ) -> Result<Tensor<'g>> {
        let name = op.name();
        self.owns(name, &value)?;
        let ids = self.owns_all(name, inputs)?;
        for x in inputs {
            check_pair(name, &value, x)?;
        }
        let mut i = self.inner();
        let (shape, dtype, buf) = {
            let n = i.node(name, value.id)?;
            (copy_of(&n.shape), n.dtype, n.buf)
        };
        let dev = i.device_of(name, value.id)?;
        i.retain_buf(name, dev, buf)?;
        let id = i.push_on(dev, shape, dtype, buf, Op::Custom(op), &ids);
        drop(i);
        Ok(self.handle(id))
    }
}

pub(crate) fn backward<'g>(op: &Arc<dyn CustomOp>, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let inputs: Vec<Tensor<'g>> = (0..c.inputs.len()).map(|k| c.input(k)).collect();
    let grads = op.backward(c.g, &inputs, c.out, c.gy)?;
    if grads.len() != inputs.len() {
        return Err(GraphError::BadArgument {
            op: op.name(),
            what: "custom backward returned a different number of gradients than inputs",
        });
    }
    for (gr, x) in grads.iter().zip(&inputs) {
        if let Some(gr) = gr {
            c.g.owns(op.name(), gr)?;
            let (gs, xs) = (gr.try_shape()?, x.try_shape()?);
            if gs != xs {
                return Err(GraphError::ShapeMismatch {
                    op: op.name(),
                    lhs: xs.to_vec(),
                    rhs: gs.to_vec(),
                });
            }
        }
    }
    Ok(grads.into_iter().collect())
}
