//! A small tour of every op family and of the memory paths (arena views, recycled gradient
//! buffers, index buffers, reset and stale ids) on tiny tensors — sized to run under Miri, which
//! checks the arena's and the kernels' unsafe code as it goes.

use arenagrad_graph::{BackwardOptions, DType, Graph, GraphError};

#[test]
fn every_family_forward_and_backward_on_tiny_tensors() {
    let mut g = Graph::with_threads(1);
    for dtype in [DType::F32, DType::F64] {
        let x = g
            .leaf(&[0.5, -1.0, 2.0, 0.25, -0.75, 1.5], &[2, 3], dtype)
            .unwrap();
        let w = g
            .leaf(&[0.1, 0.2, -0.3, 0.4, 0.5, -0.6], &[3, 2], dtype)
            .unwrap();
        let b = g.leaf(&[0.05, -0.05], &[2], dtype).unwrap();
        let h = x.matmul(w).unwrap().add(b).unwrap().tanh().unwrap(); // [2, 2]
        let v = h.reshape(&[4]).unwrap().reshape(&[1, 4]).unwrap(); // views share the buffer
        let s = v.softmax(1).unwrap().log().unwrap();
        let c = g
            .concat(&[s, v.t().unwrap().reshape(&[1, 4]).unwrap()], 0)
            .unwrap();
        let m = c.max_axes(&[0], false).unwrap().sum().unwrap();
        let e = x
            .exp()
            .unwrap()
            .sqrt()
            .unwrap()
            .mul(x.sigmoid().unwrap())
            .unwrap();
        let sel = e
            .index_select(1, &[2, 0])
            .unwrap()
            .gather(1, &[1, 0], &[2, 1])
            .unwrap();
        let sl = x
            .slice(1, 1, 3)
            .unwrap()
            .maximum(x.slice(1, 0, 2).unwrap())
            .unwrap();
        let img = x.reshape(&[1, 1, 2, 3]).unwrap();
        let k = g
            .leaf(&[1.0, -1.0, 0.5, 0.25], &[1, 1, 2, 2], dtype)
            .unwrap();
        let conv = img.conv2d(k, (1, 1), (1, 1), (1, 1), 1).unwrap();
        let pooled = conv
            .max_pool2d((2, 2), (1, 1), (0, 0))
            .unwrap()
            .avg_pool2d((1, 2), (1, 1), (0, 0))
            .unwrap();
        let loss = m
            .add(sel.sum().unwrap())
            .unwrap()
            .add(sl.gelu().unwrap().mean().unwrap())
            .unwrap()
            .add(pooled.relu().unwrap().sum().unwrap())
            .unwrap()
            .add(e.log_softmax(0).unwrap().sum().unwrap())
            .unwrap();
        loss.backward_with(BackwardOptions {
            retain_graph: true,
            ..Default::default()
        })
        .unwrap();
        for t in [x, w, b, k] {
            let gr = t.grad().unwrap().unwrap().to_vec_f64().unwrap();
            assert!(gr.iter().all(|v| v.is_finite()));
        }
        // Second order through the matmul chain.
        let gx = arenagrad_graph::grad(
            x.matmul(w).unwrap().tanh().unwrap().sum().unwrap(),
            &[x],
            BackwardOptions {
                create_graph: true,
                ..Default::default()
            },
        )
        .unwrap()[0]
            .unwrap();
        gx.square().unwrap().sum().unwrap().backward().unwrap();
        let id = loss.id();
        g.reset();
        assert!(matches!(g.get(id), Err(GraphError::StaleTensor { .. })));
    }
}

#[test]
fn backward_recycles_and_reuses_gradient_buffers() {
    let mut g = Graph::with_threads(1);
    for _ in 0..3 {
        // Elementwise steps write their gradient over the incoming one: backward allocates only
        // the seed and the sum's broadcast gradient, however long the chain.
        let x = g.leaf(&[0.1; 8], &[8], DType::F32).unwrap();
        let mut h = x;
        for _ in 0..20 {
            h = h.tanh().unwrap().scale(1.5).unwrap();
        }
        let l = h.sum().unwrap();
        let before = g.stats().arena.allocations;
        l.backward().unwrap();
        let made = g.stats().arena.allocations - before;
        assert_eq!(
            made, 2,
            "backward of an elementwise chain made {made} buffers"
        );
        assert_eq!(x.grad().unwrap().unwrap().to_vec::<f32>().unwrap().len(), 8);

        // Products need a new gradient per step; the dead ones are recycled.
        let y = g.leaf(&[0.2; 8], &[8], DType::F32).unwrap();
        let mut h = y;
        for _ in 0..20 {
            h = h.mul(y).unwrap().tanh().unwrap();
        }
        let reused = g.stats().arena.reused;
        h.sum().unwrap().backward().unwrap();
        assert!(
            g.stats().arena.reused > reused,
            "gradient buffers were not reused"
        );
        g.reset();
    }
}
