//! A model's summary, as `torchinfo.summary` prints one: each module by name, the shape of its
//! output for a given input, its parameter count, and the totals.

use std::fmt;

use arenagrad_graph::{Graph, HostTensor, Parameter};

use crate::error::Result;
use crate::module::{Module, Slot};

/// One module of a [`Summary`].
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// The module's name in the model (`layer1.0.conv1`).
    pub name: String,
    /// How deep it sits (0 for the model's own children).
    pub depth: usize,
    /// The shape of its output: that of the last op of the forward that computed with one of
    /// its parameters (`None` when none was read with gradients recorded, frozen ones say).
    pub output: Option<Vec<usize>>,
    /// Its parameters, its children's included.
    pub params: usize,
}

/// A model's modules with their output shapes and parameter counts, for one input
/// ([`summary`]). Its `Display` is the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The modules holding parameters or buffers, in the order the model visits them.
    pub rows: Vec<SummaryRow>,
    /// The input's shape.
    pub input: Vec<usize>,
    /// The model's output shape.
    pub output: Vec<usize>,
    /// Parameters (a shared one counted once).
    pub total: usize,
    /// Of those, the ones not frozen.
    pub trainable: usize,
    /// Buffer elements (running statistics).
    pub buffers: usize,
    /// Bytes of the parameters and buffers.
    pub bytes: usize,
}

impl Summary {
    /// The summary down to `depth` (0: the model's children only).
    pub fn with_depth(mut self, depth: usize) -> Self {
        self.rows.retain(|r| r.depth <= depth);
        self
    }
}

/// Runs `model` once on `input` (gradients recorded, so that each parameter's use is seen; no
/// backward) and summarises it: each module that holds parameters or buffers, with the shape
/// its output has — that of the last op that computed with one of its parameters, views of
/// them followed ([`Graph::param_outputs`]) — and its parameter count.
///
/// ```
/// use arenagrad_nn::models::resnet::ResNet;
/// use arenagrad_nn::summary::summary;
/// use arenagrad_nn::{DType, HostTensor, Module, Rng};
/// let mut model = ResNet::resnet18(10, &mut Rng::seed(0))?;
/// model.set_training(false);
/// let s = summary(&model, &HostTensor::zeros(&[1, 3, 64, 64], DType::F32)?)?;
/// assert_eq!(s.total, 11_181_642);
/// let conv1 = &s.rows[0];
/// assert_eq!((conv1.name.as_str(), conv1.output.as_deref(), conv1.params), ("conv1", Some(&[1, 64, 32, 32][..]), 9408));
/// println!("{}", s.with_depth(1));
/// # Ok::<(), arenagrad_nn::NnError>(())
/// ```
pub fn summary<M: Module + ?Sized>(model: &M, input: &HostTensor) -> Result<Summary> {
    let g = Graph::new();
    let _recording = g.enable_grad();
    let x = g.from_host(input)?;
    let y = model.forward(&g, x)?;
    let output = y.try_shape()?.to_vec();
    let uses = g.param_outputs();
    let state = model.named_state();
    // Totals, each parameter once.
    let mut seen: Vec<&Parameter> = Vec::new();
    let (mut total, mut trainable, mut buffers, mut bytes) = (0, 0, 0, 0);
    for (_, p, slot) in &state {
        if seen.iter().any(|q| q.same(p)) {
            continue;
        }
        seen.push(p);
        bytes += p.numel() * p.dtype().size();
        match slot {
            Slot::Parameter => {
                total += p.numel();
                if p.requires_grad() {
                    trainable += p.numel();
                }
            }
            Slot::Buffer => buffers += p.numel(),
        }
    }
    // The modules: every proper prefix of a value's name, in visiting order.
    let mut rows: Vec<SummaryRow> = Vec::new();
    let mut last_use: Vec<Option<usize>> = Vec::new();
    for (name, p, slot) in &state {
        let used = uses.iter().find(|u| u.param.same(p));
        let mut prefix = String::new();
        let segments: Vec<&str> = name.split('.').collect();
        for (depth, seg) in segments[..segments.len().saturating_sub(1)]
            .iter()
            .enumerate()
        {
            if !prefix.is_empty() {
                prefix.push('.');
            }
            prefix.push_str(seg);
            let at = match rows.iter().position(|r| r.name == prefix) {
                Some(at) => at,
                None => {
                    rows.push(SummaryRow {
                        name: prefix.clone(),
                        depth,
                        output: None,
                        params: 0,
                    });
                    last_use.push(None);
                    rows.len() - 1
                }
            };
            if *slot == Slot::Parameter {
                rows[at].params += p.numel();
            }
            if let Some(u) = used {
                if last_use[at].is_none_or(|t| u.at > t) {
                    last_use[at] = Some(u.at);
                    rows[at].output = Some(u.shape.clone());
                }
            }
        }
    }
    Ok(Summary {
        rows,
        input: input.shape().to_vec(),
        output,
        total,
        trainable,
        buffers,
        bytes,
    })
}

/// `1234567` as `1,234,567`.
fn grouped(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn shape(s: &[usize]) -> String {
    let dims: Vec<String> = s.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = |r: &SummaryRow| {
            let last = r.name.rsplit('.').next().unwrap_or(&r.name);
            format!("{}{last}", "  ".repeat(r.depth))
        };
        let name_w = self
            .rows
            .iter()
            .map(|r| label(r).chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        let shape_w = self
            .rows
            .iter()
            .map(|r| r.output.as_deref().map_or(2, |s| shape(s).len()))
            .max()
            .unwrap_or(0)
            .max(12);
        let count_w = grouped(self.total).len().max(7);
        let rule = "=".repeat(name_w + shape_w + count_w + 4);
        writeln!(
            f,
            "{:<name_w$}  {:<shape_w$}  {:>count_w$}",
            "Layer", "Output shape", "Param #"
        )?;
        writeln!(f, "{rule}")?;
        for r in &self.rows {
            let out = r.output.as_deref().map_or("--".to_string(), shape);
            writeln!(
                f,
                "{:<name_w$}  {out:<shape_w$}  {:>count_w$}",
                label(r),
                grouped(r.params)
            )?;
        }
        writeln!(f, "{rule}")?;
        writeln!(
            f,
            "Input {} -> output {}",
            shape(&self.input),
            shape(&self.output)
        )?;
        writeln!(
            f,
            "Total params: {} ({:.2} MB with buffers)",
            grouped(self.total),
            self.bytes as f64 / 1e6
        )?;
        writeln!(f, "Trainable params: {}", grouped(self.trainable))?;
        write!(
            f,
            "Non-trainable params: {}",
            grouped(self.total - self.trainable)
        )?;
        if self.buffers > 0 {
            write!(f, "\nBuffers: {}", grouped(self.buffers))?;
        }
        Ok(())
    }
}
