//! The character GPT under bf16 autocast against PyTorch 2.15's `torch.autocast("cpu",
//! dtype=torch.bfloat16)`: the small model of `tests/data/char_gpt/init.safetensors` on a fixed
//! batch, its loss and every parameter's f32 gradient, as
//! `scripts/torch_gpt_autocast_reference.py` wrote them to
//! `tests/data/char_gpt/autocast_bf16.safetensors`. Our attention and layer norm run on f32 copies
//! of their bf16 operands, PyTorch's bf16 kernels accumulate in f32: the loss agrees to 1e-5 and
//! each gradient to one bf16 step of its largest element.

use std::path::Path;

use arenagrad::nn::checkpoint;
use arenagrad::nn::{Gpt, GptConfig, Module, Rng};
use arenagrad::{DType, Graph};

#[test]
fn the_gpt_under_bf16_autocast_matches_pytorch() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/char_gpt");
    let want = checkpoint::load_tensors(data.join("autocast_bf16.safetensors")).unwrap();
    let get = |name: &str| {
        want.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} is not in the reference"))
            .1
            .to_f64_vec()
    };
    let cfg = GptConfig {
        vocab: 256,
        context: 16,
        layers: 2,
        heads: 2,
        dim: 16,
        mlp_ratio: 4,
        dropout: 0.0,
        dtype: DType::F32,
    };
    let model = Gpt::new(cfg, &mut Rng::seed(99)).unwrap();
    checkpoint::load(&model, data.join("init.safetensors")).unwrap();
    let w: Vec<usize> = (0..4 * 17).map(|k| (37 * k + 11) % 256).collect();
    let (x, y): (Vec<usize>, Vec<usize>) = (0..4)
        .flat_map(|b| (0..16).map(move |t| (b, t)))
        .map(|(b, t)| (w[b * 17 + t], w[b * 17 + t + 1]))
        .unzip();
    let g = Graph::new();
    let loss = {
        let _mixed = g.autocast(DType::BF16).unwrap();
        model.loss(&g, &x, &y, 4, 16).unwrap()
    };
    assert_eq!(loss.dtype(), DType::F32);
    let (l, lw) = (loss.item().unwrap(), get("loss")[0]);
    assert!(
        (l - lw).abs() <= 1e-5 * lw,
        "loss {l} against PyTorch's {lw}"
    );
    loss.backward().unwrap();
    let mut checked = 0;
    for (name, p, _) in model.named_state() {
        let Some(grad) = p.grad() else { continue };
        assert_eq!(grad.dtype(), DType::F32, "{name}");
        let (got, want) = (grad.to_f64_vec(), get(&format!("grad/{name}")));
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f64, f64::max);
        // Within one bf16 step of the tensor's largest gradient (the two engines round their
        // bf16 activations at the same places; their f32 sums differ in order).
        assert!(
            worst <= DType::BF16.epsilon() * scale,
            "{name}: off by {worst:.3e} where the largest gradient is {scale:.3e}"
        );
        checked += 1;
    }
    assert_eq!(checked, 28, "every parameter's gradient was compared");
}
