//! The new losses against PyTorch 2.15 (float64): values and gradients printed by
//! `torch.nn.functional` for the same inputs, kinks included (a difference of exactly 0, of
//! exactly β or δ), and probabilities of exactly 0 and 1 for the binary cross-entropy.

// The constants are PyTorch's printed values (one happens to be −ln 2), and each loss is a
// closure in a table of like rows.
#![allow(clippy::approx_constant, clippy::redundant_closure)]

use arenagrad_nn::loss::{self, Reduction};
use arenagrad_nn::{DType, Graph, Tensor};

fn close(what: &str, a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        if x == y {
            continue;
        }
        assert!(
            (x - y).abs() <= 1e-12 * (1.0 + y.abs()),
            "{what}: {a:?} vs {b:?}"
        );
    }
}

const PRED: [f64; 8] = [0.3, -1.2, 0.5, 2.0, -0.1, 0.9, 0.0, 1.5];
const TARGET: [f64; 8] = [0.3, -0.2, 0.0, 0.5, 0.6, -0.4, 0.7, 1.45];

type Loss = for<'g> fn(Tensor<'g>, Tensor<'g>) -> arenagrad_nn::Result<Tensor<'g>>;

fn check(name: &str, f: Loss, want: f64, gp: &[f64], gt: &[f64]) {
    let g = Graph::new();
    let p = g.leaf(&PRED, &[8], DType::F64).unwrap();
    let t = g.leaf(&TARGET, &[8], DType::F64).unwrap();
    let l = f(p, t).unwrap();
    close(name, &[l.item().unwrap()], &[want]);
    l.backward().unwrap();
    close(name, &p.grad().unwrap().unwrap().to_vec_f64().unwrap(), gp);
    close(name, &t.grad().unwrap().unwrap().to_vec_f64().unwrap(), gt);
}

#[test]
fn l1_mean_matches_pytorch() {
    check(
        "l1_mean",
        |p, t| loss::l1_loss(p, t),
        0.71875,
        &[0.0, -0.125, 0.125, 0.125, -0.125, 0.125, -0.125, 0.125],
        &[-0.0, 0.125, -0.125, -0.125, 0.125, -0.125, 0.125, -0.125],
    );
}

#[test]
fn l1_sum_matches_pytorch() {
    check(
        "l1_sum",
        |p, t| loss::l1_loss_with(p, t, Reduction::Sum),
        5.75,
        &[0.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0],
        &[-0.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0],
    );
}

#[test]
fn smooth_l1_b05_matches_pytorch() {
    check(
        "smooth_l1_b05",
        |p, t| loss::smooth_l1_loss(p, t, 0.5, Reduction::Mean),
        0.5253125000000001,
        &[
            0.0,
            -0.125,
            0.125,
            0.125,
            -0.125,
            0.125,
            -0.125,
            0.012500000000000011,
        ],
        &[
            0.0,
            0.125,
            -0.125,
            -0.125,
            0.125,
            -0.125,
            0.125,
            -0.012500000000000011,
        ],
    );
}

#[test]
fn smooth_l1_b1_sum_matches_pytorch() {
    check(
        "smooth_l1_b1_sum",
        |p, t| loss::smooth_l1_loss(p, t, 1.0, Reduction::Sum),
        2.91625,
        &[0.0, -1.0, 0.5, 1.0, -0.7, 1.0, -0.7, 0.050000000000000044],
        &[0.0, 1.0, -0.5, -1.0, 0.7, -1.0, 0.7, -0.050000000000000044],
    );
}

#[test]
fn smooth_l1_b0_matches_pytorch() {
    check(
        "smooth_l1_b0",
        |p, t| loss::smooth_l1_loss(p, t, 0.0, Reduction::Mean),
        0.71875,
        &[0.0, -0.125, 0.125, 0.125, -0.125, 0.125, -0.125, 0.125],
        &[-0.0, 0.125, -0.125, -0.125, 0.125, -0.125, 0.125, -0.125],
    );
}

#[test]
fn huber_d07_matches_pytorch() {
    check(
        "huber_d07",
        |p, t| loss::huber_loss(p, t, 0.7, Reduction::Mean),
        0.31765625,
        &[
            0.0,
            -0.0875,
            0.0625,
            0.0875,
            -0.0875,
            0.0875,
            -0.0875,
            0.0062500000000000056,
        ],
        &[
            0.0,
            0.0875,
            -0.0625,
            -0.0875,
            0.0875,
            -0.0875,
            0.0875,
            -0.0062500000000000056,
        ],
    );
}

const LOG_PROBS: [f64; 8] = [
    -1.7190675303367675,
    -0.6190675303367676,
    -2.1190675303367676,
    -1.8190675303367676,
    -0.37541870377210423,
    -3.3754187037721044,
    -1.8754187037721042,
    -2.075418703772104,
];
const PROBS: [f64; 8] = [0.25, 0.5, 0.25, 0.0, 0.1, 0.2, 0.3, 0.4];
const LOG_TARGET: [f64; 8] = [
    -1.3862943611198906,
    -0.6931471805599453,
    -1.3862943611198906,
    -6.907755278982137,
    -2.3025850929940455,
    -1.6094379124341003,
    -1.2039728043259361,
    -0.916290731874155,
];

fn check_kl(name: &str, log_target: bool, f: Loss, want: f64, gi: &[f64]) {
    let g = Graph::new();
    let i = g.leaf(&LOG_PROBS, &[2, 4], DType::F64).unwrap();
    let t = g
        .from_f64(
            if log_target { &LOG_TARGET } else { &PROBS },
            &[2, 4],
            DType::F64,
        )
        .unwrap();
    let l = f(i, t).unwrap();
    close(name, &[l.item().unwrap()], &[want]);
    l.backward().unwrap();
    close(name, &i.grad().unwrap().unwrap().to_vec_f64().unwrap(), gi);
}

#[test]
fn kl_batchmean_matches_pytorch() {
    check_kl(
        "kl_batchmean",
        false,
        |i, t| loss::kl_div(i, t),
        0.5274556187176432,
        &[-0.125, -0.25, -0.125, -0.0, -0.05, -0.1, -0.15, -0.2],
    );
}

#[test]
fn bce_refuses_inputs_and_targets_outside_zero_to_one_as_pytorch() {
    // PyTorch: "all elements of input should be between 0 and 1", then the same of the target.
    let g = Graph::new();
    let x = g.leaf(&[0.25, 0.5, 0.75], &[3], DType::F64).unwrap();
    for bad in [1.5, -0.25, f64::NAN] {
        let y = g.from_f64(&[0.0, bad, 1.0], &[3], DType::F64).unwrap();
        let e = loss::bce(x, y).unwrap_err();
        assert!(
            matches!(e, arenagrad_nn::NnError::BadData { what: "bce", .. }),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains("target"), "{e}");
        assert!(e.to_string().contains("position 1"), "{e}");
        let xb = g.leaf(&[0.25, 0.5, bad], &[3], DType::F64).unwrap();
        let e = loss::bce(xb, y).unwrap_err();
        assert!(
            e.to_string().contains("input") && e.to_string().contains("position 2"),
            "{bad}: {e}"
        );
    }
    let y = g.from_f64(&[0.0, 0.5, 1.0], &[3], DType::F64).unwrap();
    assert!(loss::bce(x, y).unwrap().item().unwrap().is_finite());
}

#[test]
fn kl_batchmean_of_an_empty_batch_is_nan_as_pytorch() {
    // PyTorch divides the sum (0) by the batch size (0).
    let g = Graph::new();
    let i = g.leaf(&[], &[0, 4], DType::F64).unwrap();
    let t = g.from_f64(&[], &[0, 4], DType::F64).unwrap();
    assert!(loss::kl_div(i, t).unwrap().item().unwrap().is_nan());
}

#[test]
fn kl_mean_matches_pytorch() {
    check_kl(
        "kl_mean",
        false,
        |i, t| loss::kl_div_with(i, t, false, Reduction::Mean),
        0.1318639046794108,
        &[
            -0.03125, -0.0625, -0.03125, -0.0, -0.0125, -0.025, -0.0375, -0.05,
        ],
    );
}

#[test]
fn kl_log_target_sum_matches_pytorch() {
    check_kl(
        "kl_log_target_sum",
        true,
        |i, t| loss::kl_div_with(i, t, true, Reduction::Sum),
        1.0498225496866411,
        &[
            -0.25,
            -0.5,
            -0.25,
            -0.0010000000000000002,
            -0.10000000000000002,
            -0.2,
            -0.3,
            -0.4,
        ],
    );
}

/// Probabilities of exactly 0 and 1 (and one below e^-100): the clamped logarithms and
/// PyTorch's gradient `(x − y)/max(x(1 − x), 1e-12)`.
#[test]
fn bce_matches_pytorch_at_the_edges() {
    let g = Graph::new();
    let x = g
        .leaf(&[0.2, 0.9, 0.0, 1.0, 0.5, 1e-50], &[6], DType::F64)
        .unwrap();
    let y = g
        .leaf(&[0.0, 1.0, 1.0, 0.0, 0.3, 1.0], &[6], DType::F64)
        .unwrap();
    let l = loss::bce(x, y).unwrap();
    close("bce", &[l.item().unwrap()], &[50.170275207921996]);
    l.backward().unwrap();
    close(
        "bce dx",
        &x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        &[
            0.2083333333333333,
            -0.1851851851851852,
            -166666667332.63382,
            166666667332.63382,
            0.13333333333333333,
            -166666667332.63382,
        ],
    );
    close(
        "bce dy",
        &y.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        &[
            0.23104906018664842,
            -0.3662040962227033,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            19.188209108283715,
        ],
    );
}

/// The graph's error inside an nn error (the losses' errors here are all the graph's).
fn graph_error(e: arenagrad_nn::NnError) -> arenagrad_graph::GraphError {
    match e {
        arenagrad_nn::NnError::Graph(g) => g,
        other => panic!("{other}"),
    }
}

/// The new losses' gradients against finite differences in f64, away from their kinks (both
/// arguments of the elementwise ones; the log-probabilities of the divergence).
#[test]
fn new_losses_pass_gradcheck() {
    use arenagrad_graph::check::{gradcheck, GradcheckOptions};
    use arenagrad_nn::HostTensor;
    let p = HostTensor::new(vec![0.31, -1.2, 0.52, 2.0, -0.1, 0.93], &[2, 3]).unwrap();
    let t = HostTensor::new(vec![0.0, -0.25, 0.1, 0.45, 0.7, -0.4], &[2, 3]).unwrap();
    let opts = GradcheckOptions::default;
    type Case = for<'g> fn(&'g Graph, &[Tensor<'g>]) -> arenagrad_graph::Result<Tensor<'g>>;
    let cases: [(&str, Case); 4] = [
        ("l1", |_, x| loss::l1_loss(x[0], x[1]).map_err(graph_error)),
        ("smooth_l1", |_, x| {
            loss::smooth_l1_loss(x[0], x[1], 0.5, Reduction::Sum).map_err(graph_error)
        }),
        ("huber", |_, x| {
            loss::huber_loss(x[0], x[1], 0.7, Reduction::Mean).map_err(graph_error)
        }),
        ("bce", |_, x| {
            let probs = x[0].sigmoid()?;
            let y = x[1].sigmoid()?;
            loss::bce(probs, y).map_err(graph_error)
        }),
    ];
    for (name, f) in cases {
        let r = gradcheck(f, &[p.clone(), t.clone()], opts()).unwrap();
        assert!(r.passed, "{name}: {r:?}");
    }
    let kl: Case = |_, x| {
        let logp = x[0].log_softmax(-1)?;
        let q = x[1].softmax(-1)?;
        loss::kl_div(logp, q).map_err(graph_error)
    };
    let r = gradcheck(kl, &[p, t], opts()).unwrap();
    assert!(r.passed, "kl_div: {r:?}");
}

const LOGITS: [f64; 20] = [
    0.2, -1.0, 0.5, 1.5, 1.0, 0.0, -0.5, 0.3, 0.0, 2.0, 0.1, -0.2, -0.7, 0.4, 0.9, 0.0, 0.3, 0.3,
    0.3, 0.3,
];

/// Every target ignored: the mean is 0/0, NaN, as PyTorch's; the sum is 0.
#[test]
fn cross_entropy_all_ignored_is_nan_as_pytorch() {
    let g = Graph::new();
    let x = g.leaf(&LOGITS[..8], &[2, 4], DType::F64).unwrap();
    let opts = |reduction| loss::CrossEntropyOptions {
        reduction,
        ignore_index: Some(99),
        ..Default::default()
    };
    let mean = loss::cross_entropy_with(x, &[99, 99], opts(Reduction::Mean)).unwrap();
    assert!(mean.item().unwrap().is_nan());
    let sum = loss::cross_entropy_with(x, &[99, 99], opts(Reduction::Sum)).unwrap();
    assert_eq!(sum.item().unwrap(), 0.0);
    // Without ignore_index, 99 is a class out of range: a typed error.
    assert!(loss::cross_entropy(x, &[99, 0]).is_err());
}

#[test]
fn cross_entropy_ignore_index_mean_matches_pytorch() {
    let g = Graph::new();
    let x = g.leaf(&LOGITS, &[5, 4], DType::F64).unwrap();
    let opts = loss::CrossEntropyOptions {
        label_smoothing: 0.0,
        reduction: Reduction::Mean,
        ignore_index: Some(99),
    };
    let l = loss::cross_entropy_with(x, &[2, 99, 1, 99, 0], opts).unwrap();
    close("value", &l.to_vec_f64().unwrap(), &[1.0878233461628235]);
    l.sum().unwrap().backward().unwrap();
    close(
        "grad",
        &x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        &[
            0.052739697933689114,
            0.01588489175562508,
            -0.26214218756864516,
            0.19351759787933098,
            0.0,
            0.0,
            0.0,
            0.0,
            0.03232179756425098,
            -0.0945057579128028,
            0.035721110687938484,
            0.026462849660613276,
            0.0,
            0.0,
            0.0,
            0.0,
            -0.25,
            0.08333333333333333,
            0.08333333333333333,
            0.08333333333333333,
        ],
    );
}

#[test]
fn cross_entropy_ignore_index_smooth_mean_matches_pytorch() {
    let g = Graph::new();
    let x = g.leaf(&LOGITS, &[5, 4], DType::F64).unwrap();
    let opts = loss::CrossEntropyOptions {
        label_smoothing: 0.1,
        reduction: Reduction::Mean,
        ignore_index: Some(99),
    };
    let l = loss::cross_entropy_with(x, &[2, 99, 1, 99, 0], opts).unwrap();
    close("value", &l.to_vec_f64().unwrap(), &[1.1453233461628236]);
    l.sum().unwrap().backward().unwrap();
    close(
        "grad",
        &x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        &[
            0.04440636460035579,
            0.007551558422291753,
            -0.23714218756864516,
            0.18518426454599768,
            0.0,
            0.0,
            0.0,
            0.0,
            0.023988464230917654,
            -0.06950575791280275,
            0.027387777354605167,
            0.01812951632727995,
            0.0,
            0.0,
            0.0,
            0.0,
            -0.22499999999999998,
            0.07500000000000002,
            0.07500000000000002,
            0.07500000000000002,
        ],
    );
}

#[test]
fn cross_entropy_ignore_index_sum_matches_pytorch() {
    let g = Graph::new();
    let x = g.leaf(&LOGITS, &[5, 4], DType::F64).unwrap();
    let opts = loss::CrossEntropyOptions {
        label_smoothing: 0.0,
        reduction: Reduction::Sum,
        ignore_index: Some(99),
    };
    let l = loss::cross_entropy_with(x, &[2, 99, 1, 99, 0], opts).unwrap();
    close("value", &l.to_vec_f64().unwrap(), &[3.2634700384884705]);
    l.sum().unwrap().backward().unwrap();
    close(
        "grad",
        &x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        &[
            0.15821909380106736,
            0.04765467526687525,
            -0.7864265627059355,
            0.580552793637993,
            0.0,
            0.0,
            0.0,
            0.0,
            0.09696539269275294,
            -0.2835172737384084,
            0.10716333206381547,
            0.07938854898183983,
            0.0,
            0.0,
            0.0,
            0.0,
            -0.75,
            0.25,
            0.25,
            0.25,
        ],
    );
}

#[test]
fn cross_entropy_ignore_index_none_smooth_matches_pytorch() {
    let g = Graph::new();
    let x = g.leaf(&LOGITS, &[5, 4], DType::F64).unwrap();
    let opts = loss::CrossEntropyOptions {
        label_smoothing: 0.2,
        reduction: Reduction::None,
        ignore_index: Some(99),
    };
    let l = loss::cross_entropy_with(x, &[2, 99, 1, 99, 0], opts).unwrap();
    close(
        "value",
        &l.to_vec_f64().unwrap(),
        &[
            1.5837745368666254,
            0.0,
            0.6384011405019547,
            0.0,
            1.3862943611198906,
        ],
    );
    l.sum().unwrap().backward().unwrap();
    close(
        "grad",
        &x.grad().unwrap().unwrap().to_vec_f64().unwrap(),
        &[
            0.10821909380106735,
            -0.002345324733124751,
            -0.6364265627059356,
            0.5305527936379929,
            0.0,
            0.0,
            0.0,
            0.0,
            0.046965392692752954,
            -0.13351727373840833,
            0.057163332063815485,
            0.02938854898183985,
            0.0,
            0.0,
            0.0,
            0.0,
            -0.6000000000000001,
            0.20000000000000007,
            0.20000000000000007,
            0.20000000000000007,
        ],
    );
}
