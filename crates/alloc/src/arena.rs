//! The per-iteration host arena.

use std::any::Any;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use bumpalo::Bump;
use half::{bf16, f16};

use crate::AllocError;

/// Arena buffers of a cache line or more start on a cache line.
const BUF_ALIGN: usize = 64;

/// Smaller ones (a scalar, a few elements) take 16, 32 or 48 bytes on a 16-byte boundary: a chain
/// of scalar ops then needs a quarter of the memory, and stays in cache. Both satisfy every
/// [`Pod`] type's alignment.
const TINY_ALIGN: usize = 16;

/// Buffers below this many bytes use the array of free lists.
const SMALL_BYTES: usize = 256 * BUF_ALIGN;

/// The free lists of small buffers: one per size (see [`size_class`]).
const SMALL_CLASSES: usize = SMALL_BYTES / BUF_ALIGN + 3;

/// A buffer's byte size and alignment for `raw` bytes of elements (at least 1, and small enough
/// not to overflow): a multiple of 16 below a cache line, of 64 from there.
#[inline(always)]
fn rounded(raw: usize) -> (usize, usize) {
    if raw <= BUF_ALIGN - TINY_ALIGN {
        ((raw + TINY_ALIGN - 1) & !(TINY_ALIGN - 1), TINY_ALIGN)
    } else {
        ((raw + BUF_ALIGN - 1) & !(BUF_ALIGN - 1), BUF_ALIGN)
    }
}

/// The free list of a rounded byte size below [`SMALL_BYTES`]: 1 to 3 for 16, 32 and 48 bytes,
/// then `bytes / 64 + 3`. Buffers of one class have one size and one alignment.
#[inline(always)]
fn size_class(bytes: usize) -> usize {
    if bytes < BUF_ALIGN {
        bytes / TINY_ALIGN
    } else {
        bytes / BUF_ALIGN + 3
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Plain element types: every bit pattern is a valid value, there is no drop glue, and the
/// alignment is at most 16 bytes. Recycled buffers are handed out without clearing because of this.
pub trait Pod: Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// A short name used in error messages.
    const NAME: &'static str;
    /// This type's position in `POD_NAMES`: what a buffer records of its element type.
    const CODE: u8;
}

macro_rules! pod {
    ($($code:literal $t:ty),*) => {
        $(
            impl sealed::Sealed for $t {}
            impl Pod for $t {
                const NAME: &'static str = stringify!($t);
                const CODE: u8 = $code;
            }
            const _: () = assert!(std::mem::align_of::<$t>() <= TINY_ALIGN);
        )*
        /// The element types a buffer can hold, by [`Pod::CODE`].
        const POD_NAMES: &[&str] = &[$(stringify!($t)),*];
    };
}
pod!(0 f32, 1 f64, 2 u8, 3 u32, 4 i32, 5 u64, 6 i64, 7 usize, 8 bf16, 9 f16, 10 Bool);

/// `n` zeros of `T` (all bits zero: +0 for the floats, false for [`Bool`]) straight from the
/// allocator's zeroed memory (`calloc`): a large block is fresh pages the system zeroes when first
/// touched, so zeros that are overwritten before they are read (a tensor about to be filled by
/// several threads, a model about to load a checkpoint) cost no pass of their own. For every
/// `Pod` type, where `vec![T::default(); n]` writes the zeros of the types the standard library
/// does not know to be zero bits (bf16, f16, `Bool`). Panics, as `vec!` does, when `n` elements
/// exceed the address space, and aborts when the allocator fails.
pub fn zeroed_vec<T: Pod>(n: usize) -> Vec<T> {
    let layout = std::alloc::Layout::array::<T>(n).expect("capacity overflow");
    try_zeroed_vec(n).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

/// [`zeroed_vec`], or `None` where `n` elements exceed the address space or the allocator has
/// no room for them — the fallible form, in one allocation. (Reserving first to see whether the
/// memory is there, then allocating zeroed, defeats the point: a block below the allocator's
/// threshold for fresh pages is the one just released, which `calloc` must then clear.)
pub fn try_zeroed_vec<T: Pod>(n: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout's size is not zero (checked above).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` comes from the global allocator with the layout of `n` elements of `T` (what a
    // `Vec<T>` of capacity `n` holds), and every one of them is zero bits, a valid `T` (`Pod`:
    // every bit pattern is a value).
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// A boolean element stored in one byte: every byte is a valid value (0 is false, anything else
/// true), so a buffer of them is [`Pod`] where Rust's `bool` (only 0 and 1 valid) cannot be.
/// Equality compares truth, not bytes; values the engine writes are always 0 or 1.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct Bool(u8);

impl Bool {
    /// False.
    pub const FALSE: Bool = Bool(0);
    /// True.
    pub const TRUE: Bool = Bool(1);
    /// The element holding `b`.
    #[inline(always)]
    pub const fn new(b: bool) -> Bool {
        Bool(b as u8)
    }
    /// Its truth.
    #[inline(always)]
    pub const fn get(self) -> bool {
        self.0 != 0
    }
}

impl From<bool> for Bool {
    fn from(b: bool) -> Bool {
        Bool::new(b)
    }
}

impl From<Bool> for bool {
    fn from(b: Bool) -> bool {
        b.get()
    }
}

impl PartialEq for Bool {
    fn eq(&self, other: &Bool) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Bool {}

impl std::hash::Hash for Bool {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.get().hash(h)
    }
}

impl std::fmt::Debug for Bool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.get(), f)
    }
}

impl std::fmt::Display for Bool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.get(), f)
    }
}

/// A point to roll an [`Arena`] back to ([`Arena::mark`], [`Arena::rollback`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaMark {
    depth: usize,
    /// Which mark of the arena's life this is (see [`MarkState::serial`]).
    serial: u64,
}

/// What a mark remembers: the counts and the region's two ends when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MarkState {
    slots: usize,
    owners: usize,
    region_lo: usize,
    region_hi: usize,
    /// [`Arena::fresh_bytes`] then.
    fresh_bytes: usize,
    /// Numbers every mark of the arena's life apart: a mark forgotten by a rollback (or a reset)
    /// must not name the newer mark that later takes its depth.
    serial: u64,
}

/// What [`Arena::split_mixed`] hands out: the output, the input and the auxiliary buffer.
pub type MixedSplit<'a, O, I, A> = (&'a mut [O], &'a [I], &'a [A]);

/// What [`Arena::alloc_split`] hands out: the new buffer, its elements and the inputs'.
pub type AllocSplit<'a, T, const N: usize> = (BufId, &'a mut [T], [&'a [T]; N]);

/// A handle to one buffer of one arena iteration: a slot index and the epoch it was made in.
///
/// Handles are `Copy` and cheap. After [`Arena::reset`] (a new epoch) or after
/// [`Arena::recycle`], using the handle is a [`AllocError::StaleBuffer`] error.
///
/// The two halves live in one `u64` (the slot in the low 32 bits): a handle made from its parts
/// is then built in a register. As two `u32` fields it was assembled on the stack by two narrow
/// stores and read back by one wide load, which the CPU cannot forward from the stores: a stall
/// of a dozen cycles in every op that makes a buffer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufId(u64);

impl std::fmt::Debug for BufId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufId")
            .field("slot", &self.slot())
            .field("epoch", &self.epoch())
            .finish()
    }
}

impl BufId {
    /// A handle that names no buffer (its epoch is never an arena's while that arena lives
    /// through fewer than 2³² resets; a placeholder until a real handle is stored).
    pub const NONE: BufId = BufId(u64::MAX);

    /// The slot index (for diagnostics).
    #[inline(always)]
    pub fn slot(self) -> u32 {
        self.0 as u32
    }

    /// A handle from its parts.
    #[inline(always)]
    pub(crate) fn from_parts(slot: u32, epoch: u32) -> Self {
        BufId(u64::from(epoch) << 32 | u64::from(slot))
    }

    /// The epoch (or generation) stored in the handle.
    #[inline(always)]
    pub(crate) fn epoch(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

#[derive(Debug)]
struct Slot {
    ptr: NonNull<u8>,
    /// Bytes reserved for this buffer (the free-list key when it is recycled).
    bytes: usize,
    len: usize,
    /// The element type, as [`Pod::CODE`].
    elem: u8,
    live: bool,
    /// Memory the arena does not own (see [`Arena::alloc_shared`]): read-only, never recycled.
    shared: bool,
    /// How many owners share this buffer (zero-copy views each hold one); it is recycled when
    /// the last lets go.
    holders: u32,
    /// The arena's epoch when the buffer was made: a handle names this buffer only if it
    /// carries the same epoch (a slot index is reused after a reset or a rollback, under a
    /// newer epoch).
    epoch: u32,
}

/// What [`Arena::reserve`] hands back: the new slot, its memory (`bytes` of it), and whether that
/// memory may be uninitialised (it came from the bump itself, not from the region or a free list,
/// which hold old `Pod` values).
struct Reserved {
    id: BufId,
    ptr: NonNull<u8>,
    bytes: usize,
    fresh: bool,
}

/// Memory statistics of an [`Arena`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Bytes held by live buffers of the current iteration.
    pub bytes_in_use: usize,
    /// The highest `bytes_in_use` since the arena was made (or since [`Arena::reset_peak`]).
    pub peak_bytes_in_use: usize,
    /// Bytes handed out by the bump in this iteration (live, recycled and free-listed).
    pub bytes_bumped: usize,
    /// The highest `bytes_bumped` of any iteration.
    pub peak_bytes_bumped: usize,
    /// Bytes the bump holds from the system allocator (its chunks).
    pub capacity: usize,
    /// Number of resets so far.
    pub resets: u64,
    /// Buffers handed out in this iteration.
    pub allocations: u64,
    /// Of those, how many were served from the free list.
    pub reused: u64,
    /// Live buffers right now.
    pub live_buffers: usize,
}

/// A bump arena for one iteration's buffers.
///
/// * `alloc_*` hands out a buffer and returns its [`BufId`]; the memory stays valid until
///   [`Arena::reset`].
/// * [`Arena::recycle`] marks one buffer dead before the reset; its memory goes to an exact-size free
///   list and serves the next request of the same byte size.
/// * [`Arena::reset`] frees everything in O(1) (the bump keeps its largest chunk, so a steady loop
///   stops calling the system allocator after its first iteration).
///
/// ```
/// use arenagrad_alloc::Arena;
/// let mut arena = Arena::new();
/// let a = arena.alloc_from_slice(&[1.0f32, 2.0, 3.0]).unwrap();
/// let b = arena.alloc_zeroed::<f32>(3).unwrap();
/// let (out, [x]) = arena.split_mut::<f32, 1>(b, [a]).unwrap();
/// for (o, v) in out.iter_mut().zip(x) { *o = v * 2.0; }
/// assert_eq!(arena.slice::<f32>(b).unwrap(), &[2.0, 4.0, 6.0]);
/// arena.reset();
/// assert!(arena.slice::<f32>(a).is_err()); // a stale handle is an error, not a read
/// ```
pub struct Arena {
    bump: Bump,
    slots: Vec<Slot>,
    free: HashMap<usize, Vec<NonNull<u8>>, BuildSizeHasher>,
    /// Free lists of small buffers, indexed by [`size_class`]: no hashing on the hot path.
    small_free: Box<[Vec<NonNull<u8>>; SMALL_CLASSES]>,
    epoch: u32,
    stats: ArenaStats,
    /// The bump's chunk, taken whole at every reset and handed out by the arena itself, as
    /// `region_len` bytes from `region`: buffers of a cache line or more are carved upwards from
    /// the bottom (`region_lo`), smaller ones downwards from the top (`region_hi`), so each end
    /// keeps its alignment with no padding. Its bytes are cleared the first time they are
    /// carved (below `init_lo`, at or above `init_hi`, they have been): a carved buffer holds
    /// old `Pod` values, a steady loop never pays for a memset, and carving is an add and two
    /// compares. A region is not cleared whole when made: that touched every page of it at
    /// once, and a region sized for a scope four times over (or a chunk sized for the largest
    /// iteration) then held that much resident memory however little of it was used. When it
    /// runs out, buffers come from the bump itself (cleared), and the next reset makes one
    /// chunk that holds the iteration.
    region: NonNull<u8>,
    region_lo: usize,
    region_hi: usize,
    region_len: usize,
    /// `[0, init_lo)` and `[init_hi, region_len)` of the region have been written.
    init_lo: usize,
    init_hi: usize,
    /// Some buffer of this iteration came from outside the region.
    overflowed: bool,
    /// Bytes of this iteration's buffers that came from outside the region.
    fresh_bytes: usize,
    /// The owners of this iteration's shared buffers, kept alive until the reset.
    owners: Vec<Arc<dyn Any + Send + Sync>>,
    /// Buffers of this iteration that died before the reset (`slots.len() - dead` are live).
    dead: usize,
    /// The open marks of nested scopes, outermost first.
    marks: Vec<MarkState>,
    /// Marks made so far (the next mark's serial).
    marks_made: u64,
}

// SAFETY: every pointer in `slots`, `free`, `small_free` and `region` points into chunks owned by
// `self.bump` (`region` may also dangle, with `region_len` 0), which is
// `Send`, or (shared slots) into memory owned by an entry of `owners`, which is `Send + Sync` and
// only ever read; no pointer into the bump is shared with anything outside the arena, and all
// access to the memory goes through `&self`/`&mut self` methods, so moving the whole arena to
// another thread moves the memory, or a reference to immutable shared memory, with it.
unsafe impl Send for Arena {}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("epoch", &self.epoch)
            .field("stats", &self.stats)
            .finish()
    }
}

/// Two buffers borrowed to write and `N` to read ([`Arena::split_two_mut`]).
pub type TwoOuts<'a, T, const N: usize> = ([&'a mut [T]; 2], [&'a [T]; N]);

impl Arena {
    /// An empty arena.
    pub fn new() -> Self {
        Self {
            bump: Bump::new(),
            slots: Vec::new(),
            free: HashMap::default(),
            small_free: Box::new(std::array::from_fn(|_| Vec::new())),
            epoch: 0,
            stats: ArenaStats::default(),
            region: NonNull::dangling(),
            region_lo: 0,
            region_hi: 0,
            region_len: 0,
            init_lo: 0,
            init_hi: 0,
            overflowed: false,
            fresh_bytes: 0,
            owners: Vec::new(),
            dead: 0,
            marks: Vec::new(),
            marks_made: 0,
        }
    }

    /// Takes the bump's (single, empty) chunk whole as the region the arena carves buffers from.
    /// A new chunk is cleared as it is carved; later it is the same memory (the bump keeps its
    /// chunk across resets and hands out the same top), whose carved parts hold old `Pod`
    /// values: initialised.
    fn take_region(&mut self) {
        let (old, old_len) = (self.region, self.region_len);
        self.region = NonNull::dangling();
        self.region_lo = 0;
        self.region_hi = 0;
        self.region_len = 0;
        // One alignment's worth short of the capacity: the bump hands out memory downwards
        // from a top that need not be aligned, so asking for every byte could miss by a few and
        // make it map a new chunk twice the size.
        let cap = self.bump.chunk_capacity().saturating_sub(BUF_ALIGN) & !(BUF_ALIGN - 1);
        if cap == 0 {
            return;
        }
        let layout = std::alloc::Layout::from_size_align(cap, BUF_ALIGN)
            .expect("invariant: chunk capacity is a valid layout size");
        let Ok(p) = self.bump.try_alloc_layout(layout) else {
            return;
        };
        if p != old || cap != old_len {
            // New memory: nothing of it written yet.
            self.init_lo = 0;
            self.init_hi = cap;
        }
        self.region = p;
        self.region_hi = cap;
        self.region_len = cap;
    }

    /// Where the arena stands now, to [`Arena::rollback`] to: a nested scope's start. Marks
    /// nest: rolling back to one also forgets every mark made after it.
    pub fn mark(&mut self) -> ArenaMark {
        let serial = self.marks_made;
        self.marks_made += 1;
        self.marks.push(MarkState {
            slots: self.slots.len(),
            owners: self.owners.len(),
            region_lo: self.region_lo,
            region_hi: self.region_hi,
            fresh_bytes: self.fresh_bytes,
            serial,
        });
        ArenaMark {
            depth: self.marks.len() - 1,
            serial,
        }
    }

    /// Frees every buffer made since `mark` at once, live or not, as a bump allocator rolls
    /// back: the region's memory carved since goes back to the region, memory from outside it
    /// (and buffers of before the mark that were recycled and handed out again) to the free
    /// lists, and every handle made since goes stale (the epoch moves on, so the slots they
    /// named are given out again only under a newer one). Buffers of before the mark are
    /// untouched. A mark of an earlier iteration (before a [`Arena::reset`]), one forgotten by a
    /// rollback to an earlier mark, or one already rolled back to, is ignored — even where a
    /// newer mark now stands at its depth.
    ///
    /// ```
    /// use arenagrad_alloc::Arena;
    /// let mut arena = Arena::new();
    /// let keep = arena.alloc_from_slice(&[1.0f32; 4]).unwrap();
    /// let before = arena.stats().bytes_in_use;
    /// let m = arena.mark();
    /// let tmp = arena.alloc_zeroed::<f32>(1000).unwrap();
    /// arena.rollback(m);
    /// assert!(arena.slice::<f32>(tmp).is_err()); // stale
    /// assert_eq!(arena.slice::<f32>(keep).unwrap(), &[1.0; 4]);
    /// assert_eq!(arena.stats().bytes_in_use, before);
    /// ```
    pub fn rollback(&mut self, mark: ArenaMark) {
        // Open still: the mark at its depth is this one, not a newer one made after it was
        // forgotten (its serial tells them apart; a reset forgets every mark).
        if self
            .marks
            .get(mark.depth)
            .is_none_or(|m| m.serial != mark.serial)
        {
            return;
        }
        let depth = mark.depth;
        let mark = self.marks[depth];
        self.marks.truncate(depth);
        debug_assert!(mark.slots <= self.slots.len());
        debug_assert!(mark.region_lo <= self.region_lo && mark.region_hi >= self.region_hi);
        let base = self.region.as_ptr() as usize;
        // The memory the region gets back: carved since the mark, at either end.
        let back = |p: NonNull<u8>| {
            let a = (p.as_ptr() as usize).wrapping_sub(base);
            let in_region = (p.as_ptr() as usize) >= base && a < self.region_len;
            in_region
                && ((a >= mark.region_lo && a < self.region_lo)
                    || (a >= self.region_hi && a < mark.region_hi))
        };
        // Free-list entries inside the returned memory would be handed out twice: drop them.
        for l in self.small_free.iter_mut() {
            l.retain(|&p| !back(p));
        }
        for l in self.free.values_mut() {
            l.retain(|&p| !back(p));
        }
        self.stats.peak_bytes_in_use = self.peak_in_use();
        let removed = self.slots.split_off(mark.slots);
        for slot in &removed {
            if !slot.live {
                self.dead -= 1;
                continue;
            }
            if slot.shared {
                continue;
            }
            self.stats.bytes_in_use -= slot.bytes;
            if !back(slot.ptr) {
                // Memory from outside the region (or reused from a free list): valid until the
                // reset, so it serves later requests of its size.
                if slot.bytes < SMALL_BYTES {
                    self.small_free[size_class(slot.bytes)].push(slot.ptr);
                } else {
                    self.free.entry(slot.bytes).or_default().push(slot.ptr);
                }
            }
        }
        self.stats.peak_bytes_bumped = self.stats.peak_bytes_bumped.max(self.stats.bytes_bumped);
        let carved = (self.region_lo - mark.region_lo) + (mark.region_hi - self.region_hi);
        self.stats.bytes_bumped -= carved.min(self.stats.bytes_bumped);
        self.region_lo = mark.region_lo;
        self.region_hi = mark.region_hi;
        self.owners.truncate(mark.owners);
        self.epoch = self.epoch.wrapping_add(1);
        let outside = self.fresh_bytes - mark.fresh_bytes;
        if outside > 0 && self.marks.is_empty() {
            // The scope outgrew the region (always so in a process's first iteration, which has
            // none yet): what it took from outside went to the exact-size free lists, which a
            // scope of slightly other sizes (a cache one token longer) would not reuse, so a loop
            // of scopes would grow until the reset. Give the scopes after it a region that holds
            // this one four times over (room for the ones that grow); they roll back into it.
            self.grow_region(4 * (carved + outside));
        }
    }

    /// Carves from now on from a new region of at least `want` bytes (and twice the old one's),
    /// taken from the bump. The old region's buffers stay where they are, valid until the
    /// reset; only the outermost scope does this (`marks` is empty), so no open mark holds
    /// ends of the old region.
    #[inline(never)]
    fn grow_region(&mut self, want: usize) {
        debug_assert!(self.marks.is_empty());
        let len = want.max(2 * self.region_len).max(1 << 20);
        let len = (len + BUF_ALIGN - 1) & !(BUF_ALIGN - 1);
        let Ok(layout) = std::alloc::Layout::from_size_align(len, BUF_ALIGN) else {
            return;
        };
        let Ok(p) = self.bump.try_alloc_layout(layout) else {
            // No memory for it: scopes keep working from the free lists and fresh memory.
            return;
        };
        // Cleared as it is carved (see `region`).
        self.region = p;
        self.region_lo = 0;
        self.region_hi = len;
        self.region_len = len;
        self.init_lo = 0;
        self.init_hi = len;
    }

    /// The arena's current epoch (incremented by every reset and every rollback).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Current statistics.
    ///
    /// The counts of this iteration's buffers and the peak of its bumped bytes are derived here
    /// rather than kept up to date by every allocation.
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            capacity: self.bump.allocated_bytes(),
            allocations: self.slots.len() as u64,
            live_buffers: self.slots.len() - self.dead,
            peak_bytes_in_use: self.peak_in_use(),
            peak_bytes_bumped: self.stats.peak_bytes_bumped.max(self.stats.bytes_bumped),
            ..self.stats
        }
    }

    /// The peak of the bytes in use, kept where they go down (they reach a peak just before a
    /// buffer dies or the arena resets), not at every allocation.
    fn peak_in_use(&self) -> usize {
        self.stats.peak_bytes_in_use.max(self.stats.bytes_in_use)
    }

    /// Restarts the peak counters at the current values.
    pub fn reset_peak(&mut self) {
        self.stats.peak_bytes_in_use = self.stats.bytes_in_use;
        self.stats.peak_bytes_bumped = self.stats.bytes_bumped;
    }

    /// Frees every buffer of this iteration at once. All earlier handles become stale.
    pub fn reset(&mut self) {
        self.marks.clear();
        self.slots.clear();
        self.owners.clear();
        self.free.clear();
        for l in self.small_free.iter_mut() {
            l.clear();
        }
        // bumpalo keeps only its newest chunk on reset. If this iteration needed more than that
        // chunk holds, the next one would map fresh chunks again (and fault every page in), so
        // start over with one chunk that holds the whole peak: from then on the loop is steady.
        self.stats.peak_bytes_bumped = self.stats.peak_bytes_bumped.max(self.stats.bytes_bumped);
        self.stats.peak_bytes_in_use = self.peak_in_use();
        self.bump.reset();
        if self.overflowed || self.stats.bytes_bumped > self.bump.chunk_capacity() {
            let want = self.stats.peak_bytes_bumped + self.stats.peak_bytes_bumped / 16;
            // The old chunks go back first: made before they went, the new chunk would have the
            // process hold both at once (its resident high-water mark twice the iteration's).
            self.bump = Bump::new();
            self.bump = Bump::with_capacity(want.max(BUF_ALIGN));
            // A new chunk: its memory is cleared when taken, whatever its address.
            self.region_len = 0;
        }
        self.take_region();
        self.overflowed = false;
        self.fresh_bytes = 0;
        self.epoch = self.epoch.wrapping_add(1);
        self.stats.bytes_in_use = 0;
        self.stats.bytes_bumped = 0;
        self.stats.reused = 0;
        self.dead = 0;
        self.stats.resets += 1;
    }

    /// The byte size and alignment of a buffer of `len` elements of `T` (see [`rounded`]).
    fn byte_size<T: Pod>(len: usize) -> Result<(usize, usize), AllocError> {
        let elem = std::mem::size_of::<T>();
        let too_large = AllocError::TooLarge {
            elems: len,
            elem_bytes: elem,
        };
        // Rounded so that recycled buffers of equal size are interchangeable, and never zero
        // (every buffer gets a distinct address).
        let raw = len.checked_mul(elem).ok_or(too_large.clone())?.max(1);
        if raw > isize::MAX as usize - BUF_ALIGN {
            return Err(too_large);
        }
        Ok(rounded(raw))
    }

    /// Reserves memory for `len` elements of `T` and returns the slot.
    ///
    /// Small buffers take the short way in line: their free list, else the region. Large ones
    /// go through [`Arena::reserve_large`]; what neither the lists nor the region can serve comes
    /// from [`Arena::reserve_fresh`].
    #[inline(always)]
    fn reserve<T: Pod>(&mut self, len: usize) -> Result<Reserved, AllocError> {
        // Up to this many elements the rounded byte size stays under `SMALL_BYTES` (the sizes
        // the array of free lists serves), with no overflow to check.
        let small_len = (SMALL_BYTES - BUF_ALIGN) / std::mem::size_of::<T>();
        if len > small_len {
            return self.reserve_large::<T>(len);
        }
        let (bytes, align) = rounded((len * std::mem::size_of::<T>()).max(1));
        let ptr = if let Some(p) = self.small_free[size_class(bytes) % SMALL_CLASSES].pop() {
            self.stats.reused += 1;
            p
        } else if let Some(p) = self.carve(bytes, align) {
            p
        } else {
            return self.reserve_fresh::<T>(len);
        };
        Ok(self.reserved::<T>(ptr, bytes, len, false))
    }

    /// `bytes` (rounded by [`rounded`], with its `align`) from the region, if they fit.
    #[inline(always)]
    fn carve(&mut self, bytes: usize, align: usize) -> Option<NonNull<u8>> {
        if bytes > self.region_hi - self.region_lo {
            return None;
        }
        // The region starts on a BUF_ALIGN boundary and its length is a multiple of it; the
        // bottom end moves by multiples of BUF_ALIGN, the top end by multiples of TINY_ALIGN, so
        // each stays aligned for what it hands out.
        let bottom = align == BUF_ALIGN;
        let start = if bottom {
            self.region_lo += bytes;
            self.region_lo - bytes
        } else {
            self.region_hi -= bytes;
            self.region_hi
        };
        self.stats.bytes_bumped += bytes;
        if (bottom && start + bytes > self.init_lo) || (!bottom && start < self.init_hi) {
            self.clear_carved(start, bytes, bottom);
        }
        // SAFETY: `region_lo <= region_hi <= region_len` holds (checked above before either end
        // moved by `bytes`), and `[start, start + bytes)` lies between the old and the new end,
        // inside the region the bump handed out (see `take_region`) and outside every buffer
        // carved before.
        Some(unsafe { self.region.add(start) })
    }

    /// Clears the part of the just-carved `[start, start + bytes)` (from the `bottom` end, or
    /// the top) that was never written, and moves that end's written mark past it.
    #[cold]
    #[inline(never)]
    fn clear_carved(&mut self, start: usize, bytes: usize, bottom: bool) {
        let end = start + bytes;
        // The bottom end carves upwards from `region_lo <= init_lo`, the top end downwards from
        // `region_hi >= init_hi`: the unwritten part is a run at the far end of the carve.
        let (from, to) = if bottom {
            (self.init_lo.max(start), end)
        } else {
            (start, self.init_hi.min(end))
        };
        if from < to {
            // SAFETY: `[from, to)` lies inside the carve `[start, start + bytes)`, which is inside
            // the region the bump handed out and outside every live buffer (see `carve`); no
            // reference to it exists yet, so writing it is in bounds and unaliased.
            unsafe { std::ptr::write_bytes(self.region.as_ptr().add(from), 0, to - from) };
        }
        if bottom {
            self.init_lo = self.init_lo.max(end);
        } else {
            self.init_hi = self.init_hi.min(start);
        }
    }

    /// [`Arena::reserve`] for buffers of `SMALL_BYTES` or more: their free list in the map, else
    /// the region, else fresh memory.
    #[inline(never)]
    fn reserve_large<T: Pod>(&mut self, len: usize) -> Result<Reserved, AllocError> {
        let (bytes, align) = Self::byte_size::<T>(len)?;
        let ptr = if let Some(p) = self.free.get_mut(&bytes).and_then(Vec::pop) {
            self.stats.reused += 1;
            p
        } else if let Some(p) = self.carve(bytes, align) {
            p
        } else {
            return self.reserve_fresh::<T>(len);
        };
        Ok(self.reserved::<T>(ptr, bytes, len, false))
    }

    /// Memory past the region, from the bump itself: uninitialised (`fresh`), and a sign that
    /// the next reset should make a chunk that holds the whole iteration. (It takes only `len`,
    /// and works out the size again, so that the in-line path keeps nothing else live for it.)
    #[inline(never)]
    fn reserve_fresh<T: Pod>(&mut self, len: usize) -> Result<Reserved, AllocError> {
        let (bytes, align) = Self::byte_size::<T>(len)?;
        let layout = std::alloc::Layout::from_size_align(bytes, align).map_err(|_| {
            AllocError::TooLarge {
                elems: len,
                elem_bytes: std::mem::size_of::<T>(),
            }
        })?;
        let p = self
            .bump
            .try_alloc_layout(layout)
            .map_err(|_| AllocError::OutOfMemory {
                requested: bytes,
                allocated: self.stats.bytes_in_use,
                reserved: self.bump.allocated_bytes(),
            })?;
        self.stats.bytes_bumped += bytes;
        self.fresh_bytes += bytes;
        self.overflowed = true;
        Ok(self.reserved::<T>(p, bytes, len, true))
    }

    /// Records a new live buffer of `len` elements of `T` at `ptr` (`bytes` reserved).
    #[inline(always)]
    fn reserved<T: Pod>(
        &mut self,
        ptr: NonNull<u8>,
        bytes: usize,
        len: usize,
        fresh: bool,
    ) -> Reserved {
        let slot = u32::try_from(self.slots.len()).expect("invariant: fewer than 2^32 buffers");
        self.slots.push(Slot {
            ptr,
            bytes,
            len,
            elem: T::CODE,
            live: true,
            shared: false,
            holders: 1,
            epoch: self.epoch,
        });
        self.stats.bytes_in_use += bytes;
        Reserved {
            id: BufId::from_parts(slot, self.epoch),
            ptr,
            bytes,
            fresh,
        }
    }

    /// A read-only buffer over memory the arena does not own: `view(&owner)` is read in place,
    /// with no copy, and `owner` is kept alive until the reset. Writing the buffer is
    /// [`AllocError::ReadOnly`]; it counts as an allocation but not towards the bytes in use.
    ///
    /// This is how a parameter's value enters an iteration: while the arena holds its `Arc`,
    /// nobody can get `&mut` access to it (`Arc::get_mut` and `Arc::make_mut` see a second
    /// owner), so the memory stays as it was for as long as any handle can read it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use arenagrad_alloc::{AllocError, Arena};
    /// let mut arena = Arena::new();
    /// let mut weights = Arc::new(vec![1.0f32, 2.0]);
    /// let w = arena.alloc_shared(weights.clone(), |v: &Vec<f32>| v.as_slice()).unwrap();
    /// assert_eq!(arena.slice::<f32>(w).unwrap(), &[1.0, 2.0]);
    /// assert!(matches!(arena.slice_mut::<f32>(w), Err(AllocError::ReadOnly { .. })));
    /// assert!(Arc::get_mut(&mut weights).is_none()); // the arena still reads it
    /// arena.reset();
    /// Arc::get_mut(&mut weights).unwrap()[0] = 3.0; // the iteration is over: update in place
    /// ```
    pub fn alloc_shared<T: Pod, O: Send + Sync + 'static>(
        &mut self,
        owner: Arc<O>,
        view: fn(&O) -> &[T],
    ) -> Result<BufId, AllocError> {
        let data = view(&owner);
        let (ptr, len) = (NonNull::from(data).cast::<u8>(), data.len());
        let slot = u32::try_from(self.slots.len()).expect("invariant: fewer than 2^32 buffers");
        self.slots.push(Slot {
            ptr,
            bytes: 0,
            len,
            elem: T::CODE,
            live: true,
            shared: true,
            holders: 1,
            epoch: self.epoch,
        });
        self.owners.push(owner);
        Ok(BufId::from_parts(slot, self.epoch))
    }

    /// A buffer of `len` zeros.
    pub fn alloc_zeroed<T: Pod>(&mut self, len: usize) -> Result<BufId, AllocError> {
        // Initialised whole first (see `alloc_from_slice`), then its elements zeroed.
        let id = self.reserve_initialised::<T>(len)?.id;
        self.slice_mut::<T>(id)?.fill(T::default());
        Ok(id)
    }

    /// A buffer of `len` elements whose contents are unspecified (but initialised): the caller is
    /// expected to overwrite all of them. Cheaper than [`Arena::alloc_zeroed`] when the buffer comes
    /// from the free list.
    #[inline(always)]
    pub fn alloc_scratch<T: Pod>(&mut self, len: usize) -> Result<BufId, AllocError> {
        Ok(self.reserve_initialised::<T>(len)?.id)
    }

    /// [`Arena::reserve`], with fresh memory cleared: every byte of the buffer is initialised.
    #[inline(always)]
    fn reserve_initialised<T: Pod>(&mut self, len: usize) -> Result<Reserved, AllocError> {
        let r = self.reserve::<T>(len)?;
        if r.fresh {
            // SAFETY: `r.ptr` was just returned by the bump for `r.bytes` bytes; nothing else
            // refers to it yet, so writing every byte is in bounds and unaliased.
            unsafe { std::ptr::write_bytes(r.ptr.as_ptr(), 0, r.bytes) };
        }
        Ok(r)
    }

    /// A new buffer of `len` elements to write and `N` live ones to read, borrowed together:
    /// [`Arena::alloc_scratch`] and [`Arena::split_mut`] in one step, without checking the new
    /// buffer again. Its contents are unspecified (but initialised), as `alloc_scratch`'s.
    #[inline(always)]
    pub fn alloc_split<T: Pod, const N: usize>(
        &mut self,
        len: usize,
        inputs: [BufId; N],
    ) -> Result<AllocSplit<'_, T, N>, AllocError> {
        // The inputs first: checked live, they name slots that exist, none of them the new one.
        let mut parts = [(NonNull::<T>::dangling(), 0); N];
        for (part, id) in parts.iter_mut().zip(inputs) {
            let s = self.check::<T>(id)?;
            *part = (s.ptr.cast::<T>(), s.len);
        }
        let r = self.reserve_initialised::<T>(len)?;
        let mut ins: [&[T]; N] = [&[]; N];
        for (dst, (p, n)) in ins.iter_mut().zip(parts) {
            // SAFETY: each input was checked live, of this epoch and of type `T`, so it points
            // at `n` initialised `T`s in memory that stays valid while `self` is borrowed
            // (reserving moves no buffer's memory). Shared borrows of inputs may alias each other.
            *dst = unsafe { std::slice::from_raw_parts(p.as_ptr(), n) };
        }
        // SAFETY: the new buffer's `len` elements lie in `r.bytes` bytes just reserved (aligned
        // to TINY_ALIGN or more, ≥ align_of::<T>() for every Pod type; initialised by
        // `reserve_initialised`), memory no live buffer holds: it
        // came from a dead buffer's free list, the region's unused part or the bump, so the
        // unique borrow overlaps none of the inputs. `&mut self` keeps any other access out for
        // the lifetime of the returned slices.
        let out = unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr().cast::<T>(), len) };
        Ok((r.id, out, ins))
    }

    /// A buffer holding a copy of `data`.
    pub fn alloc_from_slice<T: Pod>(&mut self, data: &[T]) -> Result<BufId, AllocError> {
        // Initialised whole, not only the `data.len()` elements: the bytes rounding the size up
        // are read by whoever gets the memory next from the free list.
        let r = self.reserve_initialised::<T>(data.len())?;
        // SAFETY: the slot holds at least `data.len() * size_of::<T>()` bytes aligned for `T`
        // (TINY_ALIGN ≥ align_of::<T>() for every Pod type); `data` is a distinct live borrow that
        // cannot overlap memory the arena just reserved.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), r.ptr.as_ptr().cast::<T>(), data.len())
        };
        Ok(r.id)
    }

    /// A buffer of `len` elements produced by `f(index)`.
    pub fn alloc_with<T: Pod>(
        &mut self,
        len: usize,
        mut f: impl FnMut(usize) -> T,
    ) -> Result<BufId, AllocError> {
        let id = self.alloc_scratch::<T>(len)?;
        for (i, v) in self.slice_mut::<T>(id)?.iter_mut().enumerate() {
            *v = f(i);
        }
        Ok(id)
    }

    #[inline(always)]
    fn check<T: Pod>(&self, id: BufId) -> Result<&Slot, AllocError> {
        match self.slots.get(id.slot() as usize) {
            Some(slot) if slot.live && id.epoch() == slot.epoch => {
                if slot.elem == T::CODE {
                    Ok(slot)
                } else {
                    Err(AllocError::WrongType {
                        stored: POD_NAMES[slot.elem as usize],
                        requested: T::NAME,
                    })
                }
            }
            _ => Err(self.stale(id)),
        }
    }

    /// [`Arena::check`] for a buffer about to be written: shared buffers are read-only.
    #[inline(always)]
    fn check_mut<T: Pod>(&self, id: BufId) -> Result<&Slot, AllocError> {
        let slot = self.check::<T>(id)?;
        if slot.shared {
            return Err(AllocError::ReadOnly { slot: id.slot() });
        }
        Ok(slot)
    }

    #[cold]
    fn stale(&self, id: BufId) -> AllocError {
        AllocError::StaleBuffer {
            slot: id.slot(),
            epoch: id.epoch(),
            current: self.epoch,
        }
    }

    /// Number of elements in a live buffer.
    pub fn len_of(&self, id: BufId) -> Result<usize, AllocError> {
        match self.slots.get(id.slot() as usize) {
            Some(s) if s.live && id.epoch() == s.epoch => Ok(s.len),
            _ => Err(self.stale(id)),
        }
    }

    /// Reads a buffer.
    pub fn slice<T: Pod>(&self, id: BufId) -> Result<&[T], AllocError> {
        let slot = self.check::<T>(id)?;
        // SAFETY: a live slot of this epoch points to `len` initialised elements of `T` (checked
        // by element code) inside a bump chunk that lives until `reset`, or, for a shared slot,
        // into memory that an entry of `owners` keeps alive and unwritten until `reset`; `reset`
        // needs `&mut self`, and shared access through `&self` cannot coexist with the `&mut`
        // accessors.
        Ok(unsafe { std::slice::from_raw_parts(slot.ptr.as_ptr().cast::<T>(), slot.len) })
    }

    /// Writes a buffer.
    pub fn slice_mut<T: Pod>(&mut self, id: BufId) -> Result<&mut [T], AllocError> {
        let slot = self.check_mut::<T>(id)?;
        // SAFETY: as in `slice`, and the slot is not shared (its memory is the arena's); `&mut
        // self` guarantees no other slice of this arena is alive, so the returned unique borrow
        // is not aliased.
        Ok(unsafe { std::slice::from_raw_parts_mut(slot.ptr.as_ptr().cast::<T>(), slot.len) })
    }

    /// One buffer to write and `N` distinct others to read, borrowed together — the shape of a
    /// kernel call. The inputs may repeat among themselves but not name the output.
    #[inline(always)]
    pub fn split_mut<T: Pod, const N: usize>(
        &mut self,
        out: BufId,
        inputs: [BufId; N],
    ) -> Result<(&mut [T], [&[T]; N]), AllocError> {
        self.split_checked(out, inputs, false)
    }

    /// [`Arena::split_mut`] for rewriting `out` in place: [`AllocError::NotUnique`] (and
    /// nothing borrowed) where other owners share it (views), whose values would change too.
    #[inline(always)]
    pub fn split_unique<T: Pod, const N: usize>(
        &mut self,
        out: BufId,
        inputs: [BufId; N],
    ) -> Result<(&mut [T], [&[T]; N]), AllocError> {
        self.split_checked(out, inputs, true)
    }

    #[inline(always)]
    fn split_checked<T: Pod, const N: usize>(
        &mut self,
        out: BufId,
        inputs: [BufId; N],
        unique: bool,
    ) -> Result<(&mut [T], [&[T]; N]), AllocError> {
        let o = self.check_mut::<T>(out)?;
        if unique && o.holders != 1 {
            return Err(AllocError::NotUnique {
                slot: out.slot(),
                holders: o.holders,
            });
        }
        let (optr, olen) = (o.ptr, o.len);
        // Filled in place (`array::from_fn` left its closure out of line, one call per input).
        let mut ins: [&[T]; N] = [&[]; N];
        for (dst, id) in ins.iter_mut().zip(inputs) {
            if id.slot() == out.slot() {
                return Err(AllocError::Aliased { slot: out.slot() });
            }
            let s = self.check::<T>(id)?;
            // SAFETY: the slot was checked live, of this epoch and of type `T`, so it points at
            // `len` initialised `T`s that stay valid while `self` is borrowed. Shared borrows of
            // inputs may alias each other, which is fine; that none overlaps the output is
            // argued below.
            *dst = unsafe { std::slice::from_raw_parts(s.ptr.as_ptr().cast::<T>(), s.len) };
        }
        // SAFETY: all slots were checked live, of this epoch and of type `T`, and the output is
        // not a shared slot. Live bump slots never share memory (a recycled region is only handed
        // to a new slot after its old slot is marked dead), shared slots point outside the bump
        // (into memory their owners hold), and the output slot differs from every input slot, so
        // the unique borrow of the output does not overlap the shared borrows of the inputs.
        // `&mut self` keeps any other access out for the lifetime of the returned slices.
        let out_slice = unsafe { std::slice::from_raw_parts_mut(optr.as_ptr().cast::<T>(), olen) };
        Ok((out_slice, ins))
    }

    /// Two buffers to write and `N` to read, borrowed together: a kernel with two outputs (a
    /// convolution writing its patch matrix beside its result). The outputs must differ from
    /// each other and from every input.
    pub fn split_two_mut<T: Pod, const N: usize>(
        &mut self,
        outs: [BufId; 2],
        inputs: [BufId; N],
    ) -> Result<TwoOuts<'_, T, N>, AllocError> {
        if outs[0].slot() == outs[1].slot() {
            return Err(AllocError::Aliased {
                slot: outs[0].slot(),
            });
        }
        let second = self.check_mut::<T>(outs[1])?;
        let (ptr, len) = (second.ptr, second.len);
        if inputs.iter().any(|i| i.slot() == outs[1].slot()) {
            return Err(AllocError::Aliased {
                slot: outs[1].slot(),
            });
        }
        let (first, ins) = self.split_checked::<T, N>(outs[0], inputs, false)?;
        // SAFETY: `outs[1]` was checked live, of this epoch, of type `T` and not shared, so it
        // points at `len` initialised `T`s valid while `self` is borrowed; its slot differs from
        // `outs[0]`'s and from every input's (checked above), and live bump slots never share
        // memory (see `split_checked`), so this unique borrow overlaps none of the others.
        let second = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr().cast::<T>(), len) };
        Ok(([first, second], ins))
    }

    /// One buffer to write and two to read, each of its own element type (index buffers beside
    /// value buffers). The output must differ from both inputs.
    pub fn split_mixed<O: Pod, I: Pod, A: Pod>(
        &mut self,
        out: BufId,
        input: BufId,
        aux: BufId,
    ) -> Result<MixedSplit<'_, O, I, A>, AllocError> {
        if input.slot() == out.slot() || aux.slot() == out.slot() {
            return Err(AllocError::Aliased { slot: out.slot() });
        }
        let i = self.check::<I>(input)?;
        let (ip, il) = (i.ptr, i.len);
        let a = self.check::<A>(aux)?;
        let (ap, al) = (a.ptr, a.len);
        let o = self.check_mut::<O>(out)?;
        // SAFETY: the three slots were checked live, of this epoch and of their stated types;
        // live slots never share memory and the output slot differs from both inputs, so the
        // unique borrow of the output overlaps neither shared borrow. `&mut self` keeps every
        // other access out while the slices live.
        unsafe {
            Ok((
                std::slice::from_raw_parts_mut(o.ptr.as_ptr().cast::<O>(), o.len),
                std::slice::from_raw_parts(ip.as_ptr().cast::<I>(), il),
                std::slice::from_raw_parts(ap.as_ptr().cast::<A>(), al),
            ))
        }
    }

    /// Like [`Arena::split_mut`] for a run-time number of inputs.
    pub fn split_mut_many<T: Pod>(
        &mut self,
        out: BufId,
        inputs: &[BufId],
    ) -> Result<(&mut [T], Vec<&[T]>), AllocError> {
        for i in inputs {
            if i.slot() == out.slot() {
                return Err(AllocError::Aliased { slot: out.slot() });
            }
            self.check::<T>(*i)?;
        }
        let o = self.check_mut::<T>(out)?;
        // SAFETY: identical reasoning to `split_mut`: checked live, typed, distinct from inputs.
        let out_slice =
            unsafe { std::slice::from_raw_parts_mut(o.ptr.as_ptr().cast::<T>(), o.len) };
        let ins = inputs
            .iter()
            .map(|i| {
                let s = &self.slots[i.slot() as usize];
                // SAFETY: shared borrows of checked, live, typed inputs disjoint from the output.
                unsafe { std::slice::from_raw_parts(s.ptr.as_ptr().cast::<T>(), s.len) }
            })
            .collect();
        Ok((out_slice, ins))
    }

    /// Adds an owner to a live buffer: a zero-copy view (a reshape) shares the memory, and the
    /// buffer is recycled only after every owner has called [`Arena::recycle`].
    pub fn retain(&mut self, id: BufId) -> Result<(), AllocError> {
        match self.slots.get_mut(id.slot() as usize) {
            Some(s) if s.live && id.epoch() == s.epoch => {
                s.holders += 1;
                Ok(())
            }
            _ => Err(self.stale(id)),
        }
    }

    /// Gives up one owner's claim on a buffer before the reset. When the last owner lets go, the
    /// buffer is dead: its memory serves the next request of the same size and every handle to
    /// it becomes stale.
    pub fn recycle(&mut self, id: BufId) -> Result<(), AllocError> {
        let slot = match self.slots.get_mut(id.slot() as usize) {
            Some(slot) if slot.live && id.epoch() == slot.epoch => slot,
            _ => return Err(self.stale(id)),
        };
        slot.holders -= 1;
        if slot.holders > 0 {
            return Ok(());
        }
        slot.live = false;
        self.dead += 1;
        self.stats.peak_bytes_in_use = self.stats.peak_bytes_in_use.max(self.stats.bytes_in_use);
        if slot.shared {
            // Not ours: its owner is let go at the reset.
            return Ok(());
        }
        if slot.bytes < SMALL_BYTES {
            self.small_free[size_class(slot.bytes)].push(slot.ptr);
        } else {
            self.free.entry(slot.bytes).or_default().push(slot.ptr);
        }
        self.stats.bytes_in_use -= slot.bytes;
        Ok(())
    }
}

/// Hashes byte sizes (already multiples of 64) with one multiply: the std SipHash would cost more
/// than the bump allocation it guards.
#[derive(Default, Clone, Copy)]
struct BuildSizeHasher;

#[derive(Default)]
struct SizeHasher(u64);

impl std::hash::BuildHasher for BuildSizeHasher {
    type Hasher = SizeHasher;
    fn build_hasher(&self) -> SizeHasher {
        SizeHasher(0)
    }
}

impl std::hash::Hasher for SizeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeroed vectors are `n` default values of every element type, of length and capacity
    /// `n`, empty for none (Miri checks the allocation and its release).
    #[test]
    fn zeroed_vectors_hold_defaults() {
        fn check<T: Pod + PartialEq + std::fmt::Debug>() {
            for n in [0, 1, 7, 1000] {
                let v = zeroed_vec::<T>(n);
                assert_eq!((v.len(), v.capacity()), (n, n));
                assert!(v.iter().all(|x| *x == T::default()), "{}", T::NAME);
            }
        }
        check::<f32>();
        check::<f64>();
        check::<bf16>();
        check::<f16>();
        check::<Bool>();
        check::<i64>();
        check::<u8>();
        // Zero bits are +0, not −0.
        assert!(zeroed_vec::<bf16>(1)[0].is_sign_positive());
    }

    #[test]
    fn buf_ids_pack_slot_and_epoch() {
        for (s, e) in [(0, 0), (7, 3), (u32::MAX, 1), (1, u32::MAX)] {
            let id = BufId::from_parts(s, e);
            assert_eq!((id.slot(), id.epoch()), (s, e));
            assert_eq!(
                format!("{id:?}"),
                format!("BufId {{ slot: {s}, epoch: {e} }}")
            );
        }
        assert_ne!(BufId::from_parts(1, 2), BufId::from_parts(2, 1));
        assert_eq!(
            (BufId::NONE.slot(), BufId::NONE.epoch()),
            (u32::MAX, u32::MAX)
        );
    }

    #[test]
    fn values_round_trip() {
        let mut a = Arena::new();
        let x = a.alloc_from_slice(&[1.0f64, 2.0, 3.0]).unwrap();
        let z = a.alloc_zeroed::<f64>(2).unwrap();
        assert_eq!(a.slice::<f64>(x).unwrap(), &[1.0, 2.0, 3.0]);
        assert_eq!(a.slice::<f64>(z).unwrap(), &[0.0, 0.0]);
        let w = a.alloc_with::<u32>(4, |i| i as u32 * 3).unwrap();
        assert_eq!(a.slice::<u32>(w).unwrap(), &[0, 3, 6, 9]);
    }

    #[test]
    fn shared_buffers_are_read_in_place_and_never_written() {
        let mut a = Arena::new();
        let mut owner = Arc::new(vec![1.5f32, -2.0, 4.0]);
        let w = a
            .alloc_shared(owner.clone(), |v: &Vec<f32>| v.as_slice())
            .unwrap();
        // Read in place: the same memory, and no arena bytes.
        assert_eq!(a.slice::<f32>(w).unwrap().as_ptr(), owner.as_ptr());
        assert_eq!(a.stats().bytes_in_use, 0);
        // Every write path refuses it; reads of another type are typed errors.
        assert!(matches!(
            a.slice_mut::<f32>(w),
            Err(AllocError::ReadOnly { .. })
        ));
        let x = a.alloc_from_slice(&[1.0f32, 1.0, 1.0]).unwrap();
        assert!(matches!(
            a.split_mut::<f32, 1>(w, [x]),
            Err(AllocError::ReadOnly { .. })
        ));
        assert!(matches!(
            a.split_mut_many::<f32>(w, &[x]),
            Err(AllocError::ReadOnly { .. })
        ));
        assert!(matches!(
            a.slice::<f64>(w),
            Err(AllocError::WrongType { .. })
        ));
        // It serves as a kernel input like any buffer.
        let (out, [src]) = a.split_mut::<f32, 1>(x, [w]).unwrap();
        out.copy_from_slice(src);
        assert_eq!(a.slice::<f32>(x).unwrap(), &[1.5, -2.0, 4.0]);
        // Recycling it hands nothing to the free lists: the next request is fresh memory.
        a.retain(w).unwrap();
        a.recycle(w).unwrap();
        assert!(a.slice::<f32>(w).is_ok(), "one holder left");
        a.recycle(w).unwrap();
        assert!(matches!(
            a.slice::<f32>(w),
            Err(AllocError::StaleBuffer { .. })
        ));
        let y = a.alloc_scratch::<f32>(3).unwrap();
        assert_eq!(a.stats().reused, 0);
        assert_ne!(a.slice::<f32>(y).unwrap().as_ptr(), owner.as_ptr());
        // The owner is held until the reset, then let go.
        assert!(Arc::get_mut(&mut owner).is_none());
        a.reset();
        Arc::get_mut(&mut owner).unwrap()[0] = 9.0;
        assert_eq!(owner[0], 9.0);
        // Empty views are fine.
        let e = a
            .alloc_shared(Arc::new(Vec::<f64>::new()), |v: &Vec<f64>| v.as_slice())
            .unwrap();
        assert!(a.slice::<f64>(e).unwrap().is_empty());
    }

    #[test]
    fn stale_after_reset_and_recycle() {
        let mut a = Arena::new();
        let x = a.alloc_zeroed::<f32>(8).unwrap();
        a.reset();
        let y = a.alloc_zeroed::<f32>(8).unwrap();
        assert!(matches!(
            a.slice::<f32>(x),
            Err(AllocError::StaleBuffer { .. })
        ));
        assert!(a.slice::<f32>(y).is_ok());
        a.recycle(y).unwrap();
        assert!(matches!(
            a.slice::<f32>(y),
            Err(AllocError::StaleBuffer { .. })
        ));
        assert!(a.recycle(y).is_err(), "double recycle is an error");
        // The recycled memory is reused, under a new handle.
        let z = a.alloc_scratch::<f32>(8).unwrap();
        assert_eq!(a.stats().reused, 1);
        assert_ne!(z, y);
        assert!(a.slice::<f32>(y).is_err());
    }

    #[test]
    fn shared_buffers_live_until_the_last_owner_lets_go() {
        let mut a = Arena::new();
        let x = a.alloc_from_slice(&[1.0f32, 2.0]).unwrap();
        a.retain(x).unwrap();
        a.recycle(x).unwrap();
        assert_eq!(a.slice::<f32>(x).unwrap(), &[1.0, 2.0], "one owner left");
        a.recycle(x).unwrap();
        assert!(a.slice::<f32>(x).is_err());
        assert!(a.retain(x).is_err());
    }

    #[test]
    fn mixed_split_reads_indices_beside_values() {
        let mut a = Arena::new();
        let x = a.alloc_from_slice(&[10.0f64, 20.0, 30.0]).unwrap();
        let idx = a.alloc_from_slice(&[2u32, 0]).unwrap();
        let o = a.alloc_zeroed::<f64>(2).unwrap();
        let (out, xs, is) = a.split_mixed::<f64, f64, u32>(o, x, idx).unwrap();
        for (o, &k) in out.iter_mut().zip(is) {
            *o = xs[k as usize];
        }
        assert_eq!(a.slice::<f64>(o).unwrap(), &[30.0, 10.0]);
        assert!(a.split_mixed::<f64, f64, u32>(o, o, idx).is_err());
        assert!(a.split_mixed::<f64, f32, u32>(o, x, idx).is_err());
    }

    #[test]
    fn wrong_type_and_alias_are_errors() {
        let mut a = Arena::new();
        let x = a.alloc_zeroed::<f32>(2).unwrap();
        assert!(matches!(
            a.slice::<f64>(x),
            Err(AllocError::WrongType { .. })
        ));
        assert!(matches!(
            a.split_mut::<f32, 1>(x, [x]),
            Err(AllocError::Aliased { .. })
        ));
    }

    #[test]
    fn too_large_is_an_error_not_an_abort() {
        let mut a = Arena::new();
        assert!(matches!(
            a.alloc_zeroed::<f64>(usize::MAX / 2),
            Err(AllocError::TooLarge { .. })
        ));
    }

    #[test]
    fn split_reads_inputs_and_writes_output() {
        let mut a = Arena::new();
        let x = a.alloc_from_slice(&[1.0f32, 2.0]).unwrap();
        let y = a.alloc_from_slice(&[10.0f32, 20.0]).unwrap();
        let o = a.alloc_scratch::<f32>(2).unwrap();
        let (out, [p, q]) = a.split_mut::<f32, 2>(o, [x, y]).unwrap();
        for i in 0..2 {
            out[i] = p[i] + q[i];
        }
        assert_eq!(a.slice::<f32>(o).unwrap(), &[11.0, 22.0]);
        let (out, ins) = a.split_mut_many::<f32>(o, &[x, x, y]).unwrap();
        for i in 0..2 {
            out[i] = ins[0][i] * ins[1][i] + ins[2][i];
        }
        assert_eq!(a.slice::<f32>(o).unwrap(), &[11.0, 24.0]);
    }

    #[test]
    fn steady_loop_keeps_capacity_flat() {
        let mut a = Arena::new();
        let mut caps = Vec::new();
        let rounds = if cfg!(miri) { 6 } else { 50 };
        for _ in 0..rounds {
            for n in [100usize, 1000, 10_000, 37] {
                let id = a.alloc_zeroed::<f32>(n).unwrap();
                if n == 1000 {
                    a.recycle(id).unwrap();
                }
            }
            caps.push(a.stats().capacity);
            a.reset();
        }
        assert!(
            caps[2..].iter().all(|c| *c == caps[2]),
            "capacity grew: {caps:?}"
        );
        assert_eq!(a.stats().resets, rounds);
        // The one chunk kept for the loop holds the iteration's peak with a sixteenth to spare,
        // not twice that.
        let peak = a.stats().peak_bytes_bumped;
        assert!(
            caps[2] <= peak + peak / 16 + 4096,
            "capacity {} for a peak of {peak}",
            caps[2]
        );
    }

    #[test]
    #[cfg_attr(miri, ignore)] // tens of megabytes, written once
    fn the_kept_chunk_is_sized_to_the_peak() {
        for mb in [3usize, 17, 40] {
            let mut a = Arena::new();
            for _ in 0..3 {
                for k in 0..4 {
                    a.alloc_scratch::<f32>((mb << 18) / 4 + k * 1000).unwrap();
                }
                a.reset();
            }
            let (cap, peak) = (a.stats().capacity, a.stats().peak_bytes_bumped);
            assert!(
                cap <= peak + peak / 16 + 4096,
                "capacity {cap} for a peak of {peak}"
            );
        }
    }

    #[test]
    fn stats_track_use_and_peak() {
        let mut a = Arena::new();
        let x = a.alloc_zeroed::<f32>(16).unwrap(); // 64 bytes
        let y = a.alloc_zeroed::<f64>(16).unwrap(); // 128 bytes
        assert_eq!(a.stats().bytes_in_use, 192);
        a.recycle(x).unwrap();
        assert_eq!(a.stats().bytes_in_use, 128);
        assert_eq!(a.stats().peak_bytes_in_use, 192);
        a.recycle(y).unwrap();
        assert_eq!(a.stats().live_buffers, 0);
        // The peak survives the reset and is not lowered by a smaller iteration.
        a.reset();
        a.alloc_scratch::<f32>(1).unwrap(); // 16 bytes
        assert_eq!(a.stats().bytes_in_use, 16);
        assert_eq!(a.stats().peak_bytes_in_use, 192);
        a.alloc_scratch::<f32>(100).unwrap(); // 448 bytes
        assert_eq!(a.stats().peak_bytes_in_use, 464);
        a.reset_peak();
        assert_eq!(a.stats().peak_bytes_in_use, 464);
        a.reset();
        assert_eq!(a.stats().peak_bytes_in_use, 464);
    }

    #[test]
    fn buffers_past_the_region_are_cleared_and_the_next_chunk_holds_them() {
        let mut a = Arena::new();
        // Iteration 1: no region yet, everything from the bump. Iteration 2: the kept chunk is
        // carved. Iteration 3: four times as much, most of it past the region.
        for (round, count) in [(0, 8usize), (1, 8), (2, 32), (3, 32), (4, 32)] {
            let mut ids = Vec::new();
            for k in 0..count {
                let id = a.alloc_scratch::<f64>(100 + k).unwrap();
                // Scratch memory is initialised (Miri checks the reads): old values or zeros.
                assert!(a.slice::<f64>(id).unwrap().iter().all(|v| v.is_finite()));
                a.slice_mut::<f64>(id).unwrap().fill(f64::from(round));
                ids.push(id);
            }
            for (k, id) in ids.iter().enumerate() {
                assert_eq!(a.slice::<f64>(*id).unwrap().len(), 100 + k);
                assert!(a
                    .slice::<f64>(*id)
                    .unwrap()
                    .iter()
                    .all(|&v| v == f64::from(round)));
            }
            let cap = a.stats().capacity;
            a.reset();
            if round >= 3 {
                // The chunk made after the growth holds the whole iteration: no more growth.
                assert_eq!(a.stats().capacity, cap, "round {round}");
            }
        }
    }

    #[test]
    fn recycled_memory_is_initialised_past_the_last_owners_length() {
        // Fresh bump memory (the first iteration) given to short buffers, recycled, then handed
        // to buffers that fill the whole rounded size: every byte must have been written
        // (Miri checks the reads).
        let mut a = Arena::new();
        // 4 and 52 bytes of elements (rounded to 16 and 64), then 12 and 56 (to 16 and 64).
        let bufs = [
            a.alloc_from_slice(&[1.0f32]).unwrap(),
            a.alloc_from_slice(&[1.0f32; 13]).unwrap(),
            a.alloc_zeroed::<f32>(3).unwrap(),
            a.alloc_zeroed::<f32>(14).unwrap(),
        ];
        for b in bufs {
            a.recycle(b).unwrap();
        }
        for n in [4, 16, 4, 16] {
            let before = a.stats().reused;
            let id = a.alloc_scratch::<f32>(n).unwrap();
            assert_eq!(a.stats().reused, before + 1);
            assert!(a.slice::<f32>(id).unwrap().iter().all(|v| v.is_finite()));
        }
    }

    #[test]
    fn alloc_split_makes_a_buffer_beside_its_inputs() {
        let mut a = Arena::new();
        for round in 0..3 {
            let x = a.alloc_from_slice(&[1.0f64, 2.0, 3.0]).unwrap();
            let y = a.alloc_from_slice(&[10.0f64, 20.0, 30.0]).unwrap();
            let (out, o, [xs, ys]) = a.alloc_split::<f64, 2>(3, [x, y]).unwrap();
            for ((o, x), y) in o.iter_mut().zip(xs).zip(ys) {
                *o = x + y;
            }
            assert_eq!(a.slice::<f64>(out).unwrap(), &[11.0, 22.0, 33.0]);
            assert_eq!(a.slice::<f64>(x).unwrap(), &[1.0, 2.0, 3.0]);
            // Reusing a recycled buffer's memory, and with no inputs.
            a.recycle(out).unwrap();
            let (again, o, []) = a.alloc_split::<f64, 0>(3, []).unwrap();
            assert_eq!(o.len(), 3);
            assert!(o.iter().all(|v| v.is_finite()));
            assert_ne!(again, out);
            // A stale or mistyped input is an error, and nothing is reserved.
            let before = a.stats().allocations;
            assert!(matches!(
                a.alloc_split::<f64, 1>(1, [out]),
                Err(AllocError::StaleBuffer { .. })
            ));
            assert!(matches!(
                a.alloc_split::<f32, 1>(1, [x]),
                Err(AllocError::WrongType { .. })
            ));
            assert_eq!(a.stats().allocations, before, "round {round}");
            a.reset();
        }
    }

    #[test]
    fn small_buffers_pack_on_16_bytes_and_larger_ones_start_on_lines() {
        let mut a = Arena::new();
        // Round 0 takes memory from the bump, later rounds carve the kept chunk.
        for round in 0..3 {
            let mut bufs = Vec::new();
            for n in [1usize, 3, 4, 5, 12, 13, 16, 17, 1, 100, 2] {
                let id = a.alloc_scratch::<f32>(n).unwrap();
                let at = a.slice::<f32>(id).unwrap().as_ptr() as usize;
                let (bytes, align) = rounded(n * 4);
                assert_eq!(
                    (bytes, align),
                    if n * 4 <= 48 {
                        ((n * 4).div_ceil(16) * 16, 16)
                    } else {
                        ((n * 4).div_ceil(64) * 64, 64)
                    }
                );
                assert_eq!(at % align, 0, "{n} elements at {at:#x}, round {round}");
                bufs.push((at, bytes, id));
            }
            bufs.sort_by_key(|b| b.0);
            for w in bufs.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
            }
            // A recycled buffer serves its own size only.
            let (at, bytes, id) = *bufs.iter().find(|b| b.1 == 32).unwrap();
            a.recycle(id).unwrap();
            let other = a.alloc_scratch::<f32>(12).unwrap(); // 48 bytes: another class
            assert_ne!(a.slice::<f32>(other).unwrap().as_ptr() as usize, at);
            let same = a.alloc_scratch::<f64>(bytes / 8).unwrap();
            assert_eq!(a.slice::<f64>(same).unwrap().as_ptr() as usize, at);
            a.reset();
        }
        assert!(size_class(SMALL_BYTES - BUF_ALIGN) < SMALL_CLASSES);
    }

    #[test]
    fn buffers_just_under_the_small_limit_are_reused() {
        // 16,380 bytes round up to 16 KiB, the first size kept in the map of large free lists:
        // a second request of the same length must find the first's memory there, also when the
        // region (there from the second iteration on) has room.
        let mut a = Arena::new();
        a.alloc_scratch::<f32>(1 << 16).unwrap();
        a.reset();
        for n in [4095usize, 4096, 4080] {
            let x = a.alloc_scratch::<f32>(n).unwrap();
            a.recycle(x).unwrap();
            let before = a.stats().reused;
            a.alloc_scratch::<f32>(n).unwrap();
            assert_eq!(a.stats().reused, before + 1, "{n} elements");
        }
    }

    #[test]
    fn two_outputs_are_borrowed_beside_the_inputs_and_never_alias() {
        let mut a = Arena::new();
        let x = a.alloc_from_slice(&[1.0f32, 2.0]).unwrap();
        let (p, q) = (
            a.alloc_zeroed::<f32>(2).unwrap(),
            a.alloc_zeroed::<f32>(3).unwrap(),
        );
        {
            let ([p_out, q_out], [xs]) = a.split_two_mut::<f32, 1>([p, q], [x]).unwrap();
            p_out.copy_from_slice(xs);
            q_out.fill(xs[1]);
        }
        assert_eq!(a.slice::<f32>(p).unwrap(), &[1.0, 2.0]);
        assert_eq!(a.slice::<f32>(q).unwrap(), &[2.0, 2.0, 2.0]);
        let aliased = |r: Result<TwoOuts<'_, f32, 1>, AllocError>| {
            matches!(r, Err(AllocError::Aliased { .. }))
        };
        assert!(aliased(a.split_two_mut::<f32, 1>([p, p], [x])));
        assert!(aliased(a.split_two_mut::<f32, 1>([p, q], [q])));
        assert!(aliased(a.split_two_mut::<f32, 1>([p, q], [p])));
        let shared = a
            .alloc_shared(std::sync::Arc::new(vec![0.0f32; 2]), |v: &Vec<f32>| {
                v.as_slice()
            })
            .unwrap();
        assert!(matches!(
            a.split_two_mut::<f32, 1>([p, shared], [x]),
            Err(AllocError::ReadOnly { .. })
        ));
    }

    #[test]
    fn split_unique_refuses_a_shared_buffer() {
        let mut a = Arena::new();
        let x = a.alloc_from_slice(&[1.0f32, 2.0]).unwrap();
        let g = a.alloc_from_slice(&[3.0f32, 4.0]).unwrap();
        a.retain(g).unwrap(); // a view shares it
        assert_eq!(
            a.split_unique::<f32, 1>(g, [x]).unwrap_err(),
            AllocError::NotUnique {
                slot: g.slot(),
                holders: 2
            }
        );
        a.recycle(g).unwrap();
        let (o, [xs]) = a.split_unique::<f32, 1>(g, [x]).unwrap();
        o.iter_mut().zip(xs).for_each(|(o, x)| *o *= x);
        assert_eq!(a.slice::<f32>(g).unwrap(), &[3.0, 8.0]);
        assert!(matches!(
            a.split_unique::<f32, 1>(g, [g]),
            Err(AllocError::Aliased { .. })
        ));
    }

    /// Every live buffer's byte range, to check that none overlaps another.
    fn ranges(a: &Arena) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = a
            .slots
            .iter()
            .filter(|s| s.live && !s.shared)
            .map(|s| (s.ptr.as_ptr() as usize, s.ptr.as_ptr() as usize + s.bytes))
            .collect();
        v.sort();
        v
    }

    fn disjoint(a: &Arena) {
        let r = ranges(a);
        for w in r.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlapping buffers {w:?}");
        }
    }

    #[test]
    fn rollback_frees_the_scope_and_keeps_what_came_before() {
        // Bytes past the region (48 KiB); fewer under Miri, which interprets every one cleared.
        let big = if cfg!(miri) { 1 << 17 } else { 1 << 20 };
        let mut a = Arena::new();
        // A first iteration sizes the region.
        for _ in 0..3 {
            let _ = a.alloc_zeroed::<f32>(4096).unwrap();
        }
        a.reset();
        let keep = a.alloc_from_slice(&[7.0f32; 100]).unwrap();
        let dies = a.alloc_zeroed::<f32>(50).unwrap();
        a.recycle(dies).unwrap(); // on a free list before the mark
        let before = a.stats();
        let m = a.mark();
        let t1 = a.alloc_zeroed::<f32>(50).unwrap(); // reuses `dies`'s memory
        let t2 = a.alloc_zeroed::<f32>(3000).unwrap();
        let t3 = a.alloc_zeroed::<f64>(3).unwrap();
        a.recycle(t2).unwrap(); // a dead buffer of the scope, on a free list
        let t4 = a.alloc_zeroed::<u8>(big).unwrap(); // past the region: fresh memory
        a.rollback(m);
        for t in [t1, t2, t3, t4] {
            assert!(matches!(
                a.slice::<u8>(t),
                Err(AllocError::StaleBuffer { .. })
            ));
        }
        assert_eq!(a.slice::<f32>(keep).unwrap(), &[7.0; 100]);
        let after = a.stats();
        assert_eq!(after.bytes_in_use, before.bytes_in_use);
        assert_eq!(after.live_buffers, before.live_buffers);
        // What the scope held is handed out again, never twice and never over `keep`.
        let mut again = Vec::new();
        for n in [50usize, 3000, 3, 50, big / 4, 7] {
            again.push(a.alloc_zeroed::<f32>(n).unwrap());
            disjoint(&a);
        }
        assert_eq!(a.slice::<f32>(keep).unwrap(), &[7.0; 100]);
        // A new buffer in a reused slot does not answer to the old handle.
        assert!(a.slice::<f32>(t1).is_err());
        assert!(a.slice::<f32>(again[0]).is_ok());
    }

    #[test]
    fn marks_nest_and_stale_marks_are_ignored() {
        let mut a = Arena::new();
        let outer = a.mark();
        let x = a.alloc_zeroed::<f32>(10).unwrap();
        let inner = a.mark();
        let y = a.alloc_zeroed::<f32>(10).unwrap();
        a.rollback(inner);
        assert!(a.slice::<f32>(y).is_err());
        assert!(a.slice::<f32>(x).is_ok());
        a.rollback(inner); // already rolled back: nothing happens
        assert!(a.slice::<f32>(x).is_ok());
        let inner2 = a.mark();
        a.rollback(outer); // forgets inner2 too
        assert!(a.slice::<f32>(x).is_err());
        let z = a.alloc_zeroed::<f32>(10).unwrap();
        a.rollback(inner2);
        assert!(a.slice::<f32>(z).is_ok(), "a forgotten mark frees nothing");
        let m = a.mark();
        a.reset();
        let w = a.alloc_zeroed::<f32>(10).unwrap();
        a.rollback(m);
        assert!(
            a.slice::<f32>(w).is_ok(),
            "a mark of an earlier iteration frees nothing"
        );
    }

    #[test]
    fn a_loop_of_scopes_stays_flat() {
        let mut a = Arena::new();
        let base = a.alloc_zeroed::<f32>(64).unwrap();
        let mut caps = Vec::new();
        // Miri interprets every element cleared: a shorter loop there (a minute in 200 steps).
        let steps = if cfg!(miri) { 40 } else { 200 };
        for step in 0..steps {
            let m = a.mark();
            // Growing sizes, as a cache that grows by one token per step.
            for k in 0..5 {
                let _ = a.alloc_zeroed::<f32>(100 + step * 3 + k).unwrap();
            }
            a.rollback(m);
            caps.push((a.stats().capacity, a.slots.len()));
        }
        assert!(a.slice::<f32>(base).is_ok());
        assert_eq!(a.slots.len(), 1);
        // The bump grows only while sizes outgrow the region, never per step.
        let distinct: std::collections::BTreeSet<usize> = caps.iter().map(|c| c.0).collect();
        assert!(distinct.len() < 10, "{distinct:?}");
    }

    #[test]
    fn scopes_of_a_first_iteration_stay_flat_too() {
        // No reset yet, so no region: every buffer of the first scope comes from outside it.
        // A loop of scopes whose sizes creep up (a cache one token longer each step) must not
        // keep taking fresh memory: after the first scope, it rolls back into a region.
        let mut a = Arena::new();
        let base = a.alloc_zeroed::<f32>(64).unwrap();
        let mut caps = Vec::new();
        let mut last_scope = 0;
        // Miri interprets every element written: a shorter loop of smaller buffers there.
        let (steps, first) = if cfg!(miri) { (40, 100) } else { (400, 1000) };
        for step in 0..steps {
            let m = a.mark();
            last_scope = 0;
            for k in 0..5 {
                let n = first + step * 3 + k;
                let _ = a.alloc_zeroed::<f32>(n).unwrap();
                last_scope += 4 * n;
            }
            a.rollback(m);
            caps.push(a.stats().capacity);
        }
        assert!(a.slice::<f32>(base).is_ok());
        // Every scope's sizes differ from the last's: without a region the bump holds all the
        // sizes it could not reuse (4.2 MB here); with one, the region (at least 1 MiB) and the
        // first scope's fresh memory.
        let end = *caps.last().unwrap();
        assert!(
            end < (2 << 20) + 4 * last_scope,
            "{end} bytes held, scopes of {last_scope}"
        );
        assert_eq!(
            caps[steps * 3 / 4],
            end,
            "still growing in the last quarter"
        );
        // The reset folds it all into one chunk, and the same loop goes on flat in it.
        a.reset();
        let after = a.stats().capacity;
        for step in 0..10 {
            let m = a.mark();
            for k in 0..5 {
                let _ = a.alloc_zeroed::<f32>(first + step * 3 + k).unwrap();
            }
            a.rollback(m);
        }
        assert_eq!(a.stats().capacity, after);
    }
}
