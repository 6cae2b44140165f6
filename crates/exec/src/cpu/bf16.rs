//! bf16: conversions, and the product of bf16 matrices into f32 ([`gemm_bf16`]).
//!
//! # One answer on every CPU
//!
//! The product is defined by the instruction that computes it fastest, AVX-512 BF16's
//! `vdpbf16ps`, and every other path computes the same bits. For each output element the
//! accumulator starts at 0 (or at the element's value, when accumulating) and takes the
//! products along `k` two at a time, `k` padded with a zero to even length: for the pair
//! `(2p, 2p + 1)`,
//!
//! ```text
//! acc = round(acc + a[2p + 1]·b[2p + 1])
//! acc = round(acc + a[2p]·b[2p])
//! ```
//!
//! each a fused multiply-add in f32 rounded to nearest even, reading denormal inputs (the bf16
//! operands and the accumulator) as zeros of their sign and flushing a denormal result to a zero
//! of its sign — the instruction's definition (Intel SDM, `VDPBF16PS`: "FP32 FMA with DAZ in, FTZ
//! out and RNE rounding; MXCSR neither consulted nor updated"), confirmed against the hardware
//! by this module's tests. The order does not depend on blocking or threads (threads split the
//! rows or the columns of the output; the accumulator of an element is carried in the output between blocks of
//! `k`), so the result is the same at every SIMD level, every thread count and every size of
//! block. Only a NaN's payload may differ between levels (NaN stays NaN).
//!
//! # The kernels
//!
//! Operands are packed the instruction's way: `a` in panels of [`MR`] rows, `b` in panels of
//! [`NR`] columns, each entry a 32-bit pair of bf16 neighbours along `k`. The AVX-512 BF16 kernel
//! holds an `MR × NR` tile of f32 accumulators in 24 registers and takes one `vdpbf16ps` per
//! register per pair of `k`; the portable kernel computes the definition above with fused
//! multiply-adds (AVX-512 or AVX2 where present, else `f32::mul_add`). Where no operand,
//! product, sum or accumulator of a product can be subnormal (checked on the operands first:
//! `normal_results`), the flushes change nothing, and AVX2 and AVX-512 (without BF16) run tiles
//! without them that keep their accumulators in registers (1024³ on one Zen 5 core: AVX2 30 → 77
//! GFLOP/s, AVX-512 64 → 116).
//!
//! # AMX, where asked for
//!
//! Intel's Xeons since Sapphire Rapids have a tile unit (AMX) whose `tdpbf16ps` multiplies
//! 16 × 32 by 32 × 16 bf16 tiles into f32 at several times `vdpbf16ps`'s rate. On those CPUs
//! `vdpbf16ps` retires a quarter as many instructions a second as the f32 fused multiply-add,
//! each doing twice its work: half the f32 rate (measured on an Emerald Rapids core: 1.2 G
//! `vdpbf16ps` against 5.1 G `vfmadd231ps` a second; the definition's kernel ran at 0.55–0.61×
//! the f32 product there). Its rounding is not the definition's
//! ([`Bf16Kernel::Amx`]), so it runs only where the process asks for it: [`set_amx`], or
//! `ARENAGRAD_BF16=amx` in the environment.

pub use half::bf16;

use super::matmul::{product_output, MatView, Mnk, PAR_MIN_FLOPS};

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod amx;
pub mod conv;
mod gemv;

/// Rows of a packed panel of `a`, and of the kernel's tile.
pub const MR: usize = 6;
/// Columns of a packed panel of `b`, and of the kernel's tile.
pub const NR: usize = 64;
/// Pairs of `k` packed at a time (384 values of `k`: of 128, 192, 256 and 512 pairs, the best
/// on the reference machine at 1024³).
const KC2: usize = 192;
/// Rows of `a` packed at a time.
const MC: usize = MR * 48;

/// `x` rounded to bf16, to nearest even (NaN stays a quiet NaN), as PyTorch's conversion and
/// `vcvtneps2bf16`.
pub fn to_bf16(x: f32) -> bf16 {
    // The `half` crate's rule (nearest even; NaN quiet, sign and top payload kept), branch-free.
    round_bits(x)
}

/// `x`'s value (exact).
pub fn from_bf16(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// `src` rounded into `dst` (as [`to_bf16`]).
pub fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    super::wide::wide(
        src.len(),
        #[inline(always)]
        move || f32_to_bf16_lanes(src, dst),
    )
}

/// [`f32_to_bf16`]'s loop, to inline in a caller's vectorised loop.
#[inline(always)]
pub(crate) fn f32_to_bf16_lanes(src: &[f32], dst: &mut [bf16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = round_bits(s);
    }
}

/// `src` widened into `dst` (exact).
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    super::wide::wide(
        src.len(),
        #[inline(always)]
        move || bf16_to_f32_lanes(src, dst),
    )
}

/// [`bf16_to_f32`]'s loop, to inline in a caller's vectorised loop.
#[inline(always)]
pub(crate) fn bf16_to_f32_lanes(src: &[bf16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(s.to_bits()) << 16);
    }
}

/// Round to nearest even on the bits, branch-free (so that the loop vectorises); NaN becomes
/// a quiet NaN with its sign and top payload bits.
#[inline(always)]
fn round_bits(x: f32) -> bf16 {
    let u = x.to_bits();
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16;
    let nan = (u & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits(if nan {
        (u >> 16) as u16 | 0x40
    } else {
        rounded as u16
    })
}

/// A denormal read as a zero of its sign (the instruction's DAZ), on the bits.
#[inline(always)]
fn flush_bits(u: u32) -> u32 {
    let denormal = ((u & 0x7f80_0000) == 0) as u32;
    u & !(denormal.wrapping_neg() & 0x7fff_ffff)
}

#[inline(always)]
fn flush(x: f32) -> f32 {
    f32::from_bits(flush_bits(x.to_bits()))
}

/// The bf16 at the high half of a packed pair (the odd element), as f32, denormal flushed.
#[inline(always)]
fn odd(pair: u32) -> f32 {
    f32::from_bits(flush_bits(pair & 0xffff_0000))
}

/// The bf16 at the low half of a packed pair (the even element), as f32, denormal flushed.
#[inline(always)]
fn even(pair: u32) -> f32 {
    f32::from_bits(flush_bits(pair << 16))
}

/// One pair of the definition for one element: the odd product, then the even one.
#[inline(always)]
pub fn dot_pair(acc: f32, a: u32, b: u32) -> f32 {
    let t = flush(odd(a).mul_add(odd(b), flush(acc)));
    flush(even(a).mul_add(even(b), t))
}

/// Two bf16 as the packed pair the kernels read (`lo` at `k = 2p`, `hi` at `2p + 1`).
#[inline(always)]
pub fn pair(lo: bf16, hi: bf16) -> u32 {
    u32::from(lo.to_bits()) | (u32::from(hi.to_bits()) << 16)
}

/// Which kernel a product runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// `vdpbf16ps` (AVX-512 BF16).
    Avx512Bf16,
    /// The definition in AVX-512 fused multiply-adds.
    Avx512,
    /// The definition in AVX2 fused multiply-adds.
    Avx2,
    /// The definition in `f32::mul_add`, compiled for the target's baseline.
    Portable,
    /// AMX's `tdpbf16ps`, products of 16 rows by 16 columns by 32 of `k` per instruction:
    /// **not the definition's bits** (rounding errors of the same size, other bits; the same
    /// on every thread count), so only where asked for ([`set_amx`]). A few rows against a
    /// matrix read once (a token at a time) still run on `vdpbf16ps`, as without AMX.
    Amx,
}

const AMX_UNSET: u8 = u8::MAX;
/// Whether products may run on AMX: unset (read `ARENAGRAD_BF16` on first use), 0 or 1.
static AMX: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(AMX_UNSET);

/// Lets [`gemm_bf16`] run on AMX's tile unit where the CPU has it ([`Bf16Kernel::Amx`]), or
/// stops it, for the whole process; returns whether AMX is now in use. Off by default, and
/// unless the environment variable `ARENAGRAD_BF16` is `amx`: AMX's products do not give the
/// bits every other kernel gives (see [`Bf16Kernel::Amx`]), so a process that asks for its
/// throughput gives up results equal across machines.
pub fn set_amx(on: bool) -> bool {
    let on = on && Bf16Kernel::Amx.available();
    AMX.store(u8::from(on), std::sync::atomic::Ordering::Relaxed);
    on
}

/// Whether [`gemm_bf16`] may run on AMX (see [`set_amx`]); it does not where the SIMD level is
/// capped below AVX-512 ([`super::wide::set_simd`]).
pub fn amx_in_use() -> bool {
    match AMX.load(std::sync::atomic::Ordering::Relaxed) {
        AMX_UNSET => set_amx(std::env::var("ARENAGRAD_BF16").as_deref() == Ok("amx")),
        v => v == 1,
    }
}

impl Bf16Kernel {
    /// The fastest kernel this CPU has, within the SIMD level in force
    /// ([`super::wide::simd`]).
    pub fn best() -> Bf16Kernel {
        use super::wide::{simd, Simd};
        let candidates: &[Bf16Kernel] = match simd() {
            Simd::Avx512 if amx_in_use() => &[Bf16Kernel::Amx],
            Simd::Avx512 => &[Bf16Kernel::Avx512Bf16, Bf16Kernel::Avx512],
            Simd::Avx2 => &[Bf16Kernel::Avx2],
            Simd::Baseline => &[],
        };
        candidates
            .iter()
            .copied()
            .find(|k| k.available())
            .unwrap_or(Bf16Kernel::Portable)
    }

    /// Whether this CPU can run the kernel.
    pub fn available(self) -> bool {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                Bf16Kernel::Avx512Bf16 => has!("avx512f") && has!("avx512bf16"),
                Bf16Kernel::Avx512 => has!("avx512f") && has!("fma"),
                Bf16Kernel::Avx2 => has!("avx2") && has!("fma"),
                Bf16Kernel::Portable => true,
                Bf16Kernel::Amx => has!("avx512bf16") && amx::available(),
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        {
            self == Bf16Kernel::Portable
        }
    }
}

/// `c[..m×n, row-major] (+)= a · b` for bf16 `a` (m×k) and `b` (k×n), accumulated in f32 as the
/// module documentation defines, on up to `threads` threads, with [`Bf16Kernel::best`].
/// Panics if a view does not fit its slice (an internal invariant: callers check shapes).
pub fn gemm_bf16(
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    gemm_bf16_on(Bf16Kernel::best(), dims, a, b, c, accumulate, threads)
}

/// Where a rounded product starts ([`gemm_bf16_rounded`]): output row `r` starts from row
/// `r mod rows` of `c` (`rows` × `cols`, row-major), its `n` columns from that row's, or from its
/// one value where `cols` is 1 (PyTorch's `addmm` with a broadcast bias).
#[derive(Debug, Clone, Copy)]
pub struct Start<'a> {
    /// The starting values.
    pub c: &'a [bf16],
    /// `c`'s rows: 1 or the output's.
    pub rows: usize,
    /// `c`'s columns: 1 or the output's.
    pub cols: usize,
}

impl Start<'_> {
    /// The values output row `r` starts from, widened into `row` (the output's columns): row
    /// `r mod rows` of `c`, or its one value where `cols` is 1. Panics if `c` is too short.
    pub fn row_into(&self, r: usize, row: &mut [f32]) {
        let sr = r % self.rows.max(1);
        if self.cols == 1 {
            row.fill(self.c[sr].to_f32());
        } else {
            let n = row.len();
            bf16_to_f32(&self.c[sr * n..][..n], row);
        }
    }
}

/// `out[..m×n] = round(start + a·b)`: [`gemm_bf16`]'s sums, begun from `start` (zeros where
/// none), rounded once to bf16 as [`f32_to_bf16`] rounds — the bits of [`gemm_bf16`] into an f32
/// buffer followed by [`f32_to_bf16`], without the f32 buffer: each thread keeps the sums of 32
/// rows at a time and rounds them while they are in its caches. Only where the product runs on
/// AMX ([`set_amx`]), `k` is at most 512 and `n` at most `4·m` (many rows against a weight);
/// elsewhere it returns false and writes nothing, for the caller to take the f32 route. Panics
/// if a view or `start` does not fit its slice (callers check shapes).
pub fn gemm_bf16_rounded(
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    start: Option<Start<'_>>,
    out: &mut [bf16],
    threads: usize,
) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let Mnk { m, k, n } = dims;
        // Where it pays: one block of `k` (the sums never leave the strip between blocks) and
        // no more than four times as many columns as rows (every thread reads all of `b`; a
        // linear layer's forward over 512 tokens, 512 × 384 × 1536, ran at 411-527 GFLOP/s on
        // two threads here against 319-328 by the f32 buffer, 64 × 256 × 2048 at 140-213
        // against 180-225). A weight's gradient, with a long `k` over the tokens, goes the f32
        // way, whose blocks of `b` serve many rows.
        if Bf16Kernel::best() != Bf16Kernel::Amx
            || m == 0
            || n == 0
            || k == 0
            || k.div_ceil(2) > amx::KC2
            || n > 4 * m
            || gemv::takes(Bf16Kernel::Avx512Bf16, dims, &a, &b)
        {
            return false;
        }
        rounded_on_amx(dims, a, b, start, out, threads);
        true
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = (dims, a, b, start, out, threads);
        false
    }
}

/// [`gemm_bf16_rounded`] on AMX, which must be available (not necessarily in use).
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn rounded_on_amx(
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    start: Option<Start<'_>>,
    out: &mut [bf16],
    threads: usize,
) {
    let Mnk { m, k, n } = dims;
    if let Some(s) = start {
        assert!(
            (s.rows == 1 || s.rows == m)
                && (s.cols == 1 || s.cols == n)
                && s.c.len() >= s.rows * s.cols,
            "invariant: a start that spreads over the output"
        );
    }
    // `rounded_threaded` checks the views and returns at once on an empty output.
    let work = m.saturating_mul(k).saturating_mul(n);
    let t = if work >= PAR_MIN_FLOPS { threads } else { 1 };
    amx::rounded_threaded(dims, a, b, start, out, t);
}

/// [`gemm_bf16`] on a given kernel (the portable one where the CPU lacks it).
pub fn gemm_bf16_on(
    kernel: Bf16Kernel,
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    // A few rows against a matrix read once: the same `vdpbf16ps` path under AMX.
    let rows_kernel = match kernel {
        Bf16Kernel::Amx => Bf16Kernel::Avx512Bf16,
        k => k,
    };
    if gemv::takes(rows_kernel, dims, &a, &b) {
        // A few rows (a token at a time): `b` read once where it lies, nothing packed.
        if product_output(dims, &a, &b, c, accumulate, 0.0).is_some() {
            gemv::gemv(dims, a, b, c, accumulate, threads);
        }
        return;
    }
    if swaps(dims, &a, &b) {
        // cᵀ = bᵀ·aᵀ, the same products in the same pairs and order (the bits of c), with the
        // operand that packs slowly or wastes a panel's columns on the other side.
        let Mnk { m, k, n } = dims;
        let mut ct = vec![0f32; m * n];
        if accumulate {
            super::transpose::transpose_f32(&c[..m * n], m, n, n, &mut ct);
        }
        fn flip(v: MatView<'_, bf16>) -> MatView<'_, bf16> {
            MatView {
                rs: v.cs,
                cs: v.rs,
                ..v
            }
        }
        product_on(
            kernel,
            Mnk::new(n, k, m),
            flip(b),
            flip(a),
            &mut ct,
            accumulate,
            threads,
        );
        super::transpose::transpose_f32(&ct, n, m, m, &mut c[..m * n]);
        return;
    }
    product_on(kernel, dims, a, b, c, accumulate, threads)
}

/// Whether [`gemm_bf16_on`] computes `c` as `(bᵀ·aᵀ)ᵀ`: when `b` has fewer columns than `a`
/// rows and than a panel (most of each panel would be padding), or when `b` is read
/// transposed (k contiguous, packed a column at a time) and has more columns than `a` rows
/// while `a` is k-contiguous (its transpose packs as fast as `b` would), by enough over a long
/// enough `k` that packing the smaller operand saves more than transposing the output costs.
fn swaps(dims: Mnk, a: &MatView<'_, bf16>, b: &MatView<'_, bf16>) -> bool {
    let Mnk { m, k, n } = dims;
    if m == 0 || n == 0 || k == 0 {
        return false;
    }
    let narrow = n < m && n < NR;
    // Swapped, every thread packs `a` (k × m) instead of `b` (k × n), but one thread then
    // transposes the f32 output (m × n). That pays for a long `k` (a convolution's weight
    // gradient, 64 × 12544 × 288), not for a linear layer's forward (`x·Wᵀ`, 512 × 384 × 1152:
    // 464 GFLOP/s swapped on AMX against 991 as given).
    let transposed_b = b.rs == 1
        && b.cs != 1
        && a.cs == 1
        && m < n
        && k.saturating_mul(n - m) > m.saturating_mul(n).saturating_mul(4);
    narrow || transposed_b
}

/// [`gemm_bf16_on`] as given (no swap).
fn product_on(
    kernel: Bf16Kernel,
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    let Some(c) = product_output(dims, &a, &b, c, accumulate, 0.0) else {
        return;
    };
    let Mnk { m, k, n } = dims;
    let kernel = if kernel.available() {
        kernel
    } else {
        Bf16Kernel::Portable
    };
    // The AVX2 and AVX-512 tiles leave out the flushes where no value can be subnormal
    // (`normal_results`).
    let normal = matches!(kernel, Bf16Kernel::Avx2 | Bf16Kernel::Avx512)
        && normal_results(dims, &a, &b, accumulate.then_some(&*c));
    let work = m.saturating_mul(k).saturating_mul(n);
    let parallel = threads > 1 && work >= PAR_MIN_FLOPS;
    // AMX multiplies faster than its operands pack. With more than one block of rows and `k`
    // no longer than `m`, the threads pack `b` together once and then take rows each
    // (`amx::threaded`: 1024³ on two threads in half the time of the split below). Otherwise
    // (a weight's gradient, `k` over the tokens: two forks per block of `k` cost more there),
    // columns to each thread where packing all of `b` in every thread (`k·n`) costs more than
    // packing all of `a` (`m·k`) and copying the output's columns (`m·n`).
    let amx = kernel == Bf16Kernel::Amx;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if amx && parallel && m > 32 && k <= m {
        return amx::threaded(dims, a, b, c, accumulate, threads);
    }
    if parallel
        && n >= 2 * NR
        && (if amx {
            n >= m && k >= m
        } else {
            n > m && k >= 2 * m
        })
    {
        // Wider than tall with a long `k` (a weight's gradient, summed over tokens): whole
        // panels of columns to each thread, so that each packs its part of `b` (the larger
        // operand) and all of `a`, not all of `b` as a split by rows would make every thread
        // do. Each thread writes its columns to a buffer of its own, copied into `c` after:
        // cheap beside the packing saved where `k` is long against `m` (`k·n` pairs packed
        // again per thread against `m·n` copied).
        let t = threads.clamp(1, n.div_ceil(NR));
        let cols_per = n.div_ceil(t).div_ceil(NR) * NR;
        let mut parts = column_parts(c, (m, n), cols_per, accumulate);
        super::thread_pool::for_each_owned(parts.iter_mut().collect(), |p, part| {
            let j0 = p * cols_per;
            let b = MatView {
                offset: b.offset + j0 * b.cs,
                ..b
            };
            single_thread(
                (kernel, normal),
                Mnk::new(m, k, part.len() / m),
                a,
                b,
                part,
                accumulate,
            );
        });
        columns_back(&parts, c, (m, n), cols_per);
        return;
    }
    let t = if parallel {
        threads.clamp(1, m.div_ceil(MR))
    } else {
        1
    };
    // Whole panels of rows to each thread, so that no thread packs a panel another also packs
    // (whole blocks of tiles for AMX).
    let unit = if amx { 32 } else { MR };
    let rows_per = m.div_ceil(t).div_ceil(unit) * unit;
    let block = |part: usize, c: &mut [f32]| {
        let r0 = part * rows_per;
        let a = MatView {
            offset: a.offset + r0 * a.rs,
            ..a
        };
        single_thread(
            (kernel, normal),
            Mnk::new(c.len() / n, k, n),
            a,
            b,
            c,
            accumulate,
        );
    };
    if t <= 1 {
        block(0, c);
    } else {
        let parts: Vec<&mut [f32]> = c.chunks_mut(rows_per * n).collect();
        super::thread_pool::for_each_part(parts, block);
    }
}

/// `c`'s (m × n) columns in blocks of `per`, each block a buffer of its own (m × its columns):
/// a copy of `c`'s values there when `accumulate`, else zeros. For threads that each write a
/// block of columns; [`columns_back`] puts them back.
fn column_parts(c: &[f32], (m, n): (usize, usize), per: usize, accumulate: bool) -> Vec<Vec<f32>> {
    (0..n.div_ceil(per))
        .map(|p| {
            let (j0, w) = (p * per, per.min(n - p * per));
            let mut part = vec![0f32; m * w];
            if accumulate {
                for (dst, src) in part.chunks_exact_mut(w).zip(c.chunks_exact(n)) {
                    dst.copy_from_slice(&src[j0..j0 + w]);
                }
            }
            part
        })
        .collect()
}

/// The blocks of [`column_parts`] written back into `c`.
fn columns_back(parts: &[Vec<f32>], c: &mut [f32], (m, n): (usize, usize), per: usize) {
    for (p, part) in parts.iter().enumerate() {
        let (j0, w) = (p * per, part.len() / m);
        for (dst, src) in c.chunks_exact_mut(n).zip(part.chunks_exact(w)) {
            dst[j0..j0 + w].copy_from_slice(src);
        }
    }
}

/// A packing buffer kept and reused, handed out in windows that start on a 64-byte line.
///
/// A plain `Vec<u32>` starts where the allocator puts it, 16 bytes past a line for the sizes a
/// product packs: every 64-byte row the kernels load (a `zmm` register, a tile row) then spans
/// two lines. On AMX that halved the product's speed at 1024³ (the tile loads stream from the
/// level-2 cache at half the rate when each row touches two lines).
pub(super) struct PackBuf<T = u32>(Vec<T>);

impl<T> Default for PackBuf<T> {
    fn default() -> Self {
        PackBuf(Vec::new())
    }
}

impl<T: Copy + Default> PackBuf<T> {
    /// `len` values starting on a 64-byte boundary. The contents are whatever the last use
    /// left (or zeros): the packing writes every value it hands to a kernel.
    pub(super) fn window(&mut self, len: usize) -> &mut [T] {
        let line = 64 / std::mem::size_of::<T>().max(1);
        self.0.resize(len + line - 1, T::default());
        let skip = self.0.as_ptr().align_offset(64).min(line - 1);
        &mut self.0[skip..skip + len]
    }
}

thread_local! {
    /// Each thread's packing buffers (`a`'s block, `b`'s block), kept and reused.
    static PACKS: std::cell::RefCell<(PackBuf, PackBuf)> =
        const { std::cell::RefCell::new((PackBuf(Vec::new()), PackBuf(Vec::new()))) };
}

/// `f` on this thread's packing buffers for `a` and `b` (fresh ones where they are in use
/// further up this thread's stack).
fn with_packs<R>(f: impl FnOnce(&mut PackBuf, &mut PackBuf) -> R) -> R {
    PACKS.with(|packs| {
        let mut fresh = (PackBuf::default(), PackBuf::default());
        let mut held = packs.try_borrow_mut();
        let (pa, pb) = match held.as_deref_mut() {
            Ok(p) => (&mut p.0, &mut p.1),
            Err(_) => (&mut fresh.0, &mut fresh.1),
        };
        f(pa, pb)
    })
}

/// The product on this thread: `c` (m×n, row-major) holds the starting accumulators when
/// `accumulate`, else they are zeros.
fn single_thread(
    (kernel, normal): (Bf16Kernel, bool),
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if kernel == Bf16Kernel::Amx {
        return amx::single_thread(dims, a, b, c, accumulate);
    }
    let Mnk { m, k, n } = dims;
    let k2 = k.div_ceil(2);
    with_packs(|pa_buf, pb_buf| {
        let mut p0 = 0;
        while p0 < k2 {
            let kc2 = KC2.min(k2 - p0);
            let bn = n.div_ceil(NR) * NR;
            let pb = pb_buf.window(kc2 * bn);
            pack_b(b, k, p0, kc2, n, pb);
            // `vdpbf16ps` reads whole panels of a k-contiguous `a` where they lie (its pairs
            // are adjacent already); the others, and panels with padding, are packed.
            let in_place = kernel == Bf16Kernel::Avx512Bf16 && a.cs == 1 && 2 * (p0 + kc2) <= k;
            let mut i0 = 0;
            while i0 < m {
                let mc = MC.min(m - i0);
                let am = mc.div_ceil(MR) * MR;
                let pa = pa_buf.window(kc2 * am);
                if !in_place {
                    pack_a(a, k, i0, mc, p0, kc2, pa);
                } else if mc % MR != 0 {
                    // Only the last, partial panel.
                    let last = mc / MR * MR;
                    pack_a(a, k, i0 + last, mc - last, p0, kc2, &mut pa[last * kc2..]);
                }
                for (ip, packed) in pa.chunks_exact(kc2 * MR).enumerate() {
                    let r = i0 + ip * MR;
                    let rows = MR.min(m - r);
                    let apanel = if in_place && rows == MR {
                        APanel::Rows {
                            a: &a.data[a.offset + r * a.rs + 2 * p0..],
                            rs: a.rs,
                        }
                    } else {
                        APanel::Packed(packed)
                    };
                    for (jp, bpanel) in pb.chunks_exact(kc2 * NR).enumerate() {
                        let j0 = jp * NR;
                        let cols = NR.min(n - j0);
                        let tile = Tile {
                            c: &mut c[r * n + j0..],
                            ldc: n,
                            rows,
                            cols,
                        };
                        run_tile(
                            (kernel, normal),
                            kc2,
                            apanel,
                            bpanel,
                            tile,
                            accumulate || p0 > 0,
                        );
                    }
                }
                i0 += mc;
            }
            p0 += kc2;
        }
    });
}

/// Entry `(i, j)` of `v` where `inside`, else zero (the padding of `k` to even length).
#[inline(always)]
fn padded(v: MatView<'_, bf16>, i: usize, j: usize, inside: bool) -> bf16 {
    if inside {
        v.data[v.offset + i * v.rs + j * v.cs]
    } else {
        bf16::from_bits(0)
    }
}

/// Packs pairs `p0..p0 + kc2` of rows `i0..i0 + mc` of `a` (m×k) into panels of [`MR`] rows:
/// entry `(panel, p, r)` at `(panel·kc2 + p)·MR + r`; rows past `mc` and `k` past its end are 0.
fn pack_a(
    a: MatView<'_, bf16>,
    k: usize,
    i0: usize,
    mc: usize,
    p0: usize,
    kc2: usize,
    dst: &mut [u32],
) {
    let at = |i: usize, kk: usize| padded(a, i, kk, kk < k);
    // Read transposed (a row's entries contiguous, as a weight gradient's incoming gradient
    // is), the whole panels first: each pair `p` of `k` is two runs of storage across all
    // of them, interleaved at the widest vector level into a line of pairs and dealt out
    // to the panels [`MR`] at a time. Panel by panel, each pair had been two runs of [`MR`]
    // elements, too short to vectorise: 4.5% of the autocast GPT step.
    let whole = if a.rs == 1 && a.cs != 1 && 2 * (p0 + kc2) <= k {
        (mc / MR).min(dst.len() / (kc2 * MR))
    } else {
        0
    };
    if whole > 0 {
        super::wide::wide(
            whole * MR * kc2,
            #[inline(always)]
            || pack_a_transposed(a, (i0, whole), (p0, kc2), dst),
        );
    }
    for (panel, out) in dst.chunks_exact_mut(kc2 * MR).enumerate().skip(whole) {
        let first = panel * MR;
        let rows = MR.min(mc.saturating_sub(first));
        if a.cs == 1 && rows == MR && 2 * (p0 + kc2) <= k {
            // Whole rows of contiguous pairs: read the MR rows side by side, write each pair
            // of `k` once.
            let row: [&[bf16]; MR] = std::array::from_fn(|r| {
                let base = a.offset + (i0 + first + r) * a.rs + 2 * p0;
                &a.data[base..base + 2 * kc2]
            });
            for (p, o) in out.chunks_exact_mut(MR).enumerate() {
                for (slot, src) in o.iter_mut().zip(&row) {
                    *slot = pair(src[2 * p], src[2 * p + 1]);
                }
            }
            continue;
        }
        for p in 0..kc2 {
            let kk = 2 * (p0 + p);
            for r in 0..MR {
                out[p * MR + r] = if r < rows {
                    let i = i0 + first + r;
                    pair(at(i, kk), at(i, kk + 1))
                } else {
                    0
                };
            }
        }
    }
}

/// [`pack_a`]'s first `panels` whole panels of an `a` read transposed (`a.rs == 1`), pairs
/// `p0..p0 + kc2` all inside `k`: for each pair, rows `2p` and `2p + 1` of storage across the
/// panels' rows interleaved into pairs in a line of its own, then each panel's [`MR`] of them
/// written where the panel keeps that pair.
#[inline(always)]
fn pack_a_transposed(
    a: MatView<'_, bf16>,
    (i0, panels): (usize, usize),
    (p0, kc2): (usize, usize),
    dst: &mut [u32],
) {
    let rows = panels * MR;
    let base = a.offset + i0;
    let mut line = [0u32; MC];
    for start in (0..rows).step_by(MC) {
        let len = MC.min(rows - start);
        let line = &mut line[..len];
        for p in 0..kc2 {
            let kk = 2 * (p0 + p);
            let lo = &a.data[base + start + kk * a.cs..][..len];
            let hi = &a.data[base + start + (kk + 1) * a.cs..][..len];
            for ((slot, &l), &h) in line.iter_mut().zip(lo).zip(hi) {
                *slot = pair(l, h);
            }
            for (q, six) in line.chunks_exact(MR).enumerate() {
                let panel = (start / MR + q) * kc2 + p;
                dst[panel * MR..][..MR].copy_from_slice(six);
            }
        }
    }
}

/// Packs pairs `p0..p0 + kc2` of `b` (k×n) into panels of [`NR`] columns: entry
/// `(panel, p, c)` at `(panel·kc2 + p)·NR + c`; columns past `n` and `k` past its end are 0.
fn pack_b(b: MatView<'_, bf16>, k: usize, p0: usize, kc2: usize, n: usize, dst: &mut [u32]) {
    pack_b_panels::<NR>(b, k, (p0, kc2), n, dst)
}

/// [`pack_b`] into panels of `W` columns (entry `(panel, p, c)` at `(panel·kc2 + p)·W + c`).
fn pack_b_panels<const W: usize>(
    b: MatView<'_, bf16>,
    k: usize,
    (p0, kc2): (usize, usize),
    n: usize,
    dst: &mut [u32],
) {
    // Compiled for the widest vector unit: the interleaving and the blocked transposition
    // below vectorise there.
    super::wide::wide(
        dst.len(),
        #[inline(always)]
        || pack_b_loops::<W>(b, k, (p0, kc2), n, dst),
    )
}

#[inline(always)]
fn pack_b_loops<const W: usize>(
    b: MatView<'_, bf16>,
    k: usize,
    (p0, kc2): (usize, usize),
    n: usize,
    dst: &mut [u32],
) {
    let at = |kk: usize, j: usize| padded(b, kk, j, kk < k);
    if b.cs == 1 {
        // Rows contiguous: each pair of rows read once from end to end, each panel's part
        // written as one row of the panel (a panel's `W` pairs, whole cache lines for `W` of
        // 16 and more), rather than each panel walking down all the rows in turn.
        let panels = dst.len() / (kc2 * W);
        for p in 0..kc2 {
            let kk = 2 * (p0 + p);
            let rows = (kk + 1 < k).then(|| {
                (
                    &b.data[b.offset + kk * b.rs..][..n],
                    &b.data[b.offset + (kk + 1) * b.rs..][..n],
                )
            });
            for panel in 0..panels {
                let j0 = panel * W;
                let cols = W.min(n - j0);
                let o = &mut dst[(panel * kc2 + p) * W..][..W];
                if let Some((lo, hi)) = rows {
                    let (lo, hi) = (&lo[j0..j0 + cols], &hi[j0..j0 + cols]);
                    for ((slot, &l), &h) in o.iter_mut().zip(lo).zip(hi) {
                        *slot = pair(l, h);
                    }
                    o[cols..].fill(0);
                } else {
                    for (c, slot) in o.iter_mut().enumerate() {
                        *slot = if c < cols {
                            pair(at(kk, j0 + c), at(kk + 1, j0 + c))
                        } else {
                            0
                        };
                    }
                }
            }
        }
        return;
    }
    for (panel, out) in dst.chunks_exact_mut(kc2 * W).enumerate() {
        let j0 = panel * W;
        let cols = W.min(n - j0);
        if b.rs == 1 && b.cs != 1 {
            // Read transposed (a column's k entries contiguous).
            let whole = (2 * (p0 + kc2)).min(k).saturating_sub(2 * p0) / 2;
            // Blocks of 8 pairs by 8 columns transposed through registers (8 columns' pairs
            // read, 8 rows of the panel written), then the ragged columns and pairs one by one.
            const T8: usize = 8;
            let (whole8, cols8) = (whole / T8 * T8, cols / T8 * T8);
            // A pair is the 32-bit word `pair(lo, hi)` where it lies (little-endian) when every
            // column starts at an even element: then the blocks are 8×8 transposes of 32-bit
            // words, done by moves in AVX registers (no arithmetic: the bits are kept).
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            if b.offset.is_multiple_of(2)
                && b.cs.is_multiple_of(2)
                && std::arch::is_x86_feature_detected!("avx")
            {
                let words = b.data.as_ptr().cast::<f32>();
                for pb in (0..whole8).step_by(T8) {
                    for c0 in (0..cols8).step_by(T8) {
                        let first = (b.offset + (j0 + c0) * b.cs) / 2 + p0 + pb;
                        let dst = out[pb * W + c0..].as_mut_ptr().cast::<f32>();
                        // SAFETY: the CPU has AVX (detected above). Source row c (column
                        // j0 + c0 + c of `b`, c < 8) is the 16 elements from `b.offset +
                        // (j0 + c0 + c)·b.cs + 2·(p0 + pb)`, all inside `b.data`: that column
                        // is below `n` (c0 + 8 ≤ cols8 ≤ cols), those pairs below `k` (pb + 8 ≤
                        // whole8 ≤ whole), and `b` fits k×n; the offset and stride are even, so
                        // word `first + c·(b.cs / 2) + q` is elements `2·first + c·b.cs + 2q`
                        // and `+ 1`. Destination row q (q < 8) is `out[(pb + q)·W + c0..][..8]`,
                        // inside `out` (pb + 8 ≤ kc2, c0 + 8 ≤ W); `out` is a `&mut` slice
                        // apart from `b.data`. Loads and stores are unaligned ones.
                        unsafe {
                            super::transpose::avx::transpose8x8(words.add(first), b.cs / 2, dst, W)
                        };
                    }
                }
                pack_b_edges::<W>((b, k), (p0, kc2, whole), (j0, cols), (whole8, cols8), out);
                continue;
            }
            for pb in (0..whole8).step_by(T8) {
                for c0 in (0..cols8).step_by(T8) {
                    let block: [[u32; T8]; T8] = std::array::from_fn(|c| {
                        let base = b.offset + (j0 + c0 + c) * b.cs + 2 * (p0 + pb);
                        let col = &b.data[base..base + 2 * T8];
                        std::array::from_fn(|q| pair(col[2 * q], col[2 * q + 1]))
                    });
                    for q in 0..T8 {
                        let row = &mut out[(pb + q) * W + c0..][..T8];
                        for (c, slot) in row.iter_mut().enumerate() {
                            *slot = block[c][q];
                        }
                    }
                }
            }
            pack_b_edges::<W>((b, k), (p0, kc2, whole), (j0, cols), (whole8, cols8), out);
            continue;
        }
        // Neither way contiguous: element by element.
        for p in 0..kc2 {
            let kk = 2 * (p0 + p);
            let o = &mut out[p * W..(p + 1) * W];
            for (c, slot) in o.iter_mut().enumerate() {
                *slot = if c < cols {
                    pair(at(kk, j0 + c), at(kk + 1, j0 + c))
                } else {
                    0
                };
            }
        }
    }
}

/// The parts of a panel of `b` read transposed that its 8×8 blocks leave ([`pack_b_loops`]):
/// the pairs past `whole8` of the blocked columns, every pair of the columns past `cols8`, the
/// pairs past `whole` (the last one half past `k` when it is odd, its high half zero; those
/// wholly past it zero), and zeros past column `cols`. `(p0, kc2, whole)`: the first pair, the
/// pairs packed and those wholly inside `k`; `(j0, cols)`: the panel's first column and its
/// columns inside `n`.
#[inline(always)]
fn pack_b_edges<const W: usize>(
    (b, k): (MatView<'_, bf16>, usize),
    (p0, kc2, whole): (usize, usize, usize),
    (j0, cols): (usize, usize),
    (whole8, cols8): (usize, usize),
    out: &mut [u32],
) {
    let at = |kk: usize, j: usize| padded(b, kk, j, kk < k);
    for c in 0..cols {
        let first = if c < cols8 { whole8 } else { 0 };
        let base = b.offset + (j0 + c) * b.cs + 2 * p0;
        for p in first..whole {
            out[p * W + c] = pair(b.data[base + 2 * p], b.data[base + 2 * p + 1]);
        }
    }
    for p in 0..kc2 {
        let row = &mut out[p * W..(p + 1) * W];
        if p >= whole {
            let kk = 2 * (p0 + p);
            for (c, slot) in row.iter_mut().enumerate().take(cols) {
                *slot = pair(at(kk, j0 + c), at(kk + 1, j0 + c));
            }
        }
        row[cols..].fill(0);
    }
}

/// Whether no product, sum or accumulator of `c (+)= a·b` (`c` given when accumulating) can be
/// subnormal, so that the definition's flushes change nothing: no operand is subnormal, and
/// every value is a multiple of a power of two at least 2⁻¹²⁶, the least normal magnitude.
/// A bf16 of biased exponent `e` is a multiple of 2^(e − 134), so every product is a multiple of
/// 2^(ea + eb − 268) (`ea`, `eb` the least exponents of `a`'s and `b`'s normal values); an f32
/// accumulator of exponent `e` is a multiple of 2^(e − 150). Sums of multiples of a power of two
/// are multiples of it, and so is their rounding to f32 (the representable numbers near a
/// multiple are multiples of it, or the multiple itself): a nonzero result is never below that
/// power, and never subnormal where it is at least 2⁻¹²⁶ — `ea + eb ≥ 142` and every nonzero
/// accumulator's exponent at least 24 (magnitudes above about 2⁻¹⁰³: a network's values and
/// gradients).
fn normal_results(
    dims: Mnk,
    a: &MatView<'_, bf16>,
    b: &MatView<'_, bf16>,
    c: Option<&[f32]>,
) -> bool {
    let Mnk { m, k, n } = dims;
    // The least biased exponent of a view's normal values (255 when it has none), or None
    // when one is subnormal.
    let least = |v: &MatView<'_, bf16>, rows: usize, cols: usize| -> Option<u32> {
        let mut least = 0xff;
        for i in 0..rows {
            for j in 0..cols {
                let bits = u32::from(v.data[v.offset + i * v.rs + j * v.cs].to_bits());
                let e = (bits >> 7) & 0xff;
                if e == 0 && bits & 0x7f != 0 {
                    return None;
                }
                if e != 0 && e != 0xff {
                    least = least.min(e);
                }
            }
        }
        Some(least)
    };
    let (Some(ea), Some(eb)) = (least(a, m, k), least(b, k, n)) else {
        return false;
    };
    ea + eb >= 142
        && c.is_none_or(|c| {
            c[..m * n].iter().all(|&x| {
                let (e, frac) = ((x.to_bits() >> 23) & 0xff, x.to_bits() & 0x7f_ffff);
                if e == 0 {
                    frac == 0
                } else {
                    e >= 24
                }
            })
        })
}

/// Where a tile reads `a`'s pairs: a packed panel, or (`vdpbf16ps` only) straight from `MR`
/// rows of a matrix whose `k` is contiguous, `rs` elements apart, starting at the tile's first
/// pair.
#[derive(Clone, Copy)]
enum APanel<'a> {
    Packed(&'a [u32]),
    #[cfg_attr(any(not(target_arch = "x86_64"), miri), allow(dead_code))]
    Rows {
        a: &'a [bf16],
        rs: usize,
    },
}

/// Where a tile of the output lies: `rows × cols` (at most `MR × NR`) from `c[0]`, row stride
/// `ldc`.
struct Tile<'c> {
    c: &'c mut [f32],
    ldc: usize,
    rows: usize,
    cols: usize,
}

/// One tile: the accumulators from the output (or zeros, unless `load`), `kc2` pairs of
/// products, back to the output.
fn run_tile(
    (kernel, normal): (Bf16Kernel, bool),
    kc2: usize,
    ap: APanel<'_>,
    bp: &[u32],
    tile: Tile<'_>,
    load: bool,
) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if kernel == Bf16Kernel::Avx512Bf16 && tile.rows == MR && tile.cols == NR {
        // SAFETY: `gemm_bf16_on` runs this kernel only where `available` found AVX-512 F and
        // BF16; the tile is whole (checked by the kernel against the slice's length).
        unsafe { x86::tile_bf16(kc2, ap, bp, tile.c, tile.ldc, load) };
        return;
    }
    // (Only the x86 kernels read `normal`.)
    let _ = normal;
    let mut acc = [[0f32; NR]; MR];
    if load {
        for (r, row) in acc.iter_mut().enumerate().take(tile.rows) {
            row[..tile.cols].copy_from_slice(&tile.c[r * tile.ldc..][..tile.cols]);
        }
    }
    let packed = |ap: &[u32], acc: &mut [[f32; NR]; MR]| match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: only where `available` found AVX-512 F and FMA.
        Bf16Kernel::Avx512 if normal => unsafe { x86::tile_avx512_normal(kc2, ap, bp, acc) },
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: only where `available` found AVX-512 F and FMA.
        Bf16Kernel::Avx512 => unsafe { x86::tile_avx512(kc2, ap, bp, acc) },
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: only where `available` found AVX2 and FMA.
        Bf16Kernel::Avx2 if normal => unsafe { x86::tile_avx2_normal(kc2, ap, bp, acc) },
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: only where `available` found AVX2 and FMA.
        Bf16Kernel::Avx2 => unsafe { x86::tile_avx2(kc2, ap, bp, acc) },
        _ => tile_portable(kc2, ap, bp, acc),
    };
    match (kernel, ap) {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: as above; a partial tile goes through a whole one on the stack.
        (Bf16Kernel::Avx512Bf16, ap) => unsafe {
            x86::tile_bf16(kc2, ap, bp, acc.as_flattened_mut(), NR, true)
        },
        (_, APanel::Packed(ap)) => packed(ap, &mut acc),
        (_, APanel::Rows { a, rs }) => {
            // The other kernels read packed panels (`single_thread` reads in place only for
            // `vdpbf16ps`): rows read in place are packed here.
            let mut local = [0u32; MR * KC2];
            for (p, o) in local[..kc2 * MR].chunks_exact_mut(MR).enumerate() {
                for (r, slot) in o.iter_mut().enumerate() {
                    *slot = pair(a[r * rs + 2 * p], a[r * rs + 2 * p + 1]);
                }
            }
            packed(&local[..kc2 * MR], &mut acc)
        }
    }
    for (r, row) in acc.iter().enumerate().take(tile.rows) {
        tile.c[r * tile.ldc..][..tile.cols].copy_from_slice(&row[..tile.cols]);
    }
}

/// The definition, one tile: for each pair of `k`, every accumulator takes its odd and then its
/// even product.
#[inline(always)]
fn tile_portable(kc2: usize, ap: &[u32], bp: &[u32], acc: &mut [[f32; NR]; MR]) {
    for row in acc.iter_mut() {
        for v in row.iter_mut() {
            *v = flush(*v);
        }
    }
    for (a, b) in ap.chunks_exact(MR).zip(bp.chunks_exact(NR)).take(kc2) {
        let mut bo = [0f32; NR];
        let mut be = [0f32; NR];
        for c in 0..NR {
            bo[c] = odd(b[c]);
            be[c] = even(b[c]);
        }
        for (row, &ar) in acc.iter_mut().zip(a) {
            let (ao, ae) = (odd(ar), even(ar));
            for c in 0..NR {
                let t = flush(ao.mul_add(bo[c], row[c]));
                row[c] = flush(ae.mul_add(be[c], t));
            }
        }
    }
}

/// [`tile_portable`] without its flushes: the same bits where no operand, product, sum or
/// accumulator is subnormal (`normal_results`).
#[cfg_attr(any(not(target_arch = "x86_64"), miri), allow(dead_code))]
#[inline(always)]
fn tile_unflushed(kc2: usize, ap: &[u32], bp: &[u32], acc: &mut [[f32; NR]; MR]) {
    for (a, b) in ap.chunks_exact(MR).zip(bp.chunks_exact(NR)).take(kc2) {
        let mut bo = [0f32; NR];
        let mut be = [0f32; NR];
        for c in 0..NR {
            bo[c] = f32::from_bits(b[c] & 0xffff_0000);
            be[c] = f32::from_bits(b[c] << 16);
        }
        for (row, &ar) in acc.iter_mut().zip(a) {
            let (ao, ae) = (f32::from_bits(ar & 0xffff_0000), f32::from_bits(ar << 16));
            for c in 0..NR {
                row[c] = ae.mul_add(be[c], ao.mul_add(bo[c], row[c]));
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::*;

    use super::{tile_portable, tile_unflushed, APanel, MR, NR};

    /// The portable tile compiled with AVX-512 (its `mul_add`s become `vfmadd`).
    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn tile_avx512(kc2: usize, ap: &[u32], bp: &[u32], acc: &mut [[f32; NR]; MR]) {
        tile_portable(kc2, ap, bp, acc)
    }

    /// [`tile_unflushed`] compiled with AVX-512, where no value can be subnormal
    /// (`super::normal_results`): its `MR × NR` accumulators fit AVX-512's 32 registers.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn tile_avx512_normal(
        kc2: usize,
        ap: &[u32],
        bp: &[u32],
        acc: &mut [[f32; NR]; MR],
    ) {
        tile_unflushed(kc2, ap, bp, acc)
    }

    /// The portable tile compiled with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tile_avx2(kc2: usize, ap: &[u32], bp: &[u32], acc: &mut [[f32; NR]; MR]) {
        tile_portable(kc2, ap, bp, acc)
    }

    /// [`tile_portable`] without its flushes, for products whose values cannot be subnormal
    /// (`super::normal_results`): the same fused multiply-adds in the same order (each pair's
    /// odd product, then its even), with the accumulators in registers — sixteen columns of
    /// four rows, then of the last two, at a time — where the portable tile's `MR × NR` do
    /// not fit AVX2's sixteen registers and went through memory at every step.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tile_avx2_normal(kc2: usize, ap: &[u32], bp: &[u32], acc: &mut [[f32; NR]; MR]) {
        assert!(ap.len() >= kc2 * MR && bp.len() >= kc2 * NR);
        for strip in 0..NR / 16 {
            strip_rows::<4>(kc2, ap, bp, acc, 0, strip);
            strip_rows::<2>(kc2, ap, bp, acc, 4, strip);
        }
    }

    /// Rows `r0..r0 + R` of [`tile_avx2_normal`]'s columns `16·strip..16·strip + 16`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn strip_rows<const R: usize>(
        kc2: usize,
        ap: &[u32],
        bp: &[u32],
        acc: &mut [[f32; NR]; MR],
        r0: usize,
        strip: usize,
    ) {
        assert!(r0 + R <= MR && ap.len() >= kc2 * MR && bp.len() >= kc2 * NR);
        let c0 = 16 * strip;
        // SAFETY: (AVX2 and FMA: this function's target features.) Row r0 + r's floats
        // c0..c0 + 16 lie in `acc` (r0 + R ≤ MR, and c0 + 16 ≤ NR for strip < NR / 16, the
        // caller's range); pair p's entries c0..c0 + 16 of `b` at p·NR + c0.. and its MR pairs
        // of `a` at p·MR.. lie in the panels (p < kc2; the assertion).
        unsafe {
            let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
            let mut x = [[_mm256_setzero_ps(); 2]; R];
            for (r, row) in x.iter_mut().enumerate() {
                for (v, reg) in row.iter_mut().enumerate() {
                    *reg = _mm256_loadu_ps(acc[r0 + r][c0 + 8 * v..].as_ptr());
                }
            }
            for p in 0..kc2 {
                let b = bp.as_ptr().add(p * NR + c0);
                let bw = [
                    _mm256_loadu_si256(b.cast()),
                    _mm256_loadu_si256(b.add(8).cast()),
                ];
                let odd = bw.map(|w| _mm256_castsi256_ps(_mm256_and_si256(w, high)));
                let even = bw.map(|w| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w)));
                for (r, row) in x.iter_mut().enumerate() {
                    let pair = *ap.get_unchecked(p * MR + r0 + r);
                    let ao = _mm256_set1_ps(f32::from_bits(pair & 0xffff_0000));
                    let ae = _mm256_set1_ps(f32::from_bits(pair << 16));
                    for (v, reg) in row.iter_mut().enumerate() {
                        *reg = _mm256_fmadd_ps(ao, odd[v], *reg);
                        *reg = _mm256_fmadd_ps(ae, even[v], *reg);
                    }
                }
            }
            for (r, row) in x.iter().enumerate() {
                for (v, &reg) in row.iter().enumerate() {
                    _mm256_storeu_ps(acc[r0 + r][c0 + 8 * v..].as_mut_ptr(), reg);
                }
            }
        }
    }

    /// `MR × NR` accumulators in 24 registers, one `vdpbf16ps` each per pair of `k`: `b`'s
    /// `NR / 16` registers of 16 columns loaded once, `a`'s pair broadcast once per row (six
    /// rows of four registers: half the broadcasts per product of twelve rows of two, measured
    /// 5–10% faster). The tile is rows
    /// `0..MR` of `c` (row stride `ldc`), columns `0..NR`; the accumulators start from it when
    /// `load`, else from zeros.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn tile_bf16(
        kc2: usize,
        ap: APanel<'_>,
        bp: &[u32],
        c: &mut [f32],
        ldc: usize,
        load: bool,
    ) {
        // `a`'s pair p of row r is the (unaligned) u32 at byte r·row + p·step from `a0`.
        let (a0, row, step) = match ap {
            APanel::Packed(ap) => {
                assert!(ap.len() >= kc2 * MR);
                (ap.as_ptr().cast::<u8>(), 4, 4 * MR)
            }
            APanel::Rows { a, rs } => {
                assert!(a.len() >= (MR - 1) * rs + 2 * kc2);
                (a.as_ptr().cast::<u8>(), 2 * rs, 4)
            }
        };
        assert!(bp.len() >= kc2 * NR);
        assert!(ldc >= NR && c.len() >= (MR - 1) * ldc + NR);
        const NV: usize = NR / 16;
        // How far ahead (in entries of `b`) its lines are asked for: sixteen pairs of `k`.
        const PREFETCH: usize = 16 * NR;
        let out = c.as_mut_ptr();
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if load {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    // SAFETY: row r's NR floats lie at r·ldc.. within `c` (the assertion above).
                    *x = unsafe { _mm512_loadu_ps(out.add(r * ldc + 16 * v)) };
                }
            }
        }
        let rows: [usize; MR] = std::array::from_fn(|r| r * row);
        let (mut a, mut b) = (a0, bp.as_ptr());
        for _ in 0..kc2 {
            // SAFETY: the assertions: pair p's NR entries of `b` start at p·NR, p < kc2, within
            // the panel; `a`'s MR pairs of pair p (packed side by side, or one per row of a
            // strided matrix) lie within its slice; every load is unaligned.
            unsafe {
                for v in 0..NV {
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH + 16 * v).cast());
                }
                let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                    std::mem::transmute(_mm512_loadu_si512(b.add(16 * v).cast()))
                });
                for (r, acc_row) in acc.iter_mut().enumerate() {
                    let two = a.add(rows[r]).cast::<u32>().read_unaligned();
                    let ar: __m512bh = std::mem::transmute(_mm512_set1_epi32(two as i32));
                    for (x, &bw) in acc_row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, ar, bw);
                    }
                }
                a = a.add(step);
                b = b.add(NR);
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(out.add(r * ldc + 16 * v), x) };
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every window of a packing buffer starts on a 64-byte line and has the length asked for,
    /// as the buffer grows, shrinks and grows again (each growth may move it).
    #[test]
    fn packing_windows_start_on_cache_lines() {
        let mut buf = PackBuf::default();
        let large = if cfg!(miri) { 4000 } else { 1 << 20 };
        for len in [1, 15, 16, 17, 1000, 3, 70_000 % large, 64, large, 5] {
            let w = buf.window(len);
            assert_eq!(w.len(), len);
            assert_eq!(
                w.as_ptr() as usize % 64,
                0,
                "a window of {len} off its line"
            );
            w.fill(7);
        }
    }

    /// `n` pseudo-random bf16 in [−2, 2).
    pub(crate) fn bits(seed: u64, n: usize) -> Vec<bf16> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                to_bf16(((s >> 33) as f64 / (1u64 << 31) as f64 * 4.0 - 2.0) as f32)
            })
            .collect()
    }

    /// The definition, element by element, straight from the operands.
    fn reference(dims: Mnk, a: &[bf16], b: &[bf16], c0: Option<&[f32]>) -> Vec<f32> {
        let Mnk { m, k, n } = dims;
        let zero = bf16::from_bits(0);
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = c0.map_or(0.0, |c| c[i * n + j]);
                for p in 0..k.div_ceil(2) {
                    let get = |x: &[bf16], idx: Option<usize>| idx.map_or(zero, |q| x[q]);
                    let (k0, k1) = (2 * p, 2 * p + 1);
                    let a2 = pair(a[i * k + k0], get(a, (k1 < k).then(|| i * k + k1)));
                    let b2 = pair(b[k0 * n + j], get(b, (k1 < k).then(|| k1 * n + j)));
                    acc = dot_pair(acc, a2, b2);
                }
                out[i * n + j] = acc;
            }
        }
        out
    }

    pub(super) fn same_bits(x: &[f32], y: &[f32]) -> bool {
        x.len() == y.len()
            && x.iter()
                .zip(y)
                .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
    }

    const KERNELS: [Bf16Kernel; 4] = [
        Bf16Kernel::Avx512Bf16,
        Bf16Kernel::Avx512,
        Bf16Kernel::Avx2,
        Bf16Kernel::Portable,
    ];

    /// Every kernel, at several shapes (edges of tiles and blocks, odd `k`), one and two
    /// threads, with and without accumulation, gives the definition's bits. (Miri interprets
    /// two small shapes through the portable kernel.)
    #[test]
    fn every_kernel_gives_the_definitions_bits() {
        // Whole and partial tiles, odd `k`, several blocks of `k` (401, 515 > 2·192), and last
        // a product large enough to split across threads.
        let shapes: &[(usize, usize, usize)] = if cfg!(miri) {
            &[(5, 7, 3), (7, 5, 65)]
        } else {
            &[
                (1, 1, 1),
                (5, 7, 3),
                (13, 33, 40),
                (25, 515, 65),
                (6, 2, 64),
                (7, 401, 129),
                (130, 129, 131),
                // Even `k` over two blocks (read in place by `vdpbf16ps`, with a partial last
                // panel of rows), and wider than tall (split by columns over threads).
                (20, 2 * KC2 + 20, 70),
                (20, 2000, 200),
            ]
        };
        for &(m, k, n) in shapes {
            let dims = Mnk::new(m, k, n);
            let a = bits(1 + m as u64, m * k);
            let b = bits(7 + n as u64, k * n);
            let c0: Vec<f32> = bits(11, m * n).iter().map(|&x| from_bf16(x)).collect();
            for accumulate in [false, true] {
                let want = reference(dims, &a, &b, accumulate.then_some(&c0[..]));
                for kernel in KERNELS.into_iter().filter(|k| k.available()) {
                    for threads in [1, 2] {
                        let mut c = c0.clone();
                        let av = MatView::row_major(&a, 0, k, false);
                        let bv = MatView::row_major(&b, 0, n, false);
                        gemm_bf16_on(kernel, dims, av, bv, &mut c, accumulate, threads);
                        assert!(
                            same_bits(&c, &want),
                            "{kernel:?} {m}×{k}×{n} threads {threads} accumulate {accumulate}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX-512 and AVX2 tiles leave out their flushes only where no value can be subnormal: operands
    /// scaled down until products and sums fall below 2⁻¹²⁶ take the flushing tile, and both
    /// give the definition's bits (which flush those values to zeros).
    #[test]
    #[cfg_attr(miri, ignore)] // Miri runs the portable kernel alone, which always flushes
    fn tiny_values_keep_the_flushes() {
        let (m, k, n) = (13, 40, 70);
        let dims = Mnk::new(m, k, n);
        let scale = |v: Vec<bf16>, s: f32| -> Vec<bf16> {
            v.into_iter().map(|x| to_bf16(from_bf16(x) * s)).collect()
        };
        let (a, b) = (bits(3, m * k), bits(5, k * n));
        fn view(x: &[bf16], cols: usize) -> MatView<'_, bf16> {
            MatView::row_major(x, 0, cols, false)
        }
        assert!(normal_results(dims, &view(&a, k), &view(&b, n), None));
        let c0 = vec![1e-35f32; m * n];
        assert!(!normal_results(dims, &view(&a, k), &view(&b, n), Some(&c0)));
        let (ta, tb) = (scale(a, 2f32.powi(-60)), scale(b, 2f32.powi(-60)));
        assert!(!normal_results(dims, &view(&ta, k), &view(&tb, n), None));
        let want = reference(dims, &ta, &tb, None);
        assert!(want.contains(&0.0), "the definition flushes some of these");
        for kernel in [Bf16Kernel::Avx512, Bf16Kernel::Avx2, Bf16Kernel::Portable] {
            if kernel.available() {
                let mut c = vec![0f32; m * n];
                gemm_bf16_on(kernel, dims, view(&ta, k), view(&tb, n), &mut c, false, 1);
                assert!(same_bits(&c, &want), "{kernel:?}");
            }
        }
    }

    /// A few rows against `b` read where it lies (row-major and transposed, inside wider
    /// matrices): the definition's bits at the edges of its blocks of columns and pairs, with
    /// odd `k`, on one to three threads, accumulating onto values that include −0, denormals
    /// and infinities, with operands sprinkled with denormals, infinities and NaN.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_few_rows_against_b_where_it_lies_give_the_definitions_bits() {
        let kernel = Bf16Kernel::Avx512Bf16;
        if !kernel.available() {
            crate::testing::skip("no AVX-512 BF16 here (the few-rows path is that kernel's)");
            return;
        }
        let specials = [
            bf16::from_bits(1),
            bf16::from_bits(0x8003),
            bf16::INFINITY,
            bf16::NAN,
            bf16::from_bits(0x8000),
        ];
        let sprinkle = |mut v: Vec<bf16>, every: usize| {
            for (q, x) in v.iter_mut().enumerate().skip(3).step_by(every) {
                *x = specials[q % specials.len()];
            }
            v
        };
        let shapes = [
            (1, 1, 1),
            (1, 2, 17),
            (2, 3, 31),
            (3, 33, 33),
            (4, 34, 16),
            (1, 31, 64),
            (2, 64, 100),
            (1, 768, 2304),
            (4, 129, 70),
            (1, 1000, 333),
        ];
        for (m, k, n) in shapes {
            let dims = Mnk::new(m, k, n);
            // Inside wider matrices: row strides past their widths, offsets.
            let (lda, ldb, ldbt) = (k + 3, n + 5, k + 7);
            let a_wide = sprinkle(bits(31 + k as u64, 2 + m * lda), 97);
            let b_wide = sprinkle(bits(32 + n as u64, 1 + k * ldb), 89);
            let a: Vec<bf16> = (0..m * k)
                .map(|q| a_wide[2 + (q / k) * lda + q % k])
                .collect();
            let b: Vec<bf16> = (0..k * n)
                .map(|q| b_wide[1 + (q / n) * ldb + q % n])
                .collect();
            // The same b stored transposed (column j's k values from 4 + j·ldbt).
            let mut bt_wide = vec![bf16::from_bits(0x7fc1); 4 + n * ldbt];
            for kk in 0..k {
                for j in 0..n {
                    bt_wide[4 + j * ldbt + kk] = b[kk * n + j];
                }
            }
            let c0: Vec<f32> = (0..m * n)
                .map(|q| match q % 7 {
                    0 => -0.0,
                    1 => f32::from_bits(0x8000_0005),
                    2 => f32::NEG_INFINITY,
                    _ => q as f32 * 0.375 - 5.0,
                })
                .collect();
            let av = MatView {
                data: &a_wide[..],
                offset: 2,
                rs: lda,
                cs: 1,
            };
            let layouts = [
                MatView {
                    data: &b_wide[..],
                    offset: 1,
                    rs: ldb,
                    cs: 1,
                },
                MatView {
                    data: &bt_wide[..],
                    offset: 4,
                    rs: 1,
                    cs: ldbt,
                },
            ];
            for accumulate in [false, true] {
                let want = reference(dims, &a, &b, accumulate.then_some(&c0[..]));
                for bv in layouts {
                    assert!(gemv::takes(kernel, dims, &av, &bv));
                    for threads in [1, 2, 3] {
                        let mut c = c0.clone();
                        gemm_bf16_on(kernel, dims, av, bv, &mut c, accumulate, threads);
                        assert!(
                            same_bits(&c, &want),
                            "{m}×{k}×{n}, b strides ({}, {}), threads {threads}, \
                             accumulate {accumulate}",
                            bv.rs,
                            bv.cs
                        );
                    }
                }
            }
        }
    }

    /// An `a` that is a block inside a wider matrix (row stride past `k`, an offset) gives the
    /// bits of the same block copied out: the in-place panels read each row where it lies.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn a_block_of_a_wider_matrix_gives_the_same_bits() {
        let (m, k, n, ld, at) = (13, 2 * KC2 + 8, 66, 2 * KC2 + 30, 3 * (2 * KC2 + 30) + 5);
        let wide = bits(21, at + m * ld);
        let a: Vec<bf16> = (0..m * k)
            .map(|q| wide[at + (q / k) * ld + q % k])
            .collect();
        let b = bits(22, k * n);
        let want = reference(Mnk::new(m, k, n), &a, &b, None);
        for kernel in KERNELS.into_iter().filter(|k| k.available()) {
            let mut c = vec![0f32; m * n];
            let av = MatView {
                data: &wide[..],
                offset: at,
                rs: ld,
                cs: 1,
            };
            let bv = MatView::row_major(&b, 0, n, false);
            gemm_bf16_on(kernel, Mnk::new(m, k, n), av, bv, &mut c, false, 2);
            assert!(same_bits(&c, &want), "{kernel:?}");
        }
    }

    /// Transposed operands (swapped strides) give the bits of the same product laid out plainly.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn transposed_operands_give_the_same_bits() {
        // Odd k inside one block of pairs, and k over two blocks with a partial last panel.
        for (m, k, n) in [(14, 37, 35), (9, 2 * KC2 + 53, 70)] {
            let a = bits(3, m * k);
            let b = bits(4, k * n);
            let at: Vec<bf16> = (0..k * m).map(|q| a[(q % m) * k + q / m]).collect();
            let bt: Vec<bf16> = (0..n * k).map(|q| b[(q % k) * n + q / k]).collect();
            let want = reference(Mnk::new(m, k, n), &a, &b, None);
            let mut c = vec![0f32; m * n];
            let av = MatView::row_major(&at, 0, m, true);
            let bv = MatView::row_major(&bt, 0, k, true);
            gemm_bf16(Mnk::new(m, k, n), av, bv, &mut c, false, 2);
            assert!(same_bits(&c, &want), "{m}×{k}×{n}");
        }
        // A transposed `a` of more than one block of rows (MC) and of `k` (KC2 pairs), read as
        // a block of a wider matrix, on every kernel and one and two threads: its whole panels
        // pack together across the block, the partial last one alone.
        let (m, k, n, wider) = (MC + 2 * MR + 5, 2 * KC2 + 6, NR + 6, 9);
        let a = bits(7, m * k);
        let b = bits(8, k * n);
        let lda = m + wider;
        let at: Vec<bf16> = (0..k * lda)
            .map(|q| {
                let (kk, i) = (q / lda, q % lda);
                match i.checked_sub(wider) {
                    Some(i) => a[i * k + kk],
                    None => bf16::from_f32(f32::NAN),
                }
            })
            .collect();
        let want = reference(Mnk::new(m, k, n), &a, &b, None);
        for kernel in KERNELS.into_iter().filter(|k| k.available()) {
            for threads in [1, 2] {
                let mut c = vec![0f32; m * n];
                let av = MatView {
                    data: &at,
                    offset: wider,
                    rs: 1,
                    cs: lda,
                };
                let bv = MatView::row_major(&b, 0, n, false);
                gemm_bf16_on(kernel, Mnk::new(m, k, n), av, bv, &mut c, false, threads);
                assert!(same_bits(&c, &want), "{kernel:?} threads {threads}");
            }
        }
        // Products computed as (bᵀ·aᵀ)ᵀ: a narrow b, and a transposed b wider than a is tall;
        // accumulating onto c too.
        for (m, k, n, b_transposed) in [(40, 45, 9, false), (8, 2 * KC2 + 11, 70, true)] {
            assert!(swaps(
                Mnk::new(m, k, n),
                &MatView::row_major(&[], 0, k, false),
                &MatView::row_major(&[], 0, if b_transposed { k } else { n }, b_transposed),
            ));
            let a = bits(5, m * k);
            let b = bits(6, k * n);
            let bt: Vec<bf16> = (0..n * k).map(|q| b[(q % k) * n + q / k]).collect();
            let start: Vec<f32> = (0..m * n).map(|q| q as f32 * 0.25 - 3.0).collect();
            let want = reference(Mnk::new(m, k, n), &a, &b, Some(&start));
            let mut c = start.clone();
            let bv = if b_transposed {
                MatView::row_major(&bt, 0, k, true)
            } else {
                MatView::row_major(&b, 0, n, false)
            };
            let av = MatView::row_major(&a, 0, k, false);
            gemm_bf16(Mnk::new(m, k, n), av, bv, &mut c, true, 2);
            assert!(same_bits(&c, &want), "{m}×{k}×{n}, swapped");
        }
    }

    /// The definition's edges on the hardware instruction itself, where the CPU has it: the
    /// order of the two products, rounding to nearest even after each, denormal accumulators,
    /// products and operands, infinities and NaN — against `dot_pair`, and over many random
    /// pairs of every class of value.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn dot_pair_is_the_instruction() {
        if !Bf16Kernel::Avx512Bf16.available() {
            crate::testing::skip(
                "no AVX-512 BF16 here (the other kernels still meet the definition)",
            );
            return;
        }
        let b = |x: f32| to_bf16(x);
        let p = |lo: f32, hi: f32| pair(b(lo), b(hi));
        let tiny = f32::from_bits(1);
        #[rustfmt::skip]
        let mut cases: Vec<(f32, u32, u32)> = vec![
            (1.0, p(2f32.powi(-24), 2f32.powi(-24)), p(1.0, 1.0)),
            (1.0, p(-1.0, 2f32.powi(-25)), p(1.0, 1.0)),
            (tiny, p(0.0, 0.0), p(0.0, 0.0)),
            (-tiny, p(0.0, 0.0), p(0.0, 0.0)),
            (0.0, p(2f32.powi(-70), 0.0), p(2f32.powi(-70), 0.0)),
            (-0.0, p(-2f32.powi(-70), 0.0), p(2f32.powi(-70), 0.0)),
            (1.0, pair(bf16::from_bits(1), b(0.0)), p(2f32.powi(100), 0.0)),
            (f32::INFINITY, p(1.0, 1.0), p(-1.0, 1.0)),
            (0.0, p(f32::INFINITY, 0.0), p(0.0, 1.0)),
            (0.0, p(f32::NAN, 1.0), p(1.0, 1.0)),
            (-0.0, p(0.0, -0.0), p(1.0, 1.0)),
            (f32::MAX, p(2f32.powi(100), 1.0), p(2f32.powi(100), 1.0)),
        ];
        let mut s = 5u64;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s >> 16
        };
        // Random bits hit every class (denormals, infinities, NaN) often enough.
        for _ in 0..20_000 {
            let acc = f32::from_bits(next() as u32);
            cases.push((acc, next() as u32, next() as u32));
        }
        for chunk in cases.chunks(16) {
            let mut acc = [0f32; 16];
            let (mut a, mut bb) = ([0u32; 16], [0u32; 16]);
            for (q, &(c, x, y)) in chunk.iter().enumerate() {
                acc[q] = c;
                a[q] = x;
                bb[q] = y;
            }
            // SAFETY: the CPU has AVX-512 F and BF16 (checked above).
            let got = unsafe { hardware(acc, a, bb) };
            for (q, &(c, x, y)) in chunk.iter().enumerate() {
                let want = dot_pair(c, x, y);
                assert!(
                    got[q].to_bits() == want.to_bits() || (got[q].is_nan() && want.is_nan()),
                    "acc {c:e} ({:08x}), a {x:08x}, b {y:08x}: instruction {:e} ({:08x}), \
                     definition {want:e} ({:08x})",
                    c.to_bits(),
                    got[q],
                    got[q].to_bits(),
                    want.to_bits()
                );
            }
        }
    }

    #[cfg(all(target_arch = "x86_64", not(miri)))]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn hardware(acc: [f32; 16], a: [u32; 16], b: [u32; 16]) -> [f32; 16] {
        use std::arch::x86_64::*;
        let mut out = [0f32; 16];
        // SAFETY: 16-element arrays; unaligned loads and store.
        unsafe {
            let c = _mm512_loadu_ps(acc.as_ptr());
            let va: __m512bh = std::mem::transmute(_mm512_loadu_si512(a.as_ptr().cast()));
            let vb: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.as_ptr().cast()));
            _mm512_storeu_ps(out.as_mut_ptr(), _mm512_dpbf16_ps(c, va, vb));
        }
        out
    }

    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    unsafe fn hardware(_: [f32; 16], _: [u32; 16], _: [u32; 16]) -> [f32; 16] {
        unreachable!("checked by `available`")
    }

    /// The checks above can fail: the definition with its two products swapped differs from
    /// the instruction's order on the second edge case.
    #[test]
    fn the_order_of_the_two_products_matters() {
        let b = |x: f32| to_bf16(x);
        let (a, bb) = (pair(b(-1.0), b(2f32.powi(-25))), pair(b(1.0), b(1.0)));
        let swapped = {
            let t = flush(even(a).mul_add(even(bb), 1.0));
            flush(odd(a).mul_add(odd(bb), t))
        };
        assert_eq!(dot_pair(1.0, a, bb), 0.0);
        assert_ne!(swapped, 0.0);
    }

    /// Conversions: round to nearest even, ties to even, NaN stays NaN, widening is exact.
    #[test]
    fn conversions_round_to_nearest_even() {
        let src = [
            1.0f32,
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            f32::NAN,
            -0.0,
            f32::INFINITY,
            3.0e38,
            f32::from_bits(0x3f80_8001),
        ];
        let mut dst = vec![bf16::from_bits(0); src.len()];
        f32_to_bf16(&src, &mut dst);
        for (&s, &d) in src.iter().zip(&dst) {
            let want = bf16::from_f32(s);
            assert!(
                d.to_bits() == want.to_bits() || (d.is_nan() && want.is_nan()),
                "{s}"
            );
        }
        assert_eq!(from_bf16(dst[1]), 1.0); // a tie rounds to even
        assert_eq!(from_bf16(dst[2]), 1.0 + 2f32.powi(-6)); // a tie rounds to even, upward
        assert_eq!(from_bf16(dst[7]), 1.0 + 2f32.powi(-7)); // above the tie rounds up
        let mut back = vec![0f32; dst.len()];
        bf16_to_f32(&dst, &mut back);
        assert_eq!(back[0], 1.0);
        assert!(back[3].is_nan());
    }

    /// `to_bf16` is the `half` crate's conversion bit for bit (NaN payloads included), over
    /// bit patterns spread across every exponent and the neighbourhoods of the rounding ties.
    #[test]
    fn one_value_rounds_as_the_half_crate_does() {
        let step = if cfg!(miri) { 0x00f0_0001 } else { 0x0000_1001 };
        let spread = (0..=u32::MAX).step_by(step);
        let ties = (0..256u32).flat_map(|e| {
            let base = e << 23 | 0x0001_8000;
            [
                base - 1,
                base,
                base + 1,
                base | 0x8000_0000,
                base ^ 0x0001_0000,
            ]
        });
        for bits in spread.chain(ties) {
            let x = f32::from_bits(bits);
            assert_eq!(
                to_bf16(x).to_bits(),
                bf16::from_f32(x).to_bits(),
                "{bits:#010x}"
            );
        }
    }
}
