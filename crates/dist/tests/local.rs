//! `DataParallel` in a world of one: it must train exactly as the bare module does, start every
//! bucket from backward's hook, and refuse what cannot be reduced.

mod common;

use std::sync::Arc;

use arenagrad_dist::{Communicator, DataParallel, DdpConfig, Local, Reduce};
use arenagrad_graph::HostData;
use arenagrad_nn::optim::Optimizer;
use arenagrad_nn::{Graph, Module};
use common::*;

#[test]
fn a_world_of_one_trains_bit_for_bit_as_the_bare_module_and_starts_buckets_in_backward() {
    let bare = bare(10);
    // Buckets of about 1 KiB: the two linear layers' weights and biases fall into several.
    let config = DdpConfig {
        bucket_bytes: 1024,
        first_bucket_bytes: 1024,
        ..DdpConfig::default()
    };
    let model = DataParallel::new(cnn(), Arc::new(Local), config).unwrap();
    assert!(model.buckets() >= 4, "{} buckets", model.buckets());
    let mut opt = sgd(&model);
    let mut g = Graph::with_threads(1);
    for step in 0..10 {
        opt.zero_grad();
        backward(&model, &mut g, step, 0..32);
        let stats = model.step(&mut opt).unwrap();
        assert_eq!(stats.buckets, model.buckets());
        // Every parameter got its gradient in backward: every bucket started there.
        assert_eq!(stats.started_in_backward, stats.buckets);
        let params: usize = model.parameters().iter().map(|p| p.numel()).sum();
        assert_eq!(stats.bytes, params * 4);
    }
    assert_same(&weights(&model), &bare, "wrapped vs bare");
}

#[test]
fn buckets_a_backward_never_reached_start_at_synchronize() {
    let model = DataParallel::new(cnn(), Arc::new(Local), DdpConfig::default()).unwrap();
    let mut opt = sgd(&model);
    // No forward through the wrapper: no hook, no gradient; synchronize still reduces (zeros).
    let stats = model.step(&mut opt).unwrap();
    assert_eq!(stats.started_in_backward, 0);
    assert_eq!(stats.buckets, model.buckets());
    assert!(model.parameters().iter().all(|p| p
        .grad()
        .unwrap()
        .to_f64_vec()
        .iter()
        .all(|&v| v == 0.0)));
}

#[test]
fn local_reductions_give_the_elements_back_and_refuse_a_root_outside() {
    let v = HostData::F32(vec![1.5, -2.0]);
    for op in [Reduce::Sum, Reduce::Mean, Reduce::Max, Reduce::Min] {
        assert_eq!(Local.all_reduce(v.clone(), op).unwrap(), v);
    }
    assert_eq!(Local.broadcast(v.clone(), 0).unwrap(), v);
    let e = Local.broadcast(v, 1).unwrap_err().to_string();
    assert!(e.contains("root rank 1 is outside a world of 1"), "{e}");
    Local.barrier().unwrap();
}

#[test]
fn on_main_runs_on_rank_zero_and_passes_its_failure_on() {
    let model = DataParallel::new(cnn(), Arc::new(Local), DdpConfig::default()).unwrap();
    assert_eq!(model.on_main(|| Ok(7)).unwrap(), Some(7));
    let e = model
        .on_main(|| -> arenagrad_nn::Result<()> {
            Err(arenagrad_nn::NnError::InvalidConfig {
                component: "test",
                reason: "refused".into(),
            })
        })
        .unwrap_err();
    assert!(e.to_string().contains("refused"), "{e}");
}

#[test]
fn gradients_accumulated_over_two_backward_passes_are_reduced_together() {
    // Two backward passes a step (rows 0..16 and 16..32), gradients summed, then a step.
    let run = |wrap: bool| {
        let inner = cnn();
        let model = DataParallel::new(inner, Arc::new(Local), DdpConfig::default()).unwrap();
        let mut opt = sgd(&model);
        let mut g = Graph::with_threads(1);
        for step in 0..4 {
            opt.zero_grad();
            for half in [0..16, 16..32] {
                if wrap {
                    backward(&model, &mut g, step, half);
                } else {
                    backward(model.module(), &mut g, step, half);
                }
            }
            let stats = model.step(&mut opt).unwrap();
            assert_eq!(stats.rounds, if wrap { 2 } else { 1 });
        }
        weights(&model)
    };
    // The bare module's passes bypass the hook: synchronize reduces the sums (identity here).
    assert_same(
        &run(true),
        &run(false),
        "accumulated through the wrapper vs bare",
    );
}

#[test]
fn two_steps_in_one_iteration_hook_the_graph_once() {
    // forward, backward, step; forward, backward, step — with no reset in between: the graph
    // keeps the one hook, each step's buckets start in its backward, once.
    let model = DataParallel::new(cnn(), Arc::new(Local), DdpConfig::default()).unwrap();
    let mut opt = sgd(&model);
    let g = Graph::with_threads(1);
    for step in 0..2 {
        opt.zero_grad();
        let (x, y) = batch(step, 0..8);
        let xt = g.from_slice(&x, &[8, 1, 28, 28]).unwrap();
        arenagrad_nn::loss::cross_entropy(model.forward(&g, xt).unwrap(), &y)
            .unwrap()
            .backward()
            .unwrap();
        let stats = model.step(&mut opt).unwrap();
        assert_eq!(stats.started_in_backward, stats.buckets, "step {step}");
        assert_eq!(stats.rounds, 1, "step {step}");
    }
}

/// How a [`Liar`] answers broadcast number `call` (from 0) of `request`.
type Answer = fn(HostData, usize) -> HostData;

/// Rank 1 of 2 whose reductions give the elements back and whose broadcasts answer with
/// `answer(request, call)`: a transport that answers wrongly.
struct Liar {
    answer: Answer,
    calls: std::sync::atomic::AtomicUsize,
}

impl Communicator for Liar {
    fn rank(&self) -> usize {
        1
    }
    fn world_size(&self) -> usize {
        2
    }
    fn backend(&self) -> &'static str {
        "liar"
    }
    fn all_reduce_start(
        &self,
        buf: HostData,
        _op: Reduce,
    ) -> arenagrad_dist::Result<arenagrad_dist::Pending> {
        Ok(arenagrad_dist::Pending::ready(Ok(buf)))
    }
    fn broadcast(&self, buf: HostData, _root: usize) -> arenagrad_dist::Result<HostData> {
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok((self.answer)(buf, call))
    }
    fn barrier(&self) -> arenagrad_dist::Result<()> {
        Ok(())
    }
}

/// A module of one f32 parameter, one f64 parameter and one f32 buffer.
#[derive(Debug)]
struct Mixed {
    a: arenagrad_graph::Parameter,
    b: arenagrad_graph::Parameter,
    running: arenagrad_graph::Parameter,
}

impl Mixed {
    fn new() -> Self {
        let p = |name: &str, v: &[f64], dtype| {
            arenagrad_graph::Parameter::new(
                name,
                arenagrad_graph::HostTensor::from_f64(v, &[v.len()], dtype).unwrap(),
            )
        };
        Mixed {
            a: p("a", &[1.0, 2.0, 3.0], arenagrad_graph::DType::F32),
            b: p("b", &[4.0, 5.0], arenagrad_graph::DType::F64),
            running: p("running", &[6.0], arenagrad_graph::DType::F32),
        }
    }

    fn values(&self) -> Vec<Vec<f64>> {
        [&self.a, &self.b, &self.running]
            .iter()
            .map(|p| p.value().to_f64_vec())
            .collect()
    }
}

impl Module for Mixed {
    fn forward<'g>(
        &self,
        _g: &'g Graph,
        x: arenagrad_nn::Tensor<'g>,
    ) -> arenagrad_nn::Result<arenagrad_nn::Tensor<'g>> {
        Ok(x)
    }
    fn visit(&self, v: &mut arenagrad_nn::Visitor<'_>) {
        v.param("a", &self.a);
        v.param("b", &self.b);
        v.buffer("running", &self.running);
    }
}

#[test]
fn a_broadcast_answered_with_another_length_or_dtype_is_refused_with_nothing_written() {
    // Rank 0's values, as a truthful transport would answer: every element 9.
    fn nines(buf: HostData) -> HostData {
        HostData::from_f64(buf.dtype(), &vec![9.0; buf.len()])
    }
    let liars: [(&str, Answer); 5] = [
        ("short", |buf, _| {
            HostData::from_f64(buf.dtype(), &vec![9.0; buf.len() - 1])
        }),
        ("long", |buf, _| {
            HostData::from_f64(buf.dtype(), &vec![9.0; buf.len() + 1])
        }),
        ("other dtype", |buf, _| {
            let other = match buf.dtype() {
                arenagrad_graph::DType::F32 => arenagrad_graph::DType::F64,
                _ => arenagrad_graph::DType::F32,
            };
            HostData::from_f64(other, &vec![9.0; buf.len()])
        }),
        // The f32 parameters' answer is right, the f64 ones' (the second broadcast) wrong: the
        // f32 parameters must not be written either.
        ("second answer short", |buf, call| {
            let n = buf.len() - usize::from(call == 1);
            HostData::from_f64(buf.dtype(), &vec![9.0; n])
        }),
        // The parameters' answers are right, the buffer's (the third) empty.
        ("buffer's answer empty", |buf, call| {
            if call == 2 {
                HostData::from_f64(buf.dtype(), &[])
            } else {
                nines(buf)
            }
        }),
    ];
    let before = Mixed::new().values();
    for (what, answer) in liars {
        let module = Mixed::new();
        let (a, b, running) = (module.a.clone(), module.b.clone(), module.running.clone());
        let comm = Arc::new(Liar {
            answer,
            calls: 0.into(),
        });
        let e = DataParallel::new(module, comm, DdpConfig::default()).unwrap_err();
        assert!(
            matches!(
                e,
                arenagrad_dist::DistError::Mismatch {
                    op: "DataParallel::new",
                    ..
                }
            ),
            "{what}: {e:?}"
        );
        assert!(e.to_string().contains("came back with"), "{what}: {e}");
        let after: Vec<Vec<f64>> = [&a, &b, &running]
            .iter()
            .map(|p| p.value().to_f64_vec())
            .collect();
        assert_eq!(after, before, "{what}: written before the error");
    }

    // A truthful answer is written, and broadcast_state checks as new does.
    let comm = Arc::new(Liar {
        answer: |buf, call| {
            if call < 3 {
                nines(buf)
            } else {
                HostData::from_f64(buf.dtype(), &vec![7.0; buf.len() + 2])
            }
        },
        calls: 0.into(),
    });
    let model = DataParallel::new(Mixed::new(), comm, DdpConfig::default()).unwrap();
    let nine = vec![vec![9.0; 3], vec![9.0; 2], vec![9.0]];
    assert_eq!(model.module().values(), nine);
    let e = model.broadcast_state().unwrap_err();
    assert!(
        matches!(
            e,
            arenagrad_dist::DistError::Mismatch {
                op: "DataParallel::broadcast_state",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(model.module().values(), nine);
}
