//! Optimiser state as named tensors ([`super::Optimizer::state_tensors`]), so that a checkpoint
//! resumes a run exactly. Parameters are named by their position: `"{i}.exp_avg"`. Counters
//! (`u64`) travel as two `f64`s holding their 32-bit halves, so no value loses a bit; so does the
//! data order's generator in a training checkpoint.

use std::collections::BTreeMap;

use arenagrad_graph::{HostData, HostTensor, Parameter};

use crate::error::{config, Result};

/// `u64`s as an `f64` tensor of twice their count: each one's high and low 32 bits, each exact
/// in an `f64`.
pub(crate) fn u64s_tensor(values: &[u64]) -> HostTensor {
    let halves: Vec<f64> = values
        .iter()
        .flat_map(|&v| [(v >> 32) as f64, (v & 0xffff_ffff) as f64])
        .collect();
    HostTensor::new(halves, &[2 * values.len()]).expect("invariant: two values per u64")
}

/// The `n` `u64`s of [`u64s_tensor`], or `None` when `t` is not such a tensor.
pub(crate) fn tensor_u64s(t: &HostTensor, n: usize) -> Option<Vec<u64>> {
    let v = t.to_f64_vec();
    let half = |x: f64| (0.0..=u32::MAX as f64).contains(&x) && x.fract() == 0.0;
    if t.shape() != [2 * n] || !v.iter().all(|&x| half(x)) {
        return None;
    }
    Some(
        v.chunks(2)
            .map(|p| ((p[0] as u64) << 32) | p[1] as u64)
            .collect(),
    )
}

/// A counter as a tensor `[2]` ([`u64s_tensor`]).
pub(crate) fn u64_tensor(v: u64) -> HostTensor {
    u64s_tensor(&[v])
}

/// The counter of [`u64_tensor`], checked.
pub(crate) fn tensor_u64(op: &'static str, name: &str, t: &HostTensor) -> Result<u64> {
    match tensor_u64s(t, 1).as_deref() {
        Some(&[v]) => Ok(v),
        _ => Err(config(op, format!("state `{name}` is not a counter"))),
    }
}

/// A scalar `f64` as a tensor `[1]`.
pub(crate) fn f64_tensor(v: f64) -> HostTensor {
    HostTensor::new(vec![v], &[1]).expect("invariant: one value for shape [1]")
}

/// The named tensors of a saved state, read with checks; [`StateReader::finish`] refuses names
/// nothing asked for.
pub(crate) struct StateReader<'a> {
    op: &'static str,
    map: BTreeMap<&'a str, &'a HostTensor>,
    used: Vec<&'a str>,
}

impl<'a> StateReader<'a> {
    pub(crate) fn new(op: &'static str, tensors: &'a [(String, HostTensor)]) -> Self {
        StateReader {
            op,
            map: tensors.iter().map(|(n, t)| (n.as_str(), t)).collect(),
            used: Vec::new(),
        }
    }

    fn get(&mut self, name: &str) -> Option<&'a HostTensor> {
        let (k, t) = self.map.get_key_value(name)?;
        self.used.push(k);
        Some(t)
    }

    /// The learning rate (`"lr"`), required.
    pub(crate) fn lr(&mut self) -> Result<f64> {
        match self.get("lr").map(|t| (t.shape().to_vec(), t.to_f64_vec())) {
            Some((s, v)) if s == [1] && v[0].is_finite() && v[0] >= 0.0 => Ok(v[0]),
            Some(_) => Err(config(self.op, "state `lr` is not a learning rate")),
            None => Err(config(self.op, "the state has no `lr`")),
        }
    }

    /// Counter `name`, if present.
    pub(crate) fn counter(&mut self, name: &str) -> Result<Option<u64>> {
        let op = self.op;
        self.get(name).map(|t| tensor_u64(op, name, t)).transpose()
    }

    /// Buffer `name` for parameter `p`, if present: of `p`'s shape, in the dtype `p`'s update is
    /// computed in (its own; f32 for a 16-bit parameter).
    pub(crate) fn buffer(&mut self, name: &str, p: &Parameter) -> Result<Option<HostData>> {
        let Some(t) = self.get(name) else {
            return Ok(None);
        };
        if t.shape() != p.shape().as_slice() || t.dtype() != p.dtype().compute() {
            return Err(config(
                self.op,
                format!(
                    "state `{name}` is {:?} {}, its parameter `{}` is {:?} {}",
                    t.shape(),
                    t.dtype(),
                    p.name(),
                    p.shape(),
                    p.dtype().compute()
                ),
            ));
        }
        Ok(Some(t.data().clone()))
    }

    /// Refuses names nothing read (another optimiser's state, or more parameters than this one
    /// has).
    pub(crate) fn finish(self) -> Result<()> {
        match self.map.keys().find(|k| !self.used.contains(k)) {
            Some(k) => Err(config(
                self.op,
                format!("the state has `{k}`, which this optimiser does not keep"),
            )),
            None => Ok(()),
        }
    }
}

/// A buffer as a tensor of its parameter's shape.
pub(crate) fn buffer_tensor(data: &HostData, p: &Parameter) -> Result<HostTensor> {
    Ok(HostTensor::from_data(data.clone(), &p.shape())?)
}
