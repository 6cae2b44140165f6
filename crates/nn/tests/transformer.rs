//! The attention layers against PyTorch 2.15's `TransformerEncoderLayer(norm_first=True,
//! activation="gelu", batch_first=True)` with the same weights (filled by one formula in both,
//! float64), their parameter names, finite differences, modes, and weight tying.

use arenagrad_nn::check::gradcheck_module;
use arenagrad_nn::{
    CausalLm, DType, Embedding, Gpt, GptConfig, Graph, HostTensor, Linear, Module,
    MultiheadAttention, Parameter, Rng, Sampling, TransformerBlock, TransformerConfig,
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
    let x = g.leaf(&xv, &[2, 5, 8], DType::F64).unwrap();
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
        .leaf(&shared.value().to_f64_vec(), &[5, 3], DType::F32)
        .unwrap();
    let w2 = g2
        .leaf(&shared.value().to_f64_vec(), &[5, 3], DType::F32)
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

fn tiny_gpt() -> Gpt {
    let cfg = GptConfig {
        vocab: 11,
        context: 16,
        layers: 2,
        heads: 2,
        dim: 8,
        mlp_ratio: 2,
        dropout: 0.0,
        dtype: DType::F64,
    };
    Gpt::new(cfg, &mut Rng::seed(5)).unwrap()
}

#[test]
fn cached_steps_give_the_full_forwards_logits() {
    let model = tiny_gpt();
    let seq = [3usize, 1, 4, 1, 5, 9, 2, 6, 5, 3];
    let g = Graph::new();
    let full = model.forward_tokens(&g, &seq, 1, seq.len()).unwrap();
    let full = full.to_vec_f64().unwrap();
    let mut caches = model.new_caches(&g, 1).unwrap();
    // A prompt of 4, two single tokens, then a block of 4 after a non-empty cache (the masked
    // path), in scopes as generation runs them.
    let mut got = Vec::new();
    for part in [&seq[..4], &seq[4..5], &seq[5..6], &seq[6..]] {
        let v = g
            .try_scope(|g| -> arenagrad_nn::Result<Vec<f64>> {
                Ok(model
                    .forward_cached(g, part, 1, &mut caches)?
                    .to_vec_f64()?)
            })
            .unwrap();
        got.extend(v);
    }
    close(&got, &full, 1e-12, "cached logits");
    assert_eq!(caches[0].len(), seq.len());
}

#[test]
fn greedy_generation_is_the_argmax_of_the_full_model_and_memory_stays_flat() {
    let model = tiny_gpt();
    let mut g = Graph::new();
    let prompt = [1usize, 2, 3];
    let greedy = Sampling {
        temperature: 0.0,
        top_k: None,
        top_p: None,
    };
    let _ = g.zeros(&[4096], DType::F64).unwrap();
    g.reset();
    let before = g.stats();
    let out = model
        .generate(&g, &prompt, 10, greedy, &mut Rng::seed(0))
        .unwrap();
    let after = g.stats();
    // The caches (two tensors per block) are what remains of the whole generation.
    assert_eq!(after.nodes, before.nodes + 2 * 2);
    let mut text = prompt.to_vec();
    for &t in &out {
        let logits = model
            .forward_tokens(&g, &text, 1, text.len())
            .unwrap()
            .to_vec_f64()
            .unwrap();
        let last = &logits[(text.len() - 1) * 11..];
        let best = (0..11).fold(0, |b, k| if last[k] > last[b] { k } else { b });
        assert_eq!(t, best);
        text.push(t);
        g.reset();
    }
    // Past the context (16): the cache restarts from the last half-context; still in range.
    let long = model
        .generate(&g, &prompt, 40, Sampling::default(), &mut Rng::seed(1))
        .unwrap();
    assert_eq!(long.len(), 40);
    assert!(long.iter().all(|&t| t < 11));
    let again = model
        .generate(&g, &prompt, 40, Sampling::default(), &mut Rng::seed(1))
        .unwrap();
    assert_eq!(long, again, "the same seed, the same text");
}

#[test]
fn sampling_follows_temperature_and_top_k() {
    let mut rng = Rng::seed(3);
    let logits = [0.0, 3f64.ln()];
    let s = Sampling::default();
    let n = 20_000;
    let ones = (0..n).filter(|_| s.sample(&logits, &mut rng) == 1).count();
    let p = ones as f64 / n as f64;
    assert!((p - 0.75).abs() < 0.015, "{p}");
    // Temperature 2 flattens e^(ln 3 / 2) : 1 = √3 : 1.
    let hot = Sampling {
        temperature: 2.0,
        top_k: None,
        top_p: None,
    };
    let ones = (0..n)
        .filter(|_| hot.sample(&logits, &mut rng) == 1)
        .count();
    let want = 3f64.sqrt() / (1.0 + 3f64.sqrt());
    assert!((ones as f64 / n as f64 - want).abs() < 0.015);
    let top1 = Sampling {
        temperature: 1.0,
        top_k: Some(1),
        top_p: None,
    };
    assert!((0..100).all(|_| top1.sample(&[0.1, 0.3, 0.2], &mut rng) == 1));
    let model = tiny_gpt();
    let g = Graph::new();
    let bad = Sampling {
        temperature: -1.0,
        top_k: None,
        top_p: None,
    };
    assert!(model.generate(&g, &[1], 3, bad, &mut rng).is_err());
    assert!(model.generate(&g, &[], 3, s, &mut rng).is_err());
}

#[test]
fn the_gpt_ties_its_head_and_groups_its_parameters() {
    let model = tiny_gpt();
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names[0], "tok_emb.weight");
    assert!(!names.iter().any(|n| n.contains("head")), "{names:?}");
    let [decay, rest] = model.param_groups(0.1);
    let opt = arenagrad_nn::optim::AdamW::with_groups(
        [decay, rest],
        arenagrad_nn::optim::AdamConfig::adamw(1e-3).weight_decay(0.1),
    )
    .unwrap();
    assert_eq!(opt.group_options(0), (1e-3, 0.1));
    assert_eq!(opt.group_options(1), (1e-3, 0.0));
    use arenagrad_nn::optim::Optimizer;
    assert_eq!(opt.parameters().len(), names.len());
    // Both uses of the token embedding reach its gradient: the lookup's rows and the head's.
    let g = Graph::new();
    let l = model.loss(&g, &[1, 2, 3, 4], &[2, 3, 4, 5], 1, 4).unwrap();
    l.backward().unwrap();
    let gw = model.token_embedding().grad().unwrap().to_f64_vec();
    // Row 10 is never looked up: only the head's use reaches it.
    assert!(gw[10 * 8..11 * 8].iter().any(|&v| v != 0.0));
}
