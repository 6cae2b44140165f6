//! Trains a character-level LSTM on the English fortune-cookie collection of Debian's `fortunes`
//! package, one document at a time at its own length, with truncated backpropagation through
//! time; prints the training and validation loss, saves a resumable checkpoint, and ends by
//! sampling text.
//!
//! ```text
//! cargo run --release --example char_lstm -- [--data DIR] [--docs 6000] [--hidden 256]
//!     [--layers 2] [--embed 64] [--bptt 64] [--lr 2e-3] [--clip 1.0] [--eval-every 1000]
//!     [--seed 0] [--checkpoint PATH] [--resume] [--until DOC] [--prompt TEXT]
//!     [--generate 400] [--temperature 0.8]
//! ```
//!
//! The data are the files under `/usr/share/games/fortunes/`, documents (the text between `%`
//! lines) split 90/10 into training and validation; bytes are characters, and each document is
//! read after the `%` line before it (how it begins is learnt from a fresh state). Each training
//! document
//! is read in pieces of `--bptt` characters: a piece is one iteration (forward, backward, an Adam
//! step, the graph freed by the reset), and the LSTM's state goes on to the next piece as plain
//! numbers, detached — so a document of any length trains in the memory of one piece, and the
//! state starts from zero at each new document. Validation runs whole documents, 32 at a time
//! at their own lengths (the LSTM's packed form), no padding counted.
//!
//! A checkpoint (model, optimiser state, document count, order) is written at every
//! evaluation; `--resume` continues from it (`--until DOC` stops early, as an interruption
//! would).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use arenagrad::nn::checkpoint::{self, Progress};
use arenagrad::nn::data::{Split, TextCorpus};
use arenagrad::nn::optim::{clip_grad_norm, Adam, AdamConfig, Optimizer};
use arenagrad::nn::{
    loss, Embedding, Linear, Module, NnError, Rng, RnnConfig, Sampling, Visitor, LSTM,
};
use arenagrad::prelude::*;

#[path = "common/setup.rs"]
mod setup;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use setup::{non_negative_real, positive, positive_real};

/// Trains a character-level LSTM on Debian's fortune cookies and samples text.
#[derive(Debug, Parser)]
#[command(name = "char_lstm")]
struct Args {
    /// Folder of fortune files (documents separated by `%` lines)
    #[arg(long, default_value = "/usr/share/games/fortunes")]
    data: PathBuf,
    /// Training documents to read (in an order drawn from the seed; the training set again
    /// after it is used up)
    #[arg(long, default_value_t = 6000, value_parser = positive)]
    docs: usize,
    /// Hidden units per layer
    #[arg(long, default_value_t = 256, value_parser = positive)]
    hidden: usize,
    /// LSTM layers
    #[arg(long, default_value_t = 2, value_parser = positive)]
    layers: usize,
    /// Character embedding width
    #[arg(long, default_value_t = 64, value_parser = positive)]
    embed: usize,
    /// Characters per piece: how far back gradients flow (truncated BPTT)
    #[arg(long, default_value_t = 64, value_parser = positive)]
    bptt: usize,
    /// Adam's learning rate
    #[arg(long, default_value_t = 2e-3, value_parser = positive_real)]
    lr: f64,
    /// Clip the gradients' global norm to this
    #[arg(long, default_value_t = 1.0, value_parser = positive_real)]
    clip: f64,
    /// Validation loss every N documents (on the first 256 validation documents; all of them
    /// at the end)
    #[arg(long, default_value_t = 1000, value_parser = positive)]
    eval_every: usize,
    /// Seed of the weights, the document order and sampling
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to save the model, the optimiser state and the progress
    #[arg(long, default_value_os_t = std::env::temp_dir().join("arenagrad-char-lstm.safetensors"))]
    checkpoint: PathBuf,
    /// Continue from --checkpoint (model, optimiser, documents done, order)
    #[arg(long)]
    resume: bool,
    /// Stop after this many documents, saving the checkpoint, as if interrupted
    #[arg(long, value_parser = positive)]
    until: Option<usize>,
    /// Text the sampling starts from
    #[arg(long, default_value = "The meaning of life is")]
    prompt: String,
    /// Characters to sample at the end (0: none)
    #[arg(long, default_value_t = 400)]
    generate: usize,
    /// Sampling temperature (0: greedy)
    #[arg(long, default_value_t = 0.8, value_parser = non_negative_real)]
    temperature: f64,
}

/// Bytes in, a distribution over the next byte out: an embedding, a stacked LSTM, a linear head.
struct CharLstm {
    embed: Embedding,
    lstm: LSTM,
    head: Linear,
}

/// The LSTM's state between pieces: `(h, c)` as plain numbers, `[layers, batch, hidden]` each.
type State = Option<(HostTensor, HostTensor)>;

impl CharLstm {
    fn new(args: &Args, rng: &mut Rng) -> Result<Self, NnError> {
        let cfg = RnnConfig {
            num_layers: args.layers,
            ..Default::default()
        };
        Ok(CharLstm {
            embed: Embedding::new(256, args.embed, rng)?,
            lstm: LSTM::with_config(args.embed, args.hidden, cfg, rng)?,
            head: Linear::new(args.hidden, 256, rng)?,
        })
    }

    /// Logits `[t·b, 256]` (position-major) for `ids` `[t, b]`, rows running to `lengths`,
    /// from `state`; returns the final state too.
    fn logits<'g>(
        &self,
        g: &'g Graph,
        ids: &[usize],
        t: usize,
        b: usize,
        lengths: Option<&[usize]>,
        state: &State,
    ) -> Result<(Tensor<'g>, Tensor<'g>, Tensor<'g>), NnError> {
        let x = self.embed.lookup(g, ids, &[t, b])?;
        let s = match state {
            Some((h, c)) => Some((g.from_host(h)?, g.from_host(c)?)),
            None => None,
        };
        let out = self.lstm.forward_with(g, x, s, lengths)?;
        let hidden = self.lstm.hidden_size() as isize;
        let rows = out.output.reshape(&[-1, hidden])?;
        let c_n = out.c_n.expect("an LSTM has cell states");
        Ok((self.head.forward(g, rows)?, out.h_n, c_n))
    }
}

impl Module for CharLstm {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> arenagrad::nn::Result<Tensor<'g>> {
        let h = self.lstm.forward(g, self.embed.forward(g, x)?)?;
        let hidden = self.lstm.hidden_size() as isize;
        self.head.forward(g, h.reshape(&[-1, hidden])?)
    }
    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("embed", &self.embed);
        v.child("lstm", &self.lstm);
        v.child("head", &self.head);
    }
}

/// The mean loss per character over whole documents, 32 at a time at their own lengths; each
/// batch in a scope, so memory stays flat.
fn valid_loss(model: &CharLstm, g: &Graph, docs: &[&[u8]]) -> Result<f64, NnError> {
    let _no_grad = g.no_grad();
    // Longest first, so that a batch's documents have about one length.
    let mut docs = docs.to_vec();
    docs.sort_by_key(|d| std::cmp::Reverse(d.len()));
    let (mut total, mut count) = (0.0, 0usize);
    for batch in docs.chunks(32) {
        let b = batch.len();
        let lengths: Vec<usize> = batch.iter().map(|d| d.len() - 1).collect();
        let t = lengths.iter().copied().max().unwrap_or(0);
        if t == 0 {
            continue;
        }
        let (mut ids, mut rows, mut targets) = (vec![0; t * b], Vec::new(), Vec::new());
        for (r, d) in batch.iter().enumerate() {
            for p in 0..d.len() - 1 {
                ids[p * b + r] = usize::from(d[p]);
                rows.push(p * b + r);
                targets.push(usize::from(d[p + 1]));
            }
        }
        let l = g.try_scope(|g| -> Result<f64, NnError> {
            let (logits, _, _) = model.logits(g, &ids, t, b, Some(&lengths), &None)?;
            let picked = logits.index_select(0, &rows)?;
            Ok(loss::cross_entropy(picked, &targets)?.item()?)
        })?;
        total += l * targets.len() as f64;
        count += targets.len();
    }
    Ok(total / count.max(1) as f64)
}

/// `n` characters drawn after `prompt`, one step at a time from the carried state, each step in
/// a scope. A document's end (a `%` line) starts the next from a fresh state, as in training.
fn sample(
    model: &CharLstm,
    g: &Graph,
    prompt: &[u8],
    n: usize,
    sampling: Sampling,
    rng: &mut Rng,
) -> Result<Vec<u8>, NnError> {
    let _no_grad = g.no_grad();
    let mut state: State = None;
    let mut out = Vec::new();
    let mut feed: Vec<usize> = prompt.iter().map(|&c| usize::from(c)).collect();
    if feed.is_empty() {
        feed.push(usize::from(b'\n'));
    }
    for _ in 0..n {
        let t = feed.len();
        let (last, h, c) = g.try_scope(
            |g| -> Result<(HostTensor, HostTensor, HostTensor), NnError> {
                let (logits, h, c) = model.logits(g, &feed, t, 1, None, &state)?;
                let last = logits.slice(0, t - 1, t)?;
                Ok((last.to_host()?, h.to_host()?, c.to_host()?))
            },
        )?;
        state = Some((h, c));
        let next = sampling.sample(&last.data().to_f64_vec(), rng);
        out.push(next as u8);
        feed = vec![next];
        if out.ends_with(b"\n%\n") {
            state = None;
            feed = vec![usize::from(b'%'), usize::from(b'\n')];
        }
    }
    Ok(out)
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Every argument is checked before any work.
    setup::check_until(args.until, args.docs, "--docs")?;
    setup::check_prompt(args.generate, &args.prompt)?;
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
    // Each document read after the `%` line that ends the one before it (and ending with its
    // own), so that from a fresh state the model learns how documents begin.
    let framed = |split| -> Vec<Vec<u8>> {
        corpus
            .documents_of(split)
            .into_iter()
            .map(|d| [&b"%\n"[..], d].concat())
            .collect()
    };
    let (train_text, valid_text) = (framed(Split::Train), framed(Split::Valid));
    let train_docs: Vec<&[u8]> = train_text.iter().map(Vec::as_slice).collect();
    let valid_docs: Vec<&[u8]> = valid_text.iter().map(Vec::as_slice).collect();
    let mut rng = Rng::seed(args.seed);
    let model = CharLstm::new(&args, &mut rng)?;
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(args.lr))?;
    // The document order: a permutation of the training set from the order generator, drawn
    // anew each pass. The checkpoint keeps the generator as it was when the current pass was
    // drawn, so a resumed run draws the same pass.
    let mut order_rng = Rng::seed(args.seed ^ 0x5EED);
    let mut start = 0usize;
    if args.resume {
        let p = checkpoint::load_training(&args.checkpoint, &model, &mut opt)?;
        start = p.step as usize;
        if let Some(r) = p.rng {
            order_rng = r;
        }
        println!(
            "resumed from {} after {start} documents",
            args.checkpoint.display()
        );
    }
    let end = args.until.unwrap_or(args.docs).min(args.docs);
    if end < start {
        return Err(setup::fail(format!(
            "--until {end} is before document {start}, where {} is",
            args.checkpoint.display()
        )));
    }
    let mut g = Graph::new();
    println!(
        "arenagrad char-lstm: {} parameters ({} layers of {}, embedding {}), {} training / {} \
         validation documents, one at a time, truncated BPTT every {} characters, Adam lr {}, \
         {} threads",
        model.num_parameters(),
        args.layers,
        args.hidden,
        args.embed,
        train_docs.len(),
        valid_docs.len(),
        args.bptt,
        args.lr,
        g.threads()
    );
    let probe = &valid_docs[..valid_docs.len().min(256)];
    let bar = ProgressBar::new(args.docs as u64);
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} documents {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_position(start as u64);
    let plain = !std::io::stderr().is_terminal();
    let mut perm: Vec<usize> = Vec::new();
    let mut pass_start = order_rng.clone();
    let (mut since_loss, mut since_chars, mut chars) = (0.0f64, 0usize, 0usize);
    let mut flops = 0.0f64;
    let t0 = Instant::now();
    // Time spent evaluating, left out of the training rates.
    let mut eval_secs = 0.0f64;
    let mut doc = start;
    while doc < end {
        // The pass's order, drawn when a pass begins (a resumed run draws the same one).
        let pass_at = doc % train_docs.len();
        if perm.is_empty() || pass_at == 0 {
            pass_start = order_rng.clone();
            perm = order_rng.permutation(train_docs.len())?;
        }
        let text = train_docs[perm[pass_at]];
        let mut state: State = None;
        for piece in (0..text.len() - 1).step_by(args.bptt) {
            let t = args.bptt.min(text.len() - 1 - piece);
            let ids: Vec<usize> = text[piece..piece + t]
                .iter()
                .map(|&c| usize::from(c))
                .collect();
            let targets: Vec<usize> = text[piece + 1..piece + t + 1]
                .iter()
                .map(|&c| usize::from(c))
                .collect();
            opt.zero_grad();
            let (logits, h, c) = model.logits(&g, &ids, t, 1, None, &state)?;
            let l = loss::cross_entropy(logits, &targets)?;
            l.backward()?;
            since_loss += l.item()? * t as f64;
            // The state goes on as numbers: the next piece starts from it, detached.
            state = Some((h.to_host()?, c.to_host()?));
            flops += g.stats().flops.total() as f64;
            g.reset();
            clip_grad_norm(opt.parameters(), args.clip)?;
            opt.step()?;
            since_chars += t;
            chars += t;
        }
        doc += 1;
        let secs = t0.elapsed().as_secs_f64() - eval_secs;
        let cps = chars as f64 / secs;
        if doc.is_multiple_of(args.eval_every) || doc == end {
            let train_loss = since_loss / since_chars.max(1) as f64;
            let rates = (cps, flops / secs / 1e9);
            let te = Instant::now();
            evaluate(
                &model,
                &g,
                probe,
                &args,
                doc,
                &opt,
                &pass_start,
                &bar,
                train_loss,
                rates,
            )?;
            g.reset();
            eval_secs += te.elapsed().as_secs_f64();
            (since_loss, since_chars) = (0.0, 0);
        } else if plain && doc.is_multiple_of((args.eval_every / 5).max(1)) {
            eprintln!(
                "{doc}/{} documents: loss {:.4}  {cps:.0} characters/s",
                args.docs,
                since_loss / since_chars.max(1) as f64
            );
        }
        if doc.is_multiple_of(10) {
            bar.set_message(format!(
                "loss {:.4}  {cps:.0} chars/s",
                since_loss / since_chars.max(1) as f64
            ));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64() - eval_secs;
    if doc > start {
        println!(
            "trained on {} documents ({chars} characters) in {secs:.1} s (evaluations left out): \
             {:.0} characters/s, {:.1} GFLOP/s (the graph's count of forward and backward work)",
            doc - start,
            chars as f64 / secs,
            flops / secs / 1e9
        );
    }
    let tv = Instant::now();
    let full = valid_loss(&model, &g, &valid_docs)?;
    g.reset();
    println!(
        "validation loss over all {} validation documents: {full:.4} ({:.2} bits per character, \
         {:.1} s)",
        valid_docs.len(),
        full / std::f64::consts::LN_2,
        tv.elapsed().as_secs_f64()
    );
    if doc > start {
        println!(
            "saved {} after {doc} documents (model, optimiser state and progress: --resume \
             continues from it)",
            args.checkpoint.display()
        );
    } else {
        println!(
            "{} is after {doc} documents: nothing left to train",
            args.checkpoint.display()
        );
    }
    if args.generate > 0 {
        let sampling = Sampling {
            temperature: args.temperature,
            top_k: None,
            top_p: None,
        };
        let mut sample_rng = Rng::seed(args.seed ^ 0xC0FFEE);
        let tg = Instant::now();
        let out = sample(
            &model,
            &g,
            args.prompt.as_bytes(),
            args.generate,
            sampling,
            &mut sample_rng,
        )?;
        let gs = tg.elapsed().as_secs_f64();
        g.reset();
        println!(
            "\nsampled {} characters ({:.0} characters/s, temperature {}):\n",
            out.len(),
            out.len() as f64 / gs,
            args.temperature
        );
        let text: Vec<u8> = args.prompt.bytes().chain(out).collect();
        println!("{}", String::from_utf8_lossy(&text));
    }
    Ok(())
}

/// The periodic evaluation: validation loss on the probe documents, a checkpoint, one line.
#[allow(clippy::too_many_arguments)]
fn evaluate(
    model: &CharLstm,
    g: &Graph,
    probe: &[&[u8]],
    args: &Args,
    doc: usize,
    opt: &Adam,
    order_rng: &Rng,
    bar: &ProgressBar,
    train_loss: f64,
    (cps, gflops): (f64, f64),
) -> Result<(), Box<dyn std::error::Error>> {
    let v = valid_loss(model, g, probe)?;
    let progress = Progress {
        step: doc as u64,
        rng: Some(order_rng.clone()),
        ..Progress::default()
    };
    checkpoint::save_training(&args.checkpoint, model, opt, &progress)
        .map_err(|e| setup::write_failed("the checkpoint", "--checkpoint", &args.checkpoint, e))?;
    let line = format!(
        "{doc} documents: train loss {train_loss:.4}  validation loss {v:.4}  {cps:.0} \
         characters/s  {gflops:.1} GFLOP/s"
    );
    bar.suspend(|| println!("{line}"));
    Ok(())
}
