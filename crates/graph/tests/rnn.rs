//! The fused recurrent ops: `lstm_cell` and `gru_cell` against the same formulas written in
//! elementary ops, to second order through their `create_graph` rules; `lstm_sequence` against a
//! loop of cells, against each row run alone to its own length (forwards and reversed), and
//! against finite differences in f64 for every input.

mod common;

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_graph::{
    BackwardOptions, DType, Graph, GraphError, HostTensor, LstmSequenceOptions, Result, Tensor,
};
use common::values;

fn host(n: usize, shape: &[usize], seed: u64) -> HostTensor {
    HostTensor::from_f64(&values(n, seed, false), shape, DType::F64).unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{got:?}\nvs {want:?}"
        );
    }
}

/// The LSTM step in elementary ops (PyTorch's `LSTMCell` formula).
fn lstm_ref<'g>(z: Tensor<'g>, c: Tensor<'g>) -> Result<(Tensor<'g>, Tensor<'g>)> {
    let a = z.chunk(4, -1)?;
    let (i, f, g, o) = (
        a[0].sigmoid()?,
        a[1].sigmoid()?,
        a[2].tanh()?,
        a[3].sigmoid()?,
    );
    let c2 = f.mul(c)?.add(i.mul(g)?)?;
    Ok((o.mul(c2.tanh()?)?, c2))
}

/// The GRU step in elementary ops (PyTorch's `GRUCell` formula).
fn gru_ref<'g>(gi: Tensor<'g>, gh: Tensor<'g>, h: Tensor<'g>) -> Result<Tensor<'g>> {
    let (a, b) = (gi.chunk(3, -1)?, gh.chunk(3, -1)?);
    let r = a[0].add(b[0])?.sigmoid()?;
    let z = a[1].add(b[1])?.sigmoid()?;
    let n = a[2].add(r.mul(b[2])?)?.tanh()?;
    z.neg()?.shift(1.0)?.mul(n)?.add(z.mul(h)?)
}

#[test]
fn lstm_cell_matches_its_formula_in_values_and_gradients() {
    let g = Graph::new();
    let (b, h) = (3, 4);
    let zv = values(b * 4 * h, 1, false)
        .iter()
        .map(|v| 3.0 * v)
        .collect::<Vec<_>>();
    let cv = values(b * h, 2, false);
    let w = g
        .from_f64(&values(2 * b * h, 3, false), &[2 * b, h], DType::F64)
        .unwrap();
    let run = |fused: bool| {
        let z = g.leaf(&zv, &[b, 4 * h], DType::F64).unwrap();
        let c = g.leaf(&cv, &[b, h], DType::F64).unwrap();
        let (h2, c2) = if fused {
            z.lstm_cell(c).unwrap()
        } else {
            lstm_ref(z, c).unwrap()
        };
        let y = g.concat(&[h2, c2], 0).unwrap();
        y.mul(w).unwrap().sum().unwrap().backward().unwrap();
        let gz = z.grad().unwrap().unwrap().to_vec_f64().unwrap();
        let gc = c.grad().unwrap().unwrap().to_vec_f64().unwrap();
        (y.to_vec_f64().unwrap(), gz, gc)
    };
    let (a, b2) = (run(true), run(false));
    close(&a.0, &b2.0, 1e-14);
    close(&a.1, &b2.1, 1e-14);
    close(&a.2, &b2.2, 1e-14);
}

#[test]
fn gru_cell_matches_its_formula_in_values_and_gradients() {
    let g = Graph::new();
    let (b, h) = (2, 3);
    let iv = values(b * 3 * h, 4, false);
    let ghv = values(b * 3 * h, 5, false);
    let hv = values(b * h, 6, false);
    let w = g
        .from_f64(&values(b * h, 7, false), &[b, h], DType::F64)
        .unwrap();
    let run = |fused: bool| {
        let gi = g.leaf(&iv, &[b, 3 * h], DType::F64).unwrap();
        let gh = g.leaf(&ghv, &[b, 3 * h], DType::F64).unwrap();
        let hp = g.leaf(&hv, &[b, h], DType::F64).unwrap();
        let y = if fused {
            gi.gru_cell(gh, hp).unwrap()
        } else {
            gru_ref(gi, gh, hp).unwrap()
        };
        y.mul(w).unwrap().sum().unwrap().backward().unwrap();
        let grads: Vec<Vec<f64>> = [gi, gh, hp]
            .iter()
            .map(|t| t.grad().unwrap().unwrap().to_vec_f64().unwrap())
            .collect();
        (y.to_vec_f64().unwrap(), grads)
    };
    let (a, b2) = (run(true), run(false));
    close(&a.0, &b2.0, 1e-14);
    for (p, q) in a.1.iter().zip(&b2.1) {
        close(p, q, 1e-14);
    }
}

#[test]
fn cells_pass_finite_differences_to_second_order() {
    let opts = GradcheckOptions::default();
    let lstm = check_fn(|g, x| {
        let (h, c) = x[0].lstm_cell(x[1])?;
        g.concat(&[h, c.sin()?], 1)
    });
    let xs = [host(2 * 8, &[2, 8], 8), host(2 * 2, &[2, 2], 9)];
    let r = gradcheck(lstm, &xs, opts).unwrap();
    assert!(r.passed, "lstm_cell: {r}");
    let r = gradgradcheck(lstm, &xs, opts).unwrap();
    assert!(r.passed, "lstm_cell, second order: {r}");
    let gru = check_fn(|_, x| x[0].gru_cell(x[1], x[2]));
    let xs = [
        host(6, &[1, 6], 10),
        host(6, &[1, 6], 11),
        host(2, &[1, 2], 12),
    ];
    let r = gradcheck(gru, &xs, opts).unwrap();
    assert!(r.passed, "gru_cell: {r}");
    let r = gradgradcheck(gru, &xs, opts).unwrap();
    assert!(r.passed, "gru_cell, second order: {r}");
}

/// The sequence as a loop of fused cells over one row's own length: `(outputs, h_n, c_n)`.
fn loop_of_cells<'g>(
    gi: Tensor<'g>,
    w: Tensor<'g>,
    h0: Tensor<'g>,
    c0: Tensor<'g>,
    len: usize,
    reverse: bool,
) -> (Vec<Tensor<'g>>, Tensor<'g>, Tensor<'g>) {
    let (mut h, mut c) = (h0, c0);
    let mut out = vec![None; len];
    for s in 0..len {
        let p = if reverse { len - 1 - s } else { s };
        let z = gi.slice(0, p, p + 1).unwrap().reshape(&[1, -1]).unwrap();
        let z = z.addmm_t(h, w, false, true).unwrap();
        (h, c) = z.lstm_cell(c).unwrap();
        out[p] = Some(h);
    }
    (out.into_iter().map(Option::unwrap).collect(), h, c)
}

#[test]
fn lstm_sequence_equals_each_row_run_alone_to_its_length() {
    each_row_alone(3, 4, &[None, Some(&[5, 3, 0]), Some(&[4, 4, 2])], 1);
}

#[test]
fn lstm_sequence_divided_between_threads_gives_the_same_bits() {
    // A small batch is divided between threads by hidden units (blocks of at least 32, each
    // thread its own for the whole sequence): 100 units over 1, 2 and 3 threads. A batch with
    // 12 rows or more per thread is divided by rows: 27 rows over 2 (and by units over 3). Both give the bits of
    // one thread, for rows of their own lengths, forwards and reversed, in f64 and f32; and the
    // composed recurrence's values and gradients.
    let small: &[usize] = &[5, 5, 4, 4, 4, 3, 2, 2, 1, 0, 0];
    let large: &[usize] = &[
        5, 5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 2, 2, 2, 1, 1, 1, 0, 0,
    ];
    each_row_alone(11, 100, &[Some(small)], 3);
    each_row_alone(27, 12, &[Some(large)], 2);
    for (long, h) in [(small, 100), (large, 40)] {
        lstm_sequence_threads_case(long, h);
    }
}

fn lstm_sequence_threads_case(long: &[usize], h: usize) {
    let (t, b) = (5, long.len());
    let run = |threads: usize, dtype: DType, unfused: bool, reverse: bool| {
        let g = Graph::with_threads(threads);
        let wy = g
            .from_f64(&values((t + 2) * b * h, 30, false), &[t + 2, b, h], dtype)
            .unwrap();
        let x = [
            g.leaf(&values(t * b * 4 * h, 31, false), &[t, b, 4 * h], dtype)
                .unwrap(),
            g.leaf(
                &values(4 * h * h, 32, false)
                    .iter()
                    .map(|v| 0.2 * v)
                    .collect::<Vec<_>>(),
                &[4 * h, h],
                dtype,
            )
            .unwrap(),
            g.leaf(&values(b * h, 33, false), &[b, h], dtype).unwrap(),
            g.leaf(&values(b * h, 34, false), &[b, h], dtype).unwrap(),
        ];
        let opts = LstmSequenceOptions {
            lengths: Some(long),
            reverse,
            unfused,
        };
        let (y, hn, cn) = x[0].lstm_sequence(x[1], x[2], x[3], opts).unwrap();
        let all = g
            .concat(
                &[
                    y,
                    hn.reshape(&[1, b as isize, h as isize]).unwrap(),
                    cn.reshape(&[1, b as isize, h as isize]).unwrap(),
                ],
                0,
            )
            .unwrap();
        all.mul(wy).unwrap().sum().unwrap().backward().unwrap();
        let mut out = vec![all.to_vec_f64().unwrap()];
        out.extend(x.map(|v| v.grad().unwrap().unwrap().to_vec_f64().unwrap()));
        out
    };
    let bits = |v: &[Vec<f64>]| -> Vec<Vec<u64>> {
        v.iter()
            .map(|x| x.iter().map(|f| f.to_bits()).collect())
            .collect()
    };
    for reverse in [false, true] {
        for dtype in [DType::F64, DType::F32] {
            let one = run(1, dtype, false, reverse);
            for threads in [2, 3] {
                assert_eq!(
                    bits(&run(threads, dtype, false, reverse)),
                    bits(&one),
                    "{threads} threads, {dtype}, reverse {reverse}"
                );
            }
            if dtype == DType::F64 {
                for (p, q) in one.iter().zip(&run(2, dtype, true, reverse)) {
                    close(p, q, 1e-12);
                }
            }
        }
    }
}

fn each_row_alone(b: usize, h: usize, cases: &[Option<&[usize]>], threads: usize) {
    let t = 5;
    let giv = values(t * b * 4 * h, 13, false);
    let wv: Vec<f64> = values(4 * h * h, 14, false)
        .iter()
        .map(|v| 0.5 * v)
        .collect();
    let h0v = values(b * h, 15, false);
    let c0v = values(b * h, 16, false);
    for (lengths, reverse, unfused) in cases
        .iter()
        .copied()
        .flat_map(|l| [(l, false), (l, true)])
        .flat_map(|(l, r)| [(l, r, false), (l, r, true)])
    {
        {
            let g = Graph::with_threads(threads);
            let gi = g.leaf(&giv, &[t, b, 4 * h], DType::F64).unwrap();
            let w = g.leaf(&wv, &[4 * h, h], DType::F64).unwrap();
            let h0 = g.leaf(&h0v, &[b, h], DType::F64).unwrap();
            let c0 = g.leaf(&c0v, &[b, h], DType::F64).unwrap();
            let opts = LstmSequenceOptions {
                lengths,
                reverse,
                unfused,
            };
            let (y, hn, cn) = gi.lstm_sequence(w, h0, c0, opts).unwrap();
            let (yv, hnv, cnv) = (
                y.to_vec_f64().unwrap(),
                hn.to_vec_f64().unwrap(),
                cn.to_vec_f64().unwrap(),
            );
            for r in 0..b {
                let len = lengths.map_or(t, |l| l[r]);
                let gir = gi.slice(1, r, r + 1).unwrap();
                let gir = gir.reshape(&[t as isize, (4 * h) as isize]).unwrap();
                let (h0r, c0r) = (
                    h0.slice(0, r, r + 1).unwrap(),
                    c0.slice(0, r, r + 1).unwrap(),
                );
                let (outs, hr, cr) = loop_of_cells(gir, w, h0r, c0r, len, reverse);
                for p in 0..t {
                    let got = &yv[(p * b + r) * h..(p * b + r + 1) * h];
                    match outs.get(p) {
                        Some(o) => close(got, &o.to_vec_f64().unwrap(), 1e-14),
                        None => assert!(got.iter().all(|&v| v == 0.0), "zero past the length"),
                    }
                }
                close(&hnv[r * h..(r + 1) * h], &hr.to_vec_f64().unwrap(), 1e-14);
                close(&cnv[r * h..(r + 1) * h], &cr.to_vec_f64().unwrap(), 1e-14);
            }
        }
    }
}

#[test]
fn lstm_sequence_passes_finite_differences() {
    let (t, b, h) = (4, 3, 2);
    let xs = [
        host(t * b * 4 * h, &[t, b, 4 * h], 17),
        host(4 * h * h, &[4 * h, h], 18),
        host(b * h, &[b, h], 19),
        host(b * h, &[b, h], 20),
    ];
    for lengths in [None, Some(&[4usize, 2, 1][..])] {
        for reverse in [false, true] {
            let f = check_fn(move |g, x| {
                let opts = LstmSequenceOptions {
                    lengths,
                    reverse,
                    unfused: false,
                };
                let (y, hn, cn) = x[0].lstm_sequence(x[1], x[2], x[3], opts)?;
                g.concat(
                    &[
                        y.reshape(&[-1])?,
                        hn.reshape(&[-1])?,
                        cn.sin()?.reshape(&[-1])?,
                    ],
                    0,
                )
            });
            let r = gradcheck(f, &xs, GradcheckOptions::default()).unwrap();
            assert!(r.passed, "lengths {lengths:?}, reverse {reverse}: {r}");
        }
    }
    // The composed form, to second order.
    let f = check_fn(|g, x| {
        let opts = LstmSequenceOptions {
            lengths: Some(&[4, 2, 1]),
            reverse: true,
            unfused: true,
        };
        let (y, hn, cn) = x[0].lstm_sequence(x[1], x[2], x[3], opts)?;
        g.concat(
            &[y.reshape(&[-1])?, hn.reshape(&[-1])?, cn.reshape(&[-1])?],
            0,
        )
    });
    let r = gradgradcheck(f, &xs, GradcheckOptions::default()).unwrap();
    assert!(r.passed, "unfused, second order: {r}");
}

#[test]
fn lstm_sequence_in_f32_agrees_with_f64() {
    let (t, b, h) = (6, 2, 8);
    let run = |dtype| {
        let g = Graph::new();
        let gi = g
            .leaf(&values(t * b * 4 * h, 21, false), &[t, b, 4 * h], dtype)
            .unwrap();
        let w = g
            .leaf(&values(4 * h * h, 22, false), &[4 * h, h], dtype)
            .unwrap();
        let h0 = g.zeros(&[b, h], dtype).unwrap();
        let c0 = g.zeros(&[b, h], dtype).unwrap();
        let (y, _, _) = gi.lstm_sequence(w, h0, c0, Default::default()).unwrap();
        y.square().unwrap().sum().unwrap().backward().unwrap();
        let gw = w.grad().unwrap().unwrap().to_vec_f64().unwrap();
        (y.to_vec_f64().unwrap(), gw)
    };
    let (a, b2) = (run(DType::F32), run(DType::F64));
    close(&a.0, &b2.0, 1e-5);
    close(&a.1, &b2.1, 1e-4);
}

#[test]
fn bad_arguments_are_errors_naming_the_op() {
    let g = Graph::new();
    let gi = g.leaf(&[0.0; 3 * 2 * 8], &[3, 2, 8], DType::F64).unwrap();
    let w = g.leaf(&[0.0; 8 * 2], &[8, 2], DType::F64).unwrap();
    let h0 = g.zeros(&[2, 2], DType::F64).unwrap();
    let bad_w = g.zeros(&[8, 3], DType::F64).unwrap();
    assert!(matches!(
        gi.lstm_sequence(bad_w, h0, h0, Default::default()),
        Err(GraphError::ShapeMismatch {
            op: "lstm_sequence",
            ..
        })
    ));
    for lengths in [&[1usize, 2][..], &[4, 1], &[3]] {
        let opts = LstmSequenceOptions {
            lengths: Some(lengths),
            ..Default::default()
        };
        let e = gi.lstm_sequence(w, h0, h0, opts).unwrap_err();
        assert!(e.to_string().starts_with("lstm_sequence:"), "{e}");
    }
    let z = g.zeros(&[2, 7], DType::F64).unwrap();
    assert!(matches!(
        z.lstm_cell(h0),
        Err(GraphError::ShapeMismatch {
            op: "lstm_cell",
            ..
        })
    ));
    let gh = g.zeros(&[2, 6], DType::F32).unwrap();
    assert!(matches!(
        g.zeros(&[2, 6], DType::F64).unwrap().gru_cell(gh, h0),
        Err(GraphError::DTypeMismatch { op: "gru_cell", .. })
    ));
    // Recording backward through the fused sequence is refused by name; the cells allow it.
    let (y, _, _) = gi.lstm_sequence(w, h0, h0, Default::default()).unwrap();
    let record = BackwardOptions {
        create_graph: true,
        ..Default::default()
    };
    let e = arenagrad_graph::grad(y.sum().unwrap(), &[w], record).unwrap_err();
    assert!(e.to_string().contains("lstm_sequence"), "{e}");
}
