//! Running a program on the engine: leaves, one op per statement (in a loop, in order), the
//! backward pass from the output, and everything copied out as owned host data.

use std::collections::BTreeMap;
use std::sync::Arc;

use arenagrad_graph::{CustomOp, DType, Graph, GraphError, HostData, HostTensor, Tensor};

use super::ast::{Expr, Program};
use super::error::ProgramError;
use super::infer::{check, check_run, Limits, StmtInfo};
use super::table::{all_ones, reshape_to};

/// A replacement implementation of an op, for [`Overrides`]: given the statement and its
/// operands' tensors (in the order [`Expr::operands`] lists them), it returns the statement's
/// tensor, which must have the shape the format's rules give.
pub trait OpImpl: Send + Sync {
    /// Computes the statement.
    fn apply<'g>(
        &self,
        g: &'g Graph,
        expr: &Expr,
        args: &[Tensor<'g>],
    ) -> Result<Tensor<'g>, GraphError>;
}

/// An [`OpImpl`] that keeps the op's forward computation and replaces its backward rule with a
/// [`CustomOp`]: the value is computed without recording, then recorded as the custom op's output
/// with the operands as its inputs. Attributes (axes, constants) are not passed to the rule.
pub struct BackwardRule(pub Arc<dyn CustomOp>);

impl OpImpl for BackwardRule {
    fn apply<'g>(
        &self,
        g: &'g Graph,
        expr: &Expr,
        args: &[Tensor<'g>],
    ) -> Result<Tensor<'g>, GraphError> {
        let value = {
            let _off = g.no_grad();
            apply_default(g, expr, args)?
        };
        g.custom(self.0.clone(), args, value)
    }
}

/// Replacement implementations by op name (`"tanh"`, `"matmul"`, ...): how a test plants a
/// wrong rule to see that a check catches it, or how a user tries a fused implementation of an op
/// against the built-in one. Leaves (`input`, `const`) cannot be replaced.
#[derive(Clone, Default)]
pub struct Overrides {
    map: BTreeMap<String, Arc<dyn OpImpl>>,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.map.keys()).finish()
    }
}

impl Overrides {
    /// No replacements.
    pub fn new() -> Self {
        Overrides::default()
    }

    /// Replaces the implementation of `op`.
    pub fn replace(mut self, op: &str, imp: Arc<dyn OpImpl>) -> Self {
        self.map.insert(op.to_string(), imp);
        self
    }

    /// Keeps `op`'s forward computation and replaces its backward rule (see [`BackwardRule`]).
    pub fn backward_rule(self, op: &str, rule: Arc<dyn CustomOp>) -> Self {
        self.replace(op, Arc::new(BackwardRule(rule)))
    }

    /// The replacement for `op`, if any.
    pub fn get(&self, op: &str) -> Option<&Arc<dyn OpImpl>> {
        self.map.get(op)
    }

    /// Whether there are no replacements.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The engine's reduction kernel asserts (in builds with debug assertions) that the innermost
/// run it walks is contiguous, which fails when it reduces some but not all axes of a tensor
/// whose extents are all 1 — inside a binary op's backward rule that sums a broadcast gradient,
/// for instance (the rows that reduce or broadcast handle their own cases). Such a binary op's
/// output is one element: its operands are reshaped to its shape first, which has the same
/// values and derivatives.
fn avoid_degenerate_reduce<'g>(
    expr: &Expr,
    args: &[Tensor<'g>],
) -> Result<Option<Tensor<'g>>, GraphError> {
    if let (Expr::Binary { .. }, [x, y]) = (expr, args) {
        let (a, b) = (x.try_shape()?.to_vec(), y.try_shape()?.to_vec());
        if a != b {
            if let Some(out) = arenagrad_exec::layout::broadcast_shapes(&a, &b) {
                if all_ones(&out) {
                    let x = reshape_to(*x, &out)?;
                    let y = reshape_to(*y, &out)?;
                    return apply_default(x.graph(), expr, &[x, y]).map(Some);
                }
            }
        }
    }
    Ok(None)
}

/// The built-in implementation of a non-leaf statement on the engine's tensors. Axes are passed
/// through as written (the engine resolves negative axes); the shape rules of
/// [`Program::check`] have been applied by the callers in this module.
pub fn apply_default<'g>(
    g: &'g Graph,
    expr: &Expr,
    args: &[Tensor<'g>],
) -> Result<Tensor<'g>, GraphError> {
    let arg = |k: usize| {
        args.get(k).copied().ok_or(GraphError::BadArgument {
            op: "program",
            what: "missing operand",
        })
    };
    if let Some(t) = avoid_degenerate_reduce(expr, args)? {
        return Ok(t);
    }
    match expr {
        Expr::Leaf { .. } => Err(GraphError::BadArgument {
            op: "program",
            what: "a leaf is not an op",
        }),
        // A program has one dtype: a comparison's bool mask becomes 0/1 in it.
        Expr::Binary { op, .. } => {
            let a = arg(0)?;
            let y = a.binary(*op, arg(1)?)?;
            if y.dtype() == DType::Bool {
                y.to_dtype(a.dtype())
            } else {
                Ok(y)
            }
        }
        Expr::Unary { op, .. } => arg(0)?.unary(*op),
        Expr::Op { op, params, .. } => {
            if op.accepts(args.len(), params).is_err() {
                return Err(GraphError::BadArgument {
                    op: "program",
                    what: "operands or parameters that do not fit the op's row",
                });
            }
            (op.run)(g, args, params)
        }
        Expr::User { op, .. } => match crate::user_op(op) {
            Some(u) => u.apply(g, args),
            None => Err(GraphError::BadArgument {
                op: "program",
                what: "an op that is not registered",
            }),
        },
    }
}

/// How to run a program.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Element type of every tensor.
    pub dtype: DType,
    /// Seed of the RNG that fills leaves given without values.
    pub seed: u64,
    /// Size limits, applied before anything is allocated.
    pub limits: Limits,
    /// Threads the engine's kernels may use (None: the engine's default).
    pub threads: Option<usize>,
    /// Replacement op implementations.
    pub overrides: Overrides,
}

impl Default for RunOptions {
    /// `f64`, seed 0, default limits, default threads, no overrides.
    fn default() -> Self {
        RunOptions {
            dtype: DType::F64,
            seed: 0,
            limits: Limits::default(),
            threads: None,
            overrides: Overrides::new(),
        }
    }
}

/// A tensor with the name of the statement it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// The statement's name.
    pub name: String,
    /// Its values.
    pub tensor: HostTensor,
}

/// What a run produced, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// The element type used.
    pub dtype: DType,
    /// The output (the last statement).
    pub output: NamedTensor,
    /// Every leaf (`input` and `const`) as used, in program order.
    pub values: Vec<NamedTensor>,
    /// The gradient of the output (of its sum, when it is not a scalar) for every `input`, in
    /// program order. Zeros for an input the output does not depend on.
    pub grads: Vec<NamedTensor>,
}

impl RunResult {
    /// The value of the leaf `name`.
    pub fn value(&self, name: &str) -> Option<&HostTensor> {
        self.values
            .iter()
            .find(|t| t.name == name)
            .map(|t| &t.tensor)
    }

    /// The gradient of the input `name`.
    pub fn grad(&self, name: &str) -> Option<&HostTensor> {
        self.grads
            .iter()
            .find(|t| t.name == name)
            .map(|t| &t.tensor)
    }

    /// The JSON object `arenagrad run --json` prints:
    /// `{"dtype":..,"output":{"shape":..,"data":..},"values":{NAME:..},"grads":{NAME:..}}`.
    /// Non-finite numbers are written as `null`.
    pub fn to_json(&self) -> String {
        let mut out = Vec::new();
        self.write_json(&mut out)
            .expect("invariant: writing to a Vec cannot fail");
        String::from_utf8(out).expect("invariant: serde_json writes UTF-8")
    }

    /// Writes [`RunResult::to_json`]'s object to `w` as it goes, element by element, without
    /// building it in memory first (the output of a large program is as large as its tensors).
    pub fn write_json(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        fn tensor(w: &mut impl std::io::Write, t: &HostTensor) -> std::io::Result<()> {
            w.write_all(b"{\"shape\":")?;
            serde_json::to_writer(&mut *w, t.shape())?;
            w.write_all(b",\"data\":[")?;
            // Each element as serde_json writes it (shortest form; non-finite as `null`).
            match t.data() {
                HostData::F32(v) => elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k]))?,
                HostData::F64(v) => elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k]))?,
                // A 16-bit value exactly, as the f64 it widens to (f32's shortest form would
                // read back as another f64).
                HostData::BF16(v) => {
                    elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k].to_f64()))?
                }
                HostData::F16(v) => {
                    elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k].to_f64()))?
                }
                HostData::I64(v) => elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k]))?,
                HostData::I32(v) => elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k]))?,
                HostData::U8(v) => elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k]))?,
                HostData::Bool(v) => {
                    elements(w, v.len(), |w, k| serde_json::to_writer(w, &v[k].get()))?
                }
            }
            w.write_all(b"]}")
        }
        fn elements<W: std::io::Write>(
            w: &mut W,
            n: usize,
            one: impl Fn(&mut W, usize) -> serde_json::Result<()>,
        ) -> std::io::Result<()> {
            for k in 0..n {
                if k > 0 {
                    w.write_all(b",")?;
                }
                one(w, k)?;
            }
            Ok(())
        }
        fn map(w: &mut impl std::io::Write, items: &[NamedTensor]) -> std::io::Result<()> {
            w.write_all(b"{")?;
            for (k, t) in items.iter().enumerate() {
                if k > 0 {
                    w.write_all(b",")?;
                }
                serde_json::to_writer(&mut *w, &t.name)?;
                w.write_all(b":")?;
                tensor(w, &t.tensor)?;
            }
            w.write_all(b"}")
        }
        write!(w, "{{\"dtype\":\"{}\",\"output\":", dtype_name(self.dtype))?;
        tensor(w, &self.output.tensor)?;
        w.write_all(b",\"values\":")?;
        map(w, &self.values)?;
        w.write_all(b",\"grads\":")?;
        map(w, &self.grads)?;
        w.write_all(b"}")
    }
}

/// `"f32"`, `"f64"`, `"bf16"` or `"f16"`.
pub fn dtype_name(d: DType) -> &'static str {
    d.name()
}

impl Program {
    /// Checks the program against the format's shape rules and `limits`, without allocating any
    /// tensor: every statement's shape and whether it needs grad, or the first error (with its
    /// line and column).
    pub fn check(&self, limits: &Limits) -> Result<Vec<StmtInfo>, ProgramError> {
        check(self, limits)
    }

    /// The values of every leaf, in program order, as `f64`: those given after a colon, and
    /// standard normal draws from one RNG seeded with `seed` for the others (drawn in program
    /// order, so a leaf's values do not depend on leaves with given values). Call
    /// [`Program::check`] first: this allocates what the shapes ask for.
    pub fn leaf_values(&self, seed: u64) -> Result<Vec<Vec<f64>>, ProgramError> {
        let g = Graph::with_threads(1);
        g.seed(seed);
        let mut out = Vec::new();
        for i in self.leaves() {
            if let Expr::Leaf { shape, values, .. } = &self.stmts[i].expr {
                match values {
                    Some(v) => out.push(v.clone()),
                    None => {
                        let v = g
                            .randn(shape, DType::F64)
                            .and_then(|t| t.to_vec_f64())
                            .map_err(|e| self.engine_err(i, e))?;
                        out.push(v);
                    }
                }
            }
        }
        Ok(out)
    }

    pub(crate) fn engine_err(&self, i: usize, source: GraphError) -> ProgramError {
        let (line, column) = self.op_pos(i);
        ProgramError::Engine {
            line,
            column,
            source,
        }
    }

    /// Builds the program on `g` from the leaf tensors (one per leaf, in program order) and
    /// returns every statement's tensor. The program is checked against `limits` first.
    pub fn build<'g>(
        &self,
        g: &'g Graph,
        leaves: &[Tensor<'g>],
        limits: &Limits,
        overrides: &Overrides,
    ) -> Result<Vec<Tensor<'g>>, ProgramError> {
        let infos = check(self, limits)?;
        self.build_checked(g, leaves, &infos, overrides)
    }

    /// [`Program::build`] after [`check`]: statement by statement, in a loop.
    pub(crate) fn build_checked<'g>(
        &self,
        g: &'g Graph,
        leaves: &[Tensor<'g>],
        infos: &[StmtInfo],
        overrides: &Overrides,
    ) -> Result<Vec<Tensor<'g>>, ProgramError> {
        let mut ts: Vec<Tensor<'g>> = Vec::with_capacity(self.stmts.len());
        let mut next_leaf = 0;
        for (i, s) in self.stmts.iter().enumerate() {
            let t = if s.expr.is_leaf() {
                let t = leaves.get(next_leaf).copied().ok_or_else(|| {
                    let (line, column) = self.op_pos(i);
                    ProgramError::Internal {
                        line,
                        column,
                        message: format!(
                            "{} leaf tensors given, the program has more leaves",
                            leaves.len()
                        ),
                    }
                })?;
                next_leaf += 1;
                t
            } else {
                let args: Vec<Tensor<'g>> = s.expr.operands().iter().map(|&k| ts[k]).collect();
                let r = match overrides.get(s.expr.op_name()) {
                    Some(imp) => imp.apply(g, &s.expr, &args),
                    None => apply_default(g, &s.expr, &args),
                };
                r.map_err(|e| self.engine_err(i, e))?
            };
            let got = t.try_shape().map_err(|e| self.engine_err(i, e))?;
            if let Some(info) = infos.get(i) {
                if got.as_slice() != info.shape.as_slice() {
                    let (line, column) = self.op_pos(i);
                    return Err(ProgramError::Internal {
                        line,
                        column,
                        message: format!(
                            "`{}` produced shape {:?}; the shape rules give {:?}",
                            s.name,
                            got.as_slice(),
                            info.shape
                        ),
                    });
                }
            }
            ts.push(t);
        }
        Ok(ts)
    }

    /// Runs the program forward and backward: checks it against the limits, makes the leaves
    /// (`input`s require grad), computes every statement, backpropagates from the output (from
    /// its sum when it is not a scalar), and copies out the output, every leaf's value and every
    /// input's gradient.
    pub fn run(&self, opts: &RunOptions) -> Result<RunResult, ProgramError> {
        let infos = check(self, &opts.limits)?;
        check_run(self, &infos, &opts.limits)?;
        let values = self.leaf_values(opts.seed)?;
        let g = match opts.threads {
            Some(n) => Graph::with_threads(n),
            None => Graph::new(),
        };
        let leaf_idx = self.leaves();
        let mut leaves = Vec::with_capacity(leaf_idx.len());
        for (&i, v) in leaf_idx.iter().zip(&values) {
            let t = match &self.stmts[i].expr {
                Expr::Leaf {
                    requires_grad,
                    shape,
                    dtype,
                    ..
                } => {
                    let t = g
                        .from_f64(v, shape, dtype.unwrap_or(opts.dtype))
                        .map_err(|e| self.engine_err(i, e))?;
                    if *requires_grad {
                        t.set_requires_grad(true)
                            .map_err(|e| self.engine_err(i, e))?
                    } else {
                        t
                    }
                }
                _ => continue,
            };
            leaves.push(t);
        }
        // The leaves hold their values now.
        drop(values);
        let ts = self.build_checked(&g, &leaves, &infos, &opts.overrides)?;
        let last = ts.len() - 1;
        let out = ts[last];
        let host = |i: usize, t: Tensor<'_>| t.to_host().map_err(|e| self.engine_err(i, e));
        let output = NamedTensor {
            name: self.stmts[last].name.clone(),
            tensor: host(last, out)?,
        };
        if out.requires_grad() {
            let root = if out.rank() == 0 { Ok(out) } else { out.sum() };
            root.and_then(|r| r.backward())
                .map_err(|e| self.engine_err(last, e))?;
        }
        let mut vals = Vec::with_capacity(leaf_idx.len());
        let mut grads = Vec::new();
        for (&i, t) in leaf_idx.iter().zip(&leaves) {
            let name = self.stmts[i].name.clone();
            vals.push(NamedTensor {
                name: name.clone(),
                tensor: host(i, *t)?,
            });
            if self.stmts[i].expr.is_input() {
                let gr = match t.grad().map_err(|e| self.engine_err(i, e))? {
                    Some(gt) => host(i, gt)?,
                    None => HostTensor::zeros(&infos[i].shape, opts.dtype)
                        .map_err(|e| self.engine_err(i, e))?,
                };
                grads.push(NamedTensor { name, tensor: gr });
            }
        }
        Ok(RunResult {
            dtype: opts.dtype,
            output,
            values: vals,
            grads,
        })
    }
}
