//! Fine-tunes a Llama-shaped model on one topic of Debian's fortunes with LoRA adapters: the
//! base model's weights frozen (no gradients, no optimiser state), low-rank adapters on the
//! chosen projections trained, and memory in proportion to what trains.
//!
//! ```text
//! cargo run --release --example lora_finetune -- [--domain computers] [--rank 8] [--alpha 16]
//!     [--targets q_proj,v_proj] [--pretrain-steps 400] [--steps 200] [--base FILE]
//! ```
//!
//! First a base model (byte-level, 4 blocks of width 128, grouped-query attention) is trained on
//! every fortune file except the `--domain` one and saved to `--base` (kept: a later run starts
//! from it). Then a fresh process loads it, adds adapters of rank `--rank` to the `--targets`
//! projections of every block, and trains them alone on the domain's documents. It prints the
//! domain's validation loss before and after (and the other topics', which the frozen base
//! keeps), what the fine-tuning holds — frozen weights, the adapters with their gradients and
//! Adam's two moments, the activations a step saves for backward — and its peak memory as the
//! engine counts it and as the process's resident set shows it, each over that sum.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use arenagrad::nn::checkpoint;
use arenagrad::nn::data::{Split, TextCorpus};
use arenagrad::nn::optim::{AdamConfig, AdamW, Optimizer};
use arenagrad::nn::{Llama, LlamaConfig, Module, Rng};
use arenagrad::Graph;

#[path = "common/setup.rs"]
mod setup;
use clap::Parser;
use setup::{positive, positive_real};

/// LoRA fine-tuning of a Llama-shaped model on one topic of the fortunes.
#[derive(Debug, Parser)]
#[command(name = "lora_finetune")]
struct Args {
    /// Folder of fortune files (documents separated by `%` lines)
    #[arg(long, default_value = "/usr/share/games/fortunes")]
    data: PathBuf,
    /// The topic to fine-tune on (a file of the folder); the base model trains on the others
    #[arg(long, default_value = "computers")]
    domain: String,
    /// The adapters' rank
    #[arg(long, default_value_t = 8, value_parser = positive)]
    rank: usize,
    /// The adapters' alpha (their output scaled by alpha / rank)
    #[arg(long, default_value_t = 16.0, value_parser = positive_real)]
    alpha: f64,
    /// The projections that get adapters (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    /// down_proj)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "q_proj,k_proj,v_proj,o_proj"
    )]
    targets: Vec<String>,
    /// Training steps of the base model (when --base does not exist yet)
    #[arg(long, default_value_t = 400, value_parser = positive)]
    pretrain_steps: usize,
    /// Fine-tuning steps
    #[arg(long, default_value_t = 200, value_parser = positive)]
    steps: usize,
    /// Sequences per step
    #[arg(long, default_value_t = 16, value_parser = positive)]
    batch: usize,
    /// Bytes per sequence
    #[arg(long, default_value_t = 128, value_parser = positive)]
    context: usize,
    /// Fine-tuning learning rate (the base trains at 3e-3)
    #[arg(long, default_value_t = 3e-3, value_parser = positive_real)]
    lr: f64,
    /// The base model's checkpoint: read when it exists, else trained and written
    #[arg(long, default_value = "lora_base.safetensors")]
    base: PathBuf,
    /// Seed of the data order and the adapters
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run only the fine-tuning (in this process), from an existing --base
    #[arg(long, hide = true)]
    finetune_only: bool,
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn config(context: usize) -> LlamaConfig {
    LlamaConfig {
        vocab_size: 256,
        hidden_size: 128,
        intermediate_size: 344,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: context,
        ..LlamaConfig::default()
    }
}

/// The topic's name of a fortune file (`computers.u8` is `computers`).
fn topic(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if !args.data.is_dir() {
        eprintln!(
            "The fortune files were not found in {}.\nInstall them with:  {}",
            args.data.display(),
            setup::apt_install("fortunes")
        );
        std::process::exit(2);
    }
    if !args.data.join(&args.domain).is_file() {
        return Err(setup::fail(format!(
            "--domain {:?} is not a file of {}",
            args.domain,
            args.data.display()
        )));
    }
    if args.finetune_only {
        return finetune(&args);
    }
    if !args.base.is_file() {
        setup::check_writable("the base model", "--base", &args.base)?;
        pretrain(&args)?;
    } else {
        println!(
            "base model: {} (delete it to train a new one)",
            args.base.display()
        );
    }
    // The fine-tuning in a process of its own, so that its resident set is its own.
    let status = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .arg("--finetune-only")
        .status()?;
    if !status.success() {
        return Err(setup::fail("the fine-tuning process failed"));
    }
    Ok(())
}

/// The mean loss over `batches` validation batches of `corpus` (fixed draws).
fn valid_loss(
    g: &mut Graph,
    model: &Llama,
    corpus: &TextCorpus,
    args: &Args,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut rng = Rng::seed(1234);
    let mut total = 0.0;
    let batches = 8;
    for _ in 0..batches {
        let (x, y) = corpus.batch(Split::Valid, args.batch, args.context, &mut rng)?;
        let _ng = g.no_grad();
        total += model.loss(g, &x, &y, args.batch, args.context)?.item()?;
        drop(_ng);
        g.reset();
    }
    Ok(total / batches as f64)
}

fn pretrain(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let general = TextCorpus::from_fortune_files(&args.data, 10, |n| topic(n) != args.domain)?;
    let mut rng = Rng::seed(args.seed);
    let model = Llama::new(config(args.context), &mut rng)?;
    println!(
        "training the base model ({} parameters) on the fortunes but {:?}: {} steps of {} × {} \
         bytes",
        model.num_parameters(),
        args.domain,
        args.pretrain_steps,
        args.batch,
        args.context
    );
    let mut opt = AdamW::new(
        model.parameters(),
        AdamConfig::adamw(3e-3).weight_decay(0.01),
    )?;
    let mut g = Graph::new();
    let t = Instant::now();
    for step in 1..=args.pretrain_steps {
        let (x, y) = general.batch(Split::Train, args.batch, args.context, &mut rng)?;
        let loss = model.loss(&g, &x, &y, args.batch, args.context)?;
        let l = loss.item()?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        g.reset();
        if step % 100 == 0 || step == args.pretrain_steps {
            println!(
                "  step {step:4}: loss {l:.3} ({:.1} s)",
                t.elapsed().as_secs_f64()
            );
        }
    }
    checkpoint::save(&model, &args.base)?;
    println!("saved the base model to {}", args.base.display());
    Ok(())
}

/// A line of Linux's `/proc/self/status` in bytes (`VmRSS:`, `VmHWM:`), if there is one.
fn status_bytes(key: &str) -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn mb(bytes: usize) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

fn finetune(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let domain = TextCorpus::from_fortune_files(&args.data, 10, |n| topic(n) == args.domain)?;
    let general = TextCorpus::from_fortune_files(&args.data, 10, |n| topic(n) != args.domain)?;
    // The process before the model: the program and the text.
    let resident_before = status_bytes("VmRSS:");
    let mut model = Llama::new(config(args.context), &mut Rng::seed(0))?;
    checkpoint::load(&model, &args.base)?;
    let mut g = Graph::new();
    let (before_domain, before_general) = (
        valid_loss(&mut g, &model, &domain, args)?,
        valid_loss(&mut g, &model, &general, args)?,
    );
    let targets: Vec<&str> = args.targets.iter().map(String::as_str).collect();
    let mut rng = Rng::seed(args.seed);
    model.add_lora(args.rank, args.alpha, &targets, &mut rng)?;
    let (all, trainable) = (model.num_parameters(), model.num_trainable_parameters());
    println!(
        "fine-tuning on {:?} ({} training documents): adapters of rank {} on {} — {trainable} \
         trainable parameters of {all} ({:.2}%), the rest frozen",
        args.domain,
        domain.documents().0,
        args.rank,
        targets.join(", "),
        100.0 * trainable as f64 / all as f64
    );
    let mut opt = AdamW::new(model.trainable_parameters(), AdamConfig::adamw(args.lr))?;
    let (mut saved, mut peak) = (0usize, 0usize);
    let t = Instant::now();
    for step in 1..=args.steps {
        let (x, y) = domain.batch(Split::Train, args.batch, args.context, &mut rng)?;
        g.reset_peak_stats();
        let loss = model.loss(&g, &x, &y, args.batch, args.context)?;
        // What the forward keeps for backward: the arena's live bytes now.
        saved = saved.max(g.stats().arena.bytes_in_use);
        let l = loss.item()?;
        loss.backward()?;
        peak = peak.max(g.stats().arena.peak_bytes_in_use);
        opt.step()?;
        opt.zero_grad();
        g.reset();
        if step % 50 == 0 || step == args.steps {
            println!(
                "  step {step:4}: loss {l:.3} ({:.1} s)",
                t.elapsed().as_secs_f64()
            );
        }
    }
    let (after_domain, after_general) = (
        valid_loss(&mut g, &model, &domain, args)?,
        valid_loss(&mut g, &model, &general, args)?,
    );
    println!(
        "validation loss on {:?}: {before_domain:.3} before, {after_domain:.3} after; on the \
         other topics: {before_general:.3} before, {after_general:.3} after",
        args.domain
    );
    // What the fine-tuning holds.
    let bytes = |ps: &[arenagrad::Parameter]| -> usize {
        ps.iter().map(|p| p.numel() * p.dtype().size()).sum()
    };
    let params = model.parameters();
    let frozen: Vec<_> = params
        .iter()
        .filter(|p| !p.requires_grad())
        .cloned()
        .collect();
    let adapters = model.trainable_parameters();
    // After a step's backward each adapter has a gradient; Adam keeps two moments.
    let state: usize = opt
        .state_tensors()?
        .iter()
        .map(|(_, t)| t.numel() * t.dtype().size())
        .sum();
    let ideal = bytes(&frozen) + 2 * bytes(&adapters) + state + saved;
    let engine = bytes(&frozen) + 2 * bytes(&adapters) + state + peak;
    println!("memory of the fine-tuning:");
    println!(
        "  frozen weights                      {}",
        mb(bytes(&frozen))
    );
    println!(
        "  adapters, their gradients, Adam     {} + {} + {}",
        mb(bytes(&adapters)),
        mb(bytes(&adapters)),
        mb(state)
    );
    println!("  activations saved for backward      {}", mb(saved));
    println!("  sum                                 {}", mb(ideal));
    println!(
        "  engine's peak (the arena's at its highest in a step): {} = {:.2}× the sum",
        mb(engine),
        engine as f64 / ideal as f64
    );
    if let (Some(before), Some(hwm)) = (resident_before, status_bytes("VmHWM:")) {
        let grown = hwm.saturating_sub(before);
        println!(
            "  process's peak resident set over what it held before the model: {} = {:.2}× the sum",
            mb(grown),
            grown as f64 / ideal as f64
        );
    }
    println!(
        "  (fine-tuning every weight would add {} of gradients and {} of Adam state)",
        mb(bytes(&frozen)),
        mb(2 * bytes(&frozen))
    );
    Ok(())
}
