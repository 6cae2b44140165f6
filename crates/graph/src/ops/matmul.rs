//! Matrix products: 2-D, batched, and numpy's rules for 1-D operands and broadcast batch axes.
//!
//! The op records whether each operand is read transposed, so backward's products
//! (`g·bᵀ`, `aᵀ·g`) are GEMM calls with swapped strides — no transpose is materialised.

use arenagrad_alloc::BufId;
use arenagrad_exec::cpu::{self, BatchView, MatView, Mnk};
use arenagrad_exec::layout::{broadcast_shapes, broadcast_strides, contiguous_strides, walk};
use arenagrad_exec::{bf16, DType};
use smallvec::smallvec;

use super::{check_pair, Ctx, Grads, Op};
#[cfg(feature = "cuda")]
use crate::device::on_cuda;
use crate::error::{GraphError, Result};
use crate::shape::{checked_numel, copy_of, Shape};
use crate::{Device, Tensor};

impl<'g> Tensor<'g> {
    /// Matrix product with numpy's `matmul` rules: 2-D × 2-D, batched with broadcast batch axes,
    /// and 1-D operands promoted (and the added axis removed from the result).
    ///
    /// # Examples
    ///
    /// ```
    /// use arenagrad_graph::{DType, Graph};
    /// let g = Graph::new();
    /// let a = g.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    /// let b = g.from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])?;
    /// let c = a.matmul(b)?; // torch: a @ b
    /// assert_eq!(c.shape().as_slice(), &[2, 2]);
    /// assert_eq!(c.to_vec::<f32>()?, vec![4.0, 5.0, 10.0, 11.0]);
    /// // A batch of 5 matrices times one matrix: the batch axis broadcasts.
    /// let batch = g.ones(&[5, 2, 3], DType::F32)?.matmul(b)?;
    /// assert_eq!(batch.shape().as_slice(), &[5, 2, 2]);
    /// # Ok::<(), arenagrad_graph::GraphError>(())
    /// ```
    pub fn matmul(self, other: Tensor<'g>) -> Result<Tensor<'g>> {
        let op = "matmul";
        if let Some([Some(a), Some(b)]) = Tensor::autocast_lower(self.g, [Some(self), Some(other)])?
        {
            return a.matmul(b);
        }
        check_pair(op, &self, &other)?;
        let (ash, bsh) = (self.try_shape()?, other.try_shape()?);
        if ash.is_empty() || bsh.is_empty() {
            return Err(GraphError::MatmulShape {
                op,
                lhs: ash.to_vec(),
                rhs: bsh.to_vec(),
            });
        }
        let a = if ash.len() == 1 {
            self.reshape(&[1, ash[0] as isize])?
        } else {
            self
        };
        let b = if bsh.len() == 1 {
            other.reshape(&[bsh[0] as isize, 1])?
        } else {
            other
        };
        let y = a.matmul_t(b, false, false)?;
        if ash.len() == 1 || bsh.len() == 1 {
            let mut ysh: Vec<isize> = y.shape().iter().map(|&d| d as isize).collect();
            let r = ysh.len();
            if bsh.len() == 1 {
                ysh.remove(r - 1);
            }
            if ash.len() == 1 {
                ysh.remove(ysh.len() - if bsh.len() == 1 { 1 } else { 2 });
            }
            return y.reshape(&ysh);
        }
        Ok(y)
    }

    /// `self + op(a)·op(b)` (PyTorch's `addmm`): `op` transposes a matrix when its flag is set,
    /// and `self` broadcasts to the product's shape. For matrices on the host with `self` of shape
    /// `[m, n]`, `[m, 1]`, `[1, n]`, `[n]`, `[1]` or `[]`, the output starts as `self` broadcast
    /// and the GEMM adds the product onto it, so a layer's bias costs no pass of its own; any
    /// other case is [`Tensor::matmul_t`] then [`Tensor::add`].
    pub fn addmm_t(self, a: Tensor<'g>, b: Tensor<'g>, ta: bool, tb: bool) -> Result<Tensor<'g>> {
        let name = "addmm";
        if let Some([Some(c), Some(a), Some(b)]) =
            Tensor::autocast_lower(self.g, [Some(self), Some(a), Some(b)])?
        {
            return c.addmm_t(a, b, ta, tb);
        }
        if Tensor::any_half(&[Some(self), Some(a), Some(b)])? {
            let native = [self, a, b]
                .iter()
                .all(|t| t.dtype_of(name).is_ok_and(|d| d == DType::BF16))
                && a.device() == Device::Cpu;
            if !native {
                return Tensor::lower([self, a, b], |[c, a, b]| c.addmm_t(a, b, ta, tb));
            }
        }
        check_pair(name, &a, &b)?;
        check_pair(name, &self, &a)?;
        let (csh, ash, bsh) = (self.try_shape()?, a.try_shape()?, b.try_shape()?);
        let plan = match a.device() {
            Device::Cpu => addmm_plan(&csh, &ash, &bsh, ta, tb),
            Device::Cuda(_) => None,
        };
        let Some((m, k, n, c_rows, c_cols)) = plan else {
            return a.matmul_t(b, ta, tb)?.add(self);
        };
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (dtype, cb) = {
            let nd = i.node(name, self.id)?;
            (nd.dtype, nd.buf)
        };
        let (ab, bb) = (i.node(name, a.id)?.buf, i.node(name, b.id)?.buf);
        let len = checked_numel(name, &[m, n])?;
        let out = i.alloc(name, dtype, len)?;
        let threads = i.threads;
        if dtype == DType::BF16 {
            let views = [(ash[1], ta), (bsh[1], tb)];
            let start = Some((cb, c_rows, c_cols));
            product_bf16(
                i,
                name,
                [ab, bb, out],
                (&[0], &[0]),
                Mnk::new(m, k, n),
                views,
                start,
            )?;
        } else {
            with_float!(dtype, T, {
                let (o, [cs, xs, ys]) = i.split_mut::<T, 3>(name, out, [cb, ab, bb])?;
                if n > 0 && c_rows == 1 && o.len() < cpu::par::PAR_MIN_ELEMS {
                    // One bias row for every output row (a linear layer's).
                    if c_cols == 1 {
                        o.fill(cs[0]);
                    } else {
                        cpu::shape::repeat_rows(&cs[..n], o);
                    }
                } else if n > 0 {
                    cpu::par::par_rows_mut(o, n, threads, cpu::par::PAR_MIN_ELEMS, |r, row| {
                        let cr = if c_rows == 1 { 0 } else { r };
                        if c_cols == 1 {
                            row.fill(cs[cr]);
                        } else {
                            row.copy_from_slice(&cs[cr * n..(cr + 1) * n]);
                        }
                    });
                }
                cpu::gemm(
                    Mnk::new(m, k, n),
                    MatView::row_major(xs, 0, ash[1], ta),
                    MatView::row_major(ys, 0, bsh[1], tb),
                    o,
                    true,
                    threads,
                );
            });
        }
        let id = i.push(
            copy_of(&[m, n]),
            dtype,
            out,
            Op::Addmm { ta, tb },
            &[self.id, a.id, b.id],
        );
        drop(guard);
        Ok(self.g.handle(id))
    }

    /// op(self)·op(other) over the last two axes, where op transposes the last two axes when its
    /// flag is set — read through strides, no transpose is copied (`x.matmul_t(w, false, true)`
    /// is a linear layer's `x·wᵀ`). Both operands have rank ≥ 2; batch axes broadcast.
    pub fn matmul_t(self, other: Tensor<'g>, ta: bool, tb: bool) -> Result<Tensor<'g>> {
        let name = "matmul";
        if let Some([Some(a), Some(b)]) = Tensor::autocast_lower(self.g, [Some(self), Some(other)])?
        {
            return a.matmul_t(b, ta, tb);
        }
        check_pair(name, &self, &other)?;
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (ash, dtype, dev, ab) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype, n.device(), n.buf)
        };
        // bf16 on the host multiplies its pairs natively (f32 accumulation); f16, and 16-bit
        // tensors on a device, through f32.
        if dtype.is_half() && !(dtype == DType::BF16 && dev == Device::Cpu) {
            drop(guard);
            return Tensor::lower([self, other], |[a, b]| a.matmul_t(b, ta, tb));
        }
        let (bsh, bb) = {
            let n = i.node(name, other.id)?;
            (copy_of(&n.shape), n.buf)
        };
        let bad = || GraphError::MatmulShape {
            op: name,
            lhs: ash.to_vec(),
            rhs: bsh.to_vec(),
        };
        if ash.len() < 2 || bsh.len() < 2 {
            return Err(bad());
        }
        let (ra, rb) = (ash.len(), bsh.len());
        let (m, ka) = if ta {
            (ash[ra - 1], ash[ra - 2])
        } else {
            (ash[ra - 2], ash[ra - 1])
        };
        let (kb, n) = if tb {
            (bsh[rb - 1], bsh[rb - 2])
        } else {
            (bsh[rb - 2], bsh[rb - 1])
        };
        if ka != kb {
            return Err(bad());
        }
        let (abatch, bbatch) = (&ash[..ra - 2], &bsh[..rb - 2]);
        let batch = broadcast_shapes(abatch, bbatch).ok_or_else(bad)?;
        let mut osh: Shape = copy_of(&batch);
        osh.push(m);
        osh.push(n);
        let len = checked_numel(name, &osh)?;
        let out = i.alloc_on(name, dev, dtype, len)?;
        let threads = i.threads;
        let (a_cols, b_cols) = (ash[ra - 1], bsh[rb - 1]);
        let a_mat = ash[ra - 2] * a_cols;
        let b_mat = bsh[rb - 2] * b_cols;
        if let Device::Cuda(_) = dev {
            #[cfg(not(feature = "cuda"))]
            return Err(crate::device::no_cuda_dev(dev));
            #[cfg(feature = "cuda")]
            {
                let (a_offs, b_offs) = batch_offsets(&batch, abatch, bbatch, a_mat, b_mat, m * n);
                let nb = a_offs.len();
                // One strided-batched call when the batch offsets are evenly spaced (always, unless
                // a middle batch axis broadcasts); otherwise one call per matrix.
                let step = |o: &[usize]| if o.len() > 1 { o[1] - o[0] } else { 0 };
                let (sa, sb) = (step(&a_offs), step(&b_offs));
                let even = (0..nb).all(|t| a_offs[t] == t * sa && b_offs[t] == t * sb);
                on_cuda!(i, name, dev, [ab, bb, out], |be, [x, y, o]| {
                    if even {
                        be.gemm(
                            dtype,
                            nb,
                            m,
                            n,
                            ka,
                            x,
                            sa,
                            ta,
                            y,
                            sb,
                            tb,
                            o,
                            m * n,
                            1.0,
                            0.0,
                        )
                    } else {
                        let at = |p: arenagrad_alloc::block_cache::DevicePtr, off: usize| {
                            arenagrad_alloc::block_cache::DevicePtr(
                                p.0 + (off * dtype.size()) as u64,
                            )
                        };
                        (0..nb).try_for_each(|t| {
                            be.gemm(
                                dtype,
                                1,
                                m,
                                n,
                                ka,
                                at(x, a_offs[t]),
                                0,
                                ta,
                                at(y, b_offs[t]),
                                0,
                                tb,
                                at(o, t * m * n),
                                0,
                                1.0,
                                0.0,
                            )
                        })
                    }
                });
                let id = i.push(osh, dtype, out, Op::Matmul { ta, tb }, &[self.id, other.id]);
                drop(guard);
                return Ok(self.g.handle(id));
            }
        }
        if dtype == DType::BF16 {
            let (a_offs, b_offs) = batch_offsets(&batch, abatch, bbatch, a_mat, b_mat, m * n);
            product_bf16(
                i,
                name,
                [ab, bb, out],
                (&a_offs, &b_offs),
                Mnk::new(m, ka, n),
                [(a_cols, ta), (b_cols, tb)],
                None,
            )?;
        } else {
            with_float!(dtype, T, {
                let (o, [x, y]) = i.split_mut::<T, 2>(name, out, [ab, bb])?;
                if batch.iter().product::<usize>() == 1 {
                    cpu::gemm(
                        Mnk::new(m, ka, n),
                        MatView::row_major(x, 0, a_cols, ta),
                        MatView::row_major(y, 0, b_cols, tb),
                        o,
                        false,
                        threads,
                    );
                } else {
                    // Each batch index: offsets of its matrices in a and b (stride 0 where broadcast).
                    let (a_offs, b_offs) =
                        batch_offsets(&batch, abatch, bbatch, a_mat, b_mat, m * n);
                    let a = BatchView {
                        data: x,
                        offsets: &a_offs,
                        cols: a_cols,
                        transposed: ta,
                    };
                    let b = BatchView {
                        data: y,
                        offsets: &b_offs,
                        cols: b_cols,
                        transposed: tb,
                    };
                    cpu::gemm_batched(Mnk::new(m, ka, n), a, b, o, threads);
                }
            });
        }
        let id = i.push(osh, dtype, out, Op::Matmul { ta, tb }, &[self.id, other.id]);
        drop(guard);
        Ok(self.g.handle(id))
    }
}

/// The element offsets of each batch's matrices in `a` and `b` (stride 0 where broadcast).
fn batch_offsets(
    batch: &[usize],
    abatch: &[usize],
    bbatch: &[usize],
    a_mat: usize,
    b_mat: usize,
    o_mat: usize,
) -> (Vec<usize>, Vec<usize>) {
    let sa: Vec<usize> = broadcast_strides(abatch, batch)
        .iter()
        .map(|s| s * a_mat)
        .collect();
    let sb: Vec<usize> = broadcast_strides(bbatch, batch)
        .iter()
        .map(|s| s * b_mat)
        .collect();
    let so: Vec<usize> = contiguous_strides(batch)
        .iter()
        .map(|s| s * o_mat)
        .collect();
    let mut a_offs = Vec::new();
    let mut b_offs = Vec::new();
    walk(batch, [&so, &sa, &sb], |[_, oa, ob], cnt, [_, ia, ib]| {
        for t in 0..cnt {
            a_offs.push(oa + t * ia);
            b_offs.push(ob + t * ib);
        }
    });
    (a_offs, b_offs)
}

impl<'g> Tensor<'g> {
    /// `Σ_b op(self_b)·op(other_b)` over the batch axes both operands share, accumulated into
    /// one `[m, n]` buffer by GEMMs with β = 1 (never recorded: the fused gradient of a matrix
    /// broadcast over a batch, such as a convolution's weight, without materialising one
    /// product per batch entry).
    fn matmul_t_batch_sum(self, other: Tensor<'g>, ta: bool, tb: bool) -> Result<Tensor<'g>> {
        let name = "matmul";
        let mut guard = self.g.inner();
        let i = &mut *guard;
        let (ash, dtype, ab) = {
            let n = i.node(name, self.id)?;
            (copy_of(&n.shape), n.dtype, n.buf)
        };
        let (bsh, bb) = {
            let n = i.node(name, other.id)?;
            (copy_of(&n.shape), n.buf)
        };
        let r = ash.len();
        let (m, k) = if ta {
            (ash[r - 1], ash[r - 2])
        } else {
            (ash[r - 2], ash[r - 1])
        };
        let n = if tb { bsh[r - 2] } else { bsh[r - 1] };
        let batch: usize = ash[..r - 2].iter().product();
        let (a_mat, b_mat) = (ash[r - 2] * ash[r - 1], bsh[r - 2] * bsh[r - 1]);
        let (a_cols, b_cols) = (ash[r - 1], bsh[r - 1]);
        let out = i.alloc_zeroed(name, dtype, m * n)?;
        let threads = i.threads;
        with_float!(dtype, T, {
            let (o, [x, y]) = i.split_mut::<T, 2>(name, out, [ab, bb])?;
            let groups = threads.min(batch).max(1);
            let one = |t: usize, acc: &mut [T], threads: usize| {
                cpu::gemm(
                    Mnk::new(m, k, n),
                    MatView::row_major(x, t * a_mat, a_cols, ta),
                    MatView::row_major(y, t * b_mat, b_cols, tb),
                    acc,
                    true,
                    threads,
                )
            };
            if groups <= 1 || m * n * k * batch < (1 << 22) {
                (0..batch).for_each(|t| one(t, o, threads));
            } else {
                // Each thread sums its share of the batch into its own buffer (the first into
                // the output), then the partial sums are added: one fork instead of one per
                // batch entry.
                let per = batch.div_ceil(groups);
                let mut partial = vec![<T as arenagrad_exec::Float>::ZERO; (groups - 1) * m * n];
                let mut parts: Vec<&mut [T]> = vec![&mut *o];
                parts.extend(partial.chunks_mut(m * n));
                cpu::thread_pool::for_each_part(parts, |g, acc| {
                    (g * per..((g + 1) * per).min(batch)).for_each(|t| one(t, acc, 1));
                });
                for p in partial.chunks(m * n) {
                    for (v, &q) in o.iter_mut().zip(p) {
                        *v += q;
                    }
                }
            }
        });
        let id = i.push(copy_of(&[m, n]), dtype, out, Op::Leaf, &[]);
        drop(guard);
        Ok(self.g.handle(id))
    }
}

/// `sum_to(op(x)·op(y), target)`: through [`Tensor::matmul_t_batch_sum`] when the sum is over
/// every batch axis of two operands with the same batch shape (a host tensor, no graph to
/// record), else as a product and a reduction.
fn product_summed_to<'g>(
    x: Tensor<'g>,
    y: Tensor<'g>,
    tx: bool,
    ty: bool,
    target: &[usize],
    c: &Ctx<'g>,
) -> Result<Tensor<'g>> {
    let (xs, ys) = (x.try_shape()?, y.try_shape()?);
    let fused = !c.create_graph
        && target.len() == 2
        && xs.len() > 2
        && xs.len() == ys.len()
        && xs[..xs.len() - 2] == ys[..ys.len() - 2]
        && x.device() == Device::Cpu
        && !x.dtype_of("matmul")?.is_half();
    if fused {
        return x.matmul_t_batch_sum(y, tx, ty);
    }
    x.matmul_t(y, tx, ty)?.sum_to(target)
}

/// The gradient of `target`, `sum_to(op(x)·op(y), target's shape)` — or `None` when it went
/// straight into a parameter ([`product_into_param`]).
fn input_grad<'g>(
    target: Tensor<'g>,
    x: Tensor<'g>,
    y: Tensor<'g>,
    tx: bool,
    ty: bool,
    c: &Ctx<'g>,
) -> Result<Option<Tensor<'g>>> {
    if product_into_param(target, x, y, tx, ty, c)? {
        return Ok(None);
    }
    product_summed_to(x, y, tx, ty, &target.shape(), c).map(Some)
}

/// Adds `op(x)·op(y)` straight into the gradient storage of `target` when it is a parameter's
/// leaf on the host, the backward is a plain one ([`Ctx::into_params`]) and all three are
/// matrices of one dtype: no arena buffer then holds a weight gradient. Returns false, having
/// done nothing, where that does not apply.
fn product_into_param<'g>(
    target: Tensor<'g>,
    x: Tensor<'g>,
    y: Tensor<'g>,
    tx: bool,
    ty: bool,
    c: &Ctx<'g>,
) -> Result<bool> {
    if !c.into_params {
        return Ok(false);
    }
    let name = "matmul";
    let i = c.g.inner.borrow();
    let t = i.node(name, target.id)?;
    let Op::Param(p) = &t.op else {
        return Ok(false);
    };
    if i.has_hook(target.id) {
        // Its gradient must pass through the hook first.
        return Ok(false);
    }
    let (xn, yn) = (i.node(name, x.id)?, i.node(name, y.id)?);
    let on_host = [t.device(), xn.device(), yn.device()] == [Device::Cpu; 3];
    if !on_host || xn.shape.len() != 2 || yn.shape.len() != 2 || t.shape.len() != 2 {
        return Ok(false);
    }
    let (xs, ys) = (&xn.shape, &yn.shape);
    let (m, k) = if tx { (xs[1], xs[0]) } else { (xs[0], xs[1]) };
    let n = if ty { ys[0] } else { ys[1] };
    if t.shape[..] != [m, n] || t.dtype != xn.dtype || t.dtype != yn.dtype || t.dtype.is_half() {
        return Ok(false);
    }
    let threads = i.threads;
    with_float!(t.dtype, T, {
        let (xd, yd) = (i.read::<T>(name, x.id)?, i.read::<T>(name, y.id)?);
        p.accumulate_with::<T>(m * n, |acc, fresh| {
            cpu::gemm(
                Mnk::new(m, k, n),
                MatView::row_major(&xd, 0, xs[1], tx),
                MatView::row_major(&yd, 0, ys[1], ty),
                acc,
                !fresh,
                threads,
            )
        });
    });
    Ok(true)
}

/// The bf16 product `out = op(a)·op(b)` of each pair of matrices at `offsets` (in elements of
/// `a` and `b`; `out`'s matrices follow one another): bf16 pairs multiplied and summed in f32
/// ([`cpu::bf16::gemm_bf16`], `vdpbf16ps` where the CPU has it), rounded once into `out`.
/// `views` holds each operand's row length and whether it is read transposed. With `start`
/// (`c`, its rows, its columns: 1 or the output's), the one product is added to `c` broadcast
/// over it, in f32, before the one rounding (`addmm`).
pub(crate) fn product_bf16(
    i: &mut crate::graph::Inner,
    name: &'static str,
    [ab, bb, out]: [BufId; 3],
    (a_offs, b_offs): (&[usize], &[usize]),
    dims: Mnk,
    [(a_cols, ta), (b_cols, tb)]: [(usize, bool); 2],
    start: Option<(BufId, usize, usize)>,
) -> Result<()> {
    let per = dims.m * dims.n;
    if a_offs.len() == 1 && start.is_none_or(|(_, c_rows, _)| c_rows == 1) {
        // One product from nothing or from a row (a layer's bias), rounded without the f32
        // buffer below (the same bits): on AMX from each thread's sums as they are made; off
        // it, for many rows, block by block from each thread's scratch.
        let amx = cpu::bf16::amx_in_use();
        let blocks = !amx && dims.k > 0 && dims.n > 0 && dims.m >= 2 * rounded_rows(dims.n);
        if amx || blocks {
            let alloc = |source| GraphError::Alloc { op: name, source };
            let row: Option<(Vec<bf16>, usize)> = match start {
                Some((cb, _, c_cols)) => {
                    Some((i.arena.slice::<bf16>(cb).map_err(alloc)?.to_vec(), c_cols))
                }
                None => None,
            };
            let threads = i.threads;
            let (o, x, y) = i
                .arena
                .split_mixed::<bf16, bf16, bf16>(out, ab, bb)
                .map_err(alloc)?;
            let start = row.as_ref().map(|(c, cols)| cpu::bf16::Start {
                c,
                rows: 1,
                cols: *cols,
            });
            let a = MatView::row_major(x, a_offs[0], a_cols, ta);
            let b = MatView::row_major(y, b_offs[0], b_cols, tb);
            if blocks {
                rounded_in_blocks(dims, a, b, start, o, threads);
                return Ok(());
            }
            if cpu::bf16::gemm_bf16_rounded(dims, a, b, start, o, threads) {
                return Ok(());
            }
        }
    }
    let acc = i.alloc(name, DType::F32, per * a_offs.len())?;
    let threads = i.threads;
    if let Some((cb, c_rows, c_cols)) = start {
        let (o, c, _) = i
            .arena
            .split_mixed::<f32, bf16, bf16>(acc, cb, cb)
            .map_err(|source| GraphError::Alloc { op: name, source })?;
        let n = dims.n;
        // Every product of the batch starts from `c` (a product's row `r` is row `r mod m`),
        // written by the threads.
        if n > 0 {
            let start = cpu::bf16::Start {
                c,
                rows: c_rows,
                cols: c_cols,
            };
            cpu::par::par_rows_mut(o, n, threads, cpu::par::PAR_MIN_ELEMS, |r, row| {
                start.row_into(r, row)
            });
        }
    }
    {
        let (o, x, y) = i
            .arena
            .split_mixed::<f32, bf16, bf16>(acc, ab, bb)
            .map_err(|source| GraphError::Alloc { op: name, source })?;
        let product = |t: usize, o: &mut [f32], threads: usize| {
            cpu::bf16::gemm_bf16(
                dims,
                MatView::row_major(x, a_offs[t], a_cols, ta),
                MatView::row_major(y, b_offs[t], b_cols, tb),
                o,
                start.is_some(),
                threads,
            )
        };
        let batch = a_offs.len();
        let work = dims.m.saturating_mul(dims.k).saturating_mul(dims.n);
        if batch >= 4 * threads || (batch > 1 && work < 1 << 20) {
            // Many products (a convolution's images), or small ones: whole products to each
            // thread, as the f32 products run, not each product split over threads in turn.
            cpu::par::par_rows_mut(o, per, threads, 0, |t, o| product(t, o, 1));
        } else {
            for (t, o) in o.chunks_mut(per.max(1)).enumerate().take(batch) {
                product(t, o, threads);
            }
        }
    }
    {
        let (o, w, _) = i
            .arena
            .split_mixed::<bf16, f32, f32>(out, acc, acc)
            .map_err(|source| GraphError::Alloc { op: name, source })?;
        cpu::cast(w, o, threads);
    }
    i.release_buf(Device::Cpu, acc)
}

/// The rows of a block of [`rounded_in_blocks`] for a product of `n` columns: about 2¹⁷ f32
/// sums (512 KB, within a core's level-2 cache), at least 64 rows (each block packs all of `b`
/// again) and at most 1024.
fn rounded_rows(n: usize) -> usize {
    ((1 << 17) / n.max(1)).clamp(64, 1024)
}

/// [`product_bf16`]'s `out = round(start + a·b)` for one product of many rows off AMX (a linear
/// layer over a batch's tokens): blocks of [`rounded_rows`] rows to the threads, each block's f32
/// sums made in the thread's scratch and rounded into `out` from there. The whole product's
/// sums had gone through an f32 buffer in memory and been cast after. The same bits: an
/// output's sum does not depend on the rows around it.
fn rounded_in_blocks(
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    start: Option<cpu::bf16::Start<'_>>,
    out: &mut [bf16],
    threads: usize,
) {
    use cpu::Gemm;
    let Mnk { m, k, n } = dims;
    let rows = rounded_rows(n);
    let parts: Vec<&mut [bf16]> = out[..m * n].chunks_mut(rows * n).collect();
    cpu::par::claim_each(parts, threads, |p, part| {
        let r = part.len() / n;
        let a = MatView {
            offset: a.offset + p * rows * a.rs,
            ..a
        };
        f32::with_scratch(r * n, |acc| {
            if let Some(s) = &start {
                for (q, row) in acc.chunks_exact_mut(n).enumerate() {
                    s.row_into(q, row);
                }
            }
            cpu::bf16::gemm_bf16(Mnk::new(r, k, n), a, b, acc, start.is_some(), 1);
            cpu::cast(acc, part, 1);
        });
    });
}

/// `(m, k, n, c_rows, c_cols)` for `c + op(a)·op(b)` with matrices `a` and `b` whose inner
/// dimensions agree and a `c` that spreads over the `[m, n]` product by whole rows or columns
/// (`c_rows` is 1 or m, `c_cols` 1 or n); `None` for any other case.
fn addmm_plan(
    csh: &[usize],
    ash: &[usize],
    bsh: &[usize],
    ta: bool,
    tb: bool,
) -> Option<(usize, usize, usize, usize, usize)> {
    let (&[a0, a1], &[b0, b1]) = (ash, bsh) else {
        return None;
    };
    let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
    let (kb, n) = if tb { (b1, b0) } else { (b0, b1) };
    let (r, c) = match *csh {
        [] => (1, 1),
        [c] => (1, c),
        [r, c] => (r, c),
        _ => return None,
    };
    (k == kb && (r == m || r == 1) && (c == n || c == 1)).then_some((m, k, n, r, c))
}

/// The gradients of `a` and `b` in `op(a)·op(b)` with incoming gradient `g`.
fn product_grads<'g>(
    a: Tensor<'g>,
    b: Tensor<'g>,
    g: Tensor<'g>,
    ta: bool,
    tb: bool,
    c: &Ctx<'g>,
) -> Result<(Option<Tensor<'g>>, Option<Tensor<'g>>)> {
    // C = op(A)·op(B). d op(A) = G·op(B)ᵀ, d op(B) = op(A)ᵀ·G; undo op for transposed operands.
    let ga = if !a.requires_grad() {
        None
    } else if ta {
        input_grad(a, b, g, tb, true, c)?
    } else {
        input_grad(a, g, b, false, !tb, c)?
    };
    let gb = if !b.requires_grad() {
        None
    } else if tb {
        input_grad(b, g, a, true, ta, c)?
    } else {
        input_grad(b, a, g, !ta, false, c)?
    };
    Ok((ga, gb))
}

pub(crate) fn backward<'g>(ta: bool, tb: bool, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let (ga, gb) = product_grads(c.input(0), c.input(1), c.gy, ta, tb, c)?;
    Ok(smallvec![ga, gb])
}

pub(crate) fn addmm_backward<'g>(ta: bool, tb: bool, c: &Ctx<'g>) -> Result<Grads<'g>> {
    let bias = c.input(0);
    let gc = if bias.requires_grad() {
        Some(c.gy.sum_to(&bias.try_shape()?)?)
    } else {
        None
    };
    let (ga, gb) = product_grads(c.input(1), c.input(2), c.gy, ta, tb, c)?;
    Ok(smallvec![gc, ga, gb])
}
