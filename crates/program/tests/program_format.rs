//! The program format: every op parses, prints and parses back; shapes follow the rules; errors
//! name the line and the column and say what was expected; no input makes the parser panic; sizes
//! beyond the limits are typed errors before anything is allocated.

use std::sync::Arc;

use arenagrad_graph::{Graph, GraphError, Tensor};
use arenagrad_program::{
    op_names, table::Param, BinaryOp, CheckOptions, Expr, Limits, OpImpl, Overrides, Program,
    ProgramError, RunOptions, UnaryOp,
};

/// One statement of every op (and both leaf kinds, with and without values).
const EVERY_OP: &str = "\
# every op of format version 1
a = input 2 3 : 0.5 -1 2 3.25 -0.75 1.5
b = input 3 : 1.5 2 0.25
c = const 2 1 : 2 3
s = input
r = const 3 2
d0 = add a b
d1 = sub a c
d2 = mul d0 d1
d3 = div d2 c
pa = abs a
pb = shift pa 0.5
d4 = pow pb c
d5 = maximum d4 a
d6 = minimum d5 b
q0 = eq a b
q1 = ne a q0
q2 = lt q1 b
q3 = le a c
q4 = gt q3 a
q5 = ge b q4
u0 = neg d6
u1 = exp u0
u2 = log u1
u3 = sqrt pb
u4 = sin u3
u5 = cos u4
u6 = tanh u5
u7 = sigmoid u6
u8 = relu u7
u9 = gelu u8
u10 = detach u9
u11 = silu u9
u12 = softplus u11
u13 = erf u12
u14 = gelu_tanh u13
k0 = scale u9 -2
k1 = shift k0 1e-3
k2 = powf pb 1.5
r0 = sum k2 0
r1 = mean k2 -1
r2 = max k1 1
r3 = sum k1
r4 = mean k1 0 1
m0 = softmax k2 1
m1 = log_softmax k2 0
mm = matmul a r
t0 = transpose m0 0 1
t1 = permute t0 1 0
t2 = reshape t1 3 -1
t3 = broadcast c 4 2 3
t4 = concat 0 a m1 k2
t5 = slice t4 0 1 4
e0 = cumsum a 1
e1 = logsumexp a -1
e2 = min a 0
e3 = max_dim a 1
e4 = norm a 2 1
e5 = norm a inf 0
e6 = clamp a -0.5 0.5
e7 = tril a 0
e8 = triu a -1
e9 = masked_fill a q0 -2
e10 = layer_norm a 1 1e-5
e11 = rms_norm a 2 1e-6
e12 = attention a a a 1
e13 = stack a d1 0
e14 = slice_step a 1 0 3 2
e15 = chunk a 2 1 1
e16 = split a 2 1 0
e17 = unbind a 0 1
e18 = one_hot q0 2
e19 = arange a 0 5 1.5
e20 = flip a 0 -1
e21 = roll a -1 1
e22 = repeat a 2 1 3
e23 = sort a 1 0
e24 = topk a 2 -1 1
e24s = topk a 2 -1 0
im = input 2 2 3 : 0.5 -1 2 1.5 0.25 -2 1 3 -0.5 2.5 -1.5 0.75
kw = input 2 1 2 2 : 1 -0.5 0.25 2 -1 0.5 1.5 -2
e25 = conv2d im kw 1 1 1 2
e26 = conv_transpose2d im kw 2 0 1 1 2
e27 = repeat_interleave a 2 -1
e28 = unsqueeze a 0
e29 = squeeze e28 0
e30 = where c a b
sq = input 3 4 : 0.5 -1 2 1.5 0.25 -2 1 3 -0.5 2.5 -1.5 0.75
k1d = input 2 3 2 : 1 -0.5 0.25 2 -1 0.5 1.5 -2 0.75 -0.25 1 0.5
k1t = input 3 1 2 : 0.5 -1 2 1.5 0.25 -2
e31 = conv1d sq k1d 2 1 1 1
e32 = conv_transpose1d sq k1t 2 1 1 1 1
e33 = pad a -1.5 1 2 1 0
e34 = pad_reflect a 2 1
e35 = pad_replicate a 1 3 2 0
e36 = pad_circular a 3 1
im4 = unsqueeze im 0
e37 = interpolate_nearest im4 3 5
e38 = interpolate_bilinear im4 4 2 1
e38n = interpolate_nearest_scale im4 1.5 0.75
e38b = interpolate_bilinear_scale im4 2.5 1.25 0
e38s = interpolate_nearest1d im 5
e38l = interpolate_linear im 4 1
e38t = interpolate_nearest1d_scale im 1.5
e38u = interpolate_linear_scale im 2.5 0
e39 = adaptive_avg_pool2d im 2 2
e40 = adaptive_max_pool2d im4 1 2
e41 = group_norm im4 2 1e-5
e42 = instance_norm im 1e-5
ix = const 2 2 : 2 0 1 1
e43 = gather a ix 1
ir = const 3 : 1 0 1
e44 = index_select a ir 0
e45 = scatter_add a ix k2 -1
e46 = scatter_reduce a ix k2 1 2 1
e47 = index_add a ir e44 0
pr = input 2 3 : 0.25 0.5 0.75 0.1 0.9 0.5
l0 = mse_loss a d1 0
l1 = l1_loss a d1 1
l2 = smooth_l1_loss a d1 2 0.5
l3 = huber_loss a d1 0 1.5
l4 = kl_div a pr 3 0
l5 = bce pr pr 0
l6 = bce_with_logits a pr 1
tc = const 2 : 2 0
l7 = cross_entropy a tc 0 0.1 -100
l8 = nll_loss a tc 2
l9 = einsum a b ij,j->i
l10 = einsum a r ij,jk
l11 = einsum a b ...j,...j->...
o = mul s r3
";

#[test]
fn every_op_parses_prints_and_parses_back() {
    let p = Program::parse(EVERY_OP).unwrap();
    let ops: std::collections::BTreeSet<&str> =
        p.statements().iter().map(|s| s.expr.op_name()).collect();
    for op in op_names() {
        assert!(ops.contains(op), "EVERY_OP lacks `{op}`");
    }
    let text = p.to_string();
    let q = Program::parse(&text).unwrap();
    assert_eq!(p, q);
    assert_eq!(q.to_string(), text, "printing is canonical");
    // Each statement also round-trips on its own line.
    for i in 0..p.len() {
        let line = p.statement_text(i).unwrap();
        assert!(text.lines().any(|l| l == line));
    }
    // Comments and blank lines are gone; one statement per line.
    assert_eq!(text.lines().count(), p.len());
}

#[test]
fn shapes_of_every_op() {
    let p = Program::parse(EVERY_OP).unwrap();
    let infos = p.check(&Limits::default()).unwrap();
    let shape = |name: &str| infos[p.index_of(name).unwrap()].shape.clone();
    let want: &[(&str, &[usize])] = &[
        ("s", &[]),
        ("d0", &[2, 3]),
        ("d1", &[2, 3]),
        ("d4", &[2, 3]),
        ("d6", &[2, 3]),
        ("k2", &[2, 3]),
        ("r0", &[3]),
        ("r1", &[2]),
        ("r2", &[2]),
        ("r3", &[]),
        ("r4", &[]),
        ("m1", &[2, 3]),
        ("mm", &[2, 2]),
        ("t0", &[3, 2]),
        ("t1", &[2, 3]),
        ("t2", &[3, 2]),
        ("t3", &[4, 2, 3]),
        ("t4", &[6, 3]),
        ("t5", &[3, 3]),
        ("e25", &[2, 3, 4]),
        ("e26", &[2, 5, 7]),
        ("e27", &[2, 6]),
        ("e28", &[1, 2, 3]),
        ("e29", &[2, 3]),
        ("e30", &[2, 3]),
        ("e31", &[2, 3]),
        ("e32", &[1, 7]),
        ("e33", &[3, 6]),
        ("e34", &[2, 6]),
        ("e35", &[4, 7]),
        ("e36", &[2, 7]),
        ("e37", &[1, 2, 3, 5]),
        ("e38", &[1, 2, 4, 2]),
        ("e38n", &[1, 2, 3, 2]),
        ("e38b", &[1, 2, 5, 3]),
        ("e38s", &[2, 2, 5]),
        ("e38l", &[2, 2, 4]),
        ("e38t", &[2, 2, 4]),
        ("e38u", &[2, 2, 7]),
        ("e39", &[2, 2, 2]),
        ("e40", &[1, 2, 1, 2]),
        ("e41", &[1, 2, 2, 3]),
        ("e42", &[2, 2, 3]),
        ("e43", &[2, 2]),
        ("e44", &[3, 3]),
        ("e45", &[2, 3]),
        ("e46", &[2, 3]),
        ("e47", &[2, 3]),
        ("l0", &[2, 3]),
        ("l1", &[]),
        ("l2", &[]),
        ("l3", &[2, 3]),
        ("l4", &[]),
        ("l5", &[2, 3]),
        ("l6", &[]),
        ("l7", &[2]),
        ("l8", &[]),
        ("o", &[]),
    ];
    for (name, s) in want {
        assert_eq!(shape(name), s.to_vec(), "{name}");
    }
    let grad = |name: &str| infos[p.index_of(name).unwrap()].requires_grad;
    assert!(grad("a") && grad("d0") && !grad("c") && !grad("r") && !grad("u10"));
    assert!(grad("k0"), "detach stops only its own output");
    // And the engine agrees with every predicted shape.
    let r = p.run(&RunOptions::default()).unwrap();
    assert_eq!(r.output.tensor.shape(), Vec::<usize>::new());
    assert_eq!(r.values.len(), 14);
    assert_eq!(
        r.grads.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
        ["a", "b", "s", "im", "kw", "sq", "k1d", "k1t", "pr"]
    );
}

#[test]
fn numbers_round_trip_bit_for_bit() {
    let values = [
        0.0,
        -0.0,
        0.1,
        -1.5,
        1e-310,
        1e300,
        -2.5e-8,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MAX,
        f64::MIN_POSITIVE,
    ];
    let mut p = Program::new();
    p.push(
        "x",
        Expr::Leaf {
            requires_grad: true,
            shape: vec![values.len()],
            values: Some(values.to_vec()),
            dtype: None,
        },
    )
    .unwrap();
    for (k, v) in values.iter().enumerate() {
        p.push(
            &format!("s{k}"),
            Expr::Unary {
                op: UnaryOp::Scale(*v),
                x: 0,
            },
        )
        .unwrap();
    }
    let q = Program::parse(&p.to_string()).unwrap();
    assert_eq!(p, q);
    if let Expr::Leaf {
        values: Some(v), ..
    } = &q.statements()[0].expr
    {
        for (a, b) in v.iter().zip(&values) {
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
        }
    }
    // Integers are floats too where a float is expected; floats are not integers.
    assert!(Program::parse("x = input 2\ny = scale x 3\n").is_ok());
    assert!(Program::parse("x = input 2.0\n").is_err());
}

#[test]
fn leniency_in_spacing() {
    let a = Program::parse("x=input 2 2:1 2 3 4\ny\t=  tanh   x   # tabs, spaces\r\n").unwrap();
    let b = Program::parse("x = input 2 2 : 1 2 3 4\ny = tanh x\n").unwrap();
    assert_eq!(a, b);
}

fn err(text: &str) -> ProgramError {
    match Program::parse(text) {
        Err(e) => e,
        Ok(p) => match p.check(&Limits::default()) {
            Err(e) => e,
            Ok(_) => panic!("expected an error for {text:?}"),
        },
    }
}

#[test]
fn errors_name_line_and_column_and_what_was_expected() {
    let cases: &[(&str, usize, usize, &str)] = &[
        ("", 1, 1, "at least one statement"),
        ("# only a comment\n\n", 1, 1, "at least one statement"),
        ("X = input 2\n", 1, 1, "[a-z_][a-z0-9_]*"),
        ("1x = input 2\n", 1, 1, "NAME"),
        ("x input 2\n", 1, 3, "expected `=`"),
        ("x =\n", 1, 4, "expected an op"),
        ("x = inptu 2\n", 1, 5, "expected an op, found `inptu`"),
        ("x = input 2 -3\n", 1, 13, "non-negative"),
        ("x = input 2 2.5\n", 1, 13, "dimension"),
        ("x = input 3 : 1 2\n", 1, 18, "expected 3 values"),
        ("x = input 2 : 1 2 3\n", 1, 19, "holds 2 values"),
        ("x = input 2 : 1 two\n", 1, 17, "a value (a number)"),
        (
            "x = input 2\nx = input 3\n",
            2,
            1,
            "already defined on line 1",
        ),
        ("x = input 2\ny = tanh z\n", 2, 10, "`z` is not defined"),
        ("x = tanh x\n", 1, 10, "not defined"),
        ("x = input 2\ny = tanh\n", 2, 9, "expected the operand"),
        ("x = input 2\ny = tanh x x\n", 2, 12, "expected end of line"),
        ("x = input 2\ny = add x\n", 2, 10, "the second operand"),
        ("x = input 2\ny = scale x\n", 2, 12, "the constant"),
        ("x = input 2\ny = scale x abc\n", 2, 13, "the constant"),
        ("x = input 2\ny = softmax x\n", 2, 14, "the axis"),
        (
            "x = input 2\ny = sum x 99999999999999999999\n",
            2,
            11,
            "64-bit",
        ),
        ("x = input 2\ny = slice x 0 -1 1\n", 2, 15, "the start"),
        ("x = input 2\ny = concat x x\n", 2, 12, "the axis"),
        ("x = input 2\ny = concat 0\n", 2, 13, "an operand"),
        // Shape errors, from the shape rules.
        (
            "x = input 2 3\ny = input 4\nz = add x y\n",
            3,
            11,
            "do not broadcast",
        ),
        ("x = input 2 3\ny = matmul x x\n", 2, 14, "cannot multiply"),
        ("x = input\ny = matmul x x\n", 2, 14, "rank 1 or more"),
        ("x = input 2 3\ny = sum x 2\n", 2, 11, "out of range"),
        ("x = input 2 3\ny = sum x 1 -1\n", 2, 13, "repeated"),
        ("x = input 2 3\ny = max x -3\n", 2, 11, "out of range"),
        ("x = input 2 0\ny = max x 1\n", 2, 11, "no value"),
        ("x = input\ny = softmax x 0\n", 2, 15, "rank 0 has no axes"),
        (
            "x = input 2 3\ny = transpose x 0 2\n",
            2,
            19,
            "out of range",
        ),
        ("x = input 2 3\ny = permute x 0\n", 2, 5, "a permutation"),
        ("x = input 2 3\ny = permute x 1 1\n", 2, 17, "repeated"),
        ("x = input 2 3\ny = reshape x 4 -1\n", 2, 17, "cannot infer"),
        (
            "x = input 2 3\ny = reshape x -1 -1\n",
            2,
            18,
            "already used",
        ),
        ("x = input 2 3\ny = reshape x 5\n", 2, 5, "cannot reshape"),
        (
            "x = input 2 3\ny = broadcast x 3 3\n",
            2,
            5,
            "does not broadcast",
        ),
        (
            "x = input 2 3\ny = input 2 2\nz = concat 0 x y\n",
            3,
            16,
            "does not match",
        ),
        ("x = input 2 3\ny = slice x 1 2 5\n", 2, 17, "outside axis"),
        ("x = input 2 3\ny = slice x 1 2 1\n", 2, 15, "outside axis"),
    ];
    for &(text, line, col, what) in cases {
        let e = err(text);
        assert_eq!((e.line(), e.column()), (line, col), "{text:?}: {e}");
        assert!(e.to_string().contains(what), "{text:?}: {e}");
        assert!(e
            .to_string()
            .starts_with(&format!("line {line}, column {col}: ")));
    }
}

#[test]
fn columns_count_characters_not_bytes() {
    let e = err("x = input 2 # é\ny = tanh ééé\n");
    assert_eq!((e.line(), e.column()), (2, 10));
    assert!(e.to_string().contains("`ééé`"), "{e}");
    let e = Program::parse_bytes(b"x = input 2\ny = tanh \xc3\x28\n").unwrap_err();
    assert_eq!((e.line(), e.column()), (2, 10));
    assert!(e.to_string().contains("UTF-8"));
}

#[test]
fn the_parser_never_panics() {
    let mut inputs: Vec<Vec<u8>> = vec![
        b"=".to_vec(),
        b":".to_vec(),
        b"x = = =".to_vec(),
        b"x = input : : :".to_vec(),
        b"x = input 2 : 1 :".to_vec(),
        b"\xff\xfe\xfd".to_vec(),
        b"\x00\x00".to_vec(),
        b"x = input 18446744073709551615".to_vec(),
        b"x = input 18446744073709551616".to_vec(),
        b"x = input 2 : 1e999999 -1e999999".to_vec(),
        b"x = input 1 : 0.00000000000000000000000000000000000000000000000000000001".to_vec(),
        "x = input 1 : ٣".as_bytes().to_vec(),
        "é = input 1".as_bytes().to_vec(),
        "x = input 1\ny = concat -9223372036854775808 x"
            .as_bytes()
            .to_vec(),
        "x = input 1\ny = sum x -9223372036854775808"
            .as_bytes()
            .to_vec(),
        "x = input 1\ny = reshape x -9223372036854775808"
            .as_bytes()
            .to_vec(),
        "x = input 1\ny = permute x -9223372036854775808"
            .as_bytes()
            .to_vec(),
        "x = input 1\ny = transpose x 9223372036854775807 -9223372036854775808"
            .as_bytes()
            .to_vec(),
        "x = input 1\ny = slice x 0 18446744073709551615 18446744073709551615"
            .as_bytes()
            .to_vec(),
        "x = input 1\ny = broadcast x 18446744073709551615 18446744073709551615"
            .as_bytes()
            .to_vec(),
        "x = input 1\ny = reshape x 4294967296 4294967296 0 -1"
            .as_bytes()
            .to_vec(),
        "x\u{0}= input 1".as_bytes().to_vec(),
        "x = input 1\u{2028}y = tanh x".as_bytes().to_vec(),
        vec![b'#'; 10_000],
        "x = input 1\n".repeat(3).into_bytes(),
    ];
    // Every prefix and every single-byte substitution of a program using every op.
    let base = EVERY_OP.as_bytes();
    for cut in (0..base.len()).step_by(3) {
        inputs.push(base[..cut].to_vec());
    }
    for at in (0..base.len()).step_by(11) {
        for b in [0u8, b' ', b'\n', b'#', b':', b'=', b'-', b'9', 0xff, b'z'] {
            let mut v = base.to_vec();
            v[at] = b;
            inputs.push(v);
        }
    }
    let limits = Limits::small();
    for input in inputs {
        if let Ok(p) = Program::parse_bytes(&input) {
            assert_eq!(Program::parse(&p.to_string()).unwrap(), p);
            if p.check(&limits).is_ok() {
                let _ = p.run(&RunOptions {
                    limits,
                    ..RunOptions::default()
                });
                let _ = p.to_dot(&limits).unwrap();
            }
        }
    }
}

#[test]
fn oversized_shapes_are_typed_errors_before_allocation() {
    // The element count overflows: refused by the parser.
    let e = err("x = input 4294967296 4294967296 4294967296\n");
    assert!(matches!(e, ProgramError::TooLarge { line: 1, .. }), "{e}");
    // Fits in usize but not in memory: refused before running.
    let p = Program::parse("x = input 100000 100000 100000\ny = tanh x\n").unwrap();
    let e = p.run(&RunOptions::default()).unwrap_err();
    assert!(matches!(e, ProgramError::TooLarge { line: 1, .. }), "{e}");
    assert!(e.to_string().contains("more than the limit"), "{e}");
    // Intermediates are bounded too: broadcast, matmul, concat.
    for (text, line) in [
        ("x = input 2\ny = broadcast x 100000 100000 2\n", 2),
        ("x = input 50000 1\ny = input 1 50000\nz = matmul x y\n", 3),
        ("x = input 100000000\ny = concat 0 x x x\n", 2),
        ("x = input 0 18446744073709551615 2\n", 1),
    ] {
        let p = Program::parse(text).unwrap();
        let e = p
            .run(&RunOptions {
                limits: Limits {
                    max_elements: 1 << 28,
                    ..Limits::default()
                },
                ..RunOptions::default()
            })
            .unwrap_err();
        assert!(
            matches!(e, ProgramError::TooLarge { line: l, .. } if l == line),
            "{text}: {e}"
        );
    }
    // Rank is bounded.
    let many = format!("x = input {}\n", vec!["1"; 40].join(" "));
    assert!(matches!(err(&many), ProgramError::TooLarge { .. }));
    // And the limits are the caller's to choose.
    let p = Program::parse("x = input 64\ny = sum x\n").unwrap();
    let tight = Limits {
        max_elements: 10,
        ..Limits::default()
    };
    assert!(p.check(&tight).is_err() && p.check(&Limits::default()).is_ok());
}

#[test]
fn programs_built_in_code() {
    let mut p = Program::new();
    let x = p
        .push(
            "x",
            Expr::Leaf {
                requires_grad: true,
                shape: vec![2],
                values: Some(vec![1.0, -2.0]),
                dtype: None,
            },
        )
        .unwrap();
    let y = p
        .push(
            "y",
            Expr::Binary {
                op: BinaryOp::Mul,
                lhs: x,
                rhs: x,
            },
        )
        .unwrap();
    assert!(p
        .push(
            "y",
            Expr::Unary {
                op: UnaryOp::Neg,
                x: y
            }
        )
        .is_err());
    assert!(p
        .push(
            "Z",
            Expr::Unary {
                op: UnaryOp::Neg,
                x: y
            }
        )
        .is_err());
    assert!(p
        .push(
            "z",
            Expr::Unary {
                op: UnaryOp::Neg,
                x: 9
            }
        )
        .is_err());
    assert_eq!(p.to_string(), "x = input 2 : 1.0 -2.0\ny = mul x x\n");
    // Errors in a program built in code point into its printed form.
    p.push(
        "z",
        Expr::op("softmax", vec![y], vec![Param::Int(3)]).unwrap(),
    )
    .unwrap();
    let e = p.check(&Limits::default()).unwrap_err();
    assert_eq!((e.line(), e.column()), (3, 15), "{e}");
}

#[test]
fn random_leaves_are_seeded() {
    let p = Program::parse("a = input 3\nb = const 2 : 1 2\nc = input 2\nd = sum a\n").unwrap();
    let v0 = p.leaf_values(0).unwrap();
    let v1 = p.leaf_values(1).unwrap();
    assert_eq!(v0, p.leaf_values(0).unwrap(), "same seed, same values");
    assert_ne!(v0[0], v1[0]);
    assert_eq!(v0[1], vec![1.0, 2.0]);
    // Given values draw nothing: c continues a's stream either way.
    let q = Program::parse("a = input 3\nc = input 2\nd = sum a\n").unwrap();
    assert_eq!(q.leaf_values(0).unwrap()[1], v0[2]);
}

#[test]
fn dot_shows_ops_shapes_and_grad() {
    let p = Program::parse("x = input 2 3\nw = const 3 2\nnode = matmul x w\ny = detach node\n")
        .unwrap();
    let d = p.to_dot(&Limits::default()).unwrap();
    assert!(d.starts_with("digraph program {"));
    assert!(d.contains("\"node\" [label=\"node = matmul x w\\n[2, 2]\\nrequires_grad\""));
    assert!(d.contains("\"w\" [label=\"w = const 3 2\\n[3, 2]\", shape=ellipse]"));
    assert!(d.contains("\"x\" -> \"node\" [label=\"0\"];"));
    assert!(d.contains("\"node\" -> \"y\";"));
    assert!(d.contains("peripheries=2"));
    assert!(!d.contains("\"y\" [label=\"y = detach node\\n[2, 2]\\nrequires_grad"));
    assert!(d.trim_end().ends_with('}'));
}

/// `neg` replaced by a wrong implementation: the runner uses it.
struct DoubleNeg;
impl OpImpl for DoubleNeg {
    fn apply<'g>(
        &self,
        _g: &'g Graph,
        _expr: &Expr,
        args: &[Tensor<'g>],
    ) -> Result<Tensor<'g>, GraphError> {
        args[0].scale(-2.0)
    }
}

#[test]
fn overrides_replace_ops() {
    let p = Program::parse("x = input 2 : 1 2\ny = neg x\n").unwrap();
    let opts = RunOptions {
        overrides: Overrides::new().replace("neg", Arc::new(DoubleNeg)),
        ..RunOptions::default()
    };
    let r = p.run(&opts).unwrap();
    assert_eq!(r.output.tensor.to_f64_vec(), vec![-2.0, -4.0]);
    assert_eq!(r.grad("x").unwrap().to_f64_vec(), vec![-2.0, -2.0]);
    // An override that changes the shape is caught.
    struct Flatten;
    impl OpImpl for Flatten {
        fn apply<'g>(
            &self,
            _g: &'g Graph,
            _e: &Expr,
            a: &[Tensor<'g>],
        ) -> Result<Tensor<'g>, GraphError> {
            a[0].sum()
        }
    }
    let opts = RunOptions {
        overrides: Overrides::new().replace("neg", Arc::new(Flatten)),
        ..RunOptions::default()
    };
    assert!(matches!(
        p.run(&opts),
        Err(ProgramError::Internal { line: 2, .. })
    ));
}

#[test]
fn gradcheck_reports_name_the_input_and_worst_element() {
    // relu at exactly 0: the engine's subgradient is 0, the central difference is 1/2.
    let p = Program::parse("a = input 2 : 1 2\nx = input 2 2 : 1 -1 0 2\ny = relu x\n").unwrap();
    let r = p.gradcheck(&CheckOptions::default()).unwrap();
    assert!(!r.passed);
    let bad = &r.first_order[1];
    assert_eq!(bad.name, "x");
    assert_eq!(bad.worst_index, vec![1, 0]);
    assert_eq!(bad.worst_flat, 2);
    assert!(!bad.passed && r.first_order[0].passed);
    let text = r.to_string();
    assert!(
        text.contains("FAIL x [2, 2]: worst element [1, 0]"),
        "{text}"
    );
    // Smooth programs pass, second order included.
    let p = Program::parse("x = input 3\nw = const 3\ny = mul x w\nz = tanh y\ns = softmax z 0\n")
        .unwrap();
    let r = p
        .gradcheck(&CheckOptions {
            second_order: true,
            ..CheckOptions::default()
        })
        .unwrap();
    assert!(r.passed, "{r}");
    assert_eq!(r.second_order.as_ref().unwrap().len(), 1);
}

/// The run's element count is refused with a message that reads as one sentence.
#[test]
fn the_run_limit_names_what_it_counts() {
    let p = Program::parse("x = input 100 100\ny = sum x\n").unwrap();
    let e = p
        .run(&RunOptions {
            limits: Limits {
                max_total_elements: 30_000,
                ..Limits::default()
            },
            ..RunOptions::default()
        })
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ProgramError::TooLarge { line: 2, .. }), "{msg}");
    assert!(msg.contains("(values, gradients and host copies)"), "{msg}");
}

#[test]
fn the_shape_check_and_the_engine_agree_at_the_edges() {
    // Each program is accepted by both or refused by both: the check once passed what the
    // engine then refused (a step pointing away from the end, the inf norm of an empty axis).
    let cases: &[(&str, bool)] = &[
        ("a = const 1\ny = arange a 0 5 1\n", true),
        ("a = const 1\ny = arange a 5 0 -1\n", true),
        ("a = const 1\ny = arange a 0 5 -1\n", false),
        ("a = const 1\ny = arange a 5 0 1\n", false),
        ("a = const 1\ny = arange a 2 2 1\n", true),
        // logsumexp over an empty axis is −∞ (PyTorch's), in the engine and so in the check.
        ("a = input 2 0\ny = logsumexp a 1\n", true),
        ("a = input 0 3\ny = logsumexp a 0\n", true),
        ("a = input 2 0\ny = norm a inf 1\n", false),
        ("a = input 2 0\ny = norm a inf -1\n", false),
        ("a = input 2 0\ny = norm a 2 1\n", true),
        ("a = input 2 0\ny = norm a inf 0\n", true),
        // A scalar's running sum is its value (axis 0 or -1), as the engine's.
        ("a = input : 3\ny = cumsum a 0\n", true),
        ("a = input : 3\ny = cumsum a -1\n", true),
        ("a = input : 3\ny = cumsum a 1\n", false),
    ];
    for &(text, ok) in cases {
        let p = Program::parse(text).unwrap();
        let checked = p.check(&Limits::default());
        let ran = p.run(&RunOptions::default());
        assert_eq!(checked.is_ok(), ok, "check of {text:?}: {checked:?}");
        assert_eq!(ran.is_ok(), ok, "run of {text:?}: {:?}", ran.err());
        if let Err(e) = ran {
            // Refused by the check, before the engine ran.
            assert!(!matches!(e, ProgramError::Engine { .. }), "{text:?}: {e}");
        }
    }
    let p = Program::parse("a = input 2 0\ny = logsumexp a 1\n").unwrap();
    let r = p.run(&RunOptions::default()).unwrap();
    assert_eq!(r.output.tensor.to_f64_vec(), [f64::NEG_INFINITY; 2]);
}

/// A normalisation's epsilon is refused by the shape check where the engine would refuse it
/// (negative or NaN), pointing at it, for the rows that run nn's functions as for `layer_norm`.
#[test]
fn a_negative_epsilon_is_refused_before_the_run() {
    for (text, col) in [
        ("x = input 2 4 3\ny = group_norm x 2 -1e-5\n", 20),
        ("x = input 2 4 3\ny = instance_norm x NaN\n", 21),
    ] {
        let err = Program::parse(text)
            .unwrap()
            .check(&Limits::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("eps") && err.contains(&format!("column {col}")),
            "{err}"
        );
    }
}

/// Values a loss cannot take are the engine's typed errors naming the op and the line, as
/// PyTorch refuses them: a class target out of range or not a whole number, class targets that
/// would take a gradient, a binary cross-entropy's input or target outside [0, 1].
#[test]
fn losses_refuse_values_outside_their_domain() {
    let cases = [
        (
            "a = input 2 3\nt = const 2 : 0 3\ny = cross_entropy a t 1 0 -100\n",
            "cross_entropy",
            "outside 0..C",
        ),
        (
            "a = input 2 3\nt = const 2 : 0 0.5\ny = cross_entropy a t 1 0 -100\n",
            "cross_entropy",
            "whole number",
        ),
        (
            "a = input 2 3\nt = input 2 : 0 1\ny = cross_entropy a t 1 0 -100\n",
            "cross_entropy",
            "gradient",
        ),
        (
            "a = input 2 3\nt = const 2 : 0 -100\ny = nll_loss a t 1\n",
            "nll_loss",
            "outside 0..C",
        ),
        (
            "a = input 3 : 0.2 1.5 0.7\nb = const 3 : 0 0.5 1\ny = bce a b 1\n",
            "bce",
            "input outside",
        ),
        (
            "a = input 3 : 0.2 0.5 0.7\nb = const 3 : 0 -0.5 1\ny = bce a b 1\n",
            "bce",
            "target outside",
        ),
    ];
    for (text, op, says) in cases {
        let p = Program::parse(text).unwrap();
        let e = p.run(&RunOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, ProgramError::Engine { line: 3, .. }),
            "{text:?}: {msg}"
        );
        assert!(msg.contains(op) && msg.contains(says), "{text:?}: {msg}");
    }
    // The ignored value is no error, and -100 is PyTorch's default.
    let ok = "a = input 2 3\nt = const 2 : 0 -100\ny = cross_entropy a t 1 0 -100\n";
    assert!(Program::parse(ok)
        .unwrap()
        .run(&RunOptions::default())
        .is_ok());
}

/// Integer and boolean `const`s: they print and parse back; the parser refuses a float or
/// unknown dtype, a typed `input`, missing values and values that do not fit, at the dtype's
/// column; the shape check refuses one where an op reads a float, at the operand; random
/// programs make their indices `i64`, `i32` and `u8` too, and those programs check and run.
#[test]
fn integer_and_boolean_consts() {
    let text = "i = const i64 2 2 : 2 0 1 1\nm = const bool 2 1 : 1 0\n\
                t = const i32 2 : 1 2\nk = const u8 : 3\na = input 2 3\n\
                g = gather a i 1\nf = masked_fill a m -1.5\ns = index_select a t 1\n\
                y = where m g s\nz = slice f 1 0 2\nout = add y z\n";
    let p = Program::parse(text).unwrap();
    assert_eq!(Program::parse(&p.to_string()).unwrap(), p);
    assert!(p.to_string().contains("m = const bool 2 1 : 1.0 0.0"));
    let infos = p.check(&Limits::default()).unwrap();
    assert_eq!(infos[0].dtype, Some(arenagrad_graph::DType::I64));
    assert_eq!(infos[4].dtype, None);
    let r = p.run(&RunOptions::default()).unwrap();
    assert_eq!(r.output.tensor.shape(), [2, 2]);
    assert!(r.grad("a").is_some());
    let refused = [
        ("x = const f32 2 : 1 2\n", 1, 11, "integer or boolean dtype"),
        ("x = const int8 2 : 1 2\n", 1, 11, "a dtype"),
        ("x = input i64 2 : 1 2\n", 1, 11, "cannot be i64"),
        ("x = const i64 2\n", 1, 11, "gives its values"),
        ("x = const u8 2 : 1 256\n", 1, 11, "0..=255"),
        ("x = const bool 2 : 0 2\n", 1, 11, "0..=1"),
        ("x = const i32 2 : 0.5 1\n", 1, 11, "not a whole number"),
        ("x = const i64 : NaN\n", 1, 11, "not a whole number"),
        ("i = const i64 2 : 0 1\ny = exp i\n", 2, 9, "`const i64`"),
        (
            "a = input 2\ni = const i32 2 : 0 1\ny = add a i\n",
            3,
            11,
            "`const i32`",
        ),
        (
            "a = input 3 2\ni = const i64 2 : 0 1\ny = gather i a 0\n",
            3,
            12,
            "`const i64`",
        ),
        // PyTorch's dtypes: no u8 or bool indices, no i32 targets, no integer mask.
        (
            "a = input 3 2\ni = const u8 2 1 : 0 1\ny = gather a i 0\n",
            3,
            14,
            "a floating or i64 or i32 operand",
        ),
        (
            "a = input 2 3\nt = const i32 2 : 0 1\ny = cross_entropy a t 1 0 -100\n",
            3,
            21,
            "i64 or u8",
        ),
        (
            "a = input 2 3\nm = const u8 2 1 : 0 1\ny = masked_fill a m 0\n",
            3,
            19,
            "a floating or bool operand",
        ),
    ];
    for &(text, line, col, what) in &refused {
        let e = err(text);
        assert_eq!((e.line(), e.column()), (line, col), "{text:?}: {e}");
        assert!(e.to_string().contains(what), "{text:?}: {e}");
    }
    // Built in code: the same rules.
    let mut q = Program::new();
    assert!(q
        .push(
            "x",
            Expr::Leaf {
                requires_grad: true,
                shape: vec![1],
                values: Some(vec![1.0]),
                dtype: Some(arenagrad_graph::DType::U8),
            },
        )
        .is_err());
    q.push(
        "x",
        Expr::typed_const(arenagrad_graph::DType::U8, vec![2], vec![0.0, 7.0]),
    )
    .unwrap();
    // Random programs draw typed indices; each such program checks and runs.
    use arenagrad_program::generate::{decode, well_typed, GenConfig};
    let mut seen = std::collections::BTreeSet::new();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..3000 {
        let bytes: Vec<u8> = (0..64)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        let (leaves, ops) = decode(&bytes, 3, 6);
        let p = well_typed(&leaves, &ops, &GenConfig::all());
        let text = p.to_string();
        let typed: Vec<&str> = ["const i64", "const i32", "const u8"]
            .into_iter()
            .filter(|d| text.contains(d))
            .collect();
        if typed.is_empty() {
            continue;
        }
        p.check(&Limits::small())
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        p.run(&RunOptions::default())
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        seen.extend(typed);
    }
    assert_eq!(seen.len(), 3, "typed index consts drawn: {seen:?}");
}
