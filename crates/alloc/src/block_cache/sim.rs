//! A fake device for testing the cache's policy without a GPU.

use std::collections::BTreeMap;

use super::{DevicePtr, RawAllocError, RawDeviceAlloc, MIN_BLOCK_SIZE};

/// The first address [`SimulatedDevice`] hands out.
const BASE_ADDR: u64 = 0x7f00_0000_0000;
/// Unused bytes left between two segments, so that segments are never adjacent and a cache that
/// merged blocks across segments would produce ranges the device does not recognise.
const GUARD_GAP: u64 = 4096;

/// A fake device: a capacity in bytes and an address space that is never backed by memory.
///
/// It hands out addresses aligned to [`MIN_BLOCK_SIZE`], never reuses an address, refuses
/// ([`RawAllocError::OutOfMemory`]) any allocation that would take the live bytes past the capacity (and any
/// 0-byte one), and counts calls. Freeing an address that is not the start of a live segment panics: for a test that is
/// a bug of the cache, which a real driver might not report.
#[derive(Debug, Clone)]
pub struct SimulatedDevice {
    capacity: usize,
    used: usize,
    next_addr: u64,
    /// Live segments: start address to size.
    live: BTreeMap<u64, usize>,
    malloc_calls: u64,
    failed_mallocs: u64,
    free_calls: u64,
    /// A failure other than out-of-memory for the next `malloc` (see [`SimulatedDevice::fail_next`]).
    fault: Option<String>,
}

impl SimulatedDevice {
    /// A device with `capacity` bytes of memory.
    pub fn new(capacity: usize) -> Self {
        SimulatedDevice {
            capacity,
            used: 0,
            next_addr: BASE_ADDR,
            live: BTreeMap::new(),
            malloc_calls: 0,
            failed_mallocs: 0,
            free_calls: 0,
            fault: None,
        }
    }

    /// Makes the next `malloc` fail with [`RawAllocError::Device`] carrying `msg`, as a driver
    /// does after a kernel fault.
    pub fn fail_next(&mut self, msg: impl Into<String>) {
        self.fault = Some(msg.into());
    }

    /// The capacity given to [`SimulatedDevice::new`].
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes in live segments.
    pub fn used_bytes(&self) -> usize {
        self.used
    }

    /// Calls of [`RawDeviceAlloc::malloc`], failed ones included.
    pub fn malloc_calls(&self) -> u64 {
        self.malloc_calls
    }

    /// Calls of [`RawDeviceAlloc::malloc`] that failed.
    pub fn failed_mallocs(&self) -> u64 {
        self.failed_mallocs
    }

    /// Calls of [`RawDeviceAlloc::free`].
    pub fn free_calls(&self) -> u64 {
        self.free_calls
    }

    /// The number of live segments.
    pub fn num_live_segments(&self) -> usize {
        self.live.len()
    }

    /// The live segments, as (start, size), by address.
    pub fn live_segments(&self) -> Vec<(DevicePtr, usize)> {
        self.live
            .iter()
            .map(|(&addr, &size)| (DevicePtr(addr), size))
            .collect()
    }

    /// The live segment that contains the whole range `[ptr, ptr + size)`, if any.
    pub fn segment_containing(&self, ptr: DevicePtr, size: usize) -> Option<(DevicePtr, usize)> {
        let (&start, &seg_size) = self.live.range(..=ptr.0).next_back()?;
        let end = ptr.0.checked_add(size as u64)?;
        (end <= start + seg_size as u64).then_some((DevicePtr(start), seg_size))
    }

    /// Panics unless the range `[ptr, ptr + size)` lies inside one live segment.
    #[track_caller]
    pub fn assert_range_live(&self, ptr: DevicePtr, size: usize) {
        assert!(
            self.segment_containing(ptr, size).is_some(),
            "range [{ptr}, +{size}) is not inside a live segment; live: {:?}",
            self.live_segments()
        );
    }

    /// Panics unless the device has no live segment (everything was given back).
    #[track_caller]
    pub fn assert_no_live_segments(&self) {
        assert!(
            self.live.is_empty() && self.used == 0,
            "{} live segments ({} bytes) remain: {:?}",
            self.live.len(),
            self.used,
            self.live_segments()
        );
    }
}

impl RawDeviceAlloc for SimulatedDevice {
    fn malloc(&mut self, bytes: usize) -> Result<DevicePtr, RawAllocError> {
        self.malloc_calls += 1;
        if let Some(msg) = self.fault.take() {
            self.failed_mallocs += 1;
            return Err(RawAllocError::Device(msg));
        }
        let fits = self
            .used
            .checked_add(bytes)
            .is_some_and(|total| total <= self.capacity);
        // The address space is 64-bit; a request that could not fit in it cannot fit the capacity.
        if !fits || bytes == 0 {
            self.failed_mallocs += 1;
            return Err(RawAllocError::OutOfMemory);
        }
        let addr = self.next_addr;
        let span = (bytes as u64).div_ceil(MIN_BLOCK_SIZE as u64) * MIN_BLOCK_SIZE as u64;
        self.next_addr = addr + span + GUARD_GAP;
        self.used += bytes;
        self.live.insert(addr, bytes);
        Ok(DevicePtr(addr))
    }

    fn free(&mut self, ptr: DevicePtr) {
        self.free_calls += 1;
        match self.live.remove(&ptr.0) {
            Some(size) => self.used -= size,
            None => panic!("SimulatedDevice::free({ptr}): not the start of a live segment"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_counts_and_alignment() {
        let mut dev = SimulatedDevice::new(10_000);
        let a = dev.malloc(4000).unwrap();
        let b = dev.malloc(6000).unwrap();
        assert_eq!(a.0 % MIN_BLOCK_SIZE as u64, 0);
        assert_eq!(b.0 % MIN_BLOCK_SIZE as u64, 0);
        assert!(b.0 >= a.0 + 4000 + GUARD_GAP, "segments are not adjacent");
        assert_eq!(dev.malloc(1), Err(RawAllocError::OutOfMemory));
        assert_eq!(dev.malloc(0), Err(RawAllocError::OutOfMemory));
        assert_eq!((dev.malloc_calls(), dev.failed_mallocs()), (4, 2));
        assert_eq!(dev.used_bytes(), 10_000);
        assert_eq!(
            dev.segment_containing(DevicePtr(a.0 + 100), 3900),
            Some((a, 4000))
        );
        assert_eq!(dev.segment_containing(DevicePtr(a.0 + 100), 3901), None);
        assert_eq!(dev.segment_containing(DevicePtr(a.0 - 1), 1), None);
        dev.assert_range_live(b, 6000);
        dev.free(a);
        assert_eq!(dev.used_bytes(), 6000);
        assert_eq!(dev.live_segments(), vec![(b, 6000)]);
        let c = dev.malloc(4000).unwrap();
        assert!(c.0 > b.0, "addresses are never reused");
        dev.free(b);
        dev.free(c);
        assert_eq!(dev.free_calls(), 3);
        dev.assert_no_live_segments();
    }

    #[test]
    #[should_panic(expected = "not the start of a live segment")]
    fn freeing_an_unknown_pointer_panics() {
        let mut dev = SimulatedDevice::new(1 << 20);
        let a = dev.malloc(1024).unwrap();
        dev.free(DevicePtr(a.0 + 512));
    }
}
