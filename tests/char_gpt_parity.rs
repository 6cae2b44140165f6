//! The character GPT trains as PyTorch does, step for step: from the initial weights PyTorch
//! 2.15 wrote (`scripts/torch_char_gpt.py --init`, a small model: context 16, 2 blocks of width
//! 16, 2 heads, batch 4, no dropout) and the batches of the fixed order on Debian's fortune
//! files, the first 8 losses of AdamW with decay groups, warmup and cosine, and clipping agree
//! with the ones it printed to f32 rounding. The reference files were made by
//!
//! ```text
//! python3 scripts/torch_char_gpt.py --init tests/data/char_gpt/init.safetensors --steps 8 \
//!     --batch 4 --context 16 --layers 2 --heads 2 --dim 16 --dropout 0 --warmup 3 \
//!     --log-every 1 --generate 0 | grep '^step' > tests/data/char_gpt/torch_losses.txt
//! ```
//!
//! From the same weights it also computes under bf16 autocast as PyTorch's autocast does (the
//! second test).

use std::path::Path;

use arenagrad::graph::testing::{skip_or_fail, REQUIRE_DATA};
use arenagrad::nn::checkpoint;
use arenagrad::nn::data::{Split, TextCorpus};
use arenagrad::nn::optim::{
    clip_grad_norm, AdamConfig, AdamW, LrSchedule, Optimizer, WarmupCosineLr,
};
use arenagrad::nn::{Gpt, GptConfig, Module, Rng};
use arenagrad::{DType, Graph};

const FORTUNES: &str = "/usr/share/games/fortunes";

/// The small model with PyTorch's initial weights (`init.safetensors` in `data`).
fn reference_model(data: &Path) -> (Gpt, GptConfig) {
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
    (model, cfg)
}

#[test]
fn the_first_steps_match_pytorchs_losses() {
    if !Path::new(FORTUNES).is_dir() {
        skip_or_fail(
            REQUIRE_DATA,
            format_args!("{FORTUNES} is not installed (Debian: fortunes)"),
        );
        return;
    }
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/char_gpt");
    let want: Vec<f64> = std::fs::read_to_string(data.join("torch_losses.txt"))
        .unwrap()
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(want.len(), 8);
    let corpus = TextCorpus::from_fortune_dir(FORTUNES, 10).unwrap();
    let (model, cfg) = reference_model(&data);
    let (lr, steps, batch) = (3e-3, 8, 4);
    let mut opt = AdamW::with_groups(
        model.param_groups(0.1),
        AdamConfig::adamw(lr).weight_decay(0.1),
    )
    .unwrap();
    let schedule = WarmupCosineLr::new(lr, 3, steps, lr / 10.0).unwrap();
    let mut g = Graph::new();
    let mut got = Vec::new();
    for step in 0..steps {
        let (x, y) = corpus
            .fixed_batch(Split::Train, step, batch, cfg.context)
            .unwrap();
        schedule.apply(&mut opt, step).unwrap();
        opt.zero_grad();
        let l = model.loss(&g, &x, &y, batch, cfg.context).unwrap();
        l.backward().unwrap();
        got.push(l.item().unwrap());
        g.reset();
        clip_grad_norm(opt.parameters(), 1.0).unwrap();
        opt.step().unwrap();
    }
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        // PyTorch printed six decimals.
        assert!(
            (a - b).abs() < 2e-5,
            "step {k}: {a} vs PyTorch's {b}\n{got:?}\n{want:?}"
        );
    }
}

/// Under bf16 autocast, against PyTorch 2.15's `torch.autocast("cpu", dtype=torch.bfloat16)` on
/// a fixed batch (no data files needed): the loss and every parameter's f32 gradient, as
/// `scripts/torch_gpt_autocast_reference.py` wrote them to `autocast_bf16.safetensors`. Our
/// attention and layer norm run on f32 copies of their bf16 operands, PyTorch's bf16 kernels
/// accumulate in f32: the loss agrees to 1e-5 and each gradient to one bf16 step of its largest
/// element.
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
    let (model, _) = reference_model(&data);
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
