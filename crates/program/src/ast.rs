//! The program as data: statements, their ops, and where they came from in the text.

use super::error::ProgramError;
use super::table::Param;
use arenagrad_exec::DType;

pub use arenagrad_exec::{BinaryOp, UnaryOp};

/// What a statement computes. Operands are indices of earlier statements.
#[derive(Debug, Clone)]
pub enum Expr {
    /// `input D...` (requires grad) or `const D...` (does not), with values given after a colon
    /// (row-major, exactly as many as the shape holds) or drawn from the seeded RNG.
    Leaf {
        /// `input` (true) or `const` (false).
        requires_grad: bool,
        /// The shape; empty for a scalar.
        shape: Vec<usize>,
        /// The values, if given.
        values: Option<Vec<f64>>,
        /// `None`: the run's floating dtype. An integer or boolean dtype (`const i64 …`,
        /// `i32`, `u8`, `bool`): a `const` whose values are given and fit it
        /// ([`leaf_dtype_problem`]), taken only where a row says an operand may be one
        /// ([`crate::table::OpRow::integer_operands`]).
        dtype: Option<DType>,
    },
    /// A broadcasting binary op: a public row of the binary op table
    /// ([`BinaryOp::is_public`]), `add a b`.
    Binary {
        /// Which op.
        op: BinaryOp,
        /// Left operand.
        lhs: usize,
        /// Right operand.
        rhs: usize,
    },
    /// An elementwise op: a public row of the unary op table ([`UnaryOp::is_public`]), `exp a`,
    /// or with its constant, `scale a S`, `shift a S`, `powf a P`.
    Unary {
        /// Which op (with its constant, if it has one).
        op: UnaryOp,
        /// The operand.
        x: usize,
    },
    /// An op the application registered ([`crate::register_op`]): `NAME a b ...`.
    User {
        /// Its name.
        op: &'static str,
        /// The operands, in order.
        args: Vec<usize>,
    },
    /// A row of the format's op table ([`crate::table`]): `NAME a [b ...] P...` (`sum`,
    /// `matmul`, `reshape`, `concat`, ...).
    Op {
        /// The row.
        op: &'static crate::table::OpRow,
        /// The operands, in order.
        args: Vec<usize>,
        /// The parameters, as written.
        params: Vec<Param>,
    },
}

/// Every op name of format version 1: the leaves (`input`, `const`), the public rows of the
/// binary and unary op tables, then the rows of the format's op table ([`crate::table::OPS`]).
pub fn op_names() -> &'static [&'static str] {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut v = vec!["input", "const"];
        v.extend(binary_ops().map(BinaryOp::name));
        v.extend(unary_ops().map(UnaryOp::name));
        v.extend(crate::table::OPS.iter().map(|r| r.name));
        v
    })
}

/// The binary ops of the format.
pub fn binary_ops() -> impl Iterator<Item = BinaryOp> {
    BinaryOp::KINDS.iter().copied().filter(|b| b.is_public())
}

/// The unary ops of the format (those with a constant at their first sample value).
pub fn unary_ops() -> impl Iterator<Item = UnaryOp> {
    UnaryOp::KINDS.iter().copied().filter(|u| u.is_public())
}

/// The format's binary op called `name`.
pub fn binary_op(name: &str) -> Option<BinaryOp> {
    binary_ops().find(|b| b.name() == name)
}

/// The format's unary op called `name` (with a constant: at its first sample value; set it with
/// [`UnaryOp::with_param`]).
pub fn unary_op(name: &str) -> Option<UnaryOp> {
    unary_ops().find(|u| u.name() == name)
}

impl Expr {
    /// An `input` (`requires_grad`) or `const` leaf of this shape, its values drawn when run.
    pub fn leaf(requires_grad: bool, shape: Vec<usize>) -> Expr {
        Expr::Leaf {
            requires_grad,
            shape,
            values: None,
            dtype: None,
        }
    }

    /// A `const` of an integer or boolean dtype holding `values` (`const i64 2 : 0 3`).
    pub fn typed_const(dtype: DType, shape: Vec<usize>, values: Vec<f64>) -> Expr {
        Expr::Leaf {
            requires_grad: false,
            shape,
            values: Some(values),
            dtype: Some(dtype),
        }
    }

    /// A statement of the format's op table: the row called `name` with these operands and
    /// parameters (whether they fit the row is checked by [`Program::push`]).
    pub fn op(name: &str, args: Vec<usize>, params: Vec<Param>) -> Option<Expr> {
        Some(Expr::Op {
            op: crate::table::op_row(name)?,
            args,
            params,
        })
    }

    /// The op's name as the format spells it (`input`, `const`, `add`, ...).
    pub fn op_name(&self) -> &'static str {
        match self {
            Expr::Leaf {
                requires_grad: true,
                ..
            } => "input",
            Expr::Leaf {
                requires_grad: false,
                ..
            } => "const",
            Expr::Binary { op, .. } => op.name(),
            Expr::Unary { op, .. } => op.name(),
            Expr::User { op, .. } => op,
            Expr::Op { op, .. } => op.name,
        }
    }

    /// The operands (indices of earlier statements), in the order the op takes them.
    pub fn operands(&self) -> Vec<usize> {
        match self {
            Expr::Leaf { .. } => Vec::new(),
            Expr::Binary { lhs, rhs, .. } => vec![*lhs, *rhs],
            Expr::Unary { x, .. } => vec![*x],
            Expr::User { args, .. } | Expr::Op { args, .. } => args.clone(),
        }
    }

    /// The operands, to rewrite.
    pub(crate) fn operands_mut(&mut self) -> Vec<&mut usize> {
        match self {
            Expr::Leaf { .. } => Vec::new(),
            Expr::Binary { lhs, rhs, .. } => vec![lhs, rhs],
            Expr::Unary { x, .. } => vec![x],
            Expr::User { args, .. } | Expr::Op { args, .. } => args.iter_mut().collect(),
        }
    }

    /// Whether this is a leaf (`input` or `const`).
    pub fn is_leaf(&self) -> bool {
        matches!(self, Expr::Leaf { .. })
    }

    /// Whether this is an `input` leaf (one that requires grad).
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            Expr::Leaf {
                requires_grad: true,
                ..
            }
        )
    }
}

fn f64_same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Equality that tells `0.0` from `-0.0` and treats every NaN as equal, so that a program equals
/// itself after printing and parsing.
impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        use Expr::*;
        match (self, other) {
            (
                Leaf {
                    requires_grad: r1,
                    shape: s1,
                    values: v1,
                    dtype: d1,
                },
                Leaf {
                    requires_grad: r2,
                    shape: s2,
                    values: v2,
                    dtype: d2,
                },
            ) => {
                r1 == r2
                    && s1 == s2
                    && d1 == d2
                    && match (v1, v2) {
                        (None, None) => true,
                        (Some(a), Some(b)) => {
                            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| f64_same(*x, *y))
                        }
                        _ => false,
                    }
            }
            (
                Binary {
                    op: o1,
                    lhs: l1,
                    rhs: r1,
                },
                Binary {
                    op: o2,
                    lhs: l2,
                    rhs: r2,
                },
            ) => o1 == o2 && l1 == l2 && r1 == r2,
            (Unary { op: o1, x: x1 }, Unary { op: o2, x: x2 }) => {
                let same_param = match (o1.param(), o2.param()) {
                    (Some(a), Some(b)) => f64_same(a, b),
                    (a, b) => a.is_none() && b.is_none(),
                };
                o1.name() == o2.name() && same_param && x1 == x2
            }
            (User { op: o1, args: a1 }, User { op: o2, args: a2 }) => o1 == o2 && a1 == a2,
            (
                Op {
                    op: o1,
                    args: a1,
                    params: p1,
                },
                Op {
                    op: o2,
                    args: a2,
                    params: p2,
                },
            ) => {
                o1.name == o2.name
                    && a1 == a2
                    && p1.len() == p2.len()
                    && p1.iter().zip(p2).all(|(x, y)| x.same(*y))
            }
            _ => false,
        }
    }
}

/// One statement: `NAME = OP ARG...`.
#[derive(Debug, Clone, PartialEq)]
pub struct Stmt {
    /// The name it defines (`[a-z_][a-z0-9_]*`).
    pub name: String,
    /// What it computes.
    pub expr: Expr,
}

/// Where a statement's tokens are in the text: the line, then the column of the name, of `=`,
/// of the op, and of each argument token in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct StmtSpan {
    pub line: usize,
    pub cols: Vec<usize>,
}

/// A program of format version 1: statements in order, the last one being the output.
///
/// Build one with [`Program::parse`] or [`Program::push`]; print it with `Display` (the printed
/// text parses back to an equal program). See the module documentation for the format.
#[derive(Clone, Default)]
pub struct Program {
    pub(crate) stmts: Vec<Stmt>,
    /// Source positions, when parsed from text (empty otherwise: positions then refer to the
    /// printed form, one statement per line).
    pub(crate) spans: Vec<StmtSpan>,
}

/// Shows the program's text (what a failing property test prints).
impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Program {{\n{self}}}")
    }
}

impl PartialEq for Program {
    fn eq(&self, other: &Self) -> bool {
        self.stmts == other.stmts
    }
}

/// Whether `s` is a valid statement name: `[a-z_][a-z0-9_]*`.
pub fn is_valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_lowercase() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl Program {
    /// An empty program (not runnable until it has a statement).
    pub fn new() -> Self {
        Program::default()
    }

    /// The statements, in order.
    pub fn statements(&self) -> &[Stmt] {
        &self.stmts
    }

    /// Number of statements (leaves included).
    pub fn len(&self) -> usize {
        self.stmts.len()
    }

    /// Whether there are no statements.
    pub fn is_empty(&self) -> bool {
        self.stmts.is_empty()
    }

    /// The index of the output statement (the last one), if any.
    pub fn output(&self) -> Option<usize> {
        self.stmts.len().checked_sub(1)
    }

    /// The index of the statement defining `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.stmts.iter().position(|s| s.name == name)
    }

    /// Indices of the leaf statements (`input` and `const`), in order.
    pub fn leaves(&self) -> Vec<usize> {
        (0..self.stmts.len())
            .filter(|&i| self.stmts[i].expr.is_leaf())
            .collect()
    }

    /// Indices of the `input` statements, in order.
    pub fn inputs(&self) -> Vec<usize> {
        (0..self.stmts.len())
            .filter(|&i| self.stmts[i].expr.is_input())
            .collect()
    }

    /// Appends a statement and returns its index. The name must be valid and new, and every
    /// operand must name an earlier statement; shapes are checked later (by
    /// [`Program::check`] or when run).
    pub fn push(&mut self, name: &str, expr: Expr) -> Result<usize, ProgramError> {
        let line = self.stmts.len() + 1;
        let err = |message: String| ProgramError::Parse {
            line,
            column: 1,
            message,
        };
        if !is_valid_name(name) {
            return Err(err(format!(
                "expected a name matching [a-z_][a-z0-9_]*, found {name:?}"
            )));
        }
        if self.index_of(name).is_some() {
            return Err(err(format!("`{name}` is already defined")));
        }
        if let Some(&bad) = expr.operands().iter().find(|&&o| o >= self.stmts.len()) {
            return Err(err(format!(
                "operand {bad} does not name an earlier statement (there are {})",
                self.stmts.len()
            )));
        }
        if let Expr::Op { op, args, params } = &expr {
            op.accepts(args.len(), params).map_err(err)?;
        }
        if let Expr::Leaf {
            requires_grad,
            shape,
            values,
            dtype,
        } = &expr
        {
            if let Some(problem) = leaf_dtype_problem(*requires_grad, *dtype, values.as_deref()) {
                return Err(err(problem));
            }
            let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let Some(n) = n else {
                return Err(ProgramError::TooLarge {
                    line,
                    column: 1,
                    message: format!("shape {shape:?}: the element count overflows"),
                });
            };
            if let Some(v) = values {
                if n != v.len() {
                    return Err(err(format!("{} values given for shape {shape:?}", v.len())));
                }
            }
        }
        self.stmts.push(Stmt {
            name: name.to_string(),
            expr,
        });
        // Positions of pushed statements come from the printed form.
        self.spans.clear();
        Ok(self.stmts.len() - 1)
    }
}

/// Why a leaf of `dtype` cannot be (`None`: it can). A leaf without a dtype is the run's float;
/// one with a dtype must be an integer or boolean `const` (no gradient flows through those)
/// whose values are given (nothing draws integers) and each fits the dtype: whole numbers in
/// its range, 0 or 1 for `bool`.
pub fn leaf_dtype_problem(
    requires_grad: bool,
    dtype: Option<DType>,
    values: Option<&[f64]>,
) -> Option<String> {
    let d = dtype?;
    if d.is_float() {
        return Some(format!(
            "a leaf takes an integer or boolean dtype (i64, i32, u8, bool), not {}: a program's \
             floating values all have the run's dtype",
            d.name()
        ));
    }
    if requires_grad {
        return Some(format!(
            "an `input` cannot be {}: no gradient flows through integers and booleans (write \
             `const {} …`)",
            d.name(),
            d.name()
        ));
    }
    let Some(v) = values else {
        return Some(format!(
            "a `const {}` gives its values after `:` (nothing draws them)",
            d.name()
        ));
    };
    let (lo, hi) = match d {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (0.0, 255.0),
        DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
        // Whole numbers an f64 holds exactly, as the index ops read them: below 2⁵³.
        _ => (-9_007_199_254_740_991.0, 9_007_199_254_740_991.0),
    };
    v.iter()
        .position(|&x| !(x.fract() == 0.0 && (lo..=hi).contains(&x)))
        .map(|k| {
            format!(
                "value {k} of a `const {}`, {}, is not a whole number in {lo}..={hi}",
                d.name(),
                crate::printer::float(v[k])
            )
        })
}
