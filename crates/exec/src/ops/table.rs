//! The macros that turn the op tables of [`super`] (unary, binary, reductions) into code. A reader adding an op needs only
//! the tables; this file says what each column becomes.
//!
//! Why a `macro_rules!` and not a build script: the rows stay Rust (the CPU columns are closures
//! the compiler type-checks in place, errors point at the row), nothing is generated into
//! `target/` that a reader has to find, and the CUDA columns are plain strings joined at run time.

/// Expands the unary table. Each row:
///
/// ```text
/// /// doc
/// Variant(p) samples [first, more...] => "name" {   // `(p) samples [..]`: an f64 parameter
///     public: bool,    // in the program format and random programs
///     smooth: bool,    // differentiable everywhere on its domain (gradient checks may use it)
///     domain: Domain,  // where the input must lie (random programs respect it)
///     positive: Positive, // whether the output is > 0 (random programs feed log/sqrt with it)
///     cpu: |x| expr,   // the forward, in `x: T` (and `p: f64`)
///     grad: |x, y, g| expr, // g · f'(x), with y = f(x) the forward output
///     cuda: "expr",    // the forward in CUDA C, in `x` (T) and `p` (double)
///     cuda_grad: "expr", // the derivative in CUDA C, in `x`, `y`, `g` (T) and `p`
/// }
/// ```
macro_rules! unary_table {
    ($(
        $(#[doc = $doc:literal])*
        $var:ident $(($p:ident) samples [$first:expr $(, $rest:expr)* $(,)?])? => $name:literal {
            public: $public:literal,
            smooth: $smooth:literal,
            domain: $domain:expr,
            positive: $positive:expr,
            cpu: |$x:ident| $fwd:expr,
            grad: |$gx:tt, $gy:tt, $gg:tt| $grad:expr,
            cuda: $cuda:literal,
            cuda_grad: $cuda_grad:literal $(,)?
        }
    )*) => {
        /// Elementwise functions of one tensor, one per row of the unary table
        /// (`arenagrad_exec::ops`). Scalar parameters travel as `f64` and are rounded to the
        /// element type by the kernel.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum UnaryOp {
            $(
                $(#[doc = $doc])*
                $var $((unary_table!(@f64 $p)))?,
            )*
        }

        /// The rows' positions: the op codes of the CUDA kernels.
        #[allow(dead_code)]
        #[repr(u64)]
        enum UnaryCode {
            $($var,)*
        }

        impl UnaryOp {
            /// Every op once, parameters at their first sample value.
            pub const KINDS: &'static [UnaryOp] = &[$(UnaryOp::$var $(($first))?,)*];

            /// Every op with each sample parameter (tests that go through all of them).
            pub const SAMPLES: &'static [UnaryOp] =
                &[$(UnaryOp::$var $(($first))?, $($(UnaryOp::$var($rest),)*)?)*];

            /// The name, as errors and the program format spell it.
            pub fn name(self) -> &'static str {
                match self {
                    $(UnaryOp::$var { .. } => $name,)*
                }
            }

            /// The op's code in the CUDA kernels (its row's position).
            pub fn code(self) -> u64 {
                match self {
                    $(UnaryOp::$var { .. } => UnaryCode::$var as u64,)*
                }
            }

            /// The scalar parameter, for the ops that have one.
            #[allow(unused_variables)]
            pub fn param(self) -> Option<f64> {
                match self {
                    $(UnaryOp::$var $(($p))? => unary_table!(@some $($p)?),)*
                }
            }

            /// The same op with its parameter set to `v` (unchanged for ops without one).
            #[allow(unused_variables)]
            pub fn with_param(self, v: f64) -> UnaryOp {
                match self {
                    $(UnaryOp::$var $(($p))? => UnaryOp::$var $((unary_table!(@id v $p)))?,)*
                }
            }

            /// Whether users meet the op: in the program format and in random programs. The
            /// others are derivatives written as values, used by backward rules.
            pub fn is_public(self) -> bool {
                match self {
                    $(UnaryOp::$var { .. } => $public,)*
                }
            }

            /// Whether the op is differentiable everywhere on its [`UnaryOp::domain`]: what a
            /// finite-difference check of random programs may use.
            pub fn is_smooth(self) -> bool {
                match self {
                    $(UnaryOp::$var { .. } => $smooth,)*
                }
            }

            /// Where the input must lie.
            #[allow(unused_variables)]
            pub fn domain(self) -> Domain {
                match self {
                    $(UnaryOp::$var $(($p))? => $domain,)*
                }
            }

            /// Whether the output is positive.
            #[allow(unused_variables)]
            pub fn positive(self) -> Positive {
                match self {
                    $(UnaryOp::$var $(($p))? => $positive,)*
                }
            }

            /// Calls `k` with the row's forward as a closure, so that the kernel's loop is
            /// compiled once per op with the function inlined.
            #[inline(always)]
            #[allow(unused_variables)]
            pub fn with_forward<T: Float, K: UnaryKernel<T>>(self, k: K) -> K::Out {
                match self {
                    $(UnaryOp::$var $(($p))? => k.run(#[inline(always)] move |$x: T| -> T { $fwd }),)*
                }
            }

            /// Whether the row's derivative reads the op's input `x` (its `grad` column names
            /// it rather than `_`): kernels that widen or load operands skip what it ignores.
            pub fn grad_reads_input(self) -> bool {
                match self {
                    $(UnaryOp::$var { .. } => unary_table!(@reads $gx),)*
                }
            }

            /// Whether the row's derivative reads the op's output `y` (see
            /// [`UnaryOp::grad_reads_input`]).
            pub fn grad_reads_output(self) -> bool {
                match self {
                    $(UnaryOp::$var { .. } => unary_table!(@reads $gy),)*
                }
            }

            /// Calls `k` with the row's derivative `(x, y, g) ↦ g · f'(x)` as a closure.
            #[inline(always)]
            #[allow(unused_variables)]
            pub fn with_grad<T: Float, K: UnaryGradKernel<T>>(self, k: K) -> K::Out {
                match self {
                    $(UnaryOp::$var $(($p))? => k.run(
                        #[inline(always)]
                        move |$gx: T, $gy: T, $gg: T| -> T { $grad }
                    ),)*
                }
            }
        }

        /// The CUDA columns, in code order: name, forward, derivative.
        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        pub(crate) const UNARY_CUDA: &[(&str, &str, &str)] = &[$(($name, $cuda, $cuda_grad),)*];
    };
    (@f64 $p:ident) => { f64 };
    (@reads _) => { false };
    (@reads $v:ident) => { true };
    (@some) => { None };
    (@some $p:ident) => { Some($p) };
    (@id $v:ident $p:ident) => { $v };
}

/// Expands the binary table. Each row:
///
/// ```text
/// /// doc
/// Variant => "name" {
///     public: bool, smooth: bool,
///     domain: (Domain, Domain),  // where each operand must lie
///     positive: Positive,        // IfInput: if both are; IfEither: if one is
///     grad: bool,                // false: a 0/1 mask that never requires grad
///     cpu: |a, b| expr,
///     cuda: "expr",              // in `a`, `b` (T)
/// }
/// ```
///
/// Binary derivatives are tensor expressions (they reduce over broadcast axes), written in
/// `arenagrad-graph`'s `ops/binary.rs`.
macro_rules! binary_table {
    ($(
        $(#[doc = $doc:literal])*
        $var:ident => $name:literal {
            public: $public:literal,
            smooth: $smooth:literal,
            domain: $domain:expr,
            positive: $positive:expr,
            grad: $grad:literal,
            cpu: |$a:ident, $b:ident| $fwd:expr,
            cuda: $cuda:literal $(,)?
        }
    )*) => {
        /// Elementwise functions of two broadcast tensors, one per row of the binary table
        /// (`arenagrad_exec::ops`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum BinaryOp {
            $(
                $(#[doc = $doc])*
                $var,
            )*
        }

        impl BinaryOp {
            /// Every op.
            pub const KINDS: &'static [BinaryOp] = &[$(BinaryOp::$var,)*];

            /// The name, as errors and the program format spell it.
            pub fn name(self) -> &'static str {
                match self {
                    $(BinaryOp::$var => $name,)*
                }
            }

            /// The op's code in the CUDA kernels (its row's position).
            pub fn code(self) -> u64 {
                self as u64
            }

            /// Whether users meet the op (see [`UnaryOp::is_public`]).
            pub fn is_public(self) -> bool {
                match self {
                    $(BinaryOp::$var => $public,)*
                }
            }

            /// Whether the op is differentiable everywhere on its domain.
            pub fn is_smooth(self) -> bool {
                match self {
                    $(BinaryOp::$var => $smooth,)*
                }
            }

            /// Where the left and the right operand must lie.
            pub fn domain(self) -> (Domain, Domain) {
                match self {
                    $(BinaryOp::$var => $domain,)*
                }
            }

            /// Whether the output is positive.
            pub fn positive(self) -> Positive {
                match self {
                    $(BinaryOp::$var => $positive,)*
                }
            }

            /// Whether gradients flow through the op. `false` for the comparisons, whose 0/1
            /// output never requires grad (as PyTorch's boolean results do not).
            pub fn has_grad(self) -> bool {
                match self {
                    $(BinaryOp::$var => $grad,)*
                }
            }

            /// Calls `k` with the row's function as a closure.
            #[inline(always)]
            #[allow(clippy::eq_op)] // `a != a`: NaN tests in the rows
            pub fn with_fn<T: Float, K: BinaryKernel<T>>(self, k: K) -> K::Out {
                match self {
                    $(BinaryOp::$var => k.run(#[inline(always)] move |$a: T, $b: T| -> T { $fwd }),)*
                }
            }
        }

        /// The CUDA columns, in code order: name, function.
        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        pub(crate) const BINARY_CUDA: &[(&str, &str)] = &[$(($name, $cuda),)*];
    };
}

/// Expands the reduction table. Each row:
///
/// ```text
/// /// doc
/// Variant => "name" {
///     identity: expr,            // the result over nothing, in `T: Float`: where outputs start
///     combine: |acc, v| expr,    // one step, in `acc` and `v` (T)
///     cuda_identity: "expr",     // the identity in CUDA C, in `T`
///     cuda_combine: "expr",      // the step in CUDA C, in `acc`, `v` (T)
/// }
/// ```
///
/// Every column is required: a row without its CUDA columns does not match, so it does not
/// compile (the CUDA kernels would otherwise meet a code they cannot reduce with).
macro_rules! reduce_table {
    ($(
        $(#[doc = $doc:literal])*
        $var:ident => $name:literal {
            identity: $id:expr,
            combine: |$acc:ident, $v:ident| $step:expr,
            cuda_identity: $cuda_id:literal,
            cuda_combine: $cuda_step:literal $(,)?
        }
    )*) => {
        /// What a reduction computes, one per row of the reduction table
        /// (`arenagrad_exec::ops`): `cpu::reduce` folds with the row's identity and step, the
        /// CUDA kernels with its CUDA columns (`R_*` codes from [`ReduceOp::code`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ReduceOp {
            $(
                $(#[doc = $doc])*
                $var,
            )*
        }

        impl ReduceOp {
            /// Every reduction.
            pub const KINDS: &'static [ReduceOp] = &[$(ReduceOp::$var,)*];

            /// The name, as errors and the program format spell it.
            pub fn name(self) -> &'static str {
                match self {
                    $(ReduceOp::$var => $name,)*
                }
            }

            /// The op's code in the CUDA kernels (its row's position).
            pub fn code(self) -> u64 {
                self as u64
            }

            /// The result over nothing, where every output starts.
            #[inline(always)]
            pub fn identity<T: Float>(self) -> T {
                match self {
                    $(ReduceOp::$var => $id,)*
                }
            }

            /// One step: `acc` combined with `v`.
            #[inline(always)]
            pub fn combine<T: Float>(self, acc: T, v: T) -> T {
                match self {
                    $(ReduceOp::$var => {
                        let ($acc, $v) = (acc, v);
                        $step
                    })*
                }
            }

            /// Calls `k` with the row's identity and its step as a closure, so that the
            /// kernel's loops are compiled once per reduction with the step inlined.
            #[inline(always)]
            pub fn with_combine<T: Float, K: ReduceKernel<T>>(self, k: K) -> K::Out {
                match self {
                    $(ReduceOp::$var => k.run(
                        $id,
                        #[inline(always)]
                        move |$acc: T, $v: T| -> T { $step }
                    ),)*
                }
            }
        }

        /// The CUDA columns, in code order: name, identity, step.
        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        pub(crate) const REDUCE_CUDA: &[(&str, &str, &str)] = &[$(($name, $cuda_id, $cuda_step),)*];
    };
}

pub(crate) use {binary_table, reduce_table, unary_table};
