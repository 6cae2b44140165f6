//! The program as data: statements, their ops, and where they came from in the text.

use super::error::ProgramError;

pub use arenagrad_exec::{BinaryOp, UnaryOp};

/// Sum-like reductions over a list of axes (none: every axis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// `sum a [AXIS...]`
    Sum,
    /// `mean a [AXIS...]`
    Mean,
}

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
    /// `detach a`: the same values, with no gradient flowing back.
    Detach {
        /// The operand.
        x: usize,
    },
    /// `sum`/`mean` over axes (empty: all), without keepdim.
    Reduce {
        /// Which reduction.
        op: ReduceKind,
        /// The operand.
        x: usize,
        /// The axes as written (negative counts from the end).
        axes: Vec<i64>,
    },
    /// `max a AXIS`, without keepdim.
    Max {
        /// The operand.
        x: usize,
        /// The axis as written.
        axis: i64,
    },
    /// `softmax a AXIS` or `log_softmax a AXIS`.
    Softmax {
        /// The operand.
        x: usize,
        /// The axis as written.
        axis: i64,
        /// `log_softmax` when true.
        log: bool,
    },
    /// `matmul a b` with numpy's rules.
    Matmul {
        /// Left operand.
        lhs: usize,
        /// Right operand.
        rhs: usize,
    },
    /// `transpose a D0 D1`
    Transpose {
        /// The operand.
        x: usize,
        /// First axis.
        d0: i64,
        /// Second axis.
        d1: i64,
    },
    /// `permute a P...`: output axis k is input axis `perm[k]`.
    Permute {
        /// The operand.
        x: usize,
        /// The permutation as written.
        perm: Vec<i64>,
    },
    /// `reshape a D...`, one extent may be -1.
    Reshape {
        /// The operand.
        x: usize,
        /// The target shape as written.
        shape: Vec<i64>,
    },
    /// `broadcast a D...`
    Broadcast {
        /// The operand.
        x: usize,
        /// The target shape.
        shape: Vec<usize>,
    },
    /// `concat AXIS a b ...`
    Concat {
        /// The axis as written.
        axis: i64,
        /// The operands, in order.
        xs: Vec<usize>,
    },
    /// An op the application registered ([`crate::register_op`]): `NAME a b ...`.
    User {
        /// Its name.
        op: &'static str,
        /// The operands, in order.
        args: Vec<usize>,
    },
    /// A row of the format's op table ([`crate::table`]): `NAME a [b ...] P...`.
    Op {
        /// The row.
        op: &'static crate::table::OpRow,
        /// The operands, in order.
        args: Vec<usize>,
        /// The parameters, as numbers (whole ones where the row says so).
        params: Vec<f64>,
    },
    /// `slice a AXIS START END`
    Slice {
        /// The operand.
        x: usize,
        /// The axis as written.
        axis: i64,
        /// First index kept.
        start: usize,
        /// One past the last index kept.
        end: usize,
    },
}

/// The format's own ops, besides the leaves and the elementwise ops of the op tables.
pub const FORMAT_OPS: &[&str] = &[
    "detach",
    "sum",
    "mean",
    "max",
    "softmax",
    "log_softmax",
    "matmul",
    "transpose",
    "permute",
    "reshape",
    "broadcast",
    "concat",
    "slice",
];

/// Every op name of format version 1: the leaves (`input`, `const`), the public rows of the
/// binary and unary op tables, [`FORMAT_OPS`], then the rows of the format's op table
/// ([`crate::table::OPS`]).
pub fn op_names() -> &'static [&'static str] {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut v = vec!["input", "const"];
        v.extend(binary_ops().map(BinaryOp::name));
        v.extend(unary_ops().map(UnaryOp::name));
        v.extend(FORMAT_OPS);
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

impl ReduceKind {
    /// The name in the format.
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Mean => "mean",
        }
    }
}

impl Expr {
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
            Expr::Detach { .. } => "detach",
            Expr::Reduce { op, .. } => op.name(),
            Expr::Max { .. } => "max",
            Expr::Softmax { log: false, .. } => "softmax",
            Expr::Softmax { log: true, .. } => "log_softmax",
            Expr::Matmul { .. } => "matmul",
            Expr::Transpose { .. } => "transpose",
            Expr::Permute { .. } => "permute",
            Expr::Reshape { .. } => "reshape",
            Expr::Broadcast { .. } => "broadcast",
            Expr::Concat { .. } => "concat",
            Expr::Slice { .. } => "slice",
            Expr::User { op, .. } => op,
            Expr::Op { op, .. } => op.name,
        }
    }

    /// The operands (indices of earlier statements), in the order the op takes them.
    pub fn operands(&self) -> Vec<usize> {
        match self {
            Expr::Leaf { .. } => Vec::new(),
            Expr::Binary { lhs, rhs, .. } | Expr::Matmul { lhs, rhs } => vec![*lhs, *rhs],
            Expr::Unary { x, .. }
            | Expr::Detach { x }
            | Expr::Reduce { x, .. }
            | Expr::Max { x, .. }
            | Expr::Softmax { x, .. }
            | Expr::Transpose { x, .. }
            | Expr::Permute { x, .. }
            | Expr::Reshape { x, .. }
            | Expr::Broadcast { x, .. }
            | Expr::Slice { x, .. } => vec![*x],
            Expr::Concat { xs, .. } | Expr::User { args: xs, .. } | Expr::Op { args: xs, .. } => {
                xs.clone()
            }
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
                },
                Leaf {
                    requires_grad: r2,
                    shape: s2,
                    values: v2,
                },
            ) => {
                r1 == r2
                    && s1 == s2
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
            (Detach { x: x1 }, Detach { x: x2 }) => x1 == x2,
            (
                Reduce {
                    op: o1,
                    x: x1,
                    axes: a1,
                },
                Reduce {
                    op: o2,
                    x: x2,
                    axes: a2,
                },
            ) => o1 == o2 && x1 == x2 && a1 == a2,
            (Max { x: x1, axis: a1 }, Max { x: x2, axis: a2 }) => x1 == x2 && a1 == a2,
            (
                Softmax {
                    x: x1,
                    axis: a1,
                    log: l1,
                },
                Softmax {
                    x: x2,
                    axis: a2,
                    log: l2,
                },
            ) => x1 == x2 && a1 == a2 && l1 == l2,
            (Matmul { lhs: l1, rhs: r1 }, Matmul { lhs: l2, rhs: r2 }) => l1 == l2 && r1 == r2,
            (
                Transpose {
                    x: x1,
                    d0: a1,
                    d1: b1,
                },
                Transpose {
                    x: x2,
                    d0: a2,
                    d1: b2,
                },
            ) => x1 == x2 && a1 == a2 && b1 == b2,
            (Permute { x: x1, perm: p1 }, Permute { x: x2, perm: p2 }) => x1 == x2 && p1 == p2,
            (Reshape { x: x1, shape: s1 }, Reshape { x: x2, shape: s2 }) => x1 == x2 && s1 == s2,
            (Broadcast { x: x1, shape: s1 }, Broadcast { x: x2, shape: s2 }) => {
                x1 == x2 && s1 == s2
            }
            (Concat { axis: a1, xs: x1 }, Concat { axis: a2, xs: x2 }) => a1 == a2 && x1 == x2,
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
                    && p1.iter().zip(p2).all(|(x, y)| f64_same(*x, *y))
            }
            (
                Slice {
                    x: x1,
                    axis: a1,
                    start: s1,
                    end: e1,
                },
                Slice {
                    x: x2,
                    axis: a2,
                    start: s2,
                    end: e2,
                },
            ) => x1 == x2 && a1 == a2 && s1 == s2 && e1 == e2,
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
        if let Expr::Concat { xs, .. } = &expr {
            if xs.is_empty() {
                return Err(err("concat needs at least one operand".into()));
            }
        }
        if let Expr::Leaf { shape, values, .. } = &expr {
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

    /// Line and column of token `tok` of statement `i` (0: name, 1: `=`, 2: op, 3...:
    /// arguments). Falls back to the op's column, then to column 1.
    pub(crate) fn pos(&self, i: usize, tok: usize) -> (usize, usize) {
        if let Some(s) = self.spans.get(i) {
            let col = s
                .cols
                .get(tok)
                .or_else(|| s.cols.get(2))
                .copied()
                .unwrap_or(1);
            return (s.line, col);
        }
        // No source: the printed form has statement i on line i+1, tokens one space apart.
        let toks = super::printer::tokens(self, i);
        let mut cols = Vec::with_capacity(toks.len());
        let mut col = 1;
        for t in &toks {
            cols.push(col);
            col += t.chars().count() + 1;
        }
        let col = cols.get(tok).or_else(|| cols.get(2)).copied().unwrap_or(1);
        (i + 1, col)
    }

    /// The position of argument `k` of statement `i`, for errors.
    pub(crate) fn arg_pos(&self, i: usize, k: usize) -> (usize, usize) {
        self.pos(i, 3 + k)
    }

    /// The position of the op of statement `i`, for errors.
    pub(crate) fn op_pos(&self, i: usize) -> (usize, usize) {
        self.pos(i, 2)
    }
}
