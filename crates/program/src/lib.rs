//! Graphs as data: a small text format for programs over arenagrad's ops, with a parser, a
//! printer, shape rules, a runner (forward, backward, values out), whole-program gradient checks,
//! Graphviz output, random program generation, the checks behind the fuzz targets, and (feature
//! `proptest`) proptest strategies. The `arenagrad` command-line tool (feature `cli`) runs,
//! checks and draws programs from files.
//!
//! The elementwise ops are the public rows of `arenagrad_exec`'s op tables ([`unary_ops`],
//! [`binary_ops`]): an op added there is in the format, the generator and the fuzz targets with
//! nothing to add here. Every other op is a row of the format's op table ([`table`], which says
//! how to add one).
//!
//! # The format (version 1)
//!
//! UTF-8 text, one statement per line; `#` starts a comment; blank lines are ignored. Every
//! statement is `NAME = OP ARG...`, where NAME matches `[a-z_][a-z0-9_]*` and is defined once.
//! Arguments are earlier names, integers or floats, separated by spaces. The last statement is
//! the output; when it is not a scalar, backward starts from its sum.
//!
//! | statement | meaning |
//! |---|---|
//! | `x = input D0 D1 ...` | a leaf that requires grad (no dims: a scalar) |
//! | `x = const D0 D1 ...` | a leaf that does not |
//! | `x = input 2 2 : 0.5 -1 2 3.25` | values given, row-major (else standard normal draws from the seeded RNG) |
//! | `i = const i64 2 : 3 0`, `const i32`, `const u8`, `m = const bool 2 : 1 0` | an integer or boolean leaf (no gradient; values given, whole and within the dtype): only where an op reads indices, class targets or a mask, of a dtype PyTorch's op takes there (`i64` or `i32` indices for `gather`, `index_select`, the scatters and `index_add`; `i64` or `u8` targets for `cross_entropy` and `nll_loss`; a `bool` mask for `masked_fill`, a `bool` or `u8` condition for `where`); every other value has the run's floating dtype |
//! | `add a b`, `sub`, `mul`, `div`, `pow`, `maximum`, `minimum` | elementwise, numpy broadcasting |
//! | `eq a b`, `ne`, `lt`, `le`, `gt`, `ge` | comparisons as 0/1 masks (NaN compares false but for `ne`), broadcasting; no gradient |
//! | `neg a`, `exp`, `log`, `sqrt`, `abs`, `sin`, `cos`, `tanh`, `sigmoid`, `relu`, `gelu`, `gelu_tanh`, `silu`, `softplus`, `erf` | elementwise (`gelu` exact, `gelu_tanh` its tanh approximation) |
//! | `scale a S`, `shift a S`, `powf a P` | a·S, a+S, a^P |
//! | `detach a` | the same values, no gradient flowing back |
//! | `sum a [AXIS...]`, `mean a [AXIS...]` | over the axes (none: all elements) |
//! | `max a AXIS` | maximum along one axis (keepdim false) |
//! | `softmax a AXIS`, `log_softmax a AXIS` | along one axis |
//! | `matmul a b` | numpy matmul (1-D, 2-D, batched with broadcasting) |
//! | `transpose a D0 D1`, `permute a P0 P1 ...` | axes reordered |
//! | `reshape a D0 D1 ...` | one `-1` allowed |
//! | `broadcast a D0 D1 ...` | numpy broadcasting to the shape |
//! | `concat AXIS a b ...` | joined along AXIS |
//! | `slice a AXIS START END` | elements START..END along AXIS |
//! | `cumsum a AXIS`, `logsumexp a AXIS`, `min a AXIS`, `max_dim a AXIS` | along one axis (`max_dim`: the gradient to the first maximum, as PyTorch's `max(dim)`) |
//! | `norm a P AXIS`, `clamp a LO HI`, `tril a K`, `triu a K`, `masked_fill a MASK VALUE` | vector norm, bounds, triangles, a fill where MASK ≠ 0 |
//! | `layer_norm a NDIM EPS`, `rms_norm a NDIM EPS` | over the last NDIM axes, no affine |
//! | `attention q k v CAUSAL` | scaled dot-product attention (CAUSAL 0 or 1) |
//! | `stack a b AXIS`, `slice_step a AXIS START END STEP`, `chunk a N AXIS K`, `split a SIZE AXIS K`, `unbind a AXIS K` | joining, strided slicing, the K-th piece |
//! | `one_hot a CLASSES`, `arange a START END STEP` | constants: a's values as indices; a range in a's dtype |
//! | `flip a AXIS...`, `roll a SHIFT AXIS`, `repeat a R...` | reversed, shifted with wrap-around, tiled |
//! | `sort a AXIS DESC`, `topk a K AXIS LARGEST` | the values in order (stable; DESC 0 or 1), the K largest (LARGEST 1) or smallest (0) in order |
//! | `repeat_interleave a R AXIS`, `unsqueeze a AXIS`, `squeeze a AXIS` | each element R times in a row; a new axis of extent 1; AXIS removed when its extent is 1 |
//! | `where c a b` | a where c ≠ 0, b elsewhere, broadcast together (PyTorch's `torch.where`; no gradient to c) |
//! | `conv2d x w STRIDE PADDING DILATION GROUPS`, `conv_transpose2d x w STRIDE PADDING OUTPUT_PADDING DILATION GROUPS` | PyTorch's `F.conv2d` and `F.conv_transpose2d` without a bias, the same numbers along both axes; `x` `[N, C, H, W]` or unbatched `[C, H, W]` |
//! | `conv1d x w STRIDE PADDING DILATION GROUPS`, `conv_transpose1d x w STRIDE PADDING OUTPUT_PADDING DILATION GROUPS` | PyTorch's `F.conv1d` and `F.conv_transpose1d` without a bias; `x` `[N, C, L]` or unbatched `[C, L]` |
//! | `pad a VALUE P...`, `pad_reflect a P...`, `pad_replicate a P...`, `pad_circular a P...` | PyTorch's `F.pad` (a constant VALUE, or the mode in the name); the pads flat as PyTorch takes them, last axis first (`before after` pairs) |
//! | `interpolate_nearest a H W`, `interpolate_bilinear a H W ALIGN_CORNERS` | PyTorch's `F.interpolate` to `size=(H, W)` of `a` `[N, C, H, W]` (ALIGN_CORNERS 0 or 1) |
//! | `interpolate_nearest_scale a SH SW`, `interpolate_bilinear_scale a SH SW ALIGN_CORNERS` | PyTorch's `F.interpolate` by `scale_factor=(SH, SW)`: `⌊H·SH⌋ × ⌊W·SW⌋`, positions mapped by the factors |
//! | `interpolate_nearest1d a L`, `interpolate_linear a L ALIGN_CORNERS`, `interpolate_nearest1d_scale a S`, `interpolate_linear_scale a S ALIGN_CORNERS` | PyTorch's `F.interpolate` of `a` `[N, C, L]` (sound) to `size=L` or by `scale_factor=S` (`⌊L·S⌋`), `mode="nearest"` or `"linear"` |
//! | `adaptive_avg_pool2d a H W`, `adaptive_max_pool2d a H W` | PyTorch's, into `H × W` windows; `a` `[N, C, H, W]` or `[C, H, W]` |
//! | `group_norm a GROUPS EPS`, `instance_norm a EPS` | PyTorch's `F.group_norm` and `F.instance_norm` without weight, bias or running statistics; `a` `[N, C, …]` |
//! | `gather a i AXIS`, `index_select a i AXIS`, `scatter_add a i s AXIS`, `index_add a i s AXIS`, `scatter_reduce a i s AXIS REDUCE INCLUDE_SELF` | PyTorch's, `i` a `const i64` or `i32`, or a tensor of whole numbers (a `const`) read as 64-bit integers, `s` the source; REDUCE 0 sum, 1 mean, 2 amax, 3 amin; INCLUDE_SELF 0 or 1 |
//! | `mse_loss a b R`, `l1_loss a b R`, `smooth_l1_loss a b R BETA`, `huber_loss a b R DELTA`, `kl_div a b R LOG_TARGET`, `bce a b R`, `bce_with_logits a b R` | PyTorch's losses of `a` against the target `b` (equal shapes); R the reduction: 0 none, 1 mean, 2 sum (`kl_div`: 3 batchmean); `bce`'s `a` and `b` in `[0, 1]` |
//! | `cross_entropy a t R LABEL_SMOOTHING IGNORE_INDEX`, `nll_loss a t R` | PyTorch's, `a` `[N, C]`, `[N, C, d…]` or `[C]`, `t` class indices (a `const i64` or `u8`, or whole numbers; `[N]`, `[N, d…]` or a scalar) read as 64-bit integers |
//! | `einsum a b SUBSCRIPTS` | PyTorch's `torch.einsum(SUBSCRIPTS, a, b)` for the contractions that are sums and one (batched) matrix product; SUBSCRIPTS one token as PyTorch writes them (`ij,jk->ik`, `bhqd,bhkd->bhqk`, `...ij,...jk->...ik`; `i,j` without `->`: the ellipsis's axes, then the letters seen once, in alphabetical order); as in PyTorch, ellipses broadcast right-aligned, an extent of 1 broadcasts, and a letter twice in one operand takes its diagonal |
//!
//! From `detach` on, each op is a row of the format's op table ([`table`]), read by every part of
//! the crate.
//!
//! Negative axes count from the end. Errors name the line and column (1-based, in characters)
//! and say what was expected; parsing never panics, and a shape whose element count overflows or
//! exceeds the [`Limits`] is a typed error before anything is allocated.
//!
//! ```
//! use arenagrad_program::{Program, RunOptions};
//!
//! let p = Program::parse("x = input 3 : 1 2 3\ny = mul x x\nz = sum y\n").unwrap();
//! let r = p.run(&RunOptions::default()).unwrap();
//! assert_eq!(r.output.tensor.to_f64_vec(), vec![14.0]);
//! assert_eq!(r.grad("x").unwrap().to_f64_vec(), vec![2.0, 4.0, 6.0]);
//! assert_eq!(Program::parse(&p.to_string()).unwrap(), p); // printing round-trips
//! ```

#![forbid(unsafe_code)]

mod ast;
mod dot;
mod error;
pub mod fuzzing;
pub mod generate;
mod gradcheck;
mod infer;
mod parser;
mod printer;
mod runner;
#[cfg(feature = "proptest")]
pub mod strategy;
pub mod table;
mod user;

pub use ast::{
    binary_op, binary_ops, is_valid_name, leaf_dtype_problem, op_names, unary_op, unary_ops,
    BinaryOp, Expr, Program, Stmt, UnaryOp,
};
pub use error::ProgramError;
pub use gradcheck::{CheckOptions, InputCheck, ProgramCheckReport};
pub use infer::{Limits, StmtInfo};
pub use runner::{
    apply_default, dtype_name, BackwardRule, NamedTensor, OpImpl, Overrides, RunOptions, RunResult,
};
pub use user::{register_op, user_op, user_ops, Forward, RegisterError, ShapeRule, UserOp};

impl Program {
    /// Parses program text. Never panics; errors name the line and column.
    pub fn parse(text: &str) -> Result<Program, ProgramError> {
        parser::parse(text)
    }

    /// Parses bytes, which must be UTF-8 (an invalid sequence is a located error).
    pub fn parse_bytes(bytes: &[u8]) -> Result<Program, ProgramError> {
        parser::parse_bytes(bytes)
    }

    /// The text of statement `i` (as printed), without a newline.
    pub fn statement_text(&self, i: usize) -> Option<String> {
        (i < self.stmts.len()).then(|| printer::statement(self, i))
    }
}

impl std::str::FromStr for Program {
    type Err = ProgramError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Program::parse(s)
    }
}
