//! The leak-check loop, in arenagrad:
//!
//! ```text
//! for i in range(N):
//!     x = randn(1024, 1024, requires_grad=True)
//!     y = (x @ x).sum()
//!     y.backward()
//! ```
//!
//! Prints resident memory and the arena's statistics every 100 iterations: both stay flat,
//! because each iteration's graph and buffers are freed by one reset.
//!
//! `cargo run --release --example leak_check -- [--iters N] [--size N] [--no-backward]`

use std::time::Instant;

use arenagrad::prelude::*;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |pages| pages * 4096.0 / (1 << 20) as f64)
}

/// The leak-check loop: `(x @ x).sum().backward()` on a fresh `randn` input each iteration,
/// printing resident memory as it goes.
#[derive(Debug, clap::Parser)]
#[command(name = "leak_check")]
struct Args {
    /// Iterations
    #[arg(long, default_value_t = 1000, value_parser = setup::positive)]
    iters: usize,
    /// The input's side (an n×n matrix)
    #[arg(long, default_value_t = 1024, value_parser = setup::positive)]
    size: usize,
    /// Skip backward (the graph is then never consumed: the reset must still free it)
    #[arg(long)]
    no_backward: bool,
}

#[path = "common/setup.rs"]
mod setup;

fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn run() -> Result<(), GraphError> {
    use clap::Parser;
    let a = Args::parse();
    let (iters, n, backward) = (a.iters, a.size, !a.no_backward);
    let mut g = Graph::new();
    println!("randn-matmul loop: randn({n}, {n}) -> (x @ x).sum() -> backward={backward}, {iters} iterations, {} threads", g.threads());
    println!(
        "{:>6} {:>10} {:>12} {:>14} {:>14} {:>10}",
        "iter", "RSS MiB", "ms/iter", "arena peak MiB", "arena cap MiB", "resets"
    );
    let mut t0 = Instant::now();
    for i in 1..=iters {
        let x = g.randn(&[n, n], DType::F32)?.set_requires_grad(true)?;
        let y = x.matmul(x)?.sum()?;
        if backward {
            y.backward()?;
        }
        g.reset();
        if i % 100 == 0 || i == iters {
            let s = g.stats().arena;
            let done = if i % 100 == 0 { 100 } else { i % 100 };
            println!(
                "{i:>6} {:>10.1} {:>12.2} {:>14.1} {:>14.1} {:>10}",
                rss_mib(),
                t0.elapsed().as_secs_f64() * 1e3 / done as f64,
                s.peak_bytes_bumped as f64 / (1 << 20) as f64,
                s.capacity as f64 / (1 << 20) as f64,
                s.resets
            );
            t0 = Instant::now();
        }
    }
    Ok(())
}
