//! The format's op table: one row for every op that is neither a leaf nor an elementwise row of
//! the engine's op tables — how it is written (its operands and parameters), its shape rule, how
//! it runs, whether it is smooth and how random programs draw it. The parser, the printer, shape
//! inference, the runner, the generator and the fuzz targets read the rows and name no op
//! themselves.
//!
//! Every row is written `NAME a [b ...] P...`: the operands by name, then the parameters as
//! numbers (integers where the row says so; `einsum`'s one parameter is its subscripts, one
//! token as PyTorch writes them), with two variations a row may declare: a variadic
//! tail (`sum a AXIS...`, `reshape a D...`: any number of one more kind of parameter) or variadic
//! operands after the parameters (`concat AXIS a b ...`). [`OpRow::usage`] spells a row's form.
//!
//! # Adding an op to the format
//!
//! 1. Write its row as a `const` in the file of its family — `reduce.rs` (reductions, scans,
//!    softmax), `layout.rs` (ops that move, select or join elements), `rearrange.rs` (ops that
//!    reorder or tile them), `index.rs` (ops that take indices as their second operand), `spatial.rs` (`torch.nn.functional`'s ops for images and sequences,
//!    which the `nn` crate runs), `loss.rs` (its losses, which `nn` runs too) or `compute.rs`
//!    (the rest):
//!    [`OpRow::new`] with the name, the shape rule and the forward, then what differs from the
//!    defaults (operands, parameters, smoothness, how random programs draw it). The shape rule
//!    refuses everything the engine would refuse, pointing at the argument at fault
//!    ([`Refusal`]); the runner checks that the engine's shape is the rule's.
//! 2. List it in [`OPS`] (a row left out is dead code, which the lints refuse).
//! 3. Name it in the op table of the crate's documentation and in `docs/testing.md`
//!    (`tests/op_docs.rs` fails, naming the op, until both do), and give it a reference case in
//!    `tests/program_reference.rs` (`every_op_is_covered` fails until it has one).
//!
//! Parsing, printing, shape inference, running, random generation and the fuzz targets then
//! take it up with nothing more to write; this module's tests round-trip every row through the
//! text format.

mod compute;
mod index;
mod layout;
mod loss;
mod rearrange;
mod reduce;
mod spatial;

use arenagrad_exec::{DType, Positive};
use arenagrad_graph::{Graph, GraphError, Tensor};

// The integer and boolean dtypes PyTorch 2.15's ops take (it refuses the others, naming them).
/// Indices (`gather`, `index_select`, the scatters, `index_add`).
const INDEX: &[DType] = &[DType::I64, DType::I32];
/// Class targets (`cross_entropy`, `nll_loss`: "Long or Byte").
const TARGET: &[DType] = &[DType::I64, DType::U8];
/// `masked_fill`'s mask.
const MASK: &[DType] = &[DType::Bool];
/// `where`'s condition.
const CONDITION: &[DType] = &[DType::Bool, DType::U8];

/// What kind of number a parameter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// A whole number, negative allowed (an axis, a diagonal offset), within `i64`.
    Int,
    /// A non-negative whole number (a count, an index, an extent), within `usize`.
    Count,
    /// Any number (`inf`, `-inf` and `nan` included).
    Float,
    /// `einsum` subscripts as PyTorch writes them, one token: `ij,jk->ik` ([`Subscripts`]).
    Subscripts,
}

impl ParamKind {
    /// How an error message describes a number of this kind.
    pub fn described(self) -> &'static str {
        match self {
            ParamKind::Int => "an integer",
            ParamKind::Count => "a non-negative integer",
            ParamKind::Float => "a number",
            ParamKind::Subscripts => "letters, commas, `...` and `->`",
        }
    }
}

/// `einsum` subscripts, one token of at most [`Subscripts::MAX_LEN`] ASCII letters, commas,
/// dots, `-` and `>` (`ij,jk->ik`, `bhqd,bhkd->bhqk`, `i,j`, `...ij,...jk->...ik`). Whether they fit the operands is the
/// shape rule's question; this is what the tokenizer and the printer agree on.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subscripts {
    len: u8,
    bytes: [u8; Subscripts::MAX_LEN],
}

impl Subscripts {
    /// The longest token (two operands of rank 8 and an output of rank 8 need 27, with
    /// ellipses fewer).
    pub const MAX_LEN: usize = 32;

    /// The subscripts written `text`, if it is one token of the allowed characters.
    pub fn new(text: &str) -> Option<Subscripts> {
        let ok = |b: u8| b.is_ascii_alphabetic() || matches!(b, b',' | b'.' | b'-' | b'>');
        if text.is_empty() || text.len() > Self::MAX_LEN || !text.bytes().all(ok) {
            return None;
        }
        let mut bytes = [0u8; Self::MAX_LEN];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(Subscripts {
            len: text.len() as u8,
            bytes,
        })
    }

    /// As written.
    pub fn as_str(&self) -> &str {
        // Only ASCII bytes are ever stored (`new`), so the prefix is UTF-8.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    /// The subscripts random programs draw ([`DRAWN_SUBSCRIPTS`]), the `k`-th (modulo their
    /// number).
    pub fn drawn(k: usize) -> Subscripts {
        let text = DRAWN_SUBSCRIPTS[k % DRAWN_SUBSCRIPTS.len()];
        Subscripts::new(text).expect("invariant: the drawn subscripts are valid tokens")
    }
}

impl std::fmt::Debug for Subscripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The `einsum` subscripts random programs draw: contractions that are matrix products
/// (batched, transposed on either side, with the output's axes reordered), matrix-vector
/// products, dots, outer products, a letter of one operand alone summed first, ellipses (kept,
/// summed, implicit) and diagonals; the generator gives some shared axes an extent of 1 on one side,
/// which broadcasts.
pub const DRAWN_SUBSCRIPTS: &[&str] = &[
    "i,i->",
    "i,j->ij",
    "i,ij->j",
    "ij,jk->ik",
    "ij,kj->ik",
    "ij,ik->jk",
    "ij,j->i",
    "ij,ij->i",
    "ij,jk",
    "ij,k->i",
    "bij,bjk->bik",
    "bij,bkj->bik",
    "bij,jk->bik",
    "bij,bjk->kbi",
    "ijk,jk->i",
    "bhqd,bhkd->bhqk",
    "bhqk,bhkd->bhqd",
    "...ij,...jk->...ik",
    "...i,...i->...",
    "i...,i...->...",
    "...ij,jk",
    "ij...,jk...->ik",
    "ij,jj->i",
    "bij,jj",
];

/// A parameter's value, exactly as written: whole numbers stay whole (an axis of `2^60` is not
/// rounded to a float).
#[derive(Debug, Clone, Copy)]
pub enum Param {
    /// A [`ParamKind::Int`].
    Int(i64),
    /// A [`ParamKind::Count`].
    Count(usize),
    /// A [`ParamKind::Float`].
    Float(f64),
    /// A [`ParamKind::Subscripts`].
    Subscripts(Subscripts),
}

impl Param {
    /// The value `v` as a parameter of kind `kind` (a whole number is cut toward zero and
    /// saturates, as `as` does; subscripts are the `v`-th that random programs draw,
    /// [`Subscripts::drawn`]).
    pub fn of_kind(kind: ParamKind, v: f64) -> Param {
        match kind {
            ParamKind::Int => Param::Int(v as i64),
            ParamKind::Count => Param::Count(v as usize),
            ParamKind::Float => Param::Float(v),
            ParamKind::Subscripts => Param::Subscripts(Subscripts::drawn(v as usize)),
        }
    }

    /// Its kind.
    pub fn kind(self) -> ParamKind {
        match self {
            Param::Int(_) => ParamKind::Int,
            Param::Count(_) => ParamKind::Count,
            Param::Float(_) => ParamKind::Float,
            Param::Subscripts(_) => ParamKind::Subscripts,
        }
    }

    /// As a float (a whole number beyond 2^53 rounds; subscripts are NaN).
    pub fn as_f64(self) -> f64 {
        match self {
            Param::Int(v) => v as f64,
            Param::Count(v) => v as f64,
            Param::Float(v) => v,
            Param::Subscripts(_) => f64::NAN,
        }
    }

    /// As a signed whole number (saturating; a float is cut toward zero; subscripts are 0).
    pub fn as_i64(self) -> i64 {
        match self {
            Param::Int(v) => v,
            Param::Count(v) => i64::try_from(v).unwrap_or(i64::MAX),
            Param::Float(v) => v as i64,
            Param::Subscripts(_) => 0,
        }
    }

    /// As a count (a negative number is 0; saturating; a float is cut toward zero; subscripts
    /// are 0).
    pub fn as_usize(self) -> usize {
        match self {
            Param::Int(v) => usize::try_from(v).unwrap_or(0),
            Param::Count(v) => v,
            Param::Float(v) => v as usize,
            Param::Subscripts(_) => 0,
        }
    }

    /// The subscripts, if this is a [`ParamKind::Subscripts`] parameter.
    pub fn subscripts(&self) -> Option<&str> {
        match self {
            Param::Subscripts(s) => Some(s.as_str()),
            _ => None,
        }
    }

    /// The same kind and value; every NaN equals every NaN, and `0.0` differs from `-0.0`
    /// (what printing and parsing preserve).
    pub fn same(self, other: Param) -> bool {
        match (self, other) {
            (Param::Int(a), Param::Int(b)) => a == b,
            (Param::Count(a), Param::Count(b)) => a == b,
            (Param::Float(a), Param::Float(b)) => {
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
            }
            (Param::Subscripts(a), Param::Subscripts(b)) => a == b,
            _ => false,
        }
    }
}

/// As the format writes it: whole numbers in decimal, floats in Rust's shortest round-trip form
/// (`{:?}`: `1.0`, `-0.0`, `inf`, `NaN`), which the parser reads back bit for bit.
impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Param::Int(v) => write!(f, "{v}"),
            Param::Count(v) => write!(f, "{v}"),
            Param::Float(v) => write!(f, "{v:?}"),
            Param::Subscripts(s) => f.write_str(s.as_str()),
        }
    }
}

/// One parameter of a row: what messages call it, how the usage line spells it, its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    /// What an error message calls it (`"the axis"`).
    pub what: &'static str,
    /// How [`OpRow::usage`] spells it (`"AXIS"`).
    pub token: &'static str,
    /// Its kind.
    pub kind: ParamKind,
}

const fn int(what: &'static str, token: &'static str) -> ParamSpec {
    ParamSpec {
        what,
        token,
        kind: ParamKind::Int,
    }
}

const fn count(what: &'static str, token: &'static str) -> ParamSpec {
    ParamSpec {
        what,
        token,
        kind: ParamKind::Count,
    }
}

const fn float(what: &'static str, token: &'static str) -> ParamSpec {
    ParamSpec {
        what,
        token,
        kind: ParamKind::Float,
    }
}

const fn subscripts(what: &'static str, token: &'static str) -> ParamSpec {
    ParamSpec {
        what,
        token,
        kind: ParamKind::Subscripts,
    }
}

/// How many operands a row takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exactly(usize),
    /// This many or more (written after the parameters: `concat AXIS a b ...`).
    AtLeast(usize),
}

impl Arity {
    /// The fewest operands.
    pub fn min(self) -> usize {
        match self {
            Arity::Exactly(n) | Arity::AtLeast(n) => n,
        }
    }

    /// Whether `n` operands are allowed.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

/// Why a shape rule refuses a statement, and which argument to point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The argument token at fault (0: the first after the op, in the order the statement is
    /// written); `None`: the op itself.
    pub at: Option<usize>,
    /// What is wrong, without the op's name (the error adds it).
    pub message: String,
    /// A size beyond what can be represented (an overflow), rather than a misfit.
    pub too_large: bool,
}

impl Refusal {
    /// A misfit at argument token `k`.
    pub fn at(k: usize, message: impl Into<String>) -> Refusal {
        Refusal {
            at: Some(k),
            message: message.into(),
            too_large: false,
        }
    }

    /// A misfit of the statement as a whole (pointing at the op).
    pub fn op(message: impl Into<String>) -> Refusal {
        Refusal {
            at: None,
            message: message.into(),
            too_large: false,
        }
    }

    /// An overflow at argument token `k`.
    pub fn too_large(k: usize, message: impl Into<String>) -> Refusal {
        Refusal {
            at: Some(k),
            message: message.into(),
            too_large: true,
        }
    }
}

/// A misfit at the first argument.
impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal::at(0, message)
    }
}

/// The shape rule: the output's shape from the operands' shapes and the parameters, or why the
/// op does not apply.
pub type ShapeFn = fn(&[&[usize]], &[Param]) -> Result<Vec<usize>, Refusal>;
/// The forward, recorded: the output from the operands and the parameters.
pub type RunFn = for<'g> fn(&'g Graph, &[Tensor<'g>], &[Param]) -> Result<Tensor<'g>, GraphError>;
/// Work beyond one unit per output element (a matrix product's multiply-adds), from the
/// operands' shapes, the output's and the parameters, for [`crate::Limits::max_work`].
pub type WorkFn = fn(&[&[usize]], &[usize], &[Param]) -> u64;

/// What a generator of random programs knows when it draws a row: every value made so far (its
/// shape, and whether its values are all positive), the operand drawn, and the choice's bytes.
pub struct Draw<'a> {
    shapes: &'a [Vec<usize>],
    positive: &'a [bool],
    /// Which values are integer or boolean `const`s (operands only where a row takes them).
    typed: &'a [bool],
    /// The operand drawn (an index into the values made so far).
    pub a: usize,
    /// A byte for choosing a second operand.
    pub b: u8,
    /// Four bytes of attributes (axes, constants, extents).
    pub attrs: [u8; 4],
    /// The largest extent a leaf may have.
    pub max_dim: usize,
    fits: &'a dyn Fn(&[usize]) -> bool,
    fresh: Vec<FreshLeaf>,
}

/// A leaf a row's draw asks for, made just before its statement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FreshLeaf {
    /// Its shape.
    pub(crate) shape: Vec<usize>,
    /// What it holds.
    pub(crate) kind: FreshKind,
}

/// What a fresh leaf holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum FreshKind {
    /// An `input` of values from the choice's bytes (positive where the drawn operand is).
    Input,
    /// An `input` of values strictly between 0 and 1 (probabilities).
    Probabilities,
    /// A `const` of whole numbers in `0..n` (indices): of the run's float dtype or, as the
    /// choice's bytes say, an `i64`, `i32` or `u8` one.
    Indices(usize),
}

impl<'a> Draw<'a> {
    pub(crate) fn new(
        (shapes, positive, typed): (&'a [Vec<usize>], &'a [bool], &'a [bool]),
        (a, b, attrs): (usize, u8, [u8; 4]),
        max_dim: usize,
        fits: &'a dyn Fn(&[usize]) -> bool,
    ) -> Self {
        Draw {
            shapes,
            positive,
            typed,
            a,
            b,
            attrs,
            max_dim,
            fits,
            fresh: Vec::new(),
        }
    }

    /// The shape of value `i` (made so far, or a fresh leaf asked for).
    pub fn shape(&self, i: usize) -> &[usize] {
        match self.shapes.get(i) {
            Some(s) => s,
            None => i
                .checked_sub(self.shapes.len())
                .and_then(|k| self.fresh.get(k))
                .map_or(&[], |f| &f.shape),
        }
    }

    /// Whether value `i`'s values are all positive.
    pub fn is_positive(&self, i: usize) -> bool {
        self.positive.get(i).copied().unwrap_or(false)
    }

    /// Whether a tensor of this shape is within the generator's limits.
    pub fn fits(&self, shape: &[usize]) -> bool {
        (self.fits)(shape)
    }

    /// Among the floating values made so far whose shapes `ok` accepts, the one `sel` selects.
    pub fn pick(&self, ok: impl Fn(&[usize]) -> bool, sel: u8) -> Option<usize> {
        let cands: Vec<usize> = (0..self.shapes.len())
            .filter(|&j| !self.typed.get(j).copied().unwrap_or(false) && ok(&self.shapes[j]))
            .collect();
        (!cands.is_empty()).then(|| cands[usize::from(sel) % cands.len()])
    }

    /// A new `input` of this shape (values drawn from the choice's bytes, positive where
    /// operand `a` is), made just before the statement: its index.
    pub fn fresh_input(&mut self, shape: Vec<usize>) -> usize {
        self.fresh_leaf(shape, FreshKind::Input)
    }

    /// A new `input` of this shape holding values strictly between 0 and 1 (a binary
    /// cross-entropy's probabilities, a divergence's target distribution). Its index.
    pub fn fresh_probabilities(&mut self, shape: Vec<usize>) -> usize {
        self.fresh_leaf(shape, FreshKind::Probabilities)
    }

    /// A new `const` of this shape holding whole numbers in `0..bound` (drawn from the
    /// choice's bytes; `bound` at least 1): indices for a gather or a scatter. Its index.
    pub fn fresh_indices(&mut self, shape: Vec<usize>, bound: usize) -> usize {
        self.fresh_leaf(shape, FreshKind::Indices(bound.max(1)))
    }

    fn fresh_leaf(&mut self, shape: Vec<usize>, kind: FreshKind) -> usize {
        self.fresh.push(FreshLeaf { shape, kind });
        self.shapes.len() + self.fresh.len() - 1
    }

    /// The fresh leaves asked for, in the order of their indices.
    pub(crate) fn fresh(&self) -> &[FreshLeaf] {
        &self.fresh
    }
}

/// What a generator drew: the operands (indices of values made so far, or of the fresh input)
/// and the parameters (whole numbers as floats; each converted to its kind).
pub type Drawn = (Vec<usize>, Vec<f64>);

/// How random programs draw a row.
#[derive(Clone, Copy)]
pub enum Gen {
    /// Every operand is the operand drawn (self-attention, a stack of one value twice); the
    /// parameters from its shape and the attribute bytes; `None` where the op cannot apply.
    Params(fn(&[usize], [u8; 4]) -> Option<Vec<f64>>),
    /// Operands and parameters chosen with every value made so far in view; `None` where the
    /// op cannot apply.
    Operands(fn(&mut Draw<'_>) -> Option<Drawn>),
}

/// One op of the table. Build one with [`OpRow::new`] and the methods that change a default.
#[derive(Clone, Copy)]
pub struct OpRow {
    /// The name in programs.
    pub name: &'static str,
    /// Its operands (tensors, by name).
    pub arity: Arity,
    /// Its parameters, in order.
    pub params: &'static [ParamSpec],
    /// Any number of parameters of one more kind after those (`sum a AXIS...`).
    pub rest: Option<ParamSpec>,
    /// Differentiable everywhere on the values random programs generate (gradient checks draw
    /// it).
    pub smooth: bool,
    /// No gradient flows through it (`detach`).
    pub detaches: bool,
    /// When its output is positive, for random programs (ops of positive domain draw positive
    /// operands): `IfInput`, when every operand is.
    pub positive: Positive,
    /// See [`ShapeFn`].
    pub shape: ShapeFn,
    /// See [`WorkFn`].
    pub work: Option<WorkFn>,
    /// See [`RunFn`].
    pub run: RunFn,
    /// See [`Gen`]; `None`: random programs do not draw the op.
    pub gen: Option<Gen>,
    /// The operands (by position among the operands) that may be an integer or boolean
    /// `const` (`const i64 …`), each with the dtypes PyTorch's op takes there: indices, class
    /// targets, masks. Every other operand is floating.
    pub integer_operands: &'static [(usize, &'static [DType])],
}

impl OpRow {
    /// A row of one operand and no parameters, smooth, whose output random programs treat as
    /// never positive, and which they do not draw.
    pub const fn new(name: &'static str, shape: ShapeFn, run: RunFn) -> OpRow {
        OpRow {
            name,
            arity: Arity::Exactly(1),
            params: &[],
            rest: None,
            smooth: true,
            detaches: false,
            positive: Positive::Never,
            shape,
            work: None,
            run,
            gen: None,
            integer_operands: &[],
        }
    }

    /// With these operands (positions among the operands) taking integer or boolean `const`s
    /// of the dtypes listed, as well as floating values.
    pub const fn integers(self, integer_operands: &'static [(usize, &'static [DType])]) -> OpRow {
        OpRow {
            integer_operands,
            ..self
        }
    }

    /// With these operands.
    pub const fn arity(self, arity: Arity) -> OpRow {
        OpRow { arity, ..self }
    }

    /// With these parameters.
    pub const fn params(self, params: &'static [ParamSpec]) -> OpRow {
        OpRow { params, ..self }
    }

    /// With any number of `rest` after the parameters.
    pub const fn rest(self, rest: ParamSpec) -> OpRow {
        OpRow {
            rest: Some(rest),
            ..self
        }
    }

    /// Not differentiable everywhere (kinks, ties, steps).
    pub const fn kinked(self) -> OpRow {
        OpRow {
            smooth: false,
            ..self
        }
    }

    /// Cuts the gradient.
    pub const fn detaching(self) -> OpRow {
        OpRow {
            detaches: true,
            smooth: false,
            ..self
        }
    }

    /// With this positivity of its output.
    pub const fn positive(self, positive: Positive) -> OpRow {
        OpRow { positive, ..self }
    }

    /// With work beyond its output's elements.
    pub const fn work(self, work: WorkFn) -> OpRow {
        OpRow {
            work: Some(work),
            ..self
        }
    }

    /// Drawn by random programs this way.
    pub const fn gen(self, gen: Gen) -> OpRow {
        OpRow {
            gen: Some(gen),
            ..self
        }
    }

    /// Whether the parameters come before the operands (variadic operands: `concat AXIS a b`).
    pub fn params_first(&self) -> bool {
        matches!(self.arity, Arity::AtLeast(_))
    }

    /// The integer or boolean dtypes operand `k` may have (none: floating only).
    pub fn integer_dtypes(&self, k: usize) -> &'static [DType] {
        self.integer_operands
            .iter()
            .find(|(j, _)| *j == k)
            .map_or(&[], |(_, d)| d)
    }

    /// The kind of parameter `k` (of the fixed ones, then of the tail), if it may have one.
    pub fn param_spec(&self, k: usize) -> Option<ParamSpec> {
        self.params.get(k).copied().or(self.rest)
    }

    /// How a statement of this op is written, as error messages show it:
    /// `slice A AXIS START END`, `sum A [AXIS ...]`, `concat AXIS A [B ...]`.
    pub fn usage(&self) -> String {
        let operands: Vec<String> = match self.arity {
            Arity::Exactly(n) => (0..n).map(operand_token).collect(),
            Arity::AtLeast(n) => {
                let mut v: Vec<String> = (0..n).map(operand_token).collect();
                v.push(format!("[{} ...]", operand_token(n)));
                v
            }
        };
        let mut params: Vec<String> = self.params.iter().map(|p| p.token.to_string()).collect();
        if let Some(r) = self.rest {
            params.push(format!("[{} ...]", r.token));
        }
        let mut words = vec![self.name.to_string()];
        if self.params_first() {
            words.extend(params);
            words.extend(operands);
        } else {
            words.extend(operands);
            words.extend(params);
        }
        words.join(" ")
    }

    /// What error messages call operand `k` (`the operand`, `the second operand`).
    pub fn operand_what(&self, k: usize) -> &'static str {
        match (self.arity, k) {
            (Arity::Exactly(1), _) => "the operand",
            (Arity::Exactly(2), 0) => "the first operand",
            (Arity::Exactly(2), _) => "the second operand",
            _ => "an operand",
        }
    }

    /// Whether these operands and parameters are a statement of this row (their number, and
    /// each parameter's kind): what a statement built in code must satisfy before its shape
    /// rule is asked.
    pub fn accepts(&self, operands: usize, params: &[Param]) -> Result<(), String> {
        if !self.arity.accepts(operands) {
            let n = self.arity.min();
            return Err(match self.arity {
                Arity::Exactly(_) => {
                    format!("`{}` takes {n} operands, found {operands}", self.name)
                }
                Arity::AtLeast(_) => format!(
                    "`{}` takes at least {n} operand{}, found {operands}",
                    self.name,
                    if n == 1 { "" } else { "s" }
                ),
            });
        }
        let fixed = self.params.len();
        if params.len() < fixed || (params.len() > fixed && self.rest.is_none()) {
            return Err(format!(
                "`{}` takes {fixed}{} parameters, found {}",
                self.name,
                if self.rest.is_some() { " or more" } else { "" },
                params.len()
            ));
        }
        for (k, p) in params.iter().enumerate() {
            let want = self.param_spec(k).map(|s| s.kind);
            if want != Some(p.kind()) {
                return Err(format!(
                    "`{}`: parameter {k} is {:?}, expected {}",
                    self.name,
                    p,
                    want.map_or("none", ParamKind::described)
                ));
            }
        }
        Ok(())
    }
}

fn operand_token(k: usize) -> String {
    char::from(b'A' + (k % 26) as u8).to_string()
}

impl std::fmt::Debug for OpRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The table, in the order the format lists its ops (`op_names`, the generator's op indices).
pub const OPS: &[OpRow] = &[
    layout::DETACH,
    reduce::SUM,
    reduce::MEAN,
    reduce::MAX,
    reduce::SOFTMAX,
    reduce::LOG_SOFTMAX,
    compute::MATMUL,
    layout::TRANSPOSE,
    layout::PERMUTE,
    layout::RESHAPE,
    layout::BROADCAST,
    layout::CONCAT,
    layout::SLICE,
    reduce::CUMSUM,
    reduce::LOGSUMEXP,
    reduce::MIN,
    reduce::MAX_DIM,
    reduce::NORM,
    compute::CLAMP,
    layout::TRIL,
    layout::TRIU,
    compute::MASKED_FILL,
    compute::LAYER_NORM,
    compute::RMS_NORM,
    compute::ATTENTION,
    layout::STACK,
    layout::SLICE_STEP,
    layout::CHUNK,
    layout::SPLIT,
    layout::UNBIND,
    compute::ONE_HOT,
    compute::ARANGE,
    rearrange::FLIP,
    rearrange::ROLL,
    rearrange::REPEAT,
    rearrange::SORT,
    rearrange::TOPK,
    compute::CONV2D,
    compute::CONV_TRANSPOSE2D,
    rearrange::REPEAT_INTERLEAVE,
    rearrange::UNSQUEEZE,
    rearrange::SQUEEZE,
    compute::WHERE,
    compute::CONV1D,
    compute::CONV_TRANSPOSE1D,
    spatial::PAD_CONSTANT,
    spatial::PAD_REFLECT,
    spatial::PAD_REPLICATE,
    spatial::PAD_CIRCULAR,
    spatial::INTERPOLATE_NEAREST,
    spatial::INTERPOLATE_BILINEAR,
    spatial::INTERPOLATE_NEAREST_SCALE,
    spatial::INTERPOLATE_BILINEAR_SCALE,
    spatial::INTERPOLATE_NEAREST1D,
    spatial::INTERPOLATE_LINEAR,
    spatial::INTERPOLATE_NEAREST1D_SCALE,
    spatial::INTERPOLATE_LINEAR_SCALE,
    spatial::ADAPTIVE_AVG_POOL2D,
    spatial::ADAPTIVE_MAX_POOL2D,
    spatial::GROUP_NORM,
    spatial::INSTANCE_NORM,
    index::GATHER,
    index::INDEX_SELECT,
    index::SCATTER_ADD,
    index::SCATTER_REDUCE,
    index::INDEX_ADD,
    loss::MSE_LOSS,
    loss::L1_LOSS,
    loss::SMOOTH_L1_LOSS,
    loss::HUBER_LOSS,
    loss::KL_DIV,
    loss::BCE,
    loss::BCE_WITH_LOGITS,
    loss::CROSS_ENTROPY,
    loss::NLL_LOSS,
    compute::EINSUM,
];

/// The row called `name`.
pub fn op_row(name: &str) -> Option<&'static OpRow> {
    OPS.iter().find(|r| r.name == name)
}

/// Resolves a possibly negative axis against a rank.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if axis < 0 { axis.checked_add(r)? } else { axis };
    if (0..r).contains(&a) {
        usize::try_from(a).ok()
    } else {
        None
    }
}

/// Parameter `p` as an axis of shape `s`, or why not (the message of the older rows).
fn axis(s: &[usize], p: Param) -> Result<usize, String> {
    norm_axis(p.as_i64(), s.len())
        .ok_or_else(|| format!("axis {p} is out of range for shape {s:?}"))
}

/// An axis parameter as the engine takes it (the engine resolves negative axes).
fn ax(p: Param) -> isize {
    isize::try_from(p.as_i64()).unwrap_or(if p.as_i64() < 0 {
        isize::MIN
    } else {
        isize::MAX
    })
}

/// Parameter `p` at argument `k` as a flag (0 or 1) called `what`, or a refusal pointing at it.
fn flag_at(p: Param, k: usize, what: &str) -> Result<bool, Refusal> {
    match p.as_usize() {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Refusal::at(k, format!("{what} {p}: expected 0 or 1"))),
    }
}

/// `t`'s values as `i64`s, for `op`: each a whole number of magnitude below 2⁵³ (and not
/// negative unless `negative_ok`), else `what` is the error. Indices and class targets are
/// integer `const`s or tensors of whole numbers of the run's floating dtype: both read here.
fn whole_values(
    t: Tensor<'_>,
    op: &'static str,
    what: &'static str,
    negative_ok: bool,
) -> Result<Vec<i64>, GraphError> {
    t.to_vec_f64()?
        .into_iter()
        .map(|v| {
            let whole = v.fract() == 0.0 && v.abs() < 9.007_199_254_740_992e15;
            if whole && (negative_ok || v >= 0.0) {
                Ok(v as i64)
            } else {
                Err(GraphError::BadArgument { op, what })
            }
        })
        .collect()
}

/// Parameter `p` at argument `k` as an axis of shape `s`, or a refusal pointing at it that says
/// which axes there are.
fn axis_at(s: &[usize], p: Param, k: usize) -> Result<usize, Refusal> {
    norm_axis(p.as_i64(), s.len()).ok_or_else(|| {
        let r = s.len();
        let expect = if r == 0 {
            "a tensor of rank 0 has no axes".to_string()
        } else {
            format!("expected an axis in -{r}..{r}")
        };
        Refusal::at(
            k,
            format!("axis {p} is out of range for shape {s:?}: {expect}"),
        )
    })
}

/// An `nn` function's error as the graph's: its graph error as it is; any other refusal is one
/// the row's shape rule makes first, so reaching it is a rule that disagrees with the function.
fn from_nn(e: arenagrad_nn::NnError) -> GraphError {
    match e {
        arenagrad_nn::NnError::Graph(e) => e,
        _ => bad("a refusal of the nn function that the row's shape rule did not make"),
    }
}

fn bad(what: &'static str) -> GraphError {
    GraphError::BadArgument {
        op: "program",
        what,
    }
}

fn without(s: &[usize], d: usize) -> Vec<usize> {
    let mut v = s.to_vec();
    v.remove(d);
    v
}

fn same(s: &[&[usize]], _p: &[Param]) -> Result<Vec<usize>, Refusal> {
    Ok(s[0].to_vec())
}

/// Whether every extent is 1 (and there is at least one).
pub(crate) fn all_ones(shape: &[usize]) -> bool {
    !shape.is_empty() && shape.iter().all(|&d| d == 1)
}

/// `t` reshaped to `shape`.
pub(crate) fn reshape_to<'g>(t: Tensor<'g>, shape: &[usize]) -> Result<Tensor<'g>, GraphError> {
    let s = shape
        .iter()
        .map(|&d| isize::try_from(d).map_err(|_| bad("extent out of range")))
        .collect::<Result<Vec<_>, _>>()?;
    t.reshape(&s)
}

/// An axis of rank `r` from an attribute byte, negative when `neg`.
fn axis_of(r: usize, t: u8, neg: bool) -> i64 {
    let d = i64::try_from(usize::from(t) % r.max(1)).unwrap_or(0);
    if neg {
        d - i64::try_from(r).unwrap_or(0)
    } else {
        d
    }
}

/// An axis of a non-empty shape `s` from an attribute byte `t`, negative when `neg`, and its
/// extent (`None` for a 0-D shape).
fn axis_and_extent(s: &[usize], t: u8, neg: bool) -> Option<(i64, usize)> {
    let r = s.len();
    if r == 0 {
        return None;
    }
    let axis = axis_of(r, t, neg);
    Some((axis, s[norm_axis(axis, r)?]))
}

/// An axis of a non-empty rank from an attribute byte (sometimes written negative).
fn gen_axis(s: &[usize], t: u8) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let d = usize::from(t >> 1) % s.len();
    Some(if t & 1 == 1 {
        d as f64 - s.len() as f64
    } else {
        d as f64
    })
}

/// One axis parameter (the rows that reduce or scan along an axis).
fn gen_one_axis(s: &[usize], t: [u8; 4]) -> Option<Vec<f64>> {
    Some(vec![gen_axis(s, t[0])?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Expr, Program};

    /// A value of `spec`'s kind that exercises the printer: negative, large, a float that is
    /// not whole.
    fn sample(spec: ParamSpec, k: usize) -> Param {
        match spec.kind {
            ParamKind::Int => Param::Int([-1, 2, i64::MIN, 1 << 60][k % 4]),
            ParamKind::Count => Param::Count([0, 3, usize::MAX, (1 << 53) + 1][k % 4]),
            ParamKind::Float => Param::Float([-0.0, 1.5e-7, f64::NAN, f64::NEG_INFINITY][k % 4]),
            ParamKind::Subscripts => Param::Subscripts(
                Subscripts::new(["ij,jk->ik", "i,i->", "-", ">,Z"][k % 4]).unwrap(),
            ),
        }
    }

    /// Every row, with each arity and parameter count it allows (a variadic tail of none, one
    /// and three), prints and parses back to itself, and prints the same text again: the
    /// printer and the parser read the same row.
    #[test]
    fn every_row_round_trips_through_the_text() {
        for row in OPS {
            let operand_counts = match row.arity {
                Arity::Exactly(n) => vec![n],
                Arity::AtLeast(n) => vec![n, n + 2],
            };
            let rest_counts = if row.rest.is_some() {
                vec![0, 1, 3]
            } else {
                vec![0]
            };
            for &n in &operand_counts {
                for &extra in &rest_counts {
                    let mut p = Program::new();
                    p.push("x", Expr::leaf(true, vec![2, 3])).unwrap();
                    p.push("y", Expr::leaf(false, vec![])).unwrap();
                    let args: Vec<usize> = (0..n).map(|k| k % 2).collect();
                    let params: Vec<Param> = (0..row.params.len() + extra)
                        .map(|k| sample(row.param_spec(k).unwrap(), k))
                        .collect();
                    let e = Expr::Op {
                        op: row,
                        args,
                        params,
                    };
                    p.push("z", e.clone())
                        .unwrap_or_else(|err| panic!("{row:?}: {err}"));
                    let text = p.to_string();
                    let q = Program::parse(&text).unwrap_or_else(|err| panic!("{text}: {err}"));
                    assert_eq!(q, p, "{text}");
                    assert_eq!(q.to_string(), text);
                    assert_eq!(q.statements()[2].expr, e, "{text}");
                }
            }
        }
    }

    /// A statement built in code must fit its row before its shape rule sees it: too few or
    /// too many operands or parameters, or a parameter of the wrong kind, is a typed error.
    #[test]
    fn statements_built_in_code_must_fit_their_row() {
        let mut p = Program::new();
        p.push("x", Expr::leaf(true, vec![2, 3])).unwrap();
        let bad = [
            Expr::Op {
                op: op_row("slice").unwrap(),
                args: vec![0],
                params: vec![Param::Int(0), Param::Count(0)],
            },
            Expr::Op {
                op: op_row("slice").unwrap(),
                args: vec![0],
                params: vec![Param::Int(0), Param::Int(0), Param::Count(1)],
            },
            Expr::Op {
                op: op_row("matmul").unwrap(),
                args: vec![0],
                params: vec![],
            },
            Expr::Op {
                op: op_row("concat").unwrap(),
                args: vec![],
                params: vec![Param::Int(0)],
            },
            Expr::Op {
                op: op_row("detach").unwrap(),
                args: vec![0],
                params: vec![Param::Float(1.0)],
            },
        ];
        for e in bad {
            assert!(p.clone().push("y", e.clone()).is_err(), "{e:?}");
        }
    }

    /// The usage lines spell each layout.
    #[test]
    fn usage_lines_follow_the_rows() {
        let u = |n: &str| op_row(n).unwrap().usage();
        assert_eq!(u("slice"), "slice A AXIS START END");
        assert_eq!(u("sum"), "sum A [AXIS ...]");
        assert_eq!(u("concat"), "concat AXIS A [B ...]");
        assert_eq!(u("matmul"), "matmul A B");
        assert_eq!(u("detach"), "detach A");
        assert_eq!(u("einsum"), "einsum A B SUBSCRIPTS");
    }

    /// The rows' names are distinct, and none is a leaf or an elementwise op.
    #[test]
    fn row_names_are_distinct() {
        for (k, row) in OPS.iter().enumerate() {
            assert!(OPS[..k].iter().all(|r| r.name != row.name), "{}", row.name);
            assert!(crate::binary_op(row.name).is_none() && crate::unary_op(row.name).is_none());
            assert!(!["input", "const"].contains(&row.name));
        }
    }
}
