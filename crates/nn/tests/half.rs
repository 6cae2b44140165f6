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

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("arenagrad-half-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn pytorch_16_bit_checkpoints_load_and_run_as_pytorch_runs_them() {
    let all = reference();
    let (w32, b32, x) = (
        get(&all, "f32/weight"),
        get(&all, "f32/bias"),
        get(&all, "x"),
    );
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
        let path = temp(&format!("{tag}.safetensors"));
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
    let path = temp("bits.safetensors");
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
