//! Shape rules: every statement's shape and whether it needs grad, computed from the text alone,
//! with the size limits applied — so an ill-shaped or oversized program is a typed error before
//! any tensor is allocated.

use arenagrad_exec::layout::broadcast_shapes;
use arenagrad_exec::DType;

use super::ast::{Expr, Program};
use super::error::ProgramError;

/// Size limits applied before anything is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most dimensions a tensor may have.
    pub max_rank: usize,
    /// Most elements one tensor may hold.
    pub max_elements: usize,
    /// Most elements all of a run's buffers may hold together: every statement's value, the
    /// gradients backward makes, the leaves' generated values and the host copies of the
    /// output, the values and the gradients that a run hands back.
    pub max_total_elements: usize,
    /// Most work the forward pass may do, counted as output elements plus matmul
    /// multiply-adds, summed over statements.
    pub max_work: u64,
    /// Most work a gradient check may do: each input element costs two forward passes (and
    /// second derivatives three times that again), in the units of `max_work`.
    pub max_check_work: u64,
}

impl Default for Limits {
    /// 32 dimensions, 2^28 elements per tensor (2 GiB of `f64`), 2^30 elements in all, 2^44
    /// units of work, and 2^34 for a gradient check (about a minute on one core).
    fn default() -> Self {
        Limits {
            max_rank: 32,
            max_elements: 1 << 28,
            max_total_elements: 1 << 30,
            max_work: 1 << 44,
            max_check_work: 1 << 34,
        }
    }
}

impl Limits {
    /// Small limits for fuzzing and property tests: 8 dimensions, 4096 elements per tensor,
    /// 65536 in all, 2^22 units of work, 2^28 for a gradient check.
    pub fn small() -> Self {
        Limits {
            max_rank: 8,
            max_elements: 1 << 12,
            max_total_elements: 1 << 16,
            max_work: 1 << 22,
            max_check_work: 1 << 28,
        }
    }
}

/// What the shape rules say about one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StmtInfo {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Whether gradients flow through it (an `input`, or an op on one, except `detach`).
    pub requires_grad: bool,
    /// `None`: the run's floating dtype; an integer or boolean `const`'s dtype.
    pub dtype: Option<DType>,
    /// The forward work it does (its elements, plus multiply-adds for a matmul).
    pub work: u64,
}

/// What running a checked program holds at most, in elements: every statement's value, a
/// gradient for each statement that requires grad, each leaf's generated values (alive while
/// the leaves are made), and the host copies of the output, the leaves' values and the inputs'
/// gradients.
pub fn run_elements(p: &Program, infos: &[StmtInfo]) -> usize {
    let mut total = 0usize;
    for (s, info) in p.stmts.iter().zip(infos) {
        let n = info.shape.iter().product::<usize>();
        let mut k = 1 + usize::from(info.requires_grad);
        if let Expr::Leaf { requires_grad, .. } = &s.expr {
            k += 2 + usize::from(*requires_grad);
        }
        total = total.saturating_add(n.saturating_mul(k));
    }
    let out = infos
        .last()
        .map_or(0, |i| i.shape.iter().product::<usize>());
    total.saturating_add(out)
}

/// [`run_elements`] against `limits.max_total_elements`.
pub(crate) fn check_run(
    p: &Program,
    infos: &[StmtInfo],
    limits: &Limits,
) -> Result<(), ProgramError> {
    let need = run_elements(p, infos);
    if need > limits.max_total_elements {
        let at = At {
            p,
            i: p.stmts.len() - 1,
        };
        return Err(at.large(
            None,
            format!(
                "running the program makes buffers of {need} elements (values, gradients and \
                 host copies), more than the limit of {} in all",
                limits.max_total_elements
            ),
        ));
    }
    Ok(())
}

fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// The error of statement `i` at token `tok` (None: the op).
struct At<'p> {
    p: &'p Program,
    i: usize,
}

impl At<'_> {
    fn pos(&self, arg: Option<usize>) -> (usize, usize) {
        match arg {
            Some(k) => self.p.arg_pos(self.i, k),
            None => self.p.op_pos(self.i),
        }
    }
    fn shape(&self, arg: Option<usize>, message: String) -> ProgramError {
        let (line, column) = self.pos(arg);
        ProgramError::Shape {
            line,
            column,
            message,
        }
    }
    fn large(&self, arg: Option<usize>, message: String) -> ProgramError {
        let (line, column) = self.pos(arg);
        ProgramError::TooLarge {
            line,
            column,
            message,
        }
    }
}

/// Checks every statement; returns each one's shape and grad requirement.
pub(crate) fn check(p: &Program, limits: &Limits) -> Result<Vec<StmtInfo>, ProgramError> {
    if p.stmts.is_empty() {
        return Err(ProgramError::Parse {
            line: 1,
            column: 1,
            message: "expected at least one statement, found none".into(),
        });
    }
    let mut infos: Vec<StmtInfo> = Vec::with_capacity(p.stmts.len());
    let mut total: usize = 0;
    let mut work: u64 = 0;
    for i in 0..p.stmts.len() {
        let at = At { p, i };
        let expr = &p.stmts[i].expr;
        let ops = expr.operands();
        if let Some(&bad) = ops.iter().find(|&&o| o >= i) {
            return Err(at.shape(
                None,
                format!("operand {bad} does not name an earlier statement"),
            ));
        }
        let sh = |k: usize| -> &[usize] { &infos[ops[k]].shape };
        // An integer or boolean operand only where the row takes one, of a dtype PyTorch's op
        // takes there.
        let first_operand = match expr {
            Expr::Op { op, params, .. } if op.params_first() => params.len(),
            _ => 0,
        };
        for (k, &o) in ops.iter().enumerate() {
            let Some(d) = infos[o].dtype else {
                continue;
            };
            let takes = match expr {
                Expr::Op { op, .. } => op.integer_dtypes(k),
                _ => &[],
            };
            if !takes.contains(&d) {
                let wanted = if takes.is_empty() {
                    "a floating operand".to_string()
                } else {
                    let names: Vec<&str> = takes.iter().map(|t| t.name()).collect();
                    format!("a floating or {} operand", names.join(" or "))
                };
                return Err(at.shape(
                    Some(first_operand + k),
                    format!(
                        "`{}` takes {wanted} here, as PyTorch's does, and `{}` is a `const {}` \
                         (an integer or boolean tensor goes only where an op reads indices, \
                         targets or a mask)",
                        expr.op_name(),
                        p.stmts[o].name,
                        d.name()
                    ),
                ));
            }
        }
        let mut extra_work: u64 = 0;
        let shape: Vec<usize> = match expr {
            Expr::Leaf {
                requires_grad,
                shape,
                values,
                dtype,
            } => {
                if let Some(problem) =
                    crate::ast::leaf_dtype_problem(*requires_grad, *dtype, values.as_deref())
                {
                    return Err(at.shape(None, problem));
                }
                if shape.len() > limits.max_rank {
                    return Err(at.large(
                        None,
                        format!(
                            "a shape of rank {} exceeds the limit of {} dimensions",
                            shape.len(),
                            limits.max_rank
                        ),
                    ));
                }
                let n = numel(shape)
                    .ok_or_else(|| at.large(None, "the shape's element count overflows".into()))?;
                if let Some(v) = values {
                    if v.len() != n {
                        return Err(at.shape(
                            None,
                            format!("expected {n} values for shape {shape:?}, found {}", v.len()),
                        ));
                    }
                }
                shape.clone()
            }
            Expr::Binary { op, .. } => {
                let (a, b) = (sh(0), sh(1));
                if a == b {
                    a.to_vec()
                } else {
                    broadcast_shapes(a, b).ok_or_else(|| {
                        at.shape(
                            Some(1),
                            format!(
                                "`{}`: shapes {a:?} and {b:?} do not broadcast (expected equal \
                                 extents, or 1, in each trailing dimension)",
                                op.name()
                            ),
                        )
                    })?
                }
            }
            Expr::Unary { .. } => sh(0).to_vec(),
            Expr::Op { op, args, params } => {
                // A statement built in code is checked against its row by `Program::push`.
                op.accepts(args.len(), params)
                    .map_err(|m| at.shape(None, m))?;
                let shapes: Vec<&[usize]> = (0..args.len()).map(sh).collect();
                let out = (op.shape)(&shapes, params).map_err(|r| {
                    let message = format!("{}: {}", op.name, r.message);
                    if r.too_large {
                        at.large(r.at, message)
                    } else {
                        at.shape(r.at, message)
                    }
                })?;
                extra_work = op.work.map_or(0, |w| w(&shapes, &out, params));
                out
            }
            Expr::User { op, args } => {
                let Some(u) = crate::user_op(op) else {
                    return Err(at.shape(None, format!("`{op}` is not a registered op")));
                };
                let shapes: Vec<&[usize]> = (0..args.len()).map(sh).collect();
                if shapes.len() != u.arity() {
                    return Err(at.shape(
                        None,
                        format!(
                            "`{op}` takes {} operands, found {}",
                            u.arity(),
                            shapes.len()
                        ),
                    ));
                }
                u.out_shape(&shapes).ok_or_else(|| {
                    at.shape(
                        Some(0),
                        format!("`{op}` does not apply to operands of shapes {shapes:?}"),
                    )
                })?
            }
        };
        if shape.len() > limits.max_rank {
            return Err(at.large(
                None,
                format!(
                    "the result's rank {} exceeds the limit of {} dimensions",
                    shape.len(),
                    limits.max_rank
                ),
            ));
        }
        let n = numel(&shape).ok_or_else(|| {
            at.large(
                None,
                format!("shape {shape:?}: the element count overflows"),
            )
        })?;
        // Extents of a zero-element tensor still enter its strides: bound them as if the zero
        // extents were 1, so no stride computation can overflow.
        let span = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d.max(1)))
            .unwrap_or(usize::MAX);
        if n == 0 && span > limits.max_elements {
            return Err(at.large(
                None,
                format!(
                    "shape {shape:?}: its non-zero extents multiply to more than the limit of {} \
                     elements per tensor",
                    limits.max_elements
                ),
            ));
        }
        if n > limits.max_elements {
            return Err(at.large(
                None,
                format!(
                    "shape {shape:?} holds {n} elements, more than the limit of {} per tensor",
                    limits.max_elements
                ),
            ));
        }
        total = total.saturating_add(n);
        if total > limits.max_total_elements {
            return Err(at.large(
                None,
                format!(
                    "the program's tensors hold more than the limit of {} elements in all",
                    limits.max_total_elements
                ),
            ));
        }
        work = work
            .saturating_add(u64::try_from(n).unwrap_or(u64::MAX))
            .saturating_add(extra_work);
        if work > limits.max_work {
            return Err(at.large(
                None,
                format!(
                    "the program needs more than the limit of {} units of work",
                    limits.max_work
                ),
            ));
        }
        let requires_grad = match expr {
            Expr::Leaf { requires_grad, .. } => *requires_grad,
            Expr::Op { op, .. } if op.detaches => false,
            _ => ops.iter().any(|&o| infos[o].requires_grad),
        };
        let dtype = match expr {
            Expr::Leaf { dtype, .. } => *dtype,
            _ => None,
        };
        infos.push(StmtInfo {
            shape,
            requires_grad,
            dtype,
            work: u64::try_from(n)
                .unwrap_or(u64::MAX)
                .saturating_add(extra_work),
        });
    }
    Ok(infos)
}
