//! bf16 and f16 tensors: conversions, how ops compute on them (in f32, rounded once when they
//! store), promotion beside f32, gradients stored in the tensor's dtype, parameters, and
//! values PyTorch 2.15 printed for the same programs in `torch.bfloat16` and `torch.float16`.

use arenagrad_graph::exec::cpu::bf16 as bf16_exec;
use arenagrad_graph::{bf16, f16, DType, Graph, GraphError, HostTensor, Parameter, Tensor};

const X: [f64; 12] = [
    0.3, -1.2, 0.8, 2.1, -0.4, 1.7, -0.9, 0.5, 0.0, 1.0, 3.3, 1.0,
];
const W: [f64; 12] = [1., 2., 3., -1., 0.5, 2., 0.3, -0.7, 1.1, 2., -1., 0.5];

/// What PyTorch printed for `x = X.to(dtype)` (a [3, 4] leaf), `y = tanh(x)`,
/// `s = softmax(x, 1)`, `loss = (s · W).sum() + (y · y).sum()`, `loss.backward()`, and
/// `x @ Wᵀ`, in this order.
struct Reference {
    dtype: DType,
    x: [f64; 12],
    tanh: [f64; 12],
    softmax: [f64; 12],
    loss: f64,
    grad: [f64; 12],
    mm: [f64; 9],
}

const BF16: Reference = Reference {
    dtype: DType::BF16,
    x: [
        0.30078125,
        -1.203125,
        0.80078125,
        2.09375,
        -0.400390625,
        1.703125,
        -0.8984375,
        0.5,
        0.0,
        1.0,
        3.296875,
        1.0,
    ],
    tanh: [
        0.29296875,
        -0.8359375,
        0.6640625,
        0.96875,
        -0.380859375,
        0.9375,
        -0.71484375,
        0.462890625,
        0.0,
        0.76171875,
        0.99609375,
        0.76171875,
    ],
    softmax: [
        0.11279296875,
        0.0250244140625,
        0.185546875,
        0.67578125,
        0.08154296875,
        0.66796875,
        0.049560546875,
        0.2001953125,
        0.0299072265625,
        0.0810546875,
        0.80859375,
        0.0810546875,
    ],
    loss: 6.78125,
    grad: [
        0.64453125,
        -0.455078125,
        1.2890625,
        -0.5859375,
        -0.71484375,
        0.7265625,
        -0.74609375,
        0.3359375,
        0.050048828125,
        0.8515625,
        -0.330078125,
        0.7265625,
    ],
    mm: [
        -1.796875,
        -3.484375,
        -1.828125,
        -0.189453125,
        2.59375,
        4.125,
        10.875,
        2.296875,
        -0.796875,
    ],
};

const F16: Reference = Reference {
    dtype: DType::F16,
    x: [
        0.300048828125,
        -1.2001953125,
        0.7998046875,
        2.099609375,
        -0.39990234375,
        1.7001953125,
        -0.89990234375,
        0.5,
        0.0,
        1.0,
        3.30078125,
        1.0,
    ],
    tanh: [
        0.291259765625,
        -0.83349609375,
        0.6640625,
        0.97021484375,
        -0.3798828125,
        0.935546875,
        -0.71630859375,
        0.462158203125,
        0.0,
        0.76171875,
        0.9970703125,
        0.76171875,
    ],
    softmax: [
        0.11212158203125,
        0.0250091552734375,
        0.184814453125,
        0.67822265625,
        0.08172607421875,
        0.66748046875,
        0.049591064453125,
        0.2010498046875,
        0.02978515625,
        0.08099365234375,
        0.80810546875,
        0.08099365234375,
    ],
    loss: 6.77734375,
    grad: [
        0.64111328125,
        -0.459716796875,
        1.2900390625,
        -0.59033203125,
        -0.7109375,
        0.73388671875,
        -0.7451171875,
        0.3349609375,
        0.0498046875,
        0.84814453125,
        -0.33349609375,
        0.7265625,
    ],
    mm: [
        -1.80078125,
        -3.48046875,
        -1.8203125,
        -0.19921875,
        2.580078125,
        4.109375,
        10.90625,
        2.291015625,
        -0.80078125,
    ],
};

/// One unit in the last place of `dtype` at `v` (PyTorch's f32 kernels and ours may round a
/// transcendental's last f32 bit apart, which can move the 16-bit result by one step).
fn ulp(dtype: DType, v: f64) -> f64 {
    let e = v.abs().max(f64::MIN_POSITIVE).log2().floor();
    dtype.epsilon() * 2f64.powf(e)
}

fn within_ulp(what: &str, dtype: DType, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= ulp(dtype, *w),
            "{what} in {dtype}, element {k}: {g} against PyTorch's {w}\n{got:?}"
        );
    }
}

#[test]
fn ops_in_16_bit_dtypes_match_pytorch() {
    for r in [BF16, F16] {
        let g = Graph::new();
        let x = g.leaf(&X, &[3, 4], r.dtype).unwrap();
        assert_eq!(x.dtype(), r.dtype);
        assert_eq!(x.to_vec_f64().unwrap(), r.x, "rounding of the leaf");
        let w = g.from_f64(&W, &[3, 4], r.dtype).unwrap();
        let y = x.tanh().unwrap();
        let s = x.softmax(1).unwrap();
        assert_eq!((y.dtype(), s.dtype()), (r.dtype, r.dtype));
        within_ulp("tanh", r.dtype, &y.to_vec_f64().unwrap(), &r.tanh);
        within_ulp("softmax", r.dtype, &s.to_vec_f64().unwrap(), &r.softmax);
        let loss = s
            .mul(w)
            .unwrap()
            .sum()
            .unwrap()
            .add(y.mul(y).unwrap().sum().unwrap())
            .unwrap();
        assert_eq!(loss.dtype(), r.dtype);
        within_ulp("loss", r.dtype, &[loss.item().unwrap()], &[r.loss]);
        loss.backward().unwrap();
        let gx = x.grad().unwrap().unwrap();
        assert_eq!(
            gx.dtype(),
            r.dtype,
            "a gradient is stored in its tensor's dtype"
        );
        // Elementwise ops save their 16-bit inputs and outputs as PyTorch's do, so the
        // gradient agrees to the last bit or one step (an f32 sum's order).
        within_ulp("grad", r.dtype, &gx.to_vec_f64().unwrap(), &r.grad);
        let mm = x.detach().unwrap().matmul_t(w, false, true).unwrap();
        within_ulp("mm", r.dtype, &mm.to_vec_f64().unwrap(), &r.mm);
    }
}

#[test]
fn conversions_round_to_nearest_even_and_gradients_cast_back() {
    let g = Graph::new();
    // 1 + 2⁻⁸ is halfway between two bf16 neighbours: to even, 1. 1 + 3·2⁻⁸ rounds up.
    let x = g
        .leaf(
            &[1.0 + 2f64.powi(-8), 1.0 + 3.0 * 2f64.powi(-8), -0.0, 1e39],
            &[4],
            DType::F64,
        )
        .unwrap();
    let h = x.to_dtype(DType::BF16).unwrap();
    let v = h.to_vec::<bf16>().unwrap();
    assert_eq!(v[0], bf16::ONE);
    assert_eq!(v[1].to_f64(), 1.0 + 2f64.powi(-6));
    assert!(v[2].is_sign_negative() && v[2].to_f64() == 0.0);
    assert!(v[3].is_infinite(), "past f32's range: infinity, as PyTorch");
    // PyTorch rounds f64 through f32: 1 + 2⁻⁸ + 2⁻³⁰ is 1 + 2⁻⁸ in f32, a tie, so 1.
    let t = g
        .from_f64(&[1.0 + 2f64.powi(-8) + 2f64.powi(-30)], &[1], DType::BF16)
        .unwrap();
    assert_eq!(t.to_vec::<bf16>().unwrap(), vec![bf16::ONE]);
    // The gradient goes back through the cast in the input's dtype.
    let loss = h.scale(3.0).unwrap().sum().unwrap();
    assert_eq!(loss.dtype(), DType::BF16);
    loss.backward().unwrap();
    let gx = x.grad().unwrap().unwrap();
    assert_eq!(gx.dtype(), DType::F64);
    assert_eq!(gx.to_vec_f64().unwrap(), vec![3.0; 4]);
    // The same dtype is no conversion: the handle itself.
    assert_eq!(h.to_dtype(DType::BF16).unwrap().id(), h.id());
}

#[test]
fn mixed_operands_meet_in_the_wider_dtype() {
    let g = Graph::new();
    let a = g.leaf(&[1.5, -2.0, 0.25], &[3], DType::BF16).unwrap();
    let b = g.leaf(&[0.1, 0.2, 0.3], &[3], DType::F32).unwrap();
    let c = g.leaf(&[1.0, 2.0, 3.0], &[3], DType::F16).unwrap();
    let ab = a.mul(b).unwrap();
    assert_eq!(
        ab.dtype(),
        DType::F32,
        "bf16 · f32 is f32, as PyTorch promotes"
    );
    assert_eq!(
        ab.to_vec::<f32>().unwrap(),
        vec![1.5 * 0.1f32, -2.0 * 0.2f32, 0.25 * 0.3f32]
    );
    let ac = a.add(c).unwrap();
    assert_eq!(ac.dtype(), DType::F32, "bf16 + f16 meet in f32");
    ab.add(ac).unwrap().sum().unwrap().backward().unwrap();
    let ga = a.grad().unwrap().unwrap();
    assert_eq!(ga.dtype(), DType::BF16);
    // d/da (a·b + a + c) = b + 1, rounded to bf16.
    let want: Vec<f64> = [1.1f32, 1.2, 1.3]
        .iter()
        .map(|&v| bf16::from_f32(v).to_f64())
        .collect();
    assert_eq!(ga.to_vec_f64().unwrap(), want);
    assert_eq!(c.grad().unwrap().unwrap().dtype(), DType::F16);
    let sel = g
        .where_cond(b.gt(g.full(&[3], 0.15, DType::F32).unwrap()).unwrap(), a, c)
        .unwrap();
    assert_eq!(sel.dtype(), DType::F32);
    assert_eq!(sel.to_vec_f64().unwrap(), vec![1.0, -2.0, 0.25]);
    let cat = g.concat(&[a, b], 0).unwrap();
    assert_eq!((cat.dtype(), cat.shape().to_vec()), (DType::F32, vec![6]));
}

#[test]
fn ops_that_take_one_dtype_refuse_mixed_ones() {
    let g = Graph::new();
    let a = g.zeros(&[2, 2], DType::BF16).unwrap();
    let b = g.zeros(&[2, 2], DType::F32).unwrap();
    // As PyTorch's `mm`: both operands of one dtype.
    assert!(matches!(
        a.matmul(b).unwrap_err(),
        GraphError::DTypeMismatch {
            op: "matmul",
            lhs: DType::BF16,
            rhs: DType::F32
        }
    ));
}

#[test]
fn slice_write_writes_16_bit_tensors_in_place_and_converts_another_dtype_as_pytorch_does() {
    for dt in [DType::BF16, DType::F16] {
        let g = Graph::new();
        let dst = g.zeros(&[2, 4], dt).unwrap();
        let a = g.from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], dt).unwrap();
        dst.slice_write(1, 0, a).unwrap();
        // An f32 source is rounded to the destination's dtype (1/3 is not a 16-bit value).
        let third = g.from_f64(&[1.0 / 3.0, -0.5], &[2, 1], DType::F32).unwrap();
        dst.slice_write(1, 3, third).unwrap();
        let rounded = HostTensor::from_f64(&[1.0 / 3.0], &[1], dt)
            .unwrap()
            .to_f64_vec()[0];
        assert_ne!(rounded, 1.0 / 3.0);
        assert_eq!(dst.dtype(), dt);
        assert_eq!(
            dst.to_vec_f64().unwrap(),
            vec![1.0, 2.0, 0.0, rounded, 3.0, 4.0, 0.0, -0.5],
            "{dt:?}"
        );
    }
}

#[test]
fn a_16_bit_parameter_trains_and_accumulates_in_its_dtype() {
    let p = Parameter::new(
        "w",
        HostTensor::from_f64(&[0.5, -1.25, 2.0, 0.75], &[2, 2], DType::BF16).unwrap(),
    );
    let mut g = Graph::new();
    for _ in 0..2 {
        let w = g.param(&p).unwrap();
        let x = g.from_f64(&[1.0, 3.0], &[1, 2], DType::BF16).unwrap();
        x.matmul(w).unwrap().sum().unwrap().backward().unwrap();
        g.reset();
    }
    let grad = p.grad().unwrap();
    assert_eq!(grad.dtype(), DType::BF16);
    // d/dw Σ x·w = xᵀ·1, twice: [2, 2, 6, 6].
    assert_eq!(grad.to_f64_vec(), vec![2.0, 2.0, 6.0, 6.0]);
    // Accumulation rounds once per element: 256 + 1 is not a bf16 (8 significant bits).
    let q = Parameter::new(
        "v",
        HostTensor::from_f64(&[0.0], &[1], DType::BF16).unwrap(),
    );
    for k in [256.0, 1.0, 1.0] {
        let v = g.param(&q).unwrap();
        v.scale(k).unwrap().sum().unwrap().backward().unwrap();
        g.reset();
    }
    assert_eq!(
        q.grad().unwrap().to_f64_vec(),
        vec![256.0],
        "256 + 1 rounds to even, twice"
    );
}

#[test]
fn host_tensors_convert_between_every_pair_of_dtypes() {
    let src = HostTensor::from_f64(&[0.1, -3.75, 65504.0, 1e-8], &[2, 2], DType::F64).unwrap();
    for from in DType::ALL {
        let a = src.to_dtype(from).unwrap();
        for to in DType::ALL {
            let b = a.to_dtype(to).unwrap();
            assert_eq!((b.dtype(), b.shape()), (to, &[2usize, 2][..]));
            // Each path agrees with converting the f64 values straight to `to` through `from`.
            let want = HostTensor::from_f64(&a.to_f64_vec(), &[2, 2], to).unwrap();
            assert_eq!(b, want, "{from} → {to}");
        }
    }
    let h = src.to_dtype(DType::F16).unwrap();
    assert_eq!(h.as_slice::<f16>().unwrap()[2], f16::MAX);
    assert_eq!(
        h.as_slice::<f16>().unwrap()[3],
        f16::from_f32(1e-8),
        "a subnormal of f16"
    );
}

#[test]
fn a_stale_or_foreign_operand_is_still_an_error_in_16_bit() {
    let g = Graph::new();
    let other = Graph::new();
    let a = g.zeros(&[2], DType::BF16).unwrap();
    let b = other.zeros(&[2], DType::BF16).unwrap();
    assert!(a.add(b).is_err());
    let t: Tensor<'_> = a.exp().unwrap();
    assert_eq!(t.dtype(), DType::BF16);
}

/// bf16 products on the host multiply bf16 pairs and sum in f32 (`vdpbf16ps` where the CPU has
/// it), rounding once: every layout (transposed operands, broadcast batches, `addmm`'s bias row
/// and column) against the f32 product of the same values rounded, to one step of bf16; and
/// the gradients, which take the same products, against f32's.
#[test]
fn bf16_products_round_the_f32_sum_once_in_every_layout() {
    let g = Graph::new();
    let vals = |n: usize, s: f64| -> Vec<f64> {
        (0..n)
            .map(|k| ((k as f64 * 0.61 + s).sin() * 2.0 * 64.0).round() / 64.0)
            .collect()
    };
    let pair = |shape: &[usize], s: f64| {
        let n = shape.iter().product();
        let v = vals(n, s);
        (
            g.leaf(&v, shape, DType::BF16).unwrap(),
            g.leaf(&v, shape, DType::F32).unwrap(),
        )
    };
    let near = |what: &str, low: Tensor<'_>, full: Tensor<'_>| {
        assert_eq!(low.dtype(), DType::BF16, "{what}");
        assert_eq!(low.shape(), full.shape(), "{what}");
        let want = full.to_dtype(DType::BF16).unwrap().to_vec_f64().unwrap();
        for (a, b) in low.to_vec_f64().unwrap().iter().zip(&want) {
            assert!(
                (a - b).abs() <= ulp(DType::BF16, *b),
                "{what}: {a} against {b}"
            );
        }
    };
    for (sa, sb, ta, tb) in [
        (vec![5, 7], vec![7, 3], false, false),
        (vec![7, 5], vec![7, 3], true, false),
        (vec![5, 7], vec![3, 7], false, true),
        (vec![2, 3, 7, 5], vec![3, 3, 7], true, true),
        (vec![4, 5, 7], vec![7, 6], false, false),
        (vec![2, 1, 5, 33], vec![3, 33, 9], false, false),
    ] {
        let (a, af) = pair(&sa, 0.3);
        let (b, bf) = pair(&sb, 1.7);
        let what = format!("{sa:?}·{sb:?} ta={ta} tb={tb}");
        near(
            &what,
            a.matmul_t(b, ta, tb).unwrap(),
            af.matmul_t(bf, ta, tb).unwrap(),
        );
        let (la, lb) = (
            a.matmul_t(b, ta, tb).unwrap(),
            af.matmul_t(bf, ta, tb).unwrap(),
        );
        la.sum().unwrap().backward().unwrap();
        lb.sum().unwrap().backward().unwrap();
        for (lo, hi) in [(a, af), (b, bf)] {
            let (gl, gh) = (lo.grad().unwrap().unwrap(), hi.grad().unwrap().unwrap());
            near(&format!("{what}, gradient"), gl, gh);
            lo.zero_grad().unwrap();
            hi.zero_grad().unwrap();
        }
    }
    // Bit for bit the instruction's definition (pairs along k, the odd product first, each an
    // f32 fused multiply-add), rounded once.
    let (m, k, n) = (6, 37, 5);
    let (a, _) = pair(&[m, k], 0.1);
    let (b, _) = pair(&[k, n], 0.2);
    let (av, bv) = (a.to_vec::<bf16>().unwrap(), b.to_vec::<bf16>().unwrap());
    let at = |i: usize, p: usize| if p < k { av[i * k + p] } else { bf16::ZERO };
    let bt = |p: usize, j: usize| if p < k { bv[p * n + j] } else { bf16::ZERO };
    let mut want = Vec::new();
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for p in (0..k).step_by(2) {
                let x = bf16_exec::pair(at(i, p), at(i, p + 1));
                let y = bf16_exec::pair(bt(p, j), bt(p + 1, j));
                acc = bf16_exec::dot_pair(acc, x, y);
            }
            want.push(bf16::from_f32(acc));
        }
    }
    assert_eq!(a.matmul(b).unwrap().to_vec::<bf16>().unwrap(), want);
    for c_shape in [vec![3], vec![5, 1], vec![5, 3], vec![1, 3]] {
        let (a, af) = pair(&[5, 9], 0.9);
        let (b, bf) = pair(&[3, 9], 2.2);
        let (c, cf) = pair(&c_shape, 4.1);
        let what = format!("addmm with bias {c_shape:?}");
        near(
            &what,
            c.addmm_t(a, b, false, true).unwrap(),
            cf.addmm_t(af, bf, false, true).unwrap(),
        );
    }
}

/// A bf16 product of many rows (a linear layer over a batch's tokens) is made in blocks of rows,
/// each rounded from the thread's scratch: bit for bit the whole product's f32 sums rounded
/// once (`exec`'s `gemm_bf16`, then the cast), from nothing, from a bias row and from a bias
/// value, with either operand transposed, on one to three threads, with a last block short.
#[test]
fn bf16_products_of_many_rows_round_in_blocks_to_the_whole_products_bits() {
    use arenagrad_graph::exec::cpu::{self, MatView, Mnk};
    let g = Graph::new();
    let (m, k, n) = (301, 37, 1100);
    let vals = |len: usize, s: f64| -> Vec<f64> {
        (0..len)
            .map(|i| ((i as f64 * 0.37 + s).sin() * 3.0 * 64.0).round() / 64.0)
            .collect()
    };
    for (ta, tb) in [(false, false), (true, false), (false, true)] {
        let sa = if ta { [k, m] } else { [m, k] };
        let sb = if tb { [n, k] } else { [k, n] };
        let (av, bv) = (vals(m * k, 0.4), vals(k * n, 1.9));
        let a = g.leaf(&av, &sa, DType::BF16).unwrap();
        let b = g.leaf(&bv, &sb, DType::BF16).unwrap();
        let (a16, b16) = (a.to_vec::<bf16>().unwrap(), b.to_vec::<bf16>().unwrap());
        for bias in [None, Some(vec![n]), Some(vec![1])] {
            // The definition: the f32 sums of the whole product (from the bias), then rounded.
            let mut acc = vec![0f32; m * n];
            let c = bias.as_ref().map(|shape| {
                let len: usize = shape.iter().product();
                g.leaf(&vals(len, 3.1), shape, DType::BF16).unwrap()
            });
            if let Some(c) = c {
                let cv = c.to_vec::<bf16>().unwrap();
                for (j, v) in acc.iter_mut().enumerate() {
                    *v = cv[if cv.len() == 1 { 0 } else { j % n }].to_f32();
                }
            }
            cpu::bf16::gemm_bf16(
                Mnk::new(m, k, n),
                MatView::row_major(&a16, 0, if ta { m } else { k }, ta),
                MatView::row_major(&b16, 0, if tb { k } else { n }, tb),
                &mut acc,
                c.is_some(),
                1,
            );
            let want: Vec<bf16> = acc.iter().map(|&v| cpu::bf16::to_bf16(v)).collect();
            for threads in 1..=3 {
                g.set_threads(threads);
                let got = match c {
                    Some(c) => c.addmm_t(a, b, ta, tb).unwrap(),
                    None => a.matmul_t(b, ta, tb).unwrap(),
                };
                let what = format!("ta={ta} tb={tb} bias {bias:?}, {threads} threads");
                assert_eq!(got.to_vec::<bf16>().unwrap(), want, "{what}");
            }
        }
    }
}

/// The ops that run 16-bit tensors through f32 scratch instead of recorded f32 copies
/// (attention in groups of heads, dropout and sums block by block) give, forward and backward,
/// bit for bit what the op gives on f32 copies rounded back: that is their contract.
#[test]
fn ops_widened_on_the_fly_equal_the_f32_op_on_widened_copies_bit_for_bit() {
    use arenagrad_graph::AttentionOptions;
    for dtype in [DType::BF16, DType::F16] {
        let g = Graph::new();
        let vals = |n: usize, s: f64| -> Vec<f64> {
            (0..n).map(|k| (k as f64 * 0.37 + s).sin() * 1.5).collect()
        };
        // Leaves of `dtype`, and the same values as f32 leaves fed through casts.
        let both = |shape: &[usize], s: f64| {
            let n = shape.iter().product();
            let low = g.leaf(&vals(n, s), shape, dtype).unwrap();
            let low = low.set_requires_grad(true).unwrap();
            let rounded = low.to_vec_f64().unwrap();
            let wide = g.leaf(&rounded, shape, DType::F32).unwrap();
            (low, wide.set_requires_grad(true).unwrap())
        };
        // Within `steps` 16-bit steps of the largest element (0: bit for bit).
        let near = |what: &str, a: Tensor<'_>, b: Tensor<'_>, steps: f64| {
            assert_eq!(a.dtype(), dtype, "{what}");
            let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
            let top = b.iter().fold(0f64, |m, x| m.max(x.abs()));
            let tol = steps * top * dtype.epsilon();
            for (e, (x, y)) in a.iter().zip(&b).enumerate() {
                let ok = if steps == 0.0 {
                    x.to_bits() == y.to_bits()
                } else {
                    (x - y).abs() <= tol
                };
                assert!(ok, "{what} ({dtype:?}): element {e} is {x}, not {y}");
            }
        };
        let same = |what: &str, a: Tensor<'_>, b: Tensor<'_>| near(what, a, b, 0.0);
        // 12 heads of 70 queries and 90 keys: several groups of heads, and both threads.
        let (q, qf) = both(&[3, 4, 70, 16], 0.1);
        let (k, kf) = both(&[3, 4, 90, 16], 0.7);
        let (v, vf) = both(&[3, 4, 90, 24], 1.3);
        let (m, mf) = both(&[70, 90], 2.9);
        let (m, mf) = (m.detach().unwrap(), mf.detach().unwrap());
        for (causal, dropout_p, masked) in [(true, 0.0, false), (false, 0.25, true)] {
            let opts = |mask| AttentionOptions {
                mask,
                causal,
                dropout_p,
                scale: None,
            };
            // The same seed for both: the graph's stream is reseeded before each.
            g.seed(5);
            let y = q
                .scaled_dot_product_attention(k, v, opts(masked.then_some(m)))
                .unwrap();
            g.seed(5);
            let yf = qf
                .scaled_dot_product_attention(kf, vf, opts(masked.then_some(mf)))
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let what = format!("attention causal={causal} dropout={dropout_p} mask={masked}");
            same(&what, y, yf);
            let w = both(&[3, 4, 70, 24], 4.1).0.detach().unwrap();
            y.mul(w).unwrap().sum().unwrap().backward().unwrap();
            yf.mul(w).unwrap().sum().unwrap().backward().unwrap();
            // Backward reads the output as the node keeps it, rounded to 16 bits (as PyTorch's
            // 16-bit attention does), where the f32 op on copies has it unrounded: the
            // gradients agree to a 16-bit step of the largest, not to the bit.
            for (lo, hi, name) in [(q, qf, "dq"), (k, kf, "dk"), (v, vf, "dv")] {
                let hi_grad = hi.grad().unwrap().unwrap().to_dtype(dtype).unwrap();
                let what = format!("{what}: {name}");
                near(&what, lo.grad().unwrap().unwrap(), hi_grad, 1.0);
                lo.zero_grad().unwrap();
                hi.zero_grad().unwrap();
            }
        }
        // Dropout and sums over axes, forward and backward.
        let (x, xf) = both(&[33, 77], 0.2);
        g.seed(9);
        let d = x.dropout(0.3, true).unwrap();
        g.seed(9);
        let df = xf.dropout(0.3, true).unwrap().to_dtype(dtype).unwrap();
        same("dropout", d, df);
        let s = d.sum_axes(&[0], false).unwrap();
        let sf = df
            .to_dtype(DType::F32)
            .unwrap()
            .sum_axes(&[0], false)
            .unwrap();
        same("sum over axis 0", s, sf.to_dtype(dtype).unwrap());
        let w = both(&[77], 3.3).0.detach().unwrap();
        s.mul(w).unwrap().sum().unwrap().backward().unwrap();
        sf.to_dtype(dtype)
            .unwrap()
            .mul(w)
            .unwrap()
            .sum()
            .unwrap()
            .backward()
            .unwrap();
        let xg = xf.grad().unwrap().unwrap().to_dtype(dtype).unwrap();
        same("dropout and sum: gradient", x.grad().unwrap().unwrap(), xg);
    }
}

/// A bf16 convolution on the host is the bf16 product with the bias: each image's output within
/// a rounding of the f32 convolution of the same values (a bias added per output row of every
/// image, not only the first's), gradients included, each rounded once from its f32 sum. Max
/// pooling after it picks the same elements as in f32 (its own 16-bit path where the windows
/// are disjoint, f32 where they overlap), gradients included.
#[test]
fn bf16_convolutions_and_pooling_match_f32_in_every_layout() {
    // (input, weight, pooling kernel and stride)
    type Case = ([usize; 4], [usize; 4], (usize, usize));
    let cases: [Case; 3] = [
        ([3, 2, 6, 5], [4, 2, 3, 3], (2, 2)),
        ([2, 2, 9, 7], [70, 2, 3, 3], (2, 2)),
        ([2, 3, 8, 8], [64, 3, 3, 3], (3, 2)),
    ];
    for (xs, ws, (pk, ps)) in cases {
        let g = Graph::new();
        let vals = |n: usize, s: f64| -> Vec<f64> {
            (0..n)
                .map(|k| ((k as f64 * 0.53 + s).sin() * 64.0).round() / 64.0)
                .collect()
        };
        let pair = |shape: &[usize], s: f64| {
            let v = vals(shape.iter().product(), s);
            let low = g.leaf(&v, shape, DType::BF16).unwrap();
            let full = g.leaf(&v, shape, DType::F32).unwrap();
            (
                low.set_requires_grad(true).unwrap(),
                full.set_requires_grad(true).unwrap(),
            )
        };
        let (x, xf) = pair(&xs, 0.2);
        let (w, wf) = pair(&ws, 1.1);
        let (b, bf) = pair(&ws[..1], 2.3);
        let y = x
            .conv2d_bias(w, Some(b), (1, 1), (1, 1), (1, 1), 1)
            .unwrap();
        let yf = xf
            .conv2d_bias(wf, Some(bf), (1, 1), (1, 1), (1, 1), 1)
            .unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        let near = |what: &str, lo: Tensor<'_>, hi: Tensor<'_>| {
            let want = hi.to_dtype(DType::BF16).unwrap().to_vec_f64().unwrap();
            let got = lo.to_vec_f64().unwrap();
            assert_eq!(got.len(), want.len(), "{what}: {xs:?} {ws:?}");
            for (e, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= ulp(DType::BF16, *b),
                    "{what} ({xs:?} {ws:?}): element {e} is {a}, not {b}"
                );
            }
        };
        near("conv2d", y, yf);
        // Pooling the rounded output in both dtypes: the same picks, so equal values.
        let yr = yf
            .to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let p = y.max_pool2d((pk, pk), (ps, ps), (0, 0)).unwrap();
        let pf = yr.max_pool2d((pk, pk), (ps, ps), (0, 0)).unwrap();
        assert_eq!(p.dtype(), DType::BF16);
        near("max_pool2d", p, pf);
        let weighted_backward = |t: Tensor<'_>| {
            let n = t.shape().iter().product::<usize>();
            let s = g
                .leaf(&vals(n, 3.7), &t.shape(), DType::F32)
                .unwrap()
                .to_dtype(t.dtype())
                .unwrap();
            t.mul(s).unwrap().sum().unwrap().backward().unwrap();
        };
        weighted_backward(p);
        weighted_backward(pf);
        // One product (dw) and one sum (db): each rounded once.
        for (lo, hi, what) in [(w, wf, "dw"), (b, bf, "db")] {
            near(
                what,
                lo.grad().unwrap().unwrap(),
                hi.grad().unwrap().unwrap(),
            );
        }
        // dx folds up to nine patch gradients in f32 and is rounded once, as the others.
        near(
            "dx",
            x.grad().unwrap().unwrap(),
            xf.grad().unwrap().unwrap(),
        );
    }
}

/// A layer norm storing its output in 16 bits gives `layer_norm(…).to_dtype(…)`, forward and
/// backward, bit for bit, without keeping the f32 output.
#[test]
fn a_layer_norm_stored_in_16_bits_is_the_f32_norm_rounded() {
    for dtype in [DType::BF16, DType::F16] {
        let g = Graph::new();
        let vals = |n: usize, s: f64| -> Vec<f64> {
            (0..n).map(|k| (k as f64 * 0.71 + s).sin() * 2.0).collect()
        };
        let leaf = |n: usize, shape: &[usize], s: f64| {
            g.leaf(&vals(n, s), shape, DType::F32)
                .unwrap()
                .set_requires_grad(true)
                .unwrap()
        };
        let (x, w, b) = (
            leaf(64 * 256, &[64, 256], 0.1),
            leaf(256, &[256], 0.9),
            leaf(256, &[256], 1.7),
        );
        let (x2, w2, b2) = (
            leaf(64 * 256, &[64, 256], 0.1),
            leaf(256, &[256], 0.9),
            leaf(256, &[256], 1.7),
        );
        let before = g.stats().arena.bytes_in_use;
        let y = x.layer_norm_as(1, Some(w), Some(b), 1e-5, dtype).unwrap();
        let grown = g.stats().arena.bytes_in_use - before;
        let y2 = x2
            .layer_norm(1, Some(w2), Some(b2), 1e-5)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        assert_eq!(y.dtype(), dtype);
        let bits = |t: Tensor<'_>| {
            t.to_vec_f64()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(y), bits(y2), "{dtype:?}: forward");
        // The 16-bit output and the rows' statistics, no f32 output.
        assert!(
            grown < 64 * 256 * 4,
            "{dtype:?}: the norm kept {grown} bytes, as much as an f32 output"
        );
        let up = g.leaf(&vals(64 * 256, 3.3), &[64, 256], dtype).unwrap();
        y.mul(up).unwrap().sum().unwrap().backward().unwrap();
        y2.mul(up).unwrap().sum().unwrap().backward().unwrap();
        for (a, b, what) in [(x, x2, "dx"), (w, w2, "dw"), (b, b2, "db")] {
            let (ga, gb) = (a.grad().unwrap().unwrap(), b.grad().unwrap().unwrap());
            assert_eq!(ga.dtype(), DType::F32, "{what}");
            assert_eq!(bits(ga), bits(gb), "{dtype:?}: {what}");
        }
    }
}

/// Two edges of the 16-bit paths: attention with no queries writes zero gradients for its keys
/// and values (not whatever an earlier iteration left in the arena), and a 16-bit layer norm's
/// rule under create_graph hands its f32 bias an f32 gradient.
#[test]
fn edges_of_the_16_bit_attention_and_norm() {
    use arenagrad_graph::{grad, AttentionOptions, BackwardOptions};
    let mut g = Graph::new();
    // An earlier iteration leaves non-zero bytes in the arena.
    let junk = g.full(&[1 << 16], 7.0, DType::F32).unwrap();
    let _ = junk.exp().unwrap().sum().unwrap();
    g.reset();
    let leaf = |shape: &[usize]| {
        let n = shape.iter().product();
        g.leaf(&vec![0.5; n], shape, DType::BF16)
            .unwrap()
            .set_requires_grad(true)
            .unwrap()
    };
    let (q, k, v) = (
        leaf(&[1, 2, 0, 8]),
        leaf(&[1, 2, 4, 8]),
        leaf(&[1, 2, 4, 8]),
    );
    let y = q
        .scaled_dot_product_attention(k, v, AttentionOptions::default())
        .unwrap();
    let loss = y.sum().unwrap().add(k.sum().unwrap()).unwrap();
    loss.backward().unwrap();
    let kg = k.grad().unwrap().unwrap().to_vec_f64().unwrap();
    let vg = v.grad().unwrap().unwrap().to_vec_f64().unwrap();
    assert!(kg.iter().all(|&x| x == 1.0), "k's gradient: {kg:?}");
    assert!(vg.iter().all(|&x| x == 0.0), "v's gradient: {vg:?}");
    g.reset();

    let f32_leaf = |n: usize, shape: &[usize], s: f64| {
        let vals: Vec<f64> = (0..n).map(|k| (k as f64 * 0.3 + s).cos()).collect();
        g.leaf(&vals, shape, DType::F32)
            .unwrap()
            .set_requires_grad(true)
            .unwrap()
    };
    let (x, w, b) = (
        f32_leaf(24, &[3, 8], 0.1),
        f32_leaf(8, &[8], 1.0),
        f32_leaf(8, &[8], 2.0),
    );
    let y = x
        .layer_norm_as(1, Some(w), Some(b), 1e-5, DType::BF16)
        .unwrap();
    let y2 = x
        .layer_norm(1, Some(w), Some(b), 1e-5)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let opts = || BackwardOptions {
        create_graph: true,
        ..Default::default()
    };
    let up = g.leaf(&[0.25; 24], &[3, 8], DType::BF16).unwrap();
    let got = grad(y.mul(up).unwrap().sum().unwrap(), &[x, w, b], opts()).unwrap();
    let want = grad(y2.mul(up).unwrap().sum().unwrap(), &[x, w, b], opts()).unwrap();
    for ((a, e), what) in got.iter().zip(&want).zip(["dx", "dw", "db"]) {
        let (a, e) = (a.unwrap(), e.unwrap());
        assert_eq!(a.dtype(), DType::F32, "{what}");
        let (a, e) = (a.to_vec_f64().unwrap(), e.to_vec_f64().unwrap());
        for (p, q) in a.iter().zip(&e) {
            assert!(
                (p - q).abs() <= 1e-6 * (1.0 + q.abs()),
                "{what}: {p} against {q}"
            );
        }
    }
}

/// A transposed convolution in bf16 and f16 (the batch-wide product and fold, and the grouped
/// per-image one) within PyTorch's tolerances for those dtypes of the f32 one on the same
/// values, output and every gradient, and its output in the input's dtype.
#[test]
fn transposed_convolutions_in_16_bits_match_f32() {
    for (dtype, atol, rtol) in [(DType::BF16, 1e-2, 1.6e-2), (DType::F16, 1e-3, 1e-3)] {
        for groups in [1, 2] {
            let g = Graph::new();
            let pair = |shape: &[usize], s: f64| {
                let n: usize = shape.iter().product();
                let v: Vec<f64> = (0..n)
                    .map(|k| ((k as f64 * 0.53 + s).sin() * 64.0).round() / 256.0)
                    .collect();
                let low = g.leaf(&v, shape, dtype).unwrap();
                let full = g.leaf(&v, shape, DType::F32).unwrap();
                (
                    low.set_requires_grad(true).unwrap(),
                    full.set_requires_grad(true).unwrap(),
                )
            };
            let (x, xf) = pair(&[2, 4, 5, 6], 0.2);
            let (w, wf) = pair(&[4, 3, 4, 4], 1.1);
            let (b, bf) = pair(&[3 * groups], 2.3);
            let [y, yf] = [(x, w, b), (xf, wf, bf)].map(|(x, w, b)| {
                x.conv_transpose2d(w, Some(b), (2, 2), (1, 1), (1, 0), (1, 1), groups)
                    .unwrap()
            });
            assert_eq!(y.dtype(), dtype);
            assert_eq!(y.shape(), yf.shape());
            let close = |what: &str, lo: Tensor<'_>, hi: Tensor<'_>| {
                let (got, want) = (lo.to_vec_f64().unwrap(), hi.to_vec_f64().unwrap());
                assert_eq!(got.len(), want.len());
                for (e, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= atol + rtol * b.abs(),
                        "{dtype:?} groups {groups} {what}: element {e} is {a}, not {b}"
                    );
                }
            };
            close("y", y, yf);
            for t in [y, yf] {
                t.mul(t).unwrap().sum().unwrap().backward().unwrap();
            }
            for (lo, hi, what) in [(x, xf, "dx"), (w, wf, "dw"), (b, bf, "db")] {
                let gl = lo.grad().unwrap().unwrap();
                assert_eq!(gl.dtype(), dtype, "{what}");
                close(what, gl, hi.grad().unwrap().unwrap());
            }
        }
    }
}
