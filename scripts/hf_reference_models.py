#!/usr/bin/env python3
"""Writes the Hugging Face reference models the model loaders are tested against
(`crates/nn/tests/hf_models.rs`): small, randomly initialised configurations of the reference
architectures, saved by `transformers` itself (`save_pretrained`: `config.json` and the weights as
safetensors, sharded the way large checkpoints are), beside what the reference implementation
computes from them:

    python3 scripts/hf_reference_models.py tests/data/hf

For GPT-2 (`gpt2/`): `GPT2LMHeadModel` (2 layers, width 64, 4 heads, vocabulary 512, context
128), its weights in shards of at most 200 kB with `model.safetensors.index.json`, and
`reference.safetensors` holding, for each case `{b}x{l}` (batch × length: 1x1, 1x7, 2x16,
3x33), the token ids `ids/{b}x{l}` (int64) and the logits `logits/{b}x{l}` (float32) in eval mode;
one training step on the 2x16 ids in float64 (the first 15 tokens predicting the next:
`step/loss`, and each parameter's gradient `grad/{name}`);
`prompt` (int64, [1, 5]) and the 64 tokens greedy decoding appends to it, with the key/value
cache (`greedy/cache`) and without (`greedy/nocache`), from `generate`; a byte-level BPE
tokenizer of 512 tokens trained on Debian's fortune files (`tokenizer.json`, as
`save_pretrained` writes it), a text prompt's ids (`text/ids`) and the 24 tokens greedy
decoding appends (`text/greedy`), and in `reference_text.txt` the prompt and the decoded
output, one per line. It also prints the
smallest gap between the best and second-best logit along the greedy path (a near-tie there
would make any other implementation's choice a coin toss).

For Llama (`llama/`): `LlamaForCausalLM` (2 layers, width 64, 4 query heads sharing 2
key/value heads, MLP width 176, vocabulary 512, context 128, an untied output layer), in one
file, and `reference.safetensors` with the same cases as GPT-2's (no tokenizer).

For BERT (`bert/`): `BertModel` (2 layers, width 64, 4 heads, MLP width 128, vocabulary
512, 128 positions, with the pooler), one file, a WordPiece tokenizer of 512 tokens trained on
the fortunes (`tokenizer.json`, as `save_pretrained` writes it), and `reference.safetensors`
with, for each case `{b}x{l}`, the ids, the attention mask (`mask/`, int64: later sequences of
a batch are shorter and padded), the token types (`types/`, 0 and 1 at random),
`last_hidden_state` (`hidden/`), `pooler_output` (`pooled/`) and the sentence embeddings
(`embeddings/`: mean pooling over the mask, then L2 normalisation, as `sentence-transformers`
computes them); and four sentences through the tokenizer, padded to the longest (`text/ids`,
`text/mask`, `text/embeddings`), the sentences in `reference_text.txt`, one per line.

Needs torch, transformers and safetensors (PyPI) and the fortunes (Debian: fortunes).
Deterministic: seeded, CPU, float32.
"""
import contextlib
import os
import sys

import torch
from safetensors.torch import save_file


@contextlib.contextmanager
def float64_throughout():
    """Llama's RMSNorm and rotary embeddings compute in float32 whatever the model's dtype (an
    upcast meant for 16-bit models, a downcast in a float64 one): for the float64 reference
    they compute in the input's dtype instead (the same formulas; the rotary frequencies are
    the float32 buffer's values either way)."""
    from transformers.models.llama import modeling_llama as ml

    def rms(self, h):
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))

    def rope(self, x, position_ids):
        freqs = position_ids[..., None].to(x.dtype) * self.inv_freq.to(x.device, x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    saved = (ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward)
    ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward = rms, rope
    try:
        yield
    finally:
        ml.LlamaRMSNorm.forward, ml.LlamaRotaryEmbedding.forward = saved


def reference_outputs(model, vocab, name):
    """Logits for a few batch sizes and lengths, and 64 greedy tokens after a prompt with the
    cache and without; prints the smallest greedy margin."""
    ref = {}
    gen = torch.Generator().manual_seed(1)
    for b, l in [(1, 1), (1, 7), (2, 16), (3, 33)]:
        ids = torch.randint(0, vocab, (b, l), generator=gen)
        with torch.no_grad():
            logits = model(ids).logits
        ref[f"ids/{b}x{l}"] = ids
        ref[f"logits/{b}x{l}"] = logits.contiguous()
    prompt = torch.randint(0, vocab, (1, 5), generator=gen)
    ref["prompt"] = prompt
    for key, cache in (("cache", True), ("nocache", False)):
        with torch.no_grad():
            seq = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=64,
                do_sample=False,
                use_cache=cache,
                pad_token_id=0,
            )
        ref[f"greedy/{key}"] = seq[:, prompt.shape[1]:].contiguous()
    # One training step's loss and gradients: the 2x16 case's first 15 tokens predicting the
    # next (mean cross-entropy), every parameter's gradient (dropout off: evaluation mode), in
    # float64 (a copy of the model: float32's own rounding moves these gradients by up to
    # 3e-5 of their size at this initialisation, PyTorch's as much as any).
    import copy
    wide = copy.deepcopy(model).double()
    ids = ref["ids/2x16"]
    with float64_throughout():
        logits = wide(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                                 ids[:, 1:].reshape(-1))
        loss.backward()
    ref["step/loss"] = loss.detach().reshape(1)
    for n, p in wide.named_parameters():
        ref[f"grad/{n}"] = p.grad.detach().contiguous()
    del wide
    with torch.no_grad():
        logits = model(torch.cat([prompt, ref["greedy/cache"]], dim=1)).logits[0, 4:-1]
    top2 = logits.topk(2, dim=-1).values
    distinct = len(set(ref["greedy/cache"][0].tolist()))
    print(f"{name}: smallest greedy margin {float((top2[:, 0] - top2[:, 1]).min()):.4g}, "
          f"{distinct} distinct tokens of 64")
    return ref


def llama(out):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        # As for GPT-2: wide enough that greedy decoding moves between tokens.
        initializer_range=0.5,
    )
    model = LlamaForCausalLM(cfg).eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_file(reference_outputs(model, cfg.vocab_size, "llama"),
              os.path.join(out, "reference.safetensors"))


def gpt2(out):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=512,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        bos_token_id=None,
        eos_token_id=None,
        # Wider than GPT-2's 0.02: with the default, the blocks barely move the residual
        # stream, the tied head predicts the input token again, and greedy decoding repeats one
        # token (a weak check). At 0.5 it visits 37 distinct tokens in 64, none near a tie.
        initializer_range=0.5,
    )
    model = GPT2LMHeadModel(cfg).eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="200KB")
    ref = reference_outputs(model, cfg.vocab_size, "gpt2")
    # A text prompt through the tokenizer, and the greedy continuation decoded.
    tok = byte_level_tokenizer(out, cfg.vocab_size)
    text = "The quick brown fox, said the Oracle, never reads fortunes."
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        seq = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=24,
            do_sample=False,
            pad_token_id=0,
        )
    ref["text/ids"] = ids
    ref["text/greedy"] = seq[:, ids.shape[1]:].contiguous()
    with open(os.path.join(out, "reference_text.txt"), "w") as f:
        f.write(text + "\n" + tok.decode(seq[0]) + "\n")
    save_file(ref, os.path.join(out, "reference.safetensors"))


FORTUNES = "/usr/share/games/fortunes"


def fortune_files():
    """Debian's fortune files (the text, not the `.dat` indexes), sorted."""
    return sorted(
        os.path.join(FORTUNES, f)
        for f in os.listdir(FORTUNES)
        if os.path.isfile(os.path.join(FORTUNES, f)) and not f.endswith(".dat")
    )


def byte_level_tokenizer(out, vocab_size):
    """A byte-level BPE tokenizer (GPT-2's kind) of `vocab_size` tokens trained on Debian's
    fortune files, saved by transformers beside the model (`tokenizer.json`); returns it."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train(fortune_files(), vocab_size=vocab_size, min_frequency=2, show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    tok.save_pretrained(out)
    return tok


def sentence_embeddings(hidden, mask):
    """`sentence-transformers`' mean pooling and normalisation."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)


SENTENCES = [
    "A fortune cookie is a cookie with a fortune inside.",
    "You will be hungry again in one hour.",
    "The cookie said nothing, as cookies do.",
    "Never trust a computer you can't throw out a window.",
]


def bert(out):
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        initializer_range=0.2,
    )
    model = BertModel(cfg, add_pooling_layer=True).eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    ref = {}
    gen = torch.Generator().manual_seed(2)
    for b, l in [(1, 1), (1, 7), (2, 16), (3, 33)]:
        ids = torch.randint(0, cfg.vocab_size, (b, l), generator=gen)
        mask = torch.ones(b, l, dtype=torch.int64)
        for i in range(1, b):
            mask[i, l - 5 * i:] = 0
        types = torch.randint(0, 2, (b, l), generator=gen)
        with torch.no_grad():
            o = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        key = f"{b}x{l}"
        ref[f"ids/{key}"] = ids
        ref[f"mask/{key}"] = mask
        ref[f"types/{key}"] = types
        ref[f"hidden/{key}"] = o.last_hidden_state.contiguous()
        ref[f"pooled/{key}"] = o.pooler_output.contiguous()
        ref[f"embeddings/{key}"] = sentence_embeddings(o.last_hidden_state, mask)
    # Sentences through a WordPiece tokenizer trained on the fortunes.
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train(fortune_files(), vocab_size=cfg.vocab_size, min_frequency=2, show_progress=False)
    # The trainer lists the word-continuing letters (`##a`, …) in a hash set's order, which
    # changes from run to run: sorted here (in the same places), the file is the same each time.
    by_id = sorted(wp.get_vocab().items(), key=lambda kv: kv[1])
    slots = [i for i, (t, _) in enumerate(by_id) if t.startswith("##") and len(t) == 3]
    letters = sorted(by_id[i][0] for i in slots)
    for i, t in zip(slots, letters):
        by_id[i] = (t, by_id[i][1])
    wp = BertWordPieceTokenizer(dict(by_id), lowercase=True)
    tok = BertTokenizerFast(tokenizer_object=wp._tokenizer)
    tok.save_pretrained(out)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        o = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    ref["text/ids"] = enc["input_ids"]
    ref["text/mask"] = enc["attention_mask"]
    ref["text/embeddings"] = sentence_embeddings(o.last_hidden_state, enc["attention_mask"])
    with open(os.path.join(out, "reference_text.txt"), "w") as f:
        f.write("\n".join(SENTENCES) + "\n")
    save_file(ref, os.path.join(out, "reference.safetensors"))


def main(root):
    gpt2(os.path.join(root, "gpt2"))
    llama(os.path.join(root, "llama"))
    bert(os.path.join(root, "bert"))


if __name__ == "__main__":
    main(sys.argv[1])
