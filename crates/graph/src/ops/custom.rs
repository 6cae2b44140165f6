//! User-defined ops: a forward computed with any tensor code, and a backward rule supplied by the
//! user. This is how an application adds a fused op without touching the engine, and how tests
//! plant a deliberately wrong rule to prove the gradient checker catches it.

use std::sync::Arc;

use super::{check_pair, Ctx, Grads, Op};
use crate::error::{GraphError, Result};
use crate::shape::copy_of;
use crate::{Graph, Tensor};

/// The backward rule of a user-defined op.
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
