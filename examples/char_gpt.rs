//! Trains a character-level GPT on the English fortune-cookie collection of Debian's `fortunes`
//! package, prints the training and validation loss, writes the curves as a PNG, saves a
//! resumable checkpoint, and ends by generating text from a prompt.
//!
//! ```text
//! cargo run --release --example char_gpt -- [--data DIR] [--steps 1500] [--batch 32]
//!     [--context 128] [--layers 4] [--heads 4] [--dim 128] [--dropout 0.1] [--lr 3e-3]
//!     [--warmup 100] [--weight-decay 0.1] [--clip 1.0] [--eval-every 250] [--seed 0]
//!     [--init PATH] [--order random|fixed] [--log-every N] [--checkpoint PATH] [--resume]
//!     [--until STEP] [--precision f32|bf16|f16]
//!     [--prompt TEXT] [--generate 400] [--temperature 0.8] [--top-k 40] [--plot char_gpt.png]
//! ```
//!
//! The data are the files under `/usr/share/games/fortunes/`, each read once, documents (the text
//! between `%` lines) split 90/10 into training and validation by document; bytes are tokens.
//! The model (4 pre-norm blocks of width 128, 4 heads, context 128, the output tied to the token
//! embedding) trains with AdamW (lr 3e-3, 100 warmup steps then cosine decay to lr/10, weight
//! decay 0.1 on the blocks' matrices, gradients clipped to norm 1).
//!
//! A checkpoint (model, optimiser state, step, data order) is written at every evaluation;
//! `--resume` continues from it and ends with the weights an uninterrupted run would have
//! (`--until STEP` stops early, as an interruption would).
//!
//! `--precision bf16` runs the forward and the evaluations under bf16 autocast (matrix products
//! and attention in bf16, the weights, their gradients and AdamW in f32); `--precision f16` the
//! same in f16 with loss scaling.
//!
//! `--init` starts from weights in a safetensors file (the parameter names of `nn::Gpt`),
//! `--order fixed` takes batches in the fixed order of `TextCorpus::fixed_batch`, and
//! `--log-every` prints the loss of every N-th step: with `scripts/torch_char_gpt.py --init` the
//! two engines run the same training from the same weights and can be compared step for step.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use arenagrad::nn::checkpoint::{self, Progress};
use arenagrad::nn::data::{Split, TextCorpus};
use arenagrad::nn::optim::{AdamConfig, AdamW, LrSchedule, Optimizer, WarmupCosineLr};
use arenagrad::nn::{Gpt, GptConfig, Module, NnError, Rng, Sampling};
use arenagrad::prelude::*;

#[path = "common/font.rs"]
mod font;
#[path = "common/precision.rs"]
mod precision;
#[path = "common/setup.rs"]
mod setup;
use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use precision::Precision;
use setup::{drop_probability, non_negative_real, positive, positive_real};

/// Trains a character-level GPT on Debian's fortune cookies and generates text.
#[derive(Debug, Parser)]
#[command(name = "char_gpt")]
struct Args {
    /// Folder of fortune files (documents separated by `%` lines)
    #[arg(long, default_value = "/usr/share/games/fortunes")]
    data: PathBuf,
    /// Training steps
    #[arg(long, default_value_t = 1500, value_parser = positive)]
    steps: usize,
    /// Sequences per step
    #[arg(long, default_value_t = 32, value_parser = positive)]
    batch: usize,
    /// Tokens per sequence (the model's context)
    #[arg(long, default_value_t = 128, value_parser = positive)]
    context: usize,
    /// Transformer blocks
    #[arg(long, default_value_t = 4, value_parser = positive)]
    layers: usize,
    /// Attention heads
    #[arg(long, default_value_t = 4, value_parser = positive)]
    heads: usize,
    /// Model width
    #[arg(long, default_value_t = 128, value_parser = positive)]
    dim: usize,
    /// Dropout (embeddings, attention weights, residual branches)
    #[arg(long, default_value_t = 0.1, value_parser = drop_probability)]
    dropout: f64,
    /// AdamW's peak learning rate
    #[arg(long, default_value_t = 3e-3, value_parser = positive_real)]
    lr: f64,
    /// Warmup steps (then cosine decay to lr/10)
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Weight decay of the blocks' matrices
    #[arg(long, default_value_t = 0.1, value_parser = non_negative_real)]
    weight_decay: f64,
    /// Clip the gradients' global norm to this
    #[arg(long, default_value_t = 1.0, value_parser = positive_real)]
    clip: f64,
    /// Validation loss every N steps (on 20 batches; the full validation text at the end)
    #[arg(long, default_value_t = 250, value_parser = positive)]
    eval_every: usize,
    /// Seed of the weights, the batches, dropout and sampling
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Start from the weights in this safetensors file
    #[arg(long)]
    init: Option<PathBuf>,
    /// Batch order
    #[arg(long, value_enum, default_value_t = Order::Random)]
    order: Order,
    /// Print the loss of every N-th step
    #[arg(long, value_parser = positive)]
    log_every: Option<usize>,
    /// Where to save the model, the optimiser state and the progress
    #[arg(long, default_value_os_t = std::env::temp_dir().join("arenagrad-char-gpt.safetensors"))]
    checkpoint: PathBuf,
    /// Continue from --checkpoint (model, optimiser, step and generator): the same command with
    /// --resume gives the weights of an uninterrupted run
    #[arg(long)]
    resume: bool,
    /// Stop after this step, saving the checkpoint, as if interrupted (the schedule still spans
    /// --steps)
    #[arg(long, value_parser = positive)]
    until: Option<usize>,
    /// The forward's precision: f32, or bf16/f16 autocast (f16 with loss scaling)
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    precision: Precision,
    /// Text the generation starts from
    #[arg(long, default_value = "The meaning of life is")]
    prompt: String,
    /// Characters to generate at the end (0: none)
    #[arg(long, default_value_t = 400)]
    generate: usize,
    /// Sampling temperature (0: greedy)
    #[arg(long, default_value_t = 0.8, value_parser = non_negative_real)]
    temperature: f64,
    /// Sample among the k most likely characters
    #[arg(long, default_value_t = 40, value_parser = positive)]
    top_k: usize,
    /// Where to write the loss curves (PNG)
    #[arg(long, default_value = "char_gpt.png")]
    plot: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Order {
    /// Windows at random offsets, from the seed
    Random,
    /// The fixed order of TextCorpus::fixed_batch (shared with the PyTorch script)
    Fixed,
}

/// The mean loss over validation windows at `starts` (batches of `batch`), in scopes: memory
/// stays flat however many windows. The forward in the run's `precision`.
fn valid_loss(
    model: &Gpt,
    g: &Graph,
    corpus: &TextCorpus,
    starts: &[usize],
    (batch, context): (usize, usize),
    precision: Precision,
) -> Result<f64, NnError> {
    let _mixed = precision.autocast(g)?;
    let mut total = 0.0;
    for chunk in starts.chunks(batch) {
        let (x, y) = corpus.batch_at(Split::Valid, context, chunk)?;
        let l = g.try_scope(|g| -> Result<f64, NnError> {
            Ok(model.loss(g, &x, &y, chunk.len(), context)?.item()?)
        })?;
        total += l * chunk.len() as f64;
    }
    Ok(total / starts.len() as f64)
}

/// The loss curves: training (running mean per step) and validation (at each evaluation).
fn plot(
    train: &[f64],
    valid: &[(usize, f64)],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    font::register()?;
    let root = BitMapBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    // Both curves by the step they were taken after, counted from the run's start (a resumed
    // run's history comes from its checkpoint).
    let steps = valid.last().map_or(0, |v| v.0).max(train.len()).max(1);
    let all = train.iter().chain(valid.iter().map(|v| &v.1));
    let top = all.clone().cloned().fold(0.0f64, f64::max).max(0.1) * 1.05;
    let bottom = all.cloned().fold(f64::INFINITY, f64::min).min(top) * 0.95;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "Character GPT on Debian's fortunes: loss",
            ("sans-serif", 26),
        )
        .margin(18)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(0..steps + 1, bottom..top)?;
    c.configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy, nats per character")
        .label_style(("sans-serif", 16))
        .draw()?;
    c.draw_series(LineSeries::new(
        train.iter().enumerate().map(|(i, &v)| (i + 1, v)),
        BLUE,
    ))?
    .label("training (running mean of the step losses)")
    .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
    c.draw_series(LineSeries::new(valid.iter().copied(), RED.stroke_width(2)))?
        .label("validation")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED));
    c.draw_series(
        valid
            .iter()
            .map(|&(s, v)| Circle::new((s, v), 4, RED.filled())),
    )?;
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

/// The history's series in the checkpoint's progress record.
const TRAIN: &str = "train_loss";
const VALID_STEP: &str = "valid_step";
const VALID_LOSS: &str = "valid_loss";

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Every argument is checked before any work.
    setup::check_until(args.until, args.steps, "--steps")?;
    setup::check_prompt(args.generate, &args.prompt)?;
    if !args.dim.is_multiple_of(args.heads) {
        return Err(setup::fail(format!(
            "--heads {} does not divide the width --dim {}",
            args.heads, args.dim
        )));
    }
    setup::check_writable("the plot", "--plot", &args.plot)?;
    setup::check_writable("the checkpoint", "--checkpoint", &args.checkpoint)?;
    if args.resume && !args.checkpoint.is_file() {
        return Err(setup::fail(format!(
            "cannot resume: there is no checkpoint at {} (leave out --resume to start a run)",
            args.checkpoint.display()
        )));
    }
    if !args.data.is_dir() {
        eprintln!(
            "The fortune files were not found in {}.\nInstall them with:  {}\n\
             (or pass --data DIR with text files of documents separated by `%` lines)",
            args.data.display(),
            setup::apt_install("fortunes")
        );
        std::process::exit(2);
    }
    let corpus = TextCorpus::from_fortune_dir(&args.data, 10)?;
    let cfg = GptConfig {
        vocab: 256,
        context: args.context,
        layers: args.layers,
        heads: args.heads,
        dim: args.dim,
        mlp_ratio: 4,
        dropout: args.dropout,
        dtype: DType::F32,
    };
    let mut rng = Rng::seed(args.seed);
    let mut model = Gpt::new(cfg, &mut rng)?;
    if let Some(init) = &args.init {
        checkpoint::load(&model, init)?;
    }
    let mut opt = AdamW::with_groups(
        model.param_groups(args.weight_decay),
        AdamConfig::adamw(args.lr).weight_decay(args.weight_decay),
    )?;
    let schedule = WarmupCosineLr::new(
        args.lr,
        args.warmup.min(args.steps),
        args.steps,
        args.lr / 10.0,
    )?;
    let mut scaler = args.precision.scaler()?;
    let mut start = 0usize;
    let (mut train_curve, mut valid_curve) = (Vec::new(), Vec::new());
    if args.resume {
        let p = checkpoint::load_training(&args.checkpoint, &model, &mut opt)?;
        start = p.step as usize;
        if let (Some(s), Some(state)) = (scaler.as_mut(), p.scaler) {
            s.load_state(state)?;
        }
        if let Some(r) = p.rng {
            rng = r;
        }
        if start > args.steps {
            return Err(setup::fail(format!(
                "{} is at step {start}, past the end of this run (--steps {})",
                args.checkpoint.display(),
                args.steps
            )));
        }
        // The curves so far, so that the plot shows the whole run.
        let series = |name: &str| p.history.get(name).cloned().unwrap_or_default();
        train_curve = series(TRAIN);
        train_curve.truncate(start);
        valid_curve = series(VALID_STEP)
            .into_iter()
            .map(|s| s as usize)
            .zip(series(VALID_LOSS))
            .collect();
        println!("resumed from {} at step {start}", args.checkpoint.display());
    }
    let end = args.until.unwrap_or(args.steps).min(args.steps);
    if end < start {
        return Err(setup::fail(format!(
            "--until {end} is before step {start}, where {} is",
            args.checkpoint.display()
        )));
    }
    let mut g = Graph::new();
    let (nt, nv) = corpus.documents();
    println!(
        "arenagrad char-gpt: {} parameters ({} layers, {} heads, width {}, context {}), {} files, \
         {nt} training / {nv} validation documents ({} / {} bytes), batch {}, AdamW lr {} \
         (warmup {}, cosine), {}, {} threads",
        model.num_parameters(),
        cfg.layers,
        cfg.heads,
        cfg.dim,
        cfg.context,
        corpus.files(),
        corpus.text(Split::Train).len(),
        corpus.text(Split::Valid).len(),
        args.batch,
        args.lr,
        args.warmup,
        args.precision.describe(),
        g.threads()
    );
    // The periodic validation: 20 batches at fixed offsets, the same each time.
    let probe: Vec<usize> = {
        let mut r = Rng::seed(12345);
        let n = corpus.text(Split::Valid).len() - args.context;
        (0..20 * args.batch).map(|_| r.below(n)).collect()
    };
    let bar = ProgressBar::new(args.steps as u64);
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_position(start as u64);
    let plain = !std::io::stderr().is_terminal();
    let mut running = train_curve.last().copied().unwrap_or(f64::NAN);
    // The mean training loss since the last evaluation (what the evaluation line prints).
    let (mut since_sum, mut since_n) = (0.0f64, 0usize);
    let t0 = Instant::now();
    let tokens_per_step = args.batch * args.context;
    for step in start..end {
        model.train();
        // Dropout's generator from the seed and the step alone, so a resumed run draws what an
        // uninterrupted one would.
        g.seed(args.seed ^ (step as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (x, y) = match args.order {
            Order::Random => corpus.batch(Split::Train, args.batch, args.context, &mut rng)?,
            Order::Fixed => corpus.fixed_batch(Split::Train, step, args.batch, args.context)?,
        };
        schedule.apply(&mut opt, step)?;
        opt.zero_grad();
        let lv = {
            let _mixed = args.precision.autocast(&g)?;
            let l = model.loss(&g, &x, &y, args.batch, args.context)?;
            precision::backward(l, scaler.as_ref())?
        };
        g.reset();
        precision::step(&mut opt, scaler.as_mut(), Some(args.clip))?;
        if args.log_every.is_some_and(|e| step.is_multiple_of(e)) {
            bar.suspend(|| println!("step {step} loss {lv:.6}"));
        }
        running = if running.is_nan() {
            lv
        } else {
            0.95 * running + 0.05 * lv
        };
        since_sum += lv;
        since_n += 1;
        train_curve.push(running);
        let done = step + 1 - start;
        let tps = (done * tokens_per_step) as f64 / t0.elapsed().as_secs_f64();
        if (step + 1) % args.eval_every == 0 || step + 1 == end {
            model.eval();
            let v = valid_loss(
                &model,
                &g,
                &corpus,
                &probe,
                (args.batch, args.context),
                args.precision,
            )?;
            g.reset();
            valid_curve.push((step + 1, v));
            // A checkpoint at every evaluation: an interrupted run resumes from the last.
            let progress = Progress {
                step: (step + 1) as u64,
                rng: Some(rng.clone()),
                history: [
                    (TRAIN.to_string(), train_curve.clone()),
                    (
                        VALID_STEP.to_string(),
                        valid_curve.iter().map(|v| v.0 as f64).collect(),
                    ),
                    (
                        VALID_LOSS.to_string(),
                        valid_curve.iter().map(|v| v.1).collect(),
                    ),
                ]
                .into(),
                scaler: scaler.as_ref().map(|s| s.state()),
                plateau: None,
            };
            checkpoint::save_training(&args.checkpoint, &model, &opt, &progress).map_err(|e| {
                setup::write_failed("the checkpoint", "--checkpoint", &args.checkpoint, e)
            })?;
            let line = format!(
                "step {}: train loss {:.4}  validation loss {v:.4}  {tps:.0} tokens/s",
                step + 1,
                since_sum / since_n as f64
            );
            (since_sum, since_n) = (0.0, 0);
            bar.suspend(|| println!("{line}"));
        } else if plain && (step + 1) % (args.eval_every / 5).max(1) == 0 {
            eprintln!(
                "step {}/{}: loss {running:.4}  {tps:.0} tokens/s",
                step + 1,
                args.steps
            );
        }
        if step % 5 == 0 {
            bar.set_message(format!("loss {running:.4}  {tps:.0} tokens/s"));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let trained = end.saturating_sub(start);
    if trained > 0 {
        println!(
            "trained {trained} steps in {secs:.1} s ({:.0} ms/step, {:.0} tokens/s)",
            secs * 1e3 / trained as f64,
            (trained * tokens_per_step) as f64 / secs
        );
    }
    model.eval();
    let starts = corpus.sequential_starts(Split::Valid, args.context)?;
    let tv = Instant::now();
    let full = valid_loss(
        &model,
        &g,
        &corpus,
        &starts,
        (args.batch, args.context),
        args.precision,
    )?;
    g.reset();
    println!(
        "validation loss over the whole validation text ({} windows): {full:.4} ({:.2} bits per \
         character, {:.1} s)",
        starts.len(),
        full / std::f64::consts::LN_2,
        tv.elapsed().as_secs_f64()
    );
    plot(&train_curve, &valid_curve, &args.plot)
        .map_err(|e| setup::write_failed("the plot", "--plot", &args.plot, e))?;
    println!(
        "wrote {} (training loss per step, validation loss every {} steps)",
        args.plot.display(),
        args.eval_every
    );
    if trained > 0 {
        println!(
            "saved {} at step {end} (model, optimiser state and progress: --resume continues \
             from it)",
            args.checkpoint.display()
        );
    } else {
        println!(
            "{} is at step {end}: nothing left to train",
            args.checkpoint.display()
        );
    }
    if args.generate > 0 {
        let prompt: Vec<usize> = args.prompt.bytes().map(usize::from).collect();
        let sampling = Sampling {
            temperature: args.temperature,
            top_k: Some(args.top_k),
            top_p: None,
        };
        let tg = Instant::now();
        let out = model.generate(&g, &prompt, args.generate, sampling, &mut rng)?;
        let gs = tg.elapsed().as_secs_f64();
        g.reset();
        let text: Vec<u8> = prompt.iter().chain(&out).map(|&t| t as u8).collect();
        println!(
            "\ngenerated {} characters ({:.0} tokens/s, temperature {}, top-k {}):\n",
            out.len(),
            out.len() as f64 / gs,
            args.temperature,
            args.top_k
        );
        println!("{}", String::from_utf8_lossy(&text));
    }
    Ok(())
}
