//! Scaled dot-product attention as one recorded op.
//!
//! On the host the forward and backward are the tiled kernels of
//! `arenagrad_exec::cpu::attention` (the FlashAttention scheme): the node keeps the output and
//! each query row's log-sum-exp, never the `lq × lk` weights, so a step's memory grows linearly
//! with the sequence. Under `create_graph` the rule is written in tensor ops (the weights are
//! recomputed, quadratic in memory, and differentiable again). On a CUDA device the forward and
//! backward are the fused kernels of `arenagrad_exec::cuda` (`fused.cu`: one thread per query
//! or key row streaming over the other side with a running softmax, the same memory as the
//! host's; checked against the host kernels by `crates/exec/tests/cuda_kernels_on_host.rs`); a
//! mask with more leading axes than the kernels' parameters hold (8) runs the formula composed
//! of tensor ops.

use arenagrad_alloc::BufId;
use arenagrad_exec::cpu;
use arenagrad_exec::cpu::attention::{
    self as k, AttnDims, AttnGrads, AttnInputs, AttnMask, AttnSaved, HalfLayout,
};
use arenagrad_exec::cpu::cast::Storage;
use arenagrad_exec::cpu::par::claim_each;
use arenagrad_exec::layout::broadcast_strides;
use arenagrad_exec::{bf16, f16, DType, Float};
use smallvec::{smallvec, SmallVec};

use super::{check_pair, Ctx, Grads, Op};
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::graph::Inner;
use crate::host::try_vec;
use crate::shape::Shape;
use crate::{Device, Tensor};
use arenagrad_exec::layout::broadcast_shapes;

/// Options of [`Tensor::scaled_dot_product_attention`] (PyTorch's keyword arguments).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionOptions<'g> {
    /// An additive float mask on the scores, broadcastable to `[…, lq, lk]` (−∞ hides a key;
    /// [`Tensor::masked_fill`] makes one from a 0/1 mask). No gradient flows into it.
    pub mask: Option<Tensor<'g>>,
    /// Query `i` sees keys `j ≤ i` only (PyTorch's `is_causal`, aligned top-left). May be
    /// combined with `mask`.
    pub causal: bool,
    /// The probability of dropping each attention weight (0 for none; pass 0 when evaluating).
    pub dropout_p: f64,
    /// The factor on `q·kᵀ`; `None` is `1/√d`.
    pub scale: Option<f64>,
}

/// What the node keeps: the problem, whether a mask is its fourth input, and the per-row
/// log-sum-exp (`None` when the op is not recorded: then it is scratch, and the node is only
/// counted).
#[derive(Clone, Copy)]
pub(crate) struct AttnNode {
    pub dims: AttnDims,
    pub mask: bool,
    pub lse: Option<BufId>,
    /// `Some(heads)` for [`Tensor::attention_packed`]: the one input is the packed projection.
    pub packed: Option<usize>,
}

impl AttnNode {
    /// The log-sum-exp a recorded node keeps for its backward.
    fn kept_lse(&self) -> BufId {
        self.lse
            .expect("invariant: a recorded attention keeps its rows' log-sum-exp")
    }
}

const OP: &str = "scaled_dot_product_attention";

impl<'g> Tensor<'g> {
    /// `softmax(self·kᵀ·scale + mask)·v` over the last two axes, PyTorch's
    /// `scaled_dot_product_attention`: `self` (the queries) `[…, lq, d]`, `k` `[…, lk, d]`,
    /// `v` `[…, lk, dv]` with the same leading axes (batch, heads); the output is `[…, lq, dv]`.
    /// Dropout, when `dropout_p > 0`, drops attention weights (scaling the rest by
    /// `1/(1 − p)`) from the graph's random stream. Gradients flow to `self`, `k` and `v`.
    pub fn scaled_dot_product_attention(
        self,
        k: Tensor<'g>,
        v: Tensor<'g>,
        opts: AttentionOptions<'g>,
    ) -> Result<Tensor<'g>> {
        if let Some([Some(q), Some(k), Some(v), mask]) =
            Tensor::autocast_lower(self.g, [Some(self), Some(k), Some(v), opts.mask])?
        {
            return q.scaled_dot_product_attention(k, v, AttentionOptions { mask, ..opts });
        }
        if Tensor::any_half(&[Some(self), Some(k), Some(v), opts.mask])?
            && !same_half([Some(self), Some(k), Some(v), opts.mask])?
        {
            return self.attention_lowered(k, v, opts);
        }
        let (qs, ks, vs) = (self.try_shape()?, k.try_shape()?, v.try_shape()?);
        check_pair(OP, &self, &k)?;
        check_pair(OP, &self, &v)?;
        let r = qs.len();
        let mismatch = |lhs: &[usize], rhs: &[usize]| GraphError::ShapeMismatch {
            op: OP,
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
        };
        if r < 2 || ks.len() != r || vs.len() != r {
            return Err(GraphError::BadArgument {
                op: OP,
                what: "q, k and v must have the same rank, at least 2 ([…, len, width])",
            });
        }
        if qs[..r - 2] != ks[..r - 2] || qs[r - 1] != ks[r - 1] {
            return Err(mismatch(&qs, &ks));
        }
        if vs[..r - 2] != ks[..r - 2] || vs[r - 2] != ks[r - 2] {
            return Err(mismatch(&ks, &vs));
        }
        check_options(&opts)?;
        let (lq, lk, d, dv) = (qs[r - 2], ks[r - 2], qs[r - 1], vs[r - 1]);
        let mut full: Shape = qs[..r - 2].iter().copied().collect();
        full.extend([lq, lk]);
        if let Some(m) = opts.mask {
            check_pair(OP, &self, &m)?;
            let ms = m.try_shape()?;
            if broadcast_shapes(&ms, &full).as_deref() != Some(&full[..]) {
                return Err(mismatch(&full, &ms));
            }
        }
        let dims = self.problem(&opts, [qs[..r - 2].iter().product(), lq, lk, d, dv]);
        let dev = self.device();
        if dev != Device::Cpu && !fused_on_device(opts.mask.is_some(), r - 2) {
            return composed_forward(self, k, v, opts.mask, &dims, &full);
        }
        let mut out_shape: Shape = qs[..r - 2].iter().copied().collect();
        out_shape.extend([lq, dv]);
        let mask_shape = opts.mask.map(|m| m.try_shape()).transpose()?;
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let dtype = i.node(OP, self.id)?.dtype;
        let bufs = bufs_of(i, [self, k, v])?;
        let mask = match (opts.mask, mask_shape) {
            (Some(m), Some(ms)) => Some((i.node(OP, m.id)?.buf, ms)),
            _ => None,
        };
        let (o_len, lse_len) = (dims.bh * lq * dv, dims.bh * lq);
        let mut inputs: SmallVec<[_; 4]> = smallvec![self.id, k.id, v.id];
        inputs.extend(opts.mask.map(|m| m.id));
        // The rows' log-sum-exp is kept for backward only when the op is recorded.
        let record = i.records(&inputs);
        let (o, lse) = match dev {
            Device::Cpu => {
                let p = HostProblem {
                    dims: &dims,
                    mask: mask.as_ref(),
                    full: &full,
                };
                host_forward(i, (p, &bufs, record), dtype, HalfLayout::Heads)?
            }
            Device::Cuda(_) => {
                let o = i.alloc_on(OP, dev, dtype, o_len)?;
                let lse = i.alloc_on(OP, dev, dtype, lse_len)?;
                #[cfg(feature = "cuda")]
                let st = mask.as_ref().map(|m| broadcast_strides(&m.1, &full));
                let mb = mask.as_ref().map_or(bufs[0], |m| m.0);
                let (qb, kb, vb) = (bufs[0], bufs[1], bufs[2]);
                on_cuda!(
                    i,
                    OP,
                    dev,
                    [qb, kb, vb, mb, o, lse],
                    |be, [qp, kp, vp, mp, op, lp]| {
                        let m = st.as_ref().map(|st| device_mask(mp, st, &full));
                        be.attention_forward(dtype, &dims, (qp, kp, vp), m.as_ref(), (op, lp))
                    }
                );
                if record {
                    (o, Some(lse))
                } else {
                    i.release_buf(dev, lse)?;
                    (o, None)
                }
            }
        };
        let node = AttnNode {
            dims,
            mask: opts.mask.is_some(),
            lse,
            packed: None,
        };
        let id = i.push(
            out_shape,
            dtype,
            o,
            Op::Attention(std::sync::Arc::new(node)),
            &inputs,
        );
        drop(guard);
        Ok(self.g.handle(id))
    }
}

impl Tensor<'_> {
    /// The problem of `[bh, lq, lk, d, dv]` under `opts` (already checked): the default scale `1/√d`,
    /// and a seed drawn from the graph's stream when there is dropout (none drawn otherwise).
    fn problem(&self, opts: &AttentionOptions<'_>, [bh, lq, lk, d, dv]: [usize; 5]) -> AttnDims {
        AttnDims {
            bh,
            lq,
            lk,
            d,
            dv,
            scale: opts.scale.unwrap_or(1.0 / (d.max(1) as f64).sqrt()),
            causal: opts.causal,
            dropout: opts.dropout_p,
            seed: if opts.dropout_p > 0.0 {
                self.g.inner().rng.next_u64()
            } else {
                0
            },
        }
    }
}

/// Refuses a dropout probability outside [0, 1] and a scale that is not finite.
fn check_options(opts: &AttentionOptions<'_>) -> Result<()> {
    if !(0.0..=1.0).contains(&opts.dropout_p) {
        return Err(GraphError::BadArgument {
            op: OP,
            what: "dropout_p must be in [0, 1]",
        });
    }
    if opts.scale.is_some_and(|s| !s.is_finite()) {
        return Err(GraphError::BadArgument {
            op: OP,
            what: "scale must be finite",
        });
    }
    Ok(())
}

impl<'g> Tensor<'g> {
    /// Attention of the queries `self` (`[b, heads, new, d]`) over the first `len` positions of
    /// a key/value cache `k` (`[b, kv_heads, cap, d]`) and `v` (`[b, kv_heads, cap, dv]`), as
    /// generation with a cache runs it (the cache written in place by
    /// [`Tensor::slice_write`]): the values of [`Tensor::scaled_dot_product_attention`] over
    /// `k` and `v` sliced to `len` positions, query head `h` reading key/value head
    /// `h / (heads / kv_heads)` (grouped-query attention, `transformers`' `repeat_kv`), and,
    /// with `causal`, query `i` seeing keys `j ≤ len − new + i` (the queries are the cache's
    /// last `new` positions). The scale is `1/√d`. On the host, when nothing records for
    /// backward, the cache is read where it lies (no copy of its first `len` positions, which
    /// grow with the text); otherwise, and on a CUDA device, it runs those ops.
    ///
    /// Errors: operands of other graphs, devices or dtypes (`GraphMismatch`, `DeviceMismatch`,
    /// `DTypeMismatch`); shapes other than the above a `ShapeMismatch` naming them, `heads` not
    /// a multiple of `kv_heads` too; `len` past `cap` or below `new` a `BadRange` on axis 2.
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let k = g.zeros(&[1, 2, 16, 8], DType::F32)?;
    /// let v = g.zeros(&[1, 2, 16, 8], DType::F32)?;
    /// let q = g.randn(&[1, 4, 1, 8], DType::F32)?;
    /// let o = q.attend_cache(k, v, 5, true)?;
    /// assert_eq!(o.shape().as_slice(), &[1, 4, 1, 8]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn attend_cache(
        self,
        k: Tensor<'g>,
        v: Tensor<'g>,
        len: usize,
        causal: bool,
    ) -> Result<Tensor<'g>> {
        const CACHE: &str = "attend_cache";
        check_pair(CACHE, &self, &k)?;
        check_pair(CACHE, &self, &v)?;
        let (qs, ks, vs) = (self.try_shape()?, k.try_shape()?, v.try_shape()?);
        let mismatch = |lhs: &[usize], rhs: &[usize]| GraphError::ShapeMismatch {
            op: CACHE,
            lhs: lhs.into(),
            rhs: rhs.into(),
        };
        let ([b, heads, new, d], [kb, kv, cap, kd], [vb, vkv, vcap, dv]) = (
            <[usize; 4]>::try_from(&qs[..]).map_err(|_| mismatch(&qs, &ks))?,
            <[usize; 4]>::try_from(&ks[..]).map_err(|_| mismatch(&qs, &ks))?,
            <[usize; 4]>::try_from(&vs[..]).map_err(|_| mismatch(&ks, &vs))?,
        );
        if kb != b || kd != d || kv == 0 || heads % kv != 0 {
            return Err(mismatch(&qs, &ks));
        }
        if [vb, vkv, vcap] != [b, kv, cap] {
            return Err(mismatch(&ks, &vs));
        }
        if len > cap || len < new {
            return Err(GraphError::BadRange {
                op: CACHE,
                axis: 2,
                start: 0,
                end: len,
                shape: ks.to_vec(),
            });
        }
        let (dtype, record) = {
            let i = self.g.inner();
            (
                i.node(CACHE, self.id)?.dtype,
                i.records(&[self.id, k.id, v.id]),
            )
        };
        if record || self.device() != Device::Cpu {
            return self.attend_cache_composed(k, v, len, causal, heads / kv);
        }
        let dims = cpu::attention::CacheDims {
            batch: b,
            heads,
            kv_heads: kv,
            new,
            len,
            cap,
            d,
            dv,
            scale: 1.0 / (d.max(1) as f64).sqrt(),
            causal,
        };
        let out_shape: Shape = smallvec![b, heads, new, dv];
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let [qb, kb, vb] = bufs_of(i, [self, k, v])?;
        let out = i.alloc(CACHE, dtype, b * heads * new * dv)?;
        let threads = i.threads;
        match dtype {
            DType::BF16 => {
                let (o, [q, k, v]) = i.split_mut::<bf16, 3>(CACHE, out, [qb, kb, vb])?;
                k::attend_cache_half(&dims, q, k, v, o, threads);
            }
            DType::F16 => {
                let (o, [q, k, v]) = i.split_mut::<f16, 3>(CACHE, out, [qb, kb, vb])?;
                k::attend_cache_half(&dims, q, k, v, o, threads);
            }
            _ => with_float!(dtype, T, {
                let (o, [q, k, v]) = i.split_mut::<T, 3>(CACHE, out, [qb, kb, vb])?;
                k::attend_cache(&dims, q, k, v, o, threads);
            }),
        }
        let id = i.push(out_shape, dtype, out, Op::Leaf, &[]);
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// [`Tensor::attend_cache`] in recorded ops: the cache's first `len` positions sliced, each
    /// key/value head repeated `group` times, and attention with the causal offset as a mask.
    fn attend_cache_composed(
        self,
        k: Tensor<'g>,
        v: Tensor<'g>,
        len: usize,
        causal: bool,
        group: usize,
    ) -> Result<Tensor<'g>> {
        let repeat = |x: Tensor<'g>| -> Result<Tensor<'g>> {
            let x = x.slice(2, 0, len)?;
            if group == 1 {
                return Ok(x);
            }
            let s = x.try_shape()?;
            let (b, kv, w) = (s[0], s[1], s[3]);
            x.reshape(&[b as isize, kv as isize, 1, len as isize, w as isize])?
                .broadcast_to(&[b, kv, group, len, w])?
                .reshape(&[b as isize, (kv * group) as isize, len as isize, w as isize])
        };
        let new = self.try_shape()?[2];
        // The default scale, 1/√d, as the host path's.
        let mut opts = AttentionOptions::default();
        if causal && new > 1 {
            let past = len - new;
            if past == 0 {
                opts.causal = true;
            } else {
                // Query i (position past + i) sees keys j ≤ past + i.
                let dtype = self.dtype_of("attend_cache")?;
                let rows = self
                    .g
                    .arange(past as f64, len as f64, 1.0, dtype)?
                    .reshape(&[new as isize, 1])?;
                let cols = self.g.arange(0.0, len as f64, 1.0, dtype)?;
                let zero = self.g.zeros(&[new, len], dtype)?;
                opts.mask = Some(zero.masked_fill(cols.gt(rows)?, f64::NEG_INFINITY)?);
            }
        }
        self.scaled_dot_product_attention(repeat(k)?, repeat(v)?, opts)
    }

    /// Self-attention over the heads of a packed projection, as `nn::MultiheadAttention` runs
    /// it: `self` is `[b, l, 3·e]` as an input projection writes it (the queries, keys and
    /// values, each `e = heads·d` wide, head after head), and the output `[b, l, e]` holds the
    /// heads' outputs side by side. The values are those of reshaping `self` to
    /// `[b, l, 3, heads, d]`, taking each part as `[b, heads, l, d]`,
    /// [`Tensor::scaled_dot_product_attention`] with `opts`, and merging the heads back; but on
    /// the host the node keeps no part: forward and backward read the queries, keys and values
    /// out of `self` into scratch let go at once, and the gradient comes in `self`'s layout.
    /// With a mask, or on a CUDA device, it runs those ops.
    ///
    /// Errors: `heads` of 0 is a `BadArgument`; an input that is not `[b, l, w]` with `w` a
    /// multiple of `3·heads` a `ShapeMismatch` naming its shape and `[3·heads]`; a mask from
    /// another graph a `GraphMismatch` (nothing is recorded first); otherwise those of
    /// [`Tensor::scaled_dot_product_attention`].
    ///
    /// ```
    /// use arenagrad_graph::{AttentionOptions, DType, Graph};
    /// let g = Graph::new();
    /// let qkv = g.randn(&[2, 5, 3 * 8], DType::F32)?.set_requires_grad(true)?;
    /// let opts = AttentionOptions { causal: true, ..Default::default() };
    /// let o = qkv.attention_packed(2, opts)?;
    /// assert_eq!(o.shape().as_slice(), &[2, 5, 8]);
    /// o.sum()?.backward()?;
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn attention_packed(self, heads: usize, opts: AttentionOptions<'g>) -> Result<Tensor<'g>> {
        if let Some([Some(x)]) = Tensor::autocast_lower(self.g, [Some(self)])? {
            return x.attention_packed(heads, opts);
        }
        const PACKED: &str = "attention_packed";
        if let Some(m) = opts.mask {
            check_pair(PACKED, &self, &m)?;
        }
        if heads == 0 {
            return Err(GraphError::BadArgument {
                op: PACKED,
                what: "heads must be at least 1",
            });
        }
        let s = self.try_shape()?;
        // The input must be [b, l, w] with w a multiple of 3·heads (the error's second shape).
        let bad = || GraphError::ShapeMismatch {
            op: PACKED,
            lhs: s.to_vec(),
            rhs: vec![heads.saturating_mul(3)],
        };
        let (&[b, l, w], Some(parts)) = (&s[..], heads.checked_mul(3)) else {
            return Err(bad());
        };
        if w % parts != 0 {
            return Err(bad());
        }
        let d = w / parts;
        if self.device() != Device::Cpu || opts.mask.is_some() {
            return packed_composed(self, [b, l, heads, d], opts);
        }
        check_options(&opts)?;
        let dims = self.problem(&opts, [b * heads, l, l, d, d]);
        let layout = [b, l, heads, d];
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (dtype, src) = {
            let nd = i.node(OP, self.id)?;
            (nd.dtype, nd.buf)
        };
        // 16-bit heads are widened group by group where they lie in the packed input; f32
        // and f64 heads are gathered first (their kernel reads each head whole).
        let (parts, half) = if dtype.is_half() {
            (smallvec![src, src, src], HalfLayout::Packed { heads })
        } else {
            (gather_parts(i, src, dtype, layout, 3)?, HalfLayout::Heads)
        };
        let record = i.records(&[self.id]);
        let full = [dims.bh, l, l];
        let p = HostProblem {
            dims: &dims,
            mask: None,
            full: &full,
        };
        let (heads_out, lse) = host_forward(i, (p, &parts, record), dtype, half)?;
        // The parts go back before the output is made, which may reuse one's memory.
        if half == HalfLayout::Heads {
            for part in parts {
                i.release_buf(Device::Cpu, part)?;
            }
        }
        let out = i.alloc(OP, dtype, b * l * heads * d)?;
        merge_parts(i, heads_out, out, dtype, layout, 1)?;
        i.release_buf(Device::Cpu, heads_out)?;
        let node = AttnNode {
            dims,
            mask: false,
            lse,
            packed: Some(heads),
        };
        let shape: Shape = smallvec![b, l, heads * d];
        let id = i.push(
            shape,
            dtype,
            out,
            Op::Attention(std::sync::Arc::new(node)),
            &[self.id],
        );
        drop(guard);
        Ok(self.g.handle(id))
    }
}

/// The queries, keys and values `[b, heads, l, d]` of a packed `[b, l, 3·heads·d]` in tensor
/// ops.
fn packed_split<'g>(qkv: Tensor<'g>, [b, l, h, d]: [usize; 4]) -> Result<[Tensor<'g>; 3]> {
    let (b, l, h, d) = (b as isize, l as isize, h as isize, d as isize);
    let t = qkv.reshape(&[b, l, 3, h, d])?.permute(&[2, 0, 3, 1, 4])?;
    let part = |k: usize| t.slice(0, k, k + 1)?.reshape(&[b, h, l, d]);
    Ok([part(0)?, part(1)?, part(2)?])
}

/// `[b, heads, l, d]` heads → `[b, l, heads·d]` in tensor ops.
fn heads_merged<'g>(o: Tensor<'g>, [b, l, h, d]: [usize; 4]) -> Result<Tensor<'g>> {
    o.permute(&[0, 2, 1, 3])?
        .reshape(&[b as isize, l as isize, (h * d) as isize])
}

/// [`Tensor::attention_packed`] in tensor ops.
fn packed_composed<'g>(
    qkv: Tensor<'g>,
    layout: [usize; 4],
    opts: AttentionOptions<'g>,
) -> Result<Tensor<'g>> {
    let [q, k, v] = packed_split(qkv, layout)?;
    heads_merged(q.scaled_dot_product_attention(k, v, opts)?, layout)
}

/// Part `part` of `parts` of a packed `[b, l, parts, h, d]` buffer as a new `[b, h, l, d]`
/// buffer, for each part.
fn gather_parts(
    i: &mut Inner,
    src: BufId,
    dtype: DType,
    [b, l, h, d]: [usize; 4],
    parts: usize,
) -> Result<SmallVec<[BufId; 3]>> {
    let threads = i.threads;
    let mut out = SmallVec::new();
    for part in 0..parts {
        let buf = i.alloc(OP, dtype, b * h * l * d)?;
        with_storage!(dtype, T, {
            let (dst, [s]) = i.split_mut::<T, 1>(OP, buf, [src])?;
            let row = l * d;
            cpu::par::par_rows_mut(dst, row, threads, cpu::par::PAR_MIN_ELEMS, |bh, blk| {
                let (bi, hi) = (bh / h, bh % h);
                cpu::shape::fill_runs(blk, d, s, |li| {
                    ((bi * l + li) * parts + part) * h * d + hi * d
                });
            });
        });
        out.push(buf);
    }
    Ok(out)
}

/// The inverse of [`gather_parts`]: `src` holds `parts` `[b, h, l, d]` blocks one after the
/// other; `dst` gets them packed as `[b, l, parts, h, d]`.
fn merge_parts(
    i: &mut Inner,
    src: BufId,
    dst: BufId,
    dtype: DType,
    [b, l, h, d]: [usize; 4],
    parts: usize,
) -> Result<()> {
    let threads = i.threads;
    let n = b * h * l * d;
    with_storage!(dtype, T, {
        let (out, [s]) = i.split_mut::<T, 1>(OP, dst, [src])?;
        cpu::par::par_rows_mut(
            out,
            parts * h * d,
            threads,
            cpu::par::PAR_MIN_ELEMS,
            |bl, row| {
                let (bi, li) = (bl / l, bl % l);
                cpu::shape::fill_runs(row, d, s, |ph| {
                    let (p, hi) = (ph / h, ph % h);
                    p * n + ((bi * h + hi) * l + li) * d
                });
            },
        );
    });
    Ok(())
}

/// Whether the operands (queries, keys, values, an optional mask) share one 16-bit dtype: the
/// case the host kernels run on scratch widenings, keeping the node's tensors 16-bit.
fn same_half(xs: [Option<Tensor<'_>>; 4]) -> Result<bool> {
    let q = xs[0].map(|t| t.dtype_of(OP)).transpose()?;
    for x in xs.iter().flatten() {
        if Some(x.dtype_of(OP)?) != q || x.device() != Device::Cpu {
            return Ok(false);
        }
    }
    Ok(q.is_some_and(|d| d.is_half()))
}

/// The shapes of `q`, `k`, `v`, and the weights' shape `[…, lq, lk]`.
fn shapes_of(dims: &AttnDims, qkv: [Tensor<'_>; 3]) -> Result<([Shape; 3], Shape)> {
    let [q, k, v] = qkv.map(|t| t.try_shape());
    let (q, k, v) = (q?, k?, v?);
    let mut full: Shape = q[..q.len() - 2].iter().copied().collect();
    full.extend([dims.lq, dims.lk]);
    Ok(([q, k, v], full))
}

/// The buffers of `ts`.
fn bufs_of<const N: usize>(i: &Inner, ts: [Tensor<'_>; N]) -> Result<[BufId; N]> {
    let bufs = ts
        .iter()
        .map(|t| i.node(OP, t.id).map(|n| n.buf))
        .collect::<Result<SmallVec<[BufId; N]>>>()?;
    Ok(std::array::from_fn(|k| bufs[k]))
}

/// The problem as the host kernels take it: its dimensions, the mask's buffer and shape, and
/// the weights' shape `[…, lq, lk]` the mask broadcasts to.
#[derive(Clone, Copy)]
struct HostProblem<'a> {
    dims: &'a AttnDims,
    mask: Option<&'a (BufId, Shape)>,
    full: &'a [usize],
}

/// A mask's per-head offsets and its row and column strides ([`mask_view`]).
type MaskLayout = (Vec<usize>, usize, usize);

impl HostProblem<'_> {
    /// The mask's layout for the kernels (empty without a mask).
    fn mask_layout(&self) -> MaskLayout {
        self.mask
            .map(|m| mask_view(&m.1, self.full, self.dims))
            .unwrap_or_default()
    }

    /// The mask as the kernels read it: its elements `data` laid out by `layout`.
    fn kernel_mask<'a, T>(&self, data: &'a [T], layout: &'a MaskLayout) -> Option<AttnMask<'a, T>> {
        self.mask.map(|_| AttnMask {
            data,
            offsets: &layout.0,
            rs: layout.1,
            cs: layout.2,
        })
    }
}

/// A host forward kernel for storage `T` whose rows' log-sum-exp is `L`.
type ForwardKernel<'k, T, L> =
    &'k (dyn Fn(&AttnDims, &AttnInputs<'_, T>, usize, &mut [T], &mut [L]) + Sync);

/// The host's forward: the output buffer, and the log-sum-exp's when `record` (it is scratch
/// otherwise). 16-bit operands run the f32 kernel on groups of heads widened on the fly
/// ([`k::attention_forward_half`]), read as `half` lays them out, their log-sum-exp kept in
/// f32. f32 and f64 operands are whole heads one after the other (`half` is
/// [`HalfLayout::Heads`] for them).
fn host_forward(
    i: &mut Inner,
    args: (HostProblem<'_>, &[BufId], bool),
    dtype: DType,
    half: HalfLayout,
) -> Result<(BufId, Option<BufId>)> {
    debug_assert!(dtype.is_half() || half == HalfLayout::Heads);
    match dtype {
        DType::F64 => host_forward_in::<f64, f64>(i, args, &k::attention_forward),
        DType::BF16 => host_forward_in::<bf16, f32>(i, args, &|d, x, h0, o, l| {
            k::attention_forward_half(d, x, half, h0, o, l)
        }),
        DType::F16 => host_forward_in::<f16, f32>(i, args, &|d, x, h0, o, l| {
            k::attention_forward_half(d, x, half, h0, o, l)
        }),
        _ => host_forward_in::<f32, f32>(i, args, &k::attention_forward),
    }
}

/// [`host_forward`] in storage `T`, log-sum-exp `L`. The output is written in place; the
/// log-sum-exp on the host, then copied into the arena when kept.
fn host_forward_in<T: Storage + Send + Sync, L: Storage + Float>(
    i: &mut Inner,
    (p, bufs, record): (HostProblem<'_>, &[BufId], bool),
    kernel: ForwardKernel<T, L>,
) -> Result<(BufId, Option<BufId>)> {
    let HostProblem { dims, mask, .. } = p;
    let (o_len, lse_len) = (dims.bh * dims.lq * dims.dv, dims.bh * dims.lq);
    let o = i.alloc(OP, T::DTYPE, o_len)?;
    let threads = i.threads;
    let mut lse = try_vec::<L>(OP, &[dims.bh, dims.lq], lse_len)?;
    lse.resize(lse_len, L::ZERO);
    if lse_len == 0 {
        // No query row: nothing to compute (and no per-head list of mask offsets, which
        // for 2^40 heads of no rows was the only large thing made).
        let kept = if record {
            Some(i.alloc(OP, L::DTYPE, 0)?)
        } else {
            None
        };
        return Ok((o, kept));
    }
    let mb = mask.map_or(bufs[0], |m| m.0);
    let (os, [q, kk, vv, md]) = i.split_mut::<T, 4>(OP, o, [bufs[0], bufs[1], bufs[2], mb])?;
    let layout = p.mask_layout();
    let mv = p.kernel_mask(md, &layout);
    let inputs = AttnInputs {
        q,
        k: kk,
        v: vv,
        mask: mv.as_ref(),
        first: 0,
    };
    forward_threads(dims, os, &mut lse, threads, |h0, o, l| {
        kernel(dims, &inputs, h0, o, l)
    });
    if !record {
        return Ok((o, None));
    }
    let kept = i.alloc(OP, L::DTYPE, lse_len)?;
    i.split_mut::<L, 0>(OP, kept, [])?.0.copy_from_slice(&lse);
    Ok((o, Some(kept)))
}

/// Whether a CUDA device runs this problem with the fused kernels: unless a mask's leading axes
/// are more than their parameters hold.
#[cfg(feature = "cuda")]
fn fused_on_device(masked: bool, lead_rank: usize) -> bool {
    !masked || lead_rank <= arenagrad_exec::cuda::MAX_DIMS
}

/// Without the `cuda` feature no device tensor exists.
#[cfg(not(feature = "cuda"))]
fn fused_on_device(_: bool, _: usize) -> bool {
    false
}

/// The mask at `data` as the device kernels take it, from its strides `st` broadcast to `full`.
#[cfg(feature = "cuda")]
fn device_mask<'a>(
    data: arenagrad_alloc::block_cache::DevicePtr,
    st: &'a [usize],
    full: &'a [usize],
) -> arenagrad_exec::cuda::DeviceMask<'a> {
    let r = full.len();
    arenagrad_exec::cuda::DeviceMask {
        data,
        lead_shape: &full[..r - 2],
        lead_strides: &st[..r - 2],
        rs: st[r - 2],
        cs: st[r - 1],
    }
}

/// Each head's first mask element and the row and column strides of the mask broadcast to
/// `full` (`[…, lq, lk]`).
fn mask_view(ms: &[usize], full: &[usize], dims: &AttnDims) -> (Vec<usize>, usize, usize) {
    let st = broadcast_strides(ms, full);
    let r = full.len();
    let lead = &full[..r - 2];
    let mut offsets = Vec::with_capacity(dims.bh);
    for h in 0..dims.bh {
        let (mut rem, mut off) = (h, 0);
        for a in (0..lead.len()).rev() {
            off += (rem % lead[a]) * st[a];
            rem /= lead[a];
        }
        offsets.push(off);
    }
    (offsets, st[r - 2], st[r - 1])
}

/// Splits the heads into parts ([`split_heads`]), each one run of the forward `kernel`
/// (`(first head, output part, lse part)`) on whichever thread claims it.
fn forward_threads<T: Send, L: Send>(
    dims: &AttnDims,
    o: &mut [T],
    lse: &mut [L],
    threads: usize,
    kernel: impl Fn(usize, &mut [T], &mut [L]) + Sync,
) {
    let (per, t) = split_heads(dims, threads);
    if t <= 1 {
        kernel(0, o, lse);
        return;
    }
    let parts: Vec<(usize, &mut [T], &mut [L])> = o
        .chunks_mut(per * dims.lq * dims.dv)
        .zip(lse.chunks_mut(per * dims.lq))
        .enumerate()
        .map(|(j, (o, l))| (j * per, o, l))
        .collect();
    claim_each(parts, t, |_, (h0, o, l)| kernel(*h0, o, l));
}

/// Heads per part and the number of threads that claim the parts: all heads in one part on
/// one thread unless there are several heads of enough work each, and then about
/// [`PARTS_PER_THREAD`] parts a thread, so that a thread slowed by other work on its core
/// takes fewer (a head's results do not depend on its part or thread).
fn split_heads(dims: &AttnDims, threads: usize) -> (usize, usize) {
    let work = dims
        .lq
        .saturating_mul(dims.lk)
        .saturating_mul(dims.d.saturating_add(dims.dv));
    let big = work.saturating_mul(dims.bh) >= 1 << 16;
    let t = if dims.bh >= 2 && big && dims.dv > 0 && dims.d > 0 {
        threads.clamp(1, dims.bh)
    } else {
        1
    };
    let parts = if t <= 1 { 1 } else { t * PARTS_PER_THREAD };
    // At least one head per part: an empty batch is one (empty) part.
    (dims.bh.div_ceil(parts).max(1), t)
}

/// The parts of the heads per thread (when they are split at all).
const PARTS_PER_THREAD: usize = 16;

/// The dropout decisions as a 0/1 tensor of shape `full` ([`k::keeps`], the fused kernels'
/// mask), for the composed paths.
fn keep_mask<'g>(q: Tensor<'g>, dims: &AttnDims, full: &[usize]) -> Result<Tensor<'g>> {
    let (lq, lk) = (dims.lq, dims.lk);
    let dims = *dims;
    let m = q.g.filled_by(OP, full, q.dtype(), move |e| {
        let (h, rest) = (e / (lq * lk), e % (lq * lk));
        f64::from(u8::from(k::keeps(&dims, h, rest / lk, rest % lk)))
    })?;
    m.to_device(q.device())
}

/// The scores `q·kᵀ·scale + mask`, −∞ where causal hides a key, in tensor ops.
fn composed_scores<'g>(
    q: Tensor<'g>,
    k: Tensor<'g>,
    mask: Option<Tensor<'g>>,
    dims: &AttnDims,
) -> Result<Tensor<'g>> {
    let r = q.try_shape()?.len();
    let mut s = q
        .matmul(k.transpose(r as isize - 2, r as isize - 1)?)?
        .scale(dims.scale)?;
    if let Some(m) = mask {
        s = s.add(m.detach()?)?;
    }
    if dims.causal {
        let hide = {
            let _ng = q.g.no_grad();
            let ones =
                q.g.full_on(&[dims.lq, dims.lk], 1.0, q.dtype(), q.device())?;
            ones.triu(1)?
        };
        s = s.masked_fill(hide, f64::NEG_INFINITY)?;
    }
    Ok(s)
}

/// The attention weights after dropout, and before.
fn composed_weights<'g>(
    q: Tensor<'g>,
    k: Tensor<'g>,
    mask: Option<Tensor<'g>>,
    dims: &AttnDims,
    full: &[usize],
) -> Result<(Tensor<'g>, Tensor<'g>, Option<Tensor<'g>>)> {
    let s = composed_scores(q, k, mask, dims)?;
    // PyTorch's safe softmax: a row whose every key is hidden gets weights 0, not NaN.
    let hidden = {
        let _ng = q.g.no_grad();
        let ninf = q.g.full_on(&[], f64::NEG_INFINITY, q.dtype(), q.device())?;
        s.max_axes(&[-1], true)?.eq(ninf)?
    };
    let p = s.softmax(-1)?.masked_fill(hidden, 0.0)?;
    if dims.dropout == 0.0 {
        return Ok((p, p, None));
    }
    let z = keep_mask(q, dims, full)?;
    let zs = if dims.dropout < 1.0 {
        z.scale(1.0 / (1.0 - dims.dropout))?
    } else {
        z
    };
    Ok((p.mul(zs)?, p, Some(zs)))
}

/// The forward written in tensor ops (a CUDA device's path); its gradient is autodiff's.
fn composed_forward<'g>(
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    mask: Option<Tensor<'g>>,
    dims: &AttnDims,
    full: &[usize],
) -> Result<Tensor<'g>> {
    if dims.lk == 0 {
        let mut s = q.try_shape()?;
        let r = s.len();
        s[r - 1] = dims.dv;
        return q.g.full_on(&s, 0.0, q.dtype(), q.device());
    }
    let (pd, _, _) = composed_weights(q, k, mask, dims, full)?;
    pd.matmul(v)
}

pub(crate) fn backward<'g>(nd: &AttnNode, c: &Ctx<'g>) -> Result<Grads<'g>> {
    if let Some(heads) = nd.packed {
        return packed_backward(nd, heads, c);
    }
    let (q, kt, vt) = (c.input(0), c.input(1), c.input(2));
    let mask = nd.mask.then(|| c.input(3));
    let dims = nd.dims;
    let mut grads: Grads<'g> = if c.create_graph {
        composed_backward(q, kt, vt, mask, &dims, c.gy)?
    } else if q.device() != Device::Cpu {
        device_backward(nd, c, q, kt, vt, mask)?
    } else {
        fused_backward(nd, c, q, kt, vt, mask)?
    };
    if nd.mask {
        grads.push(None);
    }
    Ok(grads)
}

/// [`Tensor::attention_packed`]'s rule: the host kernels on the parts gathered again (and the
/// output and its gradient as heads) in f32 and f64, read where they lie in the packed input,
/// output and gradient in the 16-bit dtypes ([`HalfLayout::Packed`]); the three gradients
/// packed into one in the input's layout; in tensor ops under `create_graph`.
fn packed_backward<'g>(nd: &AttnNode, heads: usize, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let qkv = c.input(0);
    let s = qkv.try_shape()?;
    let dims = nd.dims;
    let layout = [s[0], s[1], heads, dims.d];
    if c.create_graph {
        let [q, k, v] = packed_split(qkv, layout)?;
        let [b, l, h, d] = layout.map(|x| x as isize);
        let go = c.gy.reshape(&[b, l, h, d])?.permute(&[0, 2, 1, 3])?;
        let grads = composed_backward(q, k, v, None, &dims, go)?;
        let merged = grads
            .into_iter()
            .map(|g| {
                let g = g.expect("invariant: the composed rule gives all three gradients");
                heads_merged(g, layout)
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(smallvec![Some(c.g.concat(&merged, -1)?)]);
    }
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let dtype = i.node(OP, qkv.id)?.dtype;
    let [src, ob, gb] = bufs_of(i, [qkv, c.out, c.gy])?;
    // As the forward: 16-bit heads widened where they lie, f32 and f64 heads gathered.
    let (scratch, half) = if dtype.is_half() {
        (SmallVec::new(), HalfLayout::Packed { heads })
    } else {
        let mut s = gather_parts(i, src, dtype, layout, 3)?;
        s.extend(gather_parts(i, ob, dtype, layout, 1)?);
        s.extend(gather_parts(i, gb, dtype, layout, 1)?);
        (s, HalfLayout::Heads)
    };
    let full = [dims.bh, dims.lq, dims.lk];
    let p = HostProblem {
        dims: &dims,
        mask: None,
        full: &full,
    };
    let bufs = match half {
        HalfLayout::Packed { .. } => [src, src, src, ob, gb],
        HalfLayout::Heads => [scratch[0], scratch[1], scratch[2], scratch[3], scratch[4]],
    };
    let args = (p, bufs, nd.kept_lse());
    let all = host_backward(i, args, dtype, half)?;
    let grad = i.alloc(OP, dtype, s.iter().product())?;
    merge_parts(i, all, grad, dtype, layout, 3)?;
    for b in scratch.into_iter().chain([all]) {
        i.release_buf(Device::Cpu, b)?;
    }
    let id = i.push_on(Device::Cpu, s, dtype, grad, Op::Leaf, &[]);
    drop(guard);
    Ok(smallvec![Some(c.g.handle(id))])
}

/// The rule in tensor ops, differentiable again.
fn composed_backward<'g>(
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    mask: Option<Tensor<'g>>,
    dims: &AttnDims,
    go: Tensor<'g>,
) -> Result<Grads<'g>> {
    let r = q.try_shape()?.len() as isize;
    let mut full: Vec<usize> = q.try_shape()?[..r as usize - 2].to_vec();
    full.extend([dims.lq, dims.lk]);
    if dims.lk == 0 {
        return Ok(smallvec![
            Some(q.g.full_on(&q.shape(), 0.0, q.dtype(), q.device())?),
            Some(k.g.full_on(&k.shape(), 0.0, k.dtype(), k.device())?),
            Some(v.g.full_on(&v.shape(), 0.0, v.dtype(), v.device())?),
        ]);
    }
    let tr = |t: Tensor<'g>| t.transpose(r - 2, r - 1);
    let (pd, p, z) = composed_weights(q, k, mask, dims, &full)?;
    let dv = tr(pd)?.matmul(go)?;
    let mut dp = go.matmul(tr(v)?)?;
    if let Some(z) = z {
        dp = dp.mul(z)?;
    }
    let ds = p
        .mul(dp.sub(dp.mul(p)?.sum_axes(&[-1], true)?)?)?
        .scale(dims.scale)?;
    let dq = ds.matmul(k)?;
    let dk = tr(ds)?.matmul(q)?;
    Ok(smallvec![Some(dq), Some(dk), Some(dv)])
}

/// The fused backward on a CUDA device.
fn device_backward<'g>(
    nd: &AttnNode,
    c: &Ctx<'g>,
    q: Tensor<'g>,
    kt: Tensor<'g>,
    vt: Tensor<'g>,
    mask: Option<Tensor<'g>>,
) -> Result<Grads<'g>> {
    let dims = nd.dims;
    let dev = q.device();
    // `full` serves the mask's layout, which exists only for a device build.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    let ([qs, ks, vs], full) = shapes_of(&dims, [q, kt, vt])?;
    #[cfg(feature = "cuda")]
    let st = mask
        .map(|m| m.try_shape().map(|ms| broadcast_strides(&ms, &full)))
        .transpose()?;
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let dtype = i.node(OP, q.id)?.dtype;
    let [qb, kb, vb, ob, gb] = bufs_of(i, [q, kt, vt, c.out, c.gy])?;
    let mb = match mask {
        Some(m) => bufs_of(i, [m])?[0],
        None => qb,
    };
    let lse = nd.kept_lse();
    let mut grads: Grads<'g> = SmallVec::new();
    let mut out = [qb; 3];
    for (slot, len) in out.iter_mut().zip([
        dims.bh * dims.lq * dims.d,
        dims.bh * dims.lk * dims.d,
        dims.bh * dims.lk * dims.dv,
    ]) {
        *slot = i.alloc_on(OP, dev, dtype, len)?;
    }
    let [dq, dk, dv] = out;
    on_cuda!(
        i,
        OP,
        dev,
        [qb, kb, vb, mb, ob, lse, gb, dq, dk, dv],
        |be, [qp, kp, vp, mp, op, lp, gp, dqp, dkp, dvp]| {
            let m = st.as_ref().map(|st| device_mask(mp, st, &full));
            be.attention_backward(
                dtype,
                &dims,
                (qp, kp, vp),
                m.as_ref(),
                (op, lp, gp),
                (dqp, dkp, dvp),
            )
        }
    );
    for (shape, b) in [(qs, dq), (ks, dk), (vs, dv)] {
        let id = i.push_on(dev, shape, dtype, b, Op::Leaf, &[]);
        grads.push(Some(c.g.handle(id)));
    }
    drop(guard);
    Ok(grads)
}

/// A thread's first head and its parts of dq, dk and dv.
type HeadGrads<'a, T> = (usize, &'a mut [T], &'a mut [T], &'a mut [T]);

/// A host backward kernel for storage `T` whose rows' log-sum-exp is `L`.
#[rustfmt::skip] // rustfmt keeps the signature on one line of 130 columns
type BackwardKernel<'k, T, L> = &'k (dyn Fn(
    &AttnDims,
    &AttnInputs<'_, T>,
    &AttnSaved<'_, T, L>,
    (usize, usize),
    AttnGrads<'_, T>,
) + Sync);

fn fused_backward<'g>(
    nd: &AttnNode,
    c: &Ctx<'g>,
    q: Tensor<'g>,
    kt: Tensor<'g>,
    vt: Tensor<'g>,
    mask: Option<Tensor<'g>>,
) -> Result<Grads<'g>> {
    let dims = nd.dims;
    let ([qs, ks, vs], full) = shapes_of(&dims, [q, kt, vt])?;
    let mask_shape = mask.map(|m| m.try_shape()).transpose()?;
    let mut guard = c.g.inner();
    let i = &mut *guard;
    let dtype = i.node(OP, q.id)?.dtype;
    // The gradient is of the output's dtype (autodiff's seed and accumulation check it).
    let bufs = bufs_of(i, [q, kt, vt, c.out, c.gy])?;
    let mask = match (mask, mask_shape) {
        (Some(m), Some(ms)) => Some((bufs_of(i, [m])?[0], ms)),
        _ => None,
    };
    let p = HostProblem {
        dims: &dims,
        mask: mask.as_ref(),
        full: &full,
    };
    let args = (p, bufs, nd.kept_lse());
    let all = host_backward(i, args, dtype, HalfLayout::Heads)?;
    let (nq, nk, nv) = (
        dims.bh * dims.lq * dims.d,
        dims.bh * dims.lk * dims.d,
        dims.bh * dims.lk * dims.dv,
    );
    let grads = split_grads(i, c, [(qs, nq), (ks, nk), (vs, nv)], dtype, all)?;
    drop(guard);
    Ok(grads)
}

/// The host's backward in `dtype`: [`backward_in`] with the kernel for it (16-bit operands on
/// groups of heads widened on the fly, read as `half` lays them out, their log-sum-exp f32;
/// `half` is [`HalfLayout::Heads`] for f32 and f64).
fn host_backward(
    i: &mut Inner,
    args: (HostProblem<'_>, [BufId; 5], BufId),
    dtype: DType,
    half: HalfLayout,
) -> Result<BufId> {
    debug_assert!(dtype.is_half() || half == HalfLayout::Heads);
    match dtype {
        DType::F64 => backward_in::<f64, f64>(i, args, &k::attention_backward),
        DType::BF16 => backward_in::<bf16, f32>(i, args, &|d, x, s, h, g| {
            k::attention_backward_half(d, x, s, half, h, g)
        }),
        DType::F16 => backward_in::<f16, f32>(i, args, &|d, x, s, h, g| {
            k::attention_backward_half(d, x, s, half, h, g)
        }),
        _ => backward_in::<f32, f32>(i, args, &k::attention_backward),
    }
}

/// The gradients of `q`, `k` and `v` one after the other in a new buffer, by `kernel` in
/// storage `T` (log-sum-exp `L`), threaded over heads.
fn backward_in<T: Storage + Send + Sync, L: Storage + Float>(
    i: &mut Inner,
    (p, [qb, kb, vb, ob, gb], lse): (HostProblem<'_>, [BufId; 5], BufId),
    kernel: BackwardKernel<T, L>,
) -> Result<BufId> {
    let HostProblem { dims, mask, .. } = p;
    let dims = *dims;
    let (nq, nk, nv) = (
        dims.bh * dims.lq * dims.d,
        dims.bh * dims.lk * dims.d,
        dims.bh * dims.lk * dims.dv,
    );
    let all = i.alloc(OP, T::DTYPE, nq + nk + nv)?;
    // Empty gradients are computed by doing nothing (no walk over heads of no rows, and no
    // per-head list of mask offsets).
    if nq + nk + nv == 0 {
        return Ok(all);
    }
    let threads = i.threads;
    let mb = mask.map_or(qb, |m| m.0);
    // The rows' log-sum-exp (of another type than the rest for 16-bit tensors), copied out.
    let kept = i
        .arena
        .slice::<L>(lse)
        .map_err(|source| GraphError::Alloc { op: OP, source })?;
    let mut lse = try_vec::<L>(OP, &[dims.bh, dims.lq], kept.len())?;
    lse.extend_from_slice(kept);
    let lse = &lse[..];
    let (out, [q, kk, vv, o, go, md]) = i.split_mut::<T, 6>(OP, all, [qb, kb, vb, ob, gb, mb])?;
    let layout = p.mask_layout();
    let mv = p.kernel_mask(md, &layout);
    let (dq, rest) = out.split_at_mut(nq);
    let (dk, dvv) = rest.split_at_mut(nk);
    let (per, t) = split_heads(&dims, threads);
    let run = |h0: usize, dq: &mut [T], dk: &mut [T], dv: &mut [T]| {
        let heads = dq.len() / (dims.lq * dims.d).max(1);
        let heads = if dims.d == 0 { per } else { heads };
        let inputs = AttnInputs {
            q,
            k: kk,
            v: vv,
            mask: mv.as_ref(),
            first: 0,
        };
        let saved = AttnSaved { o, lse, go };
        let grads = AttnGrads { dq, dk, dv };
        kernel(&dims, &inputs, &saved, (h0, heads.min(dims.bh - h0)), grads)
    };
    if t <= 1 {
        run(0, dq, dk, dvv);
    } else {
        let parts: Vec<HeadGrads<'_, T>> = dq
            .chunks_mut(per * dims.lq * dims.d)
            .zip(dk.chunks_mut(per * dims.lk * dims.d))
            .zip(dvv.chunks_mut(per * dims.lk * dims.dv))
            .enumerate()
            .map(|(j, ((a, b), c))| (j * per, a, b, c))
            .collect();
        claim_each(parts, t, |_, (h0, a, b, c)| run(*h0, a, b, c));
    }
    Ok(all)
}

/// The gradients of `q`, `k` and `v` (each `(shape, len)`) as their own buffers, copied out of
/// `all` (one after the other), which is then let go of.
fn split_grads<'g>(
    i: &mut Inner,
    c: &Ctx<'g>,
    parts: [(Shape, usize); 3],
    dtype: DType,
    all: BufId,
) -> Result<Grads<'g>> {
    let mut grads: Grads<'g> = SmallVec::new();
    let mut at = 0;
    for (shape, len) in parts {
        let b = i.alloc(OP, dtype, len)?;
        with_storage!(dtype, T, {
            let (dst, [src]) = i.split_mut::<T, 1>(OP, b, [all])?;
            dst.copy_from_slice(&src[at..at + len]);
        });
        at += len;
        let id = i.push_on(Device::Cpu, shape, dtype, b, Op::Leaf, &[]);
        grads.push(Some(c.g.handle(id)));
    }
    i.release_buf(Device::Cpu, all)?;
    Ok(grads)
}
