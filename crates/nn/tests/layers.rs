//! Layers against hand-computed values, and every layer's gradients (input and parameters)
//! against finite differences in f64.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_nn::check::gradcheck_module;
use arenagrad_nn::functional as F;
use arenagrad_nn::{
    AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNormConfig, Conv2d, Conv2dConfig, DType, Dropout,
    Embedding, Flatten, GELUTanh, Graph, HostTensor, LayerNorm, LayerNormConfig, LeakyReLU, Linear,
    LinearConfig, MaxPool2d, Module, NnError, Parameter, ReLU, Rng, Sequential, Sigmoid, Tanh,
    GELU,
};

fn f64s(t: arenagrad_nn::Tensor<'_>) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

fn ht(v: &[f64], shape: &[usize]) -> HostTensor {
    HostTensor::new(v.to_vec(), shape).unwrap()
}

fn param(name: &str, v: &[f64], shape: &[usize]) -> Parameter {
    Parameter::new(name, ht(v, shape))
}

/// Deterministic, distinct inputs (distinct values keep max pooling away from ties).
fn input(shape: &[usize], seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut r = Rng::seed(seed);
    let v: Vec<f64> = (0..n).map(|_| r.uniform_range(-1.0, 1.0)).collect();
    ht(&v, shape)
}

fn assert_gradcheck<M: Module + ?Sized>(m: &M, x: &HostTensor) {
    let r = gradcheck_module(m, x, GradcheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    let names: Vec<&str> = r.tensors.iter().map(|t| t.name.as_str()).collect();
    let mut want = vec!["input".to_string()];
    want.extend(m.named_parameters().into_iter().map(|(n, _)| n));
    assert_eq!(names, want);
}

fn f64_linear(i: usize, o: usize, rng: &mut Rng) -> Linear {
    Linear::with_config(
        i,
        o,
        LinearConfig {
            dtype: DType::F64,
            ..Default::default()
        },
        rng,
    )
    .unwrap()
}

#[test]
fn linear_values() {
    let w = param("weight", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let b = param("bias", &[0.5, -1.0, 0.0], &[3]);
    let fc = Linear::from_parameters(w, Some(b)).unwrap();
    assert_eq!((fc.in_features(), fc.out_features()), (2, 3));
    let g = Graph::new();
    let x = g
        .from_f64(&[1.0, -1.0, 0.0, 2.0], &[2, 2], DType::F64)
        .unwrap();
    let y = fc.forward(&g, x).unwrap();
    assert_eq!(y.shape().as_slice(), &[2, 3]);
    assert_eq!(f64s(y), vec![-0.5, -2.0, -1.0, 4.5, 7.0, 12.0]);
    // Leading batch axes pass through.
    let x3 = g
        .from_f64(&[1.0, -1.0, 0.0, 2.0], &[2, 1, 2], DType::F64)
        .unwrap();
    assert_eq!(fc.forward(&g, x3).unwrap().shape().as_slice(), &[2, 1, 3]);
    let bad = g.zeros(&[2, 5], DType::F64).unwrap();
    assert!(matches!(
        fc.forward(&g, bad),
        Err(NnError::InputShape { op: "linear", .. })
    ));
}

#[test]
fn linear_init_is_seeded_and_bounded() {
    let a = Linear::new(100, 20, &mut Rng::seed(3)).unwrap();
    let b = Linear::new(100, 20, &mut Rng::seed(3)).unwrap();
    let c = Linear::new(100, 20, &mut Rng::seed(4)).unwrap();
    assert_eq!(a.weight().value(), b.weight().value());
    assert_ne!(a.weight().value(), c.weight().value());
    assert!(a
        .weight()
        .value()
        .to_f64_vec()
        .iter()
        .all(|v| v.abs() <= 0.1));
    assert!(a
        .bias()
        .unwrap()
        .value()
        .to_f64_vec()
        .iter()
        .all(|v| v.abs() <= 0.1));
    assert_eq!(a.weight().dtype(), DType::F32);
    assert!(matches!(
        Linear::new(0, 3, &mut Rng::seed(0)),
        Err(NnError::InvalidConfig { .. })
    ));
    let nb = Linear::with_config(
        4,
        2,
        LinearConfig {
            bias: false,
            ..Default::default()
        },
        &mut Rng::seed(0),
    )
    .unwrap();
    assert!(nb.bias().is_none());
    assert_eq!(nb.named_parameters().len(), 1);
}

#[test]
fn linear_gradcheck() {
    let mut rng = Rng::seed(1);
    assert_gradcheck(&f64_linear(4, 3, &mut rng), &input(&[5, 4], 2));
    // Sixteen outputs: the forward product copies Wᵀ to row-major order before the kernel.
    assert_gradcheck(&f64_linear(5, 16, &mut rng), &input(&[3, 5], 3));
    // The functional form, every argument as a checked input.
    let r = gradcheck(
        check_fn(|_g, xs| {
            F::linear(xs[0], xs[1], Some(xs[2])).map_err(|e| match e {
                NnError::Graph(e) => e,
                other => panic!("{other}"),
            })
        }),
        &[input(&[3, 4], 5), input(&[2, 4], 6), input(&[2], 7)],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(r.passed, "{r}");
    // A wide layer on one row (computed as (W·xᵀ)ᵀ), a 3-D input, and second derivatives.
    for (xs, ws) in [(vec![1, 4], vec![5, 4]), (vec![2, 1, 3], vec![2, 3])] {
        let r = gradcheck(
            check_fn(|_g, xs| F::linear(xs[0], xs[1], None).map_err(graph_err)),
            &[input(&xs, 8), input(&ws, 9)],
            GradcheckOptions::default(),
        )
        .unwrap();
        assert!(r.passed, "{r}");
        let r = gradgradcheck(
            check_fn(|_g, xs| F::linear(xs[0], xs[1], None).map_err(graph_err)?.tanh()),
            &[input(&xs, 10), input(&ws, 11)],
            GradcheckOptions::default(),
        )
        .unwrap();
        assert!(r.passed, "{r}");
    }
}

fn graph_err(e: NnError) -> arenagrad_nn::GraphError {
    match e {
        NnError::Graph(e) => e,
        other => panic!("{other}"),
    }
}

fn conv_f64(c: usize, o: usize, k: (usize, usize), cfg: Conv2dConfig, seed: u64) -> Conv2d {
    Conv2d::with_config(c, o, k, cfg.dtype(DType::F64), &mut Rng::seed(seed)).unwrap()
}

#[test]
fn conv2d_values() {
    let g = Graph::new();
    let img: Vec<f64> = (1..=9).map(f64::from).collect();
    let x = g.from_f64(&img, &[1, 1, 3, 3], DType::F64).unwrap();
    let w = || param("weight", &[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]);
    let b = || Some(param("bias", &[0.5], &[1]));
    let plain = Conv2d::from_parameters(w(), b(), Conv2dConfig::default()).unwrap();
    assert_eq!(
        f64s(plain.forward(&g, x).unwrap()),
        vec![37.5, 47.5, 67.5, 77.5]
    );
    let padded =
        Conv2d::from_parameters(w(), None, Conv2dConfig::default().padding(1).stride(2)).unwrap();
    assert_eq!(
        f64s(padded.forward(&g, x).unwrap()),
        vec![4.0, 18.0, 36.0, 77.0]
    );
    let dilated = Conv2d::from_parameters(w(), None, Conv2dConfig::default().dilation(2)).unwrap();
    assert_eq!(f64s(dilated.forward(&g, x).unwrap()), vec![64.0]);
    // Two groups: each output channel sees only its own input channel.
    let grouped = Conv2d::from_parameters(
        param("weight", &[2.0, 3.0], &[2, 1, 1, 1]),
        Some(param("bias", &[0.0, 1.0], &[2])),
        Conv2dConfig::default().groups(2),
    )
    .unwrap();
    let x2 = g
        .from_f64(
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
            &[1, 2, 2, 2],
            DType::F64,
        )
        .unwrap();
    assert_eq!(
        f64s(grouped.forward(&g, x2).unwrap()),
        vec![2.0, 4.0, 6.0, 8.0, 16.0, 19.0, 22.0, 25.0]
    );
}

#[test]
fn conv2d_shapes_and_errors() {
    let mut rng = Rng::seed(0);
    let conv = Conv2d::with_config(
        4,
        6,
        (3, 3),
        Conv2dConfig::default().stride(2).padding(1).groups(2),
        &mut rng,
    )
    .unwrap();
    assert_eq!(conv.weight().shape(), vec![6, 2, 3, 3]);
    let g = Graph::new();
    let y = conv
        .forward(&g, g.randn(&[2, 4, 9, 9], DType::F32).unwrap())
        .unwrap();
    assert_eq!(y.shape().as_slice(), &[2, 6, 5, 5]);
    assert!(matches!(
        conv.forward(&g, g.randn(&[2, 3, 9, 9], DType::F32).unwrap()),
        Err(NnError::InputShape { op: "conv2d", .. })
    ));
    assert!(matches!(
        conv.forward(&g, g.randn(&[4, 9, 9], DType::F32).unwrap()),
        Err(NnError::InputShape { .. })
    ));
    for bad in [
        Conv2d::with_config(3, 6, (3, 3), Conv2dConfig::default().groups(2), &mut rng),
        Conv2d::with_config(3, 6, (0, 3), Conv2dConfig::default(), &mut rng),
        Conv2d::with_config(3, 6, (3, 3), Conv2dConfig::default().stride(0), &mut rng),
    ] {
        assert!(matches!(bad, Err(NnError::InvalidConfig { .. })), "{bad:?}");
    }
}

#[test]
fn conv2d_gradcheck() {
    assert_gradcheck(
        &conv_f64(2, 3, (2, 2), Conv2dConfig::default(), 1),
        &input(&[2, 2, 4, 4], 2),
    );
    assert_gradcheck(
        &conv_f64(
            4,
            2,
            (3, 2),
            Conv2dConfig {
                stride: (2, 1),
                padding: (1, 1),
                dilation: (1, 2),
                groups: 2,
                ..Default::default()
            },
            3,
        ),
        &input(&[1, 4, 5, 5], 4),
    );
}

#[test]
fn pooling_values() {
    let g = Graph::new();
    let v: Vec<f64> = (0..16).map(|k| f64::from((k * 7) % 16)).collect();
    let x = g.from_f64(&v, &[1, 1, 4, 4], DType::F64).unwrap();
    // rows: [0 7 14 5] [12 3 10 1] [8 15 6 13] [4 11 2 9]
    let mp = MaxPool2d::new((2, 2)).unwrap();
    assert_eq!(
        f64s(mp.forward(&g, x).unwrap()),
        vec![12.0, 14.0, 15.0, 13.0]
    );
    let mp3 = MaxPool2d::with_options((3, 3), (1, 1), (1, 1)).unwrap();
    let y = f64s(mp3.forward(&g, x).unwrap());
    assert_eq!(y.len(), 16);
    assert_eq!(y[0], 12.0); // window rows 0..1, cols 0..1 of the padded image
                            // Padded max pooling returns input elements bit for bit, whatever the input's range.
    let v = [0.1, -1000.0, 0.3, 0.7, 0.2, 0.9, 0.15, 0.33, 0.77];
    let x32 = g.from_f64(&v, &[1, 1, 3, 3], DType::F32).unwrap();
    let mp_pad = MaxPool2d::with_options((2, 2), (2, 2), (1, 1)).unwrap();
    let y = mp_pad.forward(&g, x32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(y, vec![0.1f32, 0.3, 0.7, 0.9]);
    let ap = AvgPool2d::new((2, 2)).unwrap();
    assert_eq!(f64s(ap.forward(&g, x).unwrap()), vec![5.5, 7.5, 9.5, 7.5]);
    let small = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], DType::F64)
        .unwrap();
    let app = AvgPool2d::with_options((2, 2), (2, 2), (1, 1)).unwrap();
    assert_eq!(
        f64s(app.forward(&g, small).unwrap()),
        vec![0.25, 0.5, 0.75, 1.0],
        "padding counts toward the average"
    );
    assert!(matches!(
        MaxPool2d::with_options((2, 2), (2, 2), (2, 2)),
        Err(NnError::InvalidConfig { .. })
    ));
    assert!(matches!(
        mp.forward(&g, g.zeros(&[4, 4], DType::F64).unwrap()),
        Err(NnError::InputShape { .. })
    ));
}

#[test]
fn pooling_gradcheck() {
    let x = input(&[2, 2, 5, 5], 9);
    assert_gradcheck(&MaxPool2d::new((2, 2)).unwrap(), &x);
    assert_gradcheck(
        &MaxPool2d::with_options((3, 3), (2, 2), (1, 1)).unwrap(),
        &x,
    );
    assert_gradcheck(&AvgPool2d::new((2, 2)).unwrap(), &x);
    assert_gradcheck(
        &AvgPool2d::with_options((3, 3), (2, 1), (1, 1)).unwrap(),
        &x,
    );
}

fn bn_f64() -> BatchNormConfig {
    BatchNormConfig {
        dtype: DType::F64,
        ..Default::default()
    }
}

#[test]
fn batchnorm1d_train_and_eval_values() {
    let mut bn = BatchNorm1d::with_config(2, bn_f64()).unwrap();
    let g = Graph::new();
    let x = g
        .from_f64(&[1.0, 10.0, 3.0, 30.0], &[2, 2], DType::F64)
        .unwrap();
    let y = f64s(bn.forward(&g, x).unwrap());
    let (a, b) = (
        1.0 / (1.0 + 1e-5f64).sqrt(),
        10.0 / (100.0 + 1e-5f64).sqrt(),
    );
    close(&y, &[-a, -b, a, b], 1e-12);
    // Running statistics: momentum 0.1, the variance unbiased (n/(n−1) = 2).
    close(
        &bn.running_mean().unwrap().value().to_f64_vec(),
        &[0.2, 2.0],
        1e-15,
    );
    close(
        &bn.running_var().unwrap().value().to_f64_vec(),
        &[1.1, 20.9],
        1e-12,
    );
    bn.eval();
    assert!(!bn.is_training());
    let y = f64s(bn.forward(&g, x).unwrap());
    let want = [
        (1.0 - 0.2) / (1.1 + 1e-5f64).sqrt(),
        (10.0 - 2.0) / (20.9 + 1e-5f64).sqrt(),
        (3.0 - 0.2) / (1.1 + 1e-5f64).sqrt(),
        (30.0 - 2.0) / (20.9 + 1e-5f64).sqrt(),
    ];
    close(&y, &want, 1e-12);
    // Eval mode leaves the running statistics alone.
    close(
        &bn.running_mean().unwrap().value().to_f64_vec(),
        &[0.2, 2.0],
        1e-15,
    );
    // One value per channel cannot be normalised in training mode.
    bn.train();
    let one = g.from_f64(&[1.0, 2.0], &[1, 2], DType::F64).unwrap();
    assert!(matches!(
        bn.forward(&g, one),
        Err(NnError::InputShape { .. })
    ));
    assert!(matches!(
        bn.forward(&g, g.zeros(&[4, 3], DType::F64).unwrap()),
        Err(NnError::InputShape {
            op: "BatchNorm1d",
            ..
        })
    ));
}

#[test]
fn batchnorm_affine_and_3d_input() {
    let bn = BatchNorm1d::with_config(2, bn_f64()).unwrap();
    bn.weight()
        .unwrap()
        .set_value(ht(&[2.0, 3.0], &[2]))
        .unwrap();
    bn.bias()
        .unwrap()
        .set_value(ht(&[1.0, -1.0], &[2]))
        .unwrap();
    let g = Graph::new();
    // [N=1, C=2, L=2]: statistics over N and L.
    let x = g
        .from_f64(&[0.0, 2.0, 5.0, 5.0], &[1, 2, 2], DType::F64)
        .unwrap();
    let y = f64s(bn.forward(&g, x).unwrap());
    let a = 1.0 / (1.0 + 1e-5f64).sqrt();
    close(&y, &[1.0 - 2.0 * a, 1.0 + 2.0 * a, -1.0, -1.0], 1e-12);
    let no_affine = BatchNorm2d::with_config(
        3,
        BatchNormConfig {
            affine: false,
            track_running_stats: false,
            ..bn_f64()
        },
    )
    .unwrap();
    assert!(no_affine.named_state().is_empty());
}

#[test]
fn batchnorm_gradcheck_train_and_eval() {
    let mut bn = BatchNorm2d::with_config(3, bn_f64()).unwrap();
    bn.weight().unwrap().set_value(input(&[3], 1)).unwrap();
    bn.bias().unwrap().set_value(input(&[3], 2)).unwrap();
    assert_gradcheck(&bn, &input(&[2, 3, 3, 2], 3));
    bn.running_var()
        .unwrap()
        .set_value(ht(&[0.5, 1.5, 2.0], &[3]))
        .unwrap();
    bn.eval();
    assert_gradcheck(&bn, &input(&[2, 3, 3, 2], 4));
    let bn1 = BatchNorm1d::with_config(4, bn_f64()).unwrap();
    assert_gradcheck(&bn1, &input(&[5, 4], 5));
}

#[test]
fn layernorm_values_and_gradcheck() {
    let ln = LayerNorm::with_config(
        &[2],
        LayerNormConfig {
            dtype: DType::F64,
            ..Default::default()
        },
    )
    .unwrap();
    let g = Graph::new();
    let x = g
        .from_f64(&[1.0, 3.0, -2.0, 2.0], &[2, 2], DType::F64)
        .unwrap();
    let a = 1.0 / (1.0 + 1e-5f64).sqrt();
    let b = 2.0 / (4.0 + 1e-5f64).sqrt();
    close(&f64s(ln.forward(&g, x).unwrap()), &[-a, a, -b, b], 1e-12);
    assert!(matches!(
        ln.forward(&g, g.zeros(&[2, 3], DType::F64).unwrap()),
        Err(NnError::InputShape {
            op: "LayerNorm",
            ..
        })
    ));
    let ln2 = LayerNorm::with_config(
        &[3, 2],
        LayerNormConfig {
            dtype: DType::F64,
            ..Default::default()
        },
    )
    .unwrap();
    ln2.weight().unwrap().set_value(input(&[3, 2], 7)).unwrap();
    ln2.bias().unwrap().set_value(input(&[3, 2], 8)).unwrap();
    assert_gradcheck(&ln2, &input(&[2, 3, 2], 9));
}

#[test]
fn dropout_values_modes_and_gradcheck() {
    let mut d = Dropout::new(0.25).unwrap();
    let g = Graph::new();
    g.seed(11);
    let y = f64s(d.forward(&g, g.ones(&[4000], DType::F64).unwrap()).unwrap());
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    assert!(y
        .iter()
        .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-12));
    assert!((2850..3150).contains(&kept), "{kept}");
    // The same seed drops the same elements.
    g.seed(11);
    let y2 = f64s(d.forward(&g, g.ones(&[4000], DType::F64).unwrap()).unwrap());
    assert_eq!(y, y2);
    d.eval();
    let x = g.from_f64(&[1.0, 2.0], &[2], DType::F64).unwrap();
    assert_eq!(f64s(d.forward(&g, x).unwrap()), vec![1.0, 2.0]);
    assert!(Dropout::new(1.0).is_err() && Dropout::new(-0.1).is_err());
    d.train();
    assert_gradcheck(&d, &input(&[3, 4], 12));
}

#[test]
fn embedding_values_and_gradcheck() {
    let w = param("weight", &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2]);
    let emb = Embedding::from_parameter(w).unwrap();
    let g = Graph::new();
    let idx = g
        .from_f64(&[2.0, 0.0, 2.0, 1.0], &[2, 2], DType::F64)
        .unwrap();
    let y = emb.forward(&g, idx).unwrap();
    assert_eq!(y.shape().as_slice(), &[2, 2, 2]);
    assert_eq!(f64s(y), vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0, 10.0, 11.0]);
    // Repeated indices accumulate their gradients.
    y.sum().unwrap().backward().unwrap();
    assert_eq!(
        emb.weight().grad().unwrap().to_f64_vec(),
        vec![1.0, 1.0, 1.0, 1.0, 2.0, 2.0]
    );
    let bad = g.from_f64(&[3.0], &[1], DType::F64).unwrap();
    assert!(matches!(
        emb.forward(&g, bad),
        Err(NnError::IndexOutOfRange {
            index: 3,
            bound: 3,
            ..
        })
    ));
    let frac = g.from_f64(&[0.5], &[1], DType::F64).unwrap();
    assert!(matches!(
        emb.forward(&g, frac),
        Err(NnError::NotAnIndex { .. })
    ));
    // Gradient with respect to the table.
    let r = gradcheck(
        check_fn(|_g, xs| {
            F::embedding(xs[0], &[1, 3, 1, 0], &[2, 2]).map_err(|e| match e {
                NnError::Graph(e) => e,
                other => panic!("{other}"),
            })
        }),
        &[input(&[4, 3], 13)],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(r.passed, "{r}");
    let e = Embedding::new(5, 3, &mut Rng::seed(0)).unwrap();
    assert_eq!(
        e.lookup(&g, &[4], &[1]).unwrap().shape().as_slice(),
        &[1, 3]
    );
    // Token ids as PyTorch holds them, i64 or i32 tensors: the rows of the same lookup, and
    // the gradient reaches the weight's rows; an id past the table is a typed error.
    let want = e
        .lookup(&g, &[4, 0, 4, 2], &[2, 2])
        .unwrap()
        .to_vec_f64()
        .unwrap();
    let ids64 = g.from_slice(&[4i64, 0, 4, 2], &[2, 2]).unwrap();
    let ids32 = g.from_slice(&[4i32, 0, 4, 2], &[2, 2]).unwrap();
    for ids in [ids64, ids32] {
        let y = e.forward(&g, ids).unwrap();
        assert_eq!(y.shape().as_slice(), &[2, 2, 3]);
        assert_eq!(y.to_vec_f64().unwrap(), want);
    }
    let past = g.from_slice(&[5i64], &[1]).unwrap();
    assert!(e
        .forward(&g, past)
        .unwrap_err()
        .to_string()
        .contains("embedding"));
}

#[test]
fn activation_values_and_gradchecks() {
    let g = Graph::new();
    let x = g.from_f64(&[-1.0, 0.5, 1.0], &[3], DType::F64).unwrap();
    assert_eq!(f64s(ReLU.forward(&g, x).unwrap()), vec![0.0, 0.5, 1.0]);
    close(
        &f64s(Tanh.forward(&g, x).unwrap()),
        &[(-1f64).tanh(), 0.5f64.tanh(), 1f64.tanh()],
        1e-15,
    );
    let s = |v: f64| 1.0 / (1.0 + (-v).exp());
    close(
        &f64s(Sigmoid.forward(&g, x).unwrap()),
        &[s(-1.0), s(0.5), s(1.0)],
        1e-15,
    );
    // PyTorch's F.gelu(x) at ±1: x·Φ(x).
    let gelu = f64s(GELU.forward(&g, x).unwrap());
    assert!(
        (gelu[2] - 0.841_344_746_068_542_9).abs() < 1e-12,
        "{gelu:?}"
    );
    assert!(
        (gelu[0] + 0.158_655_253_931_457_07).abs() < 1e-12,
        "{gelu:?}"
    );
    let gelu = f64s(GELUTanh.forward(&g, x).unwrap());
    assert!(
        (gelu[2] - 0.841_191_990_607_477_6).abs() < 1e-12,
        "{gelu:?}"
    );
    assert!(
        (gelu[0] + 0.158_808_009_392_522_4).abs() < 1e-12,
        "{gelu:?}"
    );
    // Away from ReLU's kink.
    let xin = ht(&[-0.7, -0.2, 0.3, 0.9, 1.4, -1.1], &[2, 3]);
    assert_gradcheck(&ReLU, &xin);
    assert_gradcheck(&Tanh, &xin);
    assert_gradcheck(&Sigmoid, &xin);
    assert_gradcheck(&GELU, &xin);
    assert_gradcheck(&LeakyReLU::new(0.2), &xin);
    assert_eq!(
        f64s(LeakyReLU::default().forward(&g, x).unwrap()),
        vec![-0.01, 0.5, 1.0]
    );
}

#[test]
fn flatten_shapes() {
    let g = Graph::new();
    let x = g.zeros(&[2, 3, 4, 5], DType::F32).unwrap();
    assert_eq!(
        Flatten::new().forward(&g, x).unwrap().shape().as_slice(),
        &[2, 60]
    );
    assert_eq!(
        Flatten::range(1, 2)
            .forward(&g, x)
            .unwrap()
            .shape()
            .as_slice(),
        &[2, 12, 5]
    );
    assert_eq!(
        Flatten::range(0, -1)
            .forward(&g, x)
            .unwrap()
            .shape()
            .as_slice(),
        &[120]
    );
    assert!(matches!(
        Flatten::range(2, 1).forward(&g, x),
        Err(NnError::InputShape { .. })
    ));
    assert_gradcheck(&Flatten::new(), &input(&[2, 2, 3], 1));
}

#[test]
fn sequential_composes_names_modes_and_gradients() {
    let mut rng = Rng::seed(21);
    let mut cnn = Sequential::new()
        .add(conv_f64(
            1,
            2,
            (3, 3),
            Conv2dConfig::default().padding(1),
            22,
        ))
        .add(BatchNorm2d::with_config(2, bn_f64()).unwrap())
        .add(Tanh)
        .add(AvgPool2d::new((2, 2)).unwrap())
        .add(Flatten::new())
        .add(f64_linear(8, 3, &mut rng))
        .add(Dropout::new(0.3).unwrap());
    assert_eq!(cnn.len(), 7);
    let names: Vec<String> = cnn.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"]
    );
    let buffers: Vec<String> = cnn.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(buffers, ["1.running_mean", "1.running_var"]);
    assert_eq!(cnn.num_parameters(), 18 + 2 + 2 + 2 + 24 + 3);
    assert_gradcheck(&cnn, &input(&[3, 1, 4, 4], 23));
    cnn.eval();
    assert_gradcheck(&cnn, &input(&[3, 1, 4, 4], 24));
    // eval reached the BatchNorm and the Dropout: two evaluations agree exactly.
    let g = Graph::new();
    let x = g.from_host(&input(&[2, 1, 4, 4], 25)).unwrap();
    assert_eq!(
        f64s(cnn.forward(&g, x).unwrap()),
        f64s(cnn.forward(&g, x).unwrap())
    );
    cnn.assign_names();
    assert_eq!(cnn.parameters()[4].name(), "5.weight");
}

#[test]
fn module_trait_helpers() {
    let mut rng = Rng::seed(0);
    let shared = Linear::new(3, 3, &mut rng).unwrap();
    let twin = Linear::from_parameters(shared.weight().clone(), shared.bias().cloned()).unwrap();
    let m = Sequential::new().add(shared).add(ReLU).add(twin);
    // A shared parameter is listed once for optimisers, twice (by both names) for checkpoints.
    assert_eq!(m.parameters().len(), 2);
    assert_eq!(m.named_state().len(), 4);
    let g = Graph::new();
    let y = m
        .forward(&g, g.randn(&[2, 3], DType::F32).unwrap())
        .unwrap();
    y.sum().unwrap().backward().unwrap();
    assert!(m.parameters().iter().all(|p| p.grad().is_some()));
    m.zero_grad();
    assert!(m.parameters().iter().all(|p| p.grad().is_none()));
    let empty = Sequential::new();
    assert!(empty.is_empty());
    let x = g.ones(&[2], DType::F32).unwrap();
    assert_eq!(
        empty.forward(&g, x).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 1.0]
    );
}

#[test]
fn gradcheck_module_rejects_f32_parameters() {
    let fc = Linear::new(2, 2, &mut Rng::seed(0)).unwrap();
    let e = gradcheck_module(&fc, &input(&[1, 2], 0), GradcheckOptions::default()).unwrap_err();
    assert!(matches!(e, NnError::DType { .. }), "{e}");
}

#[test]
fn gradcheck_module_catches_a_wrong_gradient() {
    use arenagrad_nn::Lambda;
    // x ↦ x·stop_gradient(x): the analytic gradient (x) is half the true one (2x).
    let wrong = Lambda::new(|_g, x| Ok(x.mul(x.detach()?)?));
    let r = gradcheck_module(&wrong, &input(&[4], 3), GradcheckOptions::default()).unwrap();
    assert!(!r.passed, "{r}");
}

/// LeakyReLU as PyTorch: the gradient is the negative slope at 0 and at NaN, and NaN stays NaN.
#[test]
fn leaky_relu_at_zero_and_nan() {
    let g = Graph::new();
    let x = g
        .leaf(&[0.0, -0.0, f64::NAN, 2.0, -2.0], &[5], DType::F64)
        .unwrap();
    let y = LeakyReLU::new(0.01).forward(&g, x).unwrap();
    let yv = f64s(y);
    assert!(yv[2].is_nan());
    close(&[yv[0], yv[1], yv[3], yv[4]], &[0.0, 0.0, 2.0, -0.02], 0.0);
    y.sum().unwrap().backward().unwrap();
    let gx = f64s(x.grad().unwrap().unwrap());
    close(&gx, &[0.01, 0.01, 0.01, 1.0, 0.01], 0.0);
}

/// A batch norm given a tensor of another graph refuses it before its running statistics move.
#[test]
fn batch_norm_refuses_another_graphs_tensor_and_keeps_its_statistics() {
    let bn = BatchNorm1d::new(2).unwrap();
    let before = arenagrad_nn::checkpoint::state_dict(&bn);
    assert!(before.iter().any(|(n, _)| n == "running_mean"));
    let g1 = Graph::new();
    let g2 = Graph::new();
    let x = g1
        .leaf(&[1.0, 2.0, 3.0, 5.0, 8.0, 13.0], &[3, 2], DType::F32)
        .unwrap();
    let r = bn.forward(&g2, x);
    assert!(
        matches!(
            r,
            Err(NnError::Graph(
                arenagrad_nn::GraphError::GraphMismatch { .. }
            ))
        ),
        "{r:?}"
    );
    assert_eq!(before, arenagrad_nn::checkpoint::state_dict(&bn));
}

/// One `Nonlinearity` serves the initialisers' gains and the Elman RNN; the RNN applies only tanh
/// and relu and refuses the rest when made, as PyTorch's `nn.RNN(nonlinearity='sigmoid')` does.
#[test]
fn elman_rnn_refuses_a_nonlinearity_it_cannot_apply() {
    use arenagrad_nn::{init::calculate_gain, Nonlinearity, RNNCell, RnnConfig, LSTM, RNN};
    let mut rng = Rng::seed(0);
    for f in [
        Nonlinearity::Linear,
        Nonlinearity::Sigmoid,
        Nonlinearity::LeakyReLU,
        Nonlinearity::SELU,
    ] {
        let cfg = RnnConfig {
            nonlinearity: f,
            ..RnnConfig::default()
        };
        for err in [
            RNNCell::with_config(3, 4, cfg, &mut rng).err(),
            RNN::with_config(3, 4, cfg, &mut rng).err(),
        ] {
            let Some(NnError::InvalidConfig { component, reason }) = err else {
                panic!("{f:?}: {err:?}");
            };
            assert!(component.starts_with("RNN"), "{component}");
            assert!(reason.contains(f.name()), "{reason}");
        }
        // The LSTM has its own gates: the option does not apply, as in PyTorch.
        assert!(LSTM::with_config(3, 4, cfg, &mut rng).is_ok());
    }
    for f in [Nonlinearity::Tanh, Nonlinearity::ReLU] {
        let cfg = RnnConfig {
            nonlinearity: f,
            ..RnnConfig::default()
        };
        assert!(RNN::with_config(3, 4, cfg, &mut rng).is_ok(), "{f:?}");
    }
    assert_eq!(calculate_gain(Nonlinearity::ReLU, 0.0), 2f64.sqrt());
    assert_eq!(calculate_gain(Nonlinearity::Tanh, 0.0), 5.0 / 3.0);
}
