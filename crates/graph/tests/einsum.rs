//! einsum against plain loops over the subscripts (and a value PyTorch 2.15 printed), its
//! gradient against finite differences, and its refusals.

use arenagrad_graph::check::{check_fn, gradcheck, gradgradcheck, GradcheckOptions};
use arenagrad_graph::{DType, Graph, GraphError, HostTensor};

fn vals(n: usize, scale: f64, shift: f64) -> Vec<f64> {
    (0..n).map(|k| k as f64 * scale + shift).collect()
}

#[test]
fn batched_products_transposes_sums_outer_and_dot_match_loops() {
    let g = Graph::new();
    let (a, b) = (vals(24, 0.1, -1.0), vals(40, 0.05, 0.3));
    let ta = g.from_f64(&a, &[2, 3, 4], DType::F64).unwrap();
    let tb = g.from_f64(&b, &[2, 4, 5], DType::F64).unwrap();
    // "bij,bjk->bik"; PyTorch's first entries: -2.17, -2.34, -2.51, -2.68, -2.85, -1.09.
    let y = g.einsum("bij,bjk->bik", &[ta, tb]).unwrap();
    assert_eq!(y.shape().to_vec(), [2, 3, 5]);
    let got = y.to_vec::<f64>().unwrap();
    for bb in 0..2 {
        for i in 0..3 {
            for k in 0..5 {
                let want: f64 = (0..4)
                    .map(|j| a[bb * 12 + i * 4 + j] * b[bb * 20 + j * 5 + k])
                    .sum();
                assert!((got[bb * 15 + i * 5 + k] - want).abs() < 1e-12);
            }
        }
    }
    for (g0, w) in got.iter().zip([-2.17, -2.34, -2.51, -2.68, -2.85, -1.09]) {
        assert!((g0 - w).abs() < 1e-12);
    }
    // "bkj,bij->bki" with the output's axes in another order than the product's.
    let c = vals(16, 0.25, -2.0);
    let tc = g.from_f64(&c, &[2, 2, 4], DType::F64).unwrap();
    let y = g.einsum("bkj,bij->bki", &[tc, ta]).unwrap();
    assert_eq!(y.shape().to_vec(), [2, 2, 3]);
    let got = y.to_vec::<f64>().unwrap();
    for bb in 0..2 {
        for k in 0..2 {
            for i in 0..3 {
                let want: f64 = (0..4)
                    .map(|j| c[bb * 8 + k * 4 + j] * a[bb * 12 + i * 4 + j])
                    .sum();
                assert!((got[bb * 6 + k * 3 + i] - want).abs() < 1e-12);
            }
        }
    }
    // One operand: a sum over two axes, and a transpose.
    let s = g.einsum("bij->j", &[ta]).unwrap().to_vec::<f64>().unwrap();
    assert_eq!(s.len(), 4);
    for j in 0..4 {
        let want: f64 = (0..2)
            .flat_map(|bb| (0..3).map(move |i| (bb, i)))
            .map(|(bb, i)| a[bb * 12 + i * 4 + j])
            .sum();
        assert!((s[j] - want).abs() < 1e-12);
    }
    let t = g.einsum("bij->bji", &[ta]).unwrap();
    assert_eq!(
        t.to_vec::<f64>().unwrap(),
        ta.permute(&[0, 2, 1]).unwrap().to_vec::<f64>().unwrap()
    );
    // Implicit output: outer product "i,j" and a dot "i,i"; a letter of one operand alone
    // summed first ("ij,j->").
    let x = g.from_f64(&[1.0, 2.0, 3.0], &[3], DType::F64).unwrap();
    let z = g.from_f64(&[4.0, 5.0], &[2], DType::F64).unwrap();
    assert_eq!(
        g.einsum("i,j", &[x, z]).unwrap().to_vec::<f64>().unwrap(),
        [4.0, 5.0, 8.0, 10.0, 12.0, 15.0]
    );
    assert_eq!(g.einsum("i,i", &[x, x]).unwrap().item().unwrap(), 14.0);
    let m = g
        .from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F64)
        .unwrap();
    assert_eq!(
        g.einsum("ij,j->", &[m, x]).unwrap().item().unwrap(),
        14.0 + 32.0
    );
    assert_eq!(
        g.einsum("ij,k->i", &[m, z])
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
        [6.0 * 9.0, 15.0 * 9.0]
    );
}

#[test]
fn einsum_gradients_pass_gradcheck() {
    let inputs = [
        HostTensor::from_f64(&vals(24, 0.1, -1.0), &[2, 3, 4], DType::F64).unwrap(),
        HostTensor::from_f64(&vals(16, 0.2, -1.5), &[2, 2, 4], DType::F64).unwrap(),
    ];
    let f = check_fn(|g, x| {
        let y = g.einsum("bij,bkj->bik", &[x[0], x[1]])?;
        y.mul(y)?.sum()
    });
    let opts = GradcheckOptions::default();
    assert!(gradcheck(f, &inputs, opts).unwrap().passed);
    assert!(gradgradcheck(f, &inputs, opts).unwrap().passed);
}

/// Broadcasting, in values (against PyTorch 2.15's, printed) and in gradients: an ellipsis
/// against a batch of one, a contracted letter of extent 1 on one side, and a kept one.
#[test]
fn ellipses_and_extents_of_one_broadcast_as_pytorch_does() {
    let g = Graph::new();
    let a = g
        .from_f64(&vals(6, 0.5, -1.0), &[1, 2, 3], DType::F64)
        .unwrap();
    let b = g
        .from_f64(&vals(24, 0.25, -2.0), &[2, 3, 4], DType::F64)
        .unwrap();
    let y = g.einsum("...ij,...jk->...ik", &[a, b]).unwrap();
    assert_eq!(y.shape().to_vec(), [2, 2, 4]);
    // torch.einsum("...ij,...jk->...ik", a, b) for the same values.
    let want = [
        2.5, 2.125, 1.75, 1.375, -2.0, -1.25, -0.5, 0.25, -2.0, -2.375, -2.75, -3.125, 7.0, 7.75,
        8.5, 9.25,
    ];
    assert_eq!(y.to_vec::<f64>().unwrap(), want);
    // A contracted letter of extent 1 on the left: Σ_j a_i0 · b_jk = a_i0 · Σ_j b_jk.
    let c = g.from_f64(&[2.0, -1.0], &[2, 1], DType::F64).unwrap();
    let m = g
        .from_f64(&vals(12, 0.5, -1.0), &[3, 4], DType::F64)
        .unwrap();
    let got = g
        .einsum("ij,jk->ik", &[c, m])
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let col: Vec<f64> = (0..4)
        .map(|k| (0..3).map(|j| vals(12, 0.5, -1.0)[j * 4 + k]).sum())
        .collect();
    let expect: Vec<f64> = [2.0, -1.0]
        .iter()
        .flat_map(|&x| col.iter().map(move |&s| x * s))
        .collect();
    assert_eq!(got, expect);
    let inputs = [
        HostTensor::from_f64(&vals(6, 0.2, -0.5), &[1, 2, 3], DType::F64).unwrap(),
        HostTensor::from_f64(&vals(12, 0.15, -0.8), &[2, 3, 2], DType::F64).unwrap(),
        HostTensor::from_f64(&[0.5, -1.5], &[2, 1], DType::F64).unwrap(),
    ];
    let f = check_fn(|g, x| {
        let y = g.einsum("...ij,...jk->...ik", &[x[0], x[1]])?;
        let z = g.einsum("bik,kl->bil", &[y, x[2]])?;
        let s = g.einsum("i...,i...->...", &[z, z])?;
        s.sum()
    });
    let opts = GradcheckOptions::default();
    assert!(gradcheck(f, &inputs, opts).unwrap().passed);
    assert!(gradgradcheck(f, &inputs, opts).unwrap().passed);
}

/// Diagonals and three operands, in values (PyTorch 2.15's, printed) and in gradients: a
/// trace, a diagonal, and a bilinear form `bn,anm,bm->ba` (PyTorch's `F.bilinear` without its
/// bias), contracted left to right.
#[test]
fn diagonals_and_three_operands_match_pytorch() {
    let g = Graph::new();
    let x = g
        .from_f64(&vals(9, 0.5, -1.0), &[3, 3], DType::F64)
        .unwrap();
    assert_eq!(g.einsum("ii", &[x]).unwrap().item().unwrap(), 3.0);
    assert_eq!(
        g.einsum("ii->i", &[x]).unwrap().to_vec::<f64>().unwrap(),
        [-1.0, 1.0, 3.0]
    );
    let a = g
        .from_f64(&vals(6, 0.5, -1.0), &[2, 3], DType::F64)
        .unwrap();
    let w = g
        .from_f64(&vals(24, 0.25, -2.0), &[4, 3, 2], DType::F64)
        .unwrap();
    let b = g
        .from_f64(&vals(4, 0.75, -1.5), &[2, 2], DType::F64)
        .unwrap();
    let y = g.einsum("bn,anm,bm->ba", &[a, w, b]).unwrap();
    assert_eq!(y.shape().to_vec(), [2, 4]);
    let want = [
        -5.90625, -0.84375, 4.21875, 9.28125, -2.4375, 0.9375, 4.3125, 7.6875,
    ];
    for (got, want) in y.to_vec::<f64>().unwrap().iter().zip(want) {
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }
    let inputs = [
        HostTensor::from_f64(&vals(6, 0.2, -0.5), &[2, 3], DType::F64).unwrap(),
        HostTensor::from_f64(&vals(24, 0.05, -0.6), &[4, 3, 2], DType::F64).unwrap(),
        HostTensor::from_f64(&vals(4, 0.3, -0.4), &[2, 2], DType::F64).unwrap(),
        HostTensor::from_f64(&vals(18, 0.1, -0.9), &[2, 3, 3], DType::F64).unwrap(),
    ];
    let f = check_fn(|g, x| {
        let y = g.einsum("bn,anm,bm->ba", &[x[0], x[1], x[2]])?;
        let d = g.einsum("bii,bi->b", &[x[3], x[0]])?;
        y.sum()?.add(d.mul(d)?.sum()?)
    });
    let opts = GradcheckOptions::default();
    assert!(gradcheck(f, &inputs, opts).unwrap().passed);
    assert!(gradgradcheck(f, &inputs, opts).unwrap().passed);
}

#[test]
fn unsupported_and_mismatched_subscripts_are_typed_errors() {
    let g = Graph::new();
    let m = g.from_f64(&[1.0; 6], &[2, 3], DType::F64).unwrap();
    let v = g.from_f64(&[1.0; 2], &[2], DType::F64).unwrap();
    let bad = |r: arenagrad_graph::Result<arenagrad_graph::Tensor<'_>>| {
        matches!(
            r,
            Err(GraphError::BadArgument { op: "einsum", .. })
                | Err(GraphError::ShapeMismatch { op: "einsum", .. })
        )
    };
    assert!(bad(g.einsum("ii->i", &[m])), "a diagonal of a 2 × 3 matrix");
    assert!(
        bad(g.einsum("ij->ii", &[m])),
        "a letter repeated in the output"
    );
    assert!(bad(g.einsum("ij", &[])), "no operand");
    assert!(bad(g.einsum("..j->j", &[m])), "a dot outside an ellipsis");
    assert!(
        bad(g.einsum("...i...->i", &[m])),
        "two ellipses in one operand"
    );
    assert!(
        bad(g.einsum("ijk...->i", &[m])),
        "more letters than axes beside an ellipsis"
    );
    assert!(bad(g.einsum("ij,j->i", &[m, v])), "j is 3 and 2");
    assert!(bad(g.einsum("ijk->i", &[m])), "three letters for two axes");
    assert!(bad(g.einsum("ij->ik", &[m])), "k names no axis");
    assert!(bad(g.einsum("ij,j", &[m])), "two operands named, one given");
}

/// `einsum_shape` (what a program's shape rule asks, without a graph) gives the shape `einsum`
/// makes, and refuses, with the same error, what `einsum` refuses.
#[test]
fn einsum_shape_is_the_shape_einsum_makes_and_refuses_alike() {
    let g = Graph::new();
    let t = |s: &[usize]| {
        let n = s.iter().product();
        g.from_f64(&vals(n, 0.5, -1.0), s, DType::F64).unwrap()
    };
    let cases: &[(&str, &[&[usize]])] = &[
        ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
        ("bij,bjk->kbi", &[&[2, 3, 4], &[2, 4, 5]]),
        ("i,j", &[&[3], &[2]]),
        ("i,i->", &[&[3], &[3]]),
        ("ij,k->i", &[&[2, 3], &[4]]),
        ("ij,jk", &[&[2, 0], &[0, 4]]),
        ("bij->j", &[&[2, 3, 4]]),
        ("ij->ji", &[&[2, 3]]),
        // Ellipses (broadcast right-aligned, summed where the output leaves them out) and
        // extents of 1 that broadcast.
        ("...ij,...jk->...ik", &[&[2, 3], &[5, 3, 4]]),
        ("...ij,...jk", &[&[4, 1, 2, 3], &[6, 3, 4]]),
        ("...ij->ij", &[&[5, 2, 3]]),
        ("i...->...", &[&[5, 2, 3]]),
        ("ij...,jk...->ik...", &[&[2, 3, 7], &[3, 4, 1]]),
        ("...,...->...", &[&[5, 1], &[3]]),
        ("ij,jk->ik", &[&[2, 1], &[3, 4]]),
        ("bij,bjk->bik", &[&[1, 2, 3], &[5, 3, 4]]),
        ("i,i->i", &[&[3], &[1]]),
        // Diagonals (a trace, a diagonal beside an ellipsis, one of three axes) and three
        // operands.
        ("ii", &[&[3, 3]]),
        ("ii->i", &[&[2, 2]]),
        ("...ii->...i", &[&[4, 2, 2]]),
        ("iii->i", &[&[2, 2, 2]]),
        ("iij,j->i", &[&[2, 2, 3], &[3]]),
        ("ii,i->i", &[&[1, 1], &[3]]),
        ("i,j,k", &[&[2], &[2], &[2]]),
        ("bn,anm,bm->ba", &[&[2, 3], &[4, 3, 5], &[2, 5]]),
        ("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 5]]),
        // Refused: extents, ranks, a diagonal of unequal extents, operand counts, stray letters
        // and dots.
        ("ij,j->i", &[&[2, 3], &[2]]),
        ("ijk,jk->i", &[&[2, 3], &[3, 4]]),
        ("ii->i", &[&[2, 3]]),
        ("..j->j", &[&[2, 3]]),
        ("...ij,...jk->...ik", &[&[2, 2, 3], &[5, 3, 4]]),
        ("ijk...->i", &[&[2, 3]]),
        ("ij->...i", &[&[2, 3]]),
        ("ij,j", &[&[2, 3]]),
        ("ij->ik", &[&[2, 3]]),
        ("ij->ii", &[&[2, 3]]),
        ("i,j,k", &[&[2], &[2]]),
        ("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[5, 5]]),
        ("", &[&[]]),
    ];
    for &(spec, shapes) in cases {
        let xs: Vec<_> = shapes.iter().map(|s| t(s)).collect();
        let made = g.einsum(spec, &xs).map(|y| y.shape().to_vec());
        let said = arenagrad_graph::einsum_shape(spec, shapes);
        match (&made, &said) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{spec}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{spec}"),
            _ => panic!("{spec} {shapes:?}: einsum {made:?}, einsum_shape {said:?}"),
        }
    }
}
