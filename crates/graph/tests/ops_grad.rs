//! Every op: a value test against hand-computed numbers, and a gradient check against central
//! finite differences in f64 (PyTorch's tolerances), including broadcast cases.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_graph::exec::Domain;
use arenagrad_graph::{
    device_test, BinaryOp, DType, Device, Graph, HostTensor, Result, Tensor, UnaryOp,
};

mod common;

type Unary = for<'g> fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>;

fn ht(shape: &[usize], seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::new::<f64>(common::values(n, seed, false), shape).unwrap()
}

fn pos(shape: &[usize], seed: u64) -> HostTensor {
    let mut h = ht(shape, seed);
    if let arenagrad_graph::HostDataMut::F64(v) = h.data_mut() {
        v.iter_mut().for_each(|x| *x = x.abs() + 0.3);
    }
    h
}

/// Values of this shape inside `domain`.
fn in_domain(domain: Domain, shape: &[usize], seed: u64) -> HostTensor {
    match domain {
        Domain::All => ht(shape, seed),
        Domain::Positive => pos(shape, seed),
    }
}

fn check<F>(dev: Device, name: &str, f: F, inputs: &[HostTensor])
where
    F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
{
    let opts = GradcheckOptions {
        device: dev,
        ..GradcheckOptions::default()
    };
    let r = gradcheck(f, inputs, opts).unwrap();
    assert!(r.passed, "{name}: {r}");
}

fn values(g: &Graph, t: Tensor<'_>) -> Vec<f64> {
    let _ = g;
    t.to_vec_f64().unwrap()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 + 1e-9 * y.abs(), "{a:?} vs {b:?}");
    }
}

device_test! {
fn binary_values(dev) {
    let g = Graph::on(dev).unwrap();
    let a = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)
        .unwrap();
    let b = g.from_f64(&[10.0, 20.0], &[2], DType::F64).unwrap();
    close(&values(&g, a.add(b).unwrap()), &[11.0, 22.0, 13.0, 24.0]);
    close(&values(&g, a.sub(b).unwrap()), &[-9.0, -18.0, -7.0, -16.0]);
    close(&values(&g, a.mul(b).unwrap()), &[10.0, 40.0, 30.0, 80.0]);
    close(&values(&g, a.div(b).unwrap()), &[0.1, 0.1, 0.3, 0.2]);
    let c = g.from_f64(&[2.0, 0.5], &[2, 1], DType::F64).unwrap();
    close(
        &values(&g, a.pow(c).unwrap()),
        &[1.0, 4.0, 3f64.sqrt(), 2.0],
    );
    let m = g.from_f64(&[2.5], &[1], DType::F64).unwrap();
    close(&values(&g, a.maximum(m).unwrap()), &[2.5, 2.5, 3.0, 4.0]);
    close(&values(&g, a.minimum(m).unwrap()), &[1.0, 2.0, 2.5, 2.5]);
    // operators
    close(
        &values(&g, (a * 2.0 + 1.0) / 2.0 - 0.5),
        &[1.0, 2.0, 3.0, 4.0],
    );
    close(&values(&g, -(a + a) * a), &[-2.0, -8.0, -18.0, -32.0]);
}
}

device_test! {
fn binary_grads_with_broadcasting(dev) {
    let cases: [(&str, &[usize], &[usize]); 5] = [
        ("same", &[2, 3], &[2, 3]),
        ("row", &[2, 3], &[3]),
        ("col", &[2, 3], &[2, 1]),
        ("outer", &[3, 1], &[1, 4]),
        ("scalar", &[], &[2, 2]),
    ];
    // Every public row of the binary table (comparisons included: no gradient, and none
    // numerically away from ties), each operand inside the row's domain.
    for (label, sa, sb) in cases {
        for &op in BinaryOp::KINDS.iter().filter(|op| op.is_public()) {
            let (da, db) = op.domain();
            let ins = [in_domain(da, sa, 1), in_domain(db, sb, 2)];
            let name = format!("{} {label}", op.name());
            check(dev, &name, check_fn(move |_, x| x[0].binary(op, x[1])), &ins);
        }
    }
}
}

device_test! {
fn unary_values(dev) {
    let g = Graph::on(dev).unwrap();
    let x = g.from_f64(&[-2.0, 0.5, 1.0], &[3], DType::F64).unwrap();
    let f = |t: Result<Tensor<'_>>| t.unwrap().to_vec_f64().unwrap();
    close(&f(x.neg()), &[2.0, -0.5, -1.0]);
    close(&f(x.exp()), &[(-2f64).exp(), 0.5f64.exp(), 1f64.exp()]);
    close(&f(x.abs()), &[2.0, 0.5, 1.0]);
    close(&f(x.abs().unwrap().log()), &[2f64.ln(), 0.5f64.ln(), 0.0]);
    close(
        &f(x.abs().unwrap().sqrt()),
        &[2f64.sqrt(), 0.5f64.sqrt(), 1.0],
    );
    close(&f(x.sin()), &[(-2f64).sin(), 0.5f64.sin(), 1f64.sin()]);
    close(&f(x.cos()), &[(-2f64).cos(), 0.5f64.cos(), 1f64.cos()]);
    close(&f(x.tanh()), &[(-2f64).tanh(), 0.5f64.tanh(), 1f64.tanh()]);
    close(
        &f(x.sigmoid()),
        &[
            1.0 / (1.0 + 2f64.exp()),
            1.0 / (1.0 + (-0.5f64).exp()),
            1.0 / (1.0 + (-1f64).exp()),
        ],
    );
    close(&f(x.relu()), &[0.0, 0.5, 1.0]);
    // gelu(1) with the tanh approximation, computed by hand.
    let gelu = |v: f64| {
        0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
    };
    close(&f(x.gelu_tanh()), &[gelu(-2.0), gelu(0.5), gelu(1.0)]);
    // Exact gelu x·Φ(x) at -2, 0.5, 1 (Python's math.erf).
    close(
        &f(x.gelu()),
        &[-0.045_500_263_896_358_42, 0.345_731_230_637_006_56, 0.841_344_746_068_542_9],
    );
    close(&f(x.scale(3.0)), &[-6.0, 1.5, 3.0]);
    close(&f(x.shift(1.0)), &[-1.0, 1.5, 2.0]);
    close(&f(x.powf(3.0)), &[-8.0, 0.125, 1.0]);
}
}

device_test! {
fn unary_grads(dev) {
    // Every public row of the unary table at each of its sample constants, inside its domain
    // (a new row is checked the moment it exists); then the cases the rows' samples miss.
    let s = [2usize, 3];
    for &op in UnaryOp::SAMPLES.iter().filter(|op| op.is_public()) {
        let x = [in_domain(op.domain(), &s, 5)];
        let name = format!("{} {:?}", op.name(), op.param());
        check(dev, &name, check_fn(move |_, x| x[0].unary(op)), &x);
    }
    let x = [ht(&s, 5)];
    let p = [pos(&s, 6)];
    // Across the threshold at 20 (x itself above it).
    check(dev, "softplus tail", check_fn(|_, x| x[0].scale(12.0)?.softplus()), &x);
    check(dev, "scale", check_fn(|_, x| x[0].scale(-2.5)), &x);
    check(dev, "shift", check_fn(|_, x| x[0].shift(0.7)), &x);
    check(dev, "powf", check_fn(|_, x| x[0].powf(3.0)), &x);
    check(dev, "powf frac", check_fn(|_, x| x[0].powf(1.5)), &p);
}
}

device_test! {
fn reduction_values_and_grads(dev) {
    let g = Graph::on(dev).unwrap();
    let x = g
        .from_f64(
            &(0..6).map(f64::from).collect::<Vec<_>>(),
            &[2, 3],
            DType::F64,
        )
        .unwrap();
    close(&values(&g, x.sum().unwrap()), &[15.0]);
    close(
        &values(&g, x.sum_axes(&[0], false).unwrap()),
        &[3.0, 5.0, 7.0],
    );
    assert_eq!(x.sum_axes(&[1], true).unwrap().shape().as_slice(), &[2, 1]);
    close(&values(&g, x.mean_axes(&[-1], false).unwrap()), &[1.0, 4.0]);
    close(&values(&g, x.mean().unwrap()), &[2.5]);
    close(&values(&g, x.max_axes(&[1], false).unwrap()), &[2.0, 5.0]);
    close(&values(&g, x.max().unwrap()), &[5.0]);
    let s = [3usize, 4];
    let i = [ht(&s, 7)];
    check(dev, "sum", check_fn(|_, x| x[0].sum()), &i);
    check(dev, "sum axis0", check_fn(|_, x| x[0].sum_axes(&[0], false)), &i);
    check(
        dev,
        "sum keepdim",
        check_fn(|_, x| x[0].sum_axes(&[1], true)),
        &i,
    );
    check(dev, "mean", check_fn(|_, x| x[0].mean_axes(&[-1], false)), &i);
    check(dev, "max all", check_fn(|_, x| x[0].max()), &i);
    check(dev, "max axis", check_fn(|_, x| x[0].max_axes(&[0], true)), &i);
    check(
        dev,
        "sum 3d",
        check_fn(|_, x| x[0].sum_axes(&[0, 2], false)),
        &[ht(&[2, 3, 2], 8)],
    );
}
}

/// `a` [2, 3] and `b` [3, 2] with `a·b = [[4, 5], [10, 11]]`.
fn two_matrices(g: &Graph) -> (Tensor<'_>, Tensor<'_>) {
    let a = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64)
        .unwrap();
    let b = g
        .from_f64(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2], DType::F64)
        .unwrap();
    (a, b)
}

device_test! {
fn matmul_values_and_grads(dev) {
    let g = Graph::on(dev).unwrap();
    let (a, b) = two_matrices(&g);
    close(&values(&g, a.matmul(b).unwrap()), &[4.0, 5.0, 10.0, 11.0]);
    let v = g.from_f64(&[1.0, 1.0, 1.0], &[3], DType::F64).unwrap();
    let av = a.matmul(v).unwrap();
    assert_eq!(av.shape().as_slice(), &[2]);
    close(&values(&g, av), &[6.0, 15.0]);
    check(
        dev,
        "mm",
        check_fn(|_, x| x[0].matmul(x[1])),
        &[ht(&[3, 4], 1), ht(&[4, 2], 2)],
    );
    check(
        dev,
        "mv",
        check_fn(|_, x| x[0].matmul(x[1])),
        &[ht(&[3, 4], 1), ht(&[4], 2)],
    );
    check(
        dev,
        "vm",
        check_fn(|_, x| x[0].matmul(x[1])),
        &[ht(&[4], 1), ht(&[4, 2], 2)],
    );
    check(
        dev,
        "bmm",
        check_fn(|_, x| x[0].matmul(x[1])),
        &[ht(&[2, 3, 4], 1), ht(&[2, 4, 2], 2)],
    );
    check(
        dev,
        "bmm broadcast",
        check_fn(|_, x| x[0].matmul(x[1])),
        &[ht(&[2, 1, 3, 4], 1), ht(&[3, 4, 2], 2)],
    );
    check(
        dev,
        "mm of transposes",
        check_fn(|_, x| x[0].t()?.matmul(x[1].t()?)),
        &[ht(&[4, 3], 1), ht(&[2, 4], 2)],
    );
}
}

device_test! {
fn addmm_values_and_grads(dev) {
    let g = Graph::on(dev).unwrap();
    let (a, b) = two_matrices(&g);
    // a·b = [[4, 5], [10, 11]], plus each form of bias.
    let col = g.from_f64(&[100.0, 200.0], &[2, 1], DType::F64).unwrap();
    close(&values(&g, col.addmm_t(a, b, false, false).unwrap()), &[104.0, 105.0, 210.0, 211.0]);
    let row = g.from_f64(&[100.0, 200.0], &[2], DType::F64).unwrap();
    close(&values(&g, row.addmm_t(a, b, false, false).unwrap()), &[104.0, 205.0, 110.0, 211.0]);
    let one = g.from_f64(&[1.0], &[], DType::F64).unwrap();
    close(&values(&g, one.addmm_t(a, b, false, false).unwrap()), &[5.0, 6.0, 11.0, 12.0]);
    // Transposed operands read through strides: aᵀ is [3, 2], bᵀ is [2, 3].
    let full = g.from_f64(&[1.0; 9], &[3, 3], DType::F64).unwrap();
    let t = full.addmm_t(a, b, true, true).unwrap();
    let want = a.t().unwrap().matmul(b.t().unwrap()).unwrap().shift(1.0).unwrap();
    close(&values(&g, t), &values(&g, want));
    // A bias of another shape broadcasts as `add` would, or is add's error.
    let wide = g.from_f64(&[1.0; 8], &[2, 2, 2], DType::F64).unwrap();
    assert_eq!(wide.addmm_t(a, b, false, false).unwrap().shape().as_slice(), &[2, 2, 2]);
    let bad = g.from_f64(&[1.0; 3], &[3], DType::F64).unwrap();
    assert!(bad.addmm_t(a, b, false, false).is_err());
    assert!(col.addmm_t(a, a, false, false).is_err(), "inner dimensions differ");
    for (name, shape) in [("[m, n]", &[3, 2][..]), ("[m, 1]", &[3, 1]), ("[1, n]", &[1, 2]), ("[n]", &[2]), ("[]", &[])] {
        check(
            dev,
            &format!("addmm, bias {name}"),
            check_fn(|_, x| x[0].addmm_t(x[1], x[2], false, true)),
            &[ht(shape, 3), ht(&[3, 4], 1), ht(&[2, 4], 2)],
        );
    }
    check(
        dev,
        "addmm, transposed a, empty inner dimension",
        check_fn(|_, x| x[0].addmm_t(x[1], x[2], true, false)),
        &[ht(&[2, 3], 3), ht(&[0, 2], 1), ht(&[0, 3], 2)],
    );
}
}

device_test! {
fn shape_op_values_and_grads(dev) {
    let g = Graph::on(dev).unwrap();
    let x = g
        .from_f64(
            &(0..6).map(f64::from).collect::<Vec<_>>(),
            &[2, 3],
            DType::F64,
        )
        .unwrap();
    close(&values(&g, x.t().unwrap()), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    assert_eq!(x.reshape(&[3, -1]).unwrap().shape().as_slice(), &[3, 2]);
    close(
        &values(&g, x.slice(1, 1, 3).unwrap()),
        &[1.0, 2.0, 4.0, 5.0],
    );
    close(
        &values(&g, x.index_select(1, &[2, 0, 2]).unwrap()),
        &[2.0, 0.0, 2.0, 5.0, 3.0, 5.0],
    );
    close(
        &values(&g, x.gather(1, &[2, 1], &[2, 1]).unwrap()),
        &[2.0, 4.0],
    );
    close(
        &values(&g, g.concat(&[x, x], 0).unwrap()),
        &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
    );
    let r = g.from_f64(&[1.0, 2.0], &[2, 1], DType::F64).unwrap();
    close(
        &values(&g, r.broadcast_to(&[2, 2]).unwrap()),
        &[1.0, 1.0, 2.0, 2.0],
    );
    let p = x.reshape(&[1, 2, 3]).unwrap().permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape().as_slice(), &[3, 1, 2]);
    close(&values(&g, p), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let i = [ht(&[2, 3, 4], 9)];
    check(dev, "reshape", check_fn(|_, x| x[0].reshape(&[4, -1])), &i);
    check(dev, "permute", check_fn(|_, x| x[0].permute(&[2, 0, 1])), &i);
    check(dev, "transpose", check_fn(|_, x| x[0].transpose(0, 2)), &i);
    check(
        dev,
        "broadcast",
        check_fn(|_, x| x[0].broadcast_to(&[3, 2, 3, 4])),
        &i,
    );
    check(dev, "slice", check_fn(|_, x| x[0].slice(-1, 1, 3)), &i);
    check(dev, "narrow", check_fn(|_, x| x[0].narrow(1, 0, 2)), &i);
    check(
        dev,
        "index_select",
        check_fn(|_, x| x[0].index_select(2, &[3, 0, 3, 1])),
        &i,
    );
    check(
        dev,
        "gather",
        check_fn(|_, x| x[0].gather(1, &[0, 2, 1, 1, 0, 0, 2, 2], &[2, 1, 4])),
        &i,
    );
    check(
        dev,
        "concat",
        check_fn(|g, x| g.concat(&[x[0], x[1], x[0]], 1)),
        &[ht(&[2, 3], 1), ht(&[2, 1], 2)],
    );
}
}

device_test! {
fn softmax_values_and_grads(dev) {
    let g = Graph::on(dev).unwrap();
    let x = g.from_f64(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let e: Vec<f64> = [1f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
    let s: f64 = e.iter().sum();
    close(
        &values(&g, x.softmax(0).unwrap()),
        &e.iter().map(|v| v / s).collect::<Vec<_>>(),
    );
    close(
        &values(&g, x.log_softmax(-1).unwrap()),
        &e.iter().map(|v| (v / s).ln()).collect::<Vec<_>>(),
    );
    let big = g.from_f64(&[1000.0, 1000.0], &[2], DType::F64).unwrap();
    close(&values(&g, big.softmax(0).unwrap()), &[0.5, 0.5]);
    let i = [ht(&[3, 4], 11)];
    check(dev, "softmax", check_fn(|_, x| x[0].softmax(1)), &i);
    check(dev, "softmax axis0", check_fn(|_, x| x[0].softmax(0)), &i);
    check(dev, "log_softmax", check_fn(|_, x| x[0].log_softmax(-1)), &i);
}
}

device_test! {
fn where_values_and_grads(dev) {
    let g = Graph::on(dev).unwrap();
    let c = g.from_f64(&[1.0, 0.0, 1.0], &[3], DType::F64).unwrap();
    let a = g.from_f64(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let b = g.from_f64(&[-1.0], &[1], DType::F64).unwrap();
    close(&values(&g, g.where_cond(c, a, b).unwrap()), &[1.0, -1.0, 3.0]);
    // PyTorch's method form, `a.where(c, b)`, and a Bool condition.
    close(&values(&g, a.r#where(c, b).unwrap()), &[1.0, -1.0, 3.0]);
    let mask = a.gt(g.scalar(1.5, DType::F64).unwrap()).unwrap();
    assert_eq!(mask.dtype(), DType::Bool);
    close(&values(&g, a.r#where(mask, b).unwrap()), &[-1.0, 2.0, 3.0]);
    check(
        dev,
        "where",
        check_fn(|g, x| {
            let _ng = g.no_grad();
            let mask = x[0].relu()?; // nonzero where x0 > 0; no gradient to the condition
            drop(_ng);
            g.where_cond(mask, x[1], x[2])
        }),
        &[ht(&[2, 3], 1), ht(&[2, 3], 2), ht(&[3], 3)],
    );
}
}

device_test! {
fn second_derivatives(dev) {
    let o = GradcheckOptions {
        device: dev,
        ..GradcheckOptions::default()
    };
    let r = gradgradcheck(check_fn(|_, x| x[0].tanh()), &[ht(&[5], 1)], o).unwrap();
    assert!(r.passed, "tanh: {r}");
    let r = gradgradcheck(
        check_fn(|_, x| x[0].mul(x[0])?.mul(x[0])),
        &[ht(&[4], 2)],
        o,
    )
    .unwrap();
    assert!(r.passed, "x*x*x: {r}");
    let r = gradgradcheck(
        check_fn(|_, x| x[0].matmul(x[1])?.tanh()?.matmul(x[0].t()?)),
        &[ht(&[3, 4], 3), ht(&[4, 4], 4)],
        o,
    )
    .unwrap();
    assert!(r.passed, "matmul chain: {r}");
    let r = gradgradcheck(
        check_fn(|_, x| x[0].addmm_t(x[1], x[2], false, true)?.tanh()),
        &[ht(&[3, 1], 3), ht(&[3, 4], 4), ht(&[2, 4], 5)],
        o,
    )
    .unwrap();
    assert!(r.passed, "addmm: {r}");
    // Every public row of the unary and binary tables (a new row is checked the moment it
    // exists), operands inside the row's domain; then the composites the rows do not cover.
    for &op in UnaryOp::SAMPLES.iter().filter(|op| op.is_public()) {
        let x = in_domain(op.domain(), &[2, 3], 5);
        let r = gradgradcheck(check_fn(move |_, x| x[0].unary(op)), &[x], o).unwrap();
        assert!(r.passed, "{}: {r}", op.name());
    }
    for &op in BinaryOp::KINDS.iter().filter(|op| op.is_public()) {
        let (da, db) = op.domain();
        let ins = [in_domain(da, &[2, 3], 6), in_domain(db, &[2, 3], 7)];
        let r = gradgradcheck(check_fn(move |_, x| x[0].binary(op, x[1])), &ins, o).unwrap();
        assert!(r.passed, "{}: {r}", op.name());
    }
    let cases: [(&str, Unary); 4] = [
        ("softmax", (|_: &Graph, x: &[Tensor<'_>]| x[0].softmax(-1))),
        (
            "log_softmax",
            (|_: &Graph, x: &[Tensor<'_>]| x[0].log_softmax(-1)),
        ),
        ("div", (|_: &Graph, x: &[Tensor<'_>]| x[0].div(x[0].exp()?))),
        (
            "max",
            (|_: &Graph, x: &[Tensor<'_>]| x[0].mul(x[0])?.max_axes(&[1], false)),
        ),
    ];
    for (name, f) in cases {
        let r = gradgradcheck(f, &[ht(&[2, 3], 5)], o).unwrap();
        assert!(r.passed, "{name}: {r}");
    }
}
}

device_test! {
fn hand_derived_second_derivative_of_cube(dev) {
    // d²/dx² x³ = 6x.
    let g = Graph::on(dev).unwrap();
    let x = g.leaf(&[0.5, -2.0], &[2], DType::F64).unwrap();
    let y = x.mul(x).unwrap().mul(x).unwrap().sum().unwrap();
    let gx = arenagrad_graph::grad(
        y,
        &[x],
        arenagrad_graph::BackwardOptions {
            create_graph: true,
            ..Default::default()
        },
    )
    .unwrap()[0]
        .unwrap();
    close(&gx.to_vec_f64().unwrap(), &[0.75, 12.0]);
    let ggx =
        arenagrad_graph::grad(gx.sum().unwrap(), &[x], Default::default()).unwrap()[0].unwrap();
    close(&ggx.to_vec_f64().unwrap(), &[3.0, -12.0]);
}
}

device_test! {
fn f32_matches_f64(dev) {
    // Every public row of the unary and binary tables (at each sample constant, inside its
    // domain), then softmax: the f32 result within 1e-6 relative of the f64 one.
    let g = Graph::on(dev).unwrap();
    let both = |v: &[f64], f: &dyn Fn(Tensor<'_>) -> Result<Tensor<'_>>| {
        let run = |dtype| f(g.from_f64(v, &[v.len()], dtype).unwrap()).unwrap().to_vec_f64().unwrap();
        (run(DType::F32), run(DType::F64))
    };
    let wave = |seed: f64, domain: Domain| -> Vec<f64> {
        (0..40)
            .map(|i| (i as f64 * 0.37 + seed).sin() * 3.0)
            .map(|x| if domain == Domain::Positive { x.abs() + 0.3 } else { x })
            .collect()
    };
    let mut cases: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for &op in UnaryOp::SAMPLES.iter().filter(|op| op.is_public()) {
        let (a, b) = both(&wave(0.0, op.domain()), &|t| t.unary(op));
        cases.push((format!("{} {:?}", op.name(), op.param()), a, b));
    }
    for &op in BinaryOp::KINDS.iter().filter(|op| op.is_public()) {
        let (da, db) = op.domain();
        let rhs = wave(1.3, db);
        let (a, b) = both(&wave(0.0, da), &|t| {
            let r = t.graph().from_f64(&rhs, &[rhs.len()], t.dtype())?.to_device(t.device())?;
            t.binary(op, r)
        });
        cases.push((op.name().to_string(), a, b));
    }
    let (a, b) = both(&wave(0.0, Domain::All), &|t| t.reshape(&[4, 10])?.softmax(1));
    cases.push(("softmax".to_string(), a, b));
    for (name, a, b) in cases {
        assert_eq!(a.len(), b.len(), "{name}");
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
                "{name}: {x} vs {y}"
            );
        }
    }
}
}

device_test! {
fn cross_entropy_mean_value_grads_and_errors(dev) {
    let g = Graph::on(dev).unwrap();
    // Rows [2, 0, 0] and [0, 3, 0] against classes 0 and 1, by hand.
    let x = g
        .from_f64(&[2.0, 0.0, 0.0, 0.0, 3.0, 0.0], &[2, 3], DType::F64)
        .unwrap();
    let want = ((1.0 + 2.0 * (-2f64).exp()).ln() + (1.0 + 2.0 * (-3f64).exp()).ln()) / 2.0;
    close(&values(&g, x.cross_entropy_mean(&[0, 1]).unwrap()), &[want]);
    let f = check_fn(|_, x| x[0].cross_entropy_mean(&[2, 0, 1, 2]));
    check(dev, "cross_entropy", f, &[ht(&[4, 3], 7)]);
    let o = GradcheckOptions {
        device: dev,
        ..GradcheckOptions::default()
    };
    let r = gradgradcheck(f, &[ht(&[4, 3], 8)], o).unwrap();
    assert!(r.passed, "cross_entropy, second order: {r}");
    use arenagrad_graph::GraphError;
    let err = |r: Result<Tensor<'_>>| r.map(|_| ()).unwrap_err();
    assert!(matches!(err(x.cross_entropy_mean(&[0])), GraphError::ShapeMismatch { .. }));
    assert!(matches!(
        err(x.cross_entropy_mean(&[0, 3])),
        GraphError::IndexOutOfRange { index: 3, .. }
    ));
    let flat = x.reshape(&[6]).unwrap();
    assert!(matches!(err(flat.cross_entropy_mean(&[0])), GraphError::BadArgument { .. }));
}
}

/// Outputs of very different sizes: the finite difference of a small output must not be lost
/// in the rounding of a large one (the differences are taken per output element, then
/// projected, as PyTorch's numerical Jacobian does). Here one output is e^32.7 ≈ 1.6e14 and the
/// other e^−5.8: differencing the projected sum gave 0 for the second input's last element.
#[test]
fn gradcheck_keeps_small_outputs_beside_large_ones() {
    let x0 = HostTensor::new(
        vec![
            1.75f64, 2.25, 1.5, 2.0, 2.0, 1.5, 1.75, 2.0, 0.5, 0.75, 2.25, 1.25,
        ],
        &[4, 3],
    )
    .unwrap();
    let x1 = HostTensor::new(vec![1.5390625f64, -0.2734375], &[2]).unwrap();
    let f = check_fn(|_, x| x[0].sum()?.mul(x[1])?.exp());
    let r = gradcheck(f, &[x0, x1], GradcheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
}
