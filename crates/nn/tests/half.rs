//! bf16 and f16 in the nn layer: checkpoints PyTorch wrote in those dtypes (read, converted on
//! load into f32 modules, run as a 16-bit layer against PyTorch's output), checkpoints written
//! and read back bit for bit, and optimiser steps on 16-bit parameters.

use std::path::PathBuf;

use arenagrad_graph::{bf16, f16, DType, Graph, HostTensor, Parameter};
use arenagrad_nn::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use arenagrad_nn::{checkpoint, Linear, Module, Rng};

fn reference() -> Vec<(String, HostTensor)> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/half/linear.safetensors");
    checkpoint::load_tensors(&path).unwrap()
}

fn get(all: &[(String, HostTensor)], name: &str) -> HostTensor {
    all.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} is not in the reference"))
        .1
        .clone()
}

#[test]
fn pytorch_16_bit_checkpoints_load_and_run_as_pytorch_runs_them() {
    let all = reference();
    let (w32, b32, x) = (
        get(&all, "f32/weight"),
        get(&all, "f32/bias"),
        get(&all, "x"),
    );
    let dir = tempfile::tempdir().unwrap();
    for (tag, dtype) in [("bf16", DType::BF16), ("f16", DType::F16)] {
        let (w, b) = (
            get(&all, &format!("{tag}/weight")),
            get(&all, &format!("{tag}/bias")),
        );
        assert_eq!((w.dtype(), b.dtype()), (dtype, dtype));
        // PyTorch's rounding and ours agree on every weight.
        assert_eq!(w, w32.to_dtype(dtype).unwrap(), "{tag}");
        assert_eq!(b, b32.to_dtype(dtype).unwrap(), "{tag}");
        // A 16-bit layer: PyTorch's output, to the last bit or one step off (its f32 kernels
        // may sum in another order before rounding).
        let layer = Linear::from_parameters(
            Parameter::new("weight", w.clone()),
            Some(Parameter::new("bias", b.clone())),
        )
        .unwrap();
        let g = Graph::new();
        let xin = g.from_host(&x).unwrap().to_dtype(dtype).unwrap();
        let y = layer.forward(&g, xin).unwrap();
        assert_eq!(y.dtype(), dtype);
        let want = get(&all, &format!("{tag}/out")).to_f64_vec();
        for (got, want) in y.to_vec_f64().unwrap().iter().zip(&want) {
            let step = dtype.epsilon() * want.abs().max(1e-3);
            assert!(
                (got - want).abs() <= step,
                "{tag}: {got} against PyTorch's {want}"
            );
        }
        // Into an f32 module: converted exactly (every 16-bit value is an f32).
        let path = dir.path().join(format!("{tag}.safetensors"));
        checkpoint::save_tensors([("weight", &w), ("bias", &b)], &path).unwrap();
        let m = Linear::new(4, 3, &mut Rng::seed(1)).unwrap();
        checkpoint::load(&m, &path).unwrap();
        assert_eq!(m.weight().value().dtype(), DType::F32);
        assert_eq!(m.weight().value().to_f64_vec(), w.to_f64_vec());
        assert_eq!(m.bias().unwrap().value().to_f64_vec(), b.to_f64_vec());
    }
}

#[test]
fn sixteen_bit_tensors_round_trip_through_a_checkpoint_bit_for_bit() {
    let vals: Vec<u16> = vec![
        0x0000, 0x8000, 0x3f80, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x7bff,
    ];
    let b = HostTensor::new(vals.iter().map(|&v| bf16::from_bits(v)).collect(), &[2, 4]).unwrap();
    let h = HostTensor::new(vals.iter().map(|&v| f16::from_bits(v)).collect(), &[8]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bits.safetensors");
    checkpoint::save_tensors([("b", &b), ("h", &h)], &path).unwrap();
    let back = checkpoint::load_tensors(&path).unwrap();
    let bits = |t: &HostTensor| -> Vec<u16> {
        match t.dtype() {
            DType::BF16 => t
                .as_slice::<bf16>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect(),
            _ => t
                .as_slice::<f16>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect(),
        }
    };
    assert_eq!(back[0].1.dtype(), DType::BF16);
    assert_eq!(back[1].1.dtype(), DType::F16);
    assert_eq!(bits(&back[0].1), vals, "NaN payloads and subnormals too");
    assert_eq!(bits(&back[1].1), vals);
}

/// A 16-bit parameter's step is the f32 step on its widened values, rounded once.
#[test]
fn optimisers_step_16_bit_parameters_in_f32() {
    let start = [0.5, -1.25, 2.0, 0.75, 3.5, -0.0625];
    let x = [1.0, -2.0, 0.5, 4.0, 0.25, -1.5];
    for dtype in [DType::BF16, DType::F16] {
        let make = |dt| Parameter::new("w", HostTensor::from_f64(&start, &[6], dt).unwrap());
        let (low, full) = (make(dtype), make(DType::F32));
        let mut opts: Vec<(Box<dyn Optimizer>, Box<dyn Optimizer>)> = vec![
            (
                Box::new(Sgd::new([low.clone()], SgdConfig::new(0.1).momentum(0.9)).unwrap()),
                Box::new(Sgd::new([full.clone()], SgdConfig::new(0.1).momentum(0.9)).unwrap()),
            ),
            (
                Box::new(Adam::new([low.clone()], AdamConfig::new(0.01)).unwrap()),
                Box::new(Adam::new([full.clone()], AdamConfig::new(0.01)).unwrap()),
            ),
        ];
        for (a, b) in opts.iter_mut() {
            for _ in 0..3 {
                // The same f32 weights each time (the 16-bit ones rounded from them), and a
                // gradient exact in every dtype, so that both optimisers see the same numbers.
                let now = low.value().to_dtype(DType::F32).unwrap();
                full.set_value(now).unwrap();
                let mut g = Graph::new();
                for p in [&low, &full] {
                    let w = g.param(p).unwrap();
                    let xs = g.from_f64(&x, &[6], p.dtype()).unwrap();
                    w.mul(xs).unwrap().sum().unwrap().backward().unwrap();
                    g.reset();
                }
                assert_eq!(low.grad().unwrap().dtype(), dtype);
                a.step().unwrap();
                b.step().unwrap();
                a.zero_grad();
                b.zero_grad();
                assert_eq!(low.value().dtype(), dtype);
                assert_eq!(
                    low.value(),
                    full.value().to_dtype(dtype).unwrap(),
                    "{dtype}"
                );
            }
            // The state is f32, and saved and loaded as such.
            let state = a.state_tensors().unwrap();
            let buffers: Vec<_> = state
                .iter()
                .filter(|(n, _)| n.ends_with("exp_avg") || n.ends_with("momentum_buffer"))
                .collect();
            assert!(!buffers.is_empty(), "{state:?}");
            assert!(
                buffers.iter().all(|(_, t)| t.dtype() == DType::F32),
                "{buffers:?}"
            );
            a.load_state_tensors(&state).unwrap();
        }
    }
}

/// Under autocast a model of f32 layers runs its linear layers in bf16 and its loss in f32;
/// the parameters stay f32 and get f32 gradients, and an optimiser steps them as usual.
#[test]
fn an_f32_model_trains_under_bf16_autocast() {
    use arenagrad_nn::loss::mse_loss;
    use arenagrad_nn::Sequential;
    let mut rng = Rng::seed(3);
    let model = Sequential::new()
        .add(Linear::new(6, 16, &mut rng).unwrap())
        .add(arenagrad_nn::Tanh)
        .add(Linear::new(16, 1, &mut rng).unwrap());
    let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.1)).unwrap();
    let mut g = Graph::new();
    let mut losses = Vec::new();
    for step in 0..60 {
        let x = g.randn(&[32, 6], DType::F32).unwrap();
        let target = x
            .sum_axes(&[1], true)
            .unwrap()
            .scale(0.3)
            .unwrap()
            .tanh()
            .unwrap();
        let loss = {
            let _mixed = g.autocast(DType::BF16).unwrap();
            let y = model.forward(&g, x).unwrap();
            assert_eq!(y.dtype(), DType::BF16, "step {step}");
            mse_loss(y, target).unwrap()
        };
        assert_eq!(loss.dtype(), DType::F32);
        losses.push(loss.item().unwrap());
        loss.backward().unwrap();
        g.reset();
        for p in model.parameters() {
            assert_eq!(p.grad().unwrap().dtype(), DType::F32);
        }
        opt.step().unwrap();
        opt.zero_grad();
    }
    for p in model.parameters() {
        assert_eq!(p.dtype(), DType::F32);
    }
    let (first, last) = (
        losses[..5].iter().sum::<f64>(),
        losses[55..].iter().sum::<f64>(),
    );
    assert!(
        last < 0.5 * first,
        "the loss fell from {first} to {last} (sums of 5 steps)"
    );
}

/// The loss scaler: with a power-of-two scale and no overflow, training with it gives the
/// weights of training without it bit for bit (scaling by 2ᵏ and back is exact); a gradient
/// that overflows skips the step and halves the scale; good steps grow it after the interval.
#[test]
fn the_grad_scaler_scales_skips_and_grows_as_pytorch_does() {
    use arenagrad_nn::optim::{GradScaler, GradScalerConfig, GradScalerState};
    let make = || {
        Parameter::new(
            "w",
            HostTensor::from_f64(&[0.5, -1.25, 2.0, 0.75], &[4], DType::F32).unwrap(),
        )
    };
    let (plain, scaled) = (make(), make());
    let mut opt_plain = Adam::new([plain.clone()], AdamConfig::new(0.01)).unwrap();
    let mut opt_scaled = Adam::new([scaled.clone()], AdamConfig::new(0.01)).unwrap();
    let cfg = GradScalerConfig {
        growth_interval: 3,
        ..GradScalerConfig::default()
    };
    let mut scaler = GradScaler::new(cfg).unwrap();
    let mut g = Graph::new();
    let x = [0.3, -2.0, 1.5, 0.25];
    for step in 0..7 {
        for (p, scale) in [(&plain, None), (&scaled, Some(&scaler))] {
            let xs = g.from_f64(&x, &[4], DType::F32).unwrap();
            let loss = g
                .param(p)
                .unwrap()
                .mul(xs)
                .unwrap()
                .tanh()
                .unwrap()
                .sum()
                .unwrap();
            let loss = match scale {
                Some(s) => s.scale_loss(loss).unwrap(),
                None => loss,
            };
            loss.backward().unwrap();
            g.reset();
        }
        opt_plain.step().unwrap();
        assert!(scaler.step(&mut opt_scaled).unwrap(), "step {step}");
        scaler.update();
        opt_plain.zero_grad();
        opt_scaled.zero_grad();
        assert_eq!(scaled.value(), plain.value(), "step {step}");
    }
    // Seven good steps at an interval of three: grown twice.
    assert_eq!(
        scaler.state(),
        GradScalerState {
            scale: 65536.0 * 4.0,
            growth_tracker: 1
        }
    );
    // An infinite gradient: no step, the scale halves, the count starts again.
    let before = scaled.value();
    let xs = g
        .from_f64(&[f64::INFINITY, 1.0, 1.0, 1.0], &[4], DType::F32)
        .unwrap();
    let loss = g.param(&scaled).unwrap().mul(xs).unwrap().sum().unwrap();
    scaler.scale_loss(loss).unwrap().backward().unwrap();
    g.reset();
    scaler.unscale(&opt_scaled).unwrap();
    assert!(scaler.unscale(&opt_scaled).is_err(), "twice before update");
    assert!(!scaler.step(&mut opt_scaled).unwrap());
    scaler.update();
    assert_eq!(scaled.value(), before, "the step was skipped");
    assert_eq!(
        scaler.state(),
        GradScalerState {
            scale: 65536.0 * 2.0,
            growth_tracker: 0
        }
    );
    // Unscaling a 16-bit gradient: in f32, rounded once.
    let h = Parameter::new("h", HostTensor::from_f64(&[1.0], &[1], DType::F16).unwrap());
    let sgd = Sgd::new([h.clone()], SgdConfig::new(0.5)).unwrap();
    let mut s16 = GradScaler::new(GradScalerConfig::default()).unwrap();
    // The loss in f32 (as autocast computes losses); its gradient reaches h in f16.
    let hp = g.param(&h).unwrap().to_dtype(DType::F32).unwrap();
    let loss = hp.scale(1e-6).unwrap().sum().unwrap();
    s16.scale_loss(loss).unwrap().backward().unwrap();
    g.reset();
    // 1e-6 is a subnormal in f16 (lost to a few bits); scaled by 2¹⁶ it is 0.0655, kept
    // to 11 bits, and unscaled in f32 it is 1e-6 again to f16's subnormal step.
    s16.unscale(&sgd).unwrap();
    let got = h.grad().unwrap().to_f64_vec()[0];
    assert!((got - 1e-6).abs() < 6e-8, "{got}");
    assert!(GradScaler::new(GradScalerConfig {
        backoff_factor: 1.5,
        ..GradScalerConfig::default()
    })
    .is_err());
}
