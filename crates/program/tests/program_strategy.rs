//! The proptest strategies of `arenagrad_program::strategy`: what they generate, and that
//! shrinking takes a failing program down to a handful of statements.

use std::sync::Arc;

use arenagrad_graph::{CustomOp, DType, Graph, GraphError, Tensor};
use arenagrad_program::strategy::{self, GenConfig};
use arenagrad_program::{CheckOptions, Limits, Overrides, Program, RunOptions};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};

/// tanh with a planted mistake: the rule should be gy·(1 − y²), this one uses gy·(1 − y).
struct WrongTanh;

impl CustomOp for WrongTanh {
    fn name(&self) -> &'static str {
        "tanh"
    }
    fn backward<'g>(
        &self,
        _g: &'g Graph,
        _inputs: &[Tensor<'g>],
        output: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>, GraphError> {
        Ok(vec![Some(gy.mul(output.neg()?.shift(1.0)?)?)])
    }
}

fn check_opts(overrides: Overrides) -> CheckOptions {
    CheckOptions {
        limits: Limits::small(),
        overrides,
        ..CheckOptions::default()
    }
}

fn runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

#[test]
fn a_wrong_backward_rule_shrinks_to_at_most_three_statements() {
    let planted = Overrides::new().backward_rule("tanh", Arc::new(WrongTanh));
    let opts = check_opts(planted);
    let result = runner(256).run(&strategy::program(GenConfig::smooth(), 10), |p| {
        let report = p
            .gradcheck(&opts)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(report.passed, "{report}");
        Ok(())
    });
    let minimal = match result {
        Err(TestError::Fail(_, p)) => p,
        other => panic!("the planted rule went unnoticed: {other:?}"),
    };
    assert!(
        minimal.len() <= 3,
        "shrunk only to {} statements:\n{minimal}",
        minimal.len()
    );
    assert!(
        minimal
            .statements()
            .iter()
            .any(|s| s.expr.op_name() == "tanh"),
        "the minimal program does not use tanh:\n{minimal}"
    );
    eprintln!("minimal failing program:\n{minimal}");
    // The same program passes with the engine's own rule, and the report names the input.
    let honest = minimal.gradcheck(&check_opts(Overrides::new())).unwrap();
    assert!(honest.passed, "{minimal}\n{honest}");
    let caught = minimal.gradcheck(&opts).unwrap();
    assert!(!caught.passed);
    let bad = caught.first_order.iter().find(|c| !c.passed).unwrap();
    assert!(minimal.index_of(&bad.name).is_some());
}

#[test]
fn a_wrong_rule_in_a_shape_op_is_caught_too() {
    // A transpose whose backward forgets to transpose back (it only works for square inputs).
    struct Untransposed;
    impl CustomOp for Untransposed {
        fn name(&self) -> &'static str {
            "transpose"
        }
        fn backward<'g>(
            &self,
            _g: &'g Graph,
            inputs: &[Tensor<'g>],
            _output: Tensor<'g>,
            gy: Tensor<'g>,
        ) -> Result<Vec<Option<Tensor<'g>>>, GraphError> {
            let shape: Vec<isize> = inputs[0].shape().iter().map(|&d| d as isize).collect();
            Ok(vec![Some(gy.reshape(&shape)?)])
        }
    }
    let opts = check_opts(Overrides::new().backward_rule("transpose", Arc::new(Untransposed)));
    let result = runner(256).run(&strategy::program(GenConfig::smooth(), 10), |p| {
        let r = p
            .gradcheck(&opts)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(r.passed);
        Ok(())
    });
    match result {
        Err(TestError::Fail(_, p)) => assert!(p.len() <= 4, "{p}"),
        other => panic!("the planted rule went unnoticed: {other:?}"),
    }
}

/// tanh whose backward rule has the right value, gy·(1 − y²), but computes it from a detached
/// output: first derivatives are right, and the derivative of the rule itself is not (it loses
/// the path through y). Only a second-order check can see it.
struct FlatTanh;

impl CustomOp for FlatTanh {
    fn name(&self) -> &'static str {
        "tanh"
    }
    fn backward<'g>(
        &self,
        _g: &'g Graph,
        _inputs: &[Tensor<'g>],
        output: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>, GraphError> {
        let y = output.detach()?;
        Ok(vec![Some(gy.mul(y.mul(y)?.neg()?.shift(1.0)?)?)])
    }
}

fn second_order(overrides: Overrides) -> CheckOptions {
    CheckOptions {
        second_order: true,
        ..check_opts(overrides)
    }
}

/// Random programs check second derivatives too: a rule whose value is right and whose own
/// derivative is wrong passes every first-order check and fails the second-order one, on a
/// program the shrinker takes down to a few statements.
#[test]
fn a_rule_wrong_only_in_its_derivative_is_caught_at_second_order() {
    let planted = Overrides::new().backward_rule("tanh", Arc::new(FlatTanh));
    let strategy = strategy::program(GenConfig::smooth(), 8);
    let first = runner(64).run(&strategy, |p| {
        let r = p
            .gradcheck(&check_opts(planted.clone()))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(r.passed, "{r}");
        Ok(())
    });
    assert!(first.is_ok(), "first derivatives should pass: {first:?}");
    let result = runner(256).run(&strategy, |p| {
        let r = p
            .gradcheck(&second_order(planted.clone()))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(r.passed, "{r}");
        Ok(())
    });
    let minimal = match result {
        Err(TestError::Fail(_, p)) => p,
        other => panic!("the planted rule went unnoticed: {other:?}"),
    };
    assert!(minimal.len() <= 4, "shrunk only to:\n{minimal}");
    let caught = minimal.gradcheck(&second_order(planted)).unwrap();
    assert!(caught.first_order.iter().all(|c| c.passed), "{caught}");
    assert!(!caught.passed, "{caught}");
    let honest = minimal.gradcheck(&second_order(Overrides::new())).unwrap();
    assert!(honest.passed, "{minimal}\n{honest}");
}

proptest! {
    #![proptest_config(Config { cases: 48, failure_persistence: None, ..Config::default() })]

    #[test]
    fn smooth_programs_pass_gradcheck(p in strategy::smooth_program(6)) {
        let report = p.gradcheck(&check_opts(Overrides::new())).unwrap();
        prop_assert!(report.passed, "{}\n{}", p, report);
    }

    /// Second derivatives of random smooth programs (every smooth row, each op's rule
    /// differentiated again) against finite differences of their first derivatives.
    #[test]
    fn smooth_programs_pass_gradgradcheck(p in strategy::smooth_program(5)) {
        let report = p.gradcheck(&second_order(Overrides::new())).unwrap();
        prop_assert!(report.passed, "{}\n{}", p, report);
    }

    #[test]
    fn generated_programs_are_well_typed_and_run(p in strategy::program(GenConfig::all(), 8)) {
        let infos = p.check(&Limits::small());
        prop_assert!(infos.is_ok(), "{:?}", infos);
        for dtype in [DType::F64, DType::F32] {
            let r = p.run(&RunOptions { dtype, limits: Limits::small(), ..RunOptions::default() });
            prop_assert!(r.is_ok(), "{}: {:?}", p, r.err());
        }
    }

    #[test]
    fn generated_programs_round_trip(p in strategy::program(GenConfig::all(), 8)) {
        let text = p.to_string();
        let q = Program::parse(&text).unwrap();
        prop_assert_eq!(&q, &p);
        prop_assert_eq!(q.to_string(), text);
    }

    #[test]
    fn broadcast_pairs_broadcast((a, b) in strategy::broadcast_pair(4, 3)) {
        let g = Graph::new();
        let x = g.ones(&a, DType::F64).unwrap();
        let y = g.ones(&b, DType::F64).unwrap();
        let z = x.add(y).unwrap();
        prop_assert_eq!(z.rank(), a.len().max(b.len()));
    }

    #[test]
    fn shapes_respect_their_bounds(s in strategy::shape(3, 5), t in strategy::shaped_tensor(2, 3)) {
        prop_assert!(s.len() <= 3 && s.iter().all(|&d| (1..=5).contains(&d)));
        prop_assert_eq!(t.numel(), t.shape().iter().product::<usize>());
    }
}

/// x³, registered by the application, with its rule 3x²·gy — or, planted wrong, 3x·gy.
struct Cube {
    wrong: bool,
}

impl CustomOp for Cube {
    fn name(&self) -> &'static str {
        if self.wrong {
            "wrong_cube"
        } else {
            "cube"
        }
    }
    fn backward<'g>(
        &self,
        _g: &'g Graph,
        inputs: &[Tensor<'g>],
        _output: Tensor<'g>,
        gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>, GraphError> {
        let x = inputs[0];
        let d = if self.wrong { x } else { x.mul(x)? };
        Ok(vec![Some(gy.mul(d.scale(3.0)?)?)])
    }
}

fn register_cube(wrong: bool) -> &'static str {
    let op =
        arenagrad_program::UserOp::elementwise(Arc::new(Cube { wrong }), |_, x| x[0].powf(3.0));
    let name = op.name();
    arenagrad_program::register_op(op).unwrap();
    name
}

/// The smooth ops and `name`, drawn as often as eight of them together (the list weighs ops by
/// how often they appear in it).
fn with_op(name: &'static str) -> GenConfig {
    let mut cfg = GenConfig::smooth();
    cfg.ops.extend([name; 8]);
    cfg
}

#[test]
fn an_applications_own_op_is_drawn_and_passes_when_its_rule_is_right() {
    let name = register_cube(false);
    assert!(GenConfig::smooth().with_user_ops(true).ops.contains(&name));
    let opts = check_opts(Overrides::new());
    let drawn = std::cell::Cell::new(0usize);
    let result = runner(96).run(&strategy::program(with_op(name), 8), |p| {
        let uses = p.statements().iter().any(|s| s.expr.op_name() == name);
        drawn.set(drawn.get() + usize::from(uses));
        prop_assert_eq!(Program::parse(&p.to_string()).unwrap(), p.clone());
        // Drawn eight times as often as any other op, x³ leaves the range of f64 now and then
        // under an exponential: `exp(cube(x²))` overflows, and `pow(exp(-x³), y)` underflows
        // to a power of zero whose derivative is infinite (NaN in PyTorch too). There finite
        // differences say nothing, so a program whose output or gradients are not finite is
        // set aside (a wrong rule gives finite, wrong gradients: the test below).
        let run = p
            .run(&RunOptions {
                limits: Limits::small(),
                ..RunOptions::default()
            })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let finite = |t: &arenagrad_graph::HostTensor| t.to_f64_vec().iter().all(|v| v.is_finite());
        prop_assume!(finite(&run.output.tensor) && run.grads.iter().all(|g| finite(&g.tensor)));
        let r = p
            .gradcheck(&opts)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(r.passed, "{p}\n{r}");
        Ok(())
    });
    result.unwrap();
    let drawn = drawn.get();
    eprintln!("programs using {name}: {drawn} of 96");
    assert!(
        drawn >= 10,
        "the registered op was drawn in only {drawn} programs"
    );
}

#[test]
fn a_wrong_rule_in_an_applications_op_shrinks_to_that_op() {
    let name = register_cube(true);
    let opts = check_opts(Overrides::new());
    let result = runner(256).run(&strategy::program(with_op(name), 10), |p| {
        let r = p
            .gradcheck(&opts)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(r.passed, "{r}");
        Ok(())
    });
    let minimal = match result {
        Err(TestError::Fail(_, p)) => p,
        other => panic!("the planted rule went unnoticed: {other:?}"),
    };
    assert!(minimal.len() <= 3, "shrunk only to:\n{minimal}");
    assert!(
        minimal
            .statements()
            .iter()
            .any(|s| s.expr.op_name() == name),
        "the minimal program does not use {name}:\n{minimal}"
    );
    eprintln!("minimal failing program:\n{minimal}");
    // The fuzz harness's gradient check finds it too, from bytes.
    let cfg = with_op(name);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 32) as u8
    };
    let found = (0..300).any(|_| {
        let bytes: Vec<u8> = (0..96).map(|_| next()).collect();
        arenagrad_program::fuzzing::check_grad_with(&bytes, &cfg).is_err()
    });
    assert!(found, "no fuzz input reached the planted rule");
}

/// A power's exponent in a generated program is one of its leaves (values within ±2.25), over
/// many seeds (24 × 128 programs): an exponent computed inside the program (once, `sin(x ^ sum(x))`, a sum of 64
/// values) made powers whose gradients finite differences cannot check, and a smooth program
/// then failed its gradient check for no fault of the engine.
#[test]
fn a_powers_exponent_is_a_leaf() {
    let strategy = strategy::program(GenConfig::smooth(), 10);
    let powers = std::cell::Cell::new(0usize);
    for seed in 0..24u8 {
        let config = Config {
            cases: 128,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
        let result = TestRunner::new_with_rng(config, rng).run(&strategy, |p| {
            let text = p.to_string();
            let mut leaves = Vec::new();
            for line in text.lines() {
                let t: Vec<&str> = line.split_whitespace().collect();
                match t.get(2) {
                    Some(&"input") | Some(&"const") => leaves.push(t[0].to_string()),
                    Some(&"pow") => {
                        powers.set(powers.get() + 1);
                        prop_assert!(leaves.iter().any(|l| l == t[4]), "{line} in\n{text}");
                    }
                    _ => {}
                }
            }
            Ok(())
        });
        assert!(result.is_ok(), "seed {seed}: {result:?}");
    }
    // Not vacuous: the programs hold powers.
    assert!(powers.get() >= 30, "only {} powers drawn", powers.get());
}

/// Every row of the op table that random programs may draw is drawn, over 24 × 64 programs of
/// every op: a row whose generator can never fit an operand (a rank-4 image when the leaves are
/// at most rank 3, say) would be dead weight in every property test and fuzz target.
#[test]
fn every_drawable_row_is_drawn() {
    let strategy = strategy::program(GenConfig::all(), 10);
    let seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
    for seed in 0..24u8 {
        let config = Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]);
        let result = TestRunner::new_with_rng(config, rng).run(&strategy, |p| {
            for s in p.statements() {
                seen.borrow_mut().insert(s.expr.op_name().to_string());
            }
            Ok(())
        });
        assert!(result.is_ok(), "seed {seed}: {result:?}");
    }
    let seen = seen.into_inner();
    let missing: Vec<&str> = arenagrad_program::table::OPS
        .iter()
        .filter(|r| r.gen.is_some() && !seen.contains(r.name))
        .map(|r| r.name)
        .collect();
    assert!(missing.is_empty(), "never drawn: {missing:?}");
    // Not vacuous: the table's drawable rows are most of it, and each of them was seen.
    let drawable = arenagrad_program::table::OPS
        .iter()
        .filter(|r| r.gen.is_some())
        .count();
    assert!(
        drawable >= 40 && seen.len() >= drawable,
        "{drawable} rows, seen {seen:?}"
    );
}

/// Random programs are chains of their ops, not ops on the leaves that the output never reads
/// (and that are dropped): `smooth_program(6)` keeps over two op statements on average (it
/// kept 1.4 when every operand was drawn from all values alike), and some reach five or more.
#[test]
fn random_programs_chain_their_ops() {
    let mut runner = runner(4000);
    let (programs, ops, deep) = (
        std::cell::Cell::new(0usize),
        std::cell::Cell::new(0usize),
        std::cell::Cell::new(0usize),
    );
    runner
        .run(&strategy::smooth_program(6), |p| {
            let n = p
                .statements()
                .iter()
                .filter(|s| !matches!(s.expr.op_name(), "input" | "const"))
                .count();
            programs.set(programs.get() + 1);
            ops.set(ops.get() + n);
            deep.set(deep.get() + usize::from(n >= 5));
            Ok(())
        })
        .unwrap();
    let mean = ops.get() as f64 / programs.get() as f64;
    assert!(mean >= 2.0, "{mean:.2} op statements per program");
    assert!(
        deep.get() * 20 >= programs.get(),
        "{} of {} programs have five ops",
        deep.get(),
        programs.get()
    );
}
