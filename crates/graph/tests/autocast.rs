//! Autocast ([`Graph::autocast`]): which dtype each op runs in, a parameter's cast made once per
//! iteration, gradients reaching f32 parameters in f32, and an MLP's loss, output and gradients
//! against what PyTorch 2.15 printed under `torch.autocast("cpu", dtype=torch.bfloat16)`.

use arenagrad_graph::{DType, Graph, GraphError, HostTensor, Parameter, Tensor};

// The MLP: x [4, 8], linear(8 → 16) + b1, relu, linear(16 → 4) + b2, cross-entropy against
// targets [0, 2, 1, 3]; every value sin(0.37·k + s)·scale for k = 0, 1, ... (f32). PyTorch:
// `F.linear` and `F.cross_entropy` inside the autocast block, `loss.backward()` after it.
const LOSS: f64 = 1.4697003364562988;
const OUT: [f64; 16] = [
    -0.65625,
    -0.6640625,
    -0.58203125,
    -0.423828125,
    -0.60546875,
    -0.72265625,
    -0.73828125,
    -0.6640625,
    -0.392578125,
    -0.54296875,
    -0.62109375,
    -0.6171875,
    -0.173828125,
    -0.37109375,
    -0.515625,
    -0.59375,
];
const GW1: [f64; 128] = [
    -0.00188446044921875,
    0.01275634765625,
    0.0257568359375,
    0.03515625,
    0.039794921875,
    0.0390625,
    0.033203125,
    0.0225830078125,
    -0.0234375,
    -0.004058837890625,
    0.0157470703125,
    0.033447265625,
    0.046630859375,
    0.053466796875,
    0.05322265625,
    0.045654296875,
    -0.0040283203125,
    0.0150146484375,
    0.031982421875,
    0.044677734375,
    0.05126953125,
    0.05078125,
    0.043701171875,
    0.030517578125,
    -0.023681640625,
    -0.005218505859375,
    0.01385498046875,
    0.031005859375,
    0.044189453125,
    0.051025390625,
    0.05126953125,
    0.04443359375,
    -0.0040283203125,
    0.00933837890625,
    0.021484375,
    0.0306396484375,
    0.03564453125,
    0.035888671875,
    0.03125,
    0.0223388671875,
    -0.01141357421875,
    -0.003570556640625,
    0.00469970703125,
    0.0123291015625,
    0.018310546875,
    0.0218505859375,
    0.0223388671875,
    0.0198974609375,
    -0.001922607421875,
    -0.00109100341796875,
    -0.0001201629638671875,
    0.000885009765625,
    0.0017547607421875,
    0.0023956298828125,
    0.002716064453125,
    0.002655029296875,
    0.006744384765625,
    -0.0001201629638671875,
    -0.0069580078125,
    -0.0128173828125,
    -0.0169677734375,
    -0.018798828125,
    -0.0181884765625,
    -0.0150146484375,
    0.00118255615234375,
    -0.010986328125,
    -0.021728515625,
    -0.0294189453125,
    -0.033203125,
    -0.032470703125,
    -0.0274658203125,
    -0.0185546875,
    0.021484375,
    0.00347900390625,
    -0.01495361328125,
    -0.03125,
    -0.04345703125,
    -0.0498046875,
    -0.04931640625,
    -0.042236328125,
    0.003662109375,
    -0.01513671875,
    -0.031982421875,
    -0.04443359375,
    -0.05078125,
    -0.05029296875,
    -0.043212890625,
    -0.030029296875,
    0.02490234375,
    0.00518798828125,
    -0.01513671875,
    -0.033447265625,
    -0.047119140625,
    -0.054443359375,
    -0.0546875,
    -0.047119140625,
    0.00421142578125,
    -0.011474609375,
    -0.025634765625,
    -0.0361328125,
    -0.0419921875,
    -0.0419921875,
    -0.036376953125,
    -0.02587890625,
    0.0152587890625,
    0.00421142578125,
    -0.00738525390625,
    -0.0179443359375,
    -0.026123046875,
    -0.0306396484375,
    -0.03125,
    -0.0274658203125,
    0.00250244140625,
    -0.00177764892578125,
    -0.005828857421875,
    -0.009033203125,
    -0.0111083984375,
    -0.0115966796875,
    -0.01055908203125,
    -0.008056640625,
    -0.0023040771484375,
    0.004974365234375,
    0.0115966796875,
    0.0166015625,
    0.0194091796875,
    0.01953125,
    0.01708984375,
    0.01226806640625,
];
const GB1: [f64; 16] = [
    0.04052734375,
    -0.054931640625,
    0.052490234375,
    -0.052734375,
    0.036865234375,
    -0.0225830078125,
    0.002288818359375,
    0.019287109375,
    -0.03369140625,
    0.051025390625,
    -0.052001953125,
    0.05615234375,
    -0.04345703125,
    0.03173828125,
    -0.0118408203125,
    0.00151824951171875,
];
const GW2: [f64; 64] = [
    -0.1259765625,
    0.083984375,
    -0.15234375,
    0.1259765625,
    -0.158203125,
    0.1513671875,
    -0.1435546875,
    0.1611328125,
    -0.1162109375,
    0.1552734375,
    -0.07763671875,
    0.1337890625,
    -0.0311279296875,
    0.095703125,
    0.020263671875,
    -0.02001953125,
    -0.03125,
    0.07275390625,
    -0.080078125,
    0.1083984375,
    -0.11767578125,
    0.1298828125,
    -0.1416015625,
    0.1376953125,
    -0.150390625,
    0.1318359375,
    -0.14453125,
    0.11328125,
    -0.12353515625,
    0.0810546875,
    -0.08544921875,
    0.053955078125,
    0.07421875,
    -0.1298828125,
    0.11083984375,
    -0.1591796875,
    0.1318359375,
    -0.1669921875,
    0.13671875,
    -0.1591796875,
    0.1279296875,
    -0.1328125,
    0.10693359375,
    -0.09423828125,
    0.0751953125,
    -0.044677734375,
    0.0322265625,
    0.03369140625,
    0.0830078125,
    -0.0267333984375,
    0.1220703125,
    -0.0751953125,
    0.14453125,
    -0.11376953125,
    0.1484375,
    -0.1396484375,
    0.138671875,
    -0.154296875,
    0.115234375,
    -0.15234375,
    0.080078125,
    -0.1318359375,
    0.033203125,
    -0.0673828125,
];
const GB2: [f64; 4] = [
    0.02587890625,
    -0.005615234375,
    -0.015869140625,
    -0.004150390625,
];

fn vals(n: usize, s: f64, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|k| f64::from(((k as f64 * 0.37 + s).sin() * scale) as f32))
        .collect()
}

fn param(name: &str, v: Vec<f64>, shape: &[usize]) -> Parameter {
    Parameter::new(name, HostTensor::from_f64(&v, shape, DType::F32).unwrap())
}

/// Within `steps` steps of bf16 at each of PyTorch's values (an f32 kernel may sum in another
/// order before the rounding to bf16, moving a result by a step).
fn near_bf16(what: &str, got: &[f64], want: &[f64], steps: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let step = DType::BF16.epsilon() * w.abs().max(1e-3);
        assert!(
            (g - w).abs() <= steps * step,
            "{what}[{k}]: {g} against PyTorch's {w}\n{got:?}"
        );
    }
}

#[test]
fn an_mlp_under_bf16_autocast_matches_pytorch() {
    let w1 = param("w1", vals(128, 1.0, 0.3), &[16, 8]);
    let b1 = param("b1", vals(16, 2.0, 0.1), &[16]);
    let w2 = param("w2", vals(64, 3.0, 0.3), &[4, 16]);
    let b2 = param("b2", vals(4, 4.0, 0.1), &[4]);
    let g = Graph::new();
    let x = g
        .from_f64(&vals(32, 0.0, 1.0), &[4, 8], DType::F32)
        .unwrap();
    let (o, loss) = {
        let _mixed = g.autocast(DType::BF16).unwrap();
        let p = |p: &Parameter| g.param(p).unwrap();
        let h = p(&b1).addmm_t(x, p(&w1), false, true).unwrap();
        assert_eq!(h.dtype(), DType::BF16, "a linear layer runs in bf16");
        let a = h.relu().unwrap();
        assert_eq!(a.dtype(), DType::BF16, "relu runs in its input's dtype");
        let o = p(&b2).addmm_t(a, p(&w2), false, true).unwrap();
        let loss = o.cross_entropy_mean(&[0, 2, 1, 3]).unwrap();
        assert_eq!(loss.dtype(), DType::F32, "a loss runs in f32");
        (o, loss)
    };
    near_bf16("output", &o.to_vec_f64().unwrap(), &OUT, 0.0);
    let l = loss.item().unwrap();
    assert!(
        (l - LOSS).abs() <= 1e-6 * LOSS,
        "loss {l} against PyTorch's {LOSS}"
    );
    loss.backward().unwrap();
    for (p, want) in [(&w1, &GW1[..]), (&b1, &GB1), (&w2, &GW2), (&b2, &GB2)] {
        let grad = p.grad().unwrap();
        assert_eq!(
            grad.dtype(),
            DType::F32,
            "{}: the master weight's gradient is f32",
            p.name()
        );
        near_bf16(&p.name(), &grad.to_f64_vec(), want, 2.0);
    }
}

#[test]
fn a_parameter_is_cast_once_per_iteration_and_scopes_nest() {
    let w = param("w", vals(12, 0.5, 1.0), &[4, 3]);
    let mut g = Graph::new();
    for _ in 0..2 {
        let x = g.ones(&[2, 4], DType::BF16).unwrap();
        let _mixed = g.autocast(DType::BF16).unwrap();
        let y1 = x.matmul(g.param(&w).unwrap()).unwrap();
        let before = g.stats().nodes;
        // The same parameter again, through a new leaf: its bf16 copy is reused, so the
        // product is the only node added besides the leaf.
        let y2 = x.matmul(g.param(&w).unwrap()).unwrap();
        assert_eq!(g.stats().nodes - before, 2);
        assert_eq!(y1.to_vec_f64().unwrap(), y2.to_vec_f64().unwrap());
        y1.add(y2).unwrap().sum().unwrap().backward().unwrap();
        drop(_mixed);
        g.reset();
    }
    // Both uses of both iterations reached the f32 gradient: 4 × xᵀ·1 = 8 everywhere.
    let grad = w.grad().unwrap();
    assert_eq!(grad.dtype(), DType::F32);
    assert_eq!(grad.to_f64_vec(), vec![8.0; 12]);
    let g = Graph::new();
    assert_eq!(g.autocast_dtype(), None);
    {
        let _outer = g.autocast(DType::BF16).unwrap();
        {
            let _inner = g.autocast(DType::F16).unwrap();
            assert_eq!(g.autocast_dtype(), Some(DType::F16));
            let a = g.ones(&[2, 2], DType::F32).unwrap();
            assert_eq!(a.matmul(a).unwrap().dtype(), DType::F16);
        }
        assert_eq!(g.autocast_dtype(), Some(DType::BF16));
    }
    assert_eq!(g.autocast_dtype(), None);
    assert!(matches!(
        g.autocast(DType::F32).map(drop).unwrap_err(),
        GraphError::UnsupportedDType {
            op: "autocast",
            dtype: DType::F32
        }
    ));
    // f64 is left alone, as PyTorch leaves double alone.
    let _mixed = g.autocast(DType::BF16).unwrap();
    let d = g.ones(&[2, 2], DType::F64).unwrap();
    assert_eq!(d.matmul(d).unwrap().dtype(), DType::F64);
    // Elementwise ops meet in the wider dtype: a bf16 product plus an f32 residual is f32.
    let r: Tensor<'_> = g.ones(&[2, 2], DType::F32).unwrap();
    assert_eq!(r.matmul(r).unwrap().add(r).unwrap().dtype(), DType::F32);
}
