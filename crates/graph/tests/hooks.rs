//! Gradient hooks (`Tensor::register_hook`): they see the summed gradient, can replace it on an
//! intermediate and on a parameter's leaf (whose product gradient otherwise goes straight into
//! the parameter), run in order, and refuse what cannot be a gradient.

use std::sync::{Arc, Mutex};

use arenagrad_graph::{DType, Graph, GraphError, HostTensor, Parameter};

#[test]
fn a_hook_sees_the_summed_gradient_and_replaces_it() {
    let g = Graph::new();
    let x = g.var(&[1.0, -2.0, 3.0], &[3], DType::F64).unwrap();
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
    let x = g.var(&[1.0, 2.0], &[2], DType::F64).unwrap();
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
