#!/usr/bin/env python3
"""PyTorch counterpart of the character GPT example (`examples/char_gpt.rs`): the same data (Debian's
fortune files, split 90/10 by document), the same model (pre-norm TransformerEncoderLayer blocks with
GELU, learned positions, the output tied to the token embedding, parameter names as arenagrad's), the
same recipe (AdamW with decay on the blocks' matrices only, warmup then cosine to lr/10, clipping at 1).
Prints the time per step and tokens/s, the validation loss over the whole validation text, and the
tokens/s of generation at batch 1 with a key/value cache:

    python3 scripts/torch_char_gpt.py [--steps 1500] [--seed 0] [--threads 2]

With `--init OUT` it writes its initial weights to a safetensors file and takes batches in the fixed
order arenagrad's `TextCorpus::fixed_batch` defines, printing `step S loss L` every --log-every steps,
so that arenagrad can run the same training from the same weights:

    python3 scripts/torch_char_gpt.py --init /tmp/gpt-init.safetensors --steps 100 --dropout 0 \\
        --log-every 1 > torch.txt
    cargo run --release --example char_gpt -- --init /tmp/gpt-init.safetensors --order fixed \\
        --steps 100 --dropout 0 --log-every 1 --generate 0 | grep '^step [0-9]* loss' > arenagrad.txt

`--bench` times training steps and generation only (no full run). Needs torch (and safetensors for
--init).
"""
import argparse, math, os, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


def fortune_docs(folder):
    """Documents of the fortune files, files in name order, each read once (links skipped)."""
    seen, docs = set(), []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith(".dat") or os.path.isdir(path):
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        text = open(real, "rb").read()
        start, at = 0, 0
        while at < len(text):
            nl = text.find(b"\n", at)
            end = len(text) if nl < 0 else nl + 1
            line = text[at:end]
            if line in (b"%\n", b"%", b"%\r\n"):
                if at > start:
                    docs.append(text[start:at])
                start = end
            at = end
        if start < len(text):
            docs.append(text[start:])
    return [d for d in docs if d.strip()]


def corpus(folder, valid_every=10):
    train, valid = bytearray(), bytearray()
    for i, d in enumerate(fortune_docs(folder)):
        out = valid if i % valid_every == valid_every - 1 else train
        out += d
        if not d.endswith(b"\n"):
            out += b"\n"
        out += b"%\n"
    return torch.tensor(list(train), dtype=torch.long), torch.tensor(list(valid), dtype=torch.long)


def fixed_starts(n_windows, step, batch):
    return [((step * batch + b) * 104729) % n_windows for b in range(batch)]


def windows(text, starts, context):
    idx = torch.tensor(starts).unsqueeze(1) + torch.arange(context + 1).unsqueeze(0)
    w = text[idx]
    return w[:, :-1], w[:, 1:]


class Gpt(nn.Module):
    def __init__(self, vocab, context, layers, heads, dim, dropout):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.pos_emb = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, activation="gelu", batch_first=True,
                                       norm_first=True)
            for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        resid = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = resid if name.endswith("out_proj.weight") or name.endswith("linear2.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "norm" in name or name.startswith("ln_f"):
                nn.init.constant_(p, 1.0 if name.endswith("weight") else 0.0)
            else:
                nn.init.zeros_(p)

    def forward(self, x):
        t = x.shape[1]
        h = self.drop(self.tok_emb(x) + self.pos_emb(torch.arange(t)))
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for b in self.blocks:
            h = b(h, src_mask=mask, is_causal=True)
        return self.ln_f(h) @ self.tok_emb.weight.T

    @torch.no_grad()
    def generate(self, prompt, n, temperature, top_k, gen):
        """One token per step with each block's keys and values cached."""
        dim = self.tok_emb.weight.shape[1]
        ctx = self.pos_emb.weight.shape[0]
        caches = [[None, None] for _ in self.blocks]
        text, pending, past, out = list(prompt), list(prompt[-ctx:]), 0, []
        for _ in range(n):
            if past + len(pending) > ctx:
                caches = [[None, None] for _ in self.blocks]
                pending, past = text[-(ctx // 2):], 0
            x = torch.tensor([pending])
            t = x.shape[1]
            h = self.tok_emb(x) + self.pos_emb(torch.arange(past, past + t))
            for b, c in zip(self.blocks, caches):
                a = b.self_attn
                heads = a.num_heads
                y = b.norm1(h)
                q, k, v = F.linear(y, a.in_proj_weight, a.in_proj_bias).split(dim, dim=-1)
                q, k, v = (z.view(1, t, heads, dim // heads).transpose(1, 2) for z in (q, k, v))
                c[0] = k if c[0] is None else torch.cat([c[0], k], 2)
                c[1] = v if c[1] is None else torch.cat([c[1], v], 2)
                o = F.scaled_dot_product_attention(q, c[0], c[1], is_causal=(past == 0 and t > 1))
                h = h + a.out_proj(o.transpose(1, 2).reshape(1, t, dim))
                h = h + b.linear2(F.gelu(b.linear1(b.norm2(h))))
            logits = (self.ln_f(h[:, -1]) @ self.tok_emb.weight.T)[0]
            past += t
            if temperature == 0:
                tok = int(logits.argmax())
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            out.append(tok)
            text.append(tok)
            pending = [tok]
        return out


def lr_at(step, base, warmup, total, floor):
    """WarmupCosineLr of arenagrad (optim/schedule.rs), the same formula."""
    if step < warmup:
        return base * (step + 1) / warmup
    if step >= total:
        return floor
    p = (step - warmup) / (total - warmup)
    return floor + (base - floor) * (1 + math.cos(math.pi * p)) / 2


def param_groups(model, wd):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("blocks.")]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and n.startswith("blocks."))]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def valid_loss(model, valid, context, batch):
    n = len(valid) - context
    starts = list(range(0, n, context))
    if starts[-1] != n - 1 and n > context:
        starts.append(n - 1)
    total = 0.0
    for i in range(0, len(starts), batch):
        chunk = starts[i:i + batch]
        x, y = windows(valid, chunk, context)
        total += F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item() * len(chunk)
    return total / len(starts), len(starts)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/games/fortunes")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", help="write the initial weights here and take batches in the fixed order")
    p.add_argument("--log-every", type=int)
    p.add_argument("--generate", type=int, default=400)
    p.add_argument("--bench", action="store_true", help="time 20 training steps and generation only")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if not os.path.isdir(a.data):
        sys.exit(f"{a.data} not found: install Debian's `fortunes` package")
    train, valid = corpus(a.data)
    model = Gpt(256, a.context, a.layers, a.heads, a.dim, a.dropout)
    if a.init:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, a.init)
    opt = torch.optim.AdamW(param_groups(model, a.weight_decay), lr=a.lr, weight_decay=a.weight_decay)
    steps = 25 if a.bench else a.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(s, a.lr, min(a.warmup, a.steps), a.steps, a.lr / 10) / a.lr)
    n_windows = len(train) - a.context
    times = []
    print(f"torch char-gpt: {sum(p.numel() for p in model.parameters())} parameters, "
          f"{len(train)} / {len(valid)} bytes, batch {a.batch}, {a.threads} threads", file=sys.stderr)
    gen = torch.Generator().manual_seed(a.seed)
    for step in range(steps):
        model.train()
        if a.init:
            starts = fixed_starts(n_windows, step, a.batch)
        else:
            starts = torch.randint(0, n_windows, (a.batch,), generator=gen).tolist()
        x, y = windows(train, starts, a.context)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
        if a.log_every and step % a.log_every == 0:
            print(f"step {step} loss {loss.item():.6f}")
    warm = sorted(times[5:]) if len(times) > 5 else sorted(times)
    med = warm[len(warm) // 2]
    print(f"torch step: {med * 1e3:.1f} ms median ({a.batch * a.context / med:.0f} tokens/s)")
    model.eval()
    if not a.bench:
        v, nw = valid_loss(model, valid, a.context, a.batch)
        print(f"torch validation loss over the whole validation text ({nw} windows): {v:.4f}")
    if a.generate:
        prompt = list(b"The meaning of life is")
        model.generate(prompt, 10, 0.8, 40, gen)
        t0 = time.perf_counter()
        out = model.generate(prompt, a.generate, 0.8, 40, gen)
        s = time.perf_counter() - t0
        print(f"torch generation: {len(out) / s:.0f} tokens/s (batch 1, key/value cache)")
        if not a.bench:
            print(bytes(prompt + out).decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
