//! A unary op's derivative lives in three places: the op table's row (the fused backward
//! kernel), the CUDA string beside it, and the `create_graph` arm of the graph's backward rule,
//! which writes the derivative in differentiable ops so that it can be differentiated again.
//! This test holds the third to the first for every row of the table: the same gradient with
//! and without `create_graph`, on inputs inside each op's domain and away from its kinks.

use arenagrad_graph::exec::Domain;
use arenagrad_graph::{grad, BackwardOptions, DType, Graph, UnaryOp};

/// The gradient of `Σ wᵢ·op(xᵢ)` with respect to `x`, in `f64`, with or without `create_graph`.
fn gradient(op: UnaryOp, xs: &[f64], create_graph: bool) -> Option<Vec<f64>> {
    let g = Graph::new();
    let x = g.leaf(xs, &[xs.len()], DType::F64).unwrap();
    let w: Vec<f64> = (0..xs.len()).map(|i| 0.5 + 0.25 * i as f64).collect();
    let w = g.from_f64(&w, &[xs.len()], DType::F64).unwrap();
    let loss = x.unary(op).unwrap().mul(w).unwrap().sum().unwrap();
    let opts = BackwardOptions {
        create_graph,
        ..BackwardOptions::default()
    };
    let gx = grad(loss, &[x], opts).unwrap().remove(0);
    gx.map(|t| t.to_vec_f64().unwrap())
}

#[test]
fn every_rows_create_graph_rule_matches_its_fused_derivative() {
    // Away from 0 (abs, relu, sign, step) and on both sides of softplus's threshold (20).
    let anywhere = [-2.3, -1.1, -0.4, 0.3, 0.7, 1.6, 2.9, 25.0];
    let positive = [0.2, 0.7, 1.3, 2.9, 25.0];
    let mut checked = 0;
    for &op in UnaryOp::SAMPLES {
        let xs: &[f64] = match op.domain() {
            Domain::All => &anywhere,
            Domain::Positive => &positive,
        };
        let fused = gradient(op, xs, false);
        let graphed = gradient(op, xs, true);
        match (&fused, &graphed) {
            (Some(a), Some(b)) => {
                for (i, (a, b)) in a.iter().zip(b).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-12 * (1.0 + a.abs()),
                        "`{}` at x = {}: the create_graph rule gives {b}, the row's derivative {a}",
                        op.name(),
                        xs[i]
                    );
                }
            }
            (None, None) => {}
            _ => panic!(
                "`{}`: a gradient with one rule and none with the other ({fused:?} vs {graphed:?})",
                op.name()
            ),
        }
        checked += 1;
    }
    assert_eq!(checked, UnaryOp::SAMPLES.len());
}
