//! The bf16 product on AMX's tile unit (`tdpbf16ps`), where the CPU has it and the process asks
//! for it ([`super::set_amx`], or `ARENAGRAD_BF16=amx`).
//!
//! # Its own bits
//!
//! `tdpbf16ps` does not compute the module's definition, and nothing else computes what it does.
//! Measured on an Intel Xeon of the Emerald Rapids generation against the Intel SDM's
//! pseudo-code: with one pair of `k` per output, the instruction gives
//! `round(acc + round(a₀b₀ + a₁b₁))` — the pair's sum rounded once, then added (not two fused
//! multiply-adds, as `vdpbf16ps`); with more pairs in one instruction, no sequence of
//! round-to-nearest additions in any order reproduces it (the unit sums the products of an
//! instruction in its own wider format). Its rounding errors are of the definition's size (a few
//! units in the last place of the running sum per instruction: the tests' bound), but its bits
//! are not the definition's, so this kernel is not the default: a process that wants the
//! throughput asks for it. PyTorch's bf16 `mm` runs on AMX through oneDNN, and its bits change
//! with it too: `scripts/torch_amx_bits.py` found 26 of 65,536 bf16 outputs of a 256 × 4096 × 256
//! product different between oneDNN on AMX and oneDNN capped at AVX-512 BF16.
//!
//! What holds: each output's `k` is taken 32 at a time from its start (16 pairs per
//! instruction, the accumulator carried in the output between blocks of `k`, `k` padded with
//! zeros), whatever the thread count or the blocking, so the bits depend only on the operands
//! and the shapes — the same on every thread count and every run on AMX.
//!
//! # The kernel
//!
//! Eight tile registers of 16 rows × 64 bytes: a 32 × 32 block of f32 accumulators in four, two
//! tiles of `a` (16 rows × 16 pairs each) and two of `b` (16 pairs × 16 columns, the pairs
//! interleaved as the other kernels pack them, in panels of 16 columns). Both are packed so
//! that each tile's kilobyte is contiguous and starts on a cache line: `a` in tiles, `b` in
//! panels one tile wide. A tile whose rows straddle lines, or lie 2ⁿ bytes apart, loads at a
//! fraction of the rate. Where `a`'s `k` is contiguous and its rows are not a multiple of 2 KiB
//! apart, whole blocks of its rows are read where they lie instead ([`ARows`]): a tile row is
//! 16 adjacent pairs.
//!
//! The order: each block of 32 rows of `a` (256 pairs of `k`, 32 KiB) stays in the level-1
//! cache while all of `b`'s columns stream past it from the level-2 cache. At 1024³ on one
//! Emerald Rapids core, that and the aligned, contiguous tiles took the product from 480 to 808
//! GFLOP/s (medians of five alternating runs of `bench_core --only bf16`): loads of tile rows
//! that straddle two lines ran at about half the rate.

use std::arch::asm;
use std::sync::OnceLock;

use half::bf16;

use super::super::matmul::{product_output, MatView, Mnk};
use super::{pack_b_panels, padded, pair, with_packs, PackBuf, Start};

/// Rows and columns of a block of accumulators (two tiles by two).
const BLOCK: usize = 32;
/// Pairs of `k` per instruction.
const STEP: usize = 16;
/// Rows of `a` packed at a time.
const MC: usize = 8 * BLOCK;
/// Pairs of `k` packed at a time (a multiple of [`STEP`]): a block of 32 rows of `a` is then
/// 32 KiB, in the level-1 cache while `b` streams past. Of 192, 256 and 512, the best at 1024³
/// on one Emerald Rapids core (512 keeps the accumulators in their tiles over more of `k`, but
/// its 64 KiB blocks of `a` do not stay in the cache).
pub(super) const KC2: usize = 256;

/// Whether the CPU has AMX-TILE and AMX-BF16 and the kernel lets this process use the tile
/// registers (Linux asks each process to request them: `arch_prctl(ARCH_REQ_XCOMP_PERM)`).
/// Asked once; false elsewhere.
pub(super) fn available() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        // SAFETY: CPUID leaf 7 exists on every x86-64 CPU that reports AVX-512 (checked first);
        // the system call only asks the kernel for a permission and touches no memory.
        std::arch::is_x86_feature_detected!("avx512f")
            && unsafe {
                let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
                let (tile, bf16) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 22 & 1 == 1);
                tile && bf16 && request_tiles()
            }
    })
}

/// Asks Linux for the tile registers' state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`); true when granted.
///
/// # Safety
/// Only on x86-64 Linux (the system call's number and arguments are that ABI's).
#[cfg(target_os = "linux")]
unsafe fn request_tiles() -> bool {
    const SYS_ARCH_PRCTL: isize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: the caller's; `syscall` clobbers rcx and r11 and returns in rax.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
unsafe fn request_tiles() -> bool {
    false
}

/// The tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

static CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// The tile registers configured for [`tiles`] on this thread (eight tiles of 16 rows × 64
/// bytes) while one lives; released when the outermost drops. Not `Send`: the tile state is
/// the thread's.
struct Configured(std::marker::PhantomData<*const ()>);

thread_local! {
    /// How many [`Configured`] live on this thread.
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Configured {
    fn new() -> Configured {
        assert!(
            available(),
            "the AMX kernel runs only where the tiles are granted"
        );
        if DEPTH.get() == 0 {
            // SAFETY: the tiles are granted (the assertion); the configuration is a 64-byte
            // aligned static. Only this module's `tiles` reads the tile state; compiled code
            // never touches it.
            unsafe {
                asm!("ldtilecfg [{cfg}]", cfg = in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
            }
        }
        DEPTH.set(DEPTH.get() + 1);
        Configured(std::marker::PhantomData)
    }
}

impl Drop for Configured {
    fn drop(&mut self) {
        DEPTH.set(DEPTH.get() - 1);
        if DEPTH.get() == 0 {
            // SAFETY: the tiles were configured by the outermost `new`; releasing them returns
            // their state to the initial (empty) one.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }
}

/// `u32`s in a tile: 16 rows of 16 pairs (64 bytes).
const TILE: usize = 16 * STEP;

/// Where pair `p` of packed row `r` lies: blocks of 32 rows (`32·kp` pairs each), each a run of
/// steps; a step is its two tiles (rows 0–15, then 16–31), each 16 rows of the step's 16 pairs
/// — a tile's kilobyte contiguous, so that its rows do not share the cache's sets as rows of a
/// matrix 2ⁿ bytes apart do.
#[inline(always)]
fn slot(r: usize, p: usize, kp: usize) -> usize {
    (r / BLOCK) * BLOCK * kp
        + (p / STEP) * 2 * TILE
        + (r % BLOCK / 16) * TILE
        + (r % 16) * STEP
        + p % STEP
}

/// 32 rows of `a` as [`tiles`] reads them: the first tile row's first byte and how many bytes
/// follow it, the bytes from one tile row to the next, and from one step's 16 pairs to the
/// next's.
#[derive(Clone, Copy)]
struct ARows<'s> {
    at: std::marker::PhantomData<&'s [u8]>,
    ptr: *const u8,
    len: usize,
    ld: usize,
    step: usize,
}

impl<'s> ARows<'s> {
    /// Packed in tiles ([`slot`]): rows 64 bytes apart, a step's two tiles 2 KiB on.
    fn packed(ap: &'s [u32]) -> Self {
        ARows {
            at: std::marker::PhantomData,
            ptr: ap.as_ptr().cast(),
            len: std::mem::size_of_val(ap),
            ld: 64,
            step: 2 * TILE * 4,
        }
    }

    /// Where they lie: the rows from `i`, pairs from `p0`, of an `a` whose `k` is contiguous
    /// (pairs are then adjacent values, as a tile row takes them).
    fn in_place(a: MatView<'s, bf16>, i: usize, p0: usize) -> Self {
        let from = &a.data[a.offset + i * a.rs + 2 * p0..];
        ARows {
            at: std::marker::PhantomData,
            ptr: from.as_ptr().cast(),
            len: std::mem::size_of_val(from),
            ld: 2 * a.rs,
            step: 4 * STEP,
        }
    }
}

/// Whether whole blocks of 32 rows of `a` can be read where they lie for pairs `p0..p0 + kp`:
/// `k` contiguous, every pair inside `k`, and rows not a multiple of 2 KiB apart (tile rows
/// that far apart fall in a few of the level-1 cache's sets and push one another out). Reading
/// in place saves packing `a`; the sums are the same.
fn lies_usable(a: &MatView<'_, bf16>, k: usize, (p0, kp): (usize, usize)) -> bool {
    a.cs == 1 && 2 * (p0 + kp) <= k && !(2 * a.rs).is_multiple_of(2048)
}

/// `a` rows `i0..i0 + mc`, pairs `p0..p0 + kp`, into `dst` in tiles ([`slot`]); rows past `mc` up
/// to a whole block and `k` past its end zeros.
fn pack_rows(
    a: MatView<'_, bf16>,
    k: usize,
    rows: (usize, usize),
    pairs: (usize, usize),
    dst: &mut [u32],
) {
    // Compiled for the widest vector unit: a tile row's 64 bytes move in one register.
    super::super::wide::wide(
        dst.len(),
        #[inline(always)]
        || pack_rows_loops(a, k, rows, pairs, dst),
    )
}

#[inline(always)]
fn pack_rows_loops(
    a: MatView<'_, bf16>,
    k: usize,
    (i0, mc): (usize, usize),
    (p0, kp): (usize, usize),
    dst: &mut [u32],
) {
    // Pairs wholly inside `k`.
    let whole = (2 * (p0 + kp)).min(k).saturating_sub(2 * p0) / 2;
    let rows = dst.len() / kp;
    if a.rs == 1 && a.cs != 1 {
        // Stored transposed (a weight gradient's `xᵀ`): blocks of 16 pairs by 16 rows, each
        // pair from two runs of contiguous values, turned in a buffer on the stack and written
        // as a tile's rows.
        for pb in (0..whole).step_by(STEP) {
            let pn = STEP.min(whole - pb);
            for rb in (0..mc).step_by(16) {
                let rn = 16.min(mc - rb);
                let mut turned = [[0u32; STEP]; 16];
                for (q, kk) in (0..pn).map(|q| (q, 2 * (p0 + pb + q))) {
                    let lo = &a.data[a.offset + kk * a.cs + i0 + rb..][..rn];
                    let hi = &a.data[a.offset + (kk + 1) * a.cs + i0 + rb..][..rn];
                    for (r, (&l, &h)) in lo.iter().zip(hi).enumerate() {
                        turned[r][q] = pair(l, h);
                    }
                }
                for (r, row) in turned.iter().enumerate().take(rn) {
                    dst[slot(rb + r, pb, kp)..][..pn].copy_from_slice(&row[..pn]);
                }
            }
        }
    }
    for r in 0..rows {
        if r >= mc {
            for pb in (0..kp).step_by(STEP) {
                dst[slot(r, pb, kp)..][..STEP].fill(0);
            }
            continue;
        }
        let i = i0 + r;
        if a.cs == 1 {
            let row = &a.data[a.offset + i * a.rs + 2 * p0..][..2 * whole];
            for (pb, run) in row.chunks(2 * STEP).enumerate() {
                let out = &mut dst[slot(r, pb * STEP, kp)..][..run.len() / 2];
                if let (Ok(out), Ok(run)) = (
                    <&mut [u32; STEP]>::try_from(&mut *out),
                    <&[bf16; 2 * STEP]>::try_from(run),
                ) {
                    // A whole tile row of fixed length: moved inline, not through a call to
                    // `memcpy` per 64 bytes (which took most of the packing's time).
                    for (q, o) in out.iter_mut().enumerate() {
                        *o = pair(run[2 * q], run[2 * q + 1]);
                    }
                    continue;
                }
                for (o, two) in out.iter_mut().zip(run.chunks_exact(2)) {
                    *o = pair(two[0], two[1]);
                }
            }
        } else if a.rs != 1 {
            for p in 0..whole {
                let kk = 2 * (p0 + p);
                dst[slot(r, p, kp)] = pair(padded(a, i, kk, true), padded(a, i, kk + 1, true));
            }
        }
        for p in whole..kp {
            let kk = 2 * (p0 + p);
            dst[slot(r, p, kp)] = pair(padded(a, i, kk, kk < k), padded(a, i, kk + 1, kk + 1 < k));
        }
    }
}

/// The product on this thread, as `super::single_thread` (`c`: m×n, row-major, the starting
/// accumulators when `accumulate`). Only where [`available`] holds.
pub(super) fn single_thread(
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    c: &mut [f32],
    accumulate: bool,
) {
    threaded(dims, a, b, c, accumulate, 1)
}

/// `b`'s columns `0..cols`, pairs `p0..p0 + kp`, into `dst` in panels of one tile's 16 columns
/// (`kp` rows of 16 pairs each); `dst`'s panels past them zeros.
fn pack_b_tiles(
    b: MatView<'_, bf16>,
    k: usize,
    (p0, kp): (usize, usize),
    cols: usize,
    dst: &mut [u32],
) {
    let (packed, spare) = dst.split_at_mut(cols.div_ceil(STEP) * kp * STEP);
    if cols > 0 {
        pack_b_panels::<STEP>(b, k, (p0, kp), cols, packed);
    }
    spare.fill(0);
}

thread_local! {
    /// The calling thread's buffer for `b` packed once and shared by [`threaded`]'s threads.
    static SHARED_B: std::cell::RefCell<PackBuf> = std::cell::RefCell::new(PackBuf::default());
}

/// The product over up to `threads` threads, as [`single_thread`] (`c`: m×n, row-major, the
/// starting accumulators when `accumulate`), with its bits. For each block of `k`, the threads
/// first pack `b`'s panels together into one buffer, each a share of the panels; then each
/// takes its own rows of `a` against all of them, a block of 32 rows at a time held in the
/// level-1 cache. So `b` is packed once rather than once per thread, `a` once, and every thread
/// writes its rows of `c` where they lie (a split by columns packs all of `a` in each thread
/// and copies each thread's columns back; a split by rows with a `b` of each thread's packs all
/// of `b` in each).
pub(super) fn threaded(
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
    let k2 = k.div_ceil(2);
    let panels = n.div_ceil(STEP).next_multiple_of(2);
    let t = threads.clamp(1, m.div_ceil(BLOCK));
    let rows_per = m.div_ceil(t).div_ceil(BLOCK) * BLOCK;
    let panels_per = panels.div_ceil(t);
    // Taken for the call (a nested call, were there one, would start a buffer of its own).
    let mut shared = SHARED_B.with(|s| s.take());
    let mut p0 = 0;
    while p0 < k2 {
        let kc2 = KC2.min(k2 - p0);
        let kp = kc2.div_ceil(STEP) * STEP;
        let pb = shared.window(kp * STEP * panels);
        let parts: Vec<&mut [u32]> = pb.chunks_mut(panels_per * kp * STEP).collect();
        super::super::thread_pool::for_each_part(parts, |q, dst| {
            // This thread's panels: columns from j0, zeros past `n`.
            let j0 = q * panels_per * STEP;
            let cols = n.saturating_sub(j0).min(dst.len() / kp);
            let b = MatView {
                offset: b.offset + j0 * b.cs,
                ..b
            };
            pack_b_tiles(b, k, (p0, kp), cols, dst);
        });
        let pb = &*pb;
        let load = accumulate || p0 > 0;
        let parts: Vec<&mut [f32]> = c.chunks_mut(rows_per * n).collect();
        super::super::thread_pool::for_each_part(parts, |q, part| {
            let r0 = q * rows_per;
            let rows_here = part.len() / n;
            let tiles = Configured::new();
            let lie = lies_usable(&a, k, (p0, kp));
            with_packs(|pa_buf, _| {
                let mut i0 = 0;
                while i0 < rows_here {
                    let mc = MC.min(rows_here - i0);
                    // Whole blocks of 32 rows read where they lie when they can; the rest
                    // packed.
                    let lying = if lie { mc / BLOCK * BLOCK } else { 0 };
                    let pa = pa_buf.window(kp * (mc - lying).div_ceil(BLOCK) * BLOCK);
                    if lying < mc {
                        pack_rows(a, k, (r0 + i0 + lying, mc - lying), (p0, kp), pa);
                    }
                    let pa = &*pa;
                    for rb in (0..mc).step_by(BLOCK) {
                        let r = i0 + rb;
                        let rows = BLOCK.min(rows_here - r);
                        let ar = if rb < lying {
                            ARows::in_place(a, r0 + r, p0)
                        } else {
                            ARows::packed(&pa[(rb - lying) * kp..][..BLOCK * kp])
                        };
                        for j0 in (0..n).step_by(BLOCK) {
                            let cols = BLOCK.min(n - j0);
                            let bp = &pb[j0 * kp..];
                            let block = (ar, (bp, kp * STEP), (&mut part[r * n + j0..], n));
                            run_block(&tiles, kp / STEP, block, (rows, cols), load);
                        }
                    }
                    i0 += mc;
                }
            });
        });
        p0 += kc2;
    }
    SHARED_B.with(|s| s.replace(shared));
}

thread_local! {
    /// Each thread's sums of 32 rows for [`rounded`], kept and reused.
    static STRIP: std::cell::RefCell<PackBuf<f32>> = std::cell::RefCell::new(PackBuf::default());
}

/// `out = round(a·b)` on this thread ([`rounded_threaded`] on one thread).
#[cfg(test)]
fn rounded(dims: Mnk, a: MatView<'_, bf16>, b: MatView<'_, bf16>, out: &mut [bf16]) {
    rounded_threaded(dims, a, b, None, out, 1);
}

/// `out = round(start + a·b)` ([`super::gemm_bf16_rounded`]) over up to `threads` threads,
/// whole blocks of 32 rows to each. All of `b` is packed first (every block of `k`, one after
/// another), each thread packing a share of every block's panels into one buffer that all of
/// them then read; then each thread takes its rows, a block of 32 at a time, through every
/// block of `k` in turn, its sums kept in a strip of its own (32 rows of `n` floats, rows a
/// line longer than the columns so that they do not fall 2ⁿ bytes apart), and rounds them into
/// `out` before the next block. The sums are [`single_thread`]'s, in its order: each output's
/// `k` from its start, 16 pairs per instruction, the accumulator carried in f32 between blocks
/// of `k`; so the bits do not depend on the threads.
pub(super) fn rounded_threaded(
    dims: Mnk,
    a: MatView<'_, bf16>,
    b: MatView<'_, bf16>,
    start: Option<Start<'_>>,
    out: &mut [bf16],
    threads: usize,
) {
    let Mnk { m, k, n } = dims;
    assert!(a.fits(m, k) && b.fits(k, n) && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let k2 = k.div_ceil(2);
    let panels = n.div_ceil(STEP).next_multiple_of(2);
    let width = panels * STEP;
    // Blocks of `k`: (first pair, pairs padded to whole steps, where its panels start).
    let mut blocks = Vec::new();
    let mut packed_len = 0;
    for p0 in (0..k2).step_by(KC2) {
        let kp = KC2.min(k2 - p0).div_ceil(STEP) * STEP;
        blocks.push((p0, kp, packed_len));
        packed_len += kp * width;
    }
    let t = threads.clamp(1, m.div_ceil(BLOCK));
    let rows_per = m.div_ceil(t).div_ceil(BLOCK) * BLOCK;
    let panels_per = panels.div_ceil(t);
    // Taken for the call (a nested call, were there one, would start a buffer of its own).
    let mut shared = SHARED_B.with(|s| s.take());
    let pb = shared.window(packed_len);
    {
        // Each thread's share of every block's panels: (where, first pair, pairs, first column).
        type Share<'p> = Vec<(&'p mut [u32], usize, usize, usize)>;
        let mut shares: Vec<Share<'_>> = (0..t).map(|_| Vec::new()).collect();
        let mut rest = &mut pb[..];
        for &(p0, kp, _) in &blocks {
            let (block, after) = rest.split_at_mut(kp * width);
            rest = after;
            for (q, dst) in block.chunks_mut(panels_per * kp * STEP).enumerate() {
                shares[q].push((dst, p0, kp, q * panels_per * STEP));
            }
        }
        super::super::thread_pool::for_each_owned(shares, |_, share| {
            for (dst, p0, kp, j0) in share.iter_mut() {
                let cols = n.saturating_sub(*j0).min(dst.len() / *kp);
                let b = MatView {
                    offset: b.offset + *j0 * b.cs,
                    ..b
                };
                pack_b_tiles(b, k, (*p0, *kp), cols, dst);
            }
        });
    }
    let pb = &*pb;
    let parts: Vec<&mut [bf16]> = out[..m * n].chunks_mut(rows_per * n).collect();
    super::super::thread_pool::for_each_part(parts, |q, part| {
        let r0 = q * rows_per;
        let a = MatView {
            offset: a.offset + r0 * a.rs,
            ..a
        };
        let rows = Mnk::new(part.len() / n, k, n);
        rounded_rows(rows, a, (pb, &blocks, width), start.map(|s| (s, r0)), part);
    });
    SHARED_B.with(|s| s.replace(shared));
}

/// [`rounded_threaded`]'s rows on one thread, against `b` packed (its blocks of `k`, and the
/// panels' width).
#[allow(clippy::type_complexity)]
fn rounded_rows(
    dims: Mnk,
    a: MatView<'_, bf16>,
    (pb, blocks, width): (&[u32], &[(usize, usize, usize)], usize),
    start: Option<(Start<'_>, usize)>,
    out: &mut [bf16],
) {
    let Mnk { m, k, n } = dims;
    let ldc = width + STEP;
    let tiles = Configured::new();
    // Taken for the call (a nested call, were there one, would start a buffer of its own).
    let mut held = STRIP.with(|s| s.take());
    let strip = held.window(BLOCK * ldc);
    if blocks.is_empty() && start.is_none() {
        // No `k`: the sums are zeros.
        strip.fill(0.0);
    }
    with_packs(|pa_buf, _| {
        for i0 in (0..m).step_by(BLOCK) {
            let rows = BLOCK.min(m - i0);
            if let Some((s, r0)) = start {
                for (r, row) in strip.chunks_exact_mut(ldc).enumerate().take(rows) {
                    s.row_into(r0 + i0 + r, &mut row[..n]);
                }
            }
            for (q, &(p0, kp, at)) in blocks.iter().enumerate() {
                let ar = if rows == BLOCK && lies_usable(&a, k, (p0, kp)) {
                    ARows::in_place(a, i0, p0)
                } else {
                    let pa = pa_buf.window(BLOCK * kp);
                    pack_rows(a, k, (i0, rows), (p0, kp), pa);
                    ARows::packed(pa)
                };
                let load = start.is_some() || q > 0;
                for j0 in (0..width).step_by(BLOCK) {
                    let bp = &pb[at + j0 * kp..];
                    let block = (ar, (bp, kp * STEP), (&mut strip[j0..], ldc));
                    run_block(&tiles, kp / STEP, block, (BLOCK, BLOCK), load);
                }
            }
            for (r, row) in strip.chunks_exact(ldc).enumerate().take(rows) {
                super::f32_to_bf16(&row[..n], &mut out[(i0 + r) * n..][..n]);
            }
        }
    });
    STRIP.with(|s| s.replace(held));
}

/// One block of accumulators: `rows × cols` (at most 32 × 32) of `c` (row stride `ldc`),
/// `steps` instructions' worth of pairs from `ap` (32 rows, [`ARows`]) and `bp` (two panels of
/// 16 columns, the second `panel` values after the first, each with rows of 16 pairs).
#[allow(clippy::type_complexity)]
fn run_block(
    _tiles: &Configured,
    steps: usize,
    (ap, (bp, panel), (c, ldc)): (ARows<'_>, (&[u32], usize), (&mut [f32], usize)),
    (rows, cols): (usize, usize),
    load: bool,
) {
    // Checked arithmetic: a wrapped bound would pass and let the tiles stray.
    let fits = |len: usize, need: Option<usize>| need.is_some_and(|need| len >= need);
    // The last tile row read: row 31 of the last step, 64 bytes.
    let a_need = match steps {
        0 => Some(0),
        s => (s - 1)
            .checked_mul(ap.step)
            .zip(ap.ld.checked_mul(BLOCK - 1))
            .and_then(|(x, y)| x.checked_add(y))
            .and_then(|x| x.checked_add(64)),
    };
    assert!(fits(ap.len, a_need) && ap.ld.checked_mul(16).is_some());
    assert!(fits(
        bp.len(),
        steps.checked_mul(TILE).and_then(|x| x.checked_add(panel))
    ));
    assert!(panel.checked_mul(4).is_some());
    let c_need = (rows.max(1) - 1)
        .checked_mul(ldc)
        .and_then(|x| x.checked_add(cols));
    assert!(rows >= 1 && cols >= 1 && fits(c.len(), c_need) && ldc.checked_mul(4).is_some());
    if rows == BLOCK && cols == BLOCK {
        let b = (bp.as_ptr(), panel);
        // SAFETY: the assertions: 32 rows of `c` from its start, 32 floats each, `ldc` apart;
        // `steps` steps of `a`'s 32 tile rows (each 64 bytes, `ap.ld` apart, steps `ap.step`
        // apart) within `ap`'s bytes; `steps` tiles of `b` from its start and from `panel`
        // values on; the tiles are configured (`_tiles` lives).
        unsafe { tiles(steps, ap, b, c.as_mut_ptr(), ldc, load) };
        return;
    }
    // A partial block goes through a whole one of its own, on cache lines.
    #[repr(C, align(64))]
    struct Lines([f32; BLOCK * BLOCK]);
    let mut lines = Lines([0f32; BLOCK * BLOCK]);
    let local = &mut lines.0;
    if load {
        for r in 0..rows {
            local[r * BLOCK..][..cols].copy_from_slice(&c[r * ldc..][..cols]);
        }
    }
    // SAFETY: as above, `c` being `local` (32 × 32, stride 32).
    unsafe {
        tiles(
            steps,
            ap,
            (bp.as_ptr(), panel),
            local.as_mut_ptr(),
            BLOCK,
            true,
        )
    };
    for r in 0..rows {
        c[r * ldc..][..cols].copy_from_slice(&local[r * BLOCK..][..cols]);
    }
}

/// The tiles: load (or zero) the four accumulator tiles, `steps` × four `tdpbf16ps`, store.
///
/// # Safety
/// A [`Configured`] lives on this thread; `c` has 32 rows of 32 floats, `ldc` floats apart; `a`
/// has `steps` steps of 32 tile rows of 64 bytes (step s's row r at `a.step·s + a.ld·r` bytes
/// from `a.ptr`, all within `a.len`); `b.0` holds `steps` tiles (16 rows of 16 pairs, 1 KiB
/// each, one after another), and so does `b.0 + b.1`.
unsafe fn tiles(
    steps: usize,
    a: ARows<'_>,
    (b, panel): (*const u32, usize),
    c: *mut f32,
    ldc: usize,
    load: bool,
) {
    let panel_bytes = 4 * panel;
    let ldc_bytes = 4 * ldc;
    let (lda, astep) = (a.ld, a.step);
    let a2 = a.ptr.wrapping_add(16 * lda);
    // SAFETY: the caller's: the tiles are configured, and every tile row read or written lies
    // in its operand.
    unsafe {
        asm!(
            "test {load:e}, {load:e}",
            "jz 2f",
            "tileloadd tmm0, [{c} + {ldc}*1]",
            "tileloadd tmm1, [{c} + {ldc}*1 + 64]",
            "lea {t}, [{c} + {ldc}*8]",
            "lea {t}, [{t} + {ldc}*8]",
            "tileloadd tmm2, [{t} + {ldc}*1]",
            "tileloadd tmm3, [{t} + {ldc}*1 + 64]",
            "jmp 3f",
            "2:",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "3:",
            "test {steps}, {steps}",
            "jz 5f",
            "4:",
            "tileloadd tmm4, [{a} + {lda}*1]",
            "tileloadd tmm6, [{b} + {l64}*1]",
            "tileloadd tmm7, [{b2} + {l64}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a2} + {lda}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, {astep}",
            "add {a2}, {astep}",
            "add {b}, 1024",
            "add {b2}, 1024",
            "dec {steps}",
            "jnz 4b",
            "5:",
            "tilestored [{c} + {ldc}*1], tmm0",
            "tilestored [{c} + {ldc}*1 + 64], tmm1",
            "lea {t}, [{c} + {ldc}*8]",
            "lea {t}, [{t} + {ldc}*8]",
            "tilestored [{t} + {ldc}*1], tmm2",
            "tilestored [{t} + {ldc}*1 + 64], tmm3",
            load = in(reg) u32::from(load),
            c = in(reg) c,
            ldc = in(reg) ldc_bytes,
            a = inout(reg) a.ptr => _,
            a2 = inout(reg) a2 => _,
            lda = in(reg) lda,
            astep = in(reg) astep,
            l64 = in(reg) 64usize,
            b = inout(reg) b => _,
            b2 = inout(reg) b.wrapping_byte_add(panel_bytes) => _,
            steps = inout(reg) steps => _,
            t = out(reg) _,
            options(nostack),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{bits as values, same_bits};
    use super::super::{gemm_bf16_on, Bf16Kernel};
    use super::*;

    /// `c0 + a·b` in f64, and `|c0| + Σ|a·b|` for each output (`a` m×k and `b` k×n row-major).
    fn exact(dims: Mnk, a: &[bf16], b: &[bf16], c0: &[f32]) -> Vec<(f64, f64)> {
        let Mnk { m, k, n } = dims;
        let mut out = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut size) =
                    (f64::from(c0[i * n + j]), f64::from(c0[i * n + j]).abs());
                for kk in 0..k {
                    let t = f64::from(a[i * k + kk].to_f32()) * f64::from(b[kk * n + j].to_f32());
                    sum += t;
                    size += t.abs();
                }
                out.push((sum, size));
            }
        }
        out
    }

    /// Whether every output lies within 2⁻²⁰ of its size per instruction along `k` (plus one) of
    /// the exact value: a few units in the last place for each rounding of the unit.
    fn within(c: &[f32], want: &[(f64, f64)], k: usize) -> bool {
        let per = (k.div_ceil(2 * STEP) + 1) as f64 * 2f64.powi(-20);
        c.iter()
            .zip(want)
            .all(|(&x, &(sum, size))| (f64::from(x) - sum).abs() <= per * size)
    }

    fn skip() -> bool {
        if Bf16Kernel::Amx.available() {
            return false;
        }
        crate::testing::skip("no AMX-BF16 here, or Linux did not grant the tile registers");
        true
    }

    /// `a` (m×k) and `b` (k×n) in the layouts asked for (transposed storage read transposed).
    fn product(
        dims: Mnk,
        (a, b): (&[bf16], &[bf16]),
        (at, bt): (bool, bool),
        c: &mut [f32],
        accumulate: bool,
        threads: usize,
    ) {
        let Mnk { m, k, n } = dims;
        let transpose = |x: &[bf16], rows: usize, cols: usize| -> Vec<bf16> {
            (0..cols)
                .flat_map(|j| (0..rows).map(move |i| x[i * cols + j]))
                .collect()
        };
        let (sa, sb) = (
            if at { transpose(a, m, k) } else { a.to_vec() },
            if bt { transpose(b, k, n) } else { b.to_vec() },
        );
        let av = if at {
            MatView::row_major(&sa, 0, m, true)
        } else {
            MatView::row_major(&sa, 0, k, false)
        };
        let bv = if bt {
            MatView::row_major(&sb, 0, k, true)
        } else {
            MatView::row_major(&sb, 0, n, false)
        };
        gemm_bf16_on(Bf16Kernel::Amx, dims, av, bv, c, accumulate, threads);
    }

    /// At the edges of tiles, blocks of rows and blocks of `k` (odd `k`, `k` over several
    /// blocks), in every layout, with and without accumulation: within the bound of the exact
    /// value, and the same bits on one, two and three threads.
    #[test]
    fn products_are_near_the_exact_ones_with_the_same_bits_on_every_thread_count() {
        if skip() {
            return;
        }
        for &(m, k, n) in &[
            (16, 1, 1),
            (17, 31, 33),
            (32, 32, 32),
            (33, 33, 65),
            (70, 2 * 2 * KC2 + 37, 100),
            (300, 96, 40),
            // Taller than a thread's block of rows (256), not swapped: the second block's
            // offsets in every layout.
            (520, 64, 70),
            (64, 2000, 200),
        ] {
            let dims = Mnk::new(m, k, n);
            let (a, b) = (values(1 + m as u64, m * k), values(7 + n as u64, k * n));
            let c0: Vec<f32> = values(11, m * n).iter().map(|x| x.to_f32()).collect();
            for accumulate in [false, true] {
                let zeros = vec![0f32; m * n];
                let want = exact(dims, &a, &b, if accumulate { &c0 } else { &zeros });
                for layout in [(false, false), (true, false), (false, true), (true, true)] {
                    let mut first = None;
                    for threads in [1, 2, 3] {
                        let mut c = c0.clone();
                        product(dims, (&a, &b), layout, &mut c, accumulate, threads);
                        let what = format!(
                            "{m}×{k}×{n} {layout:?} threads {threads} accumulate {accumulate}"
                        );
                        assert!(within(&c, &want, k), "{what}: off the exact value");
                        let first = first.get_or_insert_with(|| c.clone());
                        assert!(
                            same_bits(&c, first),
                            "{what}: bits differ from one thread's"
                        );
                    }
                }
            }
        }
    }

    /// The rounded product gives the bits of the product into f32 (from the start's values,
    /// where it has one) followed by the rounding, for every kind of start, at the edges of
    /// blocks of rows, columns and `k`, in every layout, on one to three threads; and a planted
    /// change (a start taken from the wrong row) is caught.
    #[test]
    fn rounded_products_give_the_bits_of_the_product_then_the_rounding() {
        if skip() {
            return;
        }
        let starts =
            |m: usize, n: usize| [None, Some((1, n)), Some((1, 1)), Some((m, n)), Some((m, 1))];
        for &(m, k, n) in &[
            (1, 1, 1),
            (31, 17, 33),
            (64, 64, 64),
            (33, 2 * KC2 + 37, 70),
            (100, 3 * 2 * KC2 + 2, 48),
            (70, 0, 20),
        ] {
            let (a, b) = (values(3 + m as u64, m * k), values(9 + n as u64, k * n));
            for start in starts(m, n) {
                let c = start.map(|(r, c)| values(13, r * c));
                for layout in [(false, false), (true, true), (false, true), (true, false)] {
                    let what = format!("{m}×{k}×{n} start {start:?} layout {layout:?}");
                    let mut keep = None;
                    let (av, bv) = views(m, k, n, (&a, &b), layout, &mut keep);
                    // The reference: the f32 product from the start, then the rounding.
                    let mut f = vec![0f32; m * n];
                    if let (Some((rows, cols)), Some(c)) = (start, &c) {
                        for (r, row) in f.chunks_exact_mut(n).enumerate() {
                            for (j, v) in row.iter_mut().enumerate() {
                                *v = c[(r % rows) * cols + j % cols].to_f32();
                            }
                        }
                    }
                    gemm_bf16_on(
                        Bf16Kernel::Amx,
                        Mnk::new(m, k, n),
                        av,
                        bv,
                        &mut f,
                        start.is_some(),
                        1,
                    );
                    let mut want = vec![bf16::ZERO; m * n];
                    super::super::f32_to_bf16(&f, &mut want);
                    for threads in [1, 2, 3] {
                        let mut got = vec![bf16::from_bits(0x7fc1); m * n];
                        let st = start.zip(c.as_deref()).map(|((rows, cols), c)| Start {
                            c,
                            rows,
                            cols,
                        });
                        super::super::rounded_on_amx(
                            Mnk::new(m, k, n),
                            av,
                            bv,
                            st,
                            &mut got,
                            threads,
                        );
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(
                            same,
                            "{what} threads {threads}: not the rounded product's bits"
                        );
                    }
                }
            }
        }
        // The check sees a start read from the wrong row.
        let (m, k, n) = (40, 20, 24);
        let (a, b) = (values(1, m * k), values(2, k * n));
        let c = values(4, m * n);
        let mut keep = None;
        let (av, bv) = views(m, k, n, (&a, &b), (false, false), &mut keep);
        let mut right = vec![bf16::ZERO; m * n];
        let mut wrong = vec![bf16::ZERO; m * n];
        let st = Start {
            c: &c,
            rows: m,
            cols: n,
        };
        super::super::rounded_on_amx(Mnk::new(m, k, n), av, bv, Some(st), &mut right, 1);
        let shifted = Start {
            c: &c[n..],
            rows: m - 1,
            cols: n,
        };
        super::super::rounded_on_amx(
            Mnk::new(m - 1, k, n),
            av,
            bv,
            Some(shifted),
            &mut wrong[..(m - 1) * n],
            1,
        );
        assert!(right[..(m - 1) * n]
            .iter()
            .zip(&wrong)
            .any(|(x, y)| x.to_bits() != y.to_bits()));
    }

    /// `a` (m×k) and `b` (k×n) stored in the layouts asked for, as views (with their storage).
    fn views<'s>(
        m: usize,
        k: usize,
        n: usize,
        (a, b): (&[bf16], &[bf16]),
        (at, bt): (bool, bool),
        store: &'s mut Option<(Vec<bf16>, Vec<bf16>)>,
    ) -> (MatView<'s, bf16>, MatView<'s, bf16>) {
        let transpose = |x: &[bf16], rows: usize, cols: usize| -> Vec<bf16> {
            (0..cols)
                .flat_map(|j| (0..rows).map(move |i| x[i * cols + j]))
                .collect()
        };
        let sa = if at { transpose(a, m, k) } else { a.to_vec() };
        let sb = if bt { transpose(b, k, n) } else { b.to_vec() };
        let (sa, sb) = store.insert((sa, sb));
        let av = if at {
            MatView::row_major(sa, 0, m, true)
        } else {
            MatView::row_major(sa, 0, k, false)
        };
        let bv = if bt {
            MatView::row_major(sb, 0, k, true)
        } else {
            MatView::row_major(sb, 0, n, false)
        };
        (av, bv)
    }

    /// Blocks of `a` read where they lie (rows 2·k bytes apart, `k` contiguous) give the bits of
    /// the same `a` packed (rows 2 KiB apart, which are always packed), in the product and in
    /// the rounded product: whole and partial blocks of rows, a last block of `k` that is not
    /// whole steps, one and two threads, with and without accumulation.
    #[test]
    fn rows_read_where_they_lie_give_the_packed_bits() {
        if skip() {
            return;
        }
        for &(m, k, n) in &[(96, 1000, 40), (70, 64, 33), (64, 2 * KC2, 64)] {
            assert!(k <= 1024);
            let (a, b) = (values(21 + m as u64, m * k), values(22, k * n));
            // The same rows, 1024 values apart.
            let mut wide = vec![bf16::from_f32(f32::NAN); m * 1024];
            for (i, row) in a.chunks(k).enumerate() {
                wide[i * 1024..][..k].copy_from_slice(row);
            }
            let lie = MatView::row_major(&a, 0, k, false);
            let packed = MatView {
                data: &wide,
                offset: 0,
                rs: 1024,
                cs: 1,
            };
            assert!(lies_usable(&lie, k, (0, STEP)) && !lies_usable(&packed, k, (0, STEP)));
            let bv = MatView::row_major(&b, 0, n, false);
            let c0: Vec<f32> = values(23, m * n).iter().map(|x| x.to_f32()).collect();
            for (accumulate, threads) in [(false, 1), (true, 1), (false, 2), (true, 2)] {
                let (mut want, mut got) = (c0.clone(), c0.clone());
                let dims = Mnk::new(m, k, n);
                threaded(dims, packed, bv, &mut want, accumulate, threads);
                threaded(dims, lie, bv, &mut got, accumulate, threads);
                let what = format!("{m}×{k}×{n} accumulate {accumulate} on {threads}");
                assert!(same_bits(&got, &want), "{what}");
            }
            let mut want = vec![bf16::ZERO; m * n];
            let mut got = want.clone();
            rounded(Mnk::new(m, k, n), packed, bv, &mut want);
            rounded(Mnk::new(m, k, n), lie, bv, &mut got);
            let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "rounded {m}×{k}×{n}");
        }
    }

    /// `b` packed once by all the threads, then rows to each: the bits of one thread, at the
    /// edges of blocks of rows, columns (a last panel of zeros past `n`, thread shares of
    /// panels that end past `n`) and `k`, in every layout, with and without accumulation, on two
    /// to five threads; and the comparison sees a planted change (a term of `k` left out).
    #[test]
    fn shared_packing_over_threads_gives_one_threads_bits() {
        if skip() {
            return;
        }
        for &(m, k, n) in &[
            (33, 31, 17),
            (64, 64, 64),
            (100, 2 * KC2 + 37, 70),
            (70, 3 * 2 * KC2 + 2, 130),
            (300, 96, 40),
            (97, 1, 5),
        ] {
            let (a, b) = (values(5 + m as u64, m * k), values(6 + n as u64, k * n));
            let c0: Vec<f32> = values(17, m * n).iter().map(|x| x.to_f32()).collect();
            for accumulate in [false, true] {
                for layout in [(false, false), (true, false), (false, true), (true, true)] {
                    let mut keep = None;
                    let (av, bv) = views(m, k, n, (&a, &b), layout, &mut keep);
                    let mut one = c0.clone();
                    single_thread(Mnk::new(m, k, n), av, bv, &mut one, accumulate);
                    for threads in [2, 3, 5] {
                        let mut got = c0.clone();
                        threaded(Mnk::new(m, k, n), av, bv, &mut got, accumulate, threads);
                        let what =
                            format!("{m}×{k}×{n} {layout:?} accumulate {accumulate} on {threads}");
                        assert!(same_bits(&got, &one), "{what}: not one thread's bits");
                    }
                }
            }
        }
        let (m, k, n) = (64, 40, 48);
        let (a, b) = (values(1, m * k), values(2, k * n));
        let mut keep = None;
        let (av, bv) = views(m, k, n, (&a, &b), (false, false), &mut keep);
        let mut whole = vec![0f32; m * n];
        threaded(Mnk::new(m, k, n), av, bv, &mut whole, false, 2);
        let (mut keep2, short) = (None, Mnk::new(m, k - 1, n));
        let a_short: Vec<bf16> = (0..m)
            .flat_map(|i| a[i * k..i * k + k - 1].to_vec())
            .collect();
        let (av2, bv2) = views(
            m,
            k - 1,
            n,
            (&a_short, &b[..(k - 1) * n]),
            (false, false),
            &mut keep2,
        );
        let mut fewer = vec![0f32; m * n];
        threaded(short, av2, bv2, &mut fewer, false, 2);
        assert!(
            !same_bits(&whole, &fewer),
            "the check missed a term left out"
        );
    }

    /// Why the kernel is not the default: with one pair of `k`, `tdpbf16ps` rounds the pair's
    /// sum once and then adds it to the accumulator, where `vdpbf16ps` (the module's
    /// definition) takes the two products one after the other; over random values the two
    /// disagree on some outputs.
    #[test]
    fn one_pair_is_rounded_once_then_added_unlike_the_definition() {
        if skip() {
            return;
        }
        let (m, n) = (64, 64);
        let (a, b) = (values(21, m * 2), values(22, 2 * n));
        let c0: Vec<f32> = values(23, m * n)
            .iter()
            .enumerate()
            .map(|(i, x)| x.to_f32() * (1 << (i % 9)) as f32)
            .collect();
        let mut c = c0.clone();
        product(Mnk::new(m, 2, n), (&a, &b), (false, false), &mut c, true, 1);
        let mut differ = 0;
        for i in 0..m {
            for j in 0..n {
                let (a0, a1) = (a[2 * i], a[2 * i + 1]);
                let (b0, b1) = (b[j], b[n + j]);
                let sum = a0.to_f32() * b0.to_f32() + a1.to_f32() * b1.to_f32();
                assert_eq!(
                    c[i * n + j].to_bits(),
                    (c0[i * n + j] + sum).to_bits(),
                    "measured on Emerald Rapids; does this CPU's AMX round otherwise? (the module \
                     documentation would need to say so)"
                );
                let definition = super::super::dot_pair(c0[i * n + j], pair(a0, a1), pair(b0, b1));
                differ += usize::from(definition.to_bits() != c[i * n + j].to_bits());
            }
        }
        assert!(differ > 0, "AMX gave the definition's bits on every output");
    }

    /// A product split at a block of `k` and accumulated gives the bits of the whole (the
    /// accumulator carried through the output as between blocks), and the bound catches a
    /// product with one value of `k` left out.
    #[test]
    fn accumulating_across_blocks_of_k_matches_and_the_bound_catches_a_dropped_term() {
        if skip() {
            return;
        }
        let (m, k, n) = (40, 4 * KC2 + 10, 50);
        let split = 2 * KC2;
        let (a, b) = (values(3, m * k), values(5, k * n));
        let mut whole = vec![0f32; m * n];
        product(
            Mnk::new(m, k, n),
            (&a, &b),
            (false, false),
            &mut whole,
            false,
            2,
        );
        let (a0, a1): (Vec<bf16>, Vec<bf16>) = {
            let rows = |r: std::ops::Range<usize>| -> Vec<bf16> {
                (0..m)
                    .flat_map(|i| a[i * k..][r.clone()].to_vec())
                    .collect()
            };
            (rows(0..split), rows(split..k))
        };
        let mut parts = vec![0f32; m * n];
        product(
            Mnk::new(m, split, n),
            (&a0, &b[..split * n]),
            (false, false),
            &mut parts,
            false,
            1,
        );
        product(
            Mnk::new(m, k - split, n),
            (&a1, &b[split * n..]),
            (false, false),
            &mut parts,
            true,
            1,
        );
        assert!(same_bits(&whole, &parts));
        let want = exact(Mnk::new(m, k, n), &a, &b, &vec![0f32; m * n]);
        assert!(within(&whole, &want, k));
        let mut dropped = a.clone();
        dropped[5 * k + 77] = bf16::from_bits(0);
        let mut c = vec![0f32; m * n];
        product(
            Mnk::new(m, k, n),
            (&dropped, &b),
            (false, false),
            &mut c,
            false,
            1,
        );
        assert!(
            !within(&c, &want, k),
            "a product missing a term passes the bound"
        );
    }
}
