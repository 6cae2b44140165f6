//! The attention layers against PyTorch 2.15's `TransformerEncoderLayer(norm_first=True,
//! activation="gelu", batch_first=True)` with the same weights (filled by one formula in both,
//! float64), their parameter names, finite differences, modes, and weight tying.

use arenagrad_nn::check::gradcheck_module;
use arenagrad_nn::{
    DType, Embedding, Graph, HostTensor, Linear, Module, MultiheadAttention, Parameter, Rng,
    TransformerBlock, TransformerConfig,
};

/// Parameter `j` (in visiting order), element `k`: `sin((k + 1)·0.37 + j) / 2`, as the PyTorch
/// side fills its `named_parameters()`.
fn fill(m: &impl Module) {
    for (j, (_, p)) in m.named_parameters().iter().enumerate() {
        let v: Vec<f64> = (0..p.numel())
            .map(|k| ((k + 1) as f64 * 0.37 + j as f64).sin() * 0.5)
            .collect();
        p.set_value(HostTensor::from_f64(&v, &p.shape(), DType::F64).unwrap())
            .unwrap();
    }
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what} [{k}]: {a} vs {b}"
        );
    }
}

fn block(dropout: f64) -> TransformerBlock {
    let cfg = TransformerConfig {
        heads: 2,
        mlp_ratio: 2,
        dropout,
        causal: true,
        eps: 1e-5,
        dtype: DType::F64,
    };
    TransformerBlock::new(8, cfg, &mut Rng::seed(0)).unwrap()
}

#[test]
fn parameter_names_are_pytorchs() {
    let names: Vec<String> = block(0.0)
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "self_attn.in_proj_weight",
            "self_attn.in_proj_bias",
            "self_attn.out_proj.weight",
            "self_attn.out_proj.bias",
            "linear1.weight",
            "linear1.bias",
            "linear2.weight",
            "linear2.bias",
            "norm1.weight",
            "norm1.bias",
            "norm2.weight",
            "norm2.bias",
        ]
    );
}

#[test]
fn a_block_matches_pytorchs_encoder_layer() {
    let b = block(0.0);
    fill(&b);
    let g = Graph::new();
    let xv: Vec<f64> = (0..80).map(|k| (0.3 * k as f64).cos() * 1.2).collect();
    let x = g.var(&xv, &[2, 5, 8], DType::F64).unwrap();
    let y = b.forward(&g, x).unwrap();
    let yv = y.to_vec_f64().unwrap();
    #[rustfmt::skip]
    close(&yv[..10], &[
        1.71043142976897, 0.9027159925458585, 1.8207004218112002, 0.07411752214135103,
        1.405292222474566, -0.972648388122263, 0.698031095490007, -1.8912472522114143,
        -0.11278093419818097, -1.395320699896157,
    ], 1e-12, "output");
    close(
        &[yv.iter().sum()],
        &[20.039077715253182],
        1e-12,
        "output sum",
    );
    let wv: Vec<f64> = (0..80).map(|k| (0.11 * k as f64).sin()).collect();
    let w = g.from_f64(&wv, &[2, 5, 8], DType::F64).unwrap();
    y.mul(w).unwrap().sum().unwrap().backward().unwrap();
    #[rustfmt::skip]
    close(&x.grad().unwrap().unwrap().to_vec_f64().unwrap()[..6], &[
        0.24429017588945867, -0.022292173218090468, -0.008454185487824808,
        -0.08964532458291151, 0.35496792376682773, 0.4950570644908488,
    ], 1e-10, "input gradient");
    let grad = |k: usize| {
        let p = &b.named_parameters()[k].1;
        p.grad().unwrap().to_f64_vec()
    };
    #[rustfmt::skip]
    close(&grad(0)[..6], &[
        -0.006207991818865636, 0.0028044019975184947, 0.008657041371969676,
        0.011112942953516405, 0.011246811417818837, 0.010658170865908834,
    ], 1e-9, "in_proj_weight gradient");
    #[rustfmt::skip]
    close(&grad(10), &[
        2.9880907719641385, -3.6815355871599396, 4.550345060685645, -7.159301792621491,
        4.9506213599531055, -4.7295662319910114, 2.469910915913829, -0.23647174986510455,
    ], 1e-10, "norm2.weight gradient");
}

#[test]
fn attention_and_block_pass_finite_differences() {
    let mut rng = Rng::seed(3);
    let attn = MultiheadAttention::with_options(6, 3, true, 0.0, DType::F64, &mut rng).unwrap();
    let x = HostTensor::from_f64(
        &(0..36).map(|k| (k as f64 * 0.7).sin()).collect::<Vec<_>>(),
        &[2, 3, 6],
        DType::F64,
    )
    .unwrap();
    let r = gradcheck_module(&attn, &x, Default::default()).unwrap();
    assert!(r.passed, "MultiheadAttention: {r}");
    let b = block(0.0);
    let x = HostTensor::from_f64(
        &(0..48).map(|k| (k as f64 * 0.45).cos()).collect::<Vec<_>>(),
        &[2, 3, 8],
        DType::F64,
    )
    .unwrap();
    let r = gradcheck_module(&b, &x, Default::default()).unwrap();
    assert!(r.passed, "TransformerBlock: {r}");
}

#[test]
fn eval_mode_turns_dropout_off() {
    let mut b = block(0.5);
    let g = Graph::new();
    let x = g.randn(&[2, 6, 8], DType::F64).unwrap();
    let a = b.forward(&g, x).unwrap().to_vec_f64().unwrap();
    let c = b.forward(&g, x).unwrap().to_vec_f64().unwrap();
    assert_ne!(a, c, "training: fresh masks each call");
    b.eval();
    let a = b.forward(&g, x).unwrap().to_vec_f64().unwrap();
    let c = b.forward(&g, x).unwrap().to_vec_f64().unwrap();
    assert_eq!(a, c);
    let plain = block(0.0);
    fill(&plain);
    fill(&b);
    assert_eq!(
        b.forward(&g, x).unwrap().to_vec_f64().unwrap(),
        plain.forward(&g, x).unwrap().to_vec_f64().unwrap()
    );
}

#[test]
fn a_tied_weight_collects_both_gradients() {
    // The token embedding and the output projection share one [vocab, dim] parameter.
    let mut rng = Rng::seed(1);
    let emb = Embedding::new(5, 3, &mut rng).unwrap();
    let shared: Parameter = emb.weight().clone();
    let head = Linear::from_parameters(shared.clone(), None).unwrap();
    let g = Graph::new();
    let e = emb.lookup(&g, &[1, 4], &[2]).unwrap();
    let logits = head.forward(&g, e).unwrap();
    logits.square().unwrap().sum().unwrap().backward().unwrap();
    let tied = shared.grad().unwrap().to_f64_vec();
    // The same two uses with separate copies, their gradients summed.
    let g2 = Graph::new();
    let w1 = g2
        .var(&shared.value().to_f64_vec(), &[5, 3], DType::F32)
        .unwrap();
    let w2 = g2
        .var(&shared.value().to_f64_vec(), &[5, 3], DType::F32)
        .unwrap();
    let e = w1.index_select(0, &[1, 4]).unwrap();
    let l = e.matmul(w2.t().unwrap()).unwrap();
    l.square().unwrap().sum().unwrap().backward().unwrap();
    let a = w1.grad().unwrap().unwrap().to_vec_f64().unwrap();
    let b = w2.grad().unwrap().unwrap().to_vec_f64().unwrap();
    let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    close(&tied, &sum, 1e-5, "tied gradient");
    assert_eq!(emb.named_parameters().len(), 1);
}
