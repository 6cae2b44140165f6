//! The per-iteration device arena.
//!
//! The device counterpart of [`Arena`](crate::Arena): the buffers of one iteration's
//! intermediate values live in blocks of a [`BlockCache`], named by [`BufId`] handles, and all go
//! back to the cache when the iteration ends ([`DeviceArena::reset`]). Because the cache keeps
//! the segments it got from the device, a steady loop asks the device for memory only during its
//! first iteration.
//!
//! The arena does not own the cache: a cache serves one device and is shared by every graph on
//! it (behind a mutex), so each method that takes or gives back memory borrows it.

use crate::block_cache::{
    BlockCache, BlockHandle, CacheError, DevicePtr, RawDeviceAlloc, StreamId,
};
use crate::{AllocError, BufId};

/// One entry of the arena's slot table.
#[derive(Debug, Clone)]
struct Slot {
    /// The block while the buffer is live; `None` once it went back to the cache.
    block: Option<BlockHandle>,
    /// Bytes the caller asked for (the block may be larger).
    requested: usize,
    /// How many owners share the buffer (zero-copy views each hold one).
    holders: u32,
    /// Incremented every time the slot's buffer dies (recycled or reset); a handle is valid only
    /// while it carries the slot's current generation.
    generation: u32,
}

/// Memory statistics of a [`DeviceArena`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceArenaStats {
    /// Bytes of the blocks held by live buffers (block sizes: at least the rounded requests).
    pub bytes_in_use: usize,
    /// The highest `bytes_in_use` since the arena was made (or since
    /// [`DeviceArena::reset_peak`]).
    pub peak_bytes: usize,
    /// Live buffers right now.
    pub live_buffers: usize,
    /// Buffers handed out since the arena was made (all iterations).
    pub allocs: u64,
    /// Number of resets so far.
    pub resets: u64,
}

/// The buffers of one iteration on a device, carved from a [`BlockCache`].
///
/// * [`DeviceArena::alloc`] takes a block from the cache and returns a [`BufId`] for it;
///   [`DeviceArena::ptr`] gives its device address.
/// * [`DeviceArena::retain`] adds an owner (a zero-copy view), [`DeviceArena::recycle`] drops
///   one; when the last owner lets go the block goes back to the cache at once and serves the next
///   request of the iteration. Reuse is safe without waiting for the device because work on a
///   stream runs in submission order and the engine uses one stream per device: a kernel queued
///   later cannot touch the block before the kernels that used it are done.
/// * [`DeviceArena::reset`] ends the iteration: every live block goes back to the cache.
///
/// # Handles
///
/// Slots of dead buffers are reused, and every slot carries a generation that is incremented
/// each time its buffer dies. A [`BufId`] holds the slot and the generation it was made with
/// (in the field that host-arena handles use for the epoch), so a handle kept after its buffer
/// was recycled or reset is a [`AllocError::StaleBuffer`] error even when the slot holds another
/// buffer by then: a (slot, generation) pair is handed out again only after the slot has been
/// reused 2³² times. In a `StaleBuffer` error from this arena, `epoch` is the handle's generation
/// and `current` the slot's (0 for a slot this arena does not have).
///
/// Handles of a host [`Arena`](crate::Arena) and of other device arenas have the same type;
/// passing one here is a logic error that the arena catches only when the slot does not match.
///
/// # Dropping
///
/// Dropping the arena does not give its live blocks back (it holds no cache to give them to):
/// call [`DeviceArena::reset`] first.
///
/// ```
/// use arenagrad_alloc::block_cache::{BlockCache, SimulatedDevice, StreamId};
/// use arenagrad_alloc::DeviceArena;
///
/// let mut cache = BlockCache::new(SimulatedDevice::new(1 << 30));
/// let mut arena = DeviceArena::new();
/// for _ in 0..3 {
///     let x = arena.alloc(&mut cache, 4 << 20, StreamId::DEFAULT).unwrap();
///     let y = arena.alloc(&mut cache, 100, StreamId::DEFAULT).unwrap();
///     assert_ne!(arena.ptr(x).unwrap(), arena.ptr(y).unwrap());
///     arena.recycle(&mut cache, y).unwrap();
///     assert!(arena.ptr(y).is_err()); // a stale handle is an error, not an address
///     arena.reset(&mut cache);
///     assert!(arena.ptr(x).is_err());
/// }
/// // One segment per pool, obtained in the first iteration and reused since.
/// assert_eq!(cache.memory_stats()["num_device_alloc"], 2);
/// ```
#[derive(Debug, Default)]
pub struct DeviceArena {
    slots: Vec<Slot>,
    /// Slots whose buffer is dead, reused last-in first-out.
    free_slots: Vec<u32>,
    stats: DeviceArenaStats,
}

impl DeviceArena {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// A buffer of at least `bytes` bytes (0 allowed) for use on `stream`. The handle differs
    /// from every other handle this arena has given out (up to generation wrap-around, see the
    /// type's documentation).
    ///
    /// When the cache cannot get the memory from the device the result is
    /// [`AllocError::OutOfMemory`] and the arena is unchanged.
    pub fn alloc<D: RawDeviceAlloc>(
        &mut self,
        cache: &mut BlockCache<D>,
        bytes: usize,
        stream: StreamId,
    ) -> Result<BufId, AllocError> {
        // Pick the slot first, so that nothing can fail once the cache has handed out a block.
        let reused = self.free_slots.last().copied();
        let index = match reused {
            Some(index) => index,
            None => u32::try_from(self.slots.len())
                .expect("invariant: fewer than 2^32 live device buffers"),
        };
        let block = cache.alloc(bytes, stream).map_err(|e| match e {
            CacheError::OutOfMemory {
                requested,
                allocated,
                reserved,
            } => AllocError::OutOfMemory {
                requested,
                allocated,
                reserved,
            },
            CacheError::Device { requested, msg } => AllocError::Device { requested, msg },
            CacheError::UnknownBlock { id } => {
                unreachable!("BlockCache::alloc reported an unknown block ({id})")
            }
        })?;
        let size = block.size;
        let generation = if reused.is_some() {
            self.free_slots.pop();
            let slot = &mut self.slots[index as usize];
            debug_assert!(slot.block.is_none(), "a live slot on the free list");
            slot.block = Some(block);
            slot.requested = bytes;
            slot.holders = 1;
            slot.generation
        } else {
            self.slots.push(Slot {
                block: Some(block),
                requested: bytes,
                holders: 1,
                generation: 0,
            });
            0
        };
        let stats = &mut self.stats;
        stats.bytes_in_use += size;
        stats.peak_bytes = stats.peak_bytes.max(stats.bytes_in_use);
        stats.live_buffers += 1;
        stats.allocs += 1;
        Ok(BufId::from_parts(index, generation))
    }

    /// The index of the live slot `id` names, or a `StaleBuffer` error.
    fn live_slot(&self, id: BufId) -> Result<usize, AllocError> {
        let index = id.slot() as usize;
        match self.slots.get(index) {
            Some(slot) if slot.block.is_some() && slot.generation == id.epoch() => Ok(index),
            other => Err(AllocError::StaleBuffer {
                slot: id.slot(),
                epoch: id.epoch(),
                current: other.map_or(0, |slot| slot.generation),
            }),
        }
    }

    fn block(&self, id: BufId) -> Result<(&Slot, BlockHandle), AllocError> {
        let slot = &self.slots[self.live_slot(id)?];
        let block = slot.block.expect("invariant: live_slot checked the block");
        Ok((slot, block))
    }

    /// The device address of a live buffer.
    pub fn ptr(&self, id: BufId) -> Result<DevicePtr, AllocError> {
        Ok(self.block(id)?.1.ptr)
    }

    /// The number of bytes asked for when the buffer was allocated (its block may be larger).
    pub fn bytes(&self, id: BufId) -> Result<usize, AllocError> {
        Ok(self.block(id)?.0.requested)
    }

    /// Adds an owner to a live buffer: a zero-copy view shares the block, which goes back to the
    /// cache only after every owner has called [`DeviceArena::recycle`] (or at the reset).
    pub fn retain(&mut self, id: BufId) -> Result<(), AllocError> {
        let index = self.live_slot(id)?;
        let slot = &mut self.slots[index];
        slot.holders = slot
            .holders
            .checked_add(1)
            .expect("invariant: fewer than 2^32 owners of one buffer");
        Ok(())
    }

    /// Drops one owner of a live buffer. When the last owner lets go, the block goes back to the
    /// cache at once (it may serve the next allocation on its stream) and every handle to the
    /// buffer becomes stale.
    ///
    /// # Panics
    ///
    /// If `cache` is not the cache the buffer was allocated from.
    pub fn recycle<D: RawDeviceAlloc>(
        &mut self,
        cache: &mut BlockCache<D>,
        id: BufId,
    ) -> Result<(), AllocError> {
        let index = self.live_slot(id)?;
        let slot = &mut self.slots[index];
        slot.holders -= 1;
        if slot.holders > 0 {
            return Ok(());
        }
        let block = slot
            .block
            .take()
            .expect("invariant: live_slot checked the block");
        slot.generation = slot.generation.wrapping_add(1);
        self.free_slots.push(id.slot());
        self.stats.bytes_in_use -= block.size;
        self.stats.live_buffers -= 1;
        give_back(cache, block);
        Ok(())
    }

    /// Ends the iteration: every live block goes back to the cache and every handle given out so
    /// far becomes stale.
    ///
    /// # Panics
    ///
    /// If `cache` is not the cache the buffers were allocated from.
    pub fn reset<D: RawDeviceAlloc>(&mut self, cache: &mut BlockCache<D>) {
        for slot in &mut self.slots {
            if let Some(block) = slot.block.take() {
                slot.generation = slot.generation.wrapping_add(1);
                slot.holders = 0;
                give_back(cache, block);
            }
        }
        // Every slot is free now; hand them out again from slot 0 upwards.
        let len = u32::try_from(self.slots.len()).expect("invariant: fewer than 2^32 slots");
        self.free_slots.clear();
        self.free_slots.extend((0..len).rev());
        self.stats.bytes_in_use = 0;
        self.stats.live_buffers = 0;
        self.stats.resets += 1;
    }

    /// Current statistics.
    pub fn stats(&self) -> DeviceArenaStats {
        self.stats
    }

    /// Restarts the peak at the current value.
    pub fn reset_peak(&mut self) {
        self.stats.peak_bytes = self.stats.bytes_in_use;
    }
}

/// Frees a block the arena took from `cache`.
fn give_back<D: RawDeviceAlloc>(cache: &mut BlockCache<D>, block: BlockHandle) {
    if let Err(e) = cache.free(block) {
        panic!("DeviceArena: {e}; the arena must be given the cache its buffers came from");
    }
}

// Not under Miri: safe code over the block cache's (see there).
#[cfg(all(test, not(miri)))]
mod tests;
