//! The graph's count of floating-point work against counts by hand: a matrix product, a
//! convolution, and one training step of a small MLP (forward and backward, per op kind), and the
//! count starting again at each reset.

use arenagrad::nn::{loss, Conv2d, Conv2dConfig, Linear, Module, ReLU, Rng, Sequential};
use arenagrad::{DType, Graph};

#[test]
fn matmul_counts_two_mnk_and_once_more_per_gradient() {
    let mut g = Graph::new();
    let a = g.leaf(&[0.5; 2 * 3 * 4], &[2, 3, 4], DType::F32).unwrap();
    let b = g.from_f64(&[0.5; 4 * 5], &[4, 5], DType::F32).unwrap(); // no gradient asked
    a.matmul(b).unwrap().sum().unwrap().backward().unwrap();
    let mm = g.stats().flops.of("matmul").unwrap();
    assert_eq!(
        mm.forward,
        2 * 2 * 3 * 4 * 5,
        "a batch of two [3, 4]·[4, 5]"
    );
    assert_eq!(mm.backward, mm.forward, "only a's gradient");
    g.reset();
    assert_eq!(
        g.stats().flops.total(),
        0,
        "the reset starts the count again"
    );
}

#[test]
fn conv2d_counts_its_gemm_and_bias() {
    let g = Graph::new();
    let conv = Conv2d::with_config(
        3,
        4,
        (3, 3),
        Conv2dConfig::default().padding(1),
        &mut Rng::seed(0),
    )
    .unwrap();
    let x = g
        .leaf(&[0.1; 2 * 3 * 5 * 5], &[2, 3, 5, 5], DType::F32)
        .unwrap();
    let y = conv.forward(&g, x).unwrap();
    assert_eq!(y.shape().as_slice(), &[2, 4, 5, 5]);
    y.sum().unwrap().backward().unwrap();
    let c = g.stats().flops.of("conv2d").unwrap();
    // The GEMM [o = 4, k = 3·3·3] · [k, n·l = 2·25], and the bias added to each output.
    let gemm = 2 * 4 * 27 * 50;
    let bias = 4 * 50;
    assert_eq!(c.forward, gemm + bias);
    // The weight's and the input's gradients (a GEMM each) and the bias's (a sum).
    assert_eq!(c.backward, 2 * gemm + bias);
}

#[test]
fn an_mlp_step_counts_by_hand() {
    let g = Graph::new();
    let mut rng = Rng::seed(0);
    let model = Sequential::new()
        .add(Linear::new(4, 3, &mut rng).unwrap())
        .add(ReLU)
        .add(Linear::new(3, 2, &mut rng).unwrap());
    let x = g.from_f64(&[0.3; 5 * 4], &[5, 4], DType::F32).unwrap();
    let l = loss::cross_entropy(model.forward(&g, x).unwrap(), &[0, 1, 1, 0, 1]).unwrap();
    l.backward().unwrap();
    let f = g.stats().flops;
    let addmm = f.of("addmm").unwrap();
    // x·W₁ᵀ + b₁ ([5, 4]·[4, 3], plus the bias) and h·W₂ᵀ + b₂ ([5, 3]·[3, 2]).
    assert_eq!(
        addmm.forward,
        (2 * 5 * 4 * 3 + 5 * 3) + (2 * 5 * 3 * 2 + 5 * 2)
    );
    // Layer 1: W₁'s and b₁'s gradients (x needs none); layer 2: W₂'s, b₂'s and h's.
    assert_eq!(
        addmm.backward,
        (2 * 5 * 4 * 3 + 5 * 3) + (2 * 2 * 5 * 3 * 2 + 5 * 2)
    );
    let relu = f.of("relu").unwrap();
    assert_eq!((relu.forward, relu.backward), (15, 15));
    assert!(f.of("reshape").is_none(), "moving data counts nothing");
    assert_eq!(f.total(), f.forward() + f.backward());
    assert!(
        f.forward() > addmm.forward && f.backward() > addmm.backward,
        "{f:?}"
    );
}
