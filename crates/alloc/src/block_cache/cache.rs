//! The cache itself: segments, blocks, the free sets and the allocation algorithm.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::stats::MemoryStats;
use super::{
    pool_for, round_size, segment_size, should_split, CacheError, DevicePtr, Pool, RawAllocError,
    RawDeviceAlloc, StreamId,
};

/// Names one allocation made by a [`BlockCache`]: the block's slot and a serial number unique
/// to the allocation, so that a handle kept after its `free` is recognised as stale even when
/// the slot holds another block by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId {
    slot: usize,
    serial: u64,
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {} (allocation #{})", self.slot, self.serial)
    }
}

/// A live allocation, as returned by [`BlockCache::alloc`] and given back to
/// [`BlockCache::free`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHandle {
    /// The first byte of the block on the device.
    pub ptr: DevicePtr,
    /// The block's size: the rounded request, or more when the rest of a large block was too
    /// small to split off. The caller may use all of it.
    pub size: usize,
    /// The allocation's id.
    pub id: BlockId,
}

/// What a block is being used for, as shown by [`BlockCache::snapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Cached: reusable by its stream.
    Free,
    /// Handed out and not freed.
    Allocated,
    /// Freed, but other streams that used it may not have finished with it.
    Pending,
}

/// One block of a segment, as shown by [`BlockCache::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSnapshot {
    /// The first byte of the block.
    pub ptr: DevicePtr,
    /// The block's size.
    pub size: usize,
    /// What the block is used for.
    pub state: BlockState,
}

/// One segment held from the device, as shown by [`BlockCache::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSnapshot {
    /// The segment's address, as the device returned it.
    pub ptr: DevicePtr,
    /// The segment's size.
    pub size: usize,
    /// The pool the segment belongs to.
    pub pool: Pool,
    /// The stream whose allocations the segment serves.
    pub stream: StreamId,
    /// The segment's blocks, by address; they tile the segment exactly.
    pub blocks: Vec<BlockSnapshot>,
}

#[derive(Debug, Clone)]
enum Use {
    Free,
    Allocated {
        serial: u64,
        requested: usize,
        /// Streams other than the block's own that used it (`record_use`).
        stream_uses: Vec<StreamId>,
    },
    Pending {
        /// Streams that must finish their work before the block is reusable.
        awaiting: Vec<StreamId>,
    },
}

/// A block: a piece of a segment, linked to its neighbours in the segment by slot.
#[derive(Debug, Clone)]
struct Node {
    addr: u64,
    size: usize,
    pool: Pool,
    stream: StreamId,
    prev: Option<usize>,
    next: Option<usize>,
    state: Use,
}

#[derive(Debug, Clone)]
struct Segment {
    size: usize,
    pool: Pool,
    stream: StreamId,
    /// The slot of the segment's first block. Merging always keeps the lower block's slot, and
    /// splitting gives the upper part a new slot, so the head's slot never changes.
    head: usize,
}

/// A free block's key in its pool: ordered by stream, then size (best fit), then address.
type FreeKey = (StreamId, usize, u64, usize);

/// A caching allocator of device memory over a [`RawDeviceAlloc`]; the policy is described in
/// the [module documentation](super).
///
/// Dropping the cache does not give memory back to the device; call
/// [`BlockCache::empty_cache`] first, after freeing every block.
#[derive(Debug)]
pub struct BlockCache<D: RawDeviceAlloc> {
    device: D,
    /// The slab of blocks; `None` for a vacant slot.
    nodes: Vec<Option<Node>>,
    vacant: Vec<usize>,
    small_free: BTreeSet<FreeKey>,
    large_free: BTreeSet<FreeKey>,
    /// Live segments by address.
    segments: BTreeMap<u64, Segment>,
    /// Slots of the blocks in state `Pending`.
    pending: BTreeSet<usize>,
    next_serial: u64,
    stats: MemoryStats,
}

impl<D: RawDeviceAlloc> BlockCache<D> {
    /// An empty cache over `device`; it holds no memory until the first allocation.
    pub fn new(device: D) -> Self {
        BlockCache {
            device,
            nodes: Vec::new(),
            vacant: Vec::new(),
            small_free: BTreeSet::new(),
            large_free: BTreeSet::new(),
            segments: BTreeMap::new(),
            pending: BTreeSet::new(),
            next_serial: 0,
            stats: MemoryStats::default(),
        }
    }

    /// The device the cache allocates from.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, mutably (a test's [`SimulatedDevice`](super::SimulatedDevice) is told to fail through it). Segments
    /// the cache holds must not be freed through it.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// Allocates at least `bytes` bytes for use on `stream`.
    ///
    /// Takes the best-fitting cached block of the request's pool and stream, or else a new
    /// segment from the device. When the device refuses, the cache returns its fully free
    /// segments ([`BlockCache::empty_cache`]) and asks once more (counted in
    /// `num_alloc_retries`); if that fails too the request fails with
    /// [`CacheError::OutOfMemory`] (counted in `num_ooms`).
    pub fn alloc(&mut self, bytes: usize, stream: StreamId) -> Result<BlockHandle, CacheError> {
        let Some(rounded) = round_size(bytes) else {
            return Err(self.out_of_memory(bytes));
        };
        let pool = pool_for(rounded);
        let slot = match self.take_best_fit(pool, stream, rounded) {
            Some(slot) => slot,
            None => self.new_segment(bytes, rounded, pool, stream)?,
        };
        if should_split(pool, self.node(slot).size, rounded) {
            self.split(slot, rounded);
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let node = self.node_mut(slot);
        node.state = Use::Allocated {
            serial,
            requested: bytes,
            stream_uses: Vec::new(),
        };
        let (ptr, size) = (DevicePtr(node.addr), node.size);
        let stats = &mut self.stats;
        stats.allocation.increase(pool, 1);
        stats.allocated_bytes.increase(pool, size as u64);
        stats.active.increase(pool, 1);
        stats.active_bytes.increase(pool, size as u64);
        stats.requested_bytes.increase(pool, bytes as u64);
        Ok(BlockHandle {
            ptr,
            size,
            id: BlockId { slot, serial },
        })
    }

    /// Frees an allocation.
    ///
    /// A block used only on its own stream is reusable by that stream at once (later work on
    /// the stream runs after the work already submitted). A block also used on other streams
    /// ([`BlockCache::record_use`]) becomes pending until [`BlockCache::process_events`] or
    /// [`BlockCache::synchronize`] reports those streams done. Either way it stops counting as
    /// allocated now. A handle that is not live (freed already, or from another cache) is
    /// [`CacheError::UnknownBlock`] and changes nothing.
    pub fn free(&mut self, handle: BlockHandle) -> Result<(), CacheError> {
        let slot = self.live_slot(&handle)?;
        let node = self.node_mut(slot);
        let Use::Allocated {
            requested,
            stream_uses,
            ..
        } = std::mem::replace(&mut node.state, Use::Free)
        else {
            unreachable!("live_slot checked the block is allocated");
        };
        let (pool, size) = (node.pool, node.size);
        let stats = &mut self.stats;
        stats.allocation.decrease(pool, 1);
        stats.allocated_bytes.decrease(pool, size as u64);
        stats.requested_bytes.decrease(pool, requested as u64);
        if stream_uses.is_empty() {
            self.release(slot);
        } else {
            self.node_mut(slot).state = Use::Pending {
                awaiting: stream_uses,
            };
            self.pending.insert(slot);
        }
        Ok(())
    }

    /// Records that the allocation is used on `stream` too, so that freeing it waits for that
    /// stream (PyTorch's `recordStream`). Using it on its own stream needs no record.
    pub fn record_use(&mut self, handle: &BlockHandle, stream: StreamId) -> Result<(), CacheError> {
        let slot = self.live_slot(handle)?;
        let node = self.node_mut(slot);
        let own = node.stream;
        if let Use::Allocated { stream_uses, .. } = &mut node.state {
            if stream != own && !stream_uses.contains(&stream) {
                stream_uses.push(stream);
            }
        }
        Ok(())
    }

    /// Releases the pending blocks whose streams are all done, and returns how many were
    /// released. `completed(s)` must return true only if every piece of work submitted to
    /// stream `s` so far has finished (as `cudaStreamQuery` reports); it is asked once per
    /// stream.
    pub fn process_events(&mut self, mut completed: impl FnMut(StreamId) -> bool) -> usize {
        let mut asked: BTreeMap<StreamId, bool> = BTreeMap::new();
        let mut released = Vec::new();
        for &slot in &self.pending {
            let Some(Node {
                state: Use::Pending { awaiting },
                ..
            }) = self.nodes[slot].as_mut()
            else {
                unreachable!("pending set holds a block that is not pending");
            };
            awaiting.retain(|&s| !*asked.entry(s).or_insert_with(|| completed(s)));
            if awaiting.is_empty() {
                released.push(slot);
            }
        }
        for &slot in &released {
            self.pending.remove(&slot);
            self.release(slot);
        }
        released.len()
    }

    /// Releases every pending block, for a caller that has synchronised the device (every
    /// stream is done); returns how many were released.
    pub fn synchronize(&mut self) -> usize {
        self.process_events(|_| true)
    }

    /// Returns every fully free segment to the device (PyTorch's `empty_cache`); segments with
    /// an allocated or pending block stay. Returns the number of bytes given back.
    pub fn empty_cache(&mut self) -> usize {
        let idle: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, seg)| {
                let head = self.node(seg.head);
                matches!(head.state, Use::Free) && head.next.is_none()
            })
            .map(|(&addr, _)| addr)
            .collect();
        let mut bytes = 0;
        for addr in idle {
            let seg = self.segments.remove(&addr).expect("listed above");
            debug_assert_eq!(self.node(seg.head).size, seg.size);
            let key = self.free_key(seg.head);
            let removed = self.free_set(seg.pool).remove(&key);
            debug_assert!(removed, "a free block missing from its free set");
            self.vacate(seg.head);
            self.device.free(DevicePtr(addr));
            self.stats.segment.decrease(seg.pool, 1);
            self.stats
                .reserved_bytes
                .decrease(seg.pool, seg.size as u64);
            self.stats.num_device_free += 1;
            bytes += seg.size;
        }
        bytes
    }

    /// The statistics.
    pub fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    /// The statistics under PyTorch's `torch.cuda.memory_stats()` key names (see
    /// [`MemoryStats::to_map`]), e.g. `allocated_bytes.all.current`,
    /// `reserved_bytes.large_pool.peak`, `num_alloc_retries`.
    pub fn memory_stats(&self) -> BTreeMap<String, u64> {
        self.stats.to_map()
    }

    /// Sets every peak statistic to its current value.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// Sets the running totals and the counters to zero.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Number of freed blocks still waiting on other streams.
    pub fn num_pending(&self) -> usize {
        self.pending.len()
    }

    /// Every segment and its blocks, by address (PyTorch's `memory_snapshot`).
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        self.segments
            .iter()
            .map(|(&addr, seg)| {
                let mut blocks = Vec::new();
                let mut cursor = Some(seg.head);
                while let Some(slot) = cursor {
                    let node = self.node(slot);
                    blocks.push(BlockSnapshot {
                        ptr: DevicePtr(node.addr),
                        size: node.size,
                        state: match node.state {
                            Use::Free => BlockState::Free,
                            Use::Allocated { .. } => BlockState::Allocated,
                            Use::Pending { .. } => BlockState::Pending,
                        },
                    });
                    cursor = node.next;
                }
                SegmentSnapshot {
                    ptr: DevicePtr(addr),
                    size: seg.size,
                    pool: seg.pool,
                    stream: seg.stream,
                    blocks,
                }
            })
            .collect()
    }

    // ---- internals ----

    fn node(&self, slot: usize) -> &Node {
        self.nodes[slot].as_ref().expect("vacant block slot")
    }

    fn node_mut(&mut self, slot: usize) -> &mut Node {
        self.nodes[slot].as_mut().expect("vacant block slot")
    }

    fn free_set(&mut self, pool: Pool) -> &mut BTreeSet<FreeKey> {
        match pool {
            Pool::Small => &mut self.small_free,
            Pool::Large => &mut self.large_free,
        }
    }

    fn free_key(&self, slot: usize) -> FreeKey {
        let node = self.node(slot);
        (node.stream, node.size, node.addr, slot)
    }

    fn insert_node(&mut self, node: Node) -> usize {
        match self.vacant.pop() {
            Some(slot) => {
                self.nodes[slot] = Some(node);
                slot
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    fn vacate(&mut self, slot: usize) {
        self.nodes[slot] = None;
        self.vacant.push(slot);
    }

    /// The slot of the live allocation `handle` names, or `UnknownBlock`.
    fn live_slot(&self, handle: &BlockHandle) -> Result<usize, CacheError> {
        let BlockId { slot, serial } = handle.id;
        match self.nodes.get(slot).and_then(Option::as_ref) {
            Some(Node {
                addr,
                size,
                state: Use::Allocated { serial: s, .. },
                ..
            }) if *s == serial && *addr == handle.ptr.0 && *size == handle.size => Ok(slot),
            _ => Err(CacheError::UnknownBlock { id: handle.id }),
        }
    }

    /// Removes and returns the smallest free block of `pool` on `stream` with at least
    /// `rounded` bytes (the lowest address among equals).
    fn take_best_fit(&mut self, pool: Pool, stream: StreamId, rounded: usize) -> Option<usize> {
        let set = self.free_set(pool);
        let key = *set
            .range((stream, rounded, 0, 0)..)
            .next()
            .filter(|key| key.0 == stream)?;
        set.remove(&key);
        Some(key.3)
    }

    /// Gets a segment for a request from the device, emptying the cache and retrying once on
    /// failure; returns the slot of the segment's single (free, unlisted) block.
    fn new_segment(
        &mut self,
        bytes: usize,
        rounded: usize,
        pool: Pool,
        stream: StreamId,
    ) -> Result<usize, CacheError> {
        let Some(size) = segment_size(rounded) else {
            return Err(self.out_of_memory(bytes));
        };
        let device_failed = |msg| CacheError::Device {
            requested: bytes,
            msg,
        };
        let ptr = match self.device.malloc(size) {
            Ok(ptr) => ptr,
            Err(RawAllocError::OutOfMemory) => {
                self.empty_cache();
                self.stats.num_alloc_retries += 1;
                match self.device.malloc(size) {
                    Ok(ptr) => ptr,
                    Err(RawAllocError::OutOfMemory) => return Err(self.out_of_memory(bytes)),
                    Err(RawAllocError::Device(msg)) => return Err(device_failed(msg)),
                }
            }
            // Not a lack of memory: emptying the cache would not help (and a faulted context
            // may fail the frees too).
            Err(RawAllocError::Device(msg)) => return Err(device_failed(msg)),
        };
        let slot = self.insert_node(Node {
            addr: ptr.0,
            size,
            pool,
            stream,
            prev: None,
            next: None,
            state: Use::Free,
        });
        let previous = self.segments.insert(
            ptr.0,
            Segment {
                size,
                pool,
                stream,
                head: slot,
            },
        );
        assert!(
            previous.is_none(),
            "the device returned {ptr}, an address of a live segment"
        );
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size as u64);
        self.stats.num_device_alloc += 1;
        Ok(slot)
    }

    fn out_of_memory(&mut self, requested: usize) -> CacheError {
        self.stats.num_ooms += 1;
        CacheError::OutOfMemory {
            requested,
            allocated: self.stats.allocated_bytes.all.current as usize,
            reserved: self.stats.reserved_bytes.all.current as usize,
        }
    }

    /// Cuts the block in `slot` (taken out of its free set) to `rounded` bytes; the rest becomes
    /// a free block after it.
    fn split(&mut self, slot: usize, rounded: usize) {
        let node = self.node(slot);
        let rest = Node {
            addr: node.addr + rounded as u64,
            size: node.size - rounded,
            pool: node.pool,
            stream: node.stream,
            prev: Some(slot),
            next: node.next,
            state: Use::Free,
        };
        let (pool, next) = (rest.pool, rest.next);
        let rest_slot = self.insert_node(rest);
        if let Some(next) = next {
            self.node_mut(next).prev = Some(rest_slot);
        }
        let node = self.node_mut(slot);
        node.size = rounded;
        node.next = Some(rest_slot);
        let key = self.free_key(rest_slot);
        self.free_set(pool).insert(key);
    }

    /// Makes a freed block free: merges it with free neighbours and lists it for reuse.
    fn release(&mut self, slot: usize) {
        let node = self.node_mut(slot);
        node.state = Use::Free;
        let (pool, size, prev, next) = (node.pool, node.size, node.prev, node.next);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size as u64);
        let mut slot = slot;
        if let Some(prev) = prev.filter(|&p| matches!(self.node(p).state, Use::Free)) {
            let key = self.free_key(prev);
            self.free_set(pool).remove(&key);
            self.absorb(prev, slot);
            slot = prev;
        }
        if let Some(next) = next.filter(|&n| matches!(self.node(n).state, Use::Free)) {
            let key = self.free_key(next);
            self.free_set(pool).remove(&key);
            self.absorb(slot, next);
        }
        let key = self.free_key(slot);
        self.free_set(pool).insert(key);
    }

    /// Merges block `hi` into the block `lo` just before it, and vacates `hi`'s slot.
    fn absorb(&mut self, lo: usize, hi: usize) {
        let hi_node = self.nodes[hi].take().expect("vacant block slot");
        self.vacant.push(hi);
        debug_assert_eq!(self.node(lo).next, Some(hi));
        if let Some(next) = hi_node.next {
            self.node_mut(next).prev = Some(lo);
        }
        let lo_node = self.node_mut(lo);
        debug_assert_eq!(lo_node.addr + lo_node.size as u64, hi_node.addr);
        lo_node.size += hi_node.size;
        lo_node.next = hi_node.next;
    }
}
