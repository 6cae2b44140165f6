//! The checks behind the fuzz targets, as plain functions of bytes, so that the fuzz targets
//! (`fuzz/`, nightly, cargo-fuzz) and the corpus replay test (stable, `cargo test`) run the same
//! code.
//!
//! * [`check_parse`] — arbitrary bytes into the parser: a typed error or a program; a program
//!   prints and parses back to itself, and checking, drawing and running it (under
//!   [`Limits::small`]) gives typed errors only.
//! * [`check_build`] (target `build_run`) — bytes read as a structured program ([`raw_program`]) that may be
//!   ill-shaped, oversized or full of extreme numbers: it round-trips through the text format, and
//!   running it (in f64, f32, bf16 or f16, as its last byte says) gives a result of the predicted
//!   shapes or a typed error.
//! * [`check_grad`] — bytes read as a well-typed program over smooth ops
//!   ([`generate::well_typed`] with [`GenConfig::smooth`]) run in `f64`: gradients are finite
//!   and agree with central finite differences within PyTorch's gradcheck tolerances.
//!
//! Each returns `Err` with a description (including the program text) when a property fails;
//! a panic inside is a failure too (the fuzzer reports it as a crash).

use arenagrad_graph::check::GradcheckOptions;
use arenagrad_graph::{DType, Graph};

use super::ast::{binary_op, unary_op, Expr, Program, UnaryOp};
use super::error::ProgramError;
use super::generate::{self, all_ops, ByteReader, GenConfig};
use super::gradcheck::CheckOptions;
use super::infer::Limits;
use super::runner::{Overrides, RunOptions, RunResult};
use super::table::{Param, ParamKind, ParamSpec, Subscripts};

/// What a check made of an input that broke no property.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The program ran (and, for `grad`, its gradients checked out).
    Passed,
    /// The input was refused with a typed error, as it should be.
    Rejected(ProgramError),
    /// The input was out of the check's scope (for `grad`: values too large to difference
    /// reliably).
    Skipped(&'static str),
}

/// A property that failed, with what is needed to reproduce it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

fn violation(what: &str, p: &Program) -> Violation {
    Violation(format!("{what}\n--- program ---\n{p}"))
}

/// Printing then parsing gives the same program, and printing that gives the same text.
fn round_trip(p: &Program) -> Result<(), Violation> {
    let text = p.to_string();
    match Program::parse(&text) {
        Ok(q) if q == *p && q.to_string() == text => Ok(()),
        Ok(q) => Err(violation(
            &format!("printed program parses to a different program:\n{q}"),
            p,
        )),
        Err(e) => Err(violation(
            &format!("printed program does not parse: {e}"),
            p,
        )),
    }
}

/// The shapes of a run's tensors are the ones the shape rules predicted.
fn shapes_agree(p: &Program, r: &RunResult, limits: &Limits) -> Result<(), Violation> {
    let infos = p
        .check(limits)
        .map_err(|e| violation(&format!("ran, but the check fails: {e}"), p))?;
    let last = infos.len() - 1;
    if r.output.tensor.shape() != infos[last].shape {
        return Err(violation(
            &format!(
                "output shape {:?}, predicted {:?}",
                r.output.tensor.shape(),
                infos[last].shape
            ),
            p,
        ));
    }
    for g in &r.grads {
        let i = p.index_of(&g.name).unwrap_or(0);
        if g.tensor.shape() != infos[i].shape || g.tensor.numel() != g.tensor.data().len() {
            return Err(violation(
                &format!("gradient of `{}` has shape {:?}", g.name, g.tensor.shape()),
                p,
            ));
        }
    }
    Ok(())
}

/// An error must carry a position.
fn typed(p: Option<&Program>, e: ProgramError) -> Result<Outcome, Violation> {
    if e.line() == 0 || e.column() == 0 || e.to_string().is_empty() {
        let msg = format!("error without a position: {e:?}");
        return Err(match p {
            Some(p) => violation(&msg, p),
            None => Violation(msg),
        });
    }
    if let ProgramError::Internal { .. } = e {
        let msg = format!("shape rules and engine disagree: {e}");
        return Err(match p {
            Some(p) => violation(&msg, p),
            None => Violation(msg),
        });
    }
    Ok(Outcome::Rejected(e))
}

fn run_small(p: &Program, dtype: DType) -> Result<Outcome, Violation> {
    let limits = Limits::small();
    let opts = RunOptions {
        dtype,
        seed: 1,
        limits,
        threads: Some(1),
        overrides: Overrides::new(),
    };
    let checked = p.check(&limits);
    let dot = p.to_dot(&limits);
    if checked.is_ok() != dot.is_ok() {
        return Err(violation("check and dot disagree", p));
    }
    match p.run(&opts) {
        Ok(r) => {
            if let Err(e) = checked {
                return Err(violation(&format!("ran although the check fails: {e}"), p));
            }
            shapes_agree(p, &r, &limits)?;
            Ok(Outcome::Passed)
        }
        Err(e) => typed(Some(p), e),
    }
}

/// The `parse` target: arbitrary bytes into the parser.
pub fn check_parse(data: &[u8]) -> Result<Outcome, Violation> {
    let p = match Program::parse_bytes(data) {
        Ok(p) => p,
        Err(e) => return typed(None, e),
    };
    round_trip(&p)?;
    run_small(&p, DType::F64)
}

fn int_attr(r: &mut ByteReader<'_>) -> i64 {
    match r.u8() {
        250 => i64::MIN,
        251 => i64::MAX,
        252 => -1,
        253 => 1 << 40,
        254 => i64::from(u32::MAX),
        255 => -(1 << 33),
        b => i64::from(b % 10) - 4,
    }
}

fn dim_attr(r: &mut ByteReader<'_>) -> usize {
    match r.u8() {
        250 => usize::MAX,
        251 => usize::MAX / 2 + 1,
        252 => 1 << 32,
        253 => 1 << 20,
        254 => 4097,
        255 => 0,
        b => usize::from(b % 5),
    }
}

/// Subscripts from the bytes: one that random programs draw (which may still misfit the
/// operands), or up to eight characters of letters, commas, dots, `-` and `>` (mostly
/// malformed).
fn subscripts_attr(r: &mut ByteReader<'_>) -> Subscripts {
    let b = r.u8();
    if b < 128 {
        return Subscripts::drawn(usize::from(b));
    }
    const CHARS: &[u8] = b"ijkb,->Z..";
    let text: String = (0..1 + usize::from(b) % 8)
        .map(|_| char::from(CHARS[usize::from(r.u8()) % CHARS.len()]))
        .collect();
    Subscripts::new(&text).unwrap_or_else(|| Subscripts::drawn(0))
}

fn float_attr(r: &mut ByteReader<'_>) -> f64 {
    const F: [f64; 16] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        3.0,
        -2.5,
        1e308,
        -1e308,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-310,
        0.1,
        -7.25,
    ];
    F[usize::from(r.u8()) % F.len()]
}

/// Reads bytes as a structured program that need not be well-shaped: one to three leaves with
/// extents that may be zero or enormous, then up to 16 statements of any op with operands
/// anywhere earlier and attributes that may be out of range, extreme or non-finite.
pub fn raw_program(data: &[u8]) -> Program {
    let mut r = ByteReader::new(data);
    let mut p = Program::new();
    let n_leaves = 1 + usize::from(r.u8()) % 3;
    for k in 0..n_leaves {
        let rank_byte = r.u8();
        let rank = if rank_byte >= 250 {
            9 + usize::from(rank_byte - 250)
        } else {
            usize::from(rank_byte) % 5
        };
        let shape: Vec<usize> = (0..rank).map(|_| dim_attr(&mut r)).collect();
        let flags = r.u8();
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let values = match numel {
            Some(n) if flags & 2 != 0 && n <= 4096 => {
                Some(generate::values(u64::from(r.u8()), n, flags & 4 != 0))
            }
            _ => None,
        };
        // Flag 8: an integer or boolean `const` of whole values (which ops then refuse or take).
        let dtype = (flags & 8 != 0)
            .then(|| [DType::I64, DType::I32, DType::U8, DType::Bool][usize::from(flags >> 4) % 4]);
        let values = match dtype {
            Some(DType::Bool) => values.map(|v| v.iter().map(|x| f64::from(*x > 0.0)).collect()),
            Some(_) => values.map(|v| v.iter().map(|x| x.abs().floor()).collect()),
            None => values,
        };
        let e = Expr::Leaf {
            requires_grad: flags & 1 == 0 && dtype.is_none(),
            shape,
            values,
            dtype,
        };
        if p.push(&format!("l{k}"), e).is_err() {
            // An overflowing shape cannot be a leaf (the parser refuses it too): a scalar instead.
            let scalar = Expr::leaf(true, Vec::new());
            let _ = p.push(&format!("l{k}"), scalar);
        }
    }
    let mut k = 0;
    while !r.is_empty() && k < 16 {
        let n = p.len();
        let ops = all_ops();
        let op = ops[usize::from(r.u8()) % ops.len()];
        let operand = |r: &mut ByteReader<'_>| usize::from(r.u8()) % n;
        let e = if let Some(b) = binary_op(op) {
            Expr::Binary {
                op: b,
                lhs: operand(&mut r),
                rhs: operand(&mut r),
            }
        } else if let Some(row) = crate::table::op_row(op) {
            let param = |r: &mut ByteReader<'_>, spec: ParamSpec| match spec.kind {
                ParamKind::Float => Param::Float(float_attr(r)),
                ParamKind::Int => Param::Int(int_attr(r)),
                ParamKind::Count => Param::Count(dim_attr(r)),
                ParamKind::Subscripts => Param::Subscripts(subscripts_attr(r)),
            };
            let mut params: Vec<Param> = Vec::new();
            if row.params_first() {
                params.extend(row.params.iter().map(|&s| param(&mut r, s)));
            }
            // Variadic operands: a count byte first.
            let n_args = match row.arity {
                crate::table::Arity::Exactly(k) => k,
                crate::table::Arity::AtLeast(k) => k + usize::from(r.u8()) % 3,
            };
            let args = (0..n_args).map(|_| operand(&mut r)).collect();
            if !row.params_first() {
                params.extend(row.params.iter().map(|&s| param(&mut r, s)));
                if let Some(spec) = row.rest {
                    let extra = usize::from(r.u8()) % 5;
                    params.extend((0..extra).map(|_| param(&mut r, spec)));
                }
            }
            Expr::Op {
                op: row,
                args,
                params,
            }
        } else if let Some(u) = unary_op(op) {
            let x = operand(&mut r);
            let op = match u.param() {
                Some(_) => u.with_param(float_attr(&mut r)),
                None => u,
            };
            Expr::Unary { op, x }
        } else {
            // Registered ops are not drawn here (their arity is the application's).
            Expr::Unary {
                op: UnaryOp::Neg,
                x: operand(&mut r),
            }
        };
        let _ = p.push(&format!("t{k}"), e);
        k += 1;
    }
    p
}

/// The `build` target: a structured, possibly ill-shaped program, built and run.
pub fn check_build(data: &[u8]) -> Result<Outcome, Violation> {
    let p = raw_program(data);
    round_trip(&p)?;
    // The last byte's low bits pick the dtype: every storage dtype is fuzzed.
    let dtype = match data.last().map_or(0, |b| b & 3) {
        0 => DType::F64,
        1 => DType::F32,
        2 => DType::BF16,
        _ => DType::F16,
    };
    run_small(&p, dtype)
}

/// Largest magnitude of any value the `grad` check differentiates through.
const MAX_MAGNITUDE: f64 = 1e3;

/// The `grad` target: a well-typed program over smooth ops, in `f64`; gradients finite and
/// within gradcheck tolerance.
pub fn check_grad(data: &[u8]) -> Result<Outcome, Violation> {
    check_grad_with(data, &GenConfig::smooth())
}

/// [`check_grad`] over the ops `cfg` lists: with [`GenConfig::with_user_ops`], an application's
/// fuzz target checks the gradients of its own registered ops inside random programs.
pub fn check_grad_with(data: &[u8], cfg: &GenConfig) -> Result<Outcome, Violation> {
    let (leaves, ops) = generate::decode(data, cfg.max_rank, 10);
    let p = generate::well_typed(&leaves, &ops, cfg);
    round_trip(&p)?;
    let limits = Limits::small();
    let infos = p
        .check(&limits)
        .map_err(|e| violation(&format!("generated program is ill-typed: {e}"), &p))?;
    // Every intermediate value must be moderate for finite differences to mean anything.
    {
        let g = Graph::with_threads(1);
        let values = p
            .leaf_values(0)
            .map_err(|e| violation(&e.to_string(), &p))?;
        let mut leaves = Vec::new();
        for (&i, v) in p.leaves().iter().zip(&values) {
            let t = g
                .from_f64(v, &infos[i].shape, infos[i].dtype.unwrap_or(DType::F64))
                .map_err(|e| violation(&e.to_string(), &p))?;
            leaves.push(t);
        }
        let ts = p
            .build(&g, &leaves, &limits, &Overrides::new())
            .map_err(|e| violation(&format!("well-typed program failed: {e}"), &p))?;
        for t in ts {
            let v = t.to_vec_f64().map_err(|e| violation(&e.to_string(), &p))?;
            if v.iter().any(|x| !x.is_finite() || x.abs() > MAX_MAGNITUDE) {
                return Ok(Outcome::Skipped("values too large to difference"));
            }
        }
    }
    let r = p
        .run(&RunOptions {
            limits,
            threads: Some(1),
            ..RunOptions::default()
        })
        .map_err(|e| violation(&format!("well-typed program failed: {e}"), &p))?;
    for g in &r.grads {
        if g.tensor.to_f64_vec().iter().any(|x| !x.is_finite()) {
            return Err(violation(
                &format!("gradient of `{}` is not finite", g.name),
                &p,
            ));
        }
    }
    let report = p
        .gradcheck(&CheckOptions {
            tolerances: GradcheckOptions::default(),
            limits,
            ..CheckOptions::default()
        })
        .map_err(|e| violation(&format!("gradcheck failed to run: {e}"), &p))?;
    if !report.passed {
        return Err(violation(&format!("gradcheck mismatch:\n{report}"), &p));
    }
    Ok(Outcome::Passed)
}

/// The program an input of fuzz target `target` stands for, as text (for `parse`, the input
/// itself, lossily decoded); `None` for an unknown target. This is how to read a crash artifact.
pub fn describe(target: &str, data: &[u8]) -> Option<String> {
    match target {
        "parse" => Some(String::from_utf8_lossy(data).into_owned()),
        "build" | "build_run" => Some(raw_program(data).to_string()),
        "grad" => {
            let cfg = GenConfig::smooth();
            let (leaves, ops) = generate::decode(data, cfg.max_rank, 10);
            Some(generate::well_typed(&leaves, &ops, &cfg).to_string())
        }
        _ => None,
    }
}

/// Runs the check of fuzz target `target` (`"parse"`, `"build_run"` — also accepted as `"build"`
/// — or `"grad"`) on `data`; `None` for an unknown target.
pub fn check(target: &str, data: &[u8]) -> Option<Result<Outcome, Violation>> {
    match target {
        "parse" => Some(check_parse(data)),
        "build" | "build_run" => Some(check_build(data)),
        "grad" => Some(check_grad(data)),
        _ => None,
    }
}
