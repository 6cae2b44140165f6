//! Every op on a CUDA device against the CPU: values and gradients, f32 within 1e-4 relative and
//! f64 within 1e-10. Skipped (with the reason shown) where no GPU is usable, unless
//! `ARENAGRAD_TEST_CUDA=1`.

use arenagrad_graph::exec::Domain;
use arenagrad_graph::testing::{cuda_test_device, skip};
use arenagrad_graph::{
    AttentionOptions, BinaryOp, DType, Device, Graph, Result, ScatterReduce, Tensor, UnaryOp,
};

mod common;

type Build = for<'g> fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>;

use common::values as data;

/// Values of `f` and the gradients of Σ w·f with respect to each input, on `dev`.
fn run<F>(
    dev: Device,
    dtype: DType,
    f: &F,
    shapes: &[&[usize]],
    positive: bool,
) -> (Vec<f64>, Vec<Vec<f64>>)
where
    F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
{
    let g = Graph::on(dev).unwrap();
    let xs: Vec<Tensor<'_>> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n = s.iter().product();
            g.from_f64(&data(n, k as u64 + 1, positive), s, dtype)
                .unwrap()
                .set_requires_grad(true)
                .unwrap()
        })
        .collect();
    let y = f(&g, &xs).unwrap();
    assert_eq!(y.device(), dev);
    let w = g
        .from_f64(&data(y.numel(), 99, false), &y.shape(), dtype)
        .unwrap();
    y.mul(w).unwrap().sum().unwrap().backward().unwrap();
    let grads = xs
        .iter()
        .map(|x| match x.grad().unwrap() {
            Some(t) => t.to_vec_f64().unwrap(),
            None => vec![0.0; x.numel()],
        })
        .collect();
    (y.to_vec_f64().unwrap(), grads)
}

fn close(what: &str, a: &[f64], b: &[f64], rtol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        let tol = rtol * y.abs().max(1.0);
        assert!(
            (x - y).abs() <= tol,
            "{what}: element {k}: cuda {x} vs cpu {y}"
        );
    }
}

fn parity<F>(name: &str, f: F, shapes: &[&[usize]], positive: bool)
where
    F: for<'g> Fn(&'g Graph, &[Tensor<'g>]) -> Result<Tensor<'g>>,
{
    let Some(dev) = cuda_test_device() else {
        return;
    };
    for (dtype, rtol) in [(DType::F32, 1e-4), (DType::F64, 1e-10)] {
        let (yc, gc) = run(Device::Cpu, dtype, &f, shapes, positive);
        let (yd, gd) = run(dev, dtype, &f, shapes, positive);
        close(&format!("{name} {dtype} value"), &yd, &yc, rtol);
        for (k, (a, b)) in gd.iter().zip(&gc).enumerate() {
            close(&format!("{name} {dtype} grad {k}"), a, b, rtol);
        }
    }
}

macro_rules! parity_tests {
    ($($name:ident: $shapes:expr, $pos:expr, |$g:ident, $x:ident| $body:expr;)+) => {
        $(
            #[test]
            fn $name() {
                fn f<'g>($g: &'g Graph, $x: &[Tensor<'g>]) -> Result<Tensor<'g>> {
                    let _ = $g;
                    $body
                }
                parity(stringify!($name), f as Build, $shapes, $pos);
            }
        )+
    };
}

/// Every public row of the unary table (at each sample constant) and of the binary table, on
/// the device against the CPU: a new row is compared the moment it exists. Operands inside the
/// row's domain; a binary op's result times its left operand, so that a gradient flows through
/// comparisons too.
#[test]
fn every_public_elementwise_row() {
    for &op in UnaryOp::SAMPLES.iter().filter(|op| op.is_public()) {
        let name = format!("{} {:?}", op.name(), op.param());
        let positive = op.domain() == Domain::Positive;
        parity(&name, move |_, x| x[0].unary(op), &[&[3, 5]], positive);
    }
    for &op in BinaryOp::KINDS.iter().filter(|op| op.is_public()) {
        let (da, db) = op.domain();
        let positive = da == Domain::Positive || db == Domain::Positive;
        parity(
            op.name(),
            move |_, x| x[0].binary(op, x[1])?.mul(x[0]),
            &[&[2, 3, 4], &[3, 1]],
            positive,
        );
    }
}

parity_tests! {
    neg: &[&[3, 5]], false, |g, x| x[0].neg();
    exp: &[&[3, 5]], false, |g, x| x[0].exp();
    log: &[&[3, 5]], true, |g, x| x[0].log();
    sqrt: &[&[3, 5]], true, |g, x| x[0].sqrt();
    abs: &[&[3, 5]], false, |g, x| x[0].abs();
    sin: &[&[3, 5]], false, |g, x| x[0].sin();
    cos: &[&[3, 5]], false, |g, x| x[0].cos();
    tanh: &[&[3, 5]], false, |g, x| x[0].tanh();
    sigmoid: &[&[3, 5]], false, |g, x| x[0].sigmoid();
    relu: &[&[3, 5]], false, |g, x| x[0].relu();
    gelu: &[&[3, 5]], false, |g, x| x[0].gelu();
    gelu_tanh: &[&[3, 5]], false, |g, x| x[0].gelu_tanh();
    silu: &[&[3, 5]], false, |g, x| x[0].silu();
    softplus: &[&[3, 5]], false, |g, x| x[0].scale(8.0)?.softplus();
    erf: &[&[3, 5]], false, |g, x| x[0].erf();
    scale_shift: &[&[3, 5]], false, |g, x| x[0].scale(2.5)?.shift(-1.0);
    powf: &[&[3, 5]], true, |g, x| x[0].powf(2.5);
    add_broadcast: &[&[2, 3, 4], &[3, 1]], false, |g, x| x[0].add(x[1]);
    sub_broadcast: &[&[2, 3, 4], &[4]], false, |g, x| x[0].sub(x[1]);
    mul_broadcast: &[&[3, 1], &[1, 4]], false, |g, x| x[0].mul(x[1]);
    div_broadcast: &[&[2, 3], &[2, 1]], true, |g, x| x[0].div(x[1]);
    pow_broadcast: &[&[2, 3], &[3]], true, |g, x| x[0].pow(x[1]);
    maximum: &[&[4, 3], &[3]], false, |g, x| x[0].maximum(x[1]);
    minimum: &[&[4, 3], &[4, 1]], false, |g, x| x[0].minimum(x[1]);
    // Each mask times x, so that a gradient flows (through x, not the mask).
    comparisons: &[&[4, 3], &[3]], false, |g, x| {
        let (a, b) = (x[0], x[1]);
        let masks = [a.eq(a)?, a.ne(b)?, a.lt(b)?, a.le(b)?, a.gt(b)?, a.ge(b)?];
        let mut y = g.scalar(0.0, a.dtype())?.to_device(a.device())?;
        for (k, m) in masks.into_iter().enumerate() {
            y = y.add(m.scale(k as f64 + 1.0)?.mul(a)?)?;
        }
        Ok(y)
    };
    clamp: &[&[3, 5]], false, |g, x| x[0].clamp(Some(-0.5), Some(0.7));
    logsumexp: &[&[3, 5]], false, |g, x| x[0].logsumexp(&[1], false);
    tril: &[&[2, 3, 4]], false, |g, x| x[0].tril(1);
    gelu_exact_tail: &[&[3, 5]], false, |g, x| x[0].scale(4.0)?.gelu();
    min_axes: &[&[3, 4, 5]], false, |g, x| x[0].min_axes(&[1], false);
    max_dim: &[&[3, 4, 5]], false, |g, x| Ok(x[0].max_dim(2, false)?.0);
    norms: &[&[4, 5]], false, |g, x| {
        let n1 = x[0].norm(1.0, &[1], false)?;
        let n2 = x[0].norm(2.0, &[0], false)?.sum()?;
        n1.add(n2)?.add(x[0].norm(f64::INFINITY, &[], false)?)
    };
    layer_norm: &[&[3, 4, 5], &[5], &[5]], false, |g, x| {
        x[0].layer_norm(1, Some(x[1]), Some(x[2]), 1e-5)?.mul(x[0])
    };
    rms_norm: &[&[3, 4, 5], &[4, 5]], false, |g, x| x[0].rms_norm(2, Some(x[1]), 1e-6);
    attention: &[&[2, 3, 70, 8], &[2, 3, 67, 8], &[2, 3, 67, 5]], false, |g, x| {
        x[0].scaled_dot_product_attention(x[1], x[2], AttentionOptions::default())
    };
    attention_causal_masked: &[&[2, 2, 9, 4], &[2, 2, 9, 4], &[2, 2, 9, 3], &[2, 1, 9, 9]],
        false, |g, x| {
        let opts = AttentionOptions {
            mask: Some(x[3].detach()?),
            causal: true,
            ..Default::default()
        };
        x[0].scaled_dot_product_attention(x[1], x[2], opts)
    };
    attention_hidden_row_dropout: &[&[2, 2, 7, 4], &[2, 2, 7, 4], &[2, 2, 7, 3]], false, |g, x| {
        // A mask broadcast over batch and heads hiding every key of query 2 and a few others;
        // dropout from the graph's stream (the same seed on both devices).
        let m: Vec<f64> = (0..49)
            .map(|e| if e / 7 == 2 || e % 5 == 1 { f64::NEG_INFINITY } else { 0.1 * (e % 3) as f64 })
            .collect();
        let mask = g.from_f64(&m, &[7, 7], x[0].dtype())?;
        let opts = AttentionOptions {
            mask: Some(mask),
            dropout_p: 0.25,
            ..Default::default()
        };
        x[0].scaled_dot_product_attention(x[1], x[2], opts)
    };
    attention_wide_rows: &[&[1, 2, 3, 260], &[1, 2, 5, 260], &[1, 2, 5, 2]], false,
        |g, x| x[0].scaled_dot_product_attention(x[1], x[2], AttentionOptions::default());
    layer_norm_plain: &[&[4, 6]], false, |g, x| x[0].layer_norm(1, None, None, 1e-5)?.mul(x[0]);
    rms_norm_bias_free_no_weight: &[&[3, 2, 5]], false, |g, x| x[0].rms_norm(1, None, 1e-6);
    dropout: &[&[30, 40]], false, |g, x| x[0].dropout(0.3, true)?.mul(x[0]);
    cumsum: &[&[3, 4, 5]], false, |g, x| x[0].cumsum(1)?.mul(x[0]);
    slice_step: &[&[4, 7]], false, |g, x| x[0].slice_step(1, 1, 7, 2);
    stack: &[&[3, 4], &[3, 4]], false, |g, x| g.stack(&[x[0], x[1]], 1);
    chunk: &[&[4, 6]], false, |g, x| {
        let c = x[0].chunk(4, 1)?;
        c[0].mul(c[2])?.add(x[0].unbind(1)?[5].reshape(&[4, 1])?)
    };
    masked_fill: &[&[3, 4], &[4]], false, |g, x| {
        let m = x[1].shift(0.2)?.relu()?.detach()?;
        x[0].masked_fill(m, -3.0)
    };
    sum_all: &[&[3, 4, 5]], false, |g, x| x[0].sum();
    sum_axes: &[&[3, 4, 5]], false, |g, x| x[0].sum_axes(&[0, 2], false);
    mean_keepdim: &[&[3, 4, 5]], false, |g, x| x[0].mean_axes(&[1], true);
    max_axes: &[&[3, 4, 5]], false, |g, x| x[0].max_axes(&[-1], false);
    matmul_2d: &[&[5, 7], &[7, 3]], false, |g, x| x[0].matmul(x[1]);
    matmul_batched: &[&[2, 5, 7], &[2, 7, 3]], false, |g, x| x[0].matmul(x[1]);
    matmul_broadcast_batch: &[&[2, 1, 5, 7], &[3, 7, 4]], false, |g, x| x[0].matmul(x[1]);
    matmul_vector: &[&[7], &[2, 7, 3]], false, |g, x| x[0].matmul(x[1]);
    matmul_transposed: &[&[7, 5], &[3, 7]], false, |g, x| x[0].matmul_t(x[1], true, true);
    permute: &[&[2, 3, 4]], false, |g, x| x[0].permute(&[2, 0, 1]);
    transpose: &[&[3, 4]], false, |g, x| x[0].t();
    broadcast_to: &[&[3, 1]], false, |g, x| x[0].broadcast_to(&[2, 3, 4]);
    reshape: &[&[3, 4]], false, |g, x| x[0].reshape(&[2, -1])?.exp();
    slice: &[&[4, 6]], false, |g, x| x[0].slice(1, 2, 5);
    concat: &[&[2, 3], &[2, 2]], false, |g, x| g.concat(&[x[0], x[1], x[0]], 1);
    index_select: &[&[5, 3]], false, |g, x| x[0].index_select(0, &[4, 0, 4, 2]);
    gather: &[&[3, 4]], false, |g, x| x[0].gather(1, &[3, 0, 0, 1, 2, 2], &[3, 2]);
    softmax: &[&[3, 5]], false, |g, x| x[0].softmax(-1);
    log_softmax: &[&[3, 5]], false, |g, x| x[0].log_softmax(0);
    select: &[&[3, 4], &[4]], false, |g, x| {
        let c = x[0].shift(-0.5)?.detach()?;
        g.where_cond(c.relu()?, x[0], x[1])
    };
    conv2d: &[&[2, 3, 6, 5], &[4, 3, 3, 3]], false, |g, x| x[0].conv2d(x[1], (1, 2), (1, 0), (1, 1), 1);
    conv2d_groups_dilation: &[&[1, 4, 7, 7], &[4, 2, 2, 2]], false, |g, x| x[0].conv2d(x[1], (1, 1), (0, 1), (2, 1), 2);
    max_pool2d: &[&[2, 3, 6, 6]], false, |g, x| x[0].max_pool2d((2, 2), (2, 2), (0, 0));
    max_pool2d_padded: &[&[1, 2, 5, 5]], false, |g, x| x[0].max_pool2d((3, 3), (2, 2), (1, 1));
    avg_pool2d: &[&[2, 3, 6, 6]], false, |g, x| x[0].avg_pool2d((3, 3), (1, 1), (1, 1));
    // The ops of images, sound and graphs, composed on the device of the kernels above.
    conv_transpose2d_groups: &[&[2, 4, 3, 4], &[4, 3, 3, 2], &[6]], false, |g, x| {
        x[0].conv_transpose2d(x[1], Some(x[2]), (2, 1), (1, 0), (1, 0), (1, 2), 2)
    };
    group_norm: &[&[2, 6, 3, 4], &[6], &[6]], false, |g, x| {
        x[0].group_norm(3, Some(x[1]), Some(x[2]), 1e-5)?.mul(x[0])
    };
    sort_values: &[&[3, 7]], false, |g, x| Ok(x[0].sort(1, true)?.0);
    topk_smallest: &[&[6, 4]], false, |g, x| Ok(x[0].topk(3, 0, false)?.0);
    rearranged: &[&[3, 4]], false, |g, x| {
        x[0].flip(&[0, -1])?.roll(2, 1)?.repeat(&[2, 1])?.repeat_interleave(2, 0)
    };
    einsum_batched: &[&[2, 3, 4], &[2, 4, 5]], false, |g, x| g.einsum("bij,bjk->bik", &[x[0], x[1]]);
    gather_by_index_tensor: &[&[3, 4]], false, |g, x| {
        let i = g.from_slice(&[3i64, 0, 0, 1, 2, 2], &[3, 2])?;
        x[0].gather_by(1, i)
    };
    scatter_add_index_tensor: &[&[4, 3], &[5, 3]], false, |g, x| {
        let i = g.from_slice(&[3i64, 0, 1, 0, 0, 2, 3, 3, 3, 1, 2, 0, 2, 1, 1], &[5, 3])?;
        x[0].scatter_add(0, i, x[1])?.mul(x[0])
    };
    scatter_add_expanded_index: &[&[4, 3], &[5, 3]], false, |g, x| {
        // Constant along the rows' other axis: the slice path.
        let i = g.from_slice(&[2i64, 0, 2, 3, 1], &[5, 1])?.broadcast_to(&[5, 3])?;
        x[0].scatter_add(0, i, x[1])?.mul(x[0])
    };
    index_add_index_tensor: &[&[4, 3], &[5, 3]], false, |g, x| {
        let i = g.from_slice(&[2i64, 0, 2, 3, 1], &[5])?;
        x[0].index_add(0, i, x[1])?.mul(x[0])
    };
    scatter_reduce_amax_mean: &[&[4, 3], &[5, 3]], false, |g, x| {
        let i = g.from_slice(&[3i64, 0, 1, 0, 0, 2, 3, 3, 3, 1, 2, 0, 2, 1, 1], &[5, 3])?;
        let m = x[0].scatter_reduce(0, i, x[1], ScatterReduce::Amax, true)?;
        m.add(x[0].scatter_reduce(0, i, x[1], ScatterReduce::Mean, false)?)
    };
    to_host_and_back: &[&[3, 4]], false, |g, x| {
        let d = x[0].device();
        x[0].to_device(Device::Cpu)?.exp()?.to_device(d)
    };
}

#[test]
fn second_derivative_on_device() {
    let Some(dev) = cuda_test_device() else {
        return;
    };
    let grad2 = |dev: Device| {
        let g = Graph::on(dev).unwrap();
        let x = g.leaf(&[0.3, -0.7, 1.1], &[3], DType::F64).unwrap();
        let y = x.tanh().unwrap().mul(x).unwrap().sum().unwrap();
        let opts = arenagrad_graph::BackwardOptions {
            create_graph: true,
            ..Default::default()
        };
        let gx = arenagrad_graph::grad(y, &[x], opts).unwrap()[0].unwrap();
        gx.sum().unwrap().backward().unwrap();
        x.grad().unwrap().unwrap().to_vec_f64().unwrap()
    };
    close("d²(x·tanh x)", &grad2(dev), &grad2(Device::Cpu), 1e-10);
}

#[test]
fn mixing_devices_is_a_typed_error() {
    let Some(dev) = cuda_test_device() else {
        return;
    };
    let g = Graph::new();
    let a = g.ones(&[2], DType::F32).unwrap();
    let b = a.to_device(dev).unwrap();
    let e = a.add(b).unwrap_err();
    assert!(
        matches!(e, arenagrad_graph::GraphError::DeviceMismatch { .. }),
        "{e}"
    );
}

#[test]
fn without_a_usable_gpu_a_cuda_graph_is_no_cuda_device() {
    if arenagrad_graph::cuda_device_count() > 0 {
        skip("a CUDA device is present (the other tests here cover a working one)");
        return;
    }
    match Graph::on(Device::Cuda(0)) {
        Err(arenagrad_graph::GraphError::NoCudaDevice { ordinal: 0, reason }) => {
            assert!(!reason.is_empty())
        }
        other => panic!("expected NoCudaDevice, got {other:?}"),
    }
    // A host tensor cannot be moved there either, and nothing panics.
    let g = Graph::new();
    let x = g.ones(&[2], DType::F32).unwrap();
    assert!(matches!(
        x.to_device(Device::Cuda(0)),
        Err(arenagrad_graph::GraphError::NoCudaDevice { .. })
    ));
}

#[test]
fn empty_inner_dimension_gives_zeros() {
    let Some(dev) = cuda_test_device() else {
        return;
    };
    let g = Graph::on(dev).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let a = g.from_f64(&[], &[2, 0], dtype).unwrap();
        let b = g.from_f64(&[], &[0, 3], dtype).unwrap();
        assert_eq!(a.matmul(b).unwrap().to_vec_f64().unwrap(), vec![0.0; 6]);
        let a = g.from_f64(&[], &[4, 2, 0], dtype).unwrap();
        let b = g.from_f64(&[], &[4, 0, 3], dtype).unwrap();
        assert_eq!(a.matmul(b).unwrap().to_vec_f64().unwrap(), vec![0.0; 24]);
    }
}

#[test]
fn parameters_and_repeated_backward_accumulate_on_device() {
    let Some(dev) = cuda_test_device() else {
        return;
    };
    let run = |dev: Device| {
        let w = arenagrad_graph::Parameter::new(
            "w",
            arenagrad_graph::HostTensor::new(data(12, 5, false), &[3, 4]).unwrap(),
        );
        let mut g = Graph::on(dev).unwrap();
        let mut xs = Vec::new();
        for it in 0..2 {
            let x = g
                .from_f64(&data(8, 7 + it, false), &[2, 4], DType::F64)
                .unwrap()
                .set_requires_grad(true)
                .unwrap();
            let y = x
                .matmul_t(g.param(&w).unwrap(), false, true)
                .unwrap()
                .tanh()
                .unwrap();
            let l = y.sum().unwrap();
            let opts = arenagrad_graph::BackwardOptions {
                retain_graph: true,
                ..Default::default()
            };
            l.backward_with(opts).unwrap();
            l.backward().unwrap(); // a second pass accumulates into x and w
            let gx = x.grad().unwrap().unwrap();
            assert_eq!(gx.device(), dev);
            xs.push(gx.to_vec_f64().unwrap());
            g.reset();
        }
        (w.grad().unwrap().to_f64_vec(), xs)
    };
    let (wd, xd) = run(dev);
    let (wc, xc) = run(Device::Cpu);
    close("parameter gradient", &wd, &wc, 1e-10);
    for (a, b) in xd.iter().zip(&xc) {
        close("leaf gradient", a, b, 1e-10);
    }
}

#[test]
fn a_gradient_on_another_device_is_a_typed_error() {
    let Some(dev) = cuda_test_device() else {
        return;
    };
    struct ToHost;
    impl arenagrad_graph::CustomOp for ToHost {
        fn name(&self) -> &'static str {
            "to_host_grad"
        }
        fn backward<'g>(
            &self,
            _g: &'g Graph,
            inputs: &[Tensor<'g>],
            _out: Tensor<'g>,
            gy: Tensor<'g>,
        ) -> Result<Vec<Option<Tensor<'g>>>> {
            Ok(vec![Some(gy.mul(inputs[0])?.to_device(Device::Cpu)?)])
        }
    }
    let g = Graph::on(dev).unwrap();
    let x = g.leaf(&[0.5, 1.5], &[2], DType::F64).unwrap();
    let h = x.exp().unwrap();
    let v = {
        let _ng = g.no_grad();
        h.mul(h).unwrap()
    };
    let y = g.custom(std::sync::Arc::new(ToHost), &[h], v).unwrap();
    let e = y.sum().unwrap().backward().unwrap_err();
    assert!(
        matches!(e, arenagrad_graph::GraphError::DeviceMismatch { .. }),
        "{e}"
    );
}

/// The fused attention on a device keeps the host's promise: a 4096-token causal step (forward
/// and backward) peaks at a small fraction of the device memory the composed formula takes
/// (which holds the 4096² scores, weights and their gradients), with the same gradient.
#[test]
fn long_attention_on_device_needs_a_fraction_of_the_compositions_memory() {
    let Some(dev) = cuda_test_device() else {
        return;
    };
    let (l, d) = (4096, 16);
    let run = |fused: bool| {
        let g = Graph::on(dev).unwrap();
        let x: Vec<Tensor<'_>> = (0..3)
            .map(|s| {
                g.from_f64(&data(l * d, s + 1, false), &[1, l, d], DType::F32)
                    .unwrap()
                    .set_requires_grad(true)
                    .unwrap()
            })
            .collect();
        arenagrad_graph::synchronize(dev).unwrap();
        arenagrad_graph::reset_peak_stats(dev).unwrap();
        let o = if fused {
            let opts = AttentionOptions {
                causal: true,
                ..Default::default()
            };
            x[0].scaled_dot_product_attention(x[1], x[2], opts).unwrap()
        } else {
            let s = x[0]
                .matmul(x[1].transpose(-2, -1).unwrap())
                .unwrap()
                .scale(1.0 / (d as f64).sqrt())
                .unwrap();
            let hide = g.full(&[l, l], 1.0, DType::F32).unwrap().triu(1).unwrap();
            let s = s.masked_fill(hide, f64::NEG_INFINITY).unwrap();
            s.softmax(-1).unwrap().matmul(x[2]).unwrap()
        };
        o.sum().unwrap().backward().unwrap();
        let dq = x[0].grad().unwrap().unwrap().to_vec_f64().unwrap();
        arenagrad_graph::synchronize(dev).unwrap();
        let stats = arenagrad_graph::memory_stats(dev).unwrap();
        (stats["allocated_bytes.all.peak"], dq)
    };
    let (fused, dq_f) = run(true);
    let (composed, dq_c) = run(false);
    close("dq, fused vs composed", &dq_f, &dq_c, 1e-3);
    assert!(
        fused * 20 < composed,
        "fused peak {fused} B vs composed {composed} B"
    );
    eprintln!(
        "4096-token causal attention on {dev:?}: peak {fused} B fused, {composed} B composed"
    );
}
