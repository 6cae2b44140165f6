//! A denoising diffusion model (DDPM, Ho et al. 2020) trained on Fashion-MNIST's real images,
//! then sampled from pure noise.
//!
//! The model is a small U-Net: residual blocks with group normalisation and a sinusoidal time
//! embedding added per channel, two stride-2 convolutions down (28 → 14 → 7), self-attention at
//! 7×7, transposed convolutions up with skip connections. Training draws a time step `t` per
//! image, noises the image to `√ᾱₜ·x + √(1−ᾱₜ)·ε` (1000 steps, β linear from 10⁻⁴ to 0.02) and
//! regresses ε (mean squared error, Adam); an exponential moving average of the weights
//! (decay 0.995) samples. Sampling runs the 1000 reverse steps of the paper's ancestral sampler.
//! Writes a grid of 64 samples beside the loss curve to `ddpm.png`.
//!
//! `cargo run --release --example ddpm -- [--steps 3000] [--batch 64] [--data DIR] [--out ddpm.png]`
//!
//! `--bench N` times N training steps on random images and prints ms per step (the figure
//! `scripts/torch_ddpm.py` prints for the same model in PyTorch).
//!
//! The data are the IDX files of Debian's `dataset-fashion-mnist` package.

use std::path::PathBuf;
use std::time::Instant;

use arenagrad::nn::optim::{Adam, AdamConfig, Optimizer};
use arenagrad::nn::{
    loss, Conv2d, Conv2dConfig, ConvTranspose2d, ConvTransposeConfig, GroupNorm, Linear, Module,
    MultiheadAttention, NnError, Rng,
};
use arenagrad::prelude::*;

#[path = "common/fashion.rs"]
#[allow(dead_code)]
mod fashion;
#[path = "common/font.rs"]
mod font;
#[path = "common/setup.rs"]
mod setup;

/// Diffusion steps.
const T: usize = 1000;
/// Width of the sinusoidal time features.
const TIME_FEATURES: usize = 64;
/// Width of the time embedding the blocks read.
const TIME_DIM: usize = 128;
/// Channel groups of every group normalisation.
const GROUPS: usize = 8;

/// The example's results.
pub type Res<T> = std::result::Result<T, NnError>;

/// GroupNorm → SiLU → conv 3×3, twice, the time embedding added per channel in between, and a
/// 1×1 convolution on the shortcut when the width changes.
#[derive(Module)]
#[module(forward = "Self::needs_time")]
struct ResBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    time: Linear,
    norm2: GroupNorm,
    conv2: Conv2d,
    skip: Option<Conv2d>,
}

fn conv3(cin: usize, cout: usize, stride: usize, rng: &mut Rng) -> Res<Conv2d> {
    Conv2d::with_config(
        cin,
        cout,
        (3, 3),
        Conv2dConfig::default().padding(1).stride(stride),
        rng,
    )
}

impl ResBlock {
    fn new(cin: usize, cout: usize, rng: &mut Rng) -> Res<Self> {
        Ok(ResBlock {
            norm1: GroupNorm::new(GROUPS, cin)?,
            conv1: conv3(cin, cout, 1, rng)?,
            time: Linear::new(TIME_DIM, cout, rng)?,
            norm2: GroupNorm::new(GROUPS, cout)?,
            conv2: conv3(cout, cout, 1, rng)?,
            skip: if cin == cout {
                None
            } else {
                Some(Conv2d::new(cin, cout, (1, 1), rng)?)
            },
        })
    }

    fn needs_time<'g>(&self, _g: &'g Graph, _x: Tensor<'g>) -> Res<Tensor<'g>> {
        Err(NnError::InvalidConfig {
            component: "ResBlock",
            reason: "a block takes a time embedding: call run(g, x, temb)".into(),
        })
    }

    fn run<'g>(&self, g: &'g Graph, x: Tensor<'g>, temb: Tensor<'g>) -> Res<Tensor<'g>> {
        let h = self.conv1.forward(g, self.norm1.forward(g, x)?.silu()?)?;
        let c = h.shape()[1] as isize;
        let h = h.add(self.time.forward(g, temb)?.reshape(&[-1, c, 1, 1])?)?;
        let h = self.conv2.forward(g, self.norm2.forward(g, h)?.silu()?)?;
        let shortcut = match &self.skip {
            Some(s) => s.forward(g, x)?,
            None => x,
        };
        Ok(h.add(shortcut)?)
    }
}

/// Self-attention over the positions of a feature map, residual, after a group normalisation.
#[derive(Module)]
struct AttnBlock {
    norm: GroupNorm,
    attn: MultiheadAttention,
}

impl AttnBlock {
    fn forward<'g>(&self, g: &'g Graph, x: Tensor<'g>) -> Res<Tensor<'g>> {
        let s = x.shape();
        let (b, c, h, w) = (s[0] as isize, s[1] as isize, s[2] as isize, s[3] as isize);
        let seq = self
            .norm
            .forward(g, x)?
            .reshape(&[b, c, h * w])?
            .permute(&[0, 2, 1])?;
        let y = self.attn.forward(g, seq)?.permute(&[0, 2, 1])?;
        Ok(x.add(y.reshape(&[b, c, h, w])?)?)
    }
}

/// The U-Net: 28×28 (c) → 14×14 (2c) → 7×7 (2c) with attention → back up with skips.
#[derive(Module)]
#[module(forward = "Self::needs_time")]
pub struct UNet {
    time1: Linear,
    time2: Linear,
    conv_in: Conv2d,
    down1: ResBlock,
    pool1: Conv2d,
    down2: ResBlock,
    pool2: Conv2d,
    mid1: ResBlock,
    mid_attn: AttnBlock,
    mid2: ResBlock,
    up2: ConvTranspose2d,
    up2_block: ResBlock,
    up1: ConvTranspose2d,
    up1_block: ResBlock,
    norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl UNet {
    /// A U-Net of `c` channels at full resolution (a multiple of 8), f32.
    pub fn new(c: usize, rng: &mut Rng) -> Res<Self> {
        let up = ConvTransposeConfig {
            stride: (2, 2),
            ..Default::default()
        };
        Ok(UNet {
            time1: Linear::new(TIME_FEATURES, TIME_DIM, rng)?,
            time2: Linear::new(TIME_DIM, TIME_DIM, rng)?,
            conv_in: conv3(1, c, 1, rng)?,
            down1: ResBlock::new(c, c, rng)?,
            pool1: conv3(c, 2 * c, 2, rng)?,
            down2: ResBlock::new(2 * c, 2 * c, rng)?,
            pool2: conv3(2 * c, 2 * c, 2, rng)?,
            mid1: ResBlock::new(2 * c, 2 * c, rng)?,
            mid_attn: AttnBlock {
                norm: GroupNorm::new(GROUPS, 2 * c)?,
                attn: MultiheadAttention::new(2 * c, 4, false, rng)?,
            },
            mid2: ResBlock::new(2 * c, 2 * c, rng)?,
            up2: ConvTranspose2d::new(2 * c, 2 * c, (2, 2), up, rng)?,
            up2_block: ResBlock::new(4 * c, 2 * c, rng)?,
            up1: ConvTranspose2d::new(2 * c, c, (2, 2), up, rng)?,
            up1_block: ResBlock::new(2 * c, c, rng)?,
            norm_out: GroupNorm::new(GROUPS, c)?,
            conv_out: conv3(c, 1, 1, rng)?,
        })
    }

    fn needs_time<'g>(&self, _g: &'g Graph, _x: Tensor<'g>) -> Res<Tensor<'g>> {
        Err(NnError::InvalidConfig {
            component: "UNet",
            reason: "the U-Net takes a time step: call predict_noise(g, x, t)".into(),
        })
    }

    /// The predicted noise of images `x` `[B, 1, 28, 28]` at time steps `t` (one per image).
    pub fn predict_noise<'g>(&self, g: &'g Graph, x: Tensor<'g>, t: &[usize]) -> Res<Tensor<'g>> {
        let feats = g.from_slice(&time_features(t), &[t.len(), TIME_FEATURES])?;
        let temb = self.time1.forward(g, feats)?.silu()?;
        let temb = self.time2.forward(g, temb)?.silu()?;
        let h0 = self.conv_in.forward(g, x)?;
        let h1 = self.down1.run(g, h0, temb)?; // c, 28
        let h2 = self.down2.run(g, self.pool1.forward(g, h1)?, temb)?; // 2c, 14
        let m = self.mid1.run(g, self.pool2.forward(g, h2)?, temb)?; // 2c, 7
        let m = self.mid2.run(g, self.mid_attn.forward(g, m)?, temb)?;
        let u2 = self.up2.forward(g, m)?; // 2c, 14
        let u2 = self.up2_block.run(g, g.concat(&[u2, h2], 1)?, temb)?;
        let u1 = self.up1.forward(g, u2)?; // c, 28
        let u1 = self.up1_block.run(g, g.concat(&[u1, h1], 1)?, temb)?;
        self.conv_out
            .forward(g, self.norm_out.forward(g, u1)?.silu()?)
    }
}

/// The transformer's sinusoidal features of each time step: `sin(t·ωₖ)` then `cos(t·ωₖ)`,
/// `ωₖ = 10000^(−k/half)`.
fn time_features(t: &[usize]) -> Vec<f32> {
    let half = TIME_FEATURES / 2;
    let mut out = Vec::with_capacity(t.len() * TIME_FEATURES);
    for &step in t {
        let args: Vec<f64> = (0..half)
            .map(|k| step as f64 * (-(10000f64.ln()) * k as f64 / half as f64).exp())
            .collect();
        out.extend(args.iter().map(|a| a.sin() as f32));
        out.extend(args.iter().map(|a| a.cos() as f32));
    }
    out
}

/// The noise schedule: βₜ, αₜ = 1 − βₜ, ᾱₜ = Πα.
pub struct Schedule {
    beta: Vec<f64>,
    alpha_bar: Vec<f64>,
}

impl Schedule {
    /// The paper's: β from 10⁻⁴ to 0.02, linearly over the steps.
    pub fn linear() -> Self {
        let beta: Vec<f64> = (0..T)
            .map(|k| 1e-4 + (0.02 - 1e-4) * k as f64 / (T - 1) as f64)
            .collect();
        let mut alpha_bar = Vec::with_capacity(T);
        let mut prod = 1.0;
        for b in &beta {
            prod *= 1.0 - b;
            alpha_bar.push(prod);
        }
        Schedule { beta, alpha_bar }
    }
}

/// A batch of images as the U-Net takes them, `[B, 1, 28, 28]` f32 in `[−1, 1]`: `u8` pixels
/// (a dataset's batch as stored) cast on the graph and scaled, `p/127.5 − 1`; images of any
/// other dtype taken as they are (the benchmark's f32 ones, already in `[−1, 1]`).
pub fn pixels<'g>(g: &'g Graph, images: &HostTensor) -> Res<Tensor<'g>> {
    let b = images.shape().first().copied().unwrap_or(0);
    let x = g.from_host(images)?.reshape(&[b as isize, 1, 28, 28])?;
    Ok(match images.dtype() {
        DType::U8 => x.to_dtype(DType::F32)?.scale(1.0 / 127.5)?.shift(-1.0)?,
        _ => x,
    })
}

/// One training step on `images` (`[B, 28, 28]` or `[B, 1, 28, 28]`, `u8` pixels or f32 in
/// `[−1, 1]`; see [`pixels`]): each image noised to a random step `t` on the graph,
/// `√ᾱ_t·x₀ + √(1 − ᾱ_t)·ε`, and the loss of the noise the model predicts.
pub fn train_step(
    g: &mut Graph,
    model: &UNet,
    opt: &mut Adam,
    sched: &Schedule,
    images: &HostTensor,
    rng: &mut Rng,
) -> Res<f64> {
    let x0 = pixels(g, images)?;
    let b = x0.shape()[0];
    let t: Vec<usize> = (0..b).map(|_| rng.below(T)).collect();
    let eps: Vec<f32> = (0..b * 784).map(|_| rng.normal() as f32).collect();
    let per_image = |f: &dyn Fn(f64) -> f64| -> Vec<f32> {
        t.iter().map(|&s| f(sched.alpha_bar[s]) as f32).collect()
    };
    let keep = g.from_slice(&per_image(&|ab| ab.sqrt()), &[b, 1, 1, 1])?;
    let noise = g.from_slice(&per_image(&|ab| (1.0 - ab).sqrt()), &[b, 1, 1, 1])?;
    let target = g.from_slice(&eps, &[b, 1, 28, 28])?;
    let xt = x0.mul(keep)?.add(target.mul(noise)?)?;
    let l = loss::mse_loss(model.predict_noise(g, xt, &t)?, target)?;
    let value = l.item()?;
    opt.zero_grad();
    l.backward()?;
    opt.step()?;
    g.reset();
    Ok(value)
}

/// Weights' exponential moving average.
struct Ema {
    decay: f64,
    values: Vec<Vec<f32>>,
}

impl Ema {
    fn new(model: &UNet, decay: f64) -> Self {
        let values = model
            .parameters()
            .iter()
            .map(|p| p.value().to_f64_vec().iter().map(|&v| v as f32).collect())
            .collect();
        Ema { decay, values }
    }

    fn update(&mut self, model: &UNet) {
        let d = self.decay as f32;
        for (p, e) in model.parameters().iter().zip(&mut self.values) {
            p.update(|v, _| {
                if let arenagrad::HostDataMut::F32(w) = v {
                    for (a, &x) in e.iter_mut().zip(w.iter()) {
                        *a = d * *a + (1.0 - d) * x;
                    }
                }
            });
        }
    }

    /// Puts the averages into the model's weights.
    fn copy_into(&self, model: &UNet) {
        for (p, e) in model.parameters().iter().zip(&self.values) {
            p.update(|v, _| {
                if let arenagrad::HostDataMut::F32(w) = v {
                    w.copy_from_slice(e);
                }
            });
        }
    }
}

/// `n` images drawn by the ancestral sampler, in `[−1, 1]`, row-major `[n, 28, 28]`.
fn sample(g: &mut Graph, model: &UNet, sched: &Schedule, n: usize, rng: &mut Rng) -> Res<Vec<f32>> {
    let mut x: Vec<f32> = (0..n * 784).map(|_| rng.normal() as f32).collect();
    let shape = [n, 1, 28, 28];
    for step in (0..T).rev() {
        let eps = {
            let _ng = g.no_grad();
            let xt = g.from_slice(&x, &shape)?;
            model
                .predict_noise(g, xt, &vec![step; n])?
                .to_vec::<f32>()?
        };
        g.reset();
        let (beta, ab) = (sched.beta[step], sched.alpha_bar[step]);
        let c = beta / (1.0 - ab).sqrt();
        let scale = 1.0 / (1.0 - beta).sqrt();
        let sigma = if step > 0 { beta.sqrt() } else { 0.0 };
        for (v, &e) in x.iter_mut().zip(&eps) {
            let mean = scale * (f64::from(*v) - c * f64::from(e));
            let z = if step > 0 { rng.normal() } else { 0.0 };
            *v = (mean + sigma * z) as f32;
        }
    }
    Ok(x.iter().map(|v| v.clamp(-1.0, 1.0)).collect())
}

/// The sample grid (8 × 8, each image 3× its size) and the loss curve, side by side.
fn picture(
    samples: &[f32],
    losses: &[f64],
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    font::register()?;
    const ZOOM: usize = 3;
    const SIDE: usize = 8 * 28 * ZOOM + 9 * 4;
    let root = BitMapBackend::new(path, (SIDE as u32 + 700, SIDE as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(SIDE as u32);
    let (title, grid) = left.split_vertically(40);
    title.titled("64 samples from noise (1000 steps)", ("sans-serif", 24))?;
    for (k, img) in samples.chunks(784).take(64).enumerate() {
        let (gx, gy) = (4 + (k % 8) * (28 * ZOOM + 4), 4 + (k / 8) * (28 * ZOOM + 4));
        for (p, &v) in img.iter().enumerate() {
            let level = ((f64::from(v) + 1.0) * 127.5).round().clamp(0.0, 255.0) as u8;
            let colour = RGBColor(level, level, level);
            let (px, py) = (gx + (p % 28) * ZOOM, gy + (p / 28) * ZOOM);
            for dy in 0..ZOOM {
                for dx in 0..ZOOM {
                    grid.draw_pixel(((px + dx) as i32, (py + dy) as i32), &colour)?;
                }
            }
        }
    }
    // The loss per step, smoothed over 50 steps.
    let smooth: Vec<f64> = losses
        .iter()
        .enumerate()
        .map(|(k, _)| {
            let lo = k.saturating_sub(49);
            losses[lo..=k].iter().sum::<f64>() / (k + 1 - lo) as f64
        })
        .collect();
    // The axis spans twice the highest loss after the first twentieth of the steps, so the
    // long tail is readable; the first steps' larger losses run off the top.
    let hi = smooth[smooth.len() / 20..]
        .iter()
        .cloned()
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 2.0;
    let mut chart = ChartBuilder::on(&right)
        .caption(
            "Training loss (noise MSE, 50-step mean)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..losses.len().max(1), 0.0..hi)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("mean squared error")
        .label_style(("sans-serif", 15))
        .draw()?;
    chart.draw_series(LineSeries::new(
        smooth.iter().enumerate().map(|(k, &v)| (k, v.min(hi))),
        BLUE,
    ))?;
    root.present()?;
    Ok(())
}

/// Trains a diffusion model on Fashion-MNIST and draws samples from it.
#[derive(Debug, clap::Parser)]
#[command(name = "ddpm")]
struct Args {
    /// Directory of the Fashion-MNIST IDX files
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    data: PathBuf,
    /// Training steps
    #[arg(long, default_value_t = 3000, value_parser = setup::positive)]
    steps: usize,
    /// Images per step
    #[arg(long, default_value_t = 64, value_parser = setup::positive)]
    batch: usize,
    /// Channels at full resolution (twice that below)
    #[arg(long, default_value_t = 32, value_parser = setup::positive)]
    channels: usize,
    /// Adam's learning rate
    #[arg(long, default_value_t = 1e-3, value_parser = setup::positive_real)]
    lr: f64,
    /// Seed of the weights, the data order, the time steps and the noise
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write the samples and the loss curve (PNG)
    #[arg(long, default_value = "ddpm.png")]
    out: PathBuf,
    /// Only time this many training steps on random images (ms per step), then stop
    #[arg(long)]
    bench: Option<usize>,
}

#[allow(dead_code)] // tests/ddpm_learns.rs includes this file without calling main
fn main() -> std::process::ExitCode {
    setup::report(run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    use clap::Parser;
    let args = Args::parse();
    let mut rng = Rng::seed(args.seed);
    let model = UNet::new(args.channels, &mut rng)?;
    let mut opt = Adam::new(model.parameters(), AdamConfig::new(args.lr))?;
    let sched = Schedule::linear();
    let mut g = Graph::new();
    let n_params: usize = model.parameters().iter().map(|p| p.numel()).sum();
    if let Some(steps) = args.bench {
        let x: Vec<f32> = (0..args.batch * 784)
            .map(|_| rng.uniform() as f32 * 2.0 - 1.0)
            .collect();
        let x = HostTensor::new(x, &[args.batch, 1, 28, 28])?;
        let mut times = Vec::new();
        for _ in 0..steps + 2 {
            let t0 = Instant::now();
            train_step(&mut g, &model, &mut opt, &sched, &x, &mut rng)?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        let mut t = times[2..].to_vec();
        t.sort_by(f64::total_cmp);
        println!(
            "U-Net ({n_params} parameters), batch {}: {:.1} ms per training step (median of {steps})",
            args.batch,
            t[t.len() / 2]
        );
        return Ok(());
    }
    setup::check_writable("the picture", "--out", &args.out)?;
    let (train, _) = fashion::datasets(&args.data, None, false)?;
    if args.batch > train.len() {
        return Err(setup::fail(format!(
            "--batch {} is more than the {} training images",
            args.batch,
            train.len()
        )));
    }
    println!(
        "U-Net with {n_params} parameters; {} training images; {} steps of {}",
        train.len(),
        args.steps,
        args.batch
    );
    let mut ema = Ema::new(&model, 0.995);
    let mut losses = Vec::with_capacity(args.steps);
    let t0 = Instant::now();
    let every = (args.steps / 20).max(1);
    let mut order = rng.permutation(train.len())?;
    let mut at = 0;
    for step in 1..=args.steps {
        if at + args.batch > order.len() {
            order = rng.permutation(train.len())?;
            at = 0;
        }
        let (images, _) = train.batch_raw(&order[at..at + args.batch])?;
        at += args.batch;
        let l = train_step(&mut g, &model, &mut opt, &sched, &images, &mut rng)?;
        losses.push(l);
        ema.update(&model);
        if step % every == 0 || step == args.steps {
            let recent = &losses[losses.len().saturating_sub(every)..];
            println!(
                "step {step:>5}/{}: loss {:.4} ({:.0} s)",
                args.steps,
                recent.iter().sum::<f64>() / recent.len() as f64,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    let train_s = t0.elapsed().as_secs_f64();
    ema.copy_into(&model);
    let t1 = Instant::now();
    let samples = sample(&mut g, &model, &sched, 64, &mut rng)?;
    println!(
        "trained in {train_s:.0} s ({:.0} ms per step); sampled 64 images in {:.0} s",
        train_s * 1e3 / args.steps as f64,
        t1.elapsed().as_secs_f64()
    );
    picture(&samples, &losses, &args.out)
        .map_err(|e| setup::write_failed("the picture", "--out", &args.out, e))?;
    println!(
        "wrote {} (left: 64 samples; right: the loss per step)",
        args.out.display()
    );
    Ok(())
}
