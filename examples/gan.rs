//! The GAN step from the PyTorch paper, on a 2-D mixture of 8 Gaussians.
//!
//! Each iteration: the discriminator's loss on real data and on a *detached* fake batch (two
//! backward passes; the detach keeps the generator out of the discriminator's step), the
//! discriminator's optimiser steps; then the generator's loss through the discriminator (a third
//! backward pass) and the generator's optimiser steps. Writes `gan.png`: real vs. generated
//! samples and the two loss curves, and prints how many of the 8 modes the generator covers.
//!
//! `cargo run --release --example gan -- [--steps 3000] [--out gan.png] [--seed 0]`

use arenagrad::nn::optim::{Adam, AdamConfig, Optimizer};
use arenagrad::nn::{loss, LeakyReLU, Linear, Module, NnError, Rng, Sequential};
use arenagrad::prelude::*;

#[path = "common/font.rs"]
mod font;

/// Mode centres: 8 points on a circle of radius 2.
pub fn modes() -> Vec<(f64, f64)> {
    (0..8)
        .map(|k| {
            let a = k as f64 * std::f64::consts::PI / 4.0;
            (2.0 * a.cos(), 2.0 * a.sin())
        })
        .collect()
}

const MODE_STD: f64 = 0.05;
const LATENT: usize = 8;

fn real_batch(rng: &mut Rng, n: usize) -> Vec<f32> {
    let m = modes();
    let mut v = Vec::with_capacity(2 * n);
    for _ in 0..n {
        let (cx, cy) = m[rng.below(8)];
        v.push((cx + MODE_STD * rng.normal()) as f32);
        v.push((cy + MODE_STD * rng.normal()) as f32);
    }
    v
}

fn mlp(sizes: &[usize], rng: &mut Rng) -> Result<Sequential, NnError> {
    let mut s = Sequential::new();
    for w in sizes.windows(2) {
        s = s.add(Linear::new(w[0], w[1], rng)?);
        if w[1] != *sizes.last().expect("non-empty") {
            s = s.add(LeakyReLU::new(0.2));
        }
    }
    Ok(s)
}

/// What a training run leaves behind.
pub struct GanRun {
    /// Generated samples after training, `(x, y)`.
    pub samples: Vec<(f64, f64)>,
    /// Discriminator and generator losses per step.
    pub d_loss: Vec<f64>,
    /// Generator loss per step.
    pub g_loss: Vec<f64>,
}

/// Trains for `steps` iterations with batch 256.
pub fn train(steps: usize, seed: u64) -> Result<GanRun, NnError> {
    train_with(steps, seed, |_, _, _| {})
}

/// [`train`], calling `report(step, d_loss, g_loss)` after every step.
pub fn train_with(
    steps: usize,
    seed: u64,
    mut report: impl FnMut(usize, f64, f64),
) -> Result<GanRun, NnError> {
    let mut rng = Rng::seed(seed);
    let gen = mlp(&[LATENT, 128, 128, 2], &mut rng)?;
    let disc = mlp(&[2, 128, 128, 1], &mut rng)?;
    let cfg = AdamConfig::new(1e-3).betas(0.5, 0.999);
    let mut opt_g = Adam::new(gen.parameters(), cfg)?;
    let mut opt_d = Adam::new(disc.parameters(), cfg)?;
    let mut g = Graph::new();
    g.seed(seed);
    let batch = 256;
    let (mut d_hist, mut g_hist) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let real = g.from_slice(&real_batch(&mut rng, batch), &[batch, 2])?;
        let z = g.randn(&[batch, LATENT], DType::F32)?;
        let fake = gen.forward(&g, z)?;
        let ones = g.ones(&[batch, 1], DType::F32)?;
        let zeros = g.zeros(&[batch, 1], DType::F32)?;

        // Discriminator: real -> 1, detached fake -> 0. Two backward passes.
        opt_d.zero_grad();
        let d_real = loss::bce_with_logits(disc.forward(&g, real)?, ones)?;
        d_real.backward()?;
        let d_fake = loss::bce_with_logits(disc.forward(&g, fake.detach()?)?, zeros)?;
        d_fake.backward()?;
        opt_d.step()?;

        // Generator: make D call the fakes real — the third backward pass. A fresh forward
        // through D brings in its just-updated parameters; the gradient flows through D into G
        // (D's parameters also collect one, cleared by D's next zero_grad, as in PyTorch).
        opt_g.zero_grad();
        let g_loss = loss::bce_with_logits(disc.forward(&g, fake)?, ones)?;
        g_loss.backward()?;
        opt_g.step()?;

        d_hist.push(d_real.item()? + d_fake.item()?);
        g_hist.push(g_loss.item()?);
        report(step + 1, d_hist[step], g_hist[step]);
        g.reset();
    }
    let n = 2000;
    let samples = {
        let _ng = g.no_grad();
        let z = g.randn(&[n, LATENT], DType::F32)?;
        let v = gen.forward(&g, z)?.to_vec::<f32>()?;
        v.chunks(2)
            .map(|p| (f64::from(p[0]), f64::from(p[1])))
            .collect()
    };
    g.reset();
    Ok(GanRun {
        samples,
        d_loss: d_hist,
        g_loss: g_hist,
    })
}

/// How many modes hold at least 2% of the samples within 0.5 of their centre.
pub fn modes_covered(samples: &[(f64, f64)]) -> usize {
    modes()
        .iter()
        .filter(|(cx, cy)| {
            let near = samples
                .iter()
                .filter(|(x, y)| (x - cx).hypot(y - cy) < 0.5)
                .count();
            near * 50 >= samples.len()
        })
        .count()
}

#[allow(dead_code)]
fn plot(run: &GanRun, path: &str) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    font::register()?;
    let root = BitMapBackend::new(path, (1400, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(640);
    let mut rng = Rng::seed(99);
    let real = real_batch(&mut rng, 1000);
    let mut chart = ChartBuilder::on(&left)
        .caption(
            format!(
                "Samples: {} of 8 modes covered",
                modes_covered(&run.samples)
            ),
            ("sans-serif", 24),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(48)
        .build_cartesian_2d(-3.0f64..3.0, -3.0f64..3.0)?;
    chart
        .configure_mesh()
        .x_desc("x")
        .y_desc("y")
        .label_style(("sans-serif", 15))
        .draw()?;
    chart
        .draw_series(real.chunks(2).map(|p| {
            Circle::new(
                (f64::from(p[0]), f64::from(p[1])),
                2,
                BLUE.mix(0.4).filled(),
            )
        }))?
        .label("real (8 Gaussians on a ring)")
        .legend(|(x, y)| Circle::new((x + 10, y), 4, BLUE.filled()));
    chart
        .draw_series(
            run.samples
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 2, RED.mix(0.4).filled())),
        )?
        .label("generated")
        .legend(|(x, y)| Circle::new((x + 10, y), 4, RED.filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    let hi = run
        .d_loss
        .iter()
        .chain(&run.g_loss)
        .cloned()
        .fold(0.0f64, f64::max)
        .min(5.0);
    let steps = run.d_loss.len().max(1);
    let mut lc = ChartBuilder::on(&right)
        .caption("Losses per step", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0..steps, 0.0..hi)?;
    lc.configure_mesh()
        .x_desc("step")
        .y_desc("binary cross-entropy")
        .label_style(("sans-serif", 15))
        .draw()?;
    lc.draw_series(LineSeries::new(
        run.d_loss.iter().enumerate().map(|(i, &v)| (i, v.min(hi))),
        BLUE,
    ))?
    .label("discriminator (real + fake)")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    lc.draw_series(LineSeries::new(
        run.g_loss.iter().enumerate().map(|(i, &v)| (i, v.min(hi))),
        RED,
    ))?
    .label("generator")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    lc.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

/// Trains the GAN of the PyTorch paper on a ring of 8 Gaussians and plots its samples.
#[derive(Debug, clap::Parser)]
#[command(name = "gan")]
#[allow(dead_code)] // tests/gan_modes.rs includes this file without calling main
struct Args {
    /// Training steps (one discriminator and one generator update each)
    #[arg(long, default_value_t = 3000, value_parser = setup::positive)]
    steps: usize,
    /// Seed of the weights and the noise
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the picture (PNG)
    #[arg(long, default_value = "gan.png")]
    out: String,
}

#[path = "common/setup.rs"]
mod setup;

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    use clap::Parser;
    let Args { steps, seed, out } = Args::parse();
    // Every argument is checked before any work.
    setup::check_writable("the picture", "--out", out.as_ref())?;
    let t0 = std::time::Instant::now();
    let every = (steps / 10).max(1);
    let run = train_with(steps, seed, |step, d, gl| {
        if step % every == 0 || step == steps {
            eprintln!(
                "step {step}/{steps}: D loss {d:.3}, G loss {gl:.3} ({:.1} s)",
                t0.elapsed().as_secs_f64()
            );
        }
    })?;
    println!(
        "{steps} steps in {:.1} s; final D loss {:.3}, G loss {:.3}; modes covered: {}/8",
        t0.elapsed().as_secs_f64(),
        run.d_loss.last().copied().unwrap_or(f64::NAN),
        run.g_loss.last().copied().unwrap_or(f64::NAN),
        modes_covered(&run.samples)
    );
    plot(&run, &out).map_err(|e| setup::write_failed("the picture", "--out", out.as_ref(), e))?;
    println!("wrote {out} (left: real samples and generated ones; right: the two losses per step)");
    Ok(())
}
