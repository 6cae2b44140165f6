//! Frozen parameters and LoRA adapters: no gradient (and no gradient buffer) for what is frozen,
//! adapters' gradients against finite differences, merging and unmerging, and a Llama whose
//! adapters alone train.

use arenagrad_graph::check::GradcheckOptions;
use arenagrad_nn::check::gradcheck_module;
use arenagrad_nn::optim::{Adam, AdamConfig, Optimizer};
use arenagrad_nn::{
    DType, Graph, HostTensor, Linear, LinearConfig, Llama, LlamaConfig, Module, Parameter, Rng,
};

fn f64_linear(i: usize, o: usize, rng: &mut Rng) -> Linear {
    let cfg = LinearConfig {
        dtype: DType::F64,
        ..LinearConfig::default()
    };
    Linear::with_config(i, o, cfg, rng).unwrap()
}

fn random(shape: &[usize], seed: u64) -> HostTensor {
    let mut r = Rng::seed(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| r.uniform_range(-1.0, 1.0)).collect();
    HostTensor::new(v, shape).unwrap()
}

fn out(m: &Linear, x: &HostTensor) -> Vec<f64> {
    let g = Graph::new();
    m.forward(&g, g.from_host(x).unwrap())
        .unwrap()
        .to_vec_f64()
        .unwrap()
}

fn worst(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A frozen weight gets no gradient and keeps no gradient buffer, while the input and the bias
/// still get theirs; thawed, it gets one again.
#[test]
fn frozen_parameters_get_no_gradient() {
    let lin = f64_linear(3, 2, &mut Rng::seed(0));
    let w = lin.weight().clone();
    let mut g = Graph::new();
    let x = g.leaf(&[1.0, 2.0, 3.0], &[1, 3], DType::F64).unwrap();
    lin.forward(&g, x)
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    assert!(w.grad().is_some());
    g.reset();
    w.set_requires_grad(false);
    assert!(!w.requires_grad());
    assert!(w.grad().is_none(), "freezing drops the gradient buffer");
    let x = g.leaf(&[1.0, 2.0, 3.0], &[1, 3], DType::F64).unwrap();
    lin.forward(&g, x)
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    assert!(w.grad().is_none());
    assert!(lin.bias().unwrap().grad().is_some());
    // dL/dx = column sums of W.
    let wv = w.value().to_f64_vec();
    let want: Vec<f64> = (0..3).map(|j| wv[j] + wv[3 + j]).collect();
    assert_eq!(x.grad().unwrap().unwrap().to_vec_f64().unwrap(), want);
    assert_eq!(lin.num_trainable_parameters(), 2);
    // A graph of frozen parameters only: nothing requires grad.
    g.reset();
    lin.freeze();
    let y = lin
        .forward(&g, g.ones(&[1, 3], DType::F64).unwrap())
        .unwrap();
    assert!(!y.requires_grad());
    lin.unfreeze();
    assert_eq!(lin.num_trainable_parameters(), 8);
}

/// The adapters' gradients (and the input's) against finite differences in f64, the frozen
/// weight left out; a fresh adapter changes nothing.
#[test]
fn lora_gradients_match_finite_differences() {
    let mut rng = Rng::seed(1);
    let mut lin = f64_linear(5, 4, &mut rng);
    let x = random(&[3, 5], 2);
    let before = out(&lin, &x);
    lin.add_lora(2, 4.0, &mut rng).unwrap();
    assert_eq!(
        out(&lin, &x),
        before,
        "a fresh adapter (B = 0) changes nothing"
    );
    let l = lin.lora().unwrap();
    l.b().set_value(random(&[4, 2], 3)).unwrap();
    assert!(worst(&out(&lin, &x), &before) > 1e-3);
    let names: Vec<String> = lin.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias", "lora_A.weight", "lora_B.weight"]);
    assert_eq!(lin.num_trainable_parameters(), 2 * 5 + 4 * 2);
    let r = gradcheck_module(&lin, &x, GradcheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    assert_eq!(r.tensors.len(), 3, "input, A and B: {r}");
}

/// Merging puts `B·A·(α/r)` into the weight (the same outputs without the adapter's products),
/// unmerging takes it out again; both layouts; misuse is an error.
#[test]
fn lora_merges_and_unmerges() {
    for in_out in [false, true] {
        let mut rng = Rng::seed(4);
        let cfg = LinearConfig {
            dtype: DType::F64,
            ..LinearConfig::default()
        };
        let mut lin = if in_out {
            Linear::in_out(6, 3, cfg, &mut rng).unwrap()
        } else {
            Linear::with_config(6, 3, cfg, &mut rng).unwrap()
        };
        assert!(lin.merge_lora().is_err(), "no adapter yet");
        lin.add_lora(2, 3.0, &mut rng).unwrap();
        assert!(lin.add_lora(2, 3.0, &mut rng).is_err(), "a second adapter");
        lin.lora()
            .unwrap()
            .b()
            .set_value(random(&[3, 2], 5))
            .unwrap();
        let x = random(&[4, 6], 6);
        let (adapted, w0) = (out(&lin, &x), lin.weight().value().to_f64_vec());
        assert!(lin.unmerge_lora().is_err(), "not merged");
        lin.merge_lora().unwrap();
        assert!(lin.lora().unwrap().is_merged());
        assert!(lin.merge_lora().is_err(), "merged twice");
        assert!(worst(&out(&lin, &x), &adapted) < 1e-12, "in_out {in_out}");
        assert!(worst(&lin.weight().value().to_f64_vec(), &w0) > 1e-3);
        lin.unmerge_lora().unwrap();
        assert!(worst(&lin.weight().value().to_f64_vec(), &w0) < 1e-14);
        assert!(worst(&out(&lin, &x), &adapted) < 1e-12);
    }
    let mut lin = f64_linear(2, 2, &mut Rng::seed(0));
    assert!(lin.add_lora(0, 1.0, &mut Rng::seed(0)).is_err());
    assert!(lin.add_lora(1, f64::NAN, &mut Rng::seed(0)).is_err());
}

fn small_llama() -> Llama {
    let cfg = LlamaConfig {
        vocab_size: 40,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 32,
        ..LlamaConfig::default()
    };
    Llama::new(cfg, &mut Rng::seed(7)).unwrap()
}

/// A Llama with adapters on its query and value projections: the adapters alone are trainable
/// (PEFT's names), training moves the loss and nothing else — the frozen weights stay bit for
/// bit, get no gradient, and Adam keeps state for the adapters only.
#[test]
fn llama_lora_trains_only_the_adapters() {
    let mut model = small_llama();
    let err = model
        .add_lora(2, 4.0, &["q_proj", "wq"], &mut Rng::seed(0))
        .unwrap_err();
    assert!(err.to_string().contains("\"wq\""), "{err}");
    assert_eq!(model.num_trainable_parameters(), model.num_parameters());
    model
        .add_lora(2, 4.0, &["q_proj", "v_proj"], &mut Rng::seed(0))
        .unwrap();
    let trainable: Vec<String> = model
        .named_parameters()
        .into_iter()
        .filter(|(_, p)| p.requires_grad())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        &trainable[..4],
        [
            "model.layers.0.self_attn.q_proj.lora_A.weight",
            "model.layers.0.self_attn.q_proj.lora_B.weight",
            "model.layers.0.self_attn.v_proj.lora_A.weight",
            "model.layers.0.self_attn.v_proj.lora_B.weight",
        ]
    );
    assert_eq!(trainable.len(), 8);
    // q: A [2, 16], B [16, 2]; v: A [2, 16], B [8, 2] (two key/value heads of 4).
    assert_eq!(model.num_trainable_parameters(), 2 * (32 + 32 + 32 + 16));
    let frozen: Vec<(String, Parameter)> = model
        .named_parameters()
        .into_iter()
        .filter(|(_, p)| !p.requires_grad())
        .collect();
    let before: Vec<HostTensor> = frozen.iter().map(|(_, p)| p.value()).collect();
    let mut opt = Adam::new(model.trainable_parameters(), AdamConfig::new(0.05)).unwrap();
    let tokens: Vec<usize> = (0..2 * 12).map(|i| (i * 7 + 3) % 40).collect();
    let targets: Vec<usize> = tokens.iter().map(|t| (t + 1) % 40).collect();
    let mut g = Graph::new();
    let mut losses = Vec::new();
    for _ in 0..20 {
        let loss = model.loss(&g, &tokens, &targets, 2, 12).unwrap();
        losses.push(loss.item().unwrap());
        loss.backward().unwrap();
        for (name, p) in &frozen {
            assert!(p.grad().is_none(), "{name} got a gradient");
        }
        opt.step().unwrap();
        opt.zero_grad();
        g.reset();
    }
    assert!(
        losses[19] < losses[0] - 0.1,
        "the adapters did not learn: {losses:?}"
    );
    for ((name, p), b) in frozen.iter().zip(&before) {
        assert_eq!(&p.value(), b, "{name} changed");
    }
    let state = opt.state_tensors().unwrap();
    assert!(!state.is_empty());
    for (name, _) in &state {
        assert!(!name.contains("weight") || name.contains("lora"), "{name}");
    }
    // Merged, the model computes what it computed with the adapters beside the weights.
    let logits = |m: &Llama| {
        let g = Graph::new();
        m.forward_tokens(&g, &tokens, 2, 12)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    let adapted = logits(&model);
    model.merge_lora().unwrap();
    let merged = logits(&model);
    let gap = adapted
        .iter()
        .zip(&merged)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(gap < 1e-4, "merged logits differ by {gap}");
}
