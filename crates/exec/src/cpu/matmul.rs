//! Matrix multiplication through strided GEMM kernels.
//!
//! Transposed operands are just swapped strides, so backward's `gᵀ·x` and `g·wᵀ` cost no copy
//! (a small single-threaded product copies a transposed right operand to row-major order first,
//! which costs less than the kernel's own repacking: see [`gemm()`]).
//! Large products are split by blocks of output rows across the graph's threads, each running the
//! single-threaded kernel; matrixmultiply's own `threading` feature was measured slower on two
//! cores (175 vs. ~250 GFLOP/s at 1024³) because it also packs on one thread.
//!
//! The kernel is the `gemm` crate's (AVX-512 where the CPU has it, chosen at run time): on the
//! 2-core reference machine it ran 1024³ f32 at ~285 GFLOP/s split over two threads against
//! matrixmultiply's ~255 when it was chosen (`bench_core -- --only w1` prints the first as "raw
//! GEMM kernel, row-split"; nothing reproduces the second now). matrixmultiply stays as the
//! kernel Miri interprets.

/// Element types with a GEMM.
pub trait Gemm: Sized {
    /// `c = alpha·a·b + beta·c` over raw strided views; see `matrixmultiply::sgemm`.
    ///
    /// # Safety
    /// Every index `i·rs + j·cs` of each operand (`a` m×k, `b` k×n, `c` m×n) must lie inside the
    /// memory the pointer was derived from, `c` must not overlap `a` or `b`, and `a`, `b`, `c` must
    /// be valid for reads (and `c` for writes) for the duration of the call.
    // The raw kernel's own signature (matrixmultiply's `sgemm`), forwarded verbatim.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );

    /// Calls `f` with a scratch buffer of `len` elements (contents unspecified), kept per thread
    /// and reused, so that a product's temporary copy of an operand allocates nothing once warm.
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;

    /// [`super::transpose::transpose`], with the type's fastest kernel.
    fn transpose(src: &[Self], rows: usize, cols: usize, ld: usize, dst: &mut [Self]);
}

macro_rules! gemm_impl {
    ($t:ty, $portable:path, $transpose:path) => {
        impl Gemm for $t {
            fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [$t]) -> R) -> R {
                // A stack of buffers: a call made inside another's `f` (a product inside a
                // kernel that holds its own scratch) takes the next one, so nesting allocates
                // nothing once warm either. Each buffer is taken out while in use and put back
                // after (one lost to a panic is only memory).
                thread_local! {
                    static SCRATCH: std::cell::RefCell<Vec<Vec<$t>>> =
                        const { std::cell::RefCell::new(Vec::new()) };
                }
                let mut buf = SCRATCH
                    .with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
                    .unwrap_or_default();
                if buf.len() < len {
                    buf.resize(len, 0.0);
                }
                let r = f(&mut buf[..len]);
                SCRATCH.with(|s| {
                    if let Ok(mut s) = s.try_borrow_mut() {
                        s.push(buf);
                    }
                });
                r
            }

            fn transpose(src: &[$t], rows: usize, cols: usize, ld: usize, dst: &mut [$t]) {
                $transpose(src, rows, cols, ld, dst)
            }

            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: $t,
                a: *const $t,
                rsa: isize,
                csa: isize,
                b: *const $t,
                rsb: isize,
                csb: isize,
                beta: $t,
                c: *mut $t,
                rsc: isize,
                csc: isize,
            ) {
                if cfg!(miri) {
                    // SAFETY: forwarded verbatim; the caller upholds `gemm_raw`'s contract,
                    // which is matrixmultiply's. (Miri runs this portable kernel; the SIMD one
                    // below uses intrinsics it cannot interpret.)
                    unsafe {
                        $portable(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
                    }
                } else {
                    // SAFETY: the same contract — every index of the three strided views lies
                    // in its allocation and `c` overlaps neither input. `gemm` computes
                    // dst = dst_scale·dst + prod_scale·lhs·rhs and takes (column, row) strides.
                    unsafe {
                        gemm::gemm(
                            m,
                            n,
                            k,
                            c,
                            csc,
                            rsc,
                            beta != 0.0,
                            a,
                            csa,
                            rsa,
                            b,
                            csb,
                            rsb,
                            beta,
                            alpha,
                            false,
                            false,
                            false,
                            gemm::Parallelism::None,
                        )
                    }
                }
            }
        }
    };
}
gemm_impl!(f32, matrixmultiply::sgemm, super::transpose::transpose_f32);
gemm_impl!(
    f64,
    matrixmultiply::dgemm,
    super::transpose::transpose::<f64>
);

/// One operand of a matrix product: a slice and the strides of its 2-D view.
#[derive(Debug, Clone, Copy)]
pub struct MatView<'a, T> {
    /// The memory.
    pub data: &'a [T],
    /// Element offset of entry (0, 0).
    pub offset: usize,
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl<'a, T> MatView<'a, T> {
    /// A row-major `rows × cols` matrix at `offset`, optionally read transposed.
    pub fn row_major(data: &'a [T], offset: usize, cols: usize, transposed: bool) -> Self {
        if transposed {
            MatView {
                data,
                offset,
                rs: 1,
                cs: cols,
            }
        } else {
            MatView {
                data,
                offset,
                rs: cols,
                cs: 1,
            }
        }
    }

    /// Whether every entry of a `rows × cols` view lies inside `data`.
    pub(crate) fn fits(&self, rows: usize, cols: usize) -> bool {
        if rows == 0 || cols == 0 {
            return true;
        }
        let last = (rows - 1)
            .checked_mul(self.rs)
            .and_then(|r| {
                (cols - 1)
                    .checked_mul(self.cs)
                    .and_then(|c| r.checked_add(c))
            })
            .and_then(|x| x.checked_add(self.offset));
        matches!(last, Some(l) if l < self.data.len())
    }
}

/// The sizes of a product: `a` is `m × k`, `b` is `k × n`, `c` is `m × n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mnk {
    /// Rows of `a` and `c`.
    pub m: usize,
    /// Columns of `a`, rows of `b`.
    pub k: usize,
    /// Columns of `b` and `c`.
    pub n: usize,
}

impl Mnk {
    /// The sizes of an `m × k` by `k × n` product.
    pub const fn new(m: usize, k: usize, n: usize) -> Self {
        Mnk { m, k, n }
    }
}

/// One operand of a batch of products ([`gemm_batched`]): row-major matrices of `cols` columns
/// in `data`, the `i`-th starting at `offsets[i]`, each read transposed when `transposed`.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a, T> {
    /// The memory.
    pub data: &'a [T],
    /// Each product's entry (0, 0) of this operand.
    pub offsets: &'a [usize],
    /// Columns of each stored matrix (before any transpose).
    pub cols: usize,
    /// Whether each matrix is read transposed.
    pub transposed: bool,
}

impl<'a, T> BatchView<'a, T> {
    /// The `i`-th product's operand.
    fn get(&self, i: usize) -> MatView<'a, T> {
        MatView::row_major(self.data, self.offsets[i], self.cols, self.transposed)
    }
}

/// The largest B (in elements) that a product copies out of transposed order (per thread).
const TRANSPOSED_B_MAX: usize = 1 << 20;

/// Whether `b` is stored transposed (unit row stride: a linear layer's `Wᵀ`) and `k × cols`
/// of it small enough to copy into row-major order: packing it strided costs the kernel more.
fn transposed_b<T>(b: &MatView<'_, T>, k: usize, cols: usize) -> bool {
    b.rs == 1 && b.cs >= k && k.saturating_mul(cols) <= TRANSPOSED_B_MAX
}

/// Work (m·k·n multiply-adds) below which a product runs on one thread.
pub(crate) const PAR_MIN_FLOPS: usize = 1 << 21;

/// A product's output with the trivial cases done: `None` when nothing is left to compute (no
/// output elements, or `k = 0`: the output zeroed unless accumulating), else the first `m·n`
/// elements of `c`. Panics if a view does not fit its slice (an internal invariant: callers
/// check shapes).
pub(crate) fn product_output<'c, A, B, T: Copy>(
    dims: Mnk,
    a: &MatView<'_, A>,
    b: &MatView<'_, B>,
    c: &'c mut [T],
    accumulate: bool,
    zero: T,
) -> Option<&'c mut [T]> {
    let Mnk { m, k, n } = dims;
    assert!(
        a.fits(m, k) && b.fits(k, n),
        "invariant: matrix product operand out of bounds"
    );
    let c = &mut c[..m * n];
    if m == 0 || n == 0 {
        return None;
    }
    if k == 0 {
        if !accumulate {
            c.fill(zero);
        }
        return None;
    }
    Some(c)
}

/// `c[..m×n, row-major] (+)= a · b`. Panics if a view does not fit its slice (an internal
/// invariant: the graph checks shapes before calling).
pub fn gemm<T: crate::Float + Gemm>(
    dims: Mnk,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    accumulate: bool,
    threads: usize,
) {
    let Some(c) = product_output(dims, &a, &b, c, accumulate, T::ZERO) else {
        return;
    };
    let Mnk { m, k, n } = dims;
    if m <= SMALL_M && a.cs == 1 && b.rs == 1 {
        // A few rows against B stored transposed (a linear layer at batch 1, as in generation):
        // each output is a dot product of two contiguous runs. Transposing or packing B for
        // the kernel would read and write all of it once more, for one use.
        let t = if k * n >= PAR_DOT_MIN {
            threads.max(1)
        } else {
            1
        };
        if t <= 1 {
            rows_dot_columns(m, k, n, a, b, c, accumulate);
            return;
        }
        // Each thread takes a block of columns of every row.
        let per = n.div_ceil(t).div_ceil(4) * 4;
        let out = SharedOut(c.as_mut_ptr());
        super::thread_pool::fork(n.div_ceil(per), &|p| {
            let (j0, out) = (p * per, &out);
            let cols = per.min(n - j0);
            let bj = MatView {
                offset: b.offset + j0 * b.cs,
                ..b
            };
            for i in 0..m {
                // SAFETY: `out.0` points at `c`, a unique `&mut [T]` of m×n elements (row
                // stride n) that outlives `fork`; this block writes only columns j0..j0+cols of
                // each row, which no other block touches, and nothing reads `c` until every
                // block is done.
                let part = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * n + j0), cols) };
                let ai = MatView {
                    offset: a.offset + i * a.rs,
                    ..a
                };
                rows_dot_columns(1, k, cols, ai, bj, part, accumulate);
            }
        });
        return;
    }
    if m <= SMALL_M && a.cs == 1 && b.cs == 1 && b.rs >= n {
        // A few rows against B stored row-major (a weight kept [in, out], as GPT-2's, at
        // batch 1): B streamed once, in blocks of whole rows.
        rows_times_rows_blocks(dims, a, b, c, accumulate, threads);
        return;
    }
    if runs_transposed(dims, &a, &b) {
        transposed_product(dims, a, b, c, accumulate, threads);
        return;
    }
    let beta = if accumulate { T::ONE } else { T::ZERO };
    let work = m.saturating_mul(k).saturating_mul(n);
    // Wider than tall splits by columns (16-wide panels), otherwise by rows: a product of a
    // single row (a layer's weight stored [in, out] at batch 1) still runs on every thread.
    let parts = if n > m { n.div_ceil(16) } else { m };
    let t = if work >= PAR_MIN_FLOPS {
        threads.clamp(1, parts)
    } else {
        1
    };
    let run = |r0: usize, rows: usize, c: &mut [T], b: MatView<'_, T>| {
        debug_assert_eq!(c.len(), rows * n);
        debug_assert!(b.fits(k, n));
        // SAFETY: `a.fits(m, k)` was checked above, and `b` is either the view checked there
        // (`b.fits(k, n)`) or a k×n row-major copy of it; rows r0..r0+rows of `a` lie within its
        // first m rows, so every index the kernel reads is inside `a.data` / `b.data`; `c` is a
        // unique `&mut` slice of exactly rows×n elements with row stride n, which cannot overlap
        // the shared borrows of `a` and `b`.
        unsafe {
            T::gemm_raw(
                rows,
                k,
                n,
                T::ONE,
                a.data.as_ptr().add(a.offset + r0 * a.rs),
                a.rs as isize,
                a.cs as isize,
                b.data.as_ptr().add(b.offset),
                b.rs as isize,
                b.cs as isize,
                beta,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    };
    if t <= 1 {
        if transposed_b(&b, k, n) && n.is_multiple_of(16) {
            // B stored transposed (a linear layer's `x·Wᵀ`, W `[out, in]`): the kernel would
            // repack it on every call, through a strided loop and a fresh allocation. A copy in
            // row-major order, made in 8×8 register blocks into a reused buffer, costs less and
            // leaves the kernel nothing to pack (with n a multiple of its vector width).
            T::with_scratch(k * n, |bt| {
                T::transpose(&b.data[b.offset..], n, k, b.cs, bt);
                let bt = MatView {
                    data: &*bt,
                    offset: 0,
                    rs: n,
                    cs: 1,
                };
                run(0, m, c, bt)
            });
            return;
        }
        run(0, m, c, b);
        return;
    }
    if n > m || transposed_b(&b, k, n / t) {
        // Wide and short (a linear layer's forward, most weight gradients): split the columns,
        // so each thread packs only its part of B, the larger operand, instead of all of it.
        // So too for B stored transposed (`x·Wᵀ`): each thread copies its columns of B into
        // row-major order (see below) rather than every thread packing all of B.
        gemm_column_split(dims, a, b, c, beta, t);
        return;
    }
    // Row blocks rounded to the kernel's 8-row panels, so no thread gets a ragged panel.
    let per = m.div_ceil(t).div_ceil(8) * 8;
    let parts: Vec<&mut [T]> = c.chunks_mut(per * n).collect();
    super::thread_pool::for_each_part(parts, |j, part| run(j * per, part.len() / n, part, b));
}

/// Whether `c = a·b` runs as its transpose `cᵀ = bᵀ·aᵀ` ([`transposed_product`]): a few rows
/// (at most 64) against at least twice as many columns, over a long `k` (4096 or more), `a`'s
/// rows contiguous and `b` stored transposed — the weight gradient of a convolution with few
/// output channels recorded batch-wide (as a backward under `create_graph` records it, to be
/// differentiated again), `gout · colsᵀ` (`[32, N·L] · [N·L, 288]`). The kernel is slow on the long,
/// contiguous rows of such a `b` where they are its columns, and fast where they are its rows:
/// 32 × 50 176 × 288 on this machine's AVX-512, 45 against 103 GFLOP/s on one thread, 99 against
/// 250 on two (each thread taking rows of the transpose).
fn runs_transposed<T>(dims: Mnk, a: &MatView<'_, T>, b: &MatView<'_, T>) -> bool {
    let Mnk { m, k, n } = dims;
    m <= 64 && n >= 2 * m && k >= 4096 && a.cs == 1 && b.rs == 1
}

/// `c (+)= a·b` computed as `cᵀ = bᵀ·aᵀ` into a scratch buffer (`n × m`, row-major), then written
/// into `c` transposed (see [`runs_transposed`]).
fn transposed_product<T: crate::Float + Gemm>(
    dims: Mnk,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    accumulate: bool,
    threads: usize,
) {
    let Mnk { m, k, n } = dims;
    // `b` with unit row stride is `bᵀ` row-major; `a` with unit column stride is `aᵀ` read
    // with unit row stride.
    let bt = MatView {
        data: b.data,
        offset: b.offset,
        rs: b.cs,
        cs: 1,
    };
    let at = MatView {
        data: a.data,
        offset: a.offset,
        rs: 1,
        cs: a.rs,
    };
    T::with_scratch(n * m, |ct| {
        // Rows of `cᵀ` split over the threads, each a single-threaded product (its `m` columns
        // are few: split, each thread would copy all of `b` for its half of them — 181 against
        // 250 GFLOP/s for 288 × 50 176 × 32 on two threads).
        let t = if m * k * n >= PAR_MIN_FLOPS {
            threads.clamp(1, n.div_ceil(8))
        } else {
            1
        };
        let per = n.div_ceil(t).div_ceil(8) * 8;
        let parts: Vec<&mut [T]> = ct.chunks_mut(per * m).collect();
        super::thread_pool::for_each_part(parts, |j, part| {
            let rows = part.len() / m;
            let bj = MatView {
                offset: bt.offset + j * per * bt.rs,
                ..bt
            };
            gemm(Mnk::new(rows, k, m), bj, at, part, false, 1);
        });
        for (i, row) in c.chunks_exact_mut(n).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                let v = ct[j * m + i];
                *x = if accumulate { *x + v } else { v };
            }
        }
    });
}

/// Up to this many rows of A, a product with a transposed B is done as dot products.
pub(crate) const SMALL_M: usize = 4;

/// Multiply-adds per row (k·n) from which the dot products are split across threads.
const PAR_DOT_MIN: usize = 1 << 16;

/// `c (+)= a·b` for `a` with unit column stride and `b` with unit row stride: `c[i][j]` is the
/// dot product of row `i` of `a` and column `j` of `b`, both contiguous, summed in eight
/// interleaved lanes (a vectorisable order) and then pairwise.
fn rows_dot_columns<T: crate::Float>(
    m: usize,
    k: usize,
    n: usize,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    accumulate: bool,
) {
    for i in 0..m {
        let ar = &a.data[a.offset + i * a.rs..a.offset + i * a.rs + k];
        let row = &mut c[i * n..(i + 1) * n];
        let col = |j: usize| {
            let at = b.offset + j * b.cs;
            &b.data[at..at + k]
        };
        let mut j = 0;
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if T::DTYPE == crate::DType::F32
            && super::wide::simd() != super::wide::Simd::Baseline
            && std::arch::is_x86_feature_detected!("avx2")
        {
            // Four columns at a time in AVX registers: four independent accumulations in
            // flight, each summed in the order of the portable loop below.
            while j + 4 <= n {
                let cols = [col(j), col(j + 1), col(j + 2), col(j + 3)];
                // SAFETY: `T` is `f32`: its DTYPE says so, and `Float` has only the f32 and f64
                // implementations of this crate (it requires the sealed `Pod`, so no other crate
                // can add one); the slices reinterpret to `f32` slices of the same length. The
                // CPU has AVX2: detected just above.
                let sums = unsafe {
                    let f = |s: &[T]| std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len());
                    dot4_f32_avx2(f(ar), cols.map(f), b.cs)
                };
                for (q, s) in sums.into_iter().enumerate() {
                    let o = &mut row[j + q];
                    let s = T::from_f64(f64::from(s));
                    *o = if accumulate { *o + s } else { s };
                }
                j += 4;
            }
        }
        for (jj, o) in row.iter_mut().enumerate().skip(j) {
            let s = dot_lanes(ar, col(jj));
            *o = if accumulate { *o + s } else { s };
        }
    }
}

/// The blocks of rows [`rows_times_rows_blocks`] splits a `k × n` product's `b` into: one block
/// per [`BLOCK_ROWS_MIN`] rows up to [`ROW_BLOCKS`], fewer for a small product; a function of the
/// sizes alone, never of the threads, so that every thread count sums in the same order.
fn row_blocks(k: usize, n: usize) -> usize {
    if k.saturating_mul(n) < PAR_DOT_MIN {
        return 1;
    }
    (k / BLOCK_ROWS_MIN).clamp(1, ROW_BLOCKS)
}

/// The most blocks [`row_blocks`] makes.
const ROW_BLOCKS: usize = 8;
/// The fewest rows of `b` in a block of [`row_blocks`].
const BLOCK_ROWS_MIN: usize = 64;

/// `c (+)= a·b` for a few rows of `a` and `b` stored row-major, `b`'s rows in [`row_blocks`]
/// blocks (each a multiple of four rows but the last): each block's product
/// ([`rows_times_rows`]) into a buffer of its own, then `c` (when accumulating) plus the blocks'
/// products in block order. A thread takes consecutive blocks, so that it reads one contiguous
/// run of `b`, as a plain read of the weight does: splitting the columns instead had each thread
/// read part of every row, 26 GB/s over GPT-2's weights against 30 for reading them.
fn rows_times_rows_blocks<T: crate::Float + Gemm>(
    dims: Mnk,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    accumulate: bool,
    threads: usize,
) {
    let Mnk { m, k, n } = dims;
    let blocks = row_blocks(k, n);
    if blocks <= 1 {
        rows_times_rows_columns(dims, a, b, c, accumulate, threads);
        return;
    }
    // Block j holds rows bound(j)..bound(j + 1).
    let bound = |j: usize| {
        if j == blocks {
            k
        } else {
            j * k / blocks / 4 * 4
        }
    };
    let block = |j: usize, part: &mut [T]| {
        let (r0, r1) = (bound(j), bound(j + 1));
        let aj = MatView {
            offset: a.offset + r0 * a.cs,
            ..a
        };
        let bj = MatView {
            offset: b.offset + r0 * b.rs,
            ..b
        };
        rows_times_rows(m, r1 - r0, n, aj, bj, part, false);
    };
    let size = m * n;
    let t = threads.clamp(1, blocks);
    if t == 1 {
        // One block at a time through one buffer, added into `c` as it comes: the same sums in
        // the same order as the threaded form, without a buffer per block (a convolution with
        // a few output channels calls this once per image).
        let mut part = vec![T::ZERO; size];
        let c = &mut c[..size];
        for j in 0..blocks {
            block(j, &mut part);
            let first = j == 0 && !accumulate;
            add_into(c, &part, first);
        }
        return;
    }
    let per = blocks.div_ceil(t);
    T::with_scratch(blocks * size, |parts| {
        let groups: Vec<&mut [T]> = parts.chunks_mut(per * size).collect();
        super::thread_pool::for_each_part(groups, |p, group| {
            for (q, part) in group.chunks_exact_mut(size).enumerate() {
                block(p * per + q, part);
            }
        });
        let c = &mut c[..size];
        for (j, part) in parts.chunks_exact(size).enumerate() {
            add_into(c, part, j == 0 && !accumulate);
        }
    });
}

/// `c += part`, or `c = part` when `overwrite`.
fn add_into<T: crate::Float>(c: &mut [T], part: &[T], overwrite: bool) {
    if overwrite {
        c.copy_from_slice(part);
        return;
    }
    super::wide::wide(
        c.len(),
        #[inline(always)]
        move || {
            for (o, &x) in c.iter_mut().zip(part) {
                *o += x;
            }
        },
    );
}

/// [`rows_times_rows`] with the columns split over the threads (each column's sum the same
/// on every thread count): a product of too few rows of `b` for [`rows_times_rows_blocks`]'s
/// blocks.
fn rows_times_rows_columns<T: crate::Float>(
    dims: Mnk,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    accumulate: bool,
    threads: usize,
) {
    let Mnk { m, k, n } = dims;
    let t = if k * n >= PAR_DOT_MIN {
        threads.clamp(1, n.div_ceil(16))
    } else {
        1
    };
    if t <= 1 {
        rows_times_rows(m, k, n, a, b, c, accumulate);
        return;
    }
    let per = n.div_ceil(t).div_ceil(16) * 16;
    let out = SharedOut(c.as_mut_ptr());
    super::thread_pool::fork(n.div_ceil(per), &|p| {
        let (j0, out) = (p * per, &out);
        let cols = per.min(n - j0);
        let bj = MatView {
            offset: b.offset + j0,
            ..b
        };
        // Each row's block of columns, gathered to a buffer of this thread's and back:
        // the kernel writes a dense m×cols output.
        let mut part = vec![T::ZERO; m * cols];
        for i in 0..m {
            // SAFETY: `out.0` points at `c`, a unique `&mut [T]` of m×n elements (row stride
            // n) that outlives `fork`; this block reads and writes only columns j0..j0+cols
            // of each row, which no other block touches, and nothing else reads `c` until
            // every block is done.
            let src = unsafe { std::slice::from_raw_parts(out.0.add(i * n + j0), cols) };
            part[i * cols..(i + 1) * cols].copy_from_slice(src);
        }
        rows_times_rows(m, k, cols, a, bj, &mut part, accumulate);
        for i in 0..m {
            // SAFETY: as above.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * n + j0), cols) };
            dst.copy_from_slice(&part[i * cols..(i + 1) * cols]);
        }
    });
}

/// `c (+)= a·b` for a few rows of `a` (unit column stride) and `b` stored row-major (unit
/// column stride; a weight kept `[in, out]`, at batch 1): `b` is read once, four of its rows at
/// a time in four sequential streams, and each output row takes
/// `c + ((a₀·b₀ + a₁·b₁) + (a₂·b₂ + a₃·b₃))` per block of four (then the leftover rows one by
/// one): an elementwise order, the same at every vector width, whose output stays in the cache
/// while `b` streams past. (The general kernel treats this as a column-major matrix-vector
/// product, loading and storing the output once per row of `b`.)
fn rows_times_rows<T: crate::Float>(
    m: usize,
    k: usize,
    n: usize,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    accumulate: bool,
) {
    super::wide::wide(
        k * n,
        #[inline(always)]
        move || rows_times_rows_loops(m, k, n, a, b, c, accumulate),
    )
}

#[inline(always)]
fn rows_times_rows_loops<T: crate::Float>(
    m: usize,
    k: usize,
    n: usize,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    accumulate: bool,
) {
    if !accumulate {
        c[..m * n].fill(T::ZERO);
    }
    let brow = |r: usize| &b.data[b.offset + r * b.rs..][..n];
    let av = |i: usize, r: usize| a.data[a.offset + i * a.rs + r];
    // Columns in runs of 256 bytes. The four rows in hand are four streams, each going on in
    // the row four further down when it ends; each run first asks for the lines its streams
    // will reach AHEAD_BYTES later. A fixed distance in bytes, not in rows: the rows of a
    // GPT-2 product are 3 to 12 KB, and 16 rows ahead (up to 196 KB, past the level-1 cache)
    // was slower over its products than 3 KB ahead in every round (docs/performance.md).
    let run = (256 / std::mem::size_of::<T>()).max(1);
    let line = (64 / std::mem::size_of::<T>()).max(1);
    let ahead = (AHEAD_BYTES / std::mem::size_of::<T>()).max(1);
    let mut r = 0;
    while r + 4 <= k {
        let (b0, b1, b2, b3) = (brow(r), brow(r + 1), brow(r + 2), brow(r + 3));
        let mut s = 0;
        while s < n {
            let e = (s + run).min(n);
            for q in 0..4 {
                // Stream q's element `ahead` after column s: rows of `n` columns, four apart.
                let (row, col) = (r + q + 4 * ((s + ahead) / n), (s + ahead) % n);
                if row < k {
                    let first = b.offset + row * b.rs + col;
                    for x in (first..first + (e - s).min(n - col)).step_by(line) {
                        super::wide::prefetch(b.data.as_ptr().wrapping_add(x));
                    }
                }
            }
            for i in 0..m {
                let (a0, a1, a2, a3) = (av(i, r), av(i, r + 1), av(i, r + 2), av(i, r + 3));
                let row = &mut c[i * n + s..i * n + e];
                let (x0, x1, x2, x3) = (&b0[s..e], &b1[s..e], &b2[s..e], &b3[s..e]);
                for ((((o, &x0), &x1), &x2), &x3) in row.iter_mut().zip(x0).zip(x1).zip(x2).zip(x3)
                {
                    *o += (a0 * x0 + a1 * x1) + (a2 * x2 + a3 * x3);
                }
            }
            s = e;
        }
        r += 4;
    }
    for r in r..k {
        let br = brow(r);
        for i in 0..m {
            let ai = av(i, r);
            for (o, &x) in c[i * n..(i + 1) * n].iter_mut().zip(br) {
                *o += ai * x;
            }
        }
    }
}

/// How far ahead (in floats) the dot products of a batch-1 product with a transposed weight ask
/// for each column's lines: four columns on (the same line of the next four, which lie after
/// the four in hand: the next group is asked for whole while this one is read) where that is at
/// most [`DOT_AHEAD_GROUP_MAX`] floats, otherwise [`DOT_AHEAD`]. GPT-2's output layer (50257
/// columns of 768) on two Zen 5 threads: 4.7–4.9 ms at 2 KB ahead, 4.0 at 4 KB, where a
/// column's request fell in the next column of the group and three of the next group's four
/// columns started unasked; four columns (12 KB) on, 1.20 against 1.23 times a read of the same
/// bytes (medians of 40 alternating rounds of a probe of that product beside the read).
fn dot_ahead(column_stride: usize) -> usize {
    if 4 * column_stride <= DOT_AHEAD_GROUP_MAX {
        4 * column_stride
    } else {
        DOT_AHEAD
    }
}

/// The longest distance (16 KB) [`dot_ahead`] asks four columns on; longer columns (only 768
/// was measured) keep [`DOT_AHEAD`].
const DOT_AHEAD_GROUP_MAX: usize = 4096;

/// [`dot_ahead`]'s distance for long columns (4 KB).
const DOT_AHEAD: usize = 1024;

/// How far ahead in each of its four streams [`rows_times_rows`] asks for the weight's lines.
const AHEAD_BYTES: usize = 3072;

/// The dot product of two runs of one length, summed in eight interleaved lanes, then
/// pairwise, then the tail.
#[inline(always)]
pub(crate) fn dot_lanes<T: crate::Float>(ar: &[T], bc: &[T]) -> T {
    let k = ar.len();
    let mut lanes = [T::ZERO; 8];
    let (ac, at) = ar.split_at(k - k % 8);
    let (bcc, bt) = bc.split_at(k - k % 8);
    for (x, y) in ac.chunks_exact(8).zip(bcc.chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut tail = T::ZERO;
    for (&x, &y) in at.iter().zip(bt) {
        tail += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
        + tail
}

/// [`dot_lanes`] of `a` with four columns at once (each `a`'s length), in AVX registers; the
/// weight's columns lie `stride` floats apart (where its lines are asked for ahead only).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[target_feature(enable = "avx2")]
unsafe fn dot4_f32_avx2(a: &[f32], cols: [&[f32]; 4], stride: usize) -> [f32; 4] {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let k = a.len();
    let body = k - k % 8;
    debug_assert!(cols.iter().all(|c| c.len() == k));
    let mut acc = [_mm256_setzero_ps(); 4];
    // The columns of a transposed weight lie one after the other, `stride` apart.
    let ahead = dot_ahead(stride);
    let mut s = 0;
    while s < body {
        if s % 16 == 0 {
            for col in &cols {
                super::wide::prefetch(col.as_ptr().wrapping_add(s + ahead));
            }
        }
        // SAFETY: s + 8 ≤ body ≤ k, the length of `a` and of every column.
        unsafe {
            let x = _mm256_loadu_ps(a.as_ptr().add(s));
            for q in 0..4 {
                let y = _mm256_loadu_ps(cols[q].as_ptr().add(s));
                acc[q] = _mm256_add_ps(acc[q], _mm256_mul_ps(x, y));
            }
        }
        s += 8;
    }
    let mut out = [0.0f32; 4];
    for q in 0..4 {
        let mut l = [0.0f32; 8];
        // SAFETY: `l` holds the eight floats the store writes.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc[q]) };
        let mut tail = 0.0f32;
        for (&x, &y) in a[body..].iter().zip(&cols[q][body..]) {
            tail += x * y;
        }
        out[q] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])) + tail;
    }
    out
}

/// A pointer to `C` shared by the threads of [`gemm_column_split`] and the threaded dot products,
/// each writing its own columns.
struct SharedOut<T>(*mut T);

// SAFETY: the pointer is only dereferenced by `gemm_column_split`'s and the dot products'
// threads, which write disjoint column blocks of one `&mut` buffer that outlives the thread scope; `T: Send` values may be
// written from other threads.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above; no thread reads through the pointer what another writes.
unsafe impl<T: Send> Sync for SharedOut<T> {}

/// `c = a·b (+ c)` with the `n` columns split into `t` blocks, one per thread.
fn gemm_column_split<T: crate::Float + Gemm>(
    dims: Mnk,
    a: MatView<'_, T>,
    b: MatView<'_, T>,
    c: &mut [T],
    beta: T,
    t: usize,
) {
    let Mnk { m, k, n } = dims;
    debug_assert_eq!(c.len(), m * n);
    // Blocks of whole 16-column panels.
    let per = n.div_ceil(t).div_ceil(16) * 16;
    let out = SharedOut(c.as_mut_ptr());
    let run = |c0: usize| {
        let cols = per.min(n - c0);
        let out = &out;
        // This block's product with columns c0..c0+cols of B, given as `bm`.
        let block = |bm: MatView<'_, T>| {
            debug_assert!(bm.fits(k, cols));
            // SAFETY: `a.fits(m, k)` (checked by `gemm`) and `bm` fits k×cols (this block's
            // columns of the checked `b`, or their row-major copy), so every index the kernel
            // reads is inside `a.data` / `bm.data`. `out.0` points at `c`, a unique `&mut [T]`
            // of m×n elements with row stride n that outlives the fork; this call writes only
            // rows 0..m of columns c0..c0+cols, which no other block touches, and nothing reads
            // `c` until every block has finished.
            unsafe {
                T::gemm_raw(
                    m,
                    k,
                    cols,
                    T::ONE,
                    a.data.as_ptr().add(a.offset),
                    a.rs as isize,
                    a.cs as isize,
                    bm.data.as_ptr().add(bm.offset),
                    bm.rs as isize,
                    bm.cs as isize,
                    beta,
                    out.0.add(c0),
                    n as isize,
                    1,
                )
            }
        };
        if transposed_b(&b, k, cols) && cols.is_multiple_of(16) {
            // This block's columns of a transposed B, copied row-major into this thread's
            // buffer (as the single-threaded path does): nothing strided left to pack.
            T::with_scratch(k * cols, |bt| {
                T::transpose(&b.data[b.offset + c0 * b.cs..], cols, k, b.cs, bt);
                block(MatView {
                    data: &*bt,
                    offset: 0,
                    rs: cols,
                    cs: 1,
                })
            });
        } else {
            block(MatView {
                offset: b.offset + c0 * b.cs,
                ..b
            });
        }
    };
    super::thread_pool::fork(n.div_ceil(per), &|j| run(j * per));
}

/// Many products of one shape: `c[i] = a.get(i) · b.get(i)`, with the outputs stored one after
/// another in `c`. Batches are split across threads (each running the single-threaded kernel),
/// which beats threading inside each small product.
pub fn gemm_batched<T: crate::Float + Gemm>(
    dims: Mnk,
    a: BatchView<'_, T>,
    b: BatchView<'_, T>,
    c: &mut [T],
    threads: usize,
) {
    let Mnk { m, k, n } = dims;
    let batches = a.offsets.len();
    debug_assert_eq!(batches, b.offsets.len());
    let mn = m * n;
    if mn == 0 {
        return;
    }
    let c = &mut c[..batches * mn];
    let work = batches
        .saturating_mul(m)
        .saturating_mul(k)
        .saturating_mul(n);
    let t = if work >= PAR_MIN_FLOPS {
        threads.clamp(1, batches)
    } else {
        1
    };
    let run = |first: usize, out: &mut [T]| {
        for (j, cb) in out.chunks_mut(mn).enumerate() {
            let bi = first + j;
            gemm(dims, a.get(bi), b.get(bi), cb, false, 1);
        }
    };
    if t <= 1 {
        run(0, c);
        return;
    }
    let per = batches.div_ceil(t);
    let parts: Vec<&mut [T]> = c.chunks_mut(per * mn).collect();
    super::thread_pool::for_each_part(parts, |j, chunk| run(j * per, chunk));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `cols × rows` transpose of a row-major `rows × cols` matrix.
    fn transposed(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
        let mut t = vec![0.0; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = x[r * cols + c];
            }
        }
        t
    }

    fn naive(m: usize, k: usize, n: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    c[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        c
    }

    #[test]
    /// A product whose B is stored transposed with n a multiple of 16 goes through the
    /// row-major copy: at an offset, with a padded row stride, overwriting and accumulating, in
    /// both types; and a product with n = 15, which takes the kernel directly.
    fn transposed_b_is_copied_right() {
        // A linear layer's shape is slow to interpret: Miri checks the small ones.
        let layer = if cfg!(miri) {
            (1, 2, 16, 3)
        } else {
            (32, 64, 64, 64)
        };
        for (m, k, n, ld) in [(3, 5, 16, 5), layer, (7, 9, 32, 12), (2, 3, 15, 3)] {
            let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
            // B's transpose: n rows of k, row stride ld, starting at element 4.
            let bt: Vec<f64> = (0..4 + n * ld)
                .map(|i| ((i * 5) % 13) as f64 - 6.0)
                .collect();
            let want: Vec<f64> = (0..m * n)
                .map(|o| {
                    (0..k)
                        .map(|p| a[(o / n) * k + p] * bt[4 + (o % n) * ld + p])
                        .sum()
                })
                .collect();
            let b = MatView {
                data: &bt[..],
                offset: 4,
                rs: 1,
                cs: ld,
            };
            let mut c = vec![1.0f64; m * n];
            gemm(
                Mnk::new(m, k, n),
                MatView::row_major(&a, 0, k, false),
                b,
                &mut c,
                true,
                1,
            );
            let plus_one: Vec<f64> = want.iter().map(|w| w + 1.0).collect();
            assert_eq!(c, plus_one, "f64 {m}×{k}×{n}, accumulating");
            let (a32, bt32): (Vec<f32>, Vec<f32>) = (
                a.iter().map(|&v| v as f32).collect(),
                bt.iter().map(|&v| v as f32).collect(),
            );
            let b = MatView::row_major(&bt32, 4, ld, true);
            let mut c = vec![f32::NAN; m * n];
            gemm(
                Mnk::new(m, k, n),
                MatView::row_major(&a32, 0, k, false),
                b,
                &mut c,
                false,
                1,
            );
            let want32: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            assert_eq!(c, want32, "f32 {m}×{k}×{n}");
        }
    }

    #[test]
    fn small_products_with_offsets_and_transposes() {
        // Sized for Miri: checks the pointer arithmetic of the unsafe GEMM call.
        let a: Vec<f32> = (0..20).map(|i| i as f32 * 0.5).collect(); // a 3x4 matrix at offset 2
        let b: Vec<f32> = (0..15).map(|i| (i % 4) as f32 - 1.0).collect(); // 4x3 at offset 3
        let mut c = [9.0f32; 1 + 9];
        gemm(
            Mnk::new(3, 4, 3),
            MatView::row_major(&a, 2, 4, false),
            MatView::row_major(&b, 3, 3, false),
            &mut c[1..],
            false,
            1,
        );
        for i in 0..3 {
            for j in 0..3 {
                let want: f32 = (0..4).map(|p| a[2 + i * 4 + p] * b[3 + p * 3 + j]).sum();
                assert_eq!(c[1 + i * 3 + j], want);
            }
        }
        assert_eq!(c[0], 9.0, "nothing before the output offset is touched");
        let mut d = vec![0.0f64; 4];
        let x = [1.0, 2.0, 3.0, 4.0];
        // xᵀ·x for x 2x2, read transposed.
        gemm(
            Mnk::new(2, 2, 2),
            MatView::row_major(&x, 0, 2, true),
            MatView::row_major(&x, 0, 2, false),
            &mut d,
            false,
            1,
        );
        assert_eq!(d, vec![10.0, 14.0, 14.0, 20.0]);
        let mut e = vec![0.0f64; 8];
        let view = |transposed| BatchView {
            data: &x[..],
            offsets: &[0, 0],
            cols: 2,
            transposed,
        };
        gemm_batched(Mnk::new(2, 2, 2), view(false), view(true), &mut e, 2);
        assert_eq!(e, vec![5.0, 11.0, 11.0, 25.0, 5.0, 11.0, 11.0, 25.0]);
    }

    #[test]
    fn f32_dot_products_on_threads_and_in_avx_agree_with_the_portable_order() {
        // The f32 dot-product path takes four columns at a time in AVX registers and splits
        // the columns across threads when the product is large; each column must be summed
        // in the portable loop's order, so every thread count gives the same bits.
        let (m, k, n) = if cfg!(miri) {
            (2, 20, 9)
        } else {
            (3, 300, 301)
        };
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.37 - 2.0)
            .collect();
        let bt: Vec<f32> = (0..n * k)
            .map(|i| ((i * 5) % 11) as f32 * 0.29 - 1.5)
            .collect();
        let bv = MatView::row_major(&bt, 0, k, true);
        let mut want = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = dot_lanes(&a[i * k..(i + 1) * k], &bt[j * k..(j + 1) * k]);
            }
        }
        for threads in [1, 2, 3] {
            let mut c = vec![1.0f32; m * n];
            let av = MatView::row_major(&a, 0, k, false);
            gemm(Mnk::new(m, k, n), av, bv, &mut c, false, threads);
            assert_eq!(c, want, "{threads} threads");
        }
    }

    /// m ≤ SMALL_M with B row-major (a weight stored [in, out] at batch 1): the streaming
    /// kernel, at offsets, with a padded B, k around its blocks of four, overwriting and
    /// accumulating, in blocks of rows (4 and 8 blocks, a ragged last one) and with the columns
    /// split (too few rows for blocks), on 1, 2, 3, 8 and 16 threads (the same bits: the blocks
    /// and their order depend on the sizes alone) and at every SIMD level; equal to the exact
    /// product of small integers.
    #[test]
    fn a_few_rows_against_a_row_major_b_stream_it() {
        let big = if cfg!(miri) {
            (1, 9, 40)
        } else {
            (2, 301, 600)
        };
        let more: &[(usize, usize, usize)] = if cfg!(miri) {
            &[]
        } else {
            &[(4, 1030, 70), (1, 100, 2000)]
        };
        let shapes = [big, (1, 4, 5), (3, 7, 33), (4, 1, 17), (2, 5, 1)];
        for &(m, k, n) in shapes.iter().chain(more) {
            let a: Vec<f32> = (0..m * k + 3)
                .map(|i| ((i * 7) % 13) as f32 - 6.0)
                .collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
            let wide: Vec<f64> = a.iter().map(|&v| f64::from(v)).collect();
            let bw: Vec<f64> = b.iter().map(|&v| f64::from(v)).collect();
            let want = naive(m, k, n, &wide[3..], &bw);
            // B with rows padded to n + 3.
            let mut bp = vec![7.0f32; k * (n + 3)];
            for p in 0..k {
                bp[p * (n + 3)..p * (n + 3) + n].copy_from_slice(&b[p * n..(p + 1) * n]);
            }
            let bv = MatView {
                data: &bp,
                offset: 0,
                rs: n + 3,
                cs: 1,
            };
            let av = MatView::row_major(&a, 3, k, false);
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 2, 3, 8, 16] {
                let mut c = vec![0.5f32; m * n];
                gemm(Mnk::new(m, k, n), av, bv, &mut c, true, threads);
                for (g, w) in c.iter().zip(&want) {
                    assert_eq!(f64::from(*g), w + 0.5, "{m}x{k}x{n} on {threads} threads");
                }
                gemm(Mnk::new(m, k, n), av, bv, &mut c, false, threads);
                for (g, w) in c.iter().zip(&want) {
                    assert_eq!(f64::from(*g), *w, "{m}x{k}x{n} on {threads} threads");
                }
                first.get_or_insert(c);
            }
            // Fractions, where the order of the sums shows in the last bits: every thread count
            // and SIMD level gives the first's.
            let af: Vec<f32> = a.iter().map(|v| v * 0.37 + 0.011).collect();
            let run = |threads: usize| {
                let mut c = vec![0f32; m * n];
                let av = MatView::row_major(&af, 3, k, false);
                gemm(Mnk::new(m, k, n), av, bv, &mut c, false, threads);
                c
            };
            let one = run(1);
            for threads in [2, 3, 8, 16] {
                assert_eq!(run(threads), one, "{m}x{k}x{n} on {threads} threads");
            }
            // Other tests read the level (and the direct convolution's depend on it): change it
            // only under the lock they hold.
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            let _levels = super::super::wide::level_lock();
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            for level in [
                super::super::wide::Simd::Baseline,
                super::super::wide::Simd::Avx2,
            ] {
                let before = super::super::wide::simd();
                super::super::wide::set_simd(level);
                let got = run(2);
                super::super::wide::set_simd(before);
                assert_eq!(got, one, "{m}x{k}x{n} at {level:?}");
            }
        }
    }

    #[test]
    fn a_few_rows_against_a_transposed_b_are_dot_products() {
        // m ≤ SMALL_M with B stored transposed: the dot-product path, at offsets, with a
        // padded B, lengths around the 8 lanes, overwriting and accumulating.
        let big = if cfg!(miri) {
            (1, 24, 40)
        } else {
            (1, 128, 384)
        };
        for (m, k, n) in [big, (2, 7, 5), (3, 17, 16), (4, 8, 3), (1, 1, 1)] {
            let a: Vec<f64> = (0..m * k + 3)
                .map(|i| ((i * 7) % 13) as f64 - 6.0)
                .collect();
            let b: Vec<f64> = (0..k * n)
                .map(|i| ((i * 5) % 11) as f64 * 0.5 - 2.0)
                .collect();
            let want = naive(m, k, n, &a[3..], &b);
            // B as n rows of k + 2 (stored transposed, padded).
            let mut bt = vec![9.0; n * (k + 2)];
            for p in 0..k {
                for j in 0..n {
                    bt[j * (k + 2) + p] = b[p * n + j];
                }
            }
            let bv = MatView {
                data: &bt,
                offset: 0,
                rs: 1,
                cs: k + 2,
            };
            let mut c = vec![0.5; m * n + 2];
            gemm(
                Mnk::new(m, k, n),
                MatView::row_major(&a, 3, k, false),
                bv,
                &mut c[2..],
                true,
                1,
            );
            for (g, w) in c[2..].iter().zip(&want) {
                assert!(
                    (g - (w + 0.5)).abs() < 1e-9,
                    "{m}x{k}x{n}: {g} vs {}",
                    w + 0.5
                );
            }
            gemm(
                Mnk::new(m, k, n),
                MatView::row_major(&a, 3, k, false),
                bv,
                &mut c[2..],
                false,
                2,
            );
            for (g, w) in c[2..].iter().zip(&want) {
                assert!((g - w).abs() < 1e-9);
            }
            assert_eq!(c[..2], [0.5, 0.5]);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn matches_naive_including_transposes_and_threads() {
        let (m, k, n) = (67, 45, 33);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
        let want = naive(m, k, n, &a, &b);
        for threads in [1, 2, 3] {
            let mut c = vec![0.0; m * n];
            gemm(
                Mnk::new(m, k, n),
                MatView::row_major(&a, 0, k, false),
                MatView::row_major(&b, 0, n, false),
                &mut c,
                false,
                threads,
            );
            assert_eq!(c, want);
        }
        // aᵀ stored as k×m, read transposed.
        let at = transposed(&a, m, k);
        let mut c = vec![1.0; m * n];
        gemm(
            Mnk::new(m, k, n),
            MatView::row_major(&at, 0, m, true),
            MatView::row_major(&b, 0, n, false),
            &mut c,
            true,
            2,
        );
        let plus1: Vec<f64> = want.iter().map(|v| v + 1.0).collect();
        assert_eq!(c, plus1);
    }

    /// A few rows against a transposed B over a long k (a convolution's weight gradient) run as
    /// the transposed product, written back: the naive product's values, accumulating or not,
    /// on one to three threads.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_few_rows_over_a_long_k_run_transposed_and_match_naive() {
        let (m, k, n) = (6, 4103, 37);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
        let bt = transposed(&b, k, n);
        assert!(runs_transposed(
            Mnk::new(m, k, n),
            &MatView::row_major(&a, 0, k, false),
            &MatView::row_major(&bt, 0, k, true)
        ));
        let want = naive(m, k, n, &a, &b);
        for threads in [1, 2, 3] {
            for accumulate in [false, true] {
                let mut c = vec![0.5; m * n];
                gemm(
                    Mnk::new(m, k, n),
                    MatView::row_major(&a, 0, k, false),
                    MatView::row_major(&bt, 0, k, true),
                    &mut c,
                    accumulate,
                    threads,
                );
                let plus: Vec<f64> = want
                    .iter()
                    .map(|v| if accumulate { v + 0.5 } else { *v })
                    .collect();
                assert_eq!(c, plus, "{threads} threads, accumulate {accumulate}");
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn threaded_row_and_column_splits_match_naive() {
        // Above PAR_MIN_FLOPS: short-and-wide splits columns, tall-and-narrow splits rows.
        for (m, k, n) in [(40, 300, 250), (250, 300, 40), (33, 200, 331)] {
            let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
            let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
            let want = naive(m, k, n, &a, &b);
            // b stored transposed (n×k), read through strides.
            let bt = transposed(&b, k, n);
            for threads in [2, 3] {
                let mut c = vec![0.5; m * n];
                gemm(
                    Mnk::new(m, k, n),
                    MatView::row_major(&a, 0, k, false),
                    MatView::row_major(&bt, 0, k, true),
                    &mut c,
                    true,
                    threads,
                );
                let plus: Vec<f64> = want.iter().map(|v| v + 0.5).collect();
                assert_eq!(c, plus, "{m}x{k}x{n} on {threads} threads");
            }
        }
    }
}
