//! Gradient hooks (`Tensor::register_hook`): they see the summed gradient, can replace it on an
//! intermediate and on a parameter's leaf (whose product gradient otherwise goes straight into
//! the parameter), run in order, and refuse what cannot be a gradient.

use std::sync::{Arc, Mutex};

use arenagrad_graph::{DType, Graph, GraphError, HostTensor, Parameter};

#[test]
fn a_hook_sees_the_summed_gradient_and_replaces_it() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, -2.0, 3.0], &[3], DType::F64).unwrap();
    let y = x.tanh().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    y.register_hook(move |gy| {
        log.lock().unwrap().push(gy.to_vec_f64()?);
        Ok(None)
    })
    .unwrap();
    y.register_hook(|gy| Ok(Some(gy.scale(-1.0)?))).unwrap();
    // y is used twice: its gradient is 1 + 2 = 3 per element, seen once, summed.
    y.add(y.scale(2.0).unwrap())
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![vec![3.0; 3]]);
    let want: Vec<f64> = [1.0f64, -2.0, 3.0]
        .iter()
        .map(|v| -3.0 * (1.0 - v.tanh().powi(2)))
        .collect();
    let got = x.grad().unwrap().unwrap().to_vec_f64().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
    }
}

#[test]
fn a_hook_on_a_parameters_leaf_changes_what_reaches_the_parameter() {
    let p = Parameter::new(
        "w",
        HostTensor::from_f64(&[1.0; 6], &[2, 3], DType::F64).unwrap(),
    );
    let x_data = [0.5, -1.0, 2.0, 1.5];
    for hooked in [false, true] {
        p.zero_grad();
        let g = Graph::new();
        let w = g.param(&p).unwrap();
        if hooked {
            w.register_hook(|gw| Ok(Some(gw.scale(0.5)?))).unwrap();
        }
        let x = g.from_f64(&x_data, &[2, 2], DType::F64).unwrap();
        x.matmul(w).unwrap().sum().unwrap().backward().unwrap();
        let gw = p.grad().unwrap().data().to_f64_vec();
        // d/dw Σ x·w = column sums of x, repeated across w's columns.
        let col = [0.5 + 2.0, -1.0 + 1.5];
        let k = if hooked { 0.5 } else { 1.0 };
        let want: Vec<f64> = col.iter().flat_map(|&c| [k * c; 3]).collect();
        assert_eq!(gw, want, "hooked {hooked}");
    }
}

#[test]
fn hooks_refuse_what_cannot_be_a_gradient() {
    let g = Graph::new();
    let c = g.from_f64(&[1.0], &[1], DType::F64).unwrap();
    assert!(matches!(
        c.register_hook(|_| Ok(None)),
        Err(GraphError::BadArgument {
            op: "register_hook",
            ..
        })
    ));
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let y = x.exp().unwrap();
    y.register_hook(|gy| Ok(Some(gy.sum()?))).unwrap(); // a scalar for a [2] gradient
    let e = y.sum().unwrap().backward().unwrap_err();
    assert!(
        matches!(
            e,
            GraphError::ShapeMismatch {
                op: "register_hook",
                ..
            }
        ),
        "{e}"
    );
    assert!(x.grad().unwrap().is_none(), "nothing reached x");
}

/// A log of what each param hook call saw: the parameter's name and its gradient then.
type Seen = Arc<Mutex<Vec<(String, Option<Vec<f64>>)>>>;

fn listen(g: &Graph) -> Seen {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    g.register_param_hook(move |p| {
        let grad = p.grad().map(|t| t.to_f64_vec());
        log.lock().unwrap().push((p.name(), grad));
    });
    seen
}

fn param(name: &str, v: &[f64], shape: &[usize]) -> Parameter {
    Parameter::new(name, HostTensor::from_f64(v, shape, DType::F64).unwrap())
}

#[test]
fn a_param_hook_hears_each_parameter_once_with_its_final_gradient_last_layer_first() {
    // x·W1 → tanh → ·W2, W1 brought in twice (its gradient sums both leaves' contributions),
    // a bias b added after W2; the matrix products' weight gradients take the straight path
    // into the parameters.
    let w1 = param("w1", &[0.5, -1.0, 0.25, 2.0], &[2, 2]);
    let w2 = param("w2", &[1.5, -0.5], &[2, 1]);
    let b = param("b", &[0.1], &[1]);
    let mut g = Graph::new();
    let seen = listen(&g);
    let x = g.leaf(&[1.0, 2.0, -1.0, 0.5], &[2, 2], DType::F64).unwrap();
    let h = x.matmul(g.param(&w1).unwrap()).unwrap().tanh().unwrap();
    let h = h.add(x.matmul(g.param(&w1).unwrap()).unwrap()).unwrap();
    let y = h.matmul(g.param(&w2).unwrap()).unwrap();
    let y = y.add(g.param(&b).unwrap()).unwrap();
    y.square().unwrap().sum().unwrap().backward().unwrap();
    let got = seen.lock().unwrap().clone();
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["b", "w2", "w1"]);
    // What each hook saw is what the parameter holds after backward: nothing came later.
    for ((_, at_hook), p) in got.iter().zip([&b, &w2, &w1]) {
        assert_eq!(at_hook.as_ref(), Some(&p.grad().unwrap().to_f64_vec()));
    }
    // Every backward tells them again; the reset forgets the hook.
    g.reset();
    let x = g.leaf(&[1.0, 2.0], &[1, 2], DType::F64).unwrap();
    x.matmul(g.param(&w1).unwrap())
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[test]
fn a_param_hook_hears_parameters_no_gradient_reached_and_not_grad() {
    let used = param("used", &[2.0], &[1]);
    let unused = param("unused", &[3.0], &[1]);
    let g = Graph::new();
    let seen = listen(&g);
    let u = g.param(&unused).unwrap();
    let w = g.param(&used).unwrap();
    let _ = u.scale(2.0).unwrap(); // recorded, but not on the way to the loss
    let x = g.leaf(&[4.0], &[1], DType::F64).unwrap();
    let l = x.mul(w).unwrap().sum().unwrap();
    // grad() hands gradients back and adds into no parameter: no hook call.
    let l2 = x.mul(w).unwrap().sum().unwrap();
    arenagrad_graph::grad(l2, &[w], Default::default()).unwrap();
    assert!(seen.lock().unwrap().is_empty());
    l.backward().unwrap();
    let got = seen.lock().unwrap().clone();
    assert_eq!(
        got,
        [
            ("used".to_string(), Some(vec![4.0])),
            ("unused".to_string(), None)
        ]
    );
}

#[test]
fn set_grad_replaces_the_gradient_and_refuses_another_shape_or_dtype() {
    let p = param("p", &[1.0, 2.0], &[2]);
    p.set_grad(Some(
        HostTensor::from_f64(&[0.5, 0.25], &[2], DType::F64).unwrap(),
    ))
    .unwrap();
    assert_eq!(p.grad().unwrap().to_f64_vec(), [0.5, 0.25]);
    let wrong_shape = HostTensor::from_f64(&[1.0; 3], &[3], DType::F64).unwrap();
    assert!(matches!(
        p.set_grad(Some(wrong_shape)),
        Err(GraphError::ShapeMismatch {
            op: "Parameter::set_grad",
            ..
        })
    ));
    let wrong_dtype = HostTensor::from_f64(&[1.0; 2], &[2], DType::F32).unwrap();
    assert!(matches!(
        p.set_grad(Some(wrong_dtype)),
        Err(GraphError::DTypeMismatch {
            op: "Parameter::set_grad",
            ..
        })
    ));
    assert_eq!(p.grad().unwrap().to_f64_vec(), [0.5, 0.25]);
    p.set_grad(None).unwrap();
    assert!(p.grad().is_none());
}

#[test]
fn a_param_hook_hears_parameters_used_only_inside_checkpointed_blocks() {
    // x → block 1 (uses a and s) → block 2 (uses s) → ·c. `a` and `s` live only inside the
    // blocks, which backward runs a second time; `s` is final only after block 1's second run.
    let a = param("a", &[0.5, -1.5], &[2]);
    let s = param("s", &[2.0, 0.25], &[2]);
    let c = param("c", &[3.0, -1.0], &[2]);
    let (pa, ps) = (a.clone(), s.clone());
    let block1: arenagrad_graph::CheckpointFn =
        Arc::new(move |g, x| x[0].mul(g.param(&pa)?)?.tanh()?.mul(g.param(&ps)?));
    let ps = s.clone();
    let block2: arenagrad_graph::CheckpointFn =
        Arc::new(move |g, x| x[0].mul(g.param(&ps)?)?.sin());
    let g = Graph::new();
    let seen = listen(&g);
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let h = g.checkpoint(block1, &[x]).unwrap();
    let y = g.checkpoint(block2, &[h]).unwrap();
    let l = y.mul(g.param(&c).unwrap()).unwrap().sum().unwrap();
    l.backward().unwrap();
    let got = seen.lock().unwrap().clone();
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["c", "s", "a"], "each once, last layer's first");
    for ((name, at_hook), p) in got.iter().zip([&c, &s, &a]) {
        let fin = p.grad().expect("a gradient reached it").to_f64_vec();
        assert_eq!(
            at_hook.as_ref(),
            Some(&fin),
            "{name} was told before it was final"
        );
    }
    // Against the same model without checkpoints.
    let want: Vec<Vec<f64>> = {
        for p in [&a, &s, &c] {
            p.zero_grad();
        }
        let g = Graph::new();
        let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
        let h = x
            .mul(g.param(&a).unwrap())
            .unwrap()
            .tanh()
            .unwrap()
            .mul(g.param(&s).unwrap())
            .unwrap();
        let y = h.mul(g.param(&s).unwrap()).unwrap().sin().unwrap();
        y.mul(g.param(&c).unwrap())
            .unwrap()
            .sum()
            .unwrap()
            .backward()
            .unwrap();
        [&c, &s, &a]
            .iter()
            .map(|p| p.grad().unwrap().to_f64_vec())
            .collect()
    };
    let told: Vec<Vec<f64>> = got.into_iter().map(|(_, v)| v.unwrap()).collect();
    assert_eq!(told, want);
}

#[test]
fn a_leaf_set_to_require_grad_during_backward_joins_the_next_pass_not_this_one() {
    // PyTorch records which inputs need a gradient when the forward runs: a hook that turns
    // `requires_grad` on for a constant changes nothing in the running pass. Here the rule of
    // `x·c` then found c requiring grad with a tape position past the pass's slots, and
    // panicked indexing them; also when the flag was set inside a scope in the hook.
    for in_scope in [false, true] {
        let g = Graph::new();
        let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
        let c = g.from_f64(&[3.0, 4.0], &[2], DType::F64).unwrap();
        let y = x.mul(c).unwrap();
        let cid = c.id();
        y.register_hook(move |gy| {
            let c = gy.graph().get(cid)?;
            if in_scope {
                gy.graph().scope(|_| c.set_requires_grad(true).map(drop))?;
            } else {
                c.set_requires_grad(true)?;
            }
            Ok(None)
        })
        .unwrap();
        y.sum().unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().unwrap().to_vec_f64().unwrap(), [3.0, 4.0]);
        assert!(c.grad().unwrap().is_none(), "in scope: {in_scope}");
        // The next pass includes it.
        x.mul(c).unwrap().sum().unwrap().backward().unwrap();
        assert_eq!(c.grad().unwrap().unwrap().to_vec_f64().unwrap(), [1.0, 2.0]);
    }
}

#[test]
fn a_param_hook_hears_parameters_of_nested_checkpoints_once_per_backward() {
    let p = param("p", &[0.5, -2.0], &[2]);
    let pp = p.clone();
    let inner: arenagrad_graph::CheckpointFn =
        Arc::new(move |g, x| x[0].mul(g.param(&pp)?)?.tanh());
    let outer: arenagrad_graph::CheckpointFn =
        Arc::new(move |g, x| g.checkpoint(inner.clone(), &[x[0].sin()?])?.exp());
    let g = Graph::new();
    let seen = listen(&g);
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let l = g.checkpoint(outer, &[x]).unwrap().sum().unwrap();
    let opts = arenagrad_graph::BackwardOptions {
        retain_graph: true,
        ..Default::default()
    };
    l.backward_with(opts).unwrap();
    let once = p.grad().unwrap().to_f64_vec();
    l.backward().unwrap();
    let got = seen.lock().unwrap().clone();
    let twice: Vec<f64> = once.iter().map(|v| 2.0 * v).collect();
    assert_eq!(
        got,
        [
            ("p".to_string(), Some(once)),
            ("p".to_string(), Some(twice))
        ]
    );
}
