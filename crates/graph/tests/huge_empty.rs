//! Huge extents with nothing to compute: an empty result is answered at once, and a count that
//! cannot be held (pieces, steps) is a typed error before any work. Each of these aborted the
//! process (an index list sized by the extents, built infallibly) or ran for hours (a kernel's
//! loop over 2^40 rows or steps of nothing); each runs here under a deadline.

use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

use arenagrad_graph::{AttentionOptions, DType, Graph, GraphError, LstmSequenceOptions, Result};

const HUGE: usize = 1 << 40;

/// Runs `f` on a thread of its own and fails the test if it has not returned within a few
/// seconds (the walks fixed here took hours).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(v) => v,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: still running after 10 s"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

fn shapes(ts: &[arenagrad_graph::Tensor<'_>]) -> Vec<Vec<usize>> {
    ts.iter().map(|t| t.shape().to_vec()).collect()
}

#[test]
fn slice_step_of_an_empty_tensor_builds_no_index_list() {
    within("slice_step", || -> Result<()> {
        let g = Graph::new();
        let x = g.zeros(&[HUGE, 0], DType::F32)?.set_requires_grad(true)?;
        // Every other row of 2^40 (an index list of 2^39 entries before: 4 TiB).
        let y = x.slice_step(0, 0, HUGE, 2)?;
        assert_eq!(y.shape().as_slice(), &[HUGE / 2, 0]);
        // Along the empty axis: no element, and no kernel walking 2^40 rows of nothing.
        let z = x.slice_step(1, 0, 0, 3)?;
        assert_eq!(z.shape().as_slice(), &[HUGE, 0]);
        y.sum()?.add(z.sum()?)?.backward()?;
        assert_eq!(x.grad()?.unwrap().shape().as_slice(), &[HUGE, 0]);
        // Picked elements of a small tensor still come from the index list, in order.
        let s = g.from_f64(&[0., 1., 2., 3., 4., 5., 6.], &[7], DType::F64)?;
        assert_eq!(s.slice_step(0, 1, 7, 3)?.to_vec::<f64>()?, [1.0, 4.0]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn chunk_and_unbind_of_an_empty_tensor() {
    within("chunk", || -> Result<()> {
        let g = Graph::new();
        let x = g.zeros(&[HUGE, 0], DType::F32)?;
        // 2^40 pieces cannot be nodes of one iteration: an error naming the op and the shape.
        let err = x.chunk(HUGE, 0).unwrap_err();
        assert_eq!(
            err,
            GraphError::TooLarge {
                op: "chunk",
                shape: vec![HUGE, 0]
            }
        );
        let err = x.unbind(0).unwrap_err();
        assert_eq!(
            err,
            GraphError::TooLarge {
                op: "unbind",
                shape: vec![HUGE, 0]
            }
        );
        // Pieces along either axis, made at once (each a slice of nothing).
        assert_eq!(
            shapes(&x.chunk(2, 0)?),
            [vec![HUGE / 2, 0], vec![HUGE / 2, 0]]
        );
        assert_eq!(shapes(&x.chunk(2, 1)?), [vec![HUGE, 0], vec![HUGE, 0]]);
        assert_eq!(x.chunk(3, 1)?.len(), 3);
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_recurrence_of_more_steps_than_an_iteration_holds_is_an_error() {
    within("recurrence", || -> Result<()> {
        let g = Graph::new();
        // Zero-width inputs of 2^40 steps for one row: 2^40 nodes at least (and an index list
        // of 2^40 entries before the walk, which aborted).
        let x = g.zeros(&[HUGE, 0], DType::F64)?;
        let h0 = g.zeros(&[1, 0], DType::F64)?;
        let mut calls = 0;
        let r = g.recurrence(x, vec![h0], HUGE, &[HUGE], false, |x, s| {
            calls += 1;
            Ok::<_, GraphError>(vec![s[0].add(x)?])
        });
        assert_eq!(
            r.map(|_| ()).unwrap_err(),
            GraphError::TooLarge {
                op: "recurrence",
                shape: vec![HUGE, 1]
            }
        );
        assert_eq!(calls, 0);
        // t · b overflowing is a shape mismatch, not an overflow.
        let y = g.zeros(&[4, 0], DType::F64)?;
        let h = g.zeros(&[2, 0], DType::F64)?;
        let r = g.recurrence(y, vec![h], usize::MAX, &[usize::MAX, 0], false, |_, s| {
            Ok::<_, GraphError>(s.to_vec())
        });
        assert!(matches!(
            r.map(|_| ()),
            Err(GraphError::ShapeMismatch {
                op: "recurrence",
                ..
            })
        ));
        Ok(())
    })
    .unwrap();
}

#[test]
fn an_lstm_over_empty_steps_does_not_walk_them() {
    within("lstm_sequence", || -> Result<()> {
        let g = Graph::new();
        // No hidden unit: [2^40, 1, 0] projections.
        let gi = g
            .zeros(&[HUGE, 1, 0], DType::F32)?
            .set_requires_grad(true)?;
        let w = g.zeros(&[0, 0], DType::F32)?.set_requires_grad(true)?;
        let h0 = g.zeros(&[1, 0], DType::F32)?.set_requires_grad(true)?;
        let c0 = g.zeros(&[1, 0], DType::F32)?.set_requires_grad(true)?;
        for unfused in [false, true] {
            let opts = LstmSequenceOptions {
                unfused,
                ..Default::default()
            };
            let (y, hn, cn) = gi.lstm_sequence(w, h0, c0, opts)?;
            assert_eq!(
                shapes(&[y, hn, cn]),
                [vec![HUGE, 1, 0], vec![1, 0], vec![1, 0]]
            );
            y.sum()?.add(hn.sum()?)?.add(cn.sum()?)?.backward()?;
            assert_eq!(gi.grad()?.unwrap().shape().as_slice(), &[HUGE, 1, 0]);
        }
        // No row: [2^40, 0, 8] projections of two units. The recurrent weight's gradient is
        // zeros (a sum over no position).
        let gi = g.zeros(&[HUGE, 0, 8], DType::F32)?;
        let w = g.full(&[8, 2], 0.5, DType::F32)?.set_requires_grad(true)?;
        let h0 = g.zeros(&[0, 2], DType::F32)?;
        let (y, hn, cn) = gi.lstm_sequence(w, h0, h0, Default::default())?;
        assert_eq!(
            shapes(&[y, hn, cn]),
            [vec![HUGE, 0, 2], vec![0, 2], vec![0, 2]]
        );
        y.sum()?.backward()?;
        assert_eq!(w.grad()?.unwrap().to_vec::<f32>()?, vec![0.0; 16]);
        Ok(())
    })
    .unwrap();
}

#[test]
fn ops_with_an_empty_result_do_no_work() {
    within("concat, cumsum, attention", || -> Result<()> {
        let g = Graph::new();
        let x = g.zeros(&[HUGE, 0], DType::F32)?;
        // Placing 2^40 rows of nothing, twice, took hours.
        assert_eq!(g.concat(&[x, x], 1)?.shape().as_slice(), &[HUGE, 0]);
        // 2^40 running sums of nothing.
        assert_eq!(x.cumsum(0)?.shape().as_slice(), &[HUGE, 0]);
        // 2^40 heads of no query: a list of each head's mask offset (8 TiB) aborted.
        let q = g.zeros(&[HUGE, 0, 4], DType::F32)?;
        let mask = g.zeros(&[HUGE, 0, 0], DType::F32)?;
        let opts = AttentionOptions {
            mask: Some(mask),
            ..Default::default()
        };
        let o = q.scaled_dot_product_attention(q, q, opts)?;
        assert_eq!(o.shape().as_slice(), &[HUGE, 0, 4]);
        // And through backward (the recorded op keeps its empty statistics).
        let q = q.set_requires_grad(true)?;
        let o = q.scaled_dot_product_attention(q, q, opts)?;
        o.sum()?.backward()?;
        assert_eq!(q.grad()?.unwrap().shape().as_slice(), &[HUGE, 0, 4]);
        // The values of a small concat and cumsum are unchanged.
        let a = g.from_f64(&[1., 2., 3., 4.], &[2, 2], DType::F64)?;
        assert_eq!(
            g.concat(&[a, a], 1)?.to_vec::<f64>()?,
            [1., 2., 1., 2., 3., 4., 3., 4.]
        );
        assert_eq!(a.cumsum(0)?.to_vec::<f64>()?, [1., 2., 4., 6.]);
        Ok(())
    })
    .unwrap();
}
