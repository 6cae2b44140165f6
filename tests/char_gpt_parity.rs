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

use std::path::Path;

use arenagrad::graph::testing::{skip_or_fail, REQUIRE_DATA};
use arenagrad::nn::checkpoint;
use arenagrad::nn::data::{Split, TextCorpus};
use arenagrad::nn::optim::{
    clip_grad_norm, AdamConfig, AdamW, LrSchedule, Optimizer, WarmupCosineLr,
};
use arenagrad::nn::{Gpt, GptConfig, Rng};
use arenagrad::{DType, Graph};

const FORTUNES: &str = "/usr/share/games/fortunes";

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
