//! Running a program on the engine: leaves, one op per statement (in a loop, in order), the
//! backward pass from the output, and everything copied out as owned host data.

use std::collections::BTreeMap;
use std::sync::Arc;

use arenagrad_graph::{CustomOp, DType, Graph, GraphError, HostData, HostTensor, Tensor};

use super::ast::{Expr, Program, ReduceKind};
use super::error::ProgramError;
use super::infer::{check, check_run, Limits, StmtInfo};

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

/// Whether every extent is 1 (and there is at least one).
fn all_ones(shape: &[usize]) -> bool {
    !shape.is_empty() && shape.iter().all(|&d| d == 1)
}

fn reshape_to<'g>(t: Tensor<'g>, shape: &[usize]) -> Result<Tensor<'g>, GraphError> {
    let s = shape
        .iter()
        .map(|&d| {
            isize::try_from(d).map_err(|_| GraphError::BadArgument {
                op: "program",
                what: "extent out of range",
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    t.reshape(&s)
}

/// The engine's reduction kernel asserts (in builds with debug assertions) that the innermost
/// run it walks is contiguous, which fails when it reduces some but not all axes of a tensor
/// whose extents are all 1 — directly (`sum`, `max`) or inside a backward rule that sums a
/// broadcast gradient (binary ops, `broadcast`, batched `matmul`). Every such case is a
/// one-element tensor, where the reduction or broadcast is a reshape: these rewrites use
/// reshapes, which have the same values and derivatives.
fn avoid_degenerate_reduce<'g>(
    expr: &Expr,
    args: &[Tensor<'g>],
) -> Result<Option<Tensor<'g>>, GraphError> {
    let shape = |k: usize| -> Result<Vec<usize>, GraphError> {
        match args.get(k) {
            Some(t) => Ok(t.try_shape()?.to_vec()),
            None => Err(GraphError::BadArgument {
                op: "program",
                what: "missing operand",
            }),
        }
    };
    match expr {
        Expr::Reduce { axes, .. } => {
            let s = shape(0)?;
            if all_ones(&s) {
                let mut mask = vec![axes.is_empty(); s.len()];
                for &a in axes {
                    match super::infer::norm_axis(a, s.len()) {
                        Some(d) if !mask[d] => mask[d] = true,
                        // Let the engine report a bad or repeated axis.
                        _ => return Ok(None),
                    }
                }
                let out: Vec<usize> = (0..s.len()).filter(|&d| !mask[d]).map(|_| 1).collect();
                return reshape_to(args[0], &out).map(Some);
            }
        }
        Expr::Max { axis, .. } => {
            let s = shape(0)?;
            if all_ones(&s) && super::infer::norm_axis(*axis, s.len()).is_some() {
                return reshape_to(args[0], &vec![1; s.len() - 1]).map(Some);
            }
        }
        Expr::Broadcast { shape: to, .. } => {
            let from = shape(0)?;
            let valid = arenagrad_exec::layout::broadcast_shapes(&from, to).as_deref()
                == Some(to.as_slice());
            if all_ones(to) && valid && from.as_slice() != to.as_slice() {
                return reshape_to(args[0], to).map(Some);
            }
        }
        Expr::Binary { .. } => {
            let (a, b) = (shape(0)?, shape(1)?);
            if a != b {
                if let Some(out) = arenagrad_exec::layout::broadcast_shapes(&a, &b) {
                    if all_ones(&out) {
                        let x = reshape_to(args[0], &out)?;
                        let y = reshape_to(args[1], &out)?;
                        return apply_default(x.graph(), expr, &[x, y]).map(Some);
                    }
                }
            }
        }
        Expr::Matmul { .. } => {
            let (a, b) = (shape(0)?, shape(1)?);
            if a.is_empty() || b.is_empty() {
                return Ok(None);
            }
            // Promote 1-D operands as numpy does, then compare batch shapes.
            let a2: Vec<usize> = if a.len() == 1 {
                vec![1, a[0]]
            } else {
                a.clone()
            };
            let b2: Vec<usize> = if b.len() == 1 {
                vec![b[0], 1]
            } else {
                b.clone()
            };
            let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
            let Some(batch) = arenagrad_exec::layout::broadcast_shapes(ba, bb) else {
                return Ok(None);
            };
            if all_ones(&batch) && (ba != batch.as_slice() || bb != batch.as_slice()) {
                let full = |m: &[usize]| -> Vec<usize> {
                    let mut v = batch.clone();
                    v.extend_from_slice(&m[m.len() - 2..]);
                    v
                };
                let x = reshape_to(args[0], &full(&a2))?;
                let y = reshape_to(args[1], &full(&b2))?;
                let mut out = batch.clone();
                if a.len() > 1 {
                    out.push(a2[a2.len() - 2]);
                }
                if b.len() > 1 {
                    out.push(b2[b2.len() - 1]);
                }
                return reshape_to(x.matmul(y)?, &out).map(Some);
            }
        }
        _ => {}
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
    let ax = |a: i64| {
        isize::try_from(a).map_err(|_| GraphError::BadArgument {
            op: "program",
            what: "axis out of range",
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
        Expr::Binary { op, .. } => arg(0)?.binary(*op, arg(1)?),
        Expr::Unary { op, .. } => arg(0)?.unary(*op),
        Expr::Detach { .. } => arg(0)?.detach(),
        Expr::Reduce { op, axes, .. } => {
            let a = arg(0)?;
            let axes = axes.iter().map(|&x| ax(x)).collect::<Result<Vec<_>, _>>()?;
            match op {
                ReduceKind::Sum => a.sum_axes(&axes, false),
                ReduceKind::Mean => a.mean_axes(&axes, false),
            }
        }
        Expr::Max { axis, .. } => arg(0)?.max_axes(&[ax(*axis)?], false),
        Expr::Softmax { axis, log, .. } => {
            if *log {
                arg(0)?.log_softmax(ax(*axis)?)
            } else {
                arg(0)?.softmax(ax(*axis)?)
            }
        }
        Expr::Matmul { .. } => arg(0)?.matmul(arg(1)?),
        Expr::Transpose { d0, d1, .. } => arg(0)?.transpose(ax(*d0)?, ax(*d1)?),
        Expr::Permute { perm, .. } => {
            let a = arg(0)?;
            let rank = a.try_shape()?.len();
            let p = perm
                .iter()
                .map(|&d| {
                    super::infer::norm_axis(d, rank).ok_or(GraphError::BadArgument {
                        op: "permute",
                        what: "axis out of range",
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            a.permute(&p)
        }
        Expr::Reshape { shape, .. } => {
            let s = shape
                .iter()
                .map(|&d| ax(d))
                .collect::<Result<Vec<_>, _>>()?;
            arg(0)?.reshape(&s)
        }
        Expr::Broadcast { shape, .. } => arg(0)?.broadcast_to(shape),
        Expr::Concat { axis, .. } => g.concat(args, ax(*axis)?),
        Expr::Op { op, params, .. } => (op.run)(g, args, params),
        Expr::User { op, .. } => match crate::user_op(op) {
            Some(u) => u.apply(g, args),
            None => Err(GraphError::BadArgument {
                op: "program",
                what: "an op that is not registered",
            }),
        },
        Expr::Slice {
            axis, start, end, ..
        } => arg(0)?.slice(ax(*axis)?, *start, *end),
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

/// `"f32"` or `"f64"`.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
    }
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
                    ..
                } => {
                    let t = g
                        .from_f64(v, shape, opts.dtype)
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
