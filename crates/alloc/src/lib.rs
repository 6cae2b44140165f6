//! Memory for arenagrad.
//!
//! An eager autodiff engine allocates a buffer for every intermediate value of every iteration, and
//! nearly all of them die together when the iteration ends. This crate owns that memory so that the
//! rest of the engine never holds a raw pointer:
//!
//! * [`Arena`] is the host side: a [`bumpalo`] bump per iteration. Buffers are named by [`BufId`]
//!   handles (slot index plus the arena's epoch), read and written through safe accessors, and freed
//!   all at once by [`Arena::reset`] in O(1). Buffers that die early (the gradient of an intermediate
//!   once its backward rule has run) go to an exact-size free list and are reused within the same
//!   iteration, which keeps backward's peak near the forward's activations.
//! * [`block_cache`] is the device side: PyTorch-style caching of device memory in segments carved
//!   into blocks, written against the [`block_cache::RawDeviceAlloc`] trait so that the policy is
//!   tested over a simulated device and runs unchanged over CUDA.
//! * [`DeviceArena`] is the device side of an iteration: its buffers are blocks of a
//!   [`block_cache::BlockCache`], named by [`BufId`] handles like the host arena's, and all go back
//!   to the cache at [`DeviceArena::reset`], so a steady loop allocates from the device only in its
//!   first iteration.
//!
//! A handle from an earlier iteration, or to a buffer already recycled, is a typed
//! [`AllocError::StaleBuffer`] — never a read of whatever lives there now.

mod arena;
pub mod block_cache;
mod device_arena;
mod mapped;

pub use arena::{
    try_zeroed_vec, zeroed_vec, AllocSplit, Arena, ArenaMark, ArenaStats, Bool, BufId, MixedSplit,
    Pod, TwoOuts,
};
pub use device_arena::{DeviceArena, DeviceArenaStats};
pub use mapped::MappedFile;

/// Errors of the memory layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The handle names a buffer of an earlier iteration, or one that was recycled.
    #[error("stale buffer handle (slot {slot}, epoch {epoch}; arena is at epoch {current})")]
    StaleBuffer {
        /// Slot index in the handle.
        slot: u32,
        /// Epoch stored in the handle (for a [`DeviceArena`] handle, the slot's generation).
        epoch: u32,
        /// The arena's current epoch (for a [`DeviceArena`], the slot's current generation).
        current: u32,
    },
    /// The buffer holds elements of another type than the one asked for.
    #[error("buffer holds {stored} but was read as {requested}")]
    WrongType {
        /// Type the buffer was allocated with.
        stored: &'static str,
        /// Type requested by the caller.
        requested: &'static str,
    },
    /// A write to a buffer the arena shares with its owner (a parameter read in place).
    #[error("buffer slot {slot} is shared read-only and cannot be written")]
    ReadOnly {
        /// The slot in question.
        slot: u32,
    },
    /// The same buffer was asked for as output and as input of one kernel.
    #[error("buffer slot {slot} is both the output and an input")]
    Aliased {
        /// The slot in question.
        slot: u32,
    },
    /// A buffer to be rewritten in place ([`Arena::split_unique`]) has other owners (views
    /// share it), so writing it would change their values too.
    #[error("buffer slot {slot} has {holders} owners and cannot be rewritten in place")]
    NotUnique {
        /// The slot in question.
        slot: u32,
        /// How many owners it has.
        holders: u32,
    },
    /// A request whose byte size does not fit in `usize`.
    #[error("a buffer of {elems} elements of {elem_bytes} bytes overflows the address space")]
    TooLarge {
        /// Elements requested.
        elems: usize,
        /// Bytes per element.
        elem_bytes: usize,
    },
    /// The device failed to allocate for a reason other than a lack of memory (for CUDA a
    /// driver error, such as a fault left by an earlier kernel): the driver's message.
    #[error("device allocation of {requested} bytes failed: {msg}")]
    Device {
        /// Bytes requested.
        requested: usize,
        /// What the device reported.
        msg: String,
    },
    /// The device (or the host) could not provide the memory.
    #[error(
        "out of memory: requested {requested} bytes with {allocated} allocated and {reserved} reserved"
    )]
    OutOfMemory {
        /// Bytes requested.
        requested: usize,
        /// Bytes handed out to live blocks at the time.
        allocated: usize,
        /// Bytes held from the device at the time.
        reserved: usize,
    },
}
