//! The fused `scaled_dot_product_attention` against values PyTorch 2.15 printed (float64, with
//! and without `is_causal`), against the same formula composed of tensor ops on shapes that are
//! not multiples of the kernel's tile (masks broadcast over heads, causal, a custom scale,
//! dropout), against finite differences in f64 and to second order; and the memory it promises:
//! a 4096-token attention step peaking at a small fraction of the composition's.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, CheckFn, GradcheckOptions};
use arenagrad_graph::{
    grad, AttentionOptions, BackwardOptions, DType, Graph, GraphError, HostTensor, Result, Tensor,
};

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}: element {k}: {a} vs {b}"
        );
    }
}

/// Deterministic values in about [-1.5, 1.5].
fn vals(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i as f64 + 1.0) * 0.618_034 * (seed as f64 + 1.3)).sin() * 1.5)
        .collect()
}

/// The reference: `softmax(q·kᵀ·scale + mask)·v`, causal by `masked_fill`, in tensor ops.
fn naive<'g>(
    g: &'g Graph,
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    opts: AttentionOptions<'g>,
) -> Result<Tensor<'g>> {
    let qs = q.shape();
    let r = qs.len();
    let (lq, lk, d) = (qs[r - 2], k.shape()[r - 2], qs[r - 1]);
    let scale = opts.scale.unwrap_or(1.0 / (d as f64).sqrt());
    let mut s = q.matmul(k.transpose(-2, -1)?)?.scale(scale)?;
    if let Some(m) = opts.mask {
        s = s.add(m)?;
    }
    if opts.causal {
        let hide = g.full(&[lq, lk], 1.0, q.dtype())?.triu(1)?;
        s = s.masked_fill(hide, f64::NEG_INFINITY)?;
    }
    s.softmax(-1)?.matmul(v)
}

#[test]
fn matches_pytorch_with_and_without_causal() {
    let g = Graph::new();
    let q = g
        .leaf(&[0.3, -1.2, 0.8, 2.1, -0.4, 1.7], &[1, 3, 2], DType::F64)
        .unwrap();
    let k = g
        .leaf(
            &[0.5, 0.1, -0.9, 0.4, 1.1, -0.3, 0.2, 0.2],
            &[1, 4, 2],
            DType::F64,
        )
        .unwrap();
    #[rustfmt::skip]
    let v = g.leaf(&[1., 0., 2., 0., 1., -1., 0.5, 0.5, 0.5, -1., 2., 0.], &[1, 4, 3], DType::F64)
        .unwrap();
    let c = g
        .from_f64(
            &[1., 2., 3., -1., 0.5, 2., 0.3, -0.7, 1.1],
            &[1, 3, 3],
            DType::F64,
        )
        .unwrap();
    #[rustfmt::skip]
    let want: [(bool, [&[f64]; 4]); 2] = [
        (false, [
            &[0.23193643923099108, 0.768063560769009, 0.550810327564894, 0.11804888297201654,
              0.8819511170279835, 0.4854794296767435, 0.006819642055386543, 0.9931803579446135,
              0.026607479580027467],
            &[0.5736178792056389, -0.0932741809122809, 0.4710065741969421, -0.07250683069549205,
              0.592361943679478, -0.15432089151145786],
            &[0.28374645834386925, 0.7580478888490814, -0.31652624140581, -0.908103231184514,
              -0.13484106378010838, 0.09051081562692741, 0.16762084684204895, 0.05954452670850581],
            &[0.020541635324718796, 0.49695394763902045, 1.54709063415958, 0.06954014122199739,
              0.08218348956971999, 1.3174492544444136, 0.2035400246694371, 0.8280214571076395,
              1.7518521114229058, 0.006378198783846836, 0.39284110568362024, 1.4836079999731013],
        ]),
        (true, [
            &[1.0, 0.0, 2.0, 0.5857642922449694, 0.4142357077550306, 0.7572928767349082,
              0.3451831662569042, 0.6548168337430957, 0.035549498770712604],
            &[0.0, 0.0, 1.0809260380319732, -0.23162700814970863, 0.8975690941139873,
              -0.21058683023549724],
            &[0.39964601603908584, 2.5479995812452088, -0.3727504012017177, -2.662305944304024,
              -0.026895614837368263, 0.11430636305881509, 0.0, 0.0],
            &[0.49636465738618285, 2.101247930316463, 4.47266806647083, -0.23921665787802085,
              -0.20125992916884078, 1.4702079317257637, 0.042852000491837954, -0.09998800114762188,
              0.15712400180340583, 0.0, 0.0, 0.0],
        ]),
    ];
    for (causal, [o, dq, dk, dv]) in want {
        let opts = AttentionOptions {
            causal,
            ..Default::default()
        };
        let out = q.scaled_dot_product_attention(k, v, opts).unwrap();
        close(&out.to_vec_f64().unwrap(), o, 1e-12, "output");
        let loss = out.mul(c).unwrap().sum().unwrap();
        let gr = grad(loss, &[q, k, v], BackwardOptions::default()).unwrap();
        for (name, got, want) in [("dq", &gr[0], dq), ("dk", &gr[1], dk), ("dv", &gr[2], dv)] {
            close(&got.unwrap().to_vec_f64().unwrap(), want, 1e-12, name);
        }
    }
}

/// The fused op and the composition on the same inputs: values and all three gradients.
fn agree(
    shape_q: &[usize],
    shape_k: &[usize],
    dv: usize,
    mask: Option<&[usize]>,
    causal: bool,
    scale: Option<f64>,
) {
    let g = Graph::new();
    let mut shape_v = shape_k.to_vec();
    *shape_v.last_mut().unwrap() = dv;
    let n = |s: &[usize]| s.iter().product::<usize>();
    let q = g.leaf(&vals(n(shape_q), 1), shape_q, DType::F64).unwrap();
    let k = g.leaf(&vals(n(shape_k), 2), shape_k, DType::F64).unwrap();
    let v = g.leaf(&vals(n(&shape_v), 3), &shape_v, DType::F64).unwrap();
    let m = mask.map(|ms| {
        // Some keys hidden, the rest shifted: an additive mask with −∞ entries.
        let mv: Vec<f64> = vals(n(ms), 4)
            .iter()
            .map(|&x| if x > 1.2 { f64::NEG_INFINITY } else { x * 0.5 })
            .collect();
        g.from_f64(&mv, ms, DType::F64).unwrap()
    });
    let opts = AttentionOptions {
        mask: m,
        causal,
        dropout_p: 0.0,
        scale,
    };
    let what = format!("q {shape_q:?} k {shape_k:?} mask {mask:?} causal {causal}");
    let fused = q.scaled_dot_product_attention(k, v, opts).unwrap();
    let reference = naive(&g, q, k, v, opts).unwrap();
    close(
        &fused.to_vec_f64().unwrap(),
        &reference.to_vec_f64().unwrap(),
        1e-10,
        &what,
    );
    let w = g
        .from_f64(&vals(n(&fused.shape()), 5), &fused.shape(), DType::F64)
        .unwrap();
    let gf = grad(
        fused.mul(w).unwrap().sum().unwrap(),
        &[q, k, v],
        BackwardOptions::default(),
    )
    .unwrap();
    let gr = grad(
        reference.mul(w).unwrap().sum().unwrap(),
        &[q, k, v],
        BackwardOptions::default(),
    )
    .unwrap();
    for (a, b) in gf.iter().zip(&gr) {
        close(
            &a.unwrap().to_vec_f64().unwrap(),
            &b.unwrap().to_vec_f64().unwrap(),
            1e-9,
            &what,
        );
    }
}

#[test]
fn agrees_with_the_composition_across_tiles_masks_and_causal() {
    // Lengths across the kernel's tiles (32 wide; 64 before), unequal query and key counts, value width ≠ key width.
    agree(&[2, 3, 70, 8], &[2, 3, 130, 8], 5, None, false, None);
    agree(&[2, 3, 70, 8], &[2, 3, 130, 8], 5, None, true, None);
    agree(&[1, 2, 129, 4], &[1, 2, 129, 4], 4, None, true, Some(0.3));
    // A mask broadcast over batch and heads, and one per batch broadcast over heads.
    agree(
        &[2, 2, 65, 6],
        &[2, 2, 66, 6],
        3,
        Some(&[65, 66]),
        false,
        None,
    );
    agree(
        &[2, 2, 65, 6],
        &[2, 2, 66, 6],
        3,
        Some(&[2, 1, 65, 66]),
        true,
        None,
    );
    // More queries than one tile of 128 against one block of keys.
    agree(&[1, 2, 150, 8], &[1, 2, 100, 8], 4, None, false, None);
    // More keys than one block (256): tiles of keys with the online softmax, each tile's keys
    // a view into the head's keys transposed once.
    agree(&[1, 2, 40, 8], &[1, 2, 300, 8], 4, None, false, None);
    agree(&[1, 1, 300, 8], &[1, 1, 300, 8], 4, None, true, Some(0.2));
    // Rank 3 (no head axis) and rank 2.
    agree(&[3, 5, 4], &[3, 7, 4], 2, Some(&[1, 7]), false, None);
    agree(&[5, 4], &[7, 4], 3, None, true, None);
}

/// Without a causal mask the forward takes up to 128 queries at a time against a short run of
/// keys (32 otherwise): a query's output and log-sum-exp must not depend on the tile it falls
/// in. The whole problem and its queries 32 at a time give the same bits, with a key-padding
/// mask (the kernel's contiguous mask loop), with a full mask, with one broadcast over the keys
/// (its strided loop) and without one; each is also the composition's value.
#[test]
fn a_querys_output_does_not_depend_on_its_tile() {
    let g = Graph::new();
    let (h, lq, lk, d) = (2, 150, 100, 8);
    let f32s = |n: usize, seed: u64, shape: &[usize]| {
        let v: Vec<f32> = vals(n, seed).iter().map(|&x| x as f32).collect();
        g.from_slice(&v, shape).unwrap()
    };
    let (q, k, v) = (
        f32s(h * lq * d, 1, &[h, lq, d]),
        f32s(h * lk * d, 2, &[h, lk, d]),
        f32s(h * lk * d, 3, &[h, lk, d]),
    );
    let hidden = |x: f64| if x > 1.2 { f32::NEG_INFINITY } else { x as f32 };
    let padding: Vec<f32> = vals(lk, 4).into_iter().map(hidden).collect();
    let full: Vec<f32> = vals(lq * lk, 5).into_iter().map(hidden).collect();
    let shift: Vec<f32> = vals(lq, 6).iter().map(|&x| x as f32).collect();
    let masks = [
        None,
        Some((g.from_slice(&padding, &[1, lk]).unwrap(), false)),
        Some((g.from_slice(&full, &[lq, lk]).unwrap(), true)),
        Some((g.from_slice(&shift, &[lq, 1]).unwrap(), true)),
    ];
    for mask in masks {
        let opts = |m| AttentionOptions {
            mask: m,
            ..Default::default()
        };
        let whole = q
            .scaled_dot_product_attention(k, v, opts(mask.map(|m| m.0)))
            .unwrap();
        let reference = naive(&g, q, k, v, opts(mask.map(|m| m.0))).unwrap();
        close(
            &whole.to_vec_f64().unwrap(),
            &reference.to_vec_f64().unwrap(),
            1e-5,
            &format!("mask {mask:?}"),
        );
        for i0 in (0..lq).step_by(32) {
            let n = 32.min(lq - i0);
            let m = mask.map(|(m, per_query)| {
                if per_query {
                    m.narrow(0, i0, n).unwrap()
                } else {
                    m
                }
            });
            let part = q
                .narrow(1, i0, n)
                .unwrap()
                .scaled_dot_product_attention(k, v, opts(m))
                .unwrap();
            let want = whole.narrow(1, i0, n).unwrap().to_vec::<f32>().unwrap();
            let got = part.to_vec::<f32>().unwrap();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "queries {i0}.. mask {mask:?}");
        }
    }
}

/// The heads go in parts that the threads claim (several parts a thread, a part's heads
/// starting anywhere): outputs and gradients have the same bits on one, two and three threads,
/// with a mask whose rows differ by batch, causal, and dropout (whose draw depends on the head).
#[test]
fn the_heads_give_the_same_bits_on_any_number_of_threads() {
    let (b, h, l, d) = (2, 19, 40, 8);
    let hidden = |x: f64| if x > 1.2 { f64::NEG_INFINITY } else { x };
    let padding: Vec<f64> = vals(b * l, 4).into_iter().map(hidden).collect();
    let run = |threads: usize, dtype: DType, causal: bool, dropout_p: f64| {
        let g = Graph::with_threads(threads);
        g.seed(3);
        let leaf = |seed| {
            g.leaf(&vals(b * h * l * d, seed), &[b, h, l, d], dtype)
                .unwrap()
        };
        let (q, k, v) = (leaf(1), leaf(2), leaf(3));
        let mask = g.from_f64(&padding, &[b, 1, 1, l], dtype).unwrap();
        let opts = AttentionOptions {
            mask: Some(mask),
            causal,
            dropout_p,
            ..Default::default()
        };
        let o = q.scaled_dot_product_attention(k, v, opts).unwrap();
        let w = g
            .from_f64(&vals(b * h * l * d, 5), &[b, h, l, d], dtype)
            .unwrap();
        let loss = o.mul(w).unwrap().sum().unwrap();
        let gr = grad(loss, &[q, k, v], BackwardOptions::default()).unwrap();
        let mut all = o.to_vec_f64().unwrap();
        for x in gr {
            all.extend(x.unwrap().to_vec_f64().unwrap());
        }
        all.iter().map(|x| x.to_bits()).collect::<Vec<u64>>()
    };
    for dtype in [DType::F32, DType::BF16] {
        for (causal, dropout_p) in [(false, 0.0), (true, 0.0), (true, 0.25)] {
            let one = run(1, dtype, causal, dropout_p);
            for threads in [2, 3] {
                let many = run(threads, dtype, causal, dropout_p);
                assert!(
                    one == many,
                    "{dtype:?} causal {causal} dropout {dropout_p}: {threads} threads differ"
                );
            }
        }
    }
}

#[test]
fn rows_with_every_key_hidden_are_zero_as_pytorchs_and_no_keys_give_zeros() {
    // PyTorch 2.15's scaled_dot_product_attention gives 0 for a query whose every key is
    // masked (its safe softmax), and zeros when there are no keys.
    let g = Graph::new();
    let q = g.leaf(&vals(8, 1), &[2, 4], DType::F64).unwrap();
    let k = g.leaf(&vals(12, 2), &[3, 4], DType::F64).unwrap();
    let v = g.leaf(&vals(6, 3), &[3, 2], DType::F64).unwrap();
    let inf = f64::NEG_INFINITY;
    let m = g
        .from_f64(&[inf, inf, inf, 0.0, inf, 0.0], &[2, 3], DType::F64)
        .unwrap();
    let opts = AttentionOptions {
        mask: Some(m),
        ..Default::default()
    };
    let o = q.scaled_dot_product_attention(k, v, opts).unwrap();
    let r = naive(&g, q, k, v, opts).unwrap().to_vec_f64().unwrap();
    let ov = o.to_vec_f64().unwrap();
    assert_eq!(ov[..2], [0.0, 0.0]);
    close(&ov[2..], &r[2..], 1e-12, "the unmasked row");
    let w = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F64)
        .unwrap();
    let loss = o.mul(w).unwrap().sum().unwrap();
    let plain = grad(
        loss,
        &[q, k, v],
        BackwardOptions {
            retain_graph: true,
            ..Default::default()
        },
    )
    .unwrap();
    let composed = grad(
        loss,
        &[q, k, v],
        BackwardOptions {
            create_graph: true,
            ..Default::default()
        },
    )
    .unwrap();
    for (a, b) in plain.iter().zip(&composed) {
        let (a, b) = (
            a.unwrap().to_vec_f64().unwrap(),
            b.unwrap().to_vec_f64().unwrap(),
        );
        assert!(a.iter().all(|x| x.is_finite()), "{a:?}");
        close(&a, &b, 1e-12, "the fused and composed rules");
    }
    assert_eq!(
        plain[0].unwrap().to_vec_f64().unwrap()[..4],
        [0.0; 4],
        "no gradient to the hidden query"
    );
    let k0 = g.zeros(&[0, 4], DType::F64).unwrap();
    let v0 = g.zeros(&[0, 2], DType::F64).unwrap();
    let o = q
        .scaled_dot_product_attention(k0, v0, AttentionOptions::default())
        .unwrap();
    assert_eq!(o.shape().as_slice(), &[2, 2]);
    assert_eq!(o.to_vec_f64().unwrap(), [0.0; 4]);
}

#[test]
fn an_empty_batch_gives_an_empty_output_and_gradient() {
    // Found by the build_run fuzzer: no heads at all divided by zero splitting them.
    let g = Graph::new();
    let q = g.leaf(&[], &[0, 3, 4], DType::F64).unwrap();
    let k = g.leaf(&[], &[0, 5, 4], DType::F64).unwrap();
    let v = g.leaf(&[], &[0, 5, 2], DType::F64).unwrap();
    let o = q
        .scaled_dot_product_attention(k, v, AttentionOptions::default())
        .unwrap();
    assert_eq!(o.shape().as_slice(), &[0, 3, 2]);
    let gr = grad(o.sum().unwrap(), &[q, k, v], BackwardOptions::default()).unwrap();
    assert_eq!(gr[1].unwrap().shape().as_slice(), &[0, 5, 4]);
}

#[test]
fn gradients_pass_finite_differences_and_second_order() {
    let xs = [
        HostTensor::from_f64(&vals(2 * 3 * 4, 1), &[2, 3, 4], DType::F64).unwrap(),
        HostTensor::from_f64(&vals(2 * 5 * 4, 2), &[2, 5, 4], DType::F64).unwrap(),
        HostTensor::from_f64(&vals(2 * 5 * 3, 3), &[2, 5, 3], DType::F64).unwrap(),
    ];
    for causal in [false, true] {
        let f = check_fn(move |_, x| {
            let o = x[0].scaled_dot_product_attention(
                x[1],
                x[2],
                AttentionOptions {
                    causal,
                    ..Default::default()
                },
            )?;
            o.tanh()
        });
        passes_both_orders(f, &xs, &format!("causal {causal}"));
    }
}

#[test]
fn dropout_is_replayed_exactly_by_backward() {
    let g = Graph::new();
    g.seed(7);
    let q = g
        .leaf(&vals(2 * 70 * 8, 1), &[2, 70, 8], DType::F64)
        .unwrap();
    let k = g
        .leaf(&vals(2 * 90 * 8, 2), &[2, 90, 8], DType::F64)
        .unwrap();
    let v = g
        .leaf(&vals(2 * 90 * 3, 3), &[2, 90, 3], DType::F64)
        .unwrap();
    let opts = AttentionOptions {
        dropout_p: 0.3,
        causal: true,
        ..Default::default()
    };
    let o = q.scaled_dot_product_attention(k, v, opts).unwrap();
    let plain = q
        .scaled_dot_product_attention(
            k,
            v,
            AttentionOptions {
                dropout_p: 0.0,
                ..opts
            },
        )
        .unwrap();
    assert_ne!(o.to_vec_f64().unwrap(), plain.to_vec_f64().unwrap());
    let w = g
        .from_f64(&vals(2 * 70 * 3, 5), &[2, 70, 3], DType::F64)
        .unwrap();
    let loss = o.mul(w).unwrap().sum().unwrap();
    // The fused rule (a plain backward) and the tensor-op rule (create_graph) regenerate the
    // mask independently; they agree only if both replay the forward's.
    let composed = grad(
        loss,
        &[q, k, v],
        BackwardOptions {
            create_graph: true,
            retain_graph: true,
            ..Default::default()
        },
    )
    .unwrap();
    let fused = grad(loss, &[q, k, v], BackwardOptions::default()).unwrap();
    for (a, b) in fused.iter().zip(&composed) {
        close(
            &a.unwrap().to_vec_f64().unwrap(),
            &b.unwrap().to_vec_f64().unwrap(),
            1e-10,
            "dropout gradients",
        );
    }
    // The same seed, the same mask.
    g.seed(7);
    let again = q.scaled_dot_product_attention(k, v, opts).unwrap();
    assert_eq!(again.to_vec_f64().unwrap(), o.to_vec_f64().unwrap());
}

#[test]
fn a_long_sequence_needs_a_fraction_of_the_compositions_memory() {
    // One head of 4096 tokens: the composition holds 4096² scores, weights and their
    // gradients; the fused op only q, k, v, the output and 4096 log-sum-exps.
    let (l, d) = (4096, 16);
    let peak = |fused: bool| {
        let g = Graph::with_threads(2);
        let q = g.leaf(&vals(l * d, 1), &[1, l, d], DType::F32).unwrap();
        let k = g.leaf(&vals(l * d, 2), &[1, l, d], DType::F32).unwrap();
        let v = g.leaf(&vals(l * d, 3), &[1, l, d], DType::F32).unwrap();
        g.reset_peak_stats();
        let opts = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let o = if fused {
            q.scaled_dot_product_attention(k, v, opts).unwrap()
        } else {
            naive(&g, q, k, v, opts).unwrap()
        };
        let gr = grad(o.sum().unwrap(), &[q, k, v], BackwardOptions::default()).unwrap();
        let first = gr[0].unwrap().to_vec_f64().unwrap()[..8].to_vec();
        (g.stats().arena.peak_bytes_in_use, first)
    };
    let (fused, gf) = peak(true);
    let (naive, gn) = peak(false);
    close(&gf, &gn, 1e-3, "the two dq agree");
    let inputs = 3 * l * d * 4;
    assert!(
        fused * 20 < naive,
        "fused peak {fused} B vs composed {naive} B"
    );
    assert!(
        fused < 4 * inputs,
        "fused peak {fused} B, inputs {inputs} B"
    );
}

#[test]
fn bad_arguments_are_errors_naming_the_op() {
    let g = Graph::new();
    let q = g.leaf(&vals(24, 1), &[2, 3, 4], DType::F64).unwrap();
    let k = g.leaf(&vals(40, 2), &[2, 5, 4], DType::F64).unwrap();
    let v = g.leaf(&vals(30, 3), &[2, 5, 3], DType::F64).unwrap();
    let o = AttentionOptions::default();
    let op = "scaled_dot_product_attention";
    let bad_k = g.zeros(&[2, 5, 3], DType::F64).unwrap();
    let bad_v = g.zeros(&[2, 4, 3], DType::F64).unwrap();
    let bad_m = g.zeros(&[4, 5], DType::F64).unwrap();
    let f32v = g.zeros(&[2, 5, 3], DType::F32).unwrap();
    for r in [
        q.scaled_dot_product_attention(bad_k, v, o),
        q.scaled_dot_product_attention(k, bad_v, o),
        q.scaled_dot_product_attention(
            k,
            v,
            AttentionOptions {
                mask: Some(bad_m),
                ..o
            },
        ),
    ] {
        assert!(
            matches!(r, Err(GraphError::ShapeMismatch { op: o, .. }) if o == op),
            "{r:?}"
        );
    }
    assert!(matches!(
        q.scaled_dot_product_attention(k, f32v, o),
        Err(GraphError::DTypeMismatch { .. })
    ));
    for p in [-0.1, 1.5, f64::NAN] {
        assert!(matches!(
            q.scaled_dot_product_attention(k, v, AttentionOptions { dropout_p: p, ..o }),
            Err(GraphError::BadArgument { .. })
        ));
    }
    let flat = g.zeros(&[4], DType::F64).unwrap();
    assert!(matches!(
        flat.scaled_dot_product_attention(flat, flat, o),
        Err(GraphError::BadArgument { .. })
    ));
}

/// What [`Tensor::attention_packed`] stands for, in the ops it replaces: `qkv` `[b, l, 3·h·d]`
/// reshaped to `[b, l, 3, h, d]`, the parts as `[b, h, l, d]`, attention, the heads merged.
fn by_the_ops<'g>(qkv: Tensor<'g>, h: usize, opts: AttentionOptions<'g>) -> Result<Tensor<'g>> {
    let s = qkv.shape();
    let (b, l, d) = (s[0] as isize, s[1] as isize, (s[2] / (3 * h)) as isize);
    let h = h as isize;
    let t = qkv.reshape(&[b, l, 3, h, d])?.permute(&[2, 0, 3, 1, 4])?;
    let part = |k: usize| t.slice(0, k, k + 1)?.reshape(&[b, h, l, d]);
    part(0)?
        .scaled_dot_product_attention(part(1)?, part(2)?, opts)?
        .permute(&[0, 2, 1, 3])?
        .reshape(&[b, l, h * d])
}

/// `f` passes gradcheck and gradgradcheck at `xs`.
fn passes_both_orders(f: impl CheckFn + Copy, xs: &[HostTensor], what: &str) {
    let opts = GradcheckOptions::default();
    let r = gradcheck(f, xs, opts).unwrap();
    assert!(r.passed, "{what}: {r}");
    let r = gradgradcheck(f, xs, opts).unwrap();
    assert!(r.passed, "{what}, second order: {r}");
}

/// The packed form against the ops it stands for (reshape to `[b, l, 3, h, d]`, the parts as
/// `[b, h, l, d]`, attention, the heads merged back): the same values and gradients in f64, f32,
/// bf16 and f16, causal or not, with dropout (the same draw from the graph's stream), on one and
/// two threads; and to second order through `create_graph`. The second shape has more keys than
/// one block and heads too long for the 16-bit kernels to widen more than three at a time (they
/// read them where they lie in the packed input, group by group; a group crosses from one
/// sequence's heads to the next's).
#[test]
fn packed_attention_is_the_ops_it_stands_for() {
    for (b, l, h, d) in [(2, 37, 3, 4), (2, 300, 4, 16)] {
        packed_against_the_ops((b, l, h, d));
    }
    packed_to_second_order();
}

fn packed_against_the_ops((b, l, h, d): (usize, usize, usize, usize)) {
    for threads in [1, 2] {
        for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16] {
            for (causal, dropout_p) in [(false, 0.0), (true, 0.0), (true, 0.25)] {
                let what = format!(
                    "[{b}, {l}, {h}, {d}] {dtype:?} causal {causal} dropout {dropout_p} \
                     threads {threads}"
                );
                let opts = AttentionOptions {
                    causal,
                    dropout_p,
                    ..Default::default()
                };
                let g = Graph::with_threads(threads);
                let x = g
                    .leaf(&vals(b * l * 3 * h * d, 9), &[b, l, 3 * h * d], dtype)
                    .unwrap();
                let w = g
                    .from_f64(&vals(b * l * h * d, 4), &[b, l, h * d], dtype)
                    .unwrap();
                let run = |packed: bool| {
                    g.seed(11);
                    let o = if packed {
                        x.attention_packed(h, opts).unwrap()
                    } else {
                        by_the_ops(x, h, opts).unwrap()
                    };
                    let loss = o.mul(w).unwrap().sum().unwrap();
                    let dx = grad(loss, &[x], BackwardOptions::default()).unwrap()[0].unwrap();
                    (o.to_vec_f64().unwrap(), dx.to_vec_f64().unwrap())
                };
                let (o1, g1) = run(true);
                let (o2, g2) = run(false);
                assert_eq!(o1, o2, "{what}: output");
                assert_eq!(g1, g2, "{what}: gradient");
                g.seed(11);
                let again = by_the_ops(x, h, opts).unwrap().to_vec_f64().unwrap();
                assert_eq!(again, o2, "{what}: the same draw again");
            }
        }
    }
}

/// Second order, through the rule in tensor ops.
fn packed_to_second_order() {
    let xs = [HostTensor::from_f64(&vals(2 * 3 * 12, 1), &[2, 3, 12], DType::F64).unwrap()];
    for causal in [false, true] {
        let f = check_fn(move |_, x| {
            let opts = AttentionOptions {
                causal,
                ..Default::default()
            };
            x[0].attention_packed(2, opts)?.tanh()
        });
        passes_both_orders(f, &xs, &format!("packed, causal {causal}"));
    }
}

/// The packed form keeps no copy of the parts: after the forward the arena holds the output
/// and the rows' log-sum-exp beyond the input, where the ops it stands for hold the permuted
/// projection and its three slices too; and bad shapes are errors naming the op.
#[test]
fn packed_attention_keeps_no_parts_and_refuses_bad_shapes() {
    let (b, l, h, d) = (2, 64, 4, 8);
    let in_use = |packed: bool| {
        let g = Graph::new();
        let x = g
            .leaf(&vals(b * l * 3 * h * d, 3), &[b, l, 3 * h * d], DType::F32)
            .unwrap();
        let before = g.stats().arena.bytes_in_use;
        let o = if packed {
            x.attention_packed(h, AttentionOptions::default()).unwrap()
        } else {
            by_the_ops(x, h, AttentionOptions::default()).unwrap()
        };
        std::hint::black_box(o);
        g.stats().arena.bytes_in_use - before
    };
    let (packed, ops) = (in_use(true), in_use(false));
    let out = b * l * h * d * 4;
    assert!(
        packed <= out + b * h * l * 4 + 4096,
        "packed keeps {packed} bytes"
    );
    assert!(
        ops >= packed + 6 * out,
        "the ops keep {ops} bytes, packed {packed}"
    );

    let g = Graph::new();
    let x = g.zeros(&[2, 5, 24], DType::F32).unwrap();
    let e = x
        .attention_packed(0, AttentionOptions::default())
        .unwrap_err();
    assert!(
        matches!(
            e,
            GraphError::BadArgument {
                op: "attention_packed",
                ..
            }
        ),
        "{e}"
    );
    for (shape, heads) in [
        (&[2, 5, 25][..], 2),
        (&[10, 24][..], 2),
        (&[2, 5, 24][..], usize::MAX),
    ] {
        let x = g.zeros(shape, DType::F32).unwrap();
        let e = x
            .attention_packed(heads, AttentionOptions::default())
            .unwrap_err();
        let named = matches!(
            &e,
            GraphError::ShapeMismatch { op: "attention_packed", lhs, .. } if lhs[..] == *shape
        );
        assert!(named, "{shape:?} heads {heads}: {e}");
    }
}

/// Softmax attention written out in f64 over host values: `q` `[b, heads, new, d]`, the
/// cache `k`, `v` `[b, kv, cap, ·]` read to `len`, query head h on key/value head
/// h / (heads / kv), query i seeing keys j ≤ len − new + i when causal.
#[allow(clippy::too_many_arguments)]
fn naive_cache_attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    [b, heads, kv, new, len, cap, d, dv]: [usize; 8],
    causal: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; b * heads * new * dv];
    for bi in 0..b {
        for h in 0..heads {
            let kvh = bi * kv + h / (heads / kv);
            for i in 0..new {
                let qi = &q[((bi * heads + h) * new + i) * d..][..d];
                let limit = if causal { len - new + i + 1 } else { len };
                let s: Vec<f64> = (0..limit)
                    .map(|j| {
                        let kj = &k[(kvh * cap + j) * d..][..d];
                        qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let total: f64 = w.iter().sum();
                let o = &mut out[((bi * heads + h) * new + i) * dv..][..dv];
                for (j, wj) in w.iter().enumerate() {
                    for (c, oc) in o.iter_mut().enumerate() {
                        *oc += wj / total * v[(kvh * cap + j) * dv + c];
                    }
                }
            }
        }
    }
    out
}

/// `attend_cache` reads the cache where it lies (NaN past `len` is never read) with the values
/// of attention written out in f64, in every float dtype, for plain and grouped-query heads,
/// one and several new queries, causal or not; with a query that requires grad it runs the
/// recorded ops (the same values) and its gradient flows.
#[test]
fn attend_cache_reads_the_cache_where_it_lies() {
    let (b, cap, d, dv) = (2, 9, 8, 6);
    let mut seed = 3u64;
    let mut rand = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect()
    };
    for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16] {
        let tol = match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 2e-2,
        };
        for (heads, kv) in [(4, 4), (4, 2), (4, 1)] {
            for (new, len, causal) in [(1, 5, true), (3, 7, true), (3, 7, false), (2, 2, true)] {
                let g = Graph::new();
                // Past `len` the cache holds NaN: read, it would show in every output.
                let cache = |w: usize, vals: Vec<f64>| -> Vec<f64> {
                    vals.iter()
                        .enumerate()
                        .map(|(x, &y)| if (x / w) % cap < len { y } else { f64::NAN })
                        .collect()
                };
                let kh = cache(d, rand(b * kv * cap * d));
                let vh = cache(dv, rand(b * kv * cap * dv));
                let qh = rand(b * heads * new * d);
                let k = g.from_f64(&kh, &[b, kv, cap, d], dtype).unwrap();
                let v = g.from_f64(&vh, &[b, kv, cap, dv], dtype).unwrap();
                let q = g.from_f64(&qh, &[b, heads, new, d], dtype).unwrap();
                // The reference sees the values as stored (rounded to the dtype).
                let (qr, kr, vr) = (
                    q.to_vec_f64().unwrap(),
                    k.to_vec_f64().unwrap(),
                    v.to_vec_f64().unwrap(),
                );
                let want = naive_cache_attention(
                    &qr,
                    &kr,
                    &vr,
                    [b, heads, kv, new, len, cap, d, dv],
                    causal,
                );
                let fast = q.attend_cache(k, v, len, causal).unwrap();
                assert_eq!(fast.shape().as_slice(), &[b, heads, new, dv]);
                assert_eq!(fast.dtype(), dtype);
                let qg = q.detach().unwrap().set_requires_grad(true).unwrap();
                let slow = qg.attend_cache(k, v, len, causal).unwrap();
                for (name, got) in [("in place", fast), ("recorded", slow)] {
                    let got = got.to_vec_f64().unwrap();
                    let worst = got
                        .iter()
                        .zip(&want)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max);
                    assert!(
                        worst <= tol,
                        "{dtype:?} heads {heads}/{kv} new {new} len {len} causal {causal} \
                         ({name}): off by {worst}"
                    );
                }
                slow.sum().unwrap().backward().unwrap();
                let grad = qg.grad().unwrap().unwrap().to_vec_f64().unwrap();
                assert!(grad.iter().all(|x| x.is_finite()) && grad.iter().any(|&x| x != 0.0));
            }
        }
    }
}

/// A cache long enough for `attend_cache` to split its heads over threads (each thread widening
/// the rows it reads in 16-bit storage: row by row for a token's few queries, the key/value head
/// at once for a prompt's many): the values of attention written out in f64, and the same bits
/// on one, two and three threads, with grouped-query heads.
#[test]
fn long_caches_split_over_threads_give_the_written_out_values() {
    let (b, heads, kv, len, cap, d, dv) = (2, 4, 2, 600, 640, 8, 8);
    let vals = |n: usize, seed: usize| -> Vec<f64> {
        (0..n)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f64 / 1001.5) - 1.0)
            .collect()
    };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        // Within the output's rounding (|o| < 0.5 here) and the f32 kernel's.
        let tol = match dtype {
            DType::F32 => 1e-5,
            DType::BF16 => 4e-3,
            _ => 5e-4,
        };
        for new in [1, 2, 9] {
            let mut first: Option<Vec<f64>> = None;
            for threads in [1, 2, 3] {
                let g = Graph::with_threads(threads);
                let k = g
                    .from_f64(&vals(b * kv * cap * d, 1), &[b, kv, cap, d], dtype)
                    .unwrap();
                let v = g
                    .from_f64(&vals(b * kv * cap * dv, 2), &[b, kv, cap, dv], dtype)
                    .unwrap();
                let q = g
                    .from_f64(&vals(b * heads * new * d, 3), &[b, heads, new, d], dtype)
                    .unwrap();
                let want = naive_cache_attention(
                    &q.to_vec_f64().unwrap(),
                    &k.to_vec_f64().unwrap(),
                    &v.to_vec_f64().unwrap(),
                    [b, heads, kv, new, len, cap, d, dv],
                    true,
                );
                let got = q
                    .attend_cache(k, v, len, true)
                    .unwrap()
                    .to_vec_f64()
                    .unwrap();
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                let what = format!("{dtype:?}, {new} new, {threads} threads");
                assert!(worst <= tol, "{what}: off by {worst}");
                match &first {
                    None => first = Some(got),
                    Some(one) => assert!(
                        one.iter()
                            .zip(&got)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{what}: not the bits of one thread"
                    ),
                }
            }
        }
    }
}

/// `attend_cache` refuses a cache shorter than `len`, fewer positions than new queries, heads
/// that do not divide, shapes of another rank and mixed dtypes, naming the op.
#[test]
fn attend_cache_refuses_bad_caches() {
    let g = Graph::new();
    let f = DType::F32;
    let q = g.zeros(&[1, 4, 2, 8], f).unwrap();
    let k = g.zeros(&[1, 2, 6, 8], f).unwrap();
    let v = g.zeros(&[1, 2, 6, 8], f).unwrap();
    for len in [7, 1] {
        assert!(
            matches!(
                q.attend_cache(k, v, len, true).unwrap_err(),
                GraphError::BadRange {
                    op: "attend_cache",
                    axis: 2,
                    ..
                }
            ),
            "len {len}"
        );
    }
    let k3 = g.zeros(&[1, 3, 6, 8], f).unwrap();
    let v3 = g.zeros(&[1, 3, 6, 8], f).unwrap();
    let flat = g.zeros(&[4, 2, 8], f).unwrap();
    let short_v = g.zeros(&[1, 2, 5, 8], f).unwrap();
    for (q, k, v) in [(q, k3, v3), (flat, k, v), (q, k, short_v)] {
        let err = q.attend_cache(k, v, 2, false).unwrap_err();
        assert!(
            matches!(
                err,
                GraphError::ShapeMismatch {
                    op: "attend_cache",
                    ..
                }
            ),
            "{err}"
        );
    }
    let k64 = g.zeros(&[1, 2, 6, 8], DType::F64).unwrap();
    assert!(matches!(
        q.attend_cache(k64, v, 2, false).unwrap_err(),
        GraphError::DTypeMismatch {
            op: "attend_cache",
            ..
        }
    ));
}
