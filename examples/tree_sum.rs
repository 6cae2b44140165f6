//! A recursive network that learns to evaluate arithmetic expressions: each training example is
//! a random expression tree over the digits 0–9 with `+` and `−` (`(7 − (2 + 5)) + 3`), and the
//! network's graph follows that tree — a digit's embedding at each leaf, and at each operator a
//! learned composition of its two children's vectors (one per operator). The graph's shape is
//! different for every example: the case a static-graph engine can only run by padding trees to
//! one shape; here it is a loop over the tree's nodes in ordinary Rust.
//!
//! ```text
//! cargo run --release --example tree_sum -- [--steps 20000] [--batch 16] [--dim 64]
//!     [--max-leaves 6] [--lr 3e-3] [--eval 1000] [--seed 0]
//! ```
//!
//! The network reads the value off the root's vector (a linear head, trained by mean square on
//! value / 10, Adam with the learning rate annealed by a cosine). It prints the training loss and, on held-out expressions, the share evaluated
//! exactly (the prediction rounded to the nearest integer) — also on expressions longer than any
//! it trained on — with examples per second; `scripts/torch_tree_sum.py` is the same program in
//! PyTorch, for its examples per second.

use std::time::Instant;

use arenagrad::nn::optim::{Adam, AdamConfig, CosineAnnealingLr, LrSchedule, Optimizer};
use arenagrad::nn::{Embedding, Linear, Module, NnError, Rng, Visitor};
use arenagrad::prelude::*;

#[path = "common/setup.rs"]
mod setup;
use clap::Parser;

/// Trains a recursive network to evaluate arithmetic expressions.
#[derive(Debug, Parser)]
#[command(name = "tree_sum")]
struct Args {
    /// Training steps
    #[arg(long, default_value_t = 20000, value_parser = positive)]
    steps: usize,
    /// Expressions per step
    #[arg(long, default_value_t = 16, value_parser = positive)]
    batch: usize,
    /// Width of the node vectors
    #[arg(long, default_value_t = 64, value_parser = positive)]
    dim: usize,
    /// Most digits in a training expression
    #[arg(long, default_value_t = 6, value_parser = positive)]
    max_leaves: usize,
    /// Adam's learning rate
    #[arg(long, default_value_t = 3e-3, value_parser = setup::positive_real)]
    lr: f64,
    /// Held-out expressions per evaluation
    #[arg(long, default_value_t = 1000, value_parser = positive)]
    eval: usize,
    /// Seed of the weights and the expressions
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

use setup::positive;

/// An expression tree's node; children come before their parent (the order evaluation takes).
#[derive(Debug, Clone, Copy)]
enum Node {
    Digit(usize),
    /// `left ± right` (true: `+`), children by index.
    Op(bool, usize, usize),
}

/// A random expression of 1 to `max_leaves` digits: digits are joined pairwise at random
/// adjacent positions, with `+` or `−`, until one tree is left.
fn expression(max_leaves: usize, rng: &mut Rng) -> Vec<Node> {
    let leaves = 1 + rng.below(max_leaves);
    let mut nodes: Vec<Node> = (0..leaves).map(|_| Node::Digit(rng.below(10))).collect();
    let mut roots: Vec<usize> = (0..leaves).collect();
    while roots.len() > 1 {
        let k = rng.below(roots.len() - 1);
        nodes.push(Node::Op(rng.below(2) == 0, roots[k], roots[k + 1]));
        roots[k] = nodes.len() - 1;
        roots.remove(k + 1);
    }
    nodes
}

fn value(e: &[Node]) -> f64 {
    let mut v = vec![0.0; e.len()];
    for (i, n) in e.iter().enumerate() {
        v[i] = match *n {
            Node::Digit(d) => d as f64,
            Node::Op(plus, l, r) => {
                if plus {
                    v[l] + v[r]
                } else {
                    v[l] - v[r]
                }
            }
        };
    }
    v[e.len() - 1]
}

fn show(e: &[Node]) -> String {
    let mut s: Vec<String> = Vec::with_capacity(e.len());
    for n in e {
        let t = match *n {
            Node::Digit(d) => d.to_string(),
            Node::Op(plus, l, r) => format!("({} {} {})", s[l], if plus { '+' } else { '−' }, s[r]),
        };
        s.push(t);
    }
    let root = s.pop().unwrap_or_default();
    root.strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .map_or(root.clone(), str::to_string)
}

/// Digit embeddings, one composition per operator, and a head reading the value.
struct TreeNet {
    digits: Embedding,
    plus: Linear,
    minus: Linear,
    head: Linear,
}

impl TreeNet {
    fn new(dim: usize, rng: &mut Rng) -> Result<Self, NnError> {
        Ok(TreeNet {
            digits: Embedding::new(10, dim, rng)?,
            plus: Linear::new(2 * dim, dim, rng)?,
            minus: Linear::new(2 * dim, dim, rng)?,
            head: Linear::new(dim, 1, rng)?,
        })
    }

    /// The predicted value / 10 of each expression, `[n, 1]`: one graph following every tree.
    fn forward<'g>(&self, g: &'g Graph, exprs: &[Vec<Node>]) -> Result<Tensor<'g>, NnError> {
        let mut roots = Vec::with_capacity(exprs.len());
        for e in exprs {
            let mut h: Vec<Tensor<'g>> = Vec::with_capacity(e.len());
            for n in e {
                let v = match *n {
                    Node::Digit(d) => self.digits.lookup(g, &[d], &[1])?,
                    Node::Op(plus, l, r) => {
                        let both = g.concat(&[h[l], h[r]], 1)?;
                        let f = if plus { &self.plus } else { &self.minus };
                        f.forward(g, both)?.tanh()?
                    }
                };
                h.push(v);
            }
            roots.push(h[e.len() - 1]);
        }
        let roots = g.concat(&roots, 0)?;
        self.head.forward(g, roots)
    }
}

impl Module for TreeNet {
    fn forward<'g>(&self, _g: &'g Graph, x: Tensor<'g>) -> arenagrad::nn::Result<Tensor<'g>> {
        Ok(x)
    }
    fn visit(&self, v: &mut Visitor<'_>) {
        v.child("digits", &self.digits);
        v.child("plus", &self.plus);
        v.child("minus", &self.minus);
        v.child("head", &self.head);
    }
}

/// The share of `exprs` evaluated exactly and the mean absolute error, 100 expressions at a
/// time in scopes.
fn evaluate(net: &TreeNet, g: &Graph, exprs: &[Vec<Node>]) -> Result<(f64, f64), NnError> {
    let (mut exact, mut abs) = (0usize, 0.0);
    for chunk in exprs.chunks(100) {
        let pred = g.try_scope(|g| -> Result<HostTensor, NnError> {
            Ok(net.forward(g, chunk)?.to_host()?)
        })?;
        for (e, p) in chunk.iter().zip(pred.data().to_f64_vec()) {
            let (want, got) = (value(e), 10.0 * p);
            exact += usize::from(got.round() == want);
            abs += (got - want).abs();
        }
    }
    Ok((exact as f64 / exprs.len() as f64, abs / exprs.len() as f64))
}

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn run() -> Result<(), NnError> {
    let args = Args::parse();
    let mut rng = Rng::seed(args.seed);
    let net = TreeNet::new(args.dim, &mut rng)?;
    let mut opt = Adam::new(net.parameters(), AdamConfig::new(args.lr))?;
    let schedule = CosineAnnealingLr::new(args.lr, args.steps, args.lr / 100.0)?;
    let mut data = Rng::seed(args.seed ^ 0x7EE5);
    let held_out: Vec<Vec<Node>> = (0..args.eval)
        .map(|_| expression(args.max_leaves, &mut data))
        .collect();
    let longer: Vec<Vec<Node>> = (0..args.eval)
        .map(|_| {
            let mut e = expression(args.max_leaves + 3, &mut data);
            while e.len() < 2 * args.max_leaves + 1 {
                e = expression(args.max_leaves + 3, &mut data);
            }
            e
        })
        .collect();
    let mut g = Graph::new();
    println!(
        "arenagrad tree-sum: {} parameters (width {}), expressions of 1–{} digits with + and −, \
         batch {}, Adam lr {}, {} threads",
        net.num_parameters(),
        args.dim,
        args.max_leaves,
        args.batch,
        args.lr,
        g.threads()
    );
    let t0 = Instant::now();
    let (mut since, mut since_n, mut nodes, mut flops) = (0.0, 0usize, 0usize, 0.0f64);
    let mut eval_secs = 0.0;
    let report_every = (args.steps / 5).max(1);
    for step in 0..args.steps {
        let batch: Vec<Vec<Node>> = (0..args.batch)
            .map(|_| expression(args.max_leaves, &mut data))
            .collect();
        nodes += batch.iter().map(Vec::len).sum::<usize>();
        let targets: Vec<f64> = batch.iter().map(|e| value(e) / 10.0).collect();
        schedule.apply(&mut opt, step)?;
        opt.zero_grad();
        let pred = net.forward(&g, &batch)?;
        let want = g.from_f64(&targets, &[args.batch, 1], DType::F32)?;
        let l = pred.sub(want)?.square()?.mean()?;
        l.backward()?;
        since += l.item()?;
        since_n += 1;
        flops += g.stats().flops.total() as f64;
        g.reset();
        opt.step()?;
        if (step + 1) % report_every == 0 || step + 1 == args.steps {
            let te = Instant::now();
            let (acc, mae) = evaluate(&net, &g, &held_out)?;
            g.reset();
            eval_secs += te.elapsed().as_secs_f64();
            let secs = t0.elapsed().as_secs_f64() - eval_secs;
            println!(
                "step {}: train loss {:.4}  held-out exact {:.1}%  mean abs error {mae:.3}  {:.0} \
                 expressions/s  {:.0} tree nodes/s",
                step + 1,
                since / since_n as f64,
                100.0 * acc,
                ((step + 1) * args.batch) as f64 / secs,
                nodes as f64 / secs
            );
            (since, since_n) = (0.0, 0);
        }
    }
    let secs = t0.elapsed().as_secs_f64() - eval_secs;
    println!(
        "trained on {} expressions in {secs:.1} s (evaluations left out): {:.0} expressions/s, \
         {:.2} GFLOP/s (the graph's count)",
        args.steps * args.batch,
        (args.steps * args.batch) as f64 / secs,
        flops / secs / 1e9
    );
    let (acc, mae) = evaluate(&net, &g, &longer)?;
    g.reset();
    println!(
        "longer than any in training ({}–{} digits): exact {:.1}%, mean abs error {mae:.3}",
        args.max_leaves + 1,
        args.max_leaves + 3,
        100.0 * acc
    );
    println!("\nheld-out examples:");
    for e in held_out.iter().filter(|e| e.len() > 6).take(6) {
        let p = g.try_scope(|g| -> Result<f64, NnError> {
            Ok(net.forward(g, std::slice::from_ref(e))?.item()?)
        })?;
        println!("  {} = {}   predicted {:.2}", show(e), value(e), 10.0 * p);
    }
    g.reset();
    Ok(())
}
