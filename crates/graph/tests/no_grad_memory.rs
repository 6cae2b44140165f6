//! Memory kept for a backward that cannot come: a fused op that is not recorded (under
//! `no_grad`, or when no input requires grad) keeps nothing besides its output. Measured by the
//! arena's peak across the op against the bytes of what it returns; the values are the
//! recorded forward's, bit for bit.

mod common;

use arenagrad_graph::{AttentionOptions, DType, Graph, LstmSequenceOptions, Result, Tensor};
use common::values;

/// One fused op: its inputs' shapes, what it returns, and the bytes an unrecorded run may have
/// made at its peak (its outputs, and any intermediate the op returns through, such as the
/// `[2, b, h]` buffer a cell's two states are sliced from).
struct Case {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    run: for<'g> fn(&[Tensor<'g>]) -> Result<Vec<Tensor<'g>>>,
    peak: usize,
}

fn cases() -> Vec<Case> {
    let (t, b, h) = (5, 3, 16);
    let f = 4; // bytes of an f32
    vec![
        Case {
            name: "lstm_sequence",
            shapes: vec![vec![t, b, 4 * h], vec![4 * h, h], vec![b, h], vec![b, h]],
            run: |x| {
                let (y, hn, cn) = x[0].lstm_sequence(x[1], x[2], x[3], Default::default())?;
                Ok(vec![y, hn, cn])
            },
            peak: (t * b * h + 2 * b * h) * f,
        },
        Case {
            name: "lstm_sequence with lengths",
            shapes: vec![vec![t, b, 4 * h], vec![4 * h, h], vec![b, h], vec![b, h]],
            run: |x| {
                let opts = LstmSequenceOptions {
                    lengths: Some(&[5, 3, 1]),
                    reverse: true,
                    ..Default::default()
                };
                let (y, hn, cn) = x[0].lstm_sequence(x[1], x[2], x[3], opts)?;
                Ok(vec![y, hn, cn])
            },
            peak: (t * b * h + 2 * b * h) * f,
        },
        Case {
            name: "lstm_cell",
            shapes: vec![vec![b, 4 * h], vec![b, h]],
            run: |x| {
                let (h2, c2) = x[0].lstm_cell(x[1])?;
                Ok(vec![h2, c2])
            },
            // The [2, b, h] states and the two slices of it.
            peak: 2 * (2 * b * h) * f,
        },
        Case {
            name: "gru_cell",
            shapes: vec![vec![b, 3 * h], vec![b, 3 * h], vec![b, h]],
            run: |x| Ok(vec![x[0].gru_cell(x[1], x[2])?]),
            peak: b * h * f,
        },
        Case {
            name: "layer_norm",
            shapes: vec![vec![8, 32], vec![32], vec![32]],
            run: |x| Ok(vec![x[0].layer_norm(1, Some(x[1]), Some(x[2]), 1e-5)?]),
            peak: 8 * 32 * f,
        },
        Case {
            name: "rms_norm",
            shapes: vec![vec![8, 32]],
            run: |x| Ok(vec![x[0].rms_norm(1, None, 1e-5)?]),
            peak: 8 * 32 * f,
        },
        Case {
            name: "scaled_dot_product_attention",
            shapes: vec![vec![2, 8, 16], vec![2, 8, 16], vec![2, 8, 16]],
            run: |x| {
                let opts = AttentionOptions {
                    causal: true,
                    ..Default::default()
                };
                Ok(vec![x[0].scaled_dot_product_attention(x[1], x[2], opts)?])
            },
            peak: 2 * 8 * 16 * f,
        },
        Case {
            name: "dropout",
            shapes: vec![vec![256]],
            run: |x| Ok(vec![x[0].dropout(0.5, true)?]),
            peak: 256 * f,
        },
    ]
}

/// The case's inputs (each requiring grad when `grad`), its outputs' bits, the arena's peak
/// growth across the op, the bytes still held after it, and the tape's growth.
fn measure(g: &Graph, c: &Case, grad: bool) -> (Vec<Vec<u32>>, usize, usize, usize) {
    let inputs: Vec<Tensor<'_>> = c
        .shapes
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n = s.iter().product();
            let t = g.from_f64(&values(n, k as u64 + 1, false), s, DType::F32)?;
            if grad {
                t.set_requires_grad(true)
            } else {
                Ok(t)
            }
        })
        .collect::<Result<_>>()
        .unwrap();
    let before = g.stats();
    g.reset_peak_stats();
    let outs = (c.run)(&inputs).unwrap();
    let after = g.stats();
    let bits = outs
        .iter()
        .map(|o| {
            o.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect();
    (
        bits,
        after.arena.peak_bytes_in_use - before.arena.bytes_in_use,
        after.arena.bytes_in_use - before.arena.bytes_in_use,
        after.tape_len - before.tape_len,
    )
}

#[test]
fn fused_ops_keep_nothing_for_a_backward_that_cannot_come() {
    for c in cases() {
        let g = Graph::new();
        let (want, recorded_peak, _, _) = measure(&g, &c, true);
        let unrecorded = [
            ("under no_grad", true),
            ("with no input requiring grad", false),
        ];
        for (how, grad) in unrecorded {
            let g = Graph::new();
            let _guard = grad.then(|| g.no_grad());
            let (got, peak, held, taped) = measure(&g, &c, grad);
            assert_eq!(got, want, "{} {how}: the recorded forward's values", c.name);
            assert_eq!(taped, 0, "{} {how}: recorded", c.name);
            assert!(
                peak <= c.peak && held <= c.peak,
                "{} {how}: peak {peak} B, {held} B held after, for {} B of outputs",
                c.name,
                c.peak
            );
            if c.name != "dropout" {
                // The measure tells a record from none: the recorded op's peak is higher.
                assert!(
                    recorded_peak > peak,
                    "{}: {recorded_peak} vs {peak}",
                    c.name
                );
            }
        }
    }
}
