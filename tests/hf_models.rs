//! Models from Hugging Face (GPT-2, Llama, BERT), checked against the reference implementation: the directories in
//! `tests/data/hf` are what `transformers` 5.25 itself wrote (`save_pretrained`, sharded, of
//! small randomly initialised configurations), beside what it computed from them, made by
//!
//! ```text
//! python3 scripts/hf_reference_models.py tests/data/hf
//! ```

use std::path::{Path, PathBuf};

use arenagrad::nn::checkpoint::{self, KeyMap};
use arenagrad::nn::models::bert::{self, Bert, BertInput};
use arenagrad::nn::{CausalLm, Gpt2, Llama, Module, NnError, Rng, Sampling};
use arenagrad::{DType, Graph, HostTensor};
use safetensors::{Dtype, SafeTensors};

fn data(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/hf")
        .join(model)
}

/// The reference file's tensors: token ids (int64) as `usize`, logits as `f32`.
struct Reference {
    bytes: Vec<u8>,
}

impl Reference {
    fn open(model: &str) -> Self {
        let bytes = std::fs::read(data(model).join("reference.safetensors")).unwrap();
        Reference { bytes }
    }
    fn view(&self, name: &str) -> (Vec<usize>, Dtype, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (t.shape().to_vec(), t.dtype(), t.data().to_vec())
    }
    fn ids(&self, name: &str) -> (Vec<usize>, Vec<usize>) {
        let (shape, dtype, bytes) = self.view(name);
        assert_eq!(dtype, Dtype::I64, "{name}");
        let ids = bytes
            .chunks_exact(8)
            .map(|c| usize::try_from(i64::from_le_bytes(c.try_into().unwrap())).unwrap())
            .collect();
        (shape, ids)
    }
    fn doubles(&self, name: &str) -> (Vec<usize>, Vec<f64>) {
        let (shape, dtype, bytes) = self.view(name);
        assert_eq!(dtype, Dtype::F64, "{name}");
        let v = bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (shape, v)
    }
    fn names(&self, prefix: &str) -> Vec<String> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        st.names()
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .map(str::to_string)
            .collect()
    }
    fn floats(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (shape, dtype, bytes) = self.view(name);
        assert_eq!(dtype, Dtype::F32, "{name}");
        let v = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (shape, v)
    }
}

/// A tensor of any float dtype's values as f32 (exact for bf16 and f16).
fn widened(t: arenagrad::Tensor<'_>) -> Vec<f32> {
    t.to_vec_f64().unwrap().iter().map(|&v| v as f32).collect()
}

/// The largest absolute difference between two equally long lists.
fn worst_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The models under test: logits from position 0, besides [`CausalLm`].
trait Lm: CausalLm {
    fn logits<'g>(
        &self,
        g: &'g Graph,
        ids: &[usize],
        batch: usize,
        len: usize,
    ) -> Result<arenagrad::Tensor<'g>, NnError>;
}

impl Lm for Gpt2 {
    fn logits<'g>(
        &self,
        g: &'g Graph,
        ids: &[usize],
        batch: usize,
        len: usize,
    ) -> Result<arenagrad::Tensor<'g>, NnError> {
        self.forward_tokens(g, ids, batch, len)
    }
}

impl Lm for Llama {
    fn logits<'g>(
        &self,
        g: &'g Graph,
        ids: &[usize],
        batch: usize,
        len: usize,
    ) -> Result<arenagrad::Tensor<'g>, NnError> {
        self.forward_tokens(g, ids, batch, len)
    }
}

/// The model's logits equal `transformers`' within 1e-4 at every batch size and length the
/// reference holds (one token up to 33, batches of 1 to 3).
fn logits_match(model: &impl Lm, name: &str) {
    let r = Reference::open(name);
    let g = Graph::new();
    for case in ["1x1", "1x7", "2x16", "3x33"] {
        let (shape, ids) = r.ids(&format!("ids/{case}"));
        let (lshape, want) = r.floats(&format!("logits/{case}"));
        let logits = model.logits(&g, &ids, shape[0], shape[1]).unwrap();
        assert_eq!(
            logits.shape().as_slice(),
            lshape.as_slice(),
            "{name} {case}"
        );
        let worst = worst_gap(&logits.to_vec::<f32>().unwrap(), &want);
        assert!(
            worst <= 1e-4,
            "{name} {case}: logits differ by up to {worst}"
        );
    }
}

/// Two sequences of 16 tokens (`ids/2x16`) split into their first 9 tokens and the other 7,
/// each part both sequences' side by side.
fn split_2x16(ids: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (mut head, mut tail) = (vec![], vec![]);
    for b in 0..2 {
        head.extend_from_slice(&ids[b * 16..b * 16 + 9]);
        tail.extend_from_slice(&ids[b * 16 + 9..b * 16 + 16]);
    }
    (head, tail)
}

/// Greedy decoding of 64 tokens is `generate`'s, token for token, with the key/value cache and
/// without it (each step a full forward over the text so far); and the cache's own path agrees
/// with the full forward on a prefix and its continuation, two sequences at once.
fn greedy_matches(model: &impl Lm, name: &str) {
    let r = Reference::open(name);
    let (_, prompt) = r.ids("prompt");
    let greedy = Sampling::greedy();
    let g = Graph::new();
    let cached = model
        .generate(&g, &prompt, 64, greedy, &mut Rng::seed(0))
        .unwrap();
    assert_eq!(cached, r.ids("greedy/cache").1, "{name}");
    let mut text = prompt.clone();
    for _ in 0..64 {
        let next = g
            .try_scope(|g| -> Result<usize, NnError> {
                let logits = model.logits(g, &text, 1, text.len())?;
                let last = logits.slice(1, text.len() - 1, text.len())?.to_vec_f64()?;
                Ok(greedy.sample(&last, &mut Rng::seed(0)))
            })
            .unwrap();
        text.push(next);
    }
    assert_eq!(
        &text[prompt.len()..],
        r.ids("greedy/nocache").1.as_slice(),
        "{name}"
    );
    let mut caches = model.new_caches(&g, 2).unwrap();
    let (shape, ids) = r.ids("ids/2x16");
    let (head, tail) = split_2x16(&ids);
    model.forward_cached(&g, &head, 2, &mut caches).unwrap();
    let late = model.forward_cached(&g, &tail, 2, &mut caches).unwrap();
    let full = model.logits(&g, &ids, shape[0], shape[1]).unwrap();
    let (late, full) = (
        late.to_vec::<f32>().unwrap(),
        full.slice(1, 9, 16).unwrap().to_vec::<f32>().unwrap(),
    );
    let worst = worst_gap(&late, &full);
    assert!(
        worst <= 1e-4,
        "{name}: cached continuation differs by {worst}"
    );
}

#[test]
fn gpt2_logits_match_transformers() {
    logits_match(&Gpt2::from_pretrained(data("gpt2")).unwrap(), "gpt2");
}

#[test]
fn gpt2_greedy_generation_matches_transformers() {
    greedy_matches(&Gpt2::from_pretrained(data("gpt2")).unwrap(), "gpt2");
}

/// Llama with grouped-query attention (4 query heads on 2 key/value heads), rotary
/// embeddings, SwiGLU and an untied output layer.
#[test]
fn llama_logits_match_transformers() {
    logits_match(&Llama::from_pretrained(data("llama")).unwrap(), "llama");
}

#[test]
fn llama_greedy_generation_matches_transformers() {
    greedy_matches(&Llama::from_pretrained(data("llama")).unwrap(), "llama");
}

/// Llama's parameters are the checkpoint's, by its names, and a wrong shape is refused with
/// the name (nothing changed).
#[test]
fn llama_state_is_the_checkpoint_and_refusals_name_the_key() {
    let model = Llama::from_pretrained(data("llama")).unwrap();
    let file = checkpoint::read_tensors(data("llama")).unwrap();
    let mut ours = checkpoint::state_dict(&model);
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(ours, file);
    let mut bad = file.clone();
    let at = bad
        .iter()
        .position(|(n, _)| n == "model.layers.1.self_attn.k_proj.weight")
        .unwrap();
    bad[at].1 = bad[at].1.transposed().unwrap();
    let dir = std::env::temp_dir().join(format!("arenagrad-llama-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    checkpoint::save_tensors(bad.iter().map(|(n, t)| (n.as_str(), t)), &path).unwrap();
    let err = model.load_hf(&path).unwrap_err();
    assert!(
        err.to_string()
            .contains("model.layers.1.self_attn.k_proj.weight"),
        "{err}"
    );
    let mut after = checkpoint::state_dict(&model);
    after.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(after, file, "a refused load changed the model");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The state dict by `transformers`' names is the checkpoint itself, the tied `lm_head.weight`
/// included (what `GPT2LMHeadModel.load_state_dict(strict=True)` needs), and it loads back.
#[test]
fn gpt2_state_dict_round_trips_by_transformers_names() {
    let model = Gpt2::from_pretrained(data("gpt2")).unwrap();
    let file = checkpoint::read_tensors(data("gpt2")).unwrap();
    let mut ours = model.hf_state_dict();
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    let wte = file
        .iter()
        .find(|(n, _)| n == "transformer.wte.weight")
        .unwrap()
        .1
        .clone();
    let mut want = file.clone();
    want.push(("lm_head.weight".into(), wte));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(ours.len(), want.len());
    for ((a, ta), (b, tb)) in ours.iter().zip(&want) {
        assert_eq!(a, b);
        assert_eq!(ta, tb, "{a}");
    }
    // Saved and read back into a fresh model: the same logits.
    let dir = std::env::temp_dir().join(format!("arenagrad-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    checkpoint::save_tensors(ours.iter().map(|(n, t)| (n.as_str(), t)), &path).unwrap();
    let mut other = Gpt2::new(*model.config(), &mut Rng::seed(5)).unwrap();
    other.set_training(false);
    let g = Graph::new();
    let a = model.forward_tokens(&g, &[1, 2, 3], 1, 3).unwrap();
    let fresh = other.forward_tokens(&g, &[1, 2, 3], 1, 3).unwrap();
    assert_ne!(a.to_vec::<f32>().unwrap(), fresh.to_vec::<f32>().unwrap());
    other.load_hf(&path).unwrap();
    let b = other.forward_tokens(&g, &[1, 2, 3], 1, 3).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Refusals name what is wrong and change nothing: a mis-shaped tensor, a missing one, a shard
/// the index names but that lacks the tensor, a corrupted shard.
#[test]
fn gpt2_refuses_bad_checkpoints_and_keeps_its_weights() {
    let model = Gpt2::from_pretrained(data("gpt2")).unwrap();
    let before = model.hf_state_dict();
    let dir = std::env::temp_dir().join(format!("arenagrad-hf-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut tensors = checkpoint::read_tensors(data("gpt2")).unwrap();
    let save = |t: &[(String, HostTensor)], name: &str| {
        let p = dir.join(name);
        checkpoint::save_tensors(t.iter().map(|(n, t)| (n.as_str(), t)), &p).unwrap();
        p
    };
    // A wrong shape: a transposed projection.
    let at = tensors
        .iter()
        .position(|(n, _)| n == "transformer.h.1.mlp.c_fc.weight")
        .unwrap();
    let good = tensors[at].1.clone();
    tensors[at].1 = good.transposed().unwrap();
    let err = model
        .load_hf(save(&tensors, "shape.safetensors"))
        .unwrap_err();
    assert!(
        err.to_string().contains("transformer.h.1.mlp.c_fc.weight"),
        "{err}"
    );
    // A missing tensor.
    tensors[at].1 = good;
    let gone = tensors.remove(0).0;
    let err = model
        .load_hf(save(&tensors, "missing.safetensors"))
        .unwrap_err();
    assert!(err.to_string().contains(&gone), "{err}");
    // A truncated shard.
    let shard = data("gpt2").join("model-00002-of-00003.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    for f in std::fs::read_dir(data("gpt2")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        dir.join("model-00002-of-00003.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let err = model.load_hf(&dir).unwrap_err();
    assert!(err.to_string().contains("model-00002-of-00003"), "{err}");
    // An index that maps a tensor to a shard without it.
    std::fs::write(dir.join("model-00002-of-00003.safetensors"), &bytes).unwrap();
    let index = std::fs::read_to_string(data("gpt2").join(checkpoint::SHARD_INDEX)).unwrap();
    let moved = index.replacen(
        "\"transformer.wte.weight\": \"model-00001-of-00003.safetensors\"",
        "\"transformer.wte.weight\": \"model-00002-of-00003.safetensors\"",
        1,
    );
    assert_ne!(moved, index, "the index names wte's shard");
    std::fs::write(dir.join(checkpoint::SHARD_INDEX), moved).unwrap();
    let err = model.load_hf(&dir).unwrap_err();
    assert!(err.to_string().contains("transformer.wte.weight"), "{err}");
    // A shard named outside the directory.
    let escape = index.replacen("model-00001-of-00003", "../model-00001-of-00003", 1);
    std::fs::write(dir.join(checkpoint::SHARD_INDEX), escape).unwrap();
    assert!(model.load_hf(&dir).is_err());
    assert_eq!(
        model.hf_state_dict(),
        before,
        "a refused load changed the model"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Key maps: prefixes, renames, dropped names, and two names that would become one.
#[test]
fn key_maps_rename_drop_and_refuse_collisions() {
    let map = KeyMap::new()
        .drop("*.attn.bias")
        .strip_prefix("model.")
        .add_prefix("transformer.")
        .rename(".c_attn.", ".qkv.");
    assert_eq!(
        map.apply("model.h.0.attn.c_attn.weight").as_deref(),
        Some("transformer.h.0.attn.qkv.weight")
    );
    assert_eq!(map.apply("h.11.attn.bias"), None);
    assert_eq!(
        map.apply("transformer.h.0.attn.bias_k").as_deref(),
        Some("transformer.h.0.attn.bias_k")
    );
    let t = HostTensor::zeros(&[1], arenagrad::DType::F32).unwrap();
    let clash = vec![("model.a".to_string(), t.clone()), ("a".to_string(), t)];
    let err = map.remap(clash, Path::new("x")).unwrap_err();
    assert!(err.to_string().contains("both become"), "{err}");
    // Patterns: stars anywhere, repeated, matching empty runs.
    let m = |p: &str, n: &str| KeyMap::new().drop(p).apply(n).is_none();
    assert!(m("*", ""));
    assert!(m("a*b*c", "abc"));
    assert!(m("a*b*c", "a.x.b.y.c"));
    assert!(!m("a*b*c", "a.x.b.y.d"));
    assert!(m("**x", "yyx"));
    assert!(!m("x", "xx"));
}

/// A model loads in training mode when made, evaluation mode from a checkpoint: dropout is off
/// after `from_pretrained`, so two forwards agree.
#[test]
fn gpt2_from_pretrained_runs_in_evaluation_mode() {
    let model = Gpt2::from_pretrained(data("gpt2")).unwrap();
    let g = Graph::new();
    let a = model.forward_tokens(&g, &[4, 5, 6, 7], 1, 4).unwrap();
    let b = model.forward_tokens(&g, &[4, 5, 6, 7], 1, 4).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(model.num_parameters(), 141_056);
}

/// A text prompt through the model's own `tokenizer.json` (a byte-level BPE trained on the
/// fortunes, saved by `transformers`), read by the `tokenizers` crate: the same ids as
/// `transformers`' tokenizer, the same greedy continuation, the same decoded text.
#[test]
fn gpt2_text_round_trips_through_its_tokenizer() {
    let dir = data("gpt2");
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let lines = std::fs::read_to_string(dir.join("reference_text.txt")).unwrap();
    let mut lines = lines.lines();
    let (prompt, decoded) = (lines.next().unwrap(), lines.next().unwrap());
    let r = Reference::open("gpt2");
    let ids: Vec<usize> = tok
        .encode(prompt, false)
        .unwrap()
        .get_ids()
        .iter()
        .map(|&i| i as usize)
        .collect();
    assert_eq!(ids, r.ids("text/ids").1);
    let model = Gpt2::from_pretrained(&dir).unwrap();
    let g = Graph::new();
    let out = model
        .generate(&g, &ids, 24, Sampling::greedy(), &mut Rng::seed(0))
        .unwrap();
    assert_eq!(out, r.ids("text/greedy").1);
    let all: Vec<u32> = ids.iter().chain(&out).map(|&i| i as u32).collect();
    assert_eq!(tok.decode(&all, false).unwrap(), decoded);
}

/// The reference's BERT case `key`: ids, mask, token types.
fn bert_case(r: &Reference, key: &str) -> (Vec<usize>, (usize, usize), Vec<bool>, Vec<usize>) {
    let (shape, ids) = r.ids(&format!("ids/{key}"));
    let mask = r
        .ids(&format!("mask/{key}"))
        .1
        .iter()
        .map(|&m| m == 1)
        .collect();
    let types = r.ids(&format!("types/{key}")).1;
    (ids, (shape[0], shape[1]), mask, types)
}

/// BERT's last hidden states, pooler output and sentence embeddings equal `transformers'`
/// (and `sentence-transformers`' pooling) within 1e-4, at batch sizes 1 to 3 and lengths 1
/// to 33, later sequences of a batch padded, token types 0 and 1.
#[test]
fn bert_matches_transformers() {
    let model = Bert::from_pretrained(data("bert")).unwrap();
    let r = Reference::open("bert");
    let g = Graph::new();
    for key in ["1x1", "1x7", "2x16", "3x33"] {
        let (ids, (b, l), mask, types) = bert_case(&r, key);
        let input = BertInput::new(&ids, b, l)
            .attention_mask(&mask)
            .token_type_ids(&types);
        let hidden = model.encode(&g, &input).unwrap();
        for (name, got) in [
            ("hidden", hidden),
            ("pooled", model.pool(&g, hidden).unwrap()),
            ("embeddings", model.sentence_embeddings(&g, &input).unwrap()),
        ] {
            let (shape, want) = r.floats(&format!("{name}/{key}"));
            assert_eq!(got.shape().as_slice(), shape.as_slice(), "{name} {key}");
            let worst = worst_gap(&got.to_vec::<f32>().unwrap(), &want);
            assert!(worst <= 1e-4, "{name} {key}: differs by up to {worst}");
        }
    }
}

/// Loaded as bf16 (`from_pretrained_as`, as `from_pretrained(dir, dtype=torch.bfloat16)`), every
/// parameter is bf16 and the sentence embeddings (unit vectors) stay within bf16's tolerances
/// (PyTorch's: 1e-2 absolute, 1.6e-2 relative) of `transformers`' f32 ones; a dtype that is not
/// a float is refused.
#[test]
fn bert_loads_as_bf16_and_stays_near_the_f32_embeddings() {
    let model = Bert::from_pretrained_as(data("bert"), DType::BF16).unwrap();
    assert!(model.parameters().iter().all(|p| p.dtype() == DType::BF16));
    let r = Reference::open("bert");
    let g = Graph::new();
    for key in ["1x7", "2x16", "3x33"] {
        let (ids, (b, l), mask, types) = bert_case(&r, key);
        let input = BertInput::new(&ids, b, l)
            .attention_mask(&mask)
            .token_type_ids(&types);
        let got = model.sentence_embeddings(&g, &input).unwrap();
        assert_eq!(got.dtype(), DType::BF16, "{key}");
        let got = widened(got);
        let (_, want) = r.floats(&format!("embeddings/{key}"));
        let worst = worst_gap(&got, &want);
        eprintln!("bert bf16 {key}: embeddings within {worst} of transformers' f32");
        for (x, y) in got.iter().zip(&want) {
            assert!(
                (x - y).abs() <= 1e-2 + 1.6e-2 * y.abs(),
                "{key}: bf16 embedding {x} against f32 {y}"
            );
        }
    }
    refuses_dtype(
        Bert::from_pretrained_as(data("bert"), DType::I64).err(),
        "I64",
    );
}

/// `from_pretrained_as` refused a dtype that is not a float, with an error naming itself and
/// the dtype.
fn refuses_dtype(err: Option<impl std::fmt::Display>, dtype: &str) {
    let err = err
        .expect("a dtype that is not a float is refused")
        .to_string();
    assert!(
        err.contains("from_pretrained_as") && err.contains(dtype),
        "{err}"
    );
}

/// Sentences through the model's own `tokenizer.json` (WordPiece trained on the fortunes,
/// saved by `transformers`), padded to the longest: the same ids and mask as `transformers`'
/// tokenizer, and the same sentence embeddings.
#[test]
fn bert_sentence_embeddings_from_text_match() {
    let dir = data("bert");
    let mut tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let pad = tok.token_to_id("[PAD]").unwrap();
    tok.with_padding(Some(tokenizers::PaddingParams {
        pad_id: pad,
        pad_token: "[PAD]".into(),
        ..Default::default()
    }));
    let text = std::fs::read_to_string(dir.join("reference_text.txt")).unwrap();
    let sentences: Vec<&str> = text.lines().collect();
    let enc = tok.encode_batch(sentences.clone(), true).unwrap();
    let len = enc[0].len();
    let ids: Vec<usize> = enc
        .iter()
        .flat_map(|e| e.get_ids().iter().map(|&i| i as usize))
        .collect();
    let mask: Vec<bool> = enc
        .iter()
        .flat_map(|e| e.get_attention_mask().iter().map(|&m| m == 1))
        .collect();
    let r = Reference::open("bert");
    assert_eq!(ids, r.ids("text/ids").1);
    let want_mask: Vec<bool> = r.ids("text/mask").1.iter().map(|&m| m == 1).collect();
    assert_eq!(mask, want_mask);
    assert!(mask.contains(&false), "the sentences should need padding");
    let model = Bert::from_pretrained(&dir).unwrap();
    let g = Graph::new();
    let input = BertInput::new(&ids, sentences.len(), len).attention_mask(&mask);
    let emb = model.sentence_embeddings(&g, &input).unwrap();
    let worst = worst_gap(
        &emb.to_vec::<f32>().unwrap(),
        &r.floats("text/embeddings").1,
    );
    assert!(worst <= 1e-4, "sentence embeddings differ by up to {worst}");
    // Padding changes nothing: each sentence alone gives its row.
    for (i, e) in enc.iter().enumerate() {
        let n = e.get_attention_mask().iter().filter(|&&m| m == 1).count();
        let alone = model
            .sentence_embeddings(&g, &BertInput::new(&ids[i * len..i * len + n], 1, n))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let row = emb.slice(0, i, i + 1).unwrap().to_vec::<f32>().unwrap();
        assert!(worst_gap(&alone, &row) <= 1e-5, "sentence {i}");
    }
}

/// BERT's state dict is the checkpoint by its names; a task model's checkpoint (`bert.`
/// prefix, a `cls.` head, older `gamma`/`beta` names, a `position_ids` buffer) loads into it;
/// a wrong shape is refused with the name and nothing changes.
#[test]
fn bert_loads_task_checkpoints_and_refuses_bad_ones() {
    let model = Bert::from_pretrained(data("bert")).unwrap();
    let file = checkpoint::read_tensors(data("bert")).unwrap();
    let mut ours = model.hf_state_dict();
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(ours, file);
    let dir = std::env::temp_dir().join(format!("arenagrad-bert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let save = |t: &[(String, HostTensor)], name: &str| {
        let p = dir.join(name);
        checkpoint::save_tensors(t.iter().map(|(n, t)| (n.as_str(), t)), &p).unwrap();
        p
    };
    let mut task: Vec<(String, HostTensor)> = file
        .iter()
        .map(|(n, t)| {
            let n = n.replace("LayerNorm.weight", "LayerNorm.gamma");
            (
                format!("bert.{}", n.replace("LayerNorm.bias", "LayerNorm.beta")),
                t.clone(),
            )
        })
        .collect();
    let z = HostTensor::zeros(&[4], arenagrad::DType::F32).unwrap();
    task.push(("cls.predictions.bias".into(), z.clone()));
    task.push(("bert.embeddings.position_ids".into(), z));
    let mut other = Bert::new(*model.config(), &mut Rng::seed(3)).unwrap();
    other.set_training(false);
    other.load_hf(save(&task, "task.safetensors")).unwrap();
    let g = Graph::new();
    let ids = [5, 6, 7, 8];
    let a = model.encode(&g, &BertInput::new(&ids, 1, 4)).unwrap();
    let b = other.encode(&g, &BertInput::new(&ids, 1, 4)).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    // A transposed projection is refused by name; the model keeps its weights.
    let mut bad = file.clone();
    let at = bad
        .iter()
        .position(|(n, _)| n == "encoder.layer.1.intermediate.dense.weight")
        .unwrap();
    bad[at].1 = bad[at].1.transposed().unwrap();
    let err = model.load_hf(save(&bad, "bad.safetensors")).unwrap_err();
    assert!(
        err.to_string()
            .contains("encoder.layer.1.intermediate.dense.weight"),
        "{err}"
    );
    let mut after = model.hf_state_dict();
    after.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(after, file, "a refused load changed the model");
    // Without the pooler in the checkpoint, the model has none.
    let no_pool: Vec<_> = file
        .iter()
        .filter(|(n, _)| !n.starts_with("pooler."))
        .cloned()
        .collect();
    save(&no_pool, "model.safetensors");
    std::fs::copy(data("bert").join("config.json"), dir.join("config.json")).unwrap();
    let bare = Bert::from_pretrained(&dir).unwrap();
    let h = bare.encode(&g, &BertInput::new(&ids, 1, 4)).unwrap();
    assert_eq!(h.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
    assert!(bare.pool(&g, h).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad input is a typed error naming what is wrong: ids that do not fill the shape, a mask of
/// another length, a sequence with no real token, a token type past the vocabulary, too long
/// a sequence; unsupported configurations are refused.
#[test]
fn bert_refuses_bad_input_and_configs() {
    let model = Bert::from_pretrained(data("bert")).unwrap();
    let g = Graph::new();
    let ids = [1, 2, 3, 4];
    let expect = |input: BertInput<'_>, what: &str| {
        let err = model.encode(&g, &input).unwrap_err().to_string();
        assert!(err.contains(what), "{what}: {err}");
    };
    expect(BertInput::new(&ids, 3, 2), "token ids");
    expect(
        BertInput::new(&ids, 2, 2).attention_mask(&[true; 3]),
        "attention_mask",
    );
    expect(
        BertInput::new(&ids, 2, 2).attention_mask(&[true, true, false, false]),
        "sequence 1",
    );
    expect(
        BertInput::new(&ids, 2, 2).token_type_ids(&[0, 0, 2, 0]),
        "token type 2",
    );
    let long = vec![1; 129];
    expect(BertInput::new(&long, 1, 129), "max_position_embeddings");
    let cfg = std::fs::read_to_string(data("bert").join("config.json")).unwrap();
    for (from, to, what) in [
        (
            "\"is_decoder\": false",
            "\"is_decoder\": true",
            "is_decoder",
        ),
        (
            "\"hidden_act\": \"gelu\"",
            "\"hidden_act\": \"mish\"",
            "hidden_act",
        ),
        (
            "\"model_type\"",
            "\"position_embedding_type\": \"relative_key\", \"model_type\"",
            "position_embedding_type",
        ),
    ] {
        let text = cfg.replacen(from, to, 1);
        assert_ne!(text, cfg);
        let err = bert::BertConfig::from_json(&text).unwrap_err().to_string();
        assert!(err.contains(what), "{what}: {err}");
    }
}

/// One training step equals PyTorch's in float64: the loss of the 2x16 case's first 15 tokens
/// predicting the next, and every parameter's gradient (the tied GPT-2 embedding's from both
/// its uses), within 1e-11 of the largest value of each — for the model loaded in f64; loaded in
/// f32 within 1e-4 (f32's own rounding moves these gradients by up to 3e-5 of their size at
/// this initialisation, PyTorch's f32 run as much).
fn training_step_matches(
    model: &impl Module,
    name: &str,
    tol: f64,
    loss: impl for<'g> Fn(&'g Graph, &[usize], &[usize]) -> arenagrad::Tensor<'g>,
) {
    let r = Reference::open(name);
    let (_, ids) = r.ids("ids/2x16");
    let (x, y): (Vec<usize>, Vec<usize>) = (0..2)
        .flat_map(|b| (0..15).map(move |t| (b, t)))
        .map(|(b, t)| (ids[b * 16 + t], ids[b * 16 + t + 1]))
        .unzip();
    let g = Graph::new();
    model.zero_grad();
    let l = loss(&g, &x, &y);
    let want = r.doubles("step/loss").1[0];
    let got = l.item().unwrap();
    assert!(
        (got - want).abs() <= tol * want.abs(),
        "{name}: loss {got} vs {want}"
    );
    l.backward().unwrap();
    let params = model.named_parameters();
    for (pname, p) in &params {
        let (shape, want) = r.doubles(&format!("grad/{pname}"));
        assert_eq!(p.shape(), shape, "{pname}");
        let got = p.grad().unwrap().to_f64_vec();
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f64, f64::max);
        assert!(
            worst <= tol * scale,
            "{name} {pname}: gradient differs by {worst} (largest {scale})"
        );
    }
    let file_params = r.names("grad/").len();
    assert_eq!(params.len(), file_params, "{name}: every parameter checked");
    model.zero_grad();
}

/// The model of `dir`'s configuration in `dtype`, its weights loaded and in evaluation mode.
fn gpt2_in(dtype: arenagrad::DType) -> Gpt2 {
    let text = std::fs::read_to_string(data("gpt2").join("config.json")).unwrap();
    let mut cfg = arenagrad::nn::Gpt2Config::from_json(&text).unwrap();
    cfg.dtype = dtype;
    let mut m = Gpt2::new(cfg, &mut Rng::seed(0)).unwrap();
    m.load_hf(data("gpt2")).unwrap();
    m.set_training(false);
    m
}

fn llama_in(dtype: arenagrad::DType) -> Llama {
    let text = std::fs::read_to_string(data("llama").join("config.json")).unwrap();
    let mut cfg = arenagrad::nn::LlamaConfig::from_json(&text).unwrap();
    cfg.dtype = dtype;
    let mut m = Llama::new(cfg, &mut Rng::seed(0)).unwrap();
    m.load_hf(data("llama")).unwrap();
    m.set_training(false);
    m
}

#[test]
fn gpt2_training_step_matches_pytorch() {
    for (dtype, tol) in [
        (arenagrad::DType::F64, 1e-11),
        (arenagrad::DType::F32, 1e-4),
    ] {
        let model = gpt2_in(dtype);
        training_step_matches(&model, "gpt2", tol, |g, x, y| {
            model.loss(g, x, y, 2, 15).unwrap()
        });
    }
}

#[test]
fn llama_training_step_matches_pytorch() {
    for (dtype, tol) in [
        (arenagrad::DType::F64, 1e-11),
        (arenagrad::DType::F32, 1e-4),
    ] {
        let model = llama_in(dtype);
        training_step_matches(&model, "llama", tol, |g, x, y| {
            model.loss(g, x, y, 2, 15).unwrap()
        });
    }
}

/// Loaded as bf16 (the checkpoint's f32 values rounded as they load), GPT-2 and Llama run in
/// bf16: their logits stay as close to `transformers`' f32 ones as `transformers`' own bf16 run
/// of the same checkpoint does (within 1.5× its worst gap: 0.574 for GPT-2, 1.106 for Llama on
/// `ids/2x16`, from `AutoModelForCausalLM.from_pretrained(dir, dtype=torch.bfloat16)` in
/// `transformers` 5.25), the key/value cache (written in bf16) continues a prefix as the full
/// forward does, and a dtype that is not a float is refused.
#[test]
fn gpt2_and_llama_load_as_bf16_and_the_cache_agrees_with_the_full_forward() {
    fn check(model: &impl Lm, name: &str, theirs: f32) {
        let r = Reference::open(name);
        let g = Graph::new();
        let (shape, ids) = r.ids("ids/2x16");
        let (_, want) = r.floats("logits/2x16");
        let full = model.logits(&g, &ids, shape[0], shape[1]).unwrap();
        assert_eq!(full.dtype(), DType::BF16, "{name}");
        let got = widened(full);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = worst_gap(&got, &want);
        eprintln!("{name} bf16: worst gap {worst} against logits up to {scale}");
        assert!(
            worst <= 1.5 * theirs,
            "{name}: bf16 logits differ by {worst} (scale {scale})"
        );
        let mut caches = model.new_caches(&g, 2).unwrap();
        let (head, tail) = split_2x16(&ids);
        model.forward_cached(&g, &head, 2, &mut caches).unwrap();
        let late = model.forward_cached(&g, &tail, 2, &mut caches).unwrap();
        let late = widened(late);
        let full = widened(full.slice(1, 9, 16).unwrap());
        let worst = worst_gap(&late, &full);
        eprintln!("{name} bf16: cached continuation within {worst} of the full forward");
        assert!(
            worst <= 0.02 * scale,
            "{name}: cached bf16 continuation differs by {worst}"
        );
    }
    let gpt2 = Gpt2::from_pretrained_as(data("gpt2"), DType::BF16).unwrap();
    assert!(gpt2.parameters().iter().all(|p| p.dtype() == DType::BF16));
    check(&gpt2, "gpt2", 0.574);
    check(
        &Llama::from_pretrained_as(data("llama"), DType::BF16).unwrap(),
        "llama",
        1.106,
    );
    refuses_dtype(
        Gpt2::from_pretrained_as(data("gpt2"), DType::I64).err(),
        "I64",
    );
    refuses_dtype(
        Llama::from_pretrained_as(data("llama"), DType::U8).err(),
        "U8",
    );
}
