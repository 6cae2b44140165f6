//! Gradient checkpointing (`nn::functional::checkpoint`, `Graph::checkpoint`): an 8-block MLP
//! with dropout gives the same gradients bit for bit with and without it, keeps less memory at
//! its peak, differentiates twice under `create_graph`, and runs backward twice with
//! `retain_graph`.

use std::sync::Arc;

use arenagrad::check::{check_fn, gradgradcheck, GradcheckOptions};
use arenagrad::nn::{functional as F, Dropout, Linear, Module, Rng, Sequential, GELU};
use arenagrad::{BackwardOptions, CheckpointFn, DType, Graph, HostTensor};

fn blocks(n: usize, width: usize) -> Vec<Arc<Sequential>> {
    let mut rng = Rng::seed(3);
    (0..n)
        .map(|_| {
            Arc::new(
                Sequential::new()
                    .add(Linear::new(width, 4 * width, &mut rng).unwrap())
                    .add(GELU)
                    .add(Dropout::new(0.2).unwrap())
                    .add(Linear::new(4 * width, width, &mut rng).unwrap()),
            )
        })
        .collect()
}

/// Every gradient (parameters', then the input's) and the arena's peak of one step.
fn step(model: &[Arc<Sequential>], checkpointed: bool) -> (Vec<Vec<f32>>, usize) {
    let mut g = Graph::new();
    // A first step sizes the arena (as any training's first step does), then the measured one.
    let mut out = (Vec::new(), 0);
    for _ in 0..2 {
        for b in model {
            b.zero_grad();
        }
        g.seed(7);
        g.reset_peak_stats();
        let x = g
            .from_f64(&vec![0.3; 32 * 64], &[32, 64], DType::F32)
            .unwrap();
        let x = x.set_requires_grad(true).unwrap();
        let mut h = x;
        for b in model {
            let y = if checkpointed {
                F::checkpoint(&g, b, h).unwrap()
            } else {
                b.forward(&g, h).unwrap()
            };
            h = y.add(h).unwrap(); // a residual, as a transformer's blocks have
        }
        h.square().unwrap().mean().unwrap().backward().unwrap();
        let mut grads: Vec<Vec<f32>> = model
            .iter()
            .flat_map(|b| b.parameters())
            .map(|p| p.grad().unwrap().as_slice::<f32>().unwrap().to_vec())
            .collect();
        grads.push(x.grad().unwrap().unwrap().to_vec::<f32>().unwrap());
        out = (grads, g.stats().arena.peak_bytes_in_use);
        g.reset();
    }
    out
}

#[test]
fn gradients_are_identical_bit_for_bit_and_the_peak_is_lower() {
    let model = blocks(8, 64);
    let (plain, plain_peak) = step(&model, false);
    let (ck, ck_peak) = step(&model, true);
    assert_eq!(plain.len(), ck.len());
    for (k, (a, b)) in plain.iter().zip(&ck).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "gradient {k} differs"
        );
    }
    assert!(
        (ck_peak as f64) < 0.6 * plain_peak as f64,
        "peak {ck_peak} bytes with checkpointing, {plain_peak} without"
    );
}

#[test]
fn checkpointing_differentiates_twice_and_runs_backward_twice() {
    let block: CheckpointFn = Arc::new(|_g, x| x[0].tanh()?.mul(x[1])?.sin());
    let f = {
        let block = block.clone();
        check_fn(move |g, x| g.checkpoint(block.clone(), &[x[0], x[1]]))
    };
    let xs = [
        HostTensor::from_f64(&[0.4, -1.1, 0.7], &[3], DType::F64).unwrap(),
        HostTensor::from_f64(&[1.3, 0.2, -0.6], &[3], DType::F64).unwrap(),
    ];
    let r = gradgradcheck(f, &xs, GradcheckOptions::default()).unwrap();
    assert!(r.passed, "second order through a checkpoint: {r}");

    let g = Graph::new();
    let x = g.leaf(&[0.4, -1.1], &[2], DType::F64).unwrap();
    let y = g.checkpoint(block, &[x, x]).unwrap().sum().unwrap();
    let keep = BackwardOptions {
        retain_graph: true,
        ..Default::default()
    };
    y.backward_with(keep).unwrap();
    let once = x.grad().unwrap().unwrap().to_vec_f64().unwrap();
    y.backward().unwrap();
    let twice = x.grad().unwrap().unwrap().to_vec_f64().unwrap();
    for (a, b) in once.iter().zip(&twice) {
        assert_eq!(2.0 * a, *b);
    }
}

#[test]
fn an_identity_block_and_a_hook_inside_a_block_count_once() {
    // A block handing back its input: with a residual, x's gradient is 1 (residual) + 1 (block).
    let g = Graph::new();
    let x = g.leaf(&[0.5, -2.0], &[2], DType::F64).unwrap();
    let id: CheckpointFn = Arc::new(|_g, xs| Ok(xs[0]));
    let y = x.add(g.checkpoint(id, &[x]).unwrap()).unwrap();
    y.sum().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        vec![2.0, 2.0]
    );

    // A hook the block registers on its input: the first run's goes with that run's scope, the
    // second run's applies once.
    let g = Graph::new();
    let x = g.leaf(&[0.5, -2.0], &[2], DType::F64).unwrap();
    let block: CheckpointFn = Arc::new(|_g, xs| {
        xs[0].register_hook(|gx| Ok(Some(gx.scale(10.0)?)))?;
        xs[0].tanh()?.scale(3.0)
    });
    g.checkpoint(block, &[x])
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    let want: Vec<f64> = [0.5f64, -2.0]
        .iter()
        .map(|v| 30.0 * (1.0 - v.tanh().powi(2)))
        .collect();
    let got = x.grad().unwrap().unwrap().to_vec_f64().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
    }
}
