//! Numerical conventions at the edges — NaN, ±0, ±inf, ties, masked derivatives — against
//! PyTorch's answers (2.15, f64, exported by hand from `torch.autograd`). Every gradient is
//! checked twice: through the fused backward kernels, and through the `create_graph` rules
//! written in tensor ops, which must agree. `docs/testing.md` lists these rules in one table.

use std::collections::BTreeSet;

use arenagrad_graph::{
    grad, BackwardOptions, BinaryOp, DType, Graph, GraphError, Result, Tensor, UnaryOp,
};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// Equal as PyTorch prints them: NaN matches NaN, infinities match exactly, zeros match
/// whatever their sign, finite values to 1e-12 relative.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan())
        || a == b
        || (a.is_finite() && b.is_finite() && (a - b).abs() <= 1e-12 * a.abs().max(b.abs()))
}

fn assert_all_same(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let ok = got.iter().zip(want).all(|(&a, &b)| same(a, b));
    assert!(ok, "{what}:\n   got {got:?}\n  want {want:?}");
}

type Un = for<'g> fn(Tensor<'g>) -> Result<Tensor<'g>>;
type Bin = for<'g> fn(Tensor<'g>, Tensor<'g>) -> Result<Tensor<'g>>;
/// One row of the binary table: a value per input pair.
type Row = [f64; 10];

/// `(f(x), d Σf / dx)`, by a plain backward (fused kernels) and by `grad` with `create_graph`.
fn unary_both(f: Un, xs: &[f64]) -> [(Vec<f64>, Vec<f64>); 2] {
    let run = |create: bool| {
        let g = Graph::new();
        let x = g.leaf(xs, &[xs.len()], DType::F64).unwrap();
        let y = f(x).unwrap();
        let vals = y.to_vec::<f64>().unwrap();
        let l = y.sum().unwrap();
        let gr = if create {
            let opts = BackwardOptions {
                create_graph: true,
                ..Default::default()
            };
            grad(l, &[x], opts).unwrap()[0].unwrap()
        } else {
            l.backward().unwrap();
            x.grad().unwrap().unwrap()
        };
        (vals, gr.to_vec::<f64>().unwrap())
    };
    [run(false), run(true)]
}

/// `f`'s values and gradients at `xs` against the table's, by both backward paths. The inputs
/// once take the tiny kernels; eight times over, the wide (vectorised) ones.
fn check_unary(name: &str, f: Un, xs: &[f64], want_y: &[f64], want_g: &[f64]) {
    for reps in [1, 8] {
        let xs = xs.repeat(reps);
        let [fused, graph] = unary_both(f, &xs);
        let (want_y, want_g) = (want_y.repeat(reps), want_g.repeat(reps));
        assert_all_same(&format!("{name} value ×{reps}"), &fused.0, &want_y);
        assert_all_same(
            &format!("{name} gradient (fused) ×{reps}"),
            &fused.1,
            &want_g,
        );
        assert_all_same(
            &format!("{name} gradient (graph) ×{reps}"),
            &graph.1,
            &want_g,
        );
    }
}

/// The inputs of the unary table: NaN, 0, 1, −1, +inf, −inf.
const X: [f64; 6] = [NAN, 0.0, 1.0, -1.0, INF, -INF];

/// One op of the unary tables: its name (a row's name, with its constant in parentheses where
/// it has one), the op, then PyTorch's values and gradients at the table's inputs.
type UnaryCase<const N: usize> = (&'static str, Un, [f64; N], [f64; N]);

/// PyTorch's values and gradients at [`X`].
#[allow(clippy::approx_constant)] // the values as PyTorch printed them
fn unary_table() -> Vec<UnaryCase<6>> {
    let e = std::f64::consts::E;
    let t1 = 0.761_594_155_955_764_9; // tanh 1
    let dt1 = 0.419_974_341_614_026_1; // 1 − tanh² 1
    let s1 = 0.731_058_578_630_004_9; // σ(1)
    let ds1 = 0.196_611_933_241_481_85; // σ(1)(1 − σ(1))
    let (sin1, cos1) = (1f64.sin(), 1f64.cos());
    #[rustfmt::skip]
    return vec![
        ("relu", |x| x.relu(), [NAN, 0.0, 1.0, 0.0, INF, 0.0], [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
        ("abs", |x| x.abs(), [NAN, 0.0, 1.0, 1.0, INF, INF], [0.0, 0.0, 1.0, -1.0, 1.0, -1.0]),
        ("neg", |x| x.neg(), [NAN, 0.0, -1.0, 1.0, -INF, INF], [-1.0; 6]),
        ("sqrt", |x| x.sqrt(), [NAN, 0.0, 1.0, NAN, INF, NAN], [NAN, INF, 0.5, NAN, 0.0, NAN]),
        ("log", |x| x.log(), [NAN, -INF, 0.0, NAN, INF, NAN], [NAN, INF, 1.0, -1.0, 0.0, 0.0]),
        ("exp", |x| x.exp(), [NAN, 1.0, e, 1.0 / e, INF, 0.0], [NAN, 1.0, e, 1.0 / e, INF, 0.0]),
        ("tanh", |x| x.tanh(), [NAN, 0.0, t1, -t1, 1.0, -1.0], [NAN, 1.0, dt1, dt1, 0.0, 0.0]),
        ("sigmoid", |x| x.sigmoid(), [NAN, 0.5, s1, 1.0 - s1, 1.0, 0.0], [NAN, 0.25, ds1, ds1, 0.0, 0.0]),
        ("sin", |x| x.sin(), [NAN, 0.0, sin1, -sin1, NAN, NAN], [NAN, 1.0, cos1, cos1, NAN, NAN]),
        ("powf(0)", |x| x.powf(0.0), [1.0; 6], [0.0; 6]),
        ("powf(2)", |x| x.powf(2.0), [NAN, 0.0, 1.0, 1.0, INF, INF], [NAN, 0.0, 2.0, -2.0, INF, -INF]),
        ("powf(3)", |x| x.powf(3.0), [NAN, 0.0, 1.0, -1.0, INF, -INF], [NAN, 0.0, 3.0, 3.0, INF, INF]),
        ("powf(0.5)", |x| x.powf(0.5), [NAN, 0.0, 1.0, NAN, INF, NAN], [NAN, INF, 0.5, NAN, 0.0, NAN]),
        ("powf(-1)", |x| x.powf(-1.0), [NAN, INF, 1.0, -1.0, 0.0, 0.0], [NAN, -INF, -1.0, -1.0, 0.0, 0.0]),
        ("cos", |x| x.cos(), [NAN, 1.0, cos1, cos1, NAN, NAN], [NAN, 0.0, -sin1, sin1, NAN, NAN]),
        ("gelu", |x| x.gelu(),
            [NAN, 0.0, 0.841344746068543, -0.15865525393145702, INF, NAN],
            [NAN, 0.5, 1.0833154705876864, -0.08331547058768635, NAN, NAN]),
        ("gelu_tanh", |x| x.gelu_tanh(),
            [NAN, 0.0, 0.8411919906082768, -0.15880800939172324, INF, NAN],
            [NAN, 0.5, 1.0829640838457826, -0.08296408384578252, NAN, NAN]),
        ("scale(-1.7)", |x| x.scale(-1.7), [NAN, 0.0, -1.7, 1.7, -INF, INF], [-1.7; 6]),
        ("shift(0.3)", |x| x.shift(0.3), [NAN, 0.3, 1.3, -0.7, INF, -INF], [1.0; 6]),
    ];
}

#[test]
fn unary_ops_at_the_edges_match_pytorch() {
    for (name, f, want_y, want_g) in unary_table() {
        check_unary(name, f, &X, &want_y, &want_g);
    }
}

/// The inputs of the second unary table: [`X`], then around softplus's threshold of 20.
const XS: [f64; 9] = [NAN, 0.0, 1.0, -1.0, INF, -INF, 20.0, 20.5, -30.0];

/// silu, softplus and erf: PyTorch 2.15's values and gradients at [`XS`] (float64, exported with
/// `torch.nn.functional.silu`/`softplus` and `torch.erf`).
#[allow(clippy::approx_constant)] // the values as PyTorch printed them
fn unary_table_wide() -> Vec<UnaryCase<9>> {
    #[rustfmt::skip]
    return vec![
        ("silu", |x| x.silu(),
            [NAN, 0.0, 0.7310585786300049, -0.2689414213699951, INF, NAN, 19.999999958776925,
             20.499999974371867, -2.8072868906517896e-12],
            [NAN, 0.5, 0.9276705118714869, 0.07232948812851325, NAN, NAN, 1.0000000391619202,
             1.000000024377981, -2.713710660963134e-12]),
        ("softplus", |x| x.softplus(),
            [NAN, 0.6931471805599453, 1.3132616875182228, 0.31326168751822286, INF, 0.0,
             20.000000002061153, 20.5, 9.357622968839737e-14],
            [NAN, 0.5, 0.7310585786300049, 0.2689414213699951, 1.0, 0.0, 0.9999999979388464,
             1.0, 9.3576229688393e-14]),
        ("erf", |x| x.erf(),
            [NAN, 0.0, 0.8427007929497149, -0.8427007929497149, 1.0, -1.0, 1.0, 1.0, -1.0],
            [NAN, 1.1283791670955126, 0.4151074974205947, 0.4151074974205947, 0.0, 0.0,
             2.1610374743867984e-174, 3.4689579821931465e-183, 0.0]),
    ];
}

/// silu, softplus and erf at the edges and around softplus's threshold, by both backward paths.
/// Small integer powers in f32 as PyTorch's CPU kernel computes them, not through `pow`:
/// `x³` is `(x·x)·x` and `x⁻²` is `1/(x·x)`, which differ from the correctly rounded power in
/// the last bit for about a quarter of the values (PyTorch 2.15's `t ** 3` and `t ** -2` on
/// these inputs); `x²` is `x·x` and `x¹` is `x` itself. Backward takes the same products
/// (`g·p·x^(p−1)`).
#[test]
fn small_integer_powers_are_pytorchs_products_in_f32() {
    let g = Graph::new();
    let bits = |t: Tensor<'_>| -> Vec<u32> {
        t.to_vec_f64()
            .unwrap()
            .iter()
            .map(|&v| (v as f32).to_bits())
            .collect()
    };
    let f32s = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
    let wide = |v: &[f32]| -> Vec<f64> { v.iter().map(|&x| f64::from(x)).collect() };
    let cube_in = [0.561_460_26_f32, 1.902_608_6, 1.723_780_3];
    let x = g.from_f64(&wide(&cube_in), &[3], DType::F32).unwrap();
    // torch.tensor(cube_in) ** 3
    let want = [0.176_993_38_f32, 6.887_29, 5.122_072];
    assert_eq!(bits(x.powf(3.0).unwrap()), f32s(&want), "x³");
    // The correctly rounded cubes, which `pow` gives, are one bit above in each case.
    let rounded: Vec<u32> = cube_in
        .iter()
        .map(|&v| ((v as f64).powi(3) as f32).to_bits())
        .collect();
    assert_ne!(rounded, f32s(&want));
    let inv_in = [1.636_318_2_f32, 1.927_992_3];
    let x = g.from_f64(&wide(&inv_in), &[2], DType::F32).unwrap();
    // torch.tensor(inv_in) ** -2
    let want = [0.373_477_55_f32, 0.269_022_97];
    assert_eq!(bits(x.powf(-2.0).unwrap()), f32s(&want), "x⁻²");
    let sq: Vec<f32> = cube_in.iter().map(|&v| v * v).collect();
    let x = g.from_f64(&wide(&cube_in), &[3], DType::F32).unwrap();
    assert_eq!(bits(x.powf(2.0).unwrap()), f32s(&sq), "x²");
    assert_eq!(bits(x.powf(1.0).unwrap()), f32s(&cube_in), "x¹");
    // d/dx x³ = 3·x², as g·3·(x·x) with g = 1.
    let x = g.leaf(&wide(&cube_in), &[3], DType::F32).unwrap();
    let dx = grad(
        x.powf(3.0).unwrap().sum().unwrap(),
        &[x],
        BackwardOptions::default(),
    )
    .unwrap()[0]
        .unwrap();
    let want: Vec<f32> = cube_in.iter().map(|&v| 3.0 * (v * v)).collect();
    assert_eq!(bits(dx), f32s(&want), "d x³");
}

#[test]
fn silu_softplus_erf_match_pytorch() {
    for (name, f, want_y, want_g) in unary_table_wide() {
        check_unary(name, f, &XS, &want_y, &want_g);
    }
}

/// `(a op b, d Σ/da, d Σ/db)` by both backward paths.
fn binary_both(f: Bin, a: &[f64], b: &[f64]) -> [(Vec<f64>, Vec<f64>, Vec<f64>); 2] {
    let run = |create: bool| {
        let g = Graph::new();
        let x = g.leaf(a, &[a.len()], DType::F64).unwrap();
        let y = g.leaf(b, &[b.len()], DType::F64).unwrap();
        let out = f(x, y).unwrap();
        let vals = out.to_vec::<f64>().unwrap();
        let l = out.sum().unwrap();
        let (ga, gb) = if create {
            let opts = BackwardOptions {
                create_graph: true,
                ..Default::default()
            };
            let r = grad(l, &[x, y], opts).unwrap();
            (r[0].unwrap(), r[1].unwrap())
        } else {
            l.backward().unwrap();
            (x.grad().unwrap().unwrap(), y.grad().unwrap().unwrap())
        };
        (
            vals,
            ga.to_vec::<f64>().unwrap(),
            gb.to_vec::<f64>().unwrap(),
        )
    };
    [run(false), run(true)]
}

/// The operand pairs of the binary tables.
const A: Row = [NAN, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, -1.0, INF];
const B: Row = [1.0, NAN, 1.0, 0.0, 2.0, -1.0, NAN, 0.0, 0.5, 0.0];

/// PyTorch's values and gradients (d/da, d/db) at the pairs [`A`], [`B`].
fn binary_table() -> Vec<(&'static str, Bin, Row, Row, Row)> {
    let ln2 = std::f64::consts::LN_2;
    #[rustfmt::skip]
    return vec![
        ("maximum", |x, y| x.maximum(y),
            [NAN, NAN, 1.0, 0.0, 2.0, 0.0, NAN, 2.0, 0.5, INF],
            [1.0, 1.0, 0.5, 0.5, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0],
            [1.0, 1.0, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
        ("minimum", |x, y| x.minimum(y),
            [NAN, NAN, 1.0, 0.0, 0.0, -1.0, NAN, 0.0, -1.0, 0.0],
            [1.0, 1.0, 0.5, 0.5, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
            [1.0, 1.0, 0.5, 0.5, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]),
        ("pow", |x, y| x.pow(y),
            [NAN, 1.0, 1.0, 1.0, 0.0, INF, NAN, 1.0, NAN, 1.0],
            [1.0, NAN, 1.0, 0.0, 0.0, -INF, NAN, 0.0, NAN, 0.0],
            [NAN, 0.0, 0.0, 0.0, 0.0, -INF, NAN, ln2, NAN, INF]),
        ("div", |x, y| x.div(y),
            [NAN, NAN, 1.0, NAN, 0.0, 0.0, NAN, INF, -2.0, INF],
            [1.0, NAN, 1.0, INF, 0.5, -1.0, NAN, INF, 2.0, INF],
            [NAN, NAN, -1.0, NAN, 0.0, 0.0, NAN, -INF, 4.0, -INF]),
        ("mul", |x, y| x.mul(y),
            [NAN, NAN, 1.0, 0.0, 0.0, 0.0, NAN, 0.0, -0.5, NAN],
            [1.0, NAN, 1.0, 0.0, 2.0, -1.0, NAN, 0.0, 0.5, 0.0],
            [NAN, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, -1.0, INF]),
        ("add", |x, y| x.add(y),
            [NAN, NAN, 2.0, 0.0, 2.0, -1.0, NAN, 2.0, -0.5, INF], [1.0; 10], [1.0; 10]),
        ("sub", |x, y| x.sub(y),
            [NAN, NAN, 0.0, 0.0, -2.0, 1.0, NAN, 2.0, -1.5, INF], [1.0; 10], [-1.0; 10]),
    ];
}

/// The comparisons: PyTorch's answers at the pairs [`A`], [`B`] (as 0/1; NaN compares false but
/// for `ne`); no gradient flows (PyTorch's output does not require grad).
fn comparison_table() -> Vec<(&'static str, Bin, Row)> {
    #[rustfmt::skip]
    return vec![
        ("eq", |x, y| x.eq(y), [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        ("ne", |x, y| x.ne(y), [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ("lt", |x, y| x.lt(y), [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
        ("le", |x, y| x.le(y), [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
        ("gt", |x, y| x.gt(y), [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]),
        ("ge", |x, y| x.ge(y), [0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]),
    ];
}

#[test]
fn binary_ops_at_the_edges_match_pytorch() {
    for (name, f, want_y, want_ga, want_gb) in binary_table() {
        for (path, (y, ga, gb)) in ["fused", "create_graph"].iter().zip(binary_both(f, &A, &B)) {
            assert_all_same(&format!("{name} value"), &y, &want_y);
            assert_all_same(&format!("{name} d/da ({path})"), &ga, &want_ga);
            assert_all_same(&format!("{name} d/db ({path})"), &gb, &want_gb);
        }
    }
}

#[test]
fn comparisons_at_the_edges_match_pytorch_and_carry_no_gradient() {
    let g = Graph::new();
    let a = g.leaf(&A, &[A.len()], DType::F64).unwrap();
    let b = g.leaf(&B, &[B.len()], DType::F64).unwrap();
    for (name, f, want) in comparison_table() {
        let y = f(a, b).unwrap();
        assert_eq!(
            y.dtype(),
            DType::Bool,
            "{name}: PyTorch's comparisons give bool"
        );
        assert_all_same(name, &y.to_vec_f64().unwrap(), &want);
        assert!(
            !y.requires_grad(),
            "{name}: a comparison carries no gradient"
        );
    }
}

/// Every public row of the engine's unary and binary tables has PyTorch's answers at the edges
/// in one of the tables above: a new row fails here, naming itself, until it has them.
#[test]
fn every_public_row_has_its_edge_values() {
    let row = |name: &str| name.split('(').next().unwrap_or(name).to_string();
    let unary: BTreeSet<String> = unary_table()
        .iter()
        .map(|c| row(c.0))
        .chain(unary_table_wide().iter().map(|c| row(c.0)))
        .collect();
    let binary: BTreeSet<String> = binary_table()
        .iter()
        .map(|c| row(c.0))
        .chain(comparison_table().iter().map(|c| row(c.0)))
        .collect();
    let missing: Vec<&str> = UnaryOp::KINDS
        .iter()
        .filter(|op| op.is_public())
        .map(|op| op.name())
        .filter(|n| !unary.contains(*n))
        .chain(
            BinaryOp::KINDS
                .iter()
                .filter(|op| op.is_public())
                .map(|op| op.name())
                .filter(|n| !binary.contains(*n)),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "no PyTorch edge values (NaN, ±0, ±1, ±inf) for {missing:?}: add each op's row to the \
         tables of this file"
    );
    // And the tables name no op the engine lacks.
    for name in unary.iter().chain(&binary) {
        let known = UnaryOp::KINDS.iter().any(|op| op.name() == name)
            || BinaryOp::KINDS.iter().any(|op| op.name() == name);
        assert!(known, "the tables name `{name}`, which is no row");
    }
}

#[test]
fn max_splits_its_gradient_among_ties_and_nans() {
    // PyTorch's full `max()`: evenly among the maxima, and among the NaNs when it is NaN.
    #[rustfmt::skip]
    let cases: [(&[f64], f64, &[f64]); 5] = [
        (&[NAN, NAN, NAN], NAN, &[1.0 / 3.0; 3]),
        (&[1.0, NAN, 3.0, NAN], NAN, &[0.0, 0.5, 0.0, 0.5]),
        (&[2.0, 2.0, 1.0], 2.0, &[0.5, 0.5, 0.0]),
        (&[-INF, -INF], -INF, &[0.5, 0.5]),
        (&[1.0, 5.0, 2.0], 5.0, &[0.0, 1.0, 0.0]),
    ];
    for (xs, want_y, want_g) in cases {
        let [fused, graph] = unary_both(|x| x.max(), xs);
        assert_all_same(&format!("max {xs:?}"), &fused.0, &[want_y]);
        assert_all_same(&format!("max' {xs:?} (fused)"), &fused.1, want_g);
        assert_all_same(&format!("max' {xs:?} (create_graph)"), &graph.1, want_g);
    }
    // Along an axis, row by row.
    let g = Graph::new();
    let x = g
        .leaf(&[NAN, NAN, 1.0, 1.0, 3.0, NAN], &[3, 2], DType::F64)
        .unwrap();
    let y = x.max_axes(&[1], false).unwrap();
    assert_all_same("max_axes", &y.to_vec::<f64>().unwrap(), &[NAN, 1.0, NAN]);
    y.sum().unwrap().backward().unwrap();
    let gx = x.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
    assert_all_same("max_axes'", &gx, &[0.5, 0.5, 0.5, 0.5, 0.0, 1.0]);
}

#[test]
fn log_softmax_keeps_its_precision_for_large_logits() {
    let want = -std::f32::consts::LN_2;
    for v in [1e3f32, 1e4, 1e6, 1e7, 3e7] {
        let g = Graph::new();
        let x = g
            .leaf(&[f64::from(v), f64::from(v)], &[1, 2], DType::F32)
            .unwrap();
        let y = x.log_softmax(-1).unwrap();
        let got = y.to_vec::<f32>().unwrap();
        assert!(
            got.iter().all(|&p| (p - want).abs() <= f32::EPSILON),
            "log_softmax([{v}, {v}]) = {got:?}, want {want}"
        );
        let pick = g.from_f64(&[1.0, 0.0], &[1, 2], DType::F32).unwrap();
        y.mul(pick).unwrap().sum().unwrap().backward().unwrap();
        let gx = x.grad().unwrap().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(gx, vec![0.5, -0.5], "gradient at [{v}, {v}]");
        let s = x.softmax(-1).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(s, vec![0.5, 0.5]);
    }
}

#[test]
fn retain_grad_needs_a_tensor_that_requires_grad() {
    let g = Graph::new();
    let c = g.ones(&[2], DType::F64).unwrap();
    assert!(matches!(
        c.retain_grad(),
        Err(GraphError::BadArgument {
            op: "retain_grad",
            ..
        })
    ));
    let x = g.leaf(&[1.0, 2.0], &[2], DType::F64).unwrap();
    let h = x.mul(x).unwrap();
    h.retain_grad().unwrap();
    h.sum().unwrap().backward().unwrap();
    assert_eq!(
        h.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 1.0]
    );
}

#[test]
fn repeated_reduction_axes_are_refused() {
    let g = Graph::new();
    let x = g.ones(&[2, 3], DType::F64).unwrap();
    for axes in [&[0isize, 0][..], &[1, -1], &[-2, 0]] {
        for r in [
            x.sum_axes(axes, false),
            x.mean_axes(axes, false),
            x.max_axes(axes, true),
        ] {
            assert!(
                matches!(r, Err(GraphError::RepeatedAxis { .. })),
                "{axes:?}: {r:?}"
            );
        }
    }
    assert_eq!(x.sum_axes(&[0, -1], false).unwrap().item().unwrap(), 6.0);
}

/// `(f(x), d Σf / dx)` for an input of any shape, by a plain backward and by `grad` with
/// `create_graph`.
fn shaped_both(f: Un, xs: &[f64], shape: &[usize]) -> [(Vec<usize>, Vec<f64>, Vec<f64>); 2] {
    let run = |create: bool| {
        let g = Graph::new();
        let x = g.leaf(xs, shape, DType::F64).unwrap();
        let y = f(x).unwrap();
        let l = y.sum().unwrap();
        let gr = if create {
            let opts = BackwardOptions {
                create_graph: true,
                ..Default::default()
            };
            grad(l, &[x], opts).unwrap()[0].unwrap()
        } else {
            l.backward().unwrap();
            x.grad().unwrap().unwrap()
        };
        assert_eq!(gr.shape().as_slice(), shape);
        (
            y.shape().to_vec(),
            y.to_vec::<f64>().unwrap(),
            gr.to_vec::<f64>().unwrap(),
        )
    };
    [run(false), run(true)]
}

#[test]
fn logsumexp_over_an_empty_axis_is_minus_infinity() {
    // torch.logsumexp(torch.zeros(2, 0), 1) = [-inf, -inf] (log of an empty sum), and the
    // gradient is the (empty) input's shape.
    for (shape, axes, keep, want_shape, want) in [
        (
            &[2usize, 0][..],
            &[1isize][..],
            false,
            &[2usize][..],
            &[-INF, -INF][..],
        ),
        (&[2, 0], &[-1], true, &[2, 1], &[-INF, -INF]),
        (&[0], &[], false, &[], &[-INF]),
        (&[0, 3], &[0], false, &[3], &[-INF, -INF, -INF]),
    ] {
        let f: Un = match (axes, keep) {
            ([1], false) => |x| x.logsumexp(&[1], false),
            ([-1], true) => |x| x.logsumexp(&[-1], true),
            ([], false) => |x| x.logsumexp(&[], false),
            _ => |x| x.logsumexp(&[0], false),
        };
        for (y_shape, y, gx) in shaped_both(f, &[], shape) {
            assert_eq!(y_shape, want_shape, "{shape:?} over {axes:?}");
            assert_all_same(&format!("logsumexp {shape:?} {axes:?}"), &y, want);
            assert!(gx.is_empty());
        }
    }
}

#[test]
fn cumsum_of_a_0d_tensor_is_its_value() {
    // torch.tensor(3.).cumsum(0) = 3 (also dim -1), gradient 1; dim 1 is out of range.
    for f in [(|x| x.cumsum(0)) as Un, |x| x.cumsum(-1)] {
        for (y_shape, y, gx) in shaped_both(f, &[3.0], &[]) {
            assert!(y_shape.is_empty());
            assert_eq!((y, gx), (vec![3.0], vec![1.0]));
        }
    }
    let g = Graph::new();
    let x = g.scalar(3.0, DType::F64).unwrap();
    for axis in [1, -2] {
        assert!(matches!(
            x.cumsum(axis),
            Err(GraphError::BadAxis { op: "cumsum", .. })
        ));
    }
}

#[test]
fn clamp_with_neither_bound_is_an_error() {
    // torch.clamp(x): "At least one of 'min' or 'max' must not be None".
    let g = Graph::new();
    let x = g.leaf(&[1.0, -2.0], &[2], DType::F64).unwrap();
    assert!(matches!(
        x.clamp(None, None),
        Err(GraphError::BadArgument { op: "clamp", .. })
    ));
    assert_eq!(g.stats().tape_len, 1, "nothing recorded");
}

#[test]
fn recurrences_over_no_steps_and_rows_of_no_length() {
    // PyTorch refuses a sequence of length 0 and a packed row of length 0. Here both run: a
    // row of no length takes part in no step (its outputs are 0, its final state is its
    // initial one, which gets the final state's gradient), and a sequence of no steps is
    // every row so. (A batch mixing lengths need not drop its empty rows first.)
    let g = Graph::new();
    let h = 2;
    for t in [0usize, 2] {
        let gi = g
            .leaf(&vec![0.3; t * 2 * 4 * h], &[t, 2, 4 * h], DType::F64)
            .unwrap();
        let w = g.leaf(&[0.1; 4 * 2 * 2], &[4 * h, h], DType::F64).unwrap();
        let h0 = g.leaf(&[1.0, 2.0, 3.0, 4.0], &[2, h], DType::F64).unwrap();
        let c0 = g.leaf(&[5.0, 6.0, 7.0, 8.0], &[2, h], DType::F64).unwrap();
        let lengths = [t, 0];
        let opts = arenagrad_graph::LstmSequenceOptions {
            lengths: Some(&lengths),
            ..Default::default()
        };
        let (y, hn, cn) = gi.lstm_sequence(w, h0, c0, opts).unwrap();
        assert_eq!(y.shape().as_slice(), &[t, 2, h]);
        let yv = y.to_vec::<f64>().unwrap();
        // Row 1 (length 0): outputs 0 at every step; final states its initial ones.
        for s in 0..t {
            assert_eq!(yv[(s * 2 + 1) * h..(s * 2 + 2) * h], [0.0, 0.0]);
        }
        assert_eq!(hn.to_vec::<f64>().unwrap()[h..], [3.0, 4.0]);
        assert_eq!(cn.to_vec::<f64>().unwrap()[h..], [7.0, 8.0]);
        if t == 0 {
            assert_eq!(hn.to_vec::<f64>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
        }
        hn.add(cn).unwrap().sum().unwrap().backward().unwrap();
        let gh = h0.grad().unwrap().unwrap().to_vec::<f64>().unwrap();
        assert_eq!(gh[h..], [1.0, 1.0]);
        if t == 0 {
            assert_eq!(gh, [1.0; 4]);
        }
    }
    // The composed recurrence: no steps, final state the initial one.
    let x = g.from_f64(&[], &[0, 3], DType::F64).unwrap();
    let s0 = g.leaf(&[1.0, 2.0], &[2, 1], DType::F64).unwrap();
    let (out, last) = g
        .recurrence(x, vec![s0], 0, &[0, 0], false, |x, s| {
            Ok::<_, GraphError>(vec![s[0].add(x.sum_axes(&[1], true)?)?])
        })
        .unwrap();
    assert_eq!(out.shape().as_slice(), &[0, 2, 1]);
    assert_eq!(last[0].to_vec::<f64>().unwrap(), [1.0, 2.0]);
}

#[test]
fn attention_with_heads_of_no_width_averages_the_values() {
    // PyTorch: q, k of width 0 make scores 0·(1/√0) = NaN, and a NaN output. Here the default
    // scale is 1 at width 0 (the scores of empty dot products are 0): every key weighs the
    // same, and each query gets the values' mean, with finite gradients.
    let g = Graph::new();
    let q = g.leaf(&[], &[1, 2, 0], DType::F64).unwrap();
    let k = g.leaf(&[], &[1, 3, 0], DType::F64).unwrap();
    let v = g
        .leaf(&[1.0, 10.0, 2.0, 20.0, 6.0, 60.0], &[1, 3, 2], DType::F64)
        .unwrap();
    let o = q
        .scaled_dot_product_attention(k, v, Default::default())
        .unwrap();
    assert_eq!(o.shape().as_slice(), &[1, 2, 2]);
    assert_all_same(
        "attention d = 0",
        &o.to_vec::<f64>().unwrap(),
        &[3.0, 30.0, 3.0, 30.0],
    );
    o.sum().unwrap().backward().unwrap();
    assert_all_same(
        "attention d = 0, dv",
        &v.grad().unwrap().unwrap().to_vec::<f64>().unwrap(),
        &[2.0 / 3.0; 6],
    );
}
