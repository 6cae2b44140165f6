//! Scale: a million-op chain runs forward and backward without recursion.

use arenagrad_graph::{DType, Graph};

#[test]
#[cfg_attr(miri, ignore)]
fn million_op_chain_runs_forward_and_backward() {
    let g = Graph::with_threads(1);
    let x = g.leaf(&[0.5], &[1], DType::F32).unwrap();
    let mut h = x;
    for k in 0..1_000_000 {
        h = match k % 3 {
            0 => h.scale(1.0001).unwrap(),
            1 => h.shift(0.0001).unwrap(),
            _ => h.tanh().unwrap(),
        };
    }
    h.sum().unwrap().backward().unwrap();
    let gx = x.grad().unwrap().unwrap().item().unwrap();
    assert!(gx.is_finite() && gx > 0.0, "{gx}");
}
