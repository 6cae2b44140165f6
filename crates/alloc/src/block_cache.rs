//! A caching device-memory allocator following the rules of PyTorch's `CUDACachingAllocator`.
//!
//! # Why cache device memory
//!
//! `cudaMalloc` and `cudaFree` are slow, and `cudaFree` synchronises the whole device: it waits
//! for every kernel in flight. An eager engine allocates and frees a buffer for every
//! intermediate value of every iteration, so calling the driver each time would serialise the
//! host with the GPU. [`BlockCache`] instead asks the device ([`RawDeviceAlloc`]) for large
//! *segments*, carves them into *blocks*, and keeps freed blocks for reuse. After the first
//! iteration of a steady training loop it calls the driver not at all.
//!
//! # The policy (PyTorch's constants and rules)
//!
//! * **Rounding.** Every request is rounded up to a multiple of [`MIN_BLOCK_SIZE`] (512 bytes);
//!   a 0-byte request gets 512 bytes. See [`round_size`].
//! * **Two pools.** Requests of at most [`SMALL_SIZE`] (1 MiB) are served from the *small pool*,
//!   whose segments are [`SMALL_BUFFER`] (2 MiB). Larger requests are served from the *large
//!   pool*: a request below [`MIN_LARGE_ALLOC`] (10 MiB) gets a [`LARGE_BUFFER`] (20 MiB)
//!   segment, a bigger one a segment of its own, rounded up to a multiple of [`ROUND_LARGE`]
//!   (2 MiB). See [`pool_for`] and [`segment_size`]. Keeping small, short-lived buffers in their
//!   own segments stops them from pinning pieces of the big segments, which is the main source
//!   of fragmentation.
//! * **Best fit.** A request takes the smallest free block of its pool and stream that fits;
//!   among equal sizes, the lowest address.
//! * **Splitting.** When the chosen block is larger than the request, the rest is split off as a
//!   new free block if it is at least [`MIN_BLOCK_SIZE`] (small pool) or more than
//!   [`SMALL_SIZE`] (large pool); otherwise the caller gets the whole block (so a
//!   [`BlockHandle::size`] may exceed the rounded request in the large pool). Not splitting off
//!   small remainders of large blocks keeps the large pool from filling with slivers.
//! * **Merging.** A freed block is merged with its free neighbours in the same segment, so a
//!   segment whose blocks are all free is again one block.
//! * **Stream order.** Every block belongs to the stream it was allocated on, and a free block
//!   is only reused by an allocation on that stream: work on one stream runs in order, so the
//!   next kernel on it cannot touch the block before the previous user is done. A block also
//!   used on other streams ([`BlockCache::record_use`]) is, when freed, parked as *pending* until
//!   the caller reports those streams as having finished their work
//!   ([`BlockCache::process_events`], [`BlockCache::synchronize`]).
//! * **Out of memory.** When the device refuses a segment, the cache (1) returns every fully
//!   free cached segment to the device ([`BlockCache::empty_cache`]), (2) counts a retry
//!   (`num_alloc_retries`) and asks the device once more, and (3) if that fails too, counts an
//!   OOM (`num_ooms`) and returns [`CacheError::OutOfMemory`] with the bytes allocated and
//!   reserved at that point. Pending blocks are not released by this path: only the caller
//!   knows when other streams have finished.
//!
//! The device is reached only through the two-method [`RawDeviceAlloc`] trait, so the policy is
//! tested here over [`SimulatedDevice`] and runs unchanged over `cuMemAlloc`/`cuMemFree`.
//! Statistics use PyTorch's `torch.cuda.memory_stats()` key names ([`BlockCache::memory_stats`]).

mod cache;
mod sim;
mod stats;
// Not under Miri: the cache is safe code (no `unsafe` in it or its simulated device), so
// interpreting its tests finds nothing the test suite does not, and took four minutes there.
#[cfg(all(test, not(miri)))]
mod tests;

pub use cache::{BlockCache, BlockHandle, BlockId, BlockSnapshot, BlockState, SegmentSnapshot};
pub use sim::SimulatedDevice;
pub use stats::{MemoryStats, Stat, StatArray};

use std::fmt;

/// Requests are rounded up to a multiple of this many bytes; it is also the smallest block.
pub const MIN_BLOCK_SIZE: usize = 512;
/// The largest request served from the small pool (1 MiB).
pub const SMALL_SIZE: usize = 1 << 20;
/// The size of a small-pool segment (2 MiB).
pub const SMALL_BUFFER: usize = 2 << 20;
/// The size of a large-pool segment for requests below [`MIN_LARGE_ALLOC`] (20 MiB).
pub const LARGE_BUFFER: usize = 20 << 20;
/// Requests of at least this size (10 MiB) get a segment of their own.
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// Segments of their own are rounded up to a multiple of this size (2 MiB).
pub const ROUND_LARGE: usize = 2 << 20;

/// A device address, as returned by the device's allocator (`CUdeviceptr` for CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address as an integer.
    pub fn addr(self) -> u64 {
        self.0
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A device stream (a CUDA stream): work submitted to one stream runs in submission order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

impl StreamId {
    /// The default stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// Why the device's own allocator gave no memory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawAllocError {
    /// The device has no memory left: the cache returns its free segments and tries once more.
    OutOfMemory,
    /// The device failed for another reason (for CUDA, any error of `cuMemAlloc` but
    /// out-of-memory, such as a sticky fault left by a kernel): the driver's message. Retrying
    /// or flushing the cache cannot help, so the cache reports it as it is.
    Device(String),
}

impl fmt::Display for RawAllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawAllocError::OutOfMemory => f.write_str("the device is out of memory"),
            RawAllocError::Device(msg) => write!(f, "the device failed: {msg}"),
        }
    }
}

impl std::error::Error for RawAllocError {}

/// The device's own allocator, which [`BlockCache`] calls only to get and return whole segments.
///
/// A CUDA implementation is `cuMemAlloc` / `cuMemFree`; [`SimulatedDevice`] is a fake one for
/// tests. Implementations return addresses aligned to at least [`MIN_BLOCK_SIZE`] bytes.
pub trait RawDeviceAlloc {
    /// Allocates `bytes` bytes of device memory, or reports that the device has none left
    /// ([`RawAllocError::OutOfMemory`]) or failed otherwise ([`RawAllocError::Device`]).
    fn malloc(&mut self, bytes: usize) -> Result<DevicePtr, RawAllocError>;
    /// Returns memory obtained from [`RawDeviceAlloc::malloc`]; `ptr` is the address it returned.
    fn free(&mut self, ptr: DevicePtr);
}

/// Which pool, and so which kind of segment, serves a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// Requests of at most [`SMALL_SIZE`] bytes, in [`SMALL_BUFFER`] segments.
    Small,
    /// Requests above [`SMALL_SIZE`] bytes.
    Large,
}

/// Errors of the block cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The device could not provide a segment, even after the cache returned its free segments.
    #[error(
        "out of device memory: requested {requested} bytes with {allocated} allocated and {reserved} reserved"
    )]
    OutOfMemory {
        /// Bytes the caller asked for.
        requested: usize,
        /// Bytes in live (allocated) blocks at the time.
        allocated: usize,
        /// Bytes held from the device at the time (after returning the free segments).
        reserved: usize,
    },
    /// The device failed to allocate for a reason other than a lack of memory (the driver's
    /// message); the cache was not emptied for it.
    #[error("the device failed to allocate {requested} bytes: {msg}")]
    Device {
        /// Bytes the caller asked for.
        requested: usize,
        /// What the device reported.
        msg: String,
    },
    /// The handle is not a live allocation of this cache: it was already freed, or never came
    /// from it.
    #[error("{id} is not a live allocation of this cache (double free or foreign handle)")]
    UnknownBlock {
        /// The id in the handle.
        id: BlockId,
    },
}

/// Rounds a request up to a multiple of [`MIN_BLOCK_SIZE`] (a 0-byte request gets
/// [`MIN_BLOCK_SIZE`]); `None` when the result would overflow `usize`.
pub fn round_size(bytes: usize) -> Option<usize> {
    if bytes < MIN_BLOCK_SIZE {
        return Some(MIN_BLOCK_SIZE);
    }
    Some(bytes.checked_add(MIN_BLOCK_SIZE - 1)? / MIN_BLOCK_SIZE * MIN_BLOCK_SIZE)
}

/// The pool that serves a request of `rounded` bytes (already rounded by [`round_size`]).
pub fn pool_for(rounded: usize) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The size of the segment the cache asks the device for when no cached block fits a request
/// of `rounded` bytes; `None` when it would overflow `usize`.
pub fn segment_size(rounded: usize) -> Option<usize> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_BUFFER)
    } else {
        Some(rounded.checked_add(ROUND_LARGE - 1)? / ROUND_LARGE * ROUND_LARGE)
    }
}

/// Whether a block of `block_size` bytes in `pool` is split when `rounded` bytes of it are
/// taken: the remainder must be at least [`MIN_BLOCK_SIZE`] (small pool) or more than
/// [`SMALL_SIZE`] (large pool).
pub fn should_split(pool: Pool, block_size: usize, rounded: usize) -> bool {
    let remaining = block_size.saturating_sub(rounded);
    match pool {
        Pool::Small => remaining >= MIN_BLOCK_SIZE,
        Pool::Large => remaining > SMALL_SIZE,
    }
}
