//! Every public method that takes a tensor besides its receiver refuses a tensor of another graph
//! with `GraphError::GraphMismatch`, and leaves both graphs as they were.
//!
//! The list below is the one place that names those methods; `the_list_names_every_method`
//! reads the crate's source and fails when a public method taking a `Tensor` is missing from it,
//! so a new op cannot skip the check unnoticed.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use arenagrad_graph::{
    grad, AttentionOptions, BackwardOptions, BinaryOp, CustomOp, DType, Graph, GraphError, Result,
    Tensor,
};

/// A custom op whose rule hands back a gradient of another graph.
struct Foreign;

impl CustomOp for Foreign {
    fn name(&self) -> &'static str {
        "foreign_grad"
    }
    fn backward<'g>(
        &self,
        _g: &'g Graph,
        inputs: &[Tensor<'g>],
        _output: Tensor<'g>,
        _gy: Tensor<'g>,
    ) -> Result<Vec<Option<Tensor<'g>>>> {
        // A tensor of a graph that outlives the call, handed back with this graph's lifetime:
        // possible in safe code through a leaked graph.
        let other: &'static Graph = Box::leak(Box::new(Graph::new()));
        let t = other.ones(&inputs[0].shape(), inputs[0].dtype())?;
        Ok(vec![Some(t)])
    }
}

/// A checkpointed block that hands back another graph's tensor.
fn foreign_block<'a>(_g: &'a Graph, xs: &[Tensor<'a>]) -> Result<Tensor<'a>> {
    let other: &'static Graph = Box::leak(Box::new(Graph::new()));
    other.ones(&xs[0].shape(), xs[0].dtype())
}

type Call = for<'g> fn(&'g Graph, Tensor<'g>, Tensor<'g>, Tensor<'g>) -> Result<()>;

/// `(method, call)`: each call makes `g` (the receiver's graph) meet a tensor of another graph in
/// one operand position: `f`, shaped as `x` (`[1, 1, 2, 2]`, f64, requires grad), or `fb`, of
/// shape `[1]`.
fn calls() -> Vec<(&'static str, Call)> {
    vec![
        ("binary", |_, x, f, _| x.binary(BinaryOp::Mul, f).map(drop)),
        ("add", |_, x, f, _| x.add(f).map(drop)),
        ("sub", |_, x, f, _| x.sub(f).map(drop)),
        ("mul", |_, x, f, _| x.mul(f).map(drop)),
        ("div", |_, x, f, _| x.div(f).map(drop)),
        ("pow", |_, x, f, _| x.pow(f).map(drop)),
        ("maximum", |_, x, f, _| x.maximum(f).map(drop)),
        ("minimum", |_, x, f, _| x.minimum(f).map(drop)),
        ("eq", |_, x, f, _| x.eq(f).map(drop)),
        ("ne", |_, x, f, _| x.ne(f).map(drop)),
        ("lt", |_, x, f, _| x.lt(f).map(drop)),
        ("le", |_, x, f, _| x.le(f).map(drop)),
        ("gt", |_, x, f, _| x.gt(f).map(drop)),
        ("ge", |_, x, f, _| x.ge(f).map(drop)),
        ("masked_fill", |_, x, f, _| x.masked_fill(f, 0.0).map(drop)),
        ("gather_by", |_, x, f, _| x.gather_by(0, f).map(drop)),
        ("index_select_by", |_, x, f, _| {
            x.index_select_by(0, f).map(drop)
        }),
        ("index_add", |_, x, f, _| x.index_add(0, f, x).map(drop)),
        ("einsum", |g, x, f, _| {
            g.einsum("abcd,abcd->", &[x, f]).map(drop)
        }),
        ("scatter_add", |_, x, f, _| x.scatter_add(0, f, x).map(drop)),
        ("scatter_add", |g, x, f, _| {
            let i = g.zeros(&x.shape(), arenagrad_graph::DType::I64)?;
            x.scatter_add(0, i, f).map(drop)
        }),
        ("scatter_reduce", |_, x, f, _| {
            x.scatter_reduce(0, f, x, arenagrad_graph::ScatterReduce::Sum, true)
                .map(drop)
        }),
        ("matmul", |_, x, f, _| x.matmul(f).map(drop)),
        ("matmul_t", |_, x, f, _| {
            x.matmul_t(f, false, true).map(drop)
        }),
        ("addmm_t", |_, x, f, _| {
            x.addmm_t(f, x, false, false).map(drop)
        }),
        ("addmm_t", |_, x, f, _| {
            x.addmm_t(x, f, false, false).map(drop)
        }),
        ("addmm_t", |_, x, f, _| {
            f.addmm_t(x, x, false, false).map(drop)
        }),
        ("conv2d", |_, x, f, _| {
            x.conv2d(f, (1, 1), (0, 0), (1, 1), 1).map(drop)
        }),
        ("conv_transpose2d", |_, x, f, _| {
            x.conv_transpose2d(f, None, (1, 1), (0, 0), (0, 0), (1, 1), 1)
                .map(drop)
        }),
        ("conv_transpose2d", |_, x, _, fb| {
            x.conv_transpose2d(x, Some(fb), (1, 1), (0, 0), (0, 0), (1, 1), 1)
                .map(drop)
        }),
        ("conv2d_bias", |_, x, f, _| {
            x.conv2d_bias(f, None, (1, 1), (0, 0), (1, 1), 1).map(drop)
        }),
        ("conv2d_bias", |_, x, _, fb| {
            x.conv2d_bias(x, Some(fb), (1, 1), (0, 0), (1, 1), 1)
                .map(drop)
        }),
        ("layer_norm", |_, x, _, fb| {
            x.layer_norm(1, Some(fb), None, 1e-5).map(drop)
        }),
        ("layer_norm", |_, x, _, fb| {
            x.layer_norm(1, None, Some(fb), 1e-5).map(drop)
        }),
        ("group_norm", |_, x, _, fb| {
            x.group_norm(1, Some(fb), None, 1e-5).map(drop)
        }),
        ("group_norm", |_, x, _, fb| {
            x.group_norm(1, None, Some(fb), 1e-5).map(drop)
        }),
        ("layer_norm_as", |_, x, _, fb| {
            x.layer_norm_as(1, Some(fb), None, 1e-5, DType::BF16)
                .map(drop)
        }),
        ("layer_norm_as", |_, x, _, fb| {
            x.layer_norm_as(1, None, Some(fb), 1e-5, DType::BF16)
                .map(drop)
        }),
        ("rms_norm", |_, x, _, fb| {
            x.rms_norm(1, Some(fb), 1e-5).map(drop)
        }),
        ("lstm_cell", |_, x, f, _| x.lstm_cell(f).map(drop)),
        ("gru_cell", |_, x, f, _| x.gru_cell(f, x).map(drop)),
        ("gru_cell", |_, x, f, _| x.gru_cell(x, f).map(drop)),
        ("lstm_sequence", |_, x, f, _| {
            x.lstm_sequence(f, x, x, Default::default()).map(drop)
        }),
        ("lstm_sequence", |_, x, f, _| {
            x.lstm_sequence(x, f, x, Default::default()).map(drop)
        }),
        ("lstm_sequence", |_, x, f, _| {
            x.lstm_sequence(x, x, f, Default::default()).map(drop)
        }),
        ("scaled_dot_product_attention", |_, x, f, _| {
            x.scaled_dot_product_attention(f, x, AttentionOptions::default())
                .map(drop)
        }),
        ("scaled_dot_product_attention", |_, x, f, _| {
            x.scaled_dot_product_attention(x, f, AttentionOptions::default())
                .map(drop)
        }),
        ("scaled_dot_product_attention", |_, x, f, _| {
            let opts = AttentionOptions {
                mask: Some(f),
                ..Default::default()
            };
            x.scaled_dot_product_attention(x, x, opts).map(drop)
        }),
        ("attention_packed", |g, _, f, _| {
            let qkv = g.zeros(&[1, 2, 3], DType::F64)?;
            let opts = AttentionOptions {
                mask: Some(f),
                ..Default::default()
            };
            qkv.attention_packed(1, opts).map(drop)
        }),
        ("attend_cache", |g, _, f, _| {
            let q = g.zeros(&[1, 1, 1, 2], DType::F64)?;
            let kv = g.zeros(&[1, 1, 2, 2], DType::F64)?;
            q.attend_cache(f, kv, 1, true).map(drop)
        }),
        ("attend_cache", |g, _, f, _| {
            let q = g.zeros(&[1, 1, 1, 2], DType::F64)?;
            let kv = g.zeros(&[1, 1, 2, 2], DType::F64)?;
            q.attend_cache(kv, f, 1, true).map(drop)
        }),
        ("slice_write", |g, _, f, _| {
            let dst = g.zeros(&[1, 1, 2, 2], DType::F64)?;
            dst.slice_write(0, 0, f)
        }),
        ("concat", |g, x, f, _| g.concat(&[x, f], 0).map(drop)),
        ("concat", |g, _, f, _| g.concat(&[f, f], 0).map(drop)),
        ("stack", |g, x, f, _| g.stack(&[x, f], 0).map(drop)),
        ("stack", |g, _, f, _| g.stack(&[f, f], 0).map(drop)),
        ("r#where", |_, x, f, _| x.r#where(f, x).map(drop)),
        ("r#where", |_, x, f, _| x.r#where(x, f).map(drop)),
        ("where_cond", |g, x, f, _| g.where_cond(f, x, x).map(drop)),
        ("where_cond", |g, x, f, _| g.where_cond(x, f, x).map(drop)),
        ("where_cond", |g, x, f, _| g.where_cond(x, x, f).map(drop)),
        ("where_cond", |g, _, f, _| g.where_cond(f, f, f).map(drop)),
        ("custom", |g, x, f, _| {
            g.custom(Arc::new(Foreign), &[f], x).map(drop)
        }),
        ("recurrence", |g, x, f, _| {
            g.recurrence(f, vec![x], 1, &[1], false, |x, s| {
                Ok::<_, GraphError>(vec![s[0].add(x)?])
            })
            .map(drop)
        }),
        ("recurrence", |g, x, f, _| {
            g.recurrence(x, vec![f], 1, &[1], false, |x, s| {
                Ok::<_, GraphError>(vec![s[0].add(x)?])
            })
            .map(drop)
        }),
        ("checkpoint", |g, x, f, _| {
            g.checkpoint(Arc::new(|_, xs| xs[0].tanh()), &[x, f])
                .map(drop)
        }),
        ("checkpoint", |g, x, _, _| {
            g.checkpoint(Arc::new(foreign_block), &[x]).map(drop)
        }),
        ("custom", |g, x, f, _| {
            g.custom(Arc::new(Foreign), &[x], f).map(drop)
        }),
        ("custom", |g, _, f, _| {
            g.custom(Arc::new(Foreign), &[f], f).map(drop)
        }),
        ("grad", |_, x, f, _| {
            let y = x.sum()?;
            grad(y, &[f], BackwardOptions::default()).map(drop)
        }),
        ("backward_with", |_, x, f, _| {
            let y = x.mul(x)?;
            y.backward_with(BackwardOptions {
                grad: Some(f),
                ..Default::default()
            })
        }),
    ]
}

/// A tensor's value and gradient, and what its graph holds, to see that a refused call changed
/// nothing (the receiver's graph may hold the nodes the call made before the refused step).
fn fingerprint(
    g: &Graph,
    t: Tensor<'_>,
    whole: bool,
) -> (usize, usize, Vec<f64>, Option<Vec<f64>>) {
    let s = g.stats();
    let grad = t.grad().unwrap().map(|gr| gr.to_vec::<f64>().unwrap());
    let (nodes, tape) = if whole { (s.nodes, s.tape_len) } else { (0, 0) };
    (nodes, tape, t.to_vec::<f64>().unwrap(), grad)
}

#[test]
fn every_method_refuses_a_tensor_of_another_graph() {
    let mut failures = Vec::new();
    for (name, call) in calls() {
        let g = Graph::new();
        let other = Graph::new();
        let x = g
            .leaf(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], DType::F64)
            .unwrap();
        let f = other
            .leaf(&[5.0, 6.0, 7.0, 8.0], &[1, 1, 2, 2], DType::F64)
            .unwrap();
        let fb = other.leaf(&[9.0], &[1], DType::F64).unwrap();
        let before = (fingerprint(&g, x, false), fingerprint(&other, f, true));
        match call(&g, x, f, fb) {
            Err(GraphError::GraphMismatch { .. }) => {}
            r => failures.push(format!("{name}: {r:?}")),
        }
        let after = (fingerprint(&g, x, false), fingerprint(&other, f, true));
        if before != after {
            failures.push(format!("{name}: a graph changed ({before:?} → {after:?})"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_custom_rule_returning_a_tensor_of_another_graph_is_refused() {
    let g = Graph::new();
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let value = {
        let _ng = g.no_grad();
        x.scale(2.0).unwrap()
    };
    let y = g.custom(Arc::new(Foreign), &[x], value).unwrap();
    let r = y.sum().unwrap().backward();
    assert!(
        matches!(r, Err(GraphError::GraphMismatch { op: "foreign_grad" })),
        "{r:?}"
    );
    assert!(x.grad().unwrap().is_none(), "no gradient reached x");
}

#[test]
fn operator_overloads_report_the_callers_line() {
    let g = Graph::new();
    let other = Graph::new();
    let a = g.ones(&[2], DType::F32).unwrap();
    let b = other.ones(&[2], DType::F32).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let s2 = Arc::clone(&seen);
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        *s2.lock().unwrap() = info.location().map(|l| (l.file().to_string(), l.line()));
    }));
    let line = line!() + 1;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a + b));
    std::panic::set_hook(prev);
    assert!(r.is_err());
    let (file, at) = seen.lock().unwrap().clone().expect("a panic location");
    assert!(
        file.ends_with("graph_mismatch.rs"),
        "reported at {file}:{at}"
    );
    assert_eq!(at, line);
}

/// The public functions of the crate's source whose parameters (besides `self`) include a
/// `Tensor` handle (not a `HostTensor` or a `TensorId`).
fn methods_taking_tensors() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let src = std::fs::read_to_string(&p).unwrap();
                let mut rest = src.as_str();
                while let Some(at) = rest.find("pub fn ") {
                    rest = &rest[at + "pub fn ".len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '#')
                        .collect();
                    let Some(open) = rest.find('(') else { break };
                    let close = open + rest[open..].find(')').unwrap_or(0);
                    let params = &rest[open + 1..close];
                    let takes = params
                        .split(',')
                        .filter(|p| !p.trim().ends_with("self"))
                        .any(|p| {
                            let ty = p.split(':').nth(1).unwrap_or("");
                            // Options that carry a tensor count too.
                            ty.split(|c: char| !c.is_alphanumeric() && c != '_')
                                .any(|w| {
                                    w == "Tensor"
                                        || w == "BackwardOptions"
                                        || w == "AttentionOptions"
                                })
                        });
                    if takes {
                        found.insert(name);
                    }
                }
            }
        }
    }
    found
}

#[test]
fn the_list_names_every_method() {
    let listed: BTreeSet<String> = calls().iter().map(|(n, _)| n.to_string()).collect();
    let found = methods_taking_tensors();
    // Not an entry point: a backward rule's accessor on a crate-private type.
    let exempt: BTreeSet<String> = ["input"].iter().map(|s| s.to_string()).collect();
    let missing: Vec<_> = found
        .difference(&listed)
        .filter(|n| !exempt.contains(*n))
        .collect();
    assert!(missing.is_empty(), "add these to calls(): {missing:?}");
    let gone: Vec<_> = listed.difference(&found).collect();
    assert!(
        gone.is_empty(),
        "no longer public methods taking tensors: {gone:?}"
    );
}
