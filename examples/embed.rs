//! Sentence embeddings from a BERT directory as Hugging Face's `save_pretrained` writes it
//! (`config.json`, `model.safetensors` or its shards, `tokenizer.json`): all-MiniLM-L6-v2 and
//! the other `sentence-transformers` encoders built on `BertModel`.
//!
//! ```text
//! cargo run --release --example embed -- --model DIR [--sentence TEXT]... [--dtype f32|bf16|f16]
//! cargo run --release --example embed -- --model DIR --bench 4x128 [--runs 20] [--dtype ...]
//! ```
//!
//! The sentences (a few built-in ones without `--sentence`) are tokenized by the directory's
//! `tokenizer.json` (Hugging Face's `tokenizers`), padded to the longest, encoded, averaged over
//! each sentence's tokens and scaled to unit length — what `sentence-transformers` computes.
//! It prints each sentence's first values and the cosine similarity of every pair. `--bench
//! BATCHxLEN` instead times encoding a batch of random token ids of that shape (no padding)
//! and prints the median and best of `--runs`. `--dtype bf16` (or `f16`) converts the weights
//! as they load and runs the encoder in that dtype; the embeddings print in f32.

use std::path::{Path, PathBuf};
use std::time::Instant;

use arenagrad::nn::{Bert, BertInput, Module, Rng};
use arenagrad::{DType, Graph};

#[path = "common/setup.rs"]
mod setup;
use clap::Parser;
use setup::positive;

/// Sentence embeddings with a BERT encoder saved by Hugging Face's transformers.
#[derive(Debug, Parser)]
#[command(name = "embed")]
struct Args {
    /// The model's folder (config.json, model.safetensors or its shards, tokenizer.json)
    #[arg(long)]
    model: PathBuf,
    /// A sentence to embed (repeat for more; a few built-in ones without it)
    #[arg(long)]
    sentence: Vec<String>,
    /// Time encoding a batch of random token ids instead, of shape BATCHxLEN (e.g. 4x128)
    #[arg(long, value_parser = batch_by_len)]
    bench: Option<(usize, usize)>,
    /// Timed runs for --bench
    #[arg(long, default_value_t = 20, value_parser = positive)]
    runs: usize,
    /// The weights' dtype: f32, bf16 or f16 (converted as they load)
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    dtype: String,
}

fn batch_by_len(s: &str) -> Result<(usize, usize), String> {
    let (b, l) = s
        .split_once('x')
        .ok_or_else(|| format!("{s:?} is not BATCHxLEN (e.g. 4x128)"))?;
    Ok((positive(b)?, positive(l)?))
}

const SENTENCES: [&str; 4] = [
    "A fortune cookie is a cookie with a fortune inside.",
    "You will be hungry again in one hour.",
    "Cookies with a message baked in are served after dinner.",
    "The compiler rejected the program twice.",
];

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if !args.model.join("config.json").is_file() {
        return Err(setup::fail(format!(
            "{} holds no config.json: pass --model a folder that transformers' save_pretrained \
             wrote",
            args.model.display()
        )));
    }
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    };
    let t0 = Instant::now();
    let model = Bert::from_pretrained_as(&args.model, dtype)?;
    let loaded = t0.elapsed().as_secs_f64();
    let c = model.config();
    println!(
        "BERT: {} parameters in {}, {} layers of width {}, {} heads, vocabulary {} (loaded from \
         {} in {loaded:.2} s)",
        model.num_parameters(),
        args.dtype,
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.vocab_size,
        args.model.display()
    );
    match args.bench {
        Some(shape) => bench(&model, shape, args.runs),
        None => embed(&model, &args),
    }
}

/// Embeds the sentences and prints them with their pairwise cosine similarities.
fn embed(model: &Bert, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let sentences: Vec<&str> = if args.sentence.is_empty() {
        SENTENCES.to_vec()
    } else {
        args.sentence.iter().map(String::as_str).collect()
    };
    let (ids, mask, len) = tokenize(&args.model, &sentences, model.config().vocab_size)?;
    let g = Graph::new();
    let _no_grad = g.no_grad();
    let t = Instant::now();
    let input = BertInput::new(&ids, sentences.len(), len).attention_mask(&mask);
    let emb = model.sentence_embeddings(&g, &input)?;
    let took = t.elapsed().as_secs_f64();
    let width = model.config().hidden_size;
    let values = emb.to_vec_f64()?;
    println!(
        "{} sentences of up to {len} tokens embedded in {:.1} ms (width {width}, unit length):",
        sentences.len(),
        took * 1e3
    );
    for (i, s) in sentences.iter().enumerate() {
        let row = &values[i * width..(i + 1) * width];
        let head: Vec<String> = row.iter().take(4).map(|v| format!("{v:+.4}")).collect();
        println!("  [{i}] [{}, …] {s}", head.join(", "));
    }
    if sentences.len() > 1 {
        println!("cosine similarity:");
        // Over the norms as printed: in bf16 or f16 a unit vector's length is 1 only to the
        // dtype's precision.
        let row = |i: usize| &values[i * width..(i + 1) * width];
        let dot =
            |i: usize, j: usize| -> f64 { row(i).iter().zip(row(j)).map(|(a, b)| a * b).sum() };
        let mut best = (f64::MIN, 0, 0);
        for i in 0..sentences.len() {
            let cells: Vec<String> = (0..sentences.len())
                .map(|j| {
                    let dot = dot(i, j) / (dot(i, i) * dot(j, j)).sqrt();
                    if i < j && dot > best.0 {
                        best = (dot, i, j);
                    }
                    format!("{dot:6.3}")
                })
                .collect();
            println!("  [{i}] {}", cells.join(" "));
        }
        println!(
            "closest pair: [{}] and [{}] ({:.3})",
            best.1, best.2, best.0
        );
    }
    Ok(())
}

/// Token ids and attention mask (`[n, len]`, row-major), and `len`.
type Batch = (Vec<usize>, Vec<bool>, usize);

/// The sentences' token ids and attention mask (`[n, len]`, padded to the longest) from the
/// directory's `tokenizer.json`, special tokens added as the model was trained with them.
fn tokenize(
    dir: &Path,
    sentences: &[&str],
    vocab: usize,
) -> Result<Batch, Box<dyn std::error::Error>> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Err(setup::fail(format!(
            "{} is missing: sentences need the model's tokenizer (--bench runs without one)",
            path.display()
        )));
    }
    let tok = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| setup::fail(format!("cannot read {}: {e}", path.display())))?;
    let enc = tok
        .encode_batch(sentences.to_vec(), true)
        .map_err(|e| setup::fail(format!("cannot encode the sentences: {e}")))?;
    let len = enc.iter().map(|e| e.len()).max().unwrap_or(0);
    if len == 0 {
        return Err(setup::fail("the sentences hold no tokens"));
    }
    let pad = tok.token_to_id("[PAD]").unwrap_or(0) as usize;
    let mut ids = Vec::with_capacity(sentences.len() * len);
    let mut mask = Vec::with_capacity(sentences.len() * len);
    for e in &enc {
        ids.extend(e.get_ids().iter().map(|&i| i as usize));
        mask.extend(e.get_attention_mask().iter().map(|&m| m == 1));
        ids.resize(ids.len() + len - e.len(), pad);
        mask.resize(mask.len() + len - e.len(), false);
    }
    if let Some(&bad) = ids.iter().find(|&&t| t >= vocab) {
        return Err(setup::fail(format!(
            "the tokenizer gave token {bad}, outside the model's vocabulary of {vocab}"
        )));
    }
    Ok((ids, mask, len))
}

/// Times encoding `batch × len` random token ids (each run in its own scope, no gradient
/// recorded) and prints the median and the best.
fn bench(
    model: &Bert,
    (batch, len): (usize, usize),
    runs: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng::seed(0);
    let vocab = model.config().vocab_size as u64;
    let ids: Vec<usize> = (0..batch * len)
        .map(|_| (rng.next_u64() % vocab) as usize)
        .collect();
    let input = BertInput::new(&ids, batch, len);
    let g = Graph::new();
    let _no_grad = g.no_grad();
    let mut times = Vec::with_capacity(runs);
    for run in 0..=runs {
        let t = Instant::now();
        g.try_scope(|g| -> arenagrad::nn::Result<()> {
            let e = model.sentence_embeddings(g, &input)?;
            std::hint::black_box(e.to_vec_f64()?);
            Ok(())
        })?;
        // The first run warms the caches and the memory pool: not counted.
        if run > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "sentence embeddings of batch {batch} × {len} tokens: median {:.2} ms, best {:.2} ms \
         over {runs} runs",
        times[times.len() / 2],
        times[0]
    );
    Ok(())
}
