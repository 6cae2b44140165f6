//! Generates text with a GPT-2 or Llama-family model from a Hugging Face directory, as
//! `save_pretrained` writes it (`config.json`, whose `model_type` names the architecture,
//! `model.safetensors` or its shards, and `tokenizer.json` for text prompts).
//!
//! ```text
//! cargo run --release --example generate -- --model DIR [--prompt TEXT | --prompt-ids 1,2,3]
//!     [--tokens 64] [--temperature 0.8] [--top-k 40] [--top-p 0.95] [--greedy] [--seed 0]
//!     [--dtype f32|bf16|f16] [--floor]
//! ```
//!
//! The prompt is text when the directory has a `tokenizer.json` (encoded and the output decoded
//! by Hugging Face's `tokenizers`), token ids otherwise (`--prompt-ids`). Decoding samples at
//! `--temperature` from the `--top-k` most likely tokens and the smallest set of them whose
//! probability reaches `--top-p` (both off by default); `--greedy` takes the most likely token.
//! Each new token is one step over the key/value cache. It prints the tokens (or the text), then
//! how long loading and generating took and the tokens per second. `--dtype bf16` (or `f16`)
//! converts the weights as they load and runs the model in that dtype (half the bytes each
//! token reads); `--floor` also times reading the weights once, the floor of a token's time at
//! batch 1.

use std::path::{Path, PathBuf};
use std::time::Instant;

use arenagrad::exec::cpu::bandwidth::read_once;
use arenagrad::nn::{CausalLm, Gpt2, Llama, Module, Rng, Sampling};
use arenagrad::{DType, Graph};

#[path = "common/setup.rs"]
mod setup;
use clap::Parser;
use setup::{non_negative_real, positive};

/// Generates text with a GPT-2 or Llama model saved by Hugging Face's transformers.
#[derive(Debug, Parser)]
#[command(name = "generate")]
struct Args {
    /// The model's folder (config.json, model.safetensors or its shards, tokenizer.json)
    #[arg(long)]
    model: PathBuf,
    /// The prompt as text (needs tokenizer.json in the model's folder)
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as token ids, comma-separated
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Vec<usize>,
    /// Tokens to generate
    #[arg(long, default_value_t = 64, value_parser = positive)]
    tokens: usize,
    /// Divides the logits before sampling
    #[arg(long, default_value_t = 1.0, value_parser = non_negative_real)]
    temperature: f64,
    /// Sample among the k most likely tokens only
    #[arg(long, value_parser = positive)]
    top_k: Option<usize>,
    /// Sample among the most likely tokens whose probability reaches p (in (0, 1])
    #[arg(long, value_parser = probability)]
    top_p: Option<f64>,
    /// Always take the most likely token
    #[arg(long)]
    greedy: bool,
    /// Seed of the sampling
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The weights' dtype: f32, bf16 or f16 (converted as they load)
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    dtype: String,
    /// Also measure how fast this machine reads the weights once (the floor of a token's time
    /// at batch 1, where each token reads every weight) and compare
    #[arg(long)]
    floor: bool,
}

fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!("{s:?} is not a probability in (0, 1]")),
    }
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn tokenizer(dir: &Path) -> Result<Option<tokenizers::Tokenizer>, Box<dyn std::error::Error>> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Ok(None);
    }
    tokenizers::Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| setup::fail(format!("cannot read {}: {e}", path.display())))
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
    let tok = tokenizer(&args.model)?;
    let prompt: Vec<usize> = match (&args.prompt, &tok) {
        (Some(text), Some(t)) => t
            .encode(text.as_str(), false)
            .map_err(|e| setup::fail(format!("cannot encode the prompt: {e}")))?
            .get_ids()
            .iter()
            .map(|&i| i as usize)
            .collect(),
        (Some(_), None) => {
            return Err(setup::fail(format!(
                "--prompt needs {}; without it, give token ids with --prompt-ids",
                args.model.join("tokenizer.json").display()
            )))
        }
        (None, _) => args.prompt_ids.clone(),
    };
    if prompt.is_empty() {
        return Err(setup::fail(
            "the prompt is empty: give --prompt TEXT or --prompt-ids 1,2,3",
        ));
    }
    let t0 = Instant::now();
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    };
    let model = Model::load(&args.model, dtype)?;
    let loaded = t0.elapsed().as_secs_f64();
    let (vocab, about) = model.describe();
    if let Some(&bad) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(setup::fail(format!(
            "token {bad} is outside the vocabulary of {vocab} tokens"
        )));
    }
    println!(
        "{about} (loaded from {} in {loaded:.2} s)",
        args.model.display()
    );
    let sampling = if args.greedy {
        Sampling::greedy()
    } else {
        Sampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
        }
    };
    let g = Graph::new();
    let mut rng = Rng::seed(args.seed);
    let t1 = Instant::now();
    let out = model
        .lm()
        .generate(&g, &prompt, args.tokens, sampling, &mut rng)?;
    let took = t1.elapsed().as_secs_f64();
    match &tok {
        Some(t) => {
            let ids: Vec<u32> = prompt.iter().chain(&out).map(|&i| i as u32).collect();
            let text = t
                .decode(&ids, false)
                .map_err(|e| setup::fail(format!("cannot decode the output: {e}")))?;
            println!("{text}");
        }
        None => {
            let ids: Vec<String> = out.iter().map(|t| t.to_string()).collect();
            println!("prompt: {prompt:?}\ngenerated: {}", ids.join(","));
        }
    }
    let per_token = took / out.len() as f64;
    println!(
        "{} tokens in {took:.2} s: {:.1} tokens/s (batch 1, key/value cache)",
        out.len(),
        1.0 / per_token
    );
    if args.floor {
        floor(&model, &g, &prompt, args.tokens, sampling, args.seed)?;
    }
    Ok(())
}

/// Times each token of a new greedy or sampled run against one read of the weights made just
/// after it, and prints the ratios. This machine's bandwidth moves by a factor of two and more
/// between seconds (other tenants), while a token and the read after it lie 20 ms apart and
/// see the same machine: each token's ratio to its own read, and their median, compare like
/// with like. (Timing whole generations against reads made after them had put the same build
/// anywhere from 0.9 to 2.3 times the read.)
fn floor(
    model: &Model,
    g: &Graph,
    prompt: &[usize],
    tokens: usize,
    sampling: Sampling,
    seed: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let copy = Weights::copy(model);
    let lm = model.lm();
    let mut rng = Rng::seed(seed);
    let mut caches = lm.new_caches(g, 1)?;
    // As `generate`: the prompt's last `context` tokens; each step then adds one position.
    let ctx = lm.context();
    let mut pending = prompt[prompt.len().saturating_sub(ctx)..].to_vec();
    let room = ctx - pending.len();
    // (token, read) times, in seconds.
    let mut pairs = Vec::new();
    // The first step reads the prompt (untimed, as is the read after it); each later step one
    // token, `tokens` of them as far as the context has room.
    for step in 0..=tokens.min(room) {
        let t = Instant::now();
        let row = g.try_scope(|g| -> arenagrad::nn::Result<Vec<f64>> {
            let logits = lm.forward_cached(g, &pending, 1, &mut caches)?;
            let last = logits.shape()[1] - 1;
            Ok(logits.slice(1, last, last + 1)?.to_vec_f64()?)
        })?;
        pending = vec![sampling.sample(&row, &mut rng)];
        let token = t.elapsed().as_secs_f64();
        let read = copy.read_time(1);
        if step > 0 {
            pairs.push((token, read));
        }
    }
    if pairs.is_empty() {
        println!("no room in the context of {ctx} positions after the prompt to time a token");
        return Ok(());
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() / 10], v[v.len() * 9 / 10])
    };
    let (ratio, low, high) = median(pairs.iter().map(|(t, r)| t / r).collect());
    let (read, ..) = median(pairs.iter().map(|p| p.1).collect());
    let best = pairs.iter().map(|p| p.1).fold(f64::MAX, f64::min);
    println!(
        "reading the {:.0} MB of weights once took {:.1} ms (median; {:.1} GB/s at best on {} \
         threads); each of {} tokens against the read made just after it: {ratio:.2}× the read \
         (median; {low:.2}–{high:.2}× from the 10th to the 90th percentile)",
        copy.bytes as f64 / 1e6,
        read * 1e3,
        copy.bytes as f64 / best / 1e9,
        threads(),
        pairs.len(),
    );
    Ok(())
}

/// The architectures this example runs, by `config.json`'s `model_type`.
enum Model {
    Gpt2(Gpt2),
    Llama(Llama),
}

impl Model {
    fn load(dir: &Path, dtype: DType) -> Result<Self, Box<dyn std::error::Error>> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| setup::fail(format!("cannot read {}: {e}", path.display())))?;
        let kind = text
            .split("\"model_type\"")
            .nth(1)
            .and_then(|rest| rest.split('"').nth(1))
            .unwrap_or("");
        Ok(match kind {
            "gpt2" => Model::Gpt2(Gpt2::from_pretrained_as(dir, dtype)?),
            "llama" => Model::Llama(Llama::from_pretrained_as(dir, dtype)?),
            other => {
                return Err(setup::fail(format!(
                    "{} names model_type {other:?}; this example runs \"gpt2\" and \"llama\"",
                    path.display()
                )))
            }
        })
    }

    fn lm(&self) -> &dyn CausalLm {
        match self {
            Model::Gpt2(m) => m,
            Model::Llama(m) => m,
        }
    }

    fn parameters(&self) -> Vec<arenagrad::Parameter> {
        match self {
            Model::Gpt2(m) => m.parameters(),
            Model::Llama(m) => m.parameters(),
        }
    }

    /// The vocabulary's size, and a line about the model.
    fn describe(&self) -> (usize, String) {
        let n: usize = self.parameters().iter().map(|p| p.numel()).sum();
        match self {
            Model::Gpt2(m) => {
                let c = m.config();
                (
                    c.vocab_size,
                    format!(
                        "GPT-2: {n} parameters in {}, {} layers of width {}, {} heads, vocabulary {}, \
                         context {}",
                        format!("{:?}", c.dtype).to_lowercase(),
                        c.n_layer,
                        c.n_embd,
                        c.n_head,
                        c.vocab_size,
                        c.n_positions
                    ),
                )
            }
            Model::Llama(m) => {
                let c = m.config();
                (
                    c.vocab_size,
                    format!(
                        "Llama: {n} parameters in {}, {} layers of width {}, {} query heads on {} \
                         key/value heads, vocabulary {}, context {}",
                        format!("{:?}", c.dtype).to_lowercase(),
                        c.num_hidden_layers,
                        c.hidden_size,
                        c.num_attention_heads,
                        c.num_key_value_heads,
                        c.vocab_size,
                        c.max_position_embeddings
                    ),
                )
            }
        }
    }
}

/// The threads the engine runs on (`ARENAGRAD_NUM_THREADS`, else the CPUs this process may use).
fn threads() -> usize {
    std::env::var("ARENAGRAD_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A copy of the weights' bytes as 32-bit words, to time reading them once.
struct Weights {
    words: Vec<Vec<u32>>,
    bytes: usize,
}

impl Weights {
    fn copy(model: &Model) -> Weights {
        let params = model.parameters();
        let words = params
            .iter()
            .map(|p| {
                p.value()
                    .data()
                    .to_le_bytes()
                    .chunks(4)
                    .map(|c| {
                        let mut w = [0u8; 4];
                        w[..c.len()].copy_from_slice(c);
                        u32::from_le_bytes(w)
                    })
                    .collect()
            })
            .collect();
        let bytes = params.iter().map(|p| p.numel() * p.dtype().size()).sum();
        Weights { words, bytes }
    }

    /// The best of `reps` times to read every word once, on the engine's threads as its
    /// kernels read (`exec::cpu::bandwidth`).
    fn read_time(&self, reps: usize) -> f64 {
        let parts: Vec<&[u32]> = self.words.iter().map(|w| &w[..]).collect();
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            std::hint::black_box(read_once(&parts, threads()));
            best = best.min(t.elapsed().as_secs_f64());
        }
        best
    }
}
