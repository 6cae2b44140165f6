//! Gradient checks of whole programs: [`arenagrad_graph::check::gradcheck`] (and
//! `gradgradcheck`) on the function from the program's inputs to its output, with the report
//! naming each input and its worst element.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions, InputReport};
use arenagrad_graph::{DType, GraphError, HostTensor};

use super::ast::{Expr, Program};
use super::error::ProgramError;
use super::infer::{check, check_run, Limits, StmtInfo};
use super::runner::Overrides;

/// How to check a program's gradients.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Step and tolerances (PyTorch's defaults: ε = 1e-6, atol = 1e-5, rtol = 1e-3).
    pub tolerances: GradcheckOptions,
    /// Also check second derivatives (`gradgradcheck`).
    pub second_order: bool,
    /// Seed of the leaves given without values.
    pub seed: u64,
    /// Size limits.
    pub limits: Limits,
    /// Replacement op implementations (see [`Overrides`]).
    pub overrides: Overrides,
    /// Report progress on standard error every few seconds while a long check runs.
    pub progress: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            tolerances: GradcheckOptions::default(),
            second_order: false,
            seed: 0,
            limits: Limits::default(),
            overrides: Overrides::new(),
            progress: false,
        }
    }
}

/// The worst element of one input.
#[derive(Debug, Clone, PartialEq)]
pub struct InputCheck {
    /// The input's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Flat (row-major) index of the worst element.
    pub worst_flat: usize,
    /// The same element as one index per dimension.
    pub worst_index: Vec<usize>,
    /// Analytic gradient there (of the randomly projected output).
    pub analytic: f64,
    /// Central finite difference there.
    pub numerical: f64,
    /// `|analytic − numerical| − rtol·|numerical|`; the element passes when this is at most atol.
    pub excess: f64,
    /// Whether every element of this input is within tolerance.
    pub passed: bool,
}

/// The result of [`Program::gradcheck`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramCheckReport {
    /// First derivatives, one entry per input.
    pub first_order: Vec<InputCheck>,
    /// Second derivatives, when asked for.
    pub second_order: Option<Vec<InputCheck>>,
    /// Whether everything checked passed.
    pub passed: bool,
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        if shape[d] > 0 {
            idx[d] = flat % shape[d];
            flat /= shape[d];
        }
    }
    idx
}

impl std::fmt::Display for ProgramCheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut section = |title: &str, items: &[InputCheck]| -> std::fmt::Result {
            writeln!(f, "{title}:")?;
            if items.is_empty() {
                writeln!(f, "  (no inputs)")?;
            }
            for c in items {
                if c.shape.iter().product::<usize>() == 0 {
                    writeln!(f, "  {:<4} {} {:?}: no elements", "ok", c.name, c.shape)?;
                    continue;
                }
                writeln!(
                    f,
                    "  {:<4} {} {:?}: worst element {:?} analytic {:.9e} numerical {:.9e} \
                     excess {:.3e}",
                    if c.passed { "ok" } else { "FAIL" },
                    c.name,
                    c.shape,
                    c.worst_index,
                    c.analytic,
                    c.numerical,
                    c.excess
                )?;
            }
            Ok(())
        };
        section("first derivatives", &self.first_order)?;
        if let Some(s) = &self.second_order {
            section("second derivatives", s)?;
        }
        write!(
            f,
            "{}",
            if self.passed {
                "gradcheck passed"
            } else {
                "gradcheck FAILED"
            }
        )
    }
}

impl Program {
    /// Compares the gradient of the output (projected on fixed random weights) with respect to
    /// every `input` against central finite differences, in `f64`; with
    /// [`CheckOptions::second_order`], second derivatives as well.
    pub fn gradcheck(&self, opts: &CheckOptions) -> Result<ProgramCheckReport, ProgramError> {
        let infos = check(self, &opts.limits)?;
        check_run(self, &infos, &opts.limits)?;
        let evaluations = self.check_cost(&infos, opts)?;
        let values = self.leaf_values(opts.seed)?;
        let leaf_idx = self.leaves();
        let mut inputs = Vec::new();
        let mut names = Vec::new();
        for (&i, v) in leaf_idx.iter().zip(&values) {
            if self.stmts[i].expr.is_input() {
                let t = HostTensor::new(v.clone(), &infos[i].shape)
                    .map_err(|e| self.engine_err(i, e))?;
                inputs.push(t);
                names.push(self.stmts[i].name.clone());
            }
        }
        if inputs.is_empty() {
            return Ok(ProgramCheckReport {
                first_order: Vec::new(),
                second_order: opts.second_order.then(Vec::new),
                passed: true,
            });
        }
        let failure: RefCell<Option<ProgramError>> = RefCell::new(None);
        let (infos, values, leaf_idx, failure_ref) = (&infos, &values, &leaf_idx, &failure);
        let progress = Progress::new(opts.progress, evaluations);
        let progress = &progress;
        let f = check_fn(move |g, xs| {
            progress.tick();
            let mut leaves = Vec::with_capacity(leaf_idx.len());
            let mut k = 0;
            for (&i, v) in leaf_idx.iter().zip(values) {
                match &self.stmts[i].expr {
                    Expr::Leaf {
                        requires_grad: true,
                        ..
                    } => {
                        leaves.push(*xs.get(k).ok_or(GraphError::BadArgument {
                            op: "program",
                            what: "missing input",
                        })?);
                        k += 1;
                    }
                    Expr::Leaf { shape, dtype, .. } => {
                        leaves.push(g.from_f64(v, shape, dtype.unwrap_or(DType::F64))?)
                    }
                    _ => {}
                }
            }
            match self.build_checked(g, &leaves, infos, &opts.overrides) {
                Ok(ts) => ts.last().copied().ok_or(GraphError::BadArgument {
                    op: "program",
                    what: "empty program",
                }),
                Err(e) => {
                    *failure_ref.borrow_mut() = Some(e);
                    Err(GraphError::BadArgument {
                        op: "program",
                        what: "a statement failed",
                    })
                }
            }
        });
        let lift = |r: Result<arenagrad_graph::check::GradcheckReport, GraphError>| match r {
            Ok(r) => Ok(r),
            Err(e) => Err(failure.borrow_mut().take().unwrap_or_else(|| {
                let last = self.stmts.len() - 1;
                self.engine_err(last, e)
            })),
        };
        let atol = opts.tolerances.atol;
        let named = |reports: &[InputReport]| -> Vec<InputCheck> {
            reports
                .iter()
                .map(|r| {
                    let shape = inputs
                        .get(r.input)
                        .map_or_else(Vec::new, |h| h.shape().to_vec());
                    InputCheck {
                        name: names.get(r.input).cloned().unwrap_or_default(),
                        worst_index: unravel(r.worst_index, &shape),
                        shape,
                        worst_flat: r.worst_index,
                        analytic: r.analytic,
                        numerical: r.numerical,
                        excess: r.excess,
                        passed: !(r.excess.is_nan() || r.excess > atol),
                    }
                })
                .collect()
        };
        let first = lift(gradcheck(f, &inputs, opts.tolerances))?;
        let mut passed = first.passed;
        let first_order = named(&first.inputs);
        let second_order = if opts.second_order {
            let second = lift(gradgradcheck(f, &inputs, opts.tolerances))?;
            passed &= second.passed;
            Some(named(&second.inputs))
        } else {
            None
        };
        Ok(ProgramCheckReport {
            first_order,
            second_order,
            passed,
        })
    }

    /// How many times a gradient check of this program runs it (forward passes, each with its
    /// backward where the check needs one), refused with [`ProgramError::TooLarge`] when the
    /// work they add up to exceeds [`Limits::max_check_work`].
    fn check_cost(&self, infos: &[StmtInfo], opts: &CheckOptions) -> Result<u64, ProgramError> {
        let forward: u64 = infos
            .iter()
            .fold(0u64, |a, i| a.saturating_add(i.work.max(1)));
        let elements: u64 = self
            .stmts
            .iter()
            .zip(infos)
            .filter(|(s, _)| s.expr.is_input())
            .fold(0u64, |a, (_, i)| {
                a.saturating_add(i.shape.iter().product::<usize>() as u64)
            });
        // First derivatives: one analytic pass (forward and backward, ~3 forwards), then two
        // forward passes per input element. Second derivatives repeat that over a function
        // that is itself a forward and a backward (~3 forwards).
        let first = elements.saturating_mul(2).saturating_add(1);
        let evaluations = if opts.second_order {
            first.saturating_mul(2)
        } else {
            first
        };
        let passes = if opts.second_order {
            first.saturating_add(3).saturating_mul(4)
        } else {
            first.saturating_add(2)
        };
        let work = passes.saturating_mul(forward);
        let limit = opts.limits.max_check_work;
        if work > limit {
            let (line, column) = self.op_pos(self.stmts.len() - 1);
            return Err(ProgramError::TooLarge {
                line,
                column,
                message: format!(
                    "a gradient check of this program runs it about {passes} times ({elements} \
                     input elements, two passes each{}) at {forward} units of work a pass: \
                     {work} units, more than the limit of {limit} (raise Limits::max_check_work, \
                     or the CLI's --max-check-work)",
                    if opts.second_order {
                        ", and again for second derivatives"
                    } else {
                        ""
                    }
                ),
            });
        }
        Ok(evaluations)
    }
}

/// Counts a check's evaluations of the program and, when asked, reports how far it is on
/// standard error every few seconds.
struct Progress {
    on: bool,
    total: u64,
    done: Cell<u64>,
    start: Instant,
    last: Cell<Instant>,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(2);

    fn new(on: bool, total: u64) -> Self {
        let now = Instant::now();
        Progress {
            on,
            total,
            done: Cell::new(0),
            start: now,
            last: Cell::new(now),
        }
    }

    fn tick(&self) {
        let done = self.done.get() + 1;
        self.done.set(done);
        if !self.on || self.last.get().elapsed() < Self::EVERY {
            return;
        }
        self.last.set(Instant::now());
        let frac = done as f64 / self.total.max(1) as f64;
        let spent = self.start.elapsed().as_secs_f64();
        let left = if frac > 0.0 {
            spent * (1.0 - frac) / frac
        } else {
            0.0
        };
        eprintln!(
            "gradcheck: {done}/{} evaluations ({:.0}%), about {left:.0} s left",
            self.total,
            100.0 * frac.min(1.0)
        );
    }
}
