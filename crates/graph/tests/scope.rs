//! Nested scopes: `Graph::scope` frees what its closure made and keeps what it returns, so a
//! loop inside one iteration runs in flat memory; the enclosing scope's tensors, tape and
//! gradients are untouched.

use arenagrad_graph::{DType, Graph, GraphError, HostTensor, Parameter, Tensor};

#[test]
fn a_scope_keeps_its_result_and_frees_the_rest() {
    let g = Graph::new();
    let a = g.leaf(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let mut inner: Option<Tensor<'_>> = None;
    let nodes_before = g.stats().nodes;
    let r = g
        .scope(|g| {
            let t = a.mul(a)?.shift(1.0)?;
            inner = Some(t);
            let _ = g.zeros(&[1000], DType::F64)?;
            t.sum()
        })
        .unwrap();
    assert_eq!(r.item().unwrap(), 17.0);
    assert!(!r.requires_grad(), "a kept tensor is a constant");
    // One node more than before: the kept result.
    assert_eq!(g.stats().nodes, nodes_before + 1);
    assert!(matches!(
        inner.unwrap().to_vec_f64(),
        Err(GraphError::StaleTensor { .. })
    ));
    assert_eq!(a.to_vec_f64().unwrap(), [1.0, 2.0, 3.0]);
}

#[test]
fn the_enclosing_graph_still_differentiates() {
    let g = Graph::new();
    let x = g.leaf(&[0.5, -1.0], &[2], DType::F64).unwrap();
    let y = x.mul(x).unwrap().sum().unwrap();
    // A scope between the forward and the backward, reading x and y.
    let (v, n) = g
        .scope(|_| Ok((y.item()? * 2.0, x.to_vec_f64()?.len())))
        .unwrap();
    assert_eq!((v, n), (2.5, 2));
    y.backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        [1.0, -2.0]
    );
}

#[test]
fn scopes_nest_and_an_error_still_frees() {
    let g = Graph::new();
    let a = g.ones(&[4], DType::F32).unwrap();
    let before = g.stats();
    let out = g
        .scope(|g| {
            let b = a.scale(2.0)?;
            let c = g.scope(|_| b.scale(3.0)?.sum())?;
            // b still lives here; c is this scope's constant.
            Ok((b.sum()?.item()?, c.item()?))
        })
        .unwrap();
    assert_eq!(out, (8.0, 24.0));
    let err = g.scope(|g| -> arenagrad_graph::Result<Tensor<'_>> {
        let _big = g.zeros(&[10_000], DType::F32)?;
        a.reshape(&[3])
    });
    assert!(matches!(err, Err(GraphError::BadReshape { .. })));
    let after = g.stats();
    assert_eq!(after.nodes, before.nodes);
    assert_eq!(after.arena.bytes_in_use, before.arena.bytes_in_use);
}

#[test]
fn a_long_loop_in_one_iteration_stays_flat() {
    // A model's step at batch 1 over a growing history (a key/value cache of 2,000 rows,
    // written in place one row per step), 2,000 steps inside one iteration: the nodes, the live
    // bytes and the arena's reserve stay as they were after the first step — after a training
    // iteration's reset has sized the arena's region, and in a process's very first iteration
    // (no reset yet), where they settle within the first 400 steps.
    for warm in [true, false] {
        let seen = long_loop(warm);
        eprintln!("warm-up {warm}: (nodes, live bytes, arena bytes) every 400 steps {seen:?}");
        let from = if warm { 0 } else { 1 };
        assert!(
            seen[from..].windows(2).all(|w| w[0] == w[1]),
            "warm-up {warm}: {seen:?}"
        );
    }
}

/// (nodes, live bytes, arena capacity) every 400 steps of the loop above.
fn long_loop(warm: bool) -> Vec<(usize, usize, usize)> {
    let mut g = Graph::new();
    let w = Parameter::new(
        "w",
        HostTensor::from_f64(
            &(0..32 * 32)
                .map(|k| ((k as f64) * 0.01).sin() * 0.2)
                .collect::<Vec<_>>(),
            &[32, 32],
            DType::F32,
        )
        .unwrap(),
    );
    if warm {
        // One iteration first, as training would: its reset sizes the arena's region.
        let _ = g.randn(&[512, 512], DType::F32).unwrap();
        g.reset();
    }
    let steps = 2000;
    let cache = g.zeros(&[steps, 32], DType::F32).unwrap();
    let state = g.randn(&[1, 32], DType::F32).unwrap();
    let mut seen = Vec::new();
    for step in 0..steps {
        let y = g
            .scope(|g| {
                let h = state.matmul(g.param(&w)?)?.tanh()?;
                cache.slice_write(0, step, h)?;
                let past = cache.slice(0, 0, step + 1)?;
                let att = h.matmul(past.t()?)?.softmax(-1)?.matmul(past)?;
                state.slice_write(0, 0, att)?;
                att.sum()?.item()
            })
            .unwrap();
        assert!(y.is_finite());
        if step % 400 == 0 {
            let s = g.stats();
            seen.push((s.nodes, s.arena.bytes_in_use, s.arena.capacity));
        }
    }
    seen
}

#[test]
fn slice_write_refuses_what_would_change_a_gradient() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let c = g.from_f64(&[0.0; 3], &[3], DType::F64).unwrap();
    let one = g.from_f64(&[5.0], &[1], DType::F64).unwrap();
    assert!(matches!(
        x.slice_write(0, 0, one),
        Err(GraphError::BadArgument { .. })
    ));
    c.slice_write(0, 2, one).unwrap();
    assert_eq!(c.to_vec_f64().unwrap(), [0.0, 0.0, 5.0]);
    // Once backward will read c (the gradient of x·c is c), writing it is refused.
    let y = x.mul(c).unwrap().sum().unwrap();
    assert!(matches!(
        c.slice_write(0, 0, one),
        Err(GraphError::BadArgument { .. })
    ));
    y.backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        [0.0, 0.0, 5.0]
    );
    assert!(matches!(
        c.slice_write(0, 3, one),
        Err(GraphError::BadRange { .. })
    ));
    let two = g.from_f64(&[1.0, 2.0], &[1, 2], DType::F64).unwrap();
    assert!(matches!(
        c.slice_write(0, 0, two),
        Err(GraphError::ShapeMismatch { .. })
    ));
}

#[test]
fn a_scope_reads_parameters_and_leaves_them_alone() {
    let g = Graph::new();
    let p = Parameter::new(
        "p",
        HostTensor::from_f64(&[1.0, 2.0], &[2], DType::F64).unwrap(),
    );
    let outer = g.param(&p).unwrap();
    let s = g.scope(|g| g.param(&p)?.mul(outer)?.sum()).unwrap();
    assert_eq!(s.item().unwrap(), 5.0);
    outer.sum().unwrap().backward().unwrap();
    assert_eq!(p.grad().unwrap().to_f64_vec(), [1.0, 1.0]);
}

#[test]
fn a_leaf_set_to_require_grad_inside_a_scope_keeps_its_gradient() {
    // PyTorch: `requires_grad_()` under `no_grad` sticks, and backward fills `.grad`.
    let g = Graph::new();
    let x = g.from_f64(&[1.0, -2.0, 3.0], &[3], DType::F64).unwrap();
    let before = g.stats();
    g.scope(|_| {
        x.set_requires_grad(true)?;
        Ok(())
    })
    .unwrap();
    assert!(x.requires_grad());
    let y = x.mul(x).unwrap().sum().unwrap();
    y.backward().unwrap();
    assert_eq!(
        x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        [2.0, -4.0, 6.0]
    );
    // Turned on and off again inside: the leaf is as it was, and on no tape.
    let z = g.from_f64(&[5.0], &[1], DType::F64).unwrap();
    let tape = g.stats().tape_len;
    g.scope(|_| {
        z.set_requires_grad(true)?.set_requires_grad(false)?;
        Ok(())
    })
    .unwrap();
    assert!(!z.requires_grad());
    assert_eq!(g.stats().tape_len, tape);
    assert!(before.tape_len < tape);
}
