//! The cache's statistics, in PyTorch's shape.

use std::collections::BTreeMap;

use super::Pool;

/// One statistic: its current value, its peak since the last [`Stat::reset_peak`], and the
/// running totals of what was added to it and taken from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    /// The current value.
    pub current: u64,
    /// The largest value since creation or the last reset of the peak.
    pub peak: u64,
    /// The total ever added.
    pub allocated: u64,
    /// The total ever taken away.
    pub freed: u64,
}

impl Stat {
    fn increase(&mut self, amount: u64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    fn decrease(&mut self, amount: u64) {
        debug_assert!(self.current >= amount, "statistic went negative");
        self.current -= amount;
        self.freed += amount;
    }

    /// Sets the peak to the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// Sets the running totals (`allocated`, `freed`) to zero.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A statistic over all pools and for each pool (PyTorch's `StatArray`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray {
    /// Both pools together (`.all.` in the key names).
    pub all: Stat,
    /// The small pool (`.small_pool.`).
    pub small_pool: Stat,
    /// The large pool (`.large_pool.`).
    pub large_pool: Stat,
}

impl StatArray {
    /// The statistic of one pool.
    pub fn pool(&self, pool: Pool) -> &Stat {
        match pool {
            Pool::Small => &self.small_pool,
            Pool::Large => &self.large_pool,
        }
    }

    pub(super) fn increase(&mut self, pool: Pool, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(pool).increase(amount);
    }

    pub(super) fn decrease(&mut self, pool: Pool, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(pool).decrease(amount);
    }

    fn pool_mut(&mut self, pool: Pool) -> &mut Stat {
        match pool {
            Pool::Small => &mut self.small_pool,
            Pool::Large => &mut self.large_pool,
        }
    }

    fn for_each_mut(&mut self, f: impl Fn(&mut Stat)) {
        f(&mut self.all);
        f(&mut self.small_pool);
        f(&mut self.large_pool);
    }
}

/// Everything [`BlockCache`](super::BlockCache) counts; [`MemoryStats::to_map`] names it with
/// PyTorch's `torch.cuda.memory_stats()` keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Live allocations (blocks handed out and not yet freed), counted.
    pub allocation: StatArray,
    /// Segments held from the device, counted.
    pub segment: StatArray,
    /// Active blocks: allocated ones plus freed ones still pending on other streams, counted.
    pub active: StatArray,
    /// Bytes in live allocations (block sizes, so at least the rounded requests).
    pub allocated_bytes: StatArray,
    /// Bytes held from the device (the sizes of the segments).
    pub reserved_bytes: StatArray,
    /// Bytes in active blocks: allocated plus pending.
    pub active_bytes: StatArray,
    /// Bytes the callers asked for in live allocations, before rounding.
    pub requested_bytes: StatArray,
    /// Device allocations retried after returning the cached segments.
    pub num_alloc_retries: u64,
    /// Requests that failed with out of memory.
    pub num_ooms: u64,
    /// Successful device allocations (segments obtained).
    pub num_device_alloc: u64,
    /// Device frees (segments returned).
    pub num_device_free: u64,
}

impl MemoryStats {
    /// Sets every peak to its current value.
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            array.for_each_mut(Stat::reset_peak);
        }
    }

    /// Sets every running total to zero, the counters (`num_*`) included.
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            array.for_each_mut(Stat::reset_accumulated);
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 7] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.requested_bytes,
        ]
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 7] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The statistics under PyTorch's key names: `{name}.{all|small_pool|large_pool}.{current|
    /// peak|allocated|freed}` for `allocation`, `segment`, `active`, `allocated_bytes`,
    /// `reserved_bytes`, `active_bytes` and `requested_bytes`, plus `num_alloc_retries`,
    /// `num_ooms`, `num_device_alloc` and `num_device_free`.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        let mut map = BTreeMap::new();
        for (name, array) in self.arrays() {
            for (pool, stat) in [
                ("all", &array.all),
                ("small_pool", &array.small_pool),
                ("large_pool", &array.large_pool),
            ] {
                for (field, value) in [
                    ("current", stat.current),
                    ("peak", stat.peak),
                    ("allocated", stat.allocated),
                    ("freed", stat.freed),
                ] {
                    map.insert(format!("{name}.{pool}.{field}"), value);
                }
            }
        }
        map.insert("num_alloc_retries".to_owned(), self.num_alloc_retries);
        map.insert("num_ooms".to_owned(), self.num_ooms);
        map.insert("num_device_alloc".to_owned(), self.num_device_alloc);
        map.insert("num_device_free".to_owned(), self.num_device_free);
        map
    }
}
