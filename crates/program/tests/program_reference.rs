//! Every op of the program format against values derived by hand: small inputs given with `:`,
//! expected outputs and gradients written in closed form (or as plain loops) here, never computed
//! by arenagrad. Each case runs through the library (`Program::run`) and through the `arenagrad`
//! binary (`run --json`), and must agree to 1e-9 relative in f64.
//!
//! When the output is not a scalar, backward starts from its sum; cases whose sum would have a
//! trivial gradient multiply by a `const` of distinct weights first, so the gradient shows the
//! op's adjoint.

use std::io::Write;
use std::process::{Command, Stdio};

use arenagrad_graph::DType;
use arenagrad_program::{Program, RunOptions};
use serde_json::Value;

struct Case {
    name: &'static str,
    text: String,
    out_shape: Vec<usize>,
    out: Vec<f64>,
    /// Gradient of every `input`, in program order.
    grads: Vec<(&'static str, Vec<f64>)>,
}

fn vals(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:?}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn dims(s: &[usize]) -> String {
    s.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn input(name: &str, shape: &[usize], v: &[f64]) -> String {
    format!("{name} = input {} : {}\n", dims(shape), vals(v))
}

fn constant(name: &str, shape: &[usize], v: &[f64]) -> String {
    format!("{name} = const {} : {}\n", dims(shape), vals(v))
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= 1e-9 * w.abs() + 1e-12;
        assert!(
            ok,
            "{what}[{k}]: got {g:e}, want {w:e} (all: {got:?} vs {want:?})"
        );
    }
}

fn check_library(c: &Case) {
    let p = Program::parse(&c.text).unwrap_or_else(|e| panic!("{}: {e}\n{}", c.name, c.text));
    let r = p
        .run(&RunOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    assert_eq!(
        r.output.tensor.shape(),
        c.out_shape,
        "{}: output shape",
        c.name
    );
    close(
        &r.output.tensor.to_f64_vec(),
        &c.out,
        &format!("{} output", c.name),
    );
    assert_eq!(r.grads.len(), c.grads.len(), "{}: number of grads", c.name);
    for (name, want) in &c.grads {
        let g = r
            .grad(name)
            .unwrap_or_else(|| panic!("{}: no grad for {name}", c.name));
        close(&g.to_f64_vec(), want, &format!("{} grad {name}", c.name));
    }
}

fn run_binary(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arenagrad"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the arenagrad binary runs");
    // A broken pipe (the binary exiting before reading) shows up in the exit status instead.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("an array")
        .iter()
        // A bool tensor's values are JSON's booleans.
        .map(|x| {
            x.as_f64()
                .or_else(|| x.as_bool().map(f64::from))
                .expect("a number")
        })
        .collect()
}

fn shape_of(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .expect("a shape")
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn check_binary(c: &Case) {
    let out = run_binary(&["run", "--json", "-"], &c.text);
    assert!(
        out.status.success(),
        "{}: exit {:?}: {}",
        c.name,
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(j["dtype"], "f64");
    assert_eq!(
        shape_of(&j["output"]),
        c.out_shape,
        "{}: output shape",
        c.name
    );
    close(
        &numbers(&j["output"]["data"]),
        &c.out,
        &format!("{} json output", c.name),
    );
    let grads = j["grads"].as_object().expect("grads object");
    assert_eq!(grads.len(), c.grads.len(), "{}: grads {grads:?}", c.name);
    for (name, want) in &c.grads {
        close(
            &numbers(&grads[*name]["data"]),
            want,
            &format!("{} json grad {name}", c.name),
        );
    }
    // `values` holds every leaf as used: the inputs' and consts' given values.
    let p = Program::parse(&c.text).unwrap();
    let values = j["values"].as_object().expect("values object");
    assert_eq!(values.len(), p.leaves().len(), "{}: values", c.name);
    for i in p.leaves() {
        let s = &p.statements()[i];
        if let arenagrad_program::Expr::Leaf {
            values: Some(v),
            shape,
            ..
        } = &s.expr
        {
            assert_eq!(&shape_of(&values[&s.name]), shape);
            close(&numbers(&values[&s.name]["data"]), v, &s.name);
        }
    }
}

fn map(v: &[f64], f: impl Fn(f64) -> f64) -> Vec<f64> {
    v.iter().map(|&x| f(x)).collect()
}

const A: [f64; 4] = [0.5, -1.0, 2.0, 3.25]; // shape [2, 2]
const B: [f64; 2] = [1.5, -2.0]; // shape [2]
const X: [f64; 3] = [0.5, -1.0, 2.0]; // shape [3]
const P: [f64; 3] = [0.5, 1.0, 2.5]; // shape [3], positive
const M: [f64; 6] = [1.0, 5.0, 3.0, 4.0, -2.0, 6.0]; // shape [2, 3]
const W6: [f64; 6] = [0.25, -1.5, 2.0, 0.75, 3.0, -0.5]; // weights, 6 elements
const W8: [f64; 8] = [1.0, 2.0, -3.0, 4.0, 0.5, -6.0, 7.0, 8.0]; // weights, 8 elements

fn binary_cases() -> Vec<Case> {
    let head = input("a", &[2, 2], &A) + &input("b", &[2], &B);
    let bc = |i: usize| B[i % 2];
    let e = [2.0, -1.0, 0.5];
    let (u, v) = ([1.0, -2.0, 3.0], [0.5, 4.0, -1.0]);
    let uv = input("u", &[3], &u) + &input("v", &[3], &v);
    // Broadcasting both ways: [3, 1] with [1, 2].
    let (c, r) = ([1.0, 2.0, -3.0], [0.5, 4.0]);
    vec![
        Case {
            name: "add",
            text: head.clone() + "y = add a b\n",
            out_shape: vec![2, 2],
            out: (0..4).map(|i| A[i] + bc(i)).collect(),
            grads: vec![("a", vec![1.0; 4]), ("b", vec![2.0, 2.0])],
        },
        Case {
            name: "sub",
            text: head.clone() + "y = sub a b\n",
            out_shape: vec![2, 2],
            out: (0..4).map(|i| A[i] - bc(i)).collect(),
            grads: vec![("a", vec![1.0; 4]), ("b", vec![-2.0, -2.0])],
        },
        Case {
            name: "mul",
            text: head.clone() + "y = mul a b\n",
            out_shape: vec![2, 2],
            out: (0..4).map(|i| A[i] * bc(i)).collect(),
            grads: vec![
                ("a", (0..4).map(bc).collect()),
                ("b", vec![A[0] + A[2], A[1] + A[3]]),
            ],
        },
        Case {
            name: "div",
            text: head.clone() + "y = div a b\n",
            out_shape: vec![2, 2],
            out: (0..4).map(|i| A[i] / bc(i)).collect(),
            grads: vec![
                ("a", (0..4).map(|i| 1.0 / bc(i)).collect()),
                (
                    "b",
                    (0..2).map(|j| -(A[j] + A[j + 2]) / (B[j] * B[j])).collect(),
                ),
            ],
        },
        Case {
            name: "pow",
            text: input("a", &[3], &P) + &input("e", &[3], &e) + "y = pow a e\n",
            out_shape: vec![3],
            out: (0..3).map(|i| P[i].powf(e[i])).collect(),
            grads: vec![
                ("a", (0..3).map(|i| e[i] * P[i].powf(e[i] - 1.0)).collect()),
                ("e", (0..3).map(|i| P[i].powf(e[i]) * P[i].ln()).collect()),
            ],
        },
        Case {
            name: "maximum",
            text: uv.clone() + "y = maximum u v\n",
            out_shape: vec![3],
            out: vec![1.0, 4.0, 3.0],
            grads: vec![("u", vec![1.0, 0.0, 1.0]), ("v", vec![0.0, 1.0, 0.0])],
        },
        Case {
            name: "minimum",
            text: uv + "y = minimum u v\n",
            out_shape: vec![3],
            out: vec![0.5, -2.0, -1.0],
            grads: vec![("u", vec![0.0, 1.0, 0.0]), ("v", vec![1.0, 0.0, 1.0])],
        },
        Case {
            name: "mul outer broadcast",
            text: input("c", &[3, 1], &c) + &input("r", &[1, 2], &r) + "y = mul c r\n",
            out_shape: vec![3, 2],
            out: (0..6).map(|k| c[k / 2] * r[k % 2]).collect(),
            grads: vec![("c", vec![r[0] + r[1]; 3]), ("r", vec![c.iter().sum(); 2])],
        },
    ]
    .into_iter()
    .chain(comparison_cases())
    .collect()
}

/// Each comparison as a mask m of u against t, applied as y = m · (u + t): the mask's values by
/// hand, no gradient through the mask itself, so both inputs get m (u + t is 2 everywhere).
fn comparison_cases() -> Vec<Case> {
    let (u, t) = ([1.0, -2.0, 3.0], [1.0, 4.0, -1.0]);
    let masks: [(&'static str, [f64; 3]); 6] = [
        ("eq", [1.0, 0.0, 0.0]),
        ("ne", [0.0, 1.0, 1.0]),
        ("lt", [0.0, 1.0, 0.0]),
        ("le", [1.0, 1.0, 0.0]),
        ("gt", [0.0, 0.0, 1.0]),
        ("ge", [1.0, 0.0, 1.0]),
    ];
    masks
        .into_iter()
        .map(|(op, m)| Case {
            name: op,
            text: input("u", &[3], &u)
                + &input("t", &[3], &t)
                + &format!("m = {op} u t\ns = add u t\ny = mul m s\n"),
            out_shape: vec![3],
            out: m.iter().map(|k| 2.0 * k).collect(),
            grads: vec![("u", m.to_vec()), ("t", m.to_vec())],
        })
        .collect()
}

fn unary_cases() -> Vec<Case> {
    let x = input("x", &[3], &X);
    let p = input("x", &[3], &P);
    let one = |name, text: &str, xs: &[f64], f: fn(f64) -> f64, d: fn(f64) -> f64| Case {
        name,
        text: text.to_string(),
        out_shape: vec![3],
        out: map(xs, f),
        grads: vec![("x", map(xs, d))],
    };
    let gelu = |v: f64| {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * v * (1.0 + (c * (v + 0.044715 * v.powi(3))).tanh())
    };
    let dgelu = |v: f64| {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let t = (c * (v + 0.044715 * v.powi(3))).tanh();
        0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v * v)
    };
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    vec![
        one("neg", &(x.clone() + "y = neg x\n"), &X, |v| -v, |_| -1.0),
        one("exp", &(x.clone() + "y = exp x\n"), &X, f64::exp, f64::exp),
        one("log", &(p.clone() + "y = log x\n"), &P, f64::ln, |v| {
            1.0 / v
        }),
        one("sqrt", &(p.clone() + "y = sqrt x\n"), &P, f64::sqrt, |v| {
            0.5 / v.sqrt()
        }),
        one(
            "abs",
            &(x.clone() + "y = abs x\n"),
            &X,
            f64::abs,
            f64::signum,
        ),
        one("sin", &(x.clone() + "y = sin x\n"), &X, f64::sin, f64::cos),
        one("cos", &(x.clone() + "y = cos x\n"), &X, f64::cos, |v| {
            -v.sin()
        }),
        one("tanh", &(x.clone() + "y = tanh x\n"), &X, f64::tanh, |v| {
            1.0 - v.tanh() * v.tanh()
        }),
        Case {
            name: "sigmoid",
            text: x.clone() + "y = sigmoid x\n",
            out_shape: vec![3],
            out: map(&X, sig),
            grads: vec![("x", map(&X, |v| sig(v) * (1.0 - sig(v))))],
        },
        one(
            "relu",
            &(x.clone() + "y = relu x\n"),
            &X,
            |v| v.max(0.0),
            |v| {
                if v > 0.0 {
                    1.0
                } else {
                    0.0
                }
            },
        ),
        Case {
            name: "gelu_tanh",
            text: x.clone() + "y = gelu_tanh x\n",
            out_shape: vec![3],
            out: map(&X, gelu),
            grads: vec![("x", map(&X, dgelu))],
        },
        // Exact gelu x·Φ(x) and Φ(x) + x·φ(x) at X, from Python's math.erf.
        Case {
            name: "gelu",
            text: x.clone() + "y = gelu x\n",
            out_shape: vec![3],
            out: vec![
                0.345_731_230_637_006_56,
                -0.158_655_253_931_457_07,
                1.954_499_736_103_641_6,
            ],
            grads: vec![(
                "x",
                vec![
                    0.867_495_124_656_162_9,
                    -0.083_315_470_587_686_29,
                    1.085_231_801_078_197,
                ],
            )],
        },
        Case {
            name: "silu",
            text: x.clone() + "y = silu x\n",
            out_shape: vec![3],
            out: map(&X, |v| v * sig(v)),
            grads: vec![("x", map(&X, |v| sig(v) * (1.0 + v * (1.0 - sig(v)))))],
        },
        // Below and above PyTorch's threshold of 20, where softplus is x itself.
        Case {
            name: "softplus",
            text: input("x", &[3], &[-3.0, 0.5, 25.0]) + "y = softplus x\n",
            out_shape: vec![3],
            out: vec![(-3.0f64).exp().ln_1p(), 0.5f64.exp().ln_1p(), 25.0],
            grads: vec![("x", vec![sig(-3.0), sig(0.5), 1.0])],
        },
        // erf from Python's `math.erf` (C's erf); d/dx erf x = 2/√π · e^(−x²).
        Case {
            name: "erf",
            text: x.clone() + "y = erf x\n",
            out_shape: vec![3],
            out: vec![0.5204998778130465, -0.8427007929497149, 0.9953222650189527],
            grads: vec![(
                "x",
                map(&X, |v| 2.0 / std::f64::consts::PI.sqrt() * (-v * v).exp()),
            )],
        },
        // y = x · detach(x): the detached factor is a constant, so dy/dx = x, not 2x.
        one(
            "detach",
            &(x.clone() + "d = detach x\ny = mul x d\n"),
            &X,
            |v| v * v,
            |v| v,
        ),
        one(
            "scale",
            &(x.clone() + "y = scale x -2.5\n"),
            &X,
            |v| v * -2.5,
            |_| -2.5,
        ),
        one(
            "shift",
            &(x.clone() + "y = shift x 0.75\n"),
            &X,
            |v| v + 0.75,
            |_| 1.0,
        ),
        one(
            "powf",
            &(p + "y = powf x 1.5\n"),
            &P,
            |v| v.powf(1.5),
            |v| 1.5 * v.sqrt(),
        ),
        one(
            "powf integer",
            &(x + "y = powf x 3\n"),
            &X,
            |v| v.powi(3),
            |v| 3.0 * v * v,
        ),
    ]
}

fn reduction_cases() -> Vec<Case> {
    let m = input("m", &[2, 3], &M);
    let w2 = [0.25, -1.5];
    let w3 = [0.25, -1.5, 2.0];
    vec![
        Case {
            name: "sum all",
            text: m.clone() + "y = sum m\n",
            out_shape: vec![],
            out: vec![M.iter().sum()],
            grads: vec![("m", vec![1.0; 6])],
        },
        Case {
            name: "sum axis 0 weighted",
            text: m.clone() + &constant("w", &[3], &w3) + "s = sum m 0\ny = mul s w\n",
            out_shape: vec![3],
            out: (0..3).map(|j| (M[j] + M[j + 3]) * w3[j]).collect(),
            grads: vec![("m", (0..6).map(|k| w3[k % 3]).collect())],
        },
        Case {
            name: "sum both axes, negative",
            text: m.clone() + "y = sum m -1 0\n",
            out_shape: vec![],
            out: vec![M.iter().sum()],
            grads: vec![("m", vec![1.0; 6])],
        },
        Case {
            name: "mean axis 1 weighted",
            text: m.clone() + &constant("w", &[2], &w2) + "s = mean m 1\ny = mul s w\n",
            out_shape: vec![2],
            out: (0..2)
                .map(|i| (M[3 * i] + M[3 * i + 1] + M[3 * i + 2]) / 3.0 * w2[i])
                .collect(),
            grads: vec![("m", (0..6).map(|k| w2[k / 3] / 3.0).collect())],
        },
        Case {
            name: "mean all",
            text: m.clone() + "y = mean m\n",
            out_shape: vec![],
            out: vec![M.iter().sum::<f64>() / 6.0],
            grads: vec![("m", vec![1.0 / 6.0; 6])],
        },
        Case {
            name: "max axis 1 weighted",
            text: m.clone() + &constant("w", &[2], &w2) + "s = max m 1\ny = mul s w\n",
            out_shape: vec![2],
            out: vec![5.0 * w2[0], 6.0 * w2[1]],
            grads: vec![("m", vec![0.0, w2[0], 0.0, 0.0, 0.0, w2[1]])],
        },
        Case {
            name: "max axis -2",
            text: m + "y = max m -2\n",
            out_shape: vec![3],
            out: vec![4.0, 5.0, 6.0],
            grads: vec![("m", vec![0.0, 1.0, 0.0, 1.0, 0.0, 1.0])],
        },
    ]
}

fn softmax_cases() -> Vec<Case> {
    let m = input("m", &[2, 3], &M);
    let w = constant("w", &[2, 3], &W6);
    // Row-wise softmax by hand.
    let mut s = [0.0; 6];
    for i in 0..2 {
        let z: f64 = (0..3).map(|j| M[3 * i + j].exp()).sum();
        for j in 0..3 {
            s[3 * i + j] = M[3 * i + j].exp() / z;
        }
    }
    // L = Σ w·s: dL/dm_ij = s_ij (w_ij − Σ_k w_ik s_ik).
    let mut gs = [0.0; 6];
    // L = Σ w·log s: dL/dm_ij = w_ij − s_ij Σ_k w_ik.
    let mut gl = [0.0; 6];
    for i in 0..2 {
        let ws: f64 = (0..3).map(|k| W6[3 * i + k] * s[3 * i + k]).sum();
        let wsum: f64 = (0..3).map(|k| W6[3 * i + k]).sum();
        for j in 0..3 {
            let q = 3 * i + j;
            gs[q] = s[q] * (W6[q] - ws);
            gl[q] = W6[q] - s[q] * wsum;
        }
    }
    // Column-wise (axis 0) softmax, unweighted sum: gradient zero up to rounding, so weighted.
    let mut s0 = [0.0; 6];
    for j in 0..3 {
        let z = M[j].exp() + M[j + 3].exp();
        s0[j] = M[j].exp() / z;
        s0[j + 3] = M[j + 3].exp() / z;
    }
    let mut g0 = [0.0; 6];
    for j in 0..3 {
        let ws = W6[j] * s0[j] + W6[j + 3] * s0[j + 3];
        g0[j] = s0[j] * (W6[j] - ws);
        g0[j + 3] = s0[j + 3] * (W6[j + 3] - ws);
    }
    vec![
        Case {
            name: "softmax",
            text: m.clone() + &w + "s = softmax m 1\ny = mul s w\n",
            out_shape: vec![2, 3],
            out: (0..6).map(|q| s[q] * W6[q]).collect(),
            grads: vec![("m", gs.to_vec())],
        },
        Case {
            name: "log_softmax",
            text: m.clone() + &w + "s = log_softmax m -1\ny = mul s w\n",
            out_shape: vec![2, 3],
            out: (0..6).map(|q| s[q].ln() * W6[q]).collect(),
            grads: vec![("m", gl.to_vec())],
        },
        Case {
            name: "softmax axis 0",
            text: m + &w + "s = softmax m 0\ny = mul s w\n",
            out_shape: vec![2, 3],
            out: (0..6).map(|q| s0[q] * W6[q]).collect(),
            grads: vec![("m", g0.to_vec())],
        },
    ]
}

/// Plain-loop batched matmul with numpy broadcasting of one batch axis, for the references.
fn matmul_ref(a: &[f64], m: usize, k: usize, b: &[f64], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|t| a[i * k + t] * b[t * n + j]).sum();
        }
    }
    out
}

fn matmul_cases() -> Vec<Case> {
    let a = [1.0, 2.0, -1.0, 0.5, 3.0, -2.0]; // [2, 3]
    let b = [0.5, -1.0, 2.0, 1.5, -0.25, 3.0]; // [3, 2]
    let w = [0.25, -1.5, 2.0, 0.75]; // [2, 2]
                                     // L = Σ w ∘ (a b): dL/da = w bᵀ, dL/db = aᵀ w.
    let mut ga = [0.0; 6];
    let mut gb = [0.0; 6];
    for i in 0..2 {
        for t in 0..3 {
            ga[i * 3 + t] = (0..2).map(|j| w[i * 2 + j] * b[t * 2 + j]).sum();
        }
    }
    for t in 0..3 {
        for j in 0..2 {
            gb[t * 2 + j] = (0..2).map(|i| a[i * 3 + t] * w[i * 2 + j]).sum();
        }
    }
    let ab = matmul_ref(&a, 2, 3, &b, 2);
    let v = [2.0, -1.0, 0.5]; // [3]
                              // Batched: a2 [2, 1, 3] (two 1×3 matrices) times b [3, 2], broadcast over the batch.
    let a2 = [1.0, 2.0, -1.0, 0.5, 3.0, -2.0];
    let mut out_b = Vec::new();
    for bi in 0..2 {
        out_b.extend(matmul_ref(&a2[bi * 3..bi * 3 + 3], 1, 3, &b, 2));
    }
    vec![
        Case {
            name: "matmul 2-D weighted",
            text: input("a", &[2, 3], &a)
                + &input("b", &[3, 2], &b)
                + &constant("w", &[2, 2], &w)
                + "p = matmul a b\ny = mul p w\n",
            out_shape: vec![2, 2],
            out: (0..4).map(|q| ab[q] * w[q]).collect(),
            grads: vec![("a", ga.to_vec()), ("b", gb.to_vec())],
        },
        Case {
            name: "matmul matrix-vector",
            text: input("a", &[2, 3], &a) + &input("v", &[3], &v) + "y = matmul a v\n",
            out_shape: vec![2],
            out: (0..2)
                .map(|i| (0..3).map(|t| a[i * 3 + t] * v[t]).sum())
                .collect(),
            grads: vec![
                ("a", (0..6).map(|q| v[q % 3]).collect()),
                ("v", (0..3).map(|t| a[t] + a[3 + t]).collect()),
            ],
        },
        Case {
            name: "matmul vector-matrix",
            text: input("v", &[3], &v) + &input("b", &[3, 2], &b) + "y = matmul v b\n",
            out_shape: vec![2],
            out: (0..2)
                .map(|j| (0..3).map(|t| v[t] * b[t * 2 + j]).sum())
                .collect(),
            grads: vec![
                ("v", (0..3).map(|t| b[t * 2] + b[t * 2 + 1]).collect()),
                ("b", (0..6).map(|q| v[q / 2]).collect()),
            ],
        },
        Case {
            name: "matmul batched, broadcast right operand",
            text: input("a", &[2, 1, 3], &a2) + &input("b", &[3, 2], &b) + "y = matmul a b\n",
            out_shape: vec![2, 1, 2],
            out: out_b,
            // dΣ/da[bi,0,t] = Σ_j b[t,j]; dΣ/db[t,j] = Σ_bi a[bi,0,t].
            grads: vec![
                (
                    "a",
                    (0..6)
                        .map(|q| b[(q % 3) * 2] + b[(q % 3) * 2 + 1])
                        .collect(),
                ),
                ("b", (0..6).map(|q| a2[q / 2] + a2[3 + q / 2]).collect()),
            ],
        },
    ]
}

fn shape_cases() -> Vec<Case> {
    let m = input("m", &[2, 3], &M);
    // transpose: y[j][i] = m[i][j]; L = Σ w[j][i]·m[i][j].
    let wt = constant("w", &[3, 2], &W6);
    let transposed: Vec<f64> = (0..6).map(|q| M[(q % 2) * 3 + q / 2]).collect();
    let gt: Vec<f64> = (0..6).map(|q| W6[(q % 3) * 2 + q / 3]).collect();
    // permute of [2, 1, 3] by (2, 0, 1): shape [3, 2, 1], y[k][i][0] = x[i][0][k].
    let permuted: Vec<f64> = (0..6).map(|q| M[(q % 2) * 3 + q / 2]).collect();
    // reshape [2, 3] → [3, 2]: same row-major order.
    // broadcast [3] → [2, 3]: dL/dx_j = Σ_i w[i][j].
    let w3 = constant("w", &[2, 3], &W6);
    let bsum: Vec<f64> = (0..3).map(|j| W6[j] + W6[j + 3]).collect();
    // concat 0 of a [1, 2] and b [2, 2].
    let (ca, cb) = ([1.0, -2.0], [0.5, 3.0, -1.0, 4.0]);
    // concat -1 of c [2, 1] and d [2, 2]: rows [c0 d0 d1], [c1 d2 d3].
    let (cc, cd) = ([7.0, -8.0], [0.5, 3.0, -1.0, 4.0]);
    let cat1 = [cc[0], cd[0], cd[1], cc[1], cd[2], cd[3]];
    // slice of [2, 4] along axis 1, columns 1..3.
    let s8 = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let w4 = [0.25, -1.5, 2.0, 0.75];
    vec![
        Case {
            name: "transpose",
            text: m.clone() + &wt + "t = transpose m 0 1\ny = mul t w\n",
            out_shape: vec![3, 2],
            out: (0..6).map(|q| transposed[q] * W6[q]).collect(),
            grads: vec![("m", gt.clone())],
        },
        Case {
            name: "transpose negative axes",
            text: m.clone() + &wt + "t = transpose m -1 -2\ny = mul t w\n",
            out_shape: vec![3, 2],
            out: (0..6).map(|q| transposed[q] * W6[q]).collect(),
            grads: vec![("m", gt)],
        },
        Case {
            name: "permute",
            text: input("x", &[2, 1, 3], &M)
                + &constant("w", &[3, 2, 1], &W6)
                + "t = permute x 2 0 1\ny = mul t w\n",
            out_shape: vec![3, 2, 1],
            out: (0..6).map(|q| permuted[q] * W6[q]).collect(),
            grads: vec![("x", (0..6).map(|q| W6[(q % 3) * 2 + q / 3]).collect())],
        },
        Case {
            name: "reshape with -1",
            text: m.clone() + &constant("w", &[3, 2], &W6) + "t = reshape m 3 -1\ny = mul t w\n",
            out_shape: vec![3, 2],
            out: (0..6).map(|q| M[q] * W6[q]).collect(),
            grads: vec![("m", W6.to_vec())],
        },
        Case {
            name: "reshape to scalar",
            text: input("s", &[1, 1], &[2.5]) + "t = reshape s\ny = powf t 2\n",
            out_shape: vec![],
            out: vec![6.25],
            grads: vec![("s", vec![5.0])],
        },
        Case {
            name: "broadcast",
            text: input("x", &[3], &X) + &w3 + "t = broadcast x 2 3\ny = mul t w\n",
            out_shape: vec![2, 3],
            out: (0..6).map(|q| X[q % 3] * W6[q]).collect(),
            grads: vec![("x", bsum)],
        },
        Case {
            name: "concat axis 0",
            text: input("a", &[1, 2], &ca)
                + &input("b", &[2, 2], &cb)
                + &constant("w", &[3, 2], &W6)
                + "t = concat 0 a b\ny = mul t w\n",
            out_shape: vec![3, 2],
            out: (0..6)
                .map(|q| if q < 2 { ca[q] } else { cb[q - 2] } * W6[q])
                .collect(),
            grads: vec![("a", W6[..2].to_vec()), ("b", W6[2..].to_vec())],
        },
        Case {
            name: "concat axis -1, one operand twice",
            text: input("c", &[2, 1], &cc)
                + &input("d", &[2, 2], &cd)
                + &constant("w", &[2, 4], &W8)
                + "t = concat -1 c d c\ny = mul t w\n",
            out_shape: vec![2, 4],
            out: {
                let t = [cc[0], cd[0], cd[1], cc[0], cc[1], cd[2], cd[3], cc[1]];
                (0..8).map(|q| t[q] * W8[q]).collect()
            },
            grads: vec![
                ("c", vec![W8[0] + W8[3], W8[4] + W8[7]]),
                ("d", vec![W8[1], W8[2], W8[5], W8[6]]),
            ],
        },
        Case {
            name: "concat axis -1",
            text: input("c", &[2, 1], &cc)
                + &input("d", &[2, 2], &cd)
                + &constant("w", &[2, 3], &W6)
                + "t = concat -1 c d\ny = mul t w\n",
            out_shape: vec![2, 3],
            out: (0..6).map(|q| cat1[q] * W6[q]).collect(),
            grads: vec![
                ("c", vec![W6[0], W6[3]]),
                ("d", vec![W6[1], W6[2], W6[4], W6[5]]),
            ],
        },
        Case {
            name: "slice",
            text: input("x", &[2, 4], &s8)
                + &constant("w", &[2, 2], &w4)
                + "t = slice x 1 1 3\ny = mul t w\n",
            out_shape: vec![2, 2],
            out: vec![2.0 * w4[0], 3.0 * w4[1], 6.0 * w4[2], 7.0 * w4[3]],
            grads: vec![("x", vec![0.0, w4[0], w4[1], 0.0, 0.0, w4[2], w4[3], 0.0])],
        },
        Case {
            name: "slice axis 0, negative",
            text: input("x", &[2, 4], &s8) + "y = slice x -2 1 2\n",
            out_shape: vec![1, 4],
            out: vec![5.0, 6.0, 7.0, 8.0],
            grads: vec![("x", vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])],
        },
    ]
}

fn leaf_cases() -> Vec<Case> {
    vec![
        Case {
            name: "scalar input",
            text: "s = input : 2.5\ny = powf s 3\n".into(),
            out_shape: vec![],
            out: vec![15.625],
            grads: vec![("s", vec![18.75])],
        },
        Case {
            name: "const leaves get no gradient; unused inputs get zeros",
            text: constant("c", &[2], &[3.0, -1.0])
                + &input("x", &[2], &[0.5, 2.0])
                + &input("u", &[3], &[1.0, 2.0, 3.0])
                + "y = mul c x\n",
            out_shape: vec![2],
            out: vec![1.5, -2.0],
            grads: vec![("x", vec![3.0, -1.0]), ("u", vec![0.0; 3])],
        },
        Case {
            name: "output is an input",
            text: input("x", &[2], &[0.5, 2.0]),
            out_shape: vec![2],
            out: vec![0.5, 2.0],
            grads: vec![("x", vec![1.0, 1.0])],
        },
        Case {
            // A comparison's mask is 0/1 in the program's dtype, which every op takes (the
            // engine's bool would refuse `neg`, as PyTorch's does).
            name: "a mask negated",
            text: input("x", &[3], &X)
                + &constant("z", &[3], &[0.0; 3])
                + "m = gt x z\nn = neg m\ny = mul n x\n",
            out_shape: vec![3],
            out: vec![-0.5, 0.0, -2.0],
            grads: vec![("x", vec![-1.0, 0.0, -1.0])],
        },
        Case {
            name: "a chain with a shared operand",
            // y = tanh(x)·x + x: dy/dx = (1 − tanh²x)·x + tanh x + 1.
            text: input("x", &[3], &X) + "t = tanh x\np = mul t x\ny = add p x\n",
            out_shape: vec![3],
            out: map(&X, |v| v.tanh() * v + v),
            grads: vec![(
                "x",
                map(&X, |v| (1.0 - v.tanh() * v.tanh()) * v + v.tanh() + 1.0),
            )],
        },
    ]
}

/// The rows of the format's op table added after the first thirteen (`table/`), each against values PyTorch 2.15 printed for
/// the same program (float64; `scripts/torch_char_gpt.py`'s torch, run by hand): the op, then a
/// product with constant weights so that the gradients are not all ones.
fn table_cases() -> Vec<Case> {
    let m = input("m", &[2, 3], &M);
    let mc = constant("mc", &[2, 3], &M);
    let w6 = constant("w", &[2, 3], &W6);
    let wb = constant("w", &[2], &B);
    let wx = constant("w", &[3], &X);
    let wa = constant("w", &[2, 2], &A);
    let k = constant("k", &[3], &[0.0, 1.0, 0.0]);
    let q = input("q", &[2, 3], &M);
    let kk = input("kk", &[2, 3], &W6);
    let v = input("v", &[2, 3], &[0.5, -1.0, 2.0, 1.5, 0.25, 1.0]);
    let xi = input("x", &[3], &X);
    let idx = constant("idx", &[3], &[2.0, 0.0, 1.0]);
    let tt = input("tt", &[3, 2], &[0.5, -1.0, 2.0, 3.25, 1.5, -2.0]);
    vec![
        Case {
            name: "cumsum",
            text: format!("{m}{w6}y = cumsum m 1\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![0.25, -9.0, 18.0, 3.0, 6.0, -4.0],
            grads: vec![("m", vec![0.75, 0.5, 2.0, 3.25, 2.5, -0.5])],
        },
        Case {
            name: "logsumexp",
            text: format!("{m}{wb}y = logsumexp m -1\nz = mul y w\n"),
            out_shape: vec![2],
            out: vec![7.71439744274985, -12.254446883802812],
            grads: vec![(
                "m",
                vec![
                    0.02381435996470014,
                    1.3002199982960017,
                    0.17596564173929746,
                    -0.23833542200400765,
                    -0.0005907744460691285,
                    -1.7610738035499232,
                ],
            )],
        },
        Case {
            name: "min",
            text: format!("{m}{wx}y = min m 0\nz = mul y w\n"),
            out_shape: vec![3],
            out: vec![0.5, 2.0, 6.0],
            grads: vec![("m", vec![0.5, -0.0, 2.0, 0.0, -1.0, 0.0])],
        },
        Case {
            name: "max_dim",
            text: format!("{m}{wb}y = max_dim m 1\nz = mul y w\n"),
            out_shape: vec![2],
            out: vec![7.5, -12.0],
            grads: vec![("m", vec![0.0, 1.5, 0.0, 0.0, 0.0, -2.0])],
        },
        Case {
            name: "norm",
            text: format!("{m}{wb}y = norm m 2 1\nz = mul y w\n"),
            out_shape: vec![2],
            out: vec![8.874119674649425, -14.966629547095765],
            grads: vec![(
                "m",
                vec![
                    0.253546276418555,
                    1.267731382092775,
                    0.760638829255665,
                    -1.0690449676496976,
                    0.5345224838248488,
                    -1.6035674514745464,
                ],
            )],
        },
        Case {
            name: "norm_inf",
            text: format!("{m}{wx}y = norm m inf 0\nz = mul y w\n"),
            out_shape: vec![3],
            out: vec![2.0, -5.0, 12.0],
            grads: vec![("m", vec![0.0, -1.0, 0.0, 0.5, 0.0, 2.0])],
        },
        Case {
            name: "clamp",
            text: format!("{m}{w6}y = clamp m 0 4.5\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![0.25, -6.75, 6.0, 3.0, 0.0, -2.25],
            grads: vec![("m", vec![0.25, 0.0, 2.0, 0.75, 0.0, 0.0])],
        },
        Case {
            name: "tril",
            text: format!("{m}{w6}y = tril m 0\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![0.25, -0.0, 0.0, 3.0, -6.0, -0.0],
            grads: vec![("m", vec![0.25, 0.0, 0.0, 0.75, 3.0, 0.0])],
        },
        Case {
            name: "triu",
            text: format!("{m}{w6}y = triu m 1\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![0.0, -7.5, 6.0, 0.0, 0.0, -3.0],
            grads: vec![("m", vec![0.0, -1.5, 2.0, 0.0, 0.0, -0.5])],
        },
        Case {
            name: "masked_fill",
            text: format!("{m}{w6}{k}y = masked_fill m k -1\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![0.25, 1.5, 6.0, 3.0, -3.0, -3.0],
            grads: vec![("m", vec![0.25, 0.0, 2.0, 0.75, 0.0, -0.5])],
        },
        Case {
            name: "layer_norm",
            text: format!("{m}{w6}y = layer_norm m 1 0.00001\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![
                -0.30618564375035345,
                -1.8371138625021208,
                0.0,
                0.294174075420444,
                -4.118437055886217,
                -0.49029012570074004,
            ],
            grads: vec![(
                "m",
                vec![
                    -0.5358228672273664,
                    -0.5358268858988707,
                    1.0716497531262372,
                    0.0678861814914622,
                    -0.01697107865478442,
                    -0.05091510283667755,
                ],
            )],
        },
        Case {
            name: "rms_norm",
            text: format!("{m}{w6}y = rms_norm m 1 0.000001\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![
                0.07319250233431854,
                -2.1957750700295557,
                1.756620056023645,
                0.6943650562303498,
                -1.3887301124606997,
                -0.6943650562303498,
            ],
            grads: vec![(
                "m",
                vec![
                    0.0836485732001294,
                    -0.3868746596768569,
                    0.6169082312719809,
                    0.27278626677647655,
                    0.6447675548709053,
                    0.033064994706608675,
                ],
            )],
        },
        Case {
            name: "stack",
            text: format!("{m}{w6}y = stack m m 1\nz = mul y w\n"),
            out_shape: vec![2, 2, 3],
            out: vec![
                0.25, -7.5, 6.0, 0.75, 15.0, -1.5, 1.0, 3.0, 12.0, 3.0, -6.0, -3.0,
            ],
            grads: vec![("m", vec![1.0, 1.5, 1.5, 1.0, 1.5, 1.5])],
        },
        Case {
            name: "slice_step",
            text: format!("{m}{wa}y = slice_step m 1 0 3 2\nz = mul y w\n"),
            out_shape: vec![2, 2],
            out: vec![0.5, -3.0, 8.0, 19.5],
            grads: vec![("m", vec![0.5, 0.0, -1.0, 2.0, 0.0, 3.25])],
        },
        Case {
            name: "chunk",
            text: format!("{m}y = chunk m 2 1 1\n"),
            out_shape: vec![2, 1],
            out: vec![3.0, 6.0],
            grads: vec![("m", vec![0.0, 0.0, 1.0, 0.0, 0.0, 1.0])],
        },
        Case {
            name: "split",
            text: format!("{m}{wa}y = split m 2 1 0\nz = mul y w\n"),
            out_shape: vec![2, 2],
            out: vec![0.5, -5.0, 8.0, -6.5],
            grads: vec![("m", vec![0.5, -1.0, 0.0, 2.0, 3.25, 0.0])],
        },
        Case {
            name: "unbind",
            text: format!("{m}{wx}y = unbind m 0 1\nz = mul y w\n"),
            out_shape: vec![3],
            out: vec![2.0, 2.0, 12.0],
            grads: vec![("m", vec![0.0, 0.0, 0.0, 0.5, -1.0, 2.0])],
        },
        Case {
            name: "flip",
            text: format!("{m}{w6}y = flip m 1\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![0.75, -7.5, 2.0, 4.5, -6.0, -2.0],
            grads: vec![("m", vec![2.0, -1.5, 0.25, -0.5, 3.0, 0.75])],
        },
        Case {
            name: "roll",
            text: format!("{m}{w6}y = roll m 1 1\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![0.75, -1.5, 10.0, 4.5, 12.0, 1.0],
            grads: vec![("m", vec![-1.5, 2.0, 0.25, 3.0, -0.5, 0.75])],
        },
        Case {
            name: "repeat",
            text: format!(
                "{m}{}y = repeat m 2 1\nz = mul y w\n",
                constant(
                    "w",
                    &[4, 3],
                    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, -2.0, -3.0, 0.5, 0.25, -0.75]
                )
            ),
            out_shape: vec![4, 3],
            out: vec![
                1.0, 10.0, 9.0, 16.0, -10.0, 36.0, -1.0, -10.0, -9.0, 2.0, -0.5, -4.5,
            ],
            grads: vec![("m", vec![0.0, 0.0, 0.0, 4.5, 5.25, 5.25])],
        },
        Case {
            name: "sort",
            text: format!("{m}{w6}y = sort m 1 1\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![1.25, -4.5, 2.0, 4.5, 12.0, 1.0],
            grads: vec![("m", vec![2.0, 0.25, -1.5, 3.0, -0.5, 0.75])],
        },
        Case {
            name: "topk",
            text: format!("{m}{wa}y = topk m 2 1 1\nz = mul y w\n"),
            out_shape: vec![2, 2],
            out: vec![2.5, -3.0, 12.0, 13.0],
            grads: vec![("m", vec![0.0, 0.5, -1.0, 3.25, 0.0, 2.0])],
        },
        // PyTorch's `torch.topk(m, 2, 1, largest=False)`: the smallest first.
        Case {
            name: "topk_smallest",
            text: format!("{m}{wa}y = topk m 2 1 0\nz = mul y w\n"),
            out_shape: vec![2, 2],
            out: vec![0.5, -3.0, -4.0, 13.0],
            grads: vec![("m", vec![0.5, 0.0, -1.0, 3.25, 2.0, 0.0])],
        },
        Case {
            name: "arange",
            text: format!("{mc}{xi}y = arange mc 0 3 1\nz = mul y x\n"),
            out_shape: vec![3],
            out: vec![0.0, -1.0, 4.0],
            grads: vec![("x", vec![0.0, 1.0, 2.0])],
        },
        Case {
            name: "attention",
            text: format!("{q}{kk}{v}{w6}y = attention q kk v 0\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![
                0.37496753517626125,
                -0.3747565138219589,
                2.0002597185899105,
                0.37500228443680106,
                -2.9999885778159943,
                -0.9999984770421325,
            ],
            grads: vec![
                (
                    "q",
                    vec![
                        -0.00013587327005621757,
                        -0.0012228594305056508,
                        0.0006793663502808215,
                        4.396387282430224e-06,
                        3.9567485542332004e-05,
                        -2.1981936412549774e-05,
                    ],
                ),
                (
                    "kk",
                    vec![
                        0.00023657544185213443,
                        0.00137631824969165,
                        0.0007624829729466699,
                        -0.00023657544185270706,
                        -0.0013763182496918144,
                        -0.0007624829729476518,
                    ],
                ),
                (
                    "v",
                    vec![
                        0.7500301803869377,
                        2.9997960733103626,
                        -0.49973875845222204,
                        0.24996981961306228,
                        -1.4997960733103628,
                        1.9997387584522222,
                    ],
                ),
            ],
        },
        Case {
            name: "attention_causal",
            text: format!("{q}{kk}{v}{w6}y = attention q kk v 1\nz = mul y w\n"),
            out_shape: vec![2, 3],
            out: vec![
                0.125,
                1.5,
                4.0,
                0.37500228443680106,
                -2.9999885778159943,
                -0.9999984770421325,
            ],
            grads: vec![
                (
                    "q",
                    vec![
                        0.0,
                        0.0,
                        0.0,
                        4.396387282430224e-06,
                        3.9567485542332004e-05,
                        -2.1981936412549774e-05,
                    ],
                ),
                (
                    "kk",
                    vec![
                        -3.517109826017777e-05,
                        1.7585549130088886e-05,
                        -5.275664739026666e-05,
                        3.5171098259687116e-05,
                        -1.7585549129843558e-05,
                        5.275664738953068e-05,
                    ],
                ),
                (
                    "v",
                    vec![
                        0.9999977155631988,
                        1.4999908622527953,
                        1.5000015229578674,
                        2.2844368010935748e-06,
                        9.137747204374299e-06,
                        -1.5229578673957167e-06,
                    ],
                ),
            ],
        },
        Case {
            name: "one_hot",
            text: format!("{idx}{tt}y = one_hot idx 3\nz = matmul y tt\n"),
            out_shape: vec![3, 2],
            out: vec![1.5, -2.0, 0.5, -1.0, 2.0, 3.25],
            grads: vec![("tt", vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0])],
        },
        Case {
            name: "conv2d",
            text: "x = input 2 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 -1.25 0.5\nk = input 4 1 2 2 : -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625 0.0 0.625 -0.125 0.5\nw = const 4 2 2 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0\ny = conv2d x k 2 1 2 2\nz = mul y w\n".to_string(),
            out_shape: vec![4, 2, 2],
            out: vec![-0.234375, 0.46875, 0.0, 0.9375, -0.5625, 0.140625, 0.1875, -0.9375, 0.9375, 0.0, -0.75, -1.875, -0.5, -0.3125, 1.25, 1.25],
            grads: vec![("x", vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.3125, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0]), ("k", vec![-1.5, -0.375, 0.75, 1.875, -1.875, -0.75, 0.375, 1.5, -2.5, 4.0, 0.0, -1.5, -2.0, 4.0, 0.5, -1.5])],
        },
        Case {
            name: "conv_transpose2d",
            text: "x = input 1 2 2 2 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0\nk = input 2 3 3 3 : -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5\nw = const 1 3 4 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0\ny = conv_transpose2d x k 2 1 1 1 1\nz = mul y w\n".to_string(),
            out_shape: vec![1, 3, 4, 4],
            out: vec![1.875, -0.09375, 0.3125, -0.4375, -1.6875, 0.484375, -0.1875, 1.09375, 1.125, 0.0, 0.9375, 0.78125, -0.1875, 0.484375, -0.9375, -0.625, 0.4375, -0.0625, 1.484375, 0.375, 0.0, -0.84375, 0.15625, 0.125, -0.34375, 0.625, -1.5625, 0.078125, 0.25, -0.46875, 0.46875, 0.0, 1.078125, 0.546875, 0.125, -0.140625, 1.4375, 1.0, -0.03125, 0.0, 0.15625, -0.796875, -0.0, 0.0, -0.78125, -0.03125, -0.078125, 1.25],
            grads: vec![("x", vec![-2.4375, 2.3125, -1.0, 2.4375, 0.5, -0.4375, -0.8125, -5.4375]), ("k", vec![-0.625, 2.25, 3.375, -0.5, 6.0, -0.875, 0.375, 6.0, -0.875, 1.875, -3.125, -2.0, 3.0, -0.875, -3.625, 3.875, -3.625, -3.625, -2.5, -1.625, 2.25, -3.125, -3.625, 6.0, -2.25, -0.875, 6.0, 0.0, -2.0, -0.5, 0.75, -2.5, -1.75, 0.375, -2.25, -1.5, 0.0, 0.0, 1.5, -0.75, -1.5, 3.375, -1.125, 2.875, 3.625, 0.0, 2.0, -2.0, 1.875, 3.625, -2.5, 1.5, -1.625, -2.25])],
        },
        Case {
            name: "conv_transpose2d_groups",
            text: "x = input 2 4 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 -1.25 0.5 -0.5 1.25\nk = input 4 1 2 2 : -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625 0.0 0.625 -0.125 0.5\nw = const 2 2 5 6 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0\ny = conv_transpose2d x k 1 0 1 2 2\nz = mul y w\n".to_string(),
            out_shape: vec![2, 2, 5, 6],
            out: vec![-3.203125, 0.3125, -0.21875, 0.0, -0.5, -0.0, -0.40625, -0.703125, 0.515625, 0.0, 0.46875, -0.0, 0.40625, 0.15625, -1.8125, 0.125, -0.21875, 0.0, 2.65625, -0.09375, -0.0, 0.09375, -1.40625, -0.0, 0.0, 0.0, -0.0, -0.0, 0.0, 0.0, -0.1875, -0.0, 0.09375, 0.9375, 0.15625, 0.0, 0.125, 0.375, 0.015625, -0.40625, -0.46875, -0.0, 0.0, 0.09375, 0.625, 0.1875, -0.203125, 0.0, -0.125, -0.03125, -0.21875, -0.390625, 0.5625, 0.0, 0.0, -0.0, -0.0, 0.0, 0.0, -0.0, 0.09375, -0.40625, -0.078125, 0.28125, 0.0, 0.0, 0.390625, 0.375, 0.03125, -0.25, -0.25, -0.0, -0.6875, 2.65625, -0.75, -0.0, 0.09375, -0.0, 0.9375, 0.40625, 0.75, 0.625, -0.09375, 0.0, 0.0, -0.0, 0.0, 0.0, -0.0, -0.0, 0.15625, 0.125, 0.6875, 0.140625, -0.40625, 0.0, -0.375, 0.0, -0.65625, 0.78125, -1.28125, 0.0, 0.125, -0.125, 0.171875, -0.28125, -0.390625, -0.0, 0.0, 0.09375, 1.640625, 0.25, 0.625, 0.0, -0.0, -0.0, 0.0, 0.0, -0.0, 0.0],
            grads: vec![("x", vec![0.6875, 1.1875, 1.0, 0.9375, -2.6875, 1.25, -2.5, -0.0625, 1.6875, 1.8125, 0.125, -0.1875, 0.4375, 2.0625, 0.25, -0.125, -2.625, -0.3125, -0.3125, -2.25, -0.0625, 0.4375, 1.9375, 0.6875, 1.125, 0.9375, -2.6875, 0.6875, 1.1875, 1.0, 0.0625, 1.8125, 0.125, -2.5, -0.0625, 1.6875, 1.6875, -0.125, -2.625, 0.4375, 2.0625, 0.25, -1.75, 0.4375, 1.9375, -0.3125, -2.25, -0.0625]), ("k", vec![8.375, -3.125, 6.75, -3.375, 2.0, -2.75, 1.0, 3.125, 2.25, 1.5, 1.875, -8.5, 6.375, 0.0, -3.0, -6.625])],
        },
        Case {
            name: "repeat_interleave",
            text: "m = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 2 6 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = repeat_interleave m 2 1\nz = mul y w\n".to_string(),
            out_shape: vec![2, 6],
            out: vec![3.125, 1.25, 0.25, 1.0, 1.0, 0.25, 1.25, 3.125, -0.375, 0.0, -1.125, 1.875],
            grads: vec![("m", vec![-3.5, 2.5, -2.5, 3.5, -1.5, -1.0])],
        },
        Case {
            name: "unsqueeze",
            text: "m = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 2 3 1 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\ny = unsqueeze m -1\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3, 1],
            out: vec![3.125, -0.5, -0.25, 2.5, -0.5, 0.375],
            grads: vec![("m", vec![-2.5, -1.0, 0.5, 2.0, -2.0, -0.5])],
        },
        Case {
            name: "squeeze",
            text: "u = input 1 3 : -1.25 0.0 1.25\nw = const 3 : -2.5 -1.0 0.5\ny = squeeze u 0\nz = mul y w\n".to_string(),
            out_shape: vec![3],
            out: vec![3.125, -0.0, 0.625],
            grads: vec![("u", vec![-2.5, -1.0, 0.5])],
        },
        Case {
            name: "squeeze_keeps_other_extents",
            text: "m = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\ny = squeeze m 1\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![3.125, -0.5, -0.25, 2.5, -0.5, 0.375],
            grads: vec![("m", vec![-2.5, -1.0, 0.5, 2.0, -2.0, -0.5])],
        },
        Case {
            name: "where",
            text: "c = const 2 1 : 0.0 1.5\na = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 3 : 0.625 -0.125 0.5\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\ny = where c a b\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![-1.5625, 0.125, 0.25, 2.5, -0.5, 0.375],
            grads: vec![("a", vec![0.0, 0.0, 0.0, 2.0, -2.0, -0.5]), ("b", vec![-2.5, -1.0, 0.5])],
        },
        Case {
            name: "pad",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 3 6 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5\ny = pad a 1.5 2 1 1 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 6],
            out: vec![-3.75, -1.5, 0.75, 3.0, -3.0, -0.75, 1.5, 3.75, 1.875, 0.0, -0.75, -3.75, -1.5, 0.75, 2.5, -0.5, -2.25, -3.75],
            grads: vec![("a", vec![-1.5, 0.0, 1.5, 2.0, -2.0, 3.0])],
        },
        Case {
            name: "pad_reflect",
            text: "a = input 2 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0\nw = const 3 7 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0\ny = pad_reflect a 2 1 1 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 7],
            out: vec![-2.5, 0.75, 0.125, -1.5, -2.0, -0.0, 1.0, -1.25, -0.75, -0.0, 0.75, 1.25, -1.25, -0.25, 2.0, 1.5, 0.75, 1.875, -1.0, 0.0, 2.0],
            grads: vec![("a", vec![0.0, 0.0, 0.5, -1.0, 3.5, -3.5, -0.5, 0.0])],
        },
        Case {
            name: "pad_replicate",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 2 7 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5\ny = pad_replicate a 3 1\nz = mul y w\n".to_string(),
            out_shape: vec![2, 7],
            out: vec![3.125, 1.25, -0.625, -2.5, -1.0, 0.25, -0.5, 3.125, -1.875, 0.0, 1.875, -0.625, 0.75, -0.375],
            grads: vec![("a", vec![-1.0, -2.0, 0.5, 2.5, -2.5, -0.5])],
        },
        Case {
            name: "pad_circular",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 6 7 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5\ny = pad_circular a 1 3 2 2\nz = mul y w\n".to_string(),
            out_shape: vec![6, 7],
            out: vec![1.25, 1.25, 0.25, -1.0, 2.5, -0.25, -0.5, -1.875, -1.875, 0.0, -1.125, -3.125, -0.25, -0.375, -1.0, 2.5, 1.5, 1.25, 1.25, 0.25, -1.0, 1.5, -0.625, 0.25, -1.875, -1.875, 0.0, -1.125, 1.25, 1.25, 0.25, -1.0, 2.5, 1.5, 1.25, 0.75, 0.625, 0.5, 1.5, -0.625, 0.25, -1.875],
            grads: vec![("a", vec![-9.0, 7.0, -1.0, -6.0, 3.0, 6.0])],
        },
        Case {
            name: "interpolate_nearest",
            text: "a = input 1 2 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nw = const 1 2 3 5 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0\ny = interpolate_nearest a 3 5\nz = mul y w\n".to_string(),
            out_shape: vec![1, 2, 3, 5],
            out: vec![3.125, 1.25, 0.25, 1.0, 1.0, 0.625, -1.25, 1.25, -0.75, -0.0, 1.875, -3.125, -0.25, 0.125, -1.5, -2.0, 3.0, -0.0, -0.0, -0.5, 2.0, -2.0, -0.0, 0.0, -2.5, -1.125, 0.0, -0.375, 0.625, -0.625],
            grads: vec![("a", vec![-3.0, 3.5, -2.0, -1.0, -0.5, 2.0, 1.0, -3.0, 3.0, -1.5, -1.0, -1.0])],
        },
        Case {
            name: "interpolate_nearest_down",
            text: "a = input 1 1 4 5 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375 -1.25 0.5 -0.5 1.25 0.25\nw = const 1 1 3 2 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\ny = interpolate_nearest a 3 2\nz = mul y w\n".to_string(),
            out_shape: vec![1, 1, 3, 2],
            out: vec![3.125, 0.5, -0.375, 0.0, 0.5, -0.75],
            grads: vec![("a", vec![-2.5, 0.0, -1.0, 0.0, 0.0, 0.5, 0.0, 2.0, 0.0, 0.0, -2.0, 0.0, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])],
        },
        Case {
            name: "interpolate_bilinear",
            text: "a = input 1 1 3 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0\nw = const 1 1 2 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5\ny = interpolate_bilinear a 2 4 0\nz = mul y w\n".to_string(),
            out_shape: vec![1, 1, 2, 4],
            out: vec![1.5625, -0.0390625, 0.03125, -1.125, -2.125, -0.21875, -0.3125, -2.34375],
            grads: vec![("a", vec![-2.15625, -0.234375, 1.640625, -1.265625, 0.0, 1.265625, -1.640625, 0.234375, 2.15625])],
        },
        Case {
            name: "interpolate_bilinear_corners",
            text: "a = input 1 2 3 2 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nw = const 1 2 4 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0\ny = interpolate_bilinear a 4 3 1\nz = mul y w\n".to_string(),
            out_shape: vec![1, 2, 4, 3],
            out: vec![3.125, 0.375, 0.25, -1.5, -0.25, -0.5, -0.25000000000000006, 0.4166666666666669, -0.8750000000000002, 0.0, -0.375, 1.875, -1.0, 0.25, 0.0, 0.6666666666666665, 0.25000000000000006, -1.25, 0.75, -0.010416666666666692, 1.4166666666666665, 0.5, -0.09375, 0.625],
            grads: vec![("a", vec![-2.6666666666666665, -0.5, 2.166666666666667, -1.1666666666666667, 1.4999999999999998, -1.8333333333333333, -0.9166666666666667, 1.9166666666666665, -0.8333333333333333, 0.8333333333333337, -2.5, 1.4999999999999998])],
        },
        // By factors, PyTorch's `F.interpolate(a, scale_factor=(1.5, 2.5))`: rows ⌊d/1.5⌋, columns ⌊d·f32(0.4)⌋.
        Case {
            name: "interpolate_nearest_scale",
            text: "a = input 1 1 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 1 1 3 7 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0\ny = interpolate_nearest_scale a 1.5 2.5\nz = mul y w\n".to_string(),
            out_shape: vec![1, 1, 3, 7],
            out: vec![3.125, 1.25, -0.625, 1.0, -1.0, 0.25, -0.5, -3.125, 1.875, -0.0, 0.75, -1.25, 0.5, -0.25, 2.5, -2.5, 3.75, -0.625, -0.25, -0.375, -1.5],
            grads: vec![("a", vec![-2.0, -1.0, 0.0, 3.0, -3.5, 2.5])],
        },
        // Down and up by factors, positions mapped by 1/0.75 and 1/1.5 (not 3/2 and 4/6): `F.interpolate`'s values.
        Case {
            name: "interpolate_bilinear_scale",
            text: "a = input 1 1 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nw = const 1 1 2 6 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = interpolate_bilinear_scale a 0.75 1.5 0\nz = mul y w\n".to_string(),
            out_shape: vec![1, 1, 2, 6],
            out: vec![2.5, 0.35416666666666674, 0.10069444444444448, -0.3194444444444444, -0.7916666666666666, -0.5208333333333334, -0.375, -0.46875000000000006, -0.09374999999999992, 0.0, 0.515625, -0.78125],
            grads: vec![("a", vec![-2.5, 0.2083333333333336, 0.6249999999999999, -1.2500000000000002, 0.6250000000000001, 0.04166666666666652, 0.37500000000000006, -1.125, 1.125, -2.220446049250313e-16, 0.2500000000000001, -0.875])],
        },
        // With align_corners the factors set the size only: positions by (in − 1)/(out − 1).
        Case {
            name: "interpolate_bilinear_scale_corners",
            text: "a = input 1 2 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nw = const 1 2 3 5 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0\ny = interpolate_bilinear_scale a 1.5 1.75 1\nz = mul y w\n".to_string(),
            out_shape: vec![1, 2, 3, 5],
            out: vec![3.125, 0.375, 0.25, 0.0, 1.0, -0.0, 0.1875, 0.9375, 0.1875, -0.0, 1.875, -1.875, -0.25, -0.125, -1.5, -2.0, 1.5, -0.0, 0.5, -0.5, 1.75, -0.75, 0.0625, -0.15625, -0.46875, -1.125, 0.0, -0.375, -0.46875, -0.625],
            grads: vec![("a", vec![-3.0, 2.125, -1.375, 0.25, -0.875, 1.875, 0.0, -2.0, 1.5, -1.0, -0.25, -0.75])],
        },
        // Sound, PyTorch's `F.interpolate(a, size=7)` of `[1, 2, 3]`: entries ⌊d·3/7⌋.
        Case {
            name: "interpolate_nearest1d",
            text: "a = input 1 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 1 2 7 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5\ny = interpolate_nearest1d a 7\nz = mul y w\n".to_string(),
            out_shape: vec![1, 2, 7],
            out: vec![3.125, 1.25, -0.625, 1.0, -1.0, 0.25, -0.5, 3.125, -1.875, 0.0, 0.375, -0.625, 0.75, -0.375],
            grads: vec![("a", vec![-3.0, 0.0, 0.5, 1.0, -1.0, -0.5])],
        },
        // `F.interpolate(a, size=6, mode="linear")`: centres, src = (d + 0.5)·4/6 − 0.5 clamped at 0.
        Case {
            name: "interpolate_linear",
            text: "a = input 2 1 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0\nw = const 2 1 6 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = interpolate_linear a 6 0\nz = mul y w\n".to_string(),
            out_shape: vec![2, 1, 6],
            out: vec![3.125, 0.375, 0.16666666666666674, -0.6666666666666665, -0.75, -0.625, 0.25, -0.6249999999999999, 0.6875000000000004, 0.0, 0.75, -0.0],
            grads: vec![("a", vec![-3.0, 0.2500000000000003, 0.7499999999999998, -1.5, 2.25, -4.440892098500626e-16, 0.5000000000000002, -1.75])],
        },
        // By a factor: ⌊4·1.75⌋ = 7 entries, positions by 1/1.75.
        Case {
            name: "interpolate_nearest1d_scale",
            text: "a = input 1 2 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0\nw = const 1 2 7 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5\ny = interpolate_nearest1d_scale a 1.75\nz = mul y w\n".to_string(),
            out_shape: vec![1, 2, 7],
            out: vec![3.125, 1.25, 0.25, 1.0, 1.0, 0.25, 1.25, 0.625, -0.375, -0.0, -1.125, -2.5, -1.0, 0.0],
            grads: vec![("a", vec![-3.5, 2.5, -2.5, 1.0, 1.0, 1.5, -3.5, 0.5])],
        },
        // With align_corners the factor sets the length only: positions by (4 − 1)/(6 − 1).
        Case {
            name: "interpolate_linear_scale",
            text: "a = input 1 1 4 : -1.25 0.5 -0.5 1.25\nw = const 1 1 6 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\ny = interpolate_linear_scale a 1.5 1\nz = mul y w\n".to_string(),
            out_shape: vec![1, 1, 6],
            out: vec![3.125, 0.20000000000000004, 0.15000000000000002, -0.5999999999999996, -0.3999999999999997, -0.625],
            grads: vec![("a", vec![-2.9, 0.2000000000000004, 0.49999999999999956, -1.2999999999999998])],
        },
        Case {
            name: "adaptive_avg_pool2d",
            text: "a = input 1 2 3 5 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375\nw = const 1 2 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = adaptive_avg_pool2d a 2 3\nz = mul y w\n".to_string(),
            out_shape: vec![1, 2, 2, 3],
            out: vec![0.3125, -0.20833333333333334, 0.15625, 0.3125, -0.20833333333333334, 0.171875, -0.125, 0.5208333333333334, -0.46875, 0.0, 0.15625, 0.859375],
            grads: vec![("a", vec![-0.625, -0.7916666666666666, -0.16666666666666666, -0.04166666666666666, 0.125, -0.125, -0.625, -0.5, -0.5, 0.0, 0.5, 0.16666666666666669, -0.3333333333333333, -0.4583333333333333, -0.125, 0.25, 0.6666666666666667, 0.4166666666666667, 0.041666666666666685, -0.375, 0.25, 0.9166666666666667, 0.6666666666666667, -0.3333333333333333, -1.0, 0.0, 0.25, 0.25, -0.375, -0.625])],
        },
        Case {
            name: "adaptive_max_pool2d",
            text: "a = input 2 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0\nw = const 2 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = adaptive_max_pool2d a 2 3\nz = mul y w\n".to_string(),
            out_shape: vec![2, 2, 3],
            out: vec![-1.25, -1.0, 0.625, 1.5, -2.0, -0.5, 1.5, 3.125, -1.875, 0.0, 1.875, -3.125],
            grads: vec![("a", vec![0.0, -2.5, 0.0, 0.5, 0.0, 0.0, -3.5, 0.0, 0.0, 2.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])],
        },
        Case {
            name: "group_norm",
            text: "a = input 2 4 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0\nw = const 2 4 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0\ny = group_norm a 2 1e-05\nz = mul y w\n".to_string(),
            out_shape: vec![2, 4, 3],
            out: vec![3.482605339329944, -0.6965210678659887, -0.24875752423785313, 3.18409631024452, -0.79602407756113, 0.39801203878056507, 1.188371177704884, -0.6855987563682022, 2.605275274199169, 0.0, -0.9598382589154832, -1.5997304315258054, -1.5721515878010988, -0.646771222829566, 0.9950326505070245, 2.1094692190748923, 1.8507607299430657, 0.8457777529309709, -1.3619598544864238, 0.0756644363603569, -2.118604218089992, -2.118604218089992, 0.07566443636035684, -1.3619598544864238],
            grads: vec![("a", vec![-0.8127931496637341, -1.2354030851379636, 1.82060200936702, 1.3979920738927905, -2.1132014714815486, 0.9428036230234355, 1.0599547787407368, 3.4494245896454263, -2.2054643408367918, -0.3537674538798178, 2.0357023570248716, -3.985849930694425, -1.8518165441344987, 1.2153123554978538, 1.626733195414071, -1.308956162627525, 2.513869461446555, -2.1951423055964563, 0.6607368104586805, 0.813245245574454, 0.9657536806902273, -0.9657536806902273, -0.8132452455744539, -0.6607368104586805])],
        },
        Case {
            name: "instance_norm",
            text: "a = input 2 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nw = const 2 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = instance_norm a 1e-05\nz = mul y w\n".to_string(),
            out_shape: vec![2, 2, 3],
            out: vec![2.9061626925554913, -1.2787115847244162, -0.058123253851109835, 2.4494713718167804, -0.0, 0.6123678429541951, 1.2247356859083902, 0.0, 1.8371035288625852, 0.0, -2.107264840566858, -1.404843227044572],
            grads: vec![("a", vec![-1.2441683190170034, -0.9330957015852455, 2.1772640206022484, 1.1226973421990163, -2.245348757498715, 1.122651415299699, -1.122651415299699, 2.2453487574987157, -1.1226973421990163, 2.9673111670035484, 0.42410438947556145, -3.3914155564791097])],
        },
        Case {
            name: "conv1d",
            text: "x = input 2 3 5 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375\nk = input 2 3 2 : -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625\nw = const 2 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = conv1d x k 2 1 1 1\nz = mul y w\n".to_string(),
            out_shape: vec![2, 2, 3],
            out: vec![-0.390625, -0.25, -1.171875, 2.0, 0.46875, 0.3359375, 0.15625, 0.625, 3.515625, 0.0, -0.3515625, 1.6796875],
            grads: vec![("x", vec![-0.75, -0.125, 0.75, -0.5, 0.1875, -0.6875, -1.125, 1.125, 0.1875, 0.1875, -0.625, -0.75, 1.5, 0.1875, 0.1875, 0.0, -1.0, -0.5625, 0.0, 0.9375, -0.125, 1.9375, -1.0625, -1.5625, 1.4375, -0.25, 1.4375, -1.5625, -1.0625, 1.9375]), ("k", vec![-0.5, 0.875, 2.5, 0.375, 2.4375, 2.25, -4.0, -3.0, 2.5, -3.75, 4.1875, -2.375])],
        },
        Case {
            name: "conv1d_groups",
            text: "x = input 4 6 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5 -1.5 0.375 -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0\nk = input 2 2 2 : -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375\nw = const 2 6 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = conv1d x k 1 1 2 2\nz = mul y w\n".to_string(),
            out_shape: vec![2, 6],
            out: vec![-0.0, -1.53125, -0.203125, -0.5625, 0.78125, 0.15625, 0.28125, 3.515625, 1.078125, -0.0, 0.375, -0.625],
            grads: vec![("x", vec![0.625, -0.3125, -1.25, 1.25, 0.3125, 0.0, -0.625, 0.625, 1.375, -1.3125, -0.5625, 0.25, 1.25, -1.0, -0.625, 1.125, -1.25, -0.375, 0.9375, -0.9375, -0.9375, 1.125, -0.9375, -0.5625]), ("k", vec![-2.125, 1.875, -4.375, -0.375, 2.875, 0.5625, 4.25, -4.625])],
        },
        Case {
            name: "conv_transpose1d",
            text: "x = input 2 5 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75\nk = input 2 3 3 : -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375 -0.375 0.25 -0.5 0.125 -0.625 0.0 0.625 -0.125 0.5 -0.25 0.375\nw = const 3 10 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0 0.5 2.0 -2.0 3.0 -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5 -1.0\ny = conv_transpose1d x k 2 1 1 1 1\nz = mul y w\n".to_string(),
            out_shape: vec![3, 10],
            out: vec![0.234375, 1.125, 0.0625, 0.0, -0.0, 0.296875, -0.125, 2.1875, -0.140625, -0.0, -1.640625, -0.859375, -0.875, -0.09375, -0.5, 0.0625, 0.0, 0.546875, -0.59375, -0.078125, 1.3125, -0.1875, 0.21875, 0.3125, 0.46875, 0.234375, -0.0, 0.609375, 0.703125, -0.34375],
            grads: vec![("x", vec![-0.5, 1.25, -1.0625, 4.0625, -0.625, 0.3125, -1.875, -0.125, 0.8125, -1.125]), ("k", vec![-1.5, 5.25, 5.625, -4.625, 0.125, 1.375, -3.0, -4.625, 5.375, 1.375, 0.25, 0.25, -2.375, -5.875, 5.25, 0.625, -3.875, 0.25])],
        },
        Case {
            name: "gather",
            text: "i = const 2 3 : 3.0 0.0 0.0 1.0 2.0 1.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\ny = gather a i 1\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![-3.125, 1.25, -0.625, -1.5, -2.0, 0.375],
            grads: vec![("a", vec![-0.5, 0.0, 0.0, -2.5, 0.0, 1.5, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0])],
        },
        Case {
            name: "gather_axis0",
            text: "i = const 4 2 : 2.0 0.0 0.0 1.0 2.0 2.0 1.0 0.0\na = input 3 2 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 4 2 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5\ny = gather a i 0\nz = mul y w\n".to_string(),
            out_shape: vec![4, 2],
            out: vec![-0.625, -0.5, -0.625, 2.5, -0.5, 0.375, -0.5, 1.25],
            grads: vec![("a", vec![0.5, 1.5, 1.0, 2.0, -4.5, -0.5])],
        },
        Case {
            name: "index_select",
            text: "i = const 4 : 2.0 0.0 2.0 1.0\na = input 3 2 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nw = const 4 2 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5\ny = index_select a i 0\nz = mul y w\n".to_string(),
            out_shape: vec![4, 2],
            out: vec![-0.625, 0.75, -0.625, 1.0, -0.5, 0.375, -0.5, 3.125],
            grads: vec![("a", vec![0.5, 2.0, 1.0, 2.5, -4.5, -1.5])],
        },
        Case {
            name: "scatter_add",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 0.0 1.0 2.0 2.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_add a i s 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![1.25, -1.5, -0.25, 0.5, -0.5, 0.5, 1.0, 0.0, 2.625, 0.0, 0.5625, -5.3125],
            grads: vec![("a", vec![-2.5, -1.0, 0.5, 2.0, -2.0, -0.5, 1.0, 2.5, -1.5, 0.0, 1.5, -2.5]), ("s", vec![-1.5, -1.0, 1.5, 2.0, -2.5, -0.5, 1.5, -2.5])],
        },
        Case {
            name: "index_add",
            text: "i = const 4 : 0.0 2.0 0.0 1.0\na = input 3 2 : -1.25 0.5 -0.5 1.25 0.25 -0.75\ns = input 4 2 : 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25\nw = const 3 2 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\ny = index_add a i s 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 2],
            out: vec![-0.0, 0.25, 0.125, 2.0, 1.0, -0.125],
            grads: vec![("a", vec![-2.5, -1.0, 0.5, 2.0, -2.0, -0.5]), ("s", vec![-2.5, -1.0, -2.0, -0.5, -2.5, -1.0, 0.5, 2.0])],
        },
        Case {
            name: "scatter_reduce_sum_0",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 0 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -1.0, -0.25, 1.0, -0.5, 0.125, 0.625, 0.0, -0.0, 0.0, 0.0, -1.5625],
            grads: vec![("a", vec![-2.5, 0.0, 0.5, 0.0, -2.0, 0.0, 0.0, 2.5, 0.0, 0.0, 0.0, -2.5]), ("s", vec![-1.5, -1.0, 1.5, 2.0, -1.5, -0.5, 1.0, 2.0])],
        },
        Case {
            name: "scatter_reduce_sum_1",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 0 1\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -1.5, -0.25, 3.5, -0.5, 0.5, 1.625, 0.0, 1.5, 0.0, -0.375, -1.5625],
            grads: vec![("a", vec![-2.5, -1.0, 0.5, 2.0, -2.0, -0.5, 1.0, 2.5, -1.5, 0.0, 1.5, -2.5]), ("s", vec![-1.5, -1.0, 1.5, 2.0, -1.5, -0.5, 1.0, 2.0])],
        },
        Case {
            name: "scatter_reduce_mean_0",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 1 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -1.0, -0.25, 0.5, -0.5, 0.125, 0.625, 0.0, -0.0, 0.0, 0.0, -1.5625],
            grads: vec![("a", vec![-2.5, 0.0, 0.5, 0.0, -2.0, 0.0, 0.0, 2.5, 0.0, 0.0, 0.0, -2.5]), ("s", vec![-0.75, -1.0, 1.5, 1.0, -0.75, -0.5, 1.0, 1.0])],
        },
        Case {
            name: "scatter_reduce_mean_1",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 1 1\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -0.75, -0.25, 1.1666666666666667, -0.5, 0.25, 0.8125, 0.0, 0.5, 0.0, -0.1875, -1.5625],
            grads: vec![("a", vec![-2.5, -0.5, 0.5, 0.6666666666666666, -2.0, -0.25, 0.5, 2.5, -0.5, 0.0, 0.75, -2.5]), ("s", vec![-0.5, -0.5, 0.75, 0.6666666666666666, -0.5, -0.25, 0.5, 0.6666666666666666])],
        },
        Case {
            name: "scatter_reduce_amax_0",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 2 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -1.0, -0.25, 3.0, -0.5, 0.125, 0.625, 0.0, -1.125, 0.0, 0.0, -1.5625],
            grads: vec![("a", vec![-2.5, 0.0, 0.5, 0.0, -2.0, 0.0, 0.0, 2.5, 0.0, 0.0, 0.0, -2.5]), ("s", vec![-0.0, -1.0, 1.5, 0.0, -1.5, -0.5, 1.0, 2.0])],
        },
        Case {
            name: "scatter_reduce_amax_1",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 2 1\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -1.0, -0.25, 3.0, -0.5, 0.125, 1.0, 0.0, -1.125, 0.0, 0.0, -1.5625],
            grads: vec![("a", vec![-2.5, -0.0, 0.5, 0.0, -2.0, -0.0, 1.0, 2.5, -0.0, 0.0, 0.0, -2.5]), ("s", vec![-0.0, -1.0, 1.5, 0.0, -1.5, -0.5, 0.0, 2.0])],
        },
        Case {
            name: "scatter_reduce_amin_0",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 3 0\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -1.0, -0.25, -2.0, -0.5, 0.125, 0.625, 0.0, 1.125, 0.0, 0.0, -1.5625],
            grads: vec![("a", vec![-2.5, 0.0, 0.5, 0.0, -2.0, 0.0, 0.0, 2.5, 0.0, 0.0, 0.0, -2.5]), ("s", vec![-1.5, -1.0, 1.5, 2.0, -0.0, -0.5, 1.0, 0.0])],
        },
        Case {
            name: "scatter_reduce_amin_1",
            text: "i = const 2 4 : 2.0 0.0 2.0 0.0 2.0 1.0 1.0 0.0\na = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\ns = input 2 4 : -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625 1.5\nw = const 3 4 : -2.5 -1.0 0.5 2.0 -2.0 -0.5 1.0 2.5 -1.5 0.0 1.5 -2.5\ny = scatter_reduce a i s 0 3 1\nz = mul y w\n".to_string(),
            out_shape: vec![3, 4],
            out: vec![3.125, -0.5, -0.25, -2.0, -0.5, 0.375, 0.625, 0.0, 1.5, 0.0, -0.375, -1.5625],
            grads: vec![("a", vec![-2.5, -1.0, 0.5, 0.0, -2.0, -0.5, 0.0, 2.5, -1.5, 0.0, 1.5, -2.5]), ("s", vec![-0.0, -0.0, 0.0, 2.0, -0.0, -0.0, 1.0, 0.0])],
        },
    ]
}

/// `einsum` against `torch.einsum` in f64 (values PyTorch 2.15 printed, each output weighted
/// by `w` before the sum): a batched product with the output's axes reordered, a letter of one
/// operand alone summed first, an implicit outer product, ellipses broadcast (a batch of one)
/// and summed (with a contracted letter of extent 1 on one side), and attention scores of one
/// operand used twice (its gradient the sum of both uses).
fn einsum_cases() -> Vec<Case> {
    let a12 = [
        0.5, -1.0, 2.0, 1.5, 0.25, -2.0, 1.0, 3.0, -0.5, 2.5, -1.5, 0.75,
    ];
    let b12 = [
        1.0, -0.5, 0.25, 2.0, -1.0, 0.5, 1.5, -2.0, 0.75, -0.25, 1.0, 0.5,
    ];
    const W8S: [f64; 8] = [0.25, -1.5, 2.0, 0.75, 3.0, -0.5, 1.0, 2.0];
    vec![
        Case {
            name: "einsum_bmm_reordered",
            text: input("a", &[2, 2, 3], &a12)
                + &input("b", &[2, 3, 2], &b12)
                + &constant("w", &[2, 2, 2], &W8S)
                + "y = einsum a b bij,bjk->kbi\nz = mul y w\n",
            out_shape: vec![2, 2, 2],
            out: vec![-0.4375, -5.34375, 6.5, 2.53125, -3.75, 0.625, -3.0, -8.5],
            grads: vec![
                (
                    "a",
                    vec![
                        -1.25, 6.0625, 1.25, -1.25, -1.375, 1.25, 1.0, 1.25, 2.5, -2.875, 0.0625,
                        1.75,
                    ],
                ),
                (
                    "b",
                    vec![
                        -2.125, 0.75, -0.625, -3.125, 3.5, 7.0, 3.875, 6.0, 4.875, 0.0, -0.4375,
                        1.0,
                    ],
                ),
            ],
        },
        Case {
            name: "einsum_alone_summed",
            text: input("a", &[2, 3], &a12[..6])
                + &input("x", &[3], &X)
                + &constant("w", &[2], &B)
                + "y = einsum a x ij,k->i\nz = mul y w\n",
            out_shape: vec![2],
            out: vec![3.375, 0.75],
            grads: vec![
                ("a", vec![2.25, 2.25, 2.25, -3.0, -3.0, -3.0]),
                ("x", vec![2.75, 2.75, 2.75]),
            ],
        },
        Case {
            name: "einsum_outer_implicit",
            text: input("x", &[3], &X)
                + &input("v", &[2], &B)
                + &constant("w", &[3, 2], &W6)
                + "y = einsum x v i,j\nz = mul y w\n",
            out_shape: vec![3, 2],
            out: vec![0.1875, 1.5, -3.0, 1.5, 9.0, 2.0],
            grads: vec![("x", vec![3.375, 1.5, 5.5]), ("v", vec![4.125, -2.5])],
        },
        Case {
            name: "einsum_ellipsis_broadcast_batch",
            text: input("a", &[2, 2, 3], &a12)
                + &input("b", &[1, 3, 2], &b12[..6])
                + &constant("w", &[2, 2, 2], &W8S)
                + "y = einsum a b ...ij,...jk->...ik\nz = mul y w\n",
            out_shape: vec![2, 2, 2],
            out: vec![-0.4375, 1.875, 7.125, -0.9375, 6.75, -2.625, 1.375, -7.75],
            grads: vec![
                (
                    "a",
                    vec![
                        1.0, -2.9375, -1.0, 1.625, 2.0, -1.625, 3.25, -0.25, -3.25, 0.0, 4.25, 0.0,
                    ],
                ),
                ("b", vec![8.625, 4.875, 7.75, -2.8125, -4.25, -2.75]),
            ],
        },
        Case {
            name: "einsum_ellipsis_summed_contracted_extent_one",
            text: input("a", &[2, 3, 2], &a12)
                + &input("c", &[1, 1, 2], &B)
                + &constant("w", &[2, 1], &[0.5, -1.0])
                + "y = einsum a c ij...,jk...->ik\nz = mul y w\n",
            out_shape: vec![2, 1],
            out: vec![3.5625, 14.0],
            grads: vec![
                (
                    "a",
                    vec![
                        0.75, -1.0, 0.75, -1.0, 0.75, -1.0, -1.5, 2.0, -1.5, 2.0, -1.5, 2.0,
                    ],
                ),
                ("c", vec![2.375, -7.0]),
            ],
        },
        Case {
            name: "einsum_scores_of_one_operand",
            text: input("a", &[1, 2, 2, 3], &a12)
                + &constant("w", &[1, 2, 2, 2], &W8S)
                + "y = einsum a a bhqd,bhkd->bhqk\nz = mul y w\n",
            out_shape: vec![1, 2, 2, 2],
            out: vec![1.3125, 5.25, -7.0, 4.734375, 30.75, 1.1875, -2.375, 18.125],
            grads: vec![(
                "a",
                vec![
                    1.0, -0.375, 0.0, 2.5, -0.125, -2.0, 7.25, 17.25, -2.625, 10.5, -4.5, 2.75,
                ],
            )],
        },
    ]
}

/// The loss rows against PyTorch's `torch.nn.functional` losses, computed in f64 (the values
/// printed by PyTorch 2.15; class targets as `int64` tensors).
fn loss_cases() -> Vec<Case> {
    vec![
        Case {
            name: "mse_loss_none",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.5 -1.0 1.5 1.25 -0.25 0.25\ny = mse_loss a b 0\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![-7.65625, -2.25, 2.0, 0.0, -0.5, -0.5],
            grads: vec![("a", vec![8.75, -3.0, -2.0, 0.0, -2.0, 1.0]), ("b", vec![-8.75, 3.0, 2.0, 0.0, 2.0, -1.0])],
        },
        Case {
            name: "mse_loss_mean",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.5 -1.0 1.5 1.25 -0.25 0.25\ny = mse_loss a b 1\n".to_string(),
            out_shape: vec![],
            out: vec![1.7604166666666667],
            grads: vec![("a", vec![-0.5833333333333333, 0.5, -0.6666666666666666, 0.0, 0.16666666666666666, -0.3333333333333333]), ("b", vec![0.5833333333333333, -0.5, 0.6666666666666666, 0.0, -0.16666666666666666, 0.3333333333333333])],
        },
        Case {
            name: "l1_loss_sum",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.5 0.5 1.5 1.25 -0.25 0.25\ny = l1_loss a b 2\n".to_string(),
            out_shape: vec![],
            out: vec![5.25],
            grads: vec![("a", vec![-1.0, 0.0, -1.0, 0.0, 1.0, -1.0]), ("b", vec![1.0, -0.0, 1.0, -0.0, -1.0, 1.0])],
        },
        Case {
            name: "smooth_l1_loss_mean",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.5 -1.0 1.5 1.25 -0.25 0.25\ny = smooth_l1_loss a b 1 0.5\n".to_string(),
            out_shape: vec![],
            out: vec![0.9166666666666666],
            grads: vec![("a", vec![-0.16666666666666666, 0.16666666666666666, -0.16666666666666666, 0.0, 0.16666666666666666, -0.16666666666666666]), ("b", vec![0.16666666666666666, -0.16666666666666666, 0.16666666666666666, 0.0, -0.16666666666666666, 0.16666666666666666])],
        },
        Case {
            name: "smooth_l1_loss_beta_0",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.5 0.5 1.5 1.25 -0.25 0.25\ny = smooth_l1_loss a b 0 0.0\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![-4.375, -0.0, 1.0, 0.0, -1.0, -0.5],
            grads: vec![("a", vec![2.5, -0.0, -0.5, 0.0, -2.0, 0.5]), ("b", vec![-2.5, 0.0, 0.5, -0.0, 2.0, -0.5])],
        },
        Case {
            name: "huber_loss_none",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.5 -1.0 1.5 1.25 -0.25 0.25\ny = huber_loss a b 0 1.5\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![-3.75, -1.125, 0.9375, 0.0, -0.25, -0.25],
            grads: vec![("a", vec![3.75, -1.5, -0.75, 0.0, -1.0, 0.5]), ("b", vec![-3.75, 1.5, 0.75, 0.0, 1.0, -0.5])],
        },
        Case {
            name: "kl_div_batchmean",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.1 0.25 0.5 0.75 0.9 0.375\ny = kl_div a b 3 0\n".to_string(),
            out_shape: vec![],
            out: vec![-1.1165263390848132],
            grads: vec![("a", vec![-0.05, -0.125, -0.25, -0.375, -0.45, -0.1875]), ("b", vec![-0.02629254649702273, -0.4431471805599453, 0.40342640972002736, -0.26884103622589045, 0.32231974217108683, 0.3845853734941369])],
        },
        Case {
            name: "kl_div_mean_log_target",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.5 -1.0 1.5 1.25 -0.25 0.25\ny = kl_div a b 1 1\n".to_string(),
            out_shape: vec![],
            out: vec![2.031907704632705],
            grads: vec![("a", vec![-0.27478687845002137, -0.061313240195240384, -0.7469481783896774, -0.5817238262436402, -0.1298001305119008, -0.21400423611462355]), ("b", vec![0.7556639157375586, -0.0306566200976202, 2.2408445351690323, 0.5817238262436402, 0.0649000652559504, 0.4280084722292471])],
        },
        Case {
            name: "kl_div_none_zero_target",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = const 2 3 : 0.0 0.25 0.5 0.0 0.9 0.375\ny = kl_div a b 0 0\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![-0.0, 0.47157359027997264, -0.04828679513998632, 0.0, 0.6396489281840874, 0.04328048493969866],
            grads: vec![("a", vec![0.0, 0.25, -0.25, -0.0, 1.8, 0.1875])],
        },
        Case {
            name: "bce_none",
            text: "a = input 2 3 : 0.1 0.25 0.5 0.75 0.9 0.375\nb = input 2 3 : 0.0 1.0 0.5 0.25 0.9 0.125\ny = bce a b 0\nw = const 2 3 : -2.5 -1.0 0.5 2.0 -2.0 -0.5\nz = mul y w\n".to_string(),
            out_shape: vec![2, 3],
            out: vec![-0.2634012891445658, -1.3862943611198906, 0.34657359027997264, 2.223282577905726, -0.6501659467828964, -0.2669284161082422],
            grads: vec![("a", vec![-2.7777777777777772, 4.0, 0.0, 5.333333333333333, -0.0, -0.5333333333333333]), ("b", vec![-5.493061443340547, -1.0986122886681098, -0.0, -2.1972245773362196, 4.394449154672439, -0.25541281188299536])],
        },
        Case {
            name: "bce_with_logits_sum",
            text: "a = input 2 3 : -1.25 0.5 -0.5 1.25 0.25 -0.75\nb = input 2 3 : 0.625 0.05 0.95 0.2 0.8 0.4\ny = bce_with_logits a b 2\n".to_string(),
            out_shape: vec![],
            out: vec![5.496072557044703],
            grads: vec![("a", vec![-0.4022998611746912, 0.5724593312018545, -0.5724593312018545, 0.5772998611746911, -0.23782349911420197, -0.079178699175393]), ("b", vec![1.25, -0.5, 0.5, -1.25, -0.25, 0.75])],
        },
        Case {
            name: "cross_entropy_smoothing",
            text: "a = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nt = const 3 : 2.0 0.0 3.0\ny = cross_entropy a t 1 0.1 -100\n".to_string(),
            out_shape: vec![],
            out: vec![1.5931946387146396],
            grads: vec![("a", vec![0.007498898218654943, 0.08277486872288076, -0.27481649887475845, 0.18454273193322282, -0.23015361194164452, 0.020427378883180206, 0.1571731381516462, 0.052553094906818185, 0.015561492050436772, 0.12917189276279975, 0.042252012401064944, -0.1869853972143014])],
        },
        Case {
            name: "cross_entropy_ignore_none",
            text: "a = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nt = const 3 : 2.0 1.0 2.0\ny = cross_entropy a t 0 0.0 2\nw = const 3 : -2.5 -1.0 0.5\nz = mul y w\n".to_string(),
            out_shape: vec![3],
            out: vec![-0.0, -2.450132693633123, 0.0],
            grads: vec![("a", vec![0.0, 0.0, 0.0, 0.0, -0.2345391641750664, 0.9137178633504595, -0.49651941445493847, -0.1826592847204545, 0.0, 0.0, 0.0, 0.0])],
        },
        Case {
            name: "cross_entropy_ignore_mean",
            text: "a = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nt = const 3 : -100.0 1.0 3.0\ny = cross_entropy a t 1 0.25 -100\n".to_string(),
            out_shape: vec![],
            out: vec![1.695150629795466],
            grads: vec![("a", vec![0.0, 0.0, 0.0, 0.0, 0.0860195820875332, -0.36310893167522973, 0.21700970722746923, 0.06007964236022725, 0.004592238075655154, 0.17500783914419962, 0.0446280186015974, -0.2242280958214521])],
        },
        Case {
            name: "cross_entropy_spatial",
            text: "a = input 2 3 2 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nt = const 2 2 : 0.0 2.0 1.0 1.0\ny = cross_entropy a t 2 0.0 -100\n".to_string(),
            out_shape: vec![],
            out: vec![7.711216080868402],
            grads: vec![("a", vec![-0.8683983528530856, 0.2938147747114895, 0.278600689196273, 0.6220058829452726, 0.5897976636568126, -0.9158206576567622, 0.7033139760217739, 0.2005919076423478, -0.904816803850825, -0.5753469281887816, 0.20150282782905093, 0.37475502054643395])],
        },
        Case {
            name: "cross_entropy_one_sample",
            text: "a = input 4 : -1.25 0.5 -0.5 1.25\nt = const  : 3.0\ny = cross_entropy a t 1 0.0 -100\n".to_string(),
            out_shape: vec![],
            out: vec![0.5470951565529871],
            grads: vec![("a", vec![0.04749669465596482, 0.27332460616864224, 0.10055050337572466, -0.4213718042003316])],
        },
        Case {
            name: "nll_loss_sum",
            text: "a = input 3 4 : -1.25 0.5 -0.5 1.25 0.25 -0.75 1.0 0.0 -1.0 0.75 -0.25 0.625\nt = const 3 : 2.0 0.0 3.0\ny = nll_loss a t 2\n".to_string(),
            out_shape: vec![],
            out: vec![-0.375],
            grads: vec![("a", vec![0.0, 0.0, -1.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])],
        },
    ]
}

fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(binary_cases());
    v.extend(unary_cases());
    v.extend(reduction_cases());
    v.extend(softmax_cases());
    v.extend(matmul_cases());
    v.extend(shape_cases());
    v.extend(leaf_cases());
    v.extend(table_cases());
    v.extend(loss_cases());
    v.extend(einsum_cases());
    v
}

#[test]
fn every_op_is_covered() {
    let cases = all_cases();
    let mut seen = std::collections::BTreeSet::new();
    for c in &cases {
        let p = Program::parse(&c.text).unwrap();
        for s in p.statements() {
            seen.insert(s.expr.op_name());
        }
    }
    for op in arenagrad_program::op_names() {
        assert!(seen.contains(op), "no reference case uses `{op}`");
    }
}

#[test]
fn library_matches_hand_derived_values() {
    for c in all_cases() {
        check_library(&c);
    }
}

#[test]
fn binary_json_matches_hand_derived_values() {
    for c in all_cases() {
        check_binary(&c);
    }
}

#[test]
fn f32_runs_agree_to_single_precision() {
    for c in all_cases() {
        let p = Program::parse(&c.text).unwrap();
        let r = p
            .run(&RunOptions {
                dtype: DType::F32,
                ..RunOptions::default()
            })
            .unwrap();
        assert_eq!(r.dtype, DType::F32);
        let tol = |got: &[f64], want: &[f64], what: &str| {
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{what}: {g} vs {w}"
                );
            }
        };
        tol(&r.output.tensor.to_f64_vec(), &c.out, c.name);
        for (name, want) in &c.grads {
            tol(&r.grad(name).unwrap().to_f64_vec(), want, c.name);
        }
    }
    // And through the binary, which prints f32 data.
    let c = &unary_cases()[7];
    let out = run_binary(&["run", "--json", "--dtype", "f32", "-"], &c.text);
    assert!(out.status.success());
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["dtype"], "f32");
    let got = numbers(&j["output"]["data"]);
    for (g, w) in got.iter().zip(&c.out) {
        assert!((g - w).abs() <= 1e-6, "{g} vs {w}");
    }
}

#[test]
fn random_leaves_are_reported_as_used() {
    // Values drawn from the seeded RNG: the JSON reports them, and the output and gradient
    // follow from them by hand: y = 3x + c, dy/dx = 3.
    let text = "x = input 2 2\nc = const 2\ny = scale x 3\nz = add y c\n";
    for seed in [0u64, 7] {
        let out = run_binary(&["run", "--json", "--seed", &seed.to_string(), "-"], text);
        assert!(out.status.success());
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        let x = numbers(&j["values"]["x"]["data"]);
        let c = numbers(&j["values"]["c"]["data"]);
        assert_eq!(x.len(), 4);
        assert_eq!(c.len(), 2);
        let want: Vec<f64> = (0..4).map(|q| 3.0 * x[q] + c[q % 2]).collect();
        close(&numbers(&j["output"]["data"]), &want, "output");
        close(&numbers(&j["grads"]["x"]["data"]), &[3.0; 4], "grad");
        // Same seed, same values, library and binary alike.
        let p = Program::parse(text).unwrap();
        let r = p
            .run(&RunOptions {
                seed,
                ..RunOptions::default()
            })
            .unwrap();
        assert_eq!(r.value("x").unwrap().to_f64_vec(), x);
        assert!(j["grads"].get("c").is_none(), "consts have no gradient");
    }
}

/// Every case's `const` of whole numbers, declared `i64`, `i32`, `u8` or `bool` (where its
/// values fit), gives the same output and gradients wherever the shape rules accept it there
/// (an index, a class target, a mask); through the library and the binary. Every row that
/// reads indices, targets or a mask is reached; `where` with a boolean condition too.
#[test]
fn integer_and_boolean_consts_give_the_same_results() {
    use arenagrad_program::table::op_row;
    use arenagrad_program::Limits;
    let mut cases = all_cases();
    // `where`'s condition: 0 and a non-zero number as a float const, false and true as a bool.
    let w = cases.iter().find(|c| c.name == "where").unwrap();
    let bool_where = Case {
        name: "where with a bool condition",
        text: w
            .text
            .replace("c = const 2 1 : 0.0 1.5", "c = const bool 2 1 : 0 1"),
        out_shape: w.out_shape.clone(),
        out: w.out.clone(),
        grads: w.grads.clone(),
    };
    assert_ne!(bool_where.text, w.text);
    check_library(&bool_where);
    check_binary(&bool_where);
    let mut reached = std::collections::BTreeSet::new();
    reached.insert("where");
    for c in cases.drain(..) {
        let lines: Vec<&str> = c.text.lines().collect();
        for (k, line) in lines.iter().enumerate() {
            let Some((name, rest)) = line.split_once(" = const ") else {
                continue;
            };
            let Some((_, vals)) = rest.split_once(':') else {
                continue;
            };
            let v: Vec<f64> = vals
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
            if !v.iter().all(|x| x.fract() == 0.0) {
                continue;
            }
            let mut dtypes = vec!["i64", "i32"];
            if v.iter().all(|&x| (0.0..=255.0).contains(&x)) {
                dtypes.push("u8");
            }
            if v.iter().all(|&x| x == 0.0 || x == 1.0) {
                dtypes.push("bool");
            }
            for d in dtypes {
                let mut typed: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                typed[k] = format!("{name} = const {d} {rest}");
                let text = typed.join("\n") + "\n";
                let p = Program::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", c.name));
                if p.check(&Limits::default()).is_err() {
                    // Read as a float somewhere (a weight, a matrix): refused, as it should be.
                    continue;
                }
                let typed_case = Case {
                    name: c.name,
                    text,
                    out_shape: c.out_shape.clone(),
                    out: c.out.clone(),
                    grads: c.grads.clone(),
                };
                check_library(&typed_case);
                if d == "i32" {
                    check_binary(&typed_case);
                }
                // The rows the typed const (statement k) feeds.
                for s in p.statements() {
                    if s.expr.operands().contains(&k)
                        && op_row(s.expr.op_name()).is_some_and(|r| !r.integer_operands.is_empty())
                    {
                        reached.insert(s.expr.op_name());
                    }
                }
            }
        }
    }
    for row in arenagrad_program::table::OPS {
        if !row.integer_operands.is_empty() {
            assert!(
                reached.contains(row.name),
                "no typed const reached `{}`",
                row.name
            );
        }
    }
}
