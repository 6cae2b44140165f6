//! The recurrent cells and layers load PyTorch's weights by name and give PyTorch's outputs and
//! gradients: `tests/data/rnn/reference.safetensors` holds small float64 PyTorch 2.15 models
//! (their seeded weights, an input, the outputs, and every gradient of a weighted sum of the
//! outputs), written by
//!
//! ```text
//! python3 scripts/torch_rnn_reference.py tests/data/rnn/reference.safetensors
//! ```
//!
//! The LSTM and GRU are 2 layers, bidirectional, over a batch whose sequences have lengths
//! 5, 2, 4 (packed in PyTorch with `enforce_sorted=False`); the RNN is one relu layer, batch
//! first, from a given initial state; the cells run three steps from a zero state.

use std::collections::BTreeMap;
use std::path::Path;

use arenagrad::nn::checkpoint::{load_state_dict, load_tensors};
use arenagrad::nn::{
    GRUCell, LSTMCell, Module, Nonlinearity, RNNCell, Rng, RnnConfig, GRU, LSTM, RNN,
};
use arenagrad::{DType, Graph, HostTensor, Tensor};

struct Reference {
    tensors: BTreeMap<String, HostTensor>,
    path: std::path::PathBuf,
}

impl Reference {
    fn open() -> Self {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rnn/reference.safetensors");
        let tensors = load_tensors(&path).unwrap().into_iter().collect();
        Reference { tensors, path }
    }

    fn get(&self, name: &str) -> &HostTensor {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("{name} not in the reference"))
    }

    /// Loads `prefix/…` into the module, strictly: every name must match.
    fn load(&self, prefix: &str, m: &dyn Module) {
        let start = format!("{prefix}/");
        let own: Vec<(String, HostTensor)> = self
            .tensors
            .iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix(&start)?;
                (!rest.starts_with("out/") && !rest.starts_with("grad/") && rest != "h0")
                    .then(|| (rest.to_string(), v.clone()))
            })
            .collect();
        load_state_dict(m, own, true, &self.path).unwrap();
    }

    /// `Σ output·w/prefix/name` over the named outputs, each checked against PyTorch's.
    fn loss<'g>(&self, g: &'g Graph, prefix: &str, outs: &[(&str, Tensor<'g>)]) -> Tensor<'g> {
        let mut total = None;
        for (name, t) in outs {
            close(
                &format!("{prefix} {name}"),
                &t.to_vec_f64().unwrap(),
                &self
                    .get(&format!("{prefix}/out/{name}"))
                    .data()
                    .to_f64_vec(),
            );
            let w = g
                .from_host(self.get(&format!("w/{prefix}/{name}")))
                .unwrap();
            let term = t.mul(w).unwrap().sum().unwrap();
            total = Some(match total {
                None => term,
                Some(s) => term.add(s).unwrap(),
            });
        }
        total.unwrap()
    }

    /// Every parameter's gradient and the input's, against PyTorch's.
    fn check_grads(&self, prefix: &str, m: &dyn Module, x: Tensor<'_>) {
        for (name, p) in m.named_parameters() {
            let got = p
                .grad()
                .unwrap_or_else(|| panic!("{prefix} {name}: no gradient"));
            let want = self.get(&format!("{prefix}/grad/{name}"));
            close(
                &format!("{prefix} grad {name}"),
                &got.data().to_f64_vec(),
                &want.data().to_f64_vec(),
            );
        }
        let gx = x.grad().unwrap().unwrap().to_vec_f64().unwrap();
        close(
            &format!("{prefix} grad x"),
            &gx,
            &self.get(&format!("{prefix}/grad/x")).data().to_f64_vec(),
        );
    }
}

fn close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            "{what}[{k}]: {a} vs PyTorch's {b}"
        );
    }
}

fn f64_config() -> RnnConfig {
    RnnConfig {
        dtype: DType::F64,
        ..Default::default()
    }
}

fn lengths(r: &Reference) -> Vec<usize> {
    r.get("lengths")
        .data()
        .to_f64_vec()
        .iter()
        .map(|&v| v as usize)
        .collect()
}

#[test]
fn lstm_and_gru_layers_packed_bidirectional_match_pytorch() {
    let r = Reference::open();
    let cfg = RnnConfig {
        num_layers: 2,
        bidirectional: true,
        ..f64_config()
    };
    let len = lengths(&r);
    for unfused in [false, true] {
        let lstm =
            LSTM::with_config(3, 4, RnnConfig { unfused, ..cfg }, &mut Rng::seed(0)).unwrap();
        r.load("lstm", &lstm);
        let g = Graph::new();
        let x = g
            .from_host(r.get("x"))
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let out = lstm.forward_with(&g, x, None, Some(&len)).unwrap();
        let outs = [
            ("output", out.output),
            ("h_n", out.h_n),
            ("c_n", out.c_n.unwrap()),
        ];
        r.loss(&g, "lstm", &outs).backward().unwrap();
        r.check_grads("lstm", &lstm, x);
    }
    let gru = GRU::with_config(3, 4, cfg, &mut Rng::seed(0)).unwrap();
    r.load("gru", &gru);
    let g = Graph::new();
    let x = g
        .from_host(r.get("x"))
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let out = gru.forward_with(&g, x, None, Some(&len)).unwrap();
    r.loss(&g, "gru", &[("output", out.output), ("h_n", out.h_n)])
        .backward()
        .unwrap();
    r.check_grads("gru", &gru, x);
}

#[test]
fn relu_rnn_batch_first_from_a_given_state_matches_pytorch() {
    let r = Reference::open();
    let cfg = RnnConfig {
        batch_first: true,
        nonlinearity: Nonlinearity::ReLU,
        ..f64_config()
    };
    let rnn = RNN::with_config(3, 4, cfg, &mut Rng::seed(0)).unwrap();
    r.load("rnn", &rnn);
    let g = Graph::new();
    let x = g.from_host(r.get("x")).unwrap().transpose(0, 1).unwrap();
    let x = g
        .from_host(&x.to_host().unwrap())
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let h0 = g.from_host(r.get("rnn/h0")).unwrap();
    let out = rnn.forward_with(&g, x, Some(h0), None).unwrap();
    r.loss(&g, "rnn", &[("output", out.output), ("h_n", out.h_n)])
        .backward()
        .unwrap();
    r.check_grads("rnn", &rnn, x);
}

#[test]
fn cells_match_pytorch_over_three_steps() {
    let r = Reference::open();
    fn xs<'g>(r: &Reference, g: &'g Graph) -> Tensor<'g> {
        g.from_host(r.get("x"))
            .unwrap()
            .set_requires_grad(true)
            .unwrap()
    }
    fn step(x: Tensor<'_>, t: usize) -> Tensor<'_> {
        x.slice(0, t, t + 1).unwrap().reshape(&[3, 3]).unwrap()
    }

    let cell = LSTMCell::with_config(3, 4, f64_config(), &mut Rng::seed(0)).unwrap();
    r.load("lstm_cell", &cell);
    let g = Graph::new();
    let x = xs(&r, &g);
    let mut state = None;
    for t in 0..3 {
        state = Some(cell.forward(&g, step(x, t), state).unwrap());
    }
    let (h, c) = state.unwrap();
    r.loss(&g, "lstm_cell", &[("h", h), ("c", c)])
        .backward()
        .unwrap();
    r.check_grads("lstm_cell", &cell, x);

    let gru = GRUCell::with_config(3, 4, f64_config(), &mut Rng::seed(0)).unwrap();
    let rnn = RNNCell::with_config(3, 4, f64_config(), &mut Rng::seed(0)).unwrap();
    for (prefix, m) in [("gru_cell", &gru as &dyn Module), ("rnn_cell", &rnn)] {
        r.load(prefix, m);
        let g = Graph::new();
        let x = xs(&r, &g);
        let mut h = None;
        for t in 0..3 {
            let xt = step(x, t);
            h = Some(if prefix == "gru_cell" {
                gru.forward(&g, xt, h).unwrap()
            } else {
                rnn.forward(&g, xt, h).unwrap()
            });
        }
        r.loss(&g, prefix, &[("h", h.unwrap())]).backward().unwrap();
        r.check_grads(prefix, m, x);
    }
}
