//! The fused kernels of `fused.cu` on a [`CudaBackend`]: layer and RMS normalisation over rows,
//! and scaled dot-product attention with the FlashAttention scheme's memory (the output and each
//! query row's log-sum-exp kept, the weights recomputed in backward). Each method checks its
//! sizes, packs the parameters and queues its launches; none waits for the device.

use arenagrad_alloc::block_cache::DevicePtr;

use super::params::{blocks_for, count, invalid, to_i64, AttnParams, K};
use super::{launch, CudaBackend, CudaError, MAX_DIMS};
use crate::cpu::attention::AttnDims;
use crate::cpu::norm::NormSpec;
use crate::DType;

/// An additive attention mask on the device, broadcast to `[…lead, lq, lk]`: head `h`'s entry
/// `(i, j)` is at `h`'s coordinates over `lead_shape` times `lead_strides`, plus `i·rs + j·cs`
/// (strides 0 where the mask is broadcast).
#[derive(Debug, Clone, Copy)]
pub struct DeviceMask<'a> {
    /// The mask's elements.
    pub data: DevicePtr,
    /// The leading (batch, head) extents.
    pub lead_shape: &'a [usize],
    /// The mask's strides over them.
    pub lead_strides: &'a [usize],
    /// The stride between query rows.
    pub rs: usize,
    /// The stride between key columns.
    pub cs: usize,
}

/// A flag as the kernels take it.
fn flag(b: bool) -> u64 {
    u64::from(b)
}

/// An optional pointer as the kernels take it (0, never read, when absent).
fn ptr_or_null(p: Option<DevicePtr>) -> u64 {
    p.map_or(0, |p| p.0)
}

impl CudaBackend {
    /// Each row's `[mean, rstd]` into `stats` (`2·rows`) for the `rows × n` contiguous `x`, as
    /// [`crate::cpu::norm::norm_stats`]: f64 sums, the biased variance (the mean square when
    /// `spec.rms`, with mean 0).
    pub fn norm_stats(
        &self,
        dt: DType,
        x: DevicePtr,
        rows: usize,
        spec: NormSpec,
        eps: f64,
        stats: DevicePtr,
    ) -> Result<(), CudaError> {
        let NormSpec { n, rms } = spec;
        count("norm_stats", &[rows, n])?;
        if rows == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::NormStats, dt, "norm_stats", blocks_for(rows as u64);
            x.0, rows as u64, n as u64, eps, flag(rms), stats.0)
    }

    /// `y = (x − mean)·rstd·w + b` row by row (`x` `rows × n`) from [`CudaBackend::norm_stats`]'s
    /// `stats`, `(w, b)` (length `n`) each optional, as [`crate::cpu::norm::norm_apply`].
    pub fn norm_apply(
        &self,
        dt: DType,
        x: DevicePtr,
        [rows, n]: [usize; 2],
        stats: DevicePtr,
        (w, b): (Option<DevicePtr>, Option<DevicePtr>),
        y: DevicePtr,
    ) -> Result<(), CudaError> {
        let total = count("norm_apply", &[rows, n])?;
        if total == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::NormApply, dt, "norm_apply", blocks_for(total);
            x.0, rows as u64, n as u64, stats.0, ptr_or_null(w), ptr_or_null(b),
            flag(w.is_some()), flag(b.is_some()), y.0)
    }

    /// The input's gradient `dx` (`rows × spec.n`) of a normalisation from the output's `gy`,
    /// as [`crate::cpu::norm::norm_grad_input`]; `(x, stats)` are the forward's input and
    /// statistics.
    pub fn norm_grad_input(
        &self,
        dt: DType,
        (x, stats): (DevicePtr, DevicePtr),
        gy: DevicePtr,
        (rows, spec): (usize, NormSpec),
        w: Option<DevicePtr>,
        dx: DevicePtr,
    ) -> Result<(), CudaError> {
        let NormSpec { n, rms } = spec;
        count("norm_grad_input", &[rows, n])?;
        if rows == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::NormGradInput, dt, "norm_grad_input", blocks_for(rows as u64);
            x.0, gy.0, stats.0, rows as u64, n as u64, ptr_or_null(w), flag(w.is_some()),
            flag(rms), dx.0)
    }

    /// The weight's and the bias's gradients (`n` each, either optional): `Σ_rows gy·x̂` and
    /// `Σ_rows gy`, as [`crate::cpu::norm::norm_grad_params`]; `(x, stats)` are the forward's input (`rows × n`)
    /// and statistics.
    pub fn norm_grad_params(
        &self,
        dt: DType,
        (x, stats): (DevicePtr, DevicePtr),
        gy: DevicePtr,
        [rows, n]: [usize; 2],
        (dw, db): (Option<DevicePtr>, Option<DevicePtr>),
    ) -> Result<(), CudaError> {
        count("norm_grad_params", &[rows, n])?;
        if n == 0 || (dw.is_none() && db.is_none()) {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::NormGradParams, dt, "norm_grad_params", blocks_for(n as u64);
            x.0, gy.0, stats.0, rows as u64, n as u64, flag(dw.is_some()), flag(db.is_some()),
            ptr_or_null(dw), ptr_or_null(db))
    }

    /// Scaled dot-product attention over `dims.bh` heads, as
    /// [`crate::cpu::attention::attention_forward`]: `(q, k, v)`, `q` `[bh, lq, d]`, `k` `[bh,
    /// lk, d]`, `v` `[bh, lk, dv]` contiguous; writes `o` `[bh, lq, dv]` and each query row's
    /// log-sum-exp `lse` `[bh, lq]` (−∞, with an output of 0, for a row that sees no key).
    pub fn attention_forward(
        &self,
        dt: DType,
        dims: &AttnDims,
        (q, k, v): (DevicePtr, DevicePtr, DevicePtr),
        mask: Option<&DeviceMask<'_>>,
        (o, lse): (DevicePtr, DevicePtr),
    ) -> Result<(), CudaError> {
        const OP: &str = "attention_forward";
        let p = attn_params(OP, dims, mask)?;
        let rows = count(OP, &[dims.bh, dims.lq])?;
        if rows == 0 {
            return Ok(());
        }
        self.bind()?;
        launch!(self, K::AttnForward, dt, "attention_forward", blocks_for(rows);
            q.0, k.0, v.0, mask.map_or(0, |m| m.data.0), p, o.0, lse.0)
    }

    /// The gradients `(dq, dk, dv)` of [`CudaBackend::attention_forward`] from its inputs, its
    /// outputs `(o, lse)` and the output's gradient `go`, as
    /// [`crate::cpu::attention::attention_backward`] (overwritten; 0 for heads with no queries or
    /// no keys). A scratch buffer of `bh·lq` elements comes from the backend's cache for the
    /// launches' duration.
    pub fn attention_backward(
        &self,
        dt: DType,
        dims: &AttnDims,
        (q, k, v): (DevicePtr, DevicePtr, DevicePtr),
        mask: Option<&DeviceMask<'_>>,
        (o, lse, go): (DevicePtr, DevicePtr, DevicePtr),
        (dq, dk, dv): (DevicePtr, DevicePtr, DevicePtr),
    ) -> Result<(), CudaError> {
        const OP: &str = "attention_backward";
        let p = attn_params(OP, dims, mask)?;
        let rows = count(OP, &[dims.bh, dims.lq])?;
        let cols = count(OP, &[dims.bh, dims.lk])?;
        let m = mask.map_or(0, |m| m.data.0);
        self.bind()?;
        if rows > 0 {
            // Rows that see no key (lk = 0) get 0 from the kernel's empty loop.
            let bytes = count(OP, &[rows as usize, dt.size()])? as usize;
            let delta = self.cache().alloc(bytes, self.stream_id())?;
            let run = || {
                launch!(self, K::AttnDelta, dt, "attention_backward", blocks_for(rows);
                    go.0, o.0, p, delta.ptr.0)?;
                launch!(self, K::AttnDq, dt, "attention_backward", blocks_for(rows);
                    q.0, k.0, v.0, m, go.0, lse.0, delta.ptr.0, p, dq.0)?;
                if cols > 0 {
                    launch!(self, K::AttnDkdv, dt, "attention_backward", blocks_for(cols);
                        q.0, k.0, v.0, m, go.0, lse.0, delta.ptr.0, p, dk.0, dv.0)?;
                }
                Ok(())
            };
            let result = run();
            // Stream order makes the immediate free safe: whatever reuses the block runs after
            // the launches above.
            self.cache().free(delta)?;
            return result;
        }
        // No query rows: dq is empty, and every key's gradients are 0.
        let launch_fill = |ptr: DevicePtr, n: usize| self.fill(dt, ptr, n, 0.0);
        launch_fill(dk, dims.bh * dims.lk * dims.d)?;
        launch_fill(dv, dims.bh * dims.lk * dims.dv)?;
        launch_fill(dq, dims.bh * dims.lq * dims.d)
    }
}

/// [`AttnParams`] for `dims` and `mask`, checking the mask's leading axes against
/// [`MAX_DIMS`].
fn attn_params(
    op: &'static str,
    dims: &AttnDims,
    mask: Option<&DeviceMask<'_>>,
) -> Result<AttnParams, CudaError> {
    count(op, &[dims.bh, dims.lq, dims.lk])?;
    let mut p = AttnParams {
        bh: dims.bh as u64,
        lq: dims.lq as u64,
        lk: dims.lk as u64,
        d: dims.d as u64,
        dv: dims.dv as u64,
        causal: flag(dims.causal),
        dropout: flag(dims.dropout > 0.0),
        seed: dims.seed,
        threshold: crate::cpu::dropout::threshold(dims.dropout),
        scale: dims.scale,
        keep_scale: 1.0 / (1.0 - dims.dropout),
        ..AttnParams::default()
    };
    if let Some(m) = mask {
        let rank = m.lead_shape.len();
        if rank > MAX_DIMS || m.lead_strides.len() != rank {
            return Err(CudaError::TooManyDims { op, dims: rank });
        }
        if m.lead_shape.iter().product::<usize>() != dims.bh {
            return Err(invalid(
                op,
                format!("mask heads {:?} for {} heads", m.lead_shape, dims.bh),
            ));
        }
        p.has_mask = 1;
        p.mask_rs = to_i64(op, m.rs)?;
        p.mask_cs = to_i64(op, m.cs)?;
        p.lead_rank = rank as i64;
        for (a, (&e, &s)) in m.lead_shape.iter().zip(m.lead_strides).enumerate() {
            p.lead_shape[a] = to_i64(op, e)?;
            p.lead_stride[a] = to_i64(op, s)?;
        }
    }
    Ok(p)
}
