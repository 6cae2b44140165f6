//! An application's own ops in programs: a [`CustomOp`] (its name and backward rule) with its
//! forward, its arity, its shape rule and whether it is smooth, registered once per process with
//! [`register_op`]. A registered op parses and prints as `NAME = op a b`, runs, and is
//! gradient-checked like a built-in one; random programs draw it when their [`GenConfig`] lists
//! it ([`GenConfig::with_user_ops`]), so the proptest strategies, their shrinking and the fuzz
//! checks test the application's gradients, not only the engine's.
//!
//! ```
//! use std::sync::Arc;
//! use arenagrad_graph::{CustomOp, Graph, GraphError, Tensor};
//! use arenagrad_program::{register_op, Program, RunOptions, UserOp};
//!
//! /// x³ with its derivative 3x².
//! struct Cube;
//! impl CustomOp for Cube {
//!     fn name(&self) -> &'static str { "cube" }
//!     fn backward<'g>(&self, _g: &'g Graph, x: &[Tensor<'g>], _y: Tensor<'g>, gy: Tensor<'g>)
//!         -> Result<Vec<Option<Tensor<'g>>>, GraphError> {
//!         Ok(vec![Some(gy.mul(x[0].square()?.scale(3.0)?)?)])
//!     }
//! }
//! register_op(UserOp::elementwise(Arc::new(Cube), |_, x| x[0].powf(3.0))).unwrap();
//! let p = Program::parse("x = input 2 : 1 -2\ny = cube x\n").unwrap();
//! let r = p.run(&RunOptions::default()).unwrap();
//! assert_eq!(r.grad("x").unwrap().to_f64_vec(), vec![3.0, 12.0]);
//! ```
//!
//! [`GenConfig`]: crate::generate::GenConfig
//! [`GenConfig::with_user_ops`]: crate::generate::GenConfig::with_user_ops

use std::sync::{Arc, RwLock};

use arenagrad_graph::{CustomOp, Graph, GraphError, Tensor};

use crate::ast::{is_valid_name, op_names};

/// An op's forward: its value from its operands (run without recording).
pub type Forward =
    dyn for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>, GraphError> + Send + Sync;

/// An op's shape rule: the output's shape from the operands' shapes, or `None` where the op
/// does not apply to them.
pub type ShapeRule = dyn Fn(&[&[usize]]) -> Option<Vec<usize>> + Send + Sync;

/// An application's op, for [`register_op`].
#[derive(Clone)]
pub struct UserOp {
    rule: Arc<dyn CustomOp>,
    arity: usize,
    shape: Arc<ShapeRule>,
    smooth: bool,
    forward: Arc<Forward>,
}

impl std::fmt::Debug for UserOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserOp")
            .field("name", &self.name())
            .field("arity", &self.arity)
            .field("smooth", &self.smooth)
            .finish()
    }
}

impl UserOp {
    /// The op named by `rule` (its [`CustomOp::name`]), whose backward is `rule`'s, of `arity`
    /// operands, with its shape rule and forward. Smooth unless [`UserOp::smooth`] says not.
    pub fn new(
        rule: Arc<dyn CustomOp>,
        arity: usize,
        shape: impl Fn(&[&[usize]]) -> Option<Vec<usize>> + Send + Sync + 'static,
        forward: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>, GraphError>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        UserOp {
            rule,
            arity,
            shape: Arc::new(shape),
            smooth: true,
            forward: Arc::new(forward),
        }
    }

    /// An op of one operand whose output has the operand's shape.
    pub fn elementwise(
        rule: Arc<dyn CustomOp>,
        forward: impl for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>, GraphError>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        UserOp::new(rule, 1, |s| Some(s[0].to_vec()), forward)
    }

    /// Says whether the op is differentiable everywhere (what gradient checks of random
    /// programs may draw; see [`GenConfig::with_user_ops`](crate::generate::GenConfig::with_user_ops)).
    pub fn smooth(mut self, smooth: bool) -> Self {
        self.smooth = smooth;
        self
    }

    /// The op's name in programs.
    pub fn name(&self) -> &'static str {
        self.rule.name()
    }

    /// How many operands it takes.
    pub fn arity(&self) -> usize {
        self.arity
    }

    /// Whether it is smooth.
    pub fn is_smooth(&self) -> bool {
        self.smooth
    }

    /// The output's shape for these operand shapes, if the op applies to them.
    pub fn out_shape(&self, shapes: &[&[usize]]) -> Option<Vec<usize>> {
        if shapes.len() != self.arity {
            return None;
        }
        (self.shape)(shapes)
    }

    /// Computes the op: the forward without recording, recorded as the custom op's output.
    pub fn apply<'g>(&self, g: &'g Graph, args: &[Tensor<'g>]) -> Result<Tensor<'g>, GraphError> {
        let value = {
            let _off = g.no_grad();
            (self.forward)(g, args)?
        };
        g.custom(self.rule.clone(), args, value)
    }
}

/// Why [`register_op`] refused an op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Not a valid statement name (`[a-z_][a-z0-9_]*`).
    #[error("`{0}` is not a valid op name (expected [a-z_][a-z0-9_]*)")]
    BadName(&'static str),
    /// The name of one of the format's own ops.
    #[error("`{0}` is an op of the format already")]
    BuiltIn(&'static str),
    /// No operands.
    #[error("`{0}` takes no operands; an op needs at least one")]
    NoOperands(&'static str),
}

static REGISTRY: RwLock<Vec<Arc<UserOp>>> = RwLock::new(Vec::new());

/// Registers `op` for this process: programs may use it from now on. Registering a name again
/// replaces the earlier op of that name.
pub fn register_op(op: UserOp) -> Result<(), RegisterError> {
    let name = op.name();
    if !is_valid_name(name) {
        return Err(RegisterError::BadName(name));
    }
    if op_names().contains(&name) {
        return Err(RegisterError::BuiltIn(name));
    }
    if op.arity == 0 {
        return Err(RegisterError::NoOperands(name));
    }
    let mut r = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    r.retain(|o| o.name() != name);
    r.push(Arc::new(op));
    Ok(())
}

/// The registered op called `name`.
pub fn user_op(name: &str) -> Option<Arc<UserOp>> {
    let r = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    r.iter().find(|o| o.name() == name).cloned()
}

/// Every registered op, in registration order.
pub fn user_ops() -> Vec<Arc<UserOp>> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).clone()
}
