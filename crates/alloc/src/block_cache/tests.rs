//! Tests of the block cache over [`SimulatedDevice`]: unit tests of each rule, and property
//! tests of random alloc/free sequences against a simple model.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);
const S2: StreamId = StreamId(2);

fn cache(capacity: usize) -> BlockCache<SimulatedDevice> {
    BlockCache::new(SimulatedDevice::new(capacity))
}

fn stat(cache: &BlockCache<SimulatedDevice>, key: &str) -> u64 {
    *cache
        .memory_stats()
        .get(key)
        .unwrap_or_else(|| panic!("no statistic {key}"))
}

/// The blocks of the snapshot as (offset in segment, size, state), for the segment at `index`.
fn layout(cache: &BlockCache<SimulatedDevice>, index: usize) -> Vec<(usize, usize, BlockState)> {
    let seg = &cache.snapshot()[index];
    seg.blocks
        .iter()
        .map(|b| ((b.ptr.0 - seg.ptr.0) as usize, b.size, b.state))
        .collect()
}

/// Structural invariants that hold after every operation, checked through the public API:
/// the cache's segments are exactly the device's live segments, blocks tile their segment,
/// no two free blocks are adjacent (merging), and the segment/reserved/active statistics match.
fn check_structure(cache: &BlockCache<SimulatedDevice>) {
    let dev = cache.device();
    let snapshot = cache.snapshot();
    let seg_list: Vec<(DevicePtr, usize)> = snapshot.iter().map(|s| (s.ptr, s.size)).collect();
    assert_eq!(
        seg_list,
        dev.live_segments(),
        "cache and device disagree on segments"
    );
    let stats = cache.stats();
    let mut reserved = [0u64; 2];
    let mut segments = [0u64; 2];
    let mut active = [0u64; 2];
    let mut active_bytes = [0u64; 2];
    let mut allocated = [0u64; 2];
    let mut pending = 0;
    for seg in &snapshot {
        let p = seg.pool as usize;
        reserved[p] += seg.size as u64;
        segments[p] += 1;
        assert_eq!(seg.blocks[0].ptr, seg.ptr, "first block starts the segment");
        let mut end = seg.ptr.0;
        let mut prev_free = false;
        for block in &seg.blocks {
            assert_eq!(block.ptr.0, end, "blocks tile the segment: {seg:?}");
            assert!(block.size >= MIN_BLOCK_SIZE && block.size % MIN_BLOCK_SIZE == 0);
            let free = block.state == BlockState::Free;
            assert!(!(free && prev_free), "two adjacent free blocks: {seg:?}");
            prev_free = free;
            end += block.size as u64;
            match block.state {
                BlockState::Free => {}
                BlockState::Allocated => {
                    active[p] += 1;
                    active_bytes[p] += block.size as u64;
                    allocated[p] += block.size as u64;
                }
                BlockState::Pending => {
                    active[p] += 1;
                    active_bytes[p] += block.size as u64;
                    pending += 1;
                }
            }
        }
        assert_eq!(end, seg.ptr.0 + seg.size as u64, "blocks cover the segment");
        if seg.pool == Pool::Small {
            assert_eq!(seg.size, SMALL_BUFFER);
        }
    }
    assert_eq!(pending, cache.num_pending());
    for (array, expected) in [
        (&stats.reserved_bytes, reserved),
        (&stats.segment, segments),
        (&stats.active, active),
        (&stats.active_bytes, active_bytes),
        (&stats.allocated_bytes, allocated),
    ] {
        assert_eq!(array.small_pool.current, expected[0]);
        assert_eq!(array.large_pool.current, expected[1]);
        assert_eq!(array.all.current, expected[0] + expected[1]);
    }
    assert_eq!(stats.reserved_bytes.all.current, dev.used_bytes() as u64);
    assert_eq!(stats.segment.all.current, dev.num_live_segments() as u64);
    assert_eq!(
        stats.num_device_alloc,
        dev.malloc_calls() - dev.failed_mallocs()
    );
    assert_eq!(stats.num_device_free, dev.free_calls());
    assert_eq!(cache.memory_stats(), stats.to_map());
}

// ---------------------------------------------------------------- sizes and pools

#[test]
fn rounding() {
    assert_eq!(round_size(0), Some(512));
    assert_eq!(round_size(1), Some(512));
    assert_eq!(round_size(512), Some(512));
    assert_eq!(round_size(513), Some(1024));
    assert_eq!(round_size(MIB + 1), Some(MIB + 512));
    assert_eq!(round_size(usize::MAX - 511), Some(usize::MAX - 511));
    assert_eq!(round_size(usize::MAX - 510), None);

    let mut c = cache(64 * MIB);
    assert_eq!(c.alloc(0, S0).unwrap().size, 512);
    assert_eq!(c.alloc(1, S0).unwrap().size, 512);
    assert_eq!(c.alloc(1000, S0).unwrap().size, 1024);
    assert_eq!(c.alloc(4096, S0).unwrap().size, 4096);
    assert_eq!(
        stat(&c, "allocated_bytes.all.current"),
        512 + 512 + 1024 + 4096
    );
    assert_eq!(stat(&c, "requested_bytes.all.current"), 1 + 1000 + 4096);
    check_structure(&c);
}

#[test]
fn an_unroundable_request_is_out_of_memory_without_touching_the_device() {
    let mut c = cache(64 * MIB);
    let err = c.alloc(usize::MAX, S0).unwrap_err();
    assert_eq!(
        err,
        CacheError::OutOfMemory {
            requested: usize::MAX,
            allocated: 0,
            reserved: 0
        }
    );
    // Roundable, but its segment size (a multiple of 2 MiB) is not.
    let err = c.alloc(usize::MAX - 511, S0).unwrap_err();
    assert!(matches!(err, CacheError::OutOfMemory { .. }));
    assert_eq!(c.device().malloc_calls(), 0);
    // A representable but impossible request reaches the device: refused, retried, refused.
    let err = c.alloc(1 << 62, S0).unwrap_err();
    assert!(matches!(err, CacheError::OutOfMemory { requested, .. } if requested == 1 << 62));
    assert_eq!(c.device().malloc_calls(), 2);
    assert_eq!(stat(&c, "num_ooms"), 3);
    assert_eq!(stat(&c, "num_alloc_retries"), 1);
}

/// A device failure that is not a lack of memory (a driver's sticky fault) is reported as what
/// it is: no cache flush, no retry, no out-of-memory count, and the cache keeps its free blocks.
#[test]
fn device_failures_are_not_out_of_memory() {
    let mut c = cache(64 * MIB);
    let kept = c.alloc(MIB, S0).unwrap();
    c.free(kept).unwrap();
    let reserved = stat(&c, "reserved_bytes.all.current");
    c.device_mut()
        .fail_next("CUDA_ERROR_ILLEGAL_ADDRESS, an illegal memory access was encountered");
    // Larger than the cached segment's blocks can serve, so the device is asked.
    let err = c.alloc(40 * MIB, S0).unwrap_err();
    assert!(
        matches!(&err, CacheError::Device { requested, msg }
            if *requested == 40 * MIB && msg.contains("ILLEGAL_ADDRESS")),
        "{err:?}"
    );
    assert_eq!(stat(&c, "num_ooms"), 0);
    assert_eq!(stat(&c, "num_alloc_retries"), 0);
    assert_eq!(
        stat(&c, "reserved_bytes.all.current"),
        reserved,
        "nothing was flushed"
    );
    assert_eq!(
        c.device().malloc_calls(),
        2,
        "one call for the segment, one refused"
    );
    // The next request is served again.
    let b = c.alloc(40 * MIB, S0).unwrap();
    c.free(b).unwrap();
    check_structure(&c);
}

#[test]
fn pool_choice_and_segment_sizes() {
    assert_eq!(pool_for(512), Pool::Small);
    assert_eq!(pool_for(MIB), Pool::Small);
    assert_eq!(pool_for(MIB + 512), Pool::Large);
    assert_eq!(segment_size(512), Some(SMALL_BUFFER));
    assert_eq!(segment_size(MIB), Some(2 * MIB));
    assert_eq!(segment_size(MIB + 512), Some(20 * MIB));
    assert_eq!(segment_size(10 * MIB - 512), Some(20 * MIB));
    assert_eq!(segment_size(10 * MIB), Some(10 * MIB));
    assert_eq!(segment_size(10 * MIB + 512), Some(12 * MIB));
    assert_eq!(segment_size(64 * MIB), Some(64 * MIB));
    assert_eq!(segment_size(usize::MAX - 511), None);

    // Each request on a fresh cache, to see the segment it makes.
    for (request, pool, segment) in [
        (1, Pool::Small, 2 * MIB),
        (MIB, Pool::Small, 2 * MIB),
        (MIB + 1, Pool::Large, 20 * MIB),
        (10 * MIB - 512, Pool::Large, 20 * MIB),
        (10 * MIB - 1, Pool::Large, 10 * MIB), // rounds up to 10 MiB
        (10 * MIB, Pool::Large, 10 * MIB),
        (10 * MIB + 1, Pool::Large, 12 * MIB),
        (33 * MIB, Pool::Large, 34 * MIB),
    ] {
        let mut c = cache(256 * MIB);
        let h = c.alloc(request, S0).unwrap();
        let seg = &c.snapshot()[0];
        assert_eq!((seg.pool, seg.size), (pool, segment), "request {request}");
        assert_eq!(c.device().live_segments(), vec![(seg.ptr, segment)]);
        assert_eq!(h.ptr, seg.ptr);
        let pool_name = match pool {
            Pool::Small => "small_pool",
            Pool::Large => "large_pool",
        };
        assert_eq!(stat(&c, &format!("segment.{pool_name}.current")), 1);
        assert_eq!(
            stat(&c, &format!("reserved_bytes.{pool_name}.current")),
            segment as u64
        );
        assert_eq!(
            stat(&c, &format!("allocated_bytes.{pool_name}.current")),
            h.size as u64
        );
        check_structure(&c);
    }
}

// ---------------------------------------------------------------- splitting and merging

#[test]
fn small_pool_splits_any_remainder_of_512_bytes_or_more() {
    let mut c = cache(64 * MIB);
    let a = c.alloc(MIB, S0).unwrap();
    assert_eq!(
        layout(&c, 0),
        vec![
            (0, MIB, BlockState::Allocated),
            (MIB, MIB, BlockState::Free)
        ]
    );
    let b = c.alloc(MIB - 512, S0).unwrap();
    assert_eq!(b.ptr.0, a.ptr.0 + MIB as u64);
    assert_eq!(b.size, MIB - 512);
    assert_eq!(layout(&c, 0)[2], (2 * MIB - 512, 512, BlockState::Free));
    let d = c.alloc(1, S0).unwrap();
    assert_eq!(
        d.ptr.0,
        a.ptr.0 + (2 * MIB - 512) as u64,
        "the last 512 bytes"
    );
    assert_eq!(layout(&c, 0).len(), 3, "an exact fit is not split");
    assert_eq!(c.device().malloc_calls(), 1);
    check_structure(&c);
}

#[test]
fn large_pool_splits_only_remainders_above_1_mib() {
    let mut c = cache(256 * MIB);
    // 20 MiB segment, 19 MiB asked: the 1 MiB rest is not split off.
    let a = c.alloc(19 * MIB, S0).unwrap();
    assert_eq!(a.size, 20 * MIB);
    assert_eq!(layout(&c, 0), vec![(0, 20 * MIB, BlockState::Allocated)]);
    assert_eq!(
        stat(&c, "allocated_bytes.large_pool.current"),
        20 * MIB as u64
    );
    assert_eq!(
        stat(&c, "requested_bytes.large_pool.current"),
        19 * MIB as u64
    );
    // 1 MiB + 512 left over: split.
    let b = c.alloc(19 * MIB - 512, S1).unwrap();
    assert_eq!(b.size, 19 * MIB - 512);
    assert_eq!(
        layout(&c, 1),
        vec![
            (0, 19 * MIB - 512, BlockState::Allocated),
            (19 * MIB - 512, MIB + 512, BlockState::Free)
        ]
    );
    // An own segment (>= 10 MiB) is rounded to 2 MiB, and its rest split when above 1 MiB.
    let d = c.alloc(10 * MIB + 1, S2).unwrap();
    assert_eq!(d.size, 10 * MIB + 512);
    assert_eq!(
        layout(&c, 2),
        vec![
            (0, 10 * MIB + 512, BlockState::Allocated),
            (10 * MIB + 512, 2 * MIB - 512, BlockState::Free)
        ]
    );
    check_structure(&c);
}

#[test]
fn freed_blocks_merge_with_free_neighbours() {
    let mut c = cache(64 * MIB);
    let a = c.alloc(KIB, S0).unwrap();
    let b = c.alloc(2 * KIB, S0).unwrap();
    let d = c.alloc(4 * KIB, S0).unwrap();
    let rest = 2 * MIB - 7 * KIB;
    c.free(b).unwrap();
    assert_eq!(
        layout(&c, 0),
        vec![
            (0, KIB, BlockState::Allocated),
            (KIB, 2 * KIB, BlockState::Free),
            (3 * KIB, 4 * KIB, BlockState::Allocated),
            (7 * KIB, rest, BlockState::Free)
        ]
    );
    c.free(a).unwrap(); // merges with the following free block
    assert_eq!(
        layout(&c, 0),
        vec![
            (0, 3 * KIB, BlockState::Free),
            (3 * KIB, 4 * KIB, BlockState::Allocated),
            (7 * KIB, rest, BlockState::Free)
        ]
    );
    check_structure(&c);
    c.free(d).unwrap(); // merges on both sides: the segment is one block again
    assert_eq!(layout(&c, 0), vec![(0, 2 * MIB, BlockState::Free)]);
    assert_eq!(c.device().num_live_segments(), 1, "kept in the cache");
    // The merged block serves a request of the whole segment's pool without the device.
    let big = c.alloc(MIB, S0).unwrap();
    assert_eq!(big.ptr, a.ptr);
    assert_eq!(c.device().malloc_calls(), 1);
    check_structure(&c);
}

#[test]
fn best_fit_takes_the_smallest_block_that_fits_then_the_lowest_address() {
    let mut c = cache(64 * MIB);
    // Holes of 4, 2, 8 and 2 KiB separated by live 512-byte blocks, then the segment's tail.
    let mut holes = Vec::new();
    let mut keep = Vec::new();
    for size in [4 * KIB, 2 * KIB, 8 * KIB, 2 * KIB] {
        holes.push(c.alloc(size, S0).unwrap());
        keep.push(c.alloc(512, S0).unwrap());
    }
    for &h in &holes {
        c.free(h).unwrap();
    }
    check_structure(&c);
    // 2 KiB: two exact fits; the lower address wins.
    let x = c.alloc(2 * KIB, S0).unwrap();
    assert_eq!(x.ptr, holes[1].ptr);
    // 3 KiB: the 4 KiB hole is the smallest that fits (not the 8 KiB one, not the tail).
    let y = c.alloc(3 * KIB, S0).unwrap();
    assert_eq!(y.ptr, holes[0].ptr);
    assert_eq!(y.size, 3 * KIB, "split: 512 bytes stay free");
    // 512 bytes: the 512-byte rest of the 4 KiB hole is now the best fit.
    let z = c.alloc(512, S0).unwrap();
    assert_eq!(z.ptr.0, holes[0].ptr.0 + 3 * KIB as u64);
    // 2 KiB again: the other 2 KiB hole.
    let w = c.alloc(2 * KIB, S0).unwrap();
    assert_eq!(w.ptr, holes[3].ptr);
    // 5 KiB: only the 8 KiB hole (and the tail) fit; the hole is smaller.
    let v = c.alloc(5 * KIB, S0).unwrap();
    assert_eq!(v.ptr, holes[2].ptr);
    assert_eq!(c.device().malloc_calls(), 1);
    check_structure(&c);
}

#[test]
fn best_fit_across_segments_prefers_the_lower_address_among_equals() {
    let mut c = cache(64 * MIB);
    let a = c.alloc(MIB + 512, S0).unwrap(); // segment 1 (20 MiB)
    let b = c.alloc(19 * MIB, S0).unwrap(); // does not fit the rest: segment 2
    assert_ne!(a.ptr, b.ptr);
    c.free(b).unwrap();
    c.free(a).unwrap();
    assert_eq!(c.device().num_live_segments(), 2);
    let x = c.alloc(2 * MIB, S0).unwrap();
    assert_eq!(x.ptr, a.ptr.min(b.ptr));
    check_structure(&c);
}

// ---------------------------------------------------------------- streams

#[test]
fn free_blocks_are_reused_only_by_their_own_stream() {
    let mut c = cache(64 * MIB);
    let a = c.alloc(KIB, S0).unwrap();
    c.free(a).unwrap();
    let b = c.alloc(KIB, S1).unwrap();
    assert_eq!(
        c.device().malloc_calls(),
        2,
        "stream 1 gets a segment of its own"
    );
    assert!(c.device().segment_containing(a.ptr, KIB) != c.device().segment_containing(b.ptr, KIB));
    let d = c.alloc(KIB, S0).unwrap();
    assert_eq!(d.ptr, a.ptr, "stream 0 reuses its block at once");
    assert_eq!(c.device().malloc_calls(), 2);
    let streams: Vec<StreamId> = c.snapshot().iter().map(|s| s.stream).collect();
    assert_eq!(streams, vec![S0, S1]);
    check_structure(&c);
}

#[test]
fn a_block_used_on_other_streams_waits_for_them() {
    let mut c = cache(64 * MIB);
    let a = c.alloc(4 * KIB, S0).unwrap();
    c.record_use(&a, S1).unwrap();
    c.record_use(&a, S2).unwrap();
    c.record_use(&a, S1).unwrap(); // recorded once
    c.record_use(&a, S0).unwrap(); // its own stream: nothing to wait for
    c.free(a).unwrap();
    assert_eq!(c.num_pending(), 1);
    assert_eq!(layout(&c, 0)[0], (0, 4 * KIB, BlockState::Pending));
    assert_eq!(stat(&c, "allocated_bytes.all.current"), 0);
    assert_eq!(stat(&c, "allocation.all.current"), 0);
    assert_eq!(stat(&c, "active_bytes.all.current"), 4 * KIB as u64);
    check_structure(&c);

    // Not reusable while pending, even by its own stream.
    let b = c.alloc(4 * KIB, S0).unwrap();
    assert_ne!(b.ptr, a.ptr);
    c.free(b).unwrap();
    // Not released from the cache either.
    assert_eq!(c.empty_cache(), 0);
    assert_eq!(c.device().num_live_segments(), 1);

    let mut asked = Vec::new();
    assert_eq!(
        c.process_events(|s| {
            asked.push(s);
            s == S1
        }),
        0
    );
    assert_eq!(asked, vec![S1, S2], "each stream asked once");
    assert_eq!(c.num_pending(), 1);
    // Stream 1 is done already; only stream 2 is waited for now.
    assert_eq!(c.process_events(|s| s == S2), 1);
    assert_eq!(c.num_pending(), 0);
    assert_eq!(stat(&c, "active_bytes.all.current"), 0);
    assert_eq!(
        layout(&c, 0),
        vec![(0, 2 * MIB, BlockState::Free)],
        "merged"
    );
    let d = c.alloc(4 * KIB, S0).unwrap();
    assert_eq!(d.ptr, a.ptr);
    check_structure(&c);
}

#[test]
fn synchronize_releases_every_pending_block() {
    let mut c = cache(64 * MIB);
    let handles: Vec<BlockHandle> = (0..3).map(|_| c.alloc(MIB / 2, S0).unwrap()).collect();
    for (i, h) in handles.iter().enumerate() {
        c.record_use(h, StreamId(i as u32 + 1)).unwrap();
        c.free(*h).unwrap();
    }
    assert_eq!(c.num_pending(), 3);
    assert_eq!(c.synchronize(), 3);
    assert_eq!(c.synchronize(), 0);
    assert_eq!(c.device().num_live_segments(), 1, "1.5 MiB fit one segment");
    assert_eq!(c.empty_cache(), 2 * MIB);
    c.device().assert_no_live_segments();
    check_structure(&c);
}

// ---------------------------------------------------------------- handles

#[test]
fn double_free_and_foreign_handles_are_typed_errors() {
    let mut c = cache(64 * MIB);
    let a = c.alloc(KIB, S0).unwrap();
    c.free(a).unwrap();
    let before = c.memory_stats();
    assert_eq!(c.free(a), Err(CacheError::UnknownBlock { id: a.id }));
    assert_eq!(
        c.record_use(&a, S1),
        Err(CacheError::UnknownBlock { id: a.id })
    );
    assert_eq!(c.memory_stats(), before, "a failed free changes nothing");

    // The same slot and address handed out again: the old handle stays stale.
    let b = c.alloc(KIB, S0).unwrap();
    assert_eq!(b.ptr, a.ptr);
    assert!(matches!(c.free(a), Err(CacheError::UnknownBlock { .. })));
    // A handle with a forged address or size is refused.
    let forged = BlockHandle {
        ptr: DevicePtr(b.ptr.0 + 512),
        ..b
    };
    assert!(c.free(forged).is_err());
    assert!(c.free(BlockHandle { size: 512, ..b }).is_err());
    // A handle of another cache.
    let mut other = cache(64 * MIB);
    let foreign = other.alloc(KIB, S0).unwrap();
    assert_eq!(
        (foreign.ptr, foreign.size),
        (b.ptr, b.size),
        "same address, other cache"
    );
    assert!(c.free(foreign).is_err());
    c.free(b).unwrap();
    assert_eq!(stat(&c, "allocation.all.current"), 0);
    check_structure(&c);
    let msg = CacheError::UnknownBlock { id: a.id }.to_string();
    assert!(msg.contains("not a live allocation"), "{msg}");
}

// ---------------------------------------------------------------- out of memory, empty_cache

#[test]
fn out_of_memory_empties_the_cache_retries_once_then_fails_typed() {
    let mut c = cache(21 * MIB);
    let small = c.alloc(KIB, S0).unwrap();
    c.free(small).unwrap(); // a cached, fully free 2 MiB segment
    assert_eq!(c.device().used_bytes(), 2 * MIB);

    // 20 MiB does not fit beside it: the cache gives it back and retries.
    let a = c.alloc(5 * MIB, S0).unwrap();
    assert_eq!(stat(&c, "num_alloc_retries"), 1);
    assert_eq!(stat(&c, "num_ooms"), 0);
    assert_eq!(
        c.device().malloc_calls(),
        3,
        "small segment, refused, retried"
    );
    assert_eq!(c.device().free_calls(), 1);
    assert_eq!(c.device().live_segments(), vec![(a.ptr, 20 * MIB)]);
    check_structure(&c);

    let b = c.alloc(5 * MIB, S0).unwrap(); // from the cached rest, no device call
    assert_eq!(c.device().malloc_calls(), 3);

    // 16 MiB needs a segment of its own; nothing to give back; retried once, then OOM.
    let err = c.alloc(16 * MIB, S0).unwrap_err();
    assert_eq!(
        err,
        CacheError::OutOfMemory {
            requested: 16 * MIB,
            allocated: 10 * MIB,
            reserved: 20 * MIB
        }
    );
    assert_eq!(c.device().malloc_calls(), 5);
    assert_eq!(stat(&c, "num_alloc_retries"), 2);
    assert_eq!(stat(&c, "num_ooms"), 1);
    assert!(
        err.to_string().contains("requested 16777216 bytes"),
        "{err}"
    );
    check_structure(&c);

    // The cache still works: what is left fits.
    let d = c.alloc(10 * MIB - 512, S0).unwrap();
    assert!(d.ptr.0 > b.ptr.0);
    for h in [a, b, d] {
        c.free(h).unwrap();
    }
    // On stream 0 the 16 MiB request now fits the cached, idle 20 MiB segment.
    let e = c.alloc(16 * MIB, S0).unwrap();
    assert_eq!(e.ptr, a.ptr);
    assert_eq!(c.device().malloc_calls(), 5);
    c.free(e).unwrap();
    // Stream 1 cannot use stream 0's segment: the device refuses a new one until the cache
    // gives the idle segment back.
    let f = c.alloc(16 * MIB, S1).unwrap();
    assert_eq!(c.device().live_segments(), vec![(f.ptr, 16 * MIB)]);
    assert_eq!(stat(&c, "num_alloc_retries"), 3);
    assert_eq!(stat(&c, "num_ooms"), 1);
    check_structure(&c);
}

#[test]
fn empty_cache_returns_only_fully_free_segments() {
    let mut c = cache(256 * MIB);
    let keep_small = c.alloc(KIB, S0).unwrap();
    let drop_small = c.alloc(KIB, S1).unwrap();
    let keep_large = c.alloc(12 * MIB, S0).unwrap();
    let drop_large = c.alloc(30 * MIB, S0).unwrap();
    c.free(drop_small).unwrap();
    c.free(drop_large).unwrap();
    assert_eq!(c.device().num_live_segments(), 4);
    assert_eq!(c.empty_cache(), 2 * MIB + 30 * MIB);
    assert_eq!(c.device().num_live_segments(), 2);
    assert_eq!(c.device().free_calls(), 2);
    assert_eq!(
        stat(&c, "reserved_bytes.all.current"),
        (2 + 12) as u64 * MIB as u64
    );
    assert_eq!(stat(&c, "segment.all.current"), 2);
    assert_eq!(stat(&c, "num_device_free"), 2);
    c.device()
        .assert_range_live(keep_small.ptr, keep_small.size);
    c.device()
        .assert_range_live(keep_large.ptr, keep_large.size);
    assert_eq!(c.empty_cache(), 0, "nothing more to give back");
    c.free(keep_small).unwrap();
    c.free(keep_large).unwrap();
    assert_eq!(c.empty_cache(), 14 * MIB);
    c.device().assert_no_live_segments();
    check_structure(&c);
}

// ---------------------------------------------------------------- statistics

#[test]
fn stats_keys_values_and_peaks() {
    let mut c = cache(256 * MIB);
    let map = c.memory_stats();
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
        "active_bytes.all.current",
        "segment.all.current",
        "allocation.all.current",
        "num_device_alloc",
        "num_device_free",
        "num_alloc_retries",
        "num_ooms",
    ] {
        assert_eq!(map.get(key), Some(&0), "{key}");
    }
    for stat_name in ["allocated_bytes", "reserved_bytes", "segment", "allocation"] {
        for pool in ["small_pool", "large_pool"] {
            for field in ["current", "peak"] {
                let key = format!("{stat_name}.{pool}.{field}");
                assert!(map.contains_key(&key), "{key}");
            }
        }
    }
    assert_eq!(map.len(), 7 * 3 * 4 + 4);

    let a = c.alloc(3 * KIB, S0).unwrap();
    let b = c.alloc(5 * MIB, S0).unwrap();
    c.free(a).unwrap();
    let d = c.alloc(KIB, S0).unwrap();
    let m = c.memory_stats();
    assert_eq!(m["allocated_bytes.all.current"], (5 * MIB + KIB) as u64);
    assert_eq!(m["allocated_bytes.all.peak"], (5 * MIB + 3 * KIB) as u64);
    assert_eq!(
        m["allocated_bytes.all.allocated"],
        (5 * MIB + 4 * KIB) as u64
    );
    assert_eq!(m["allocated_bytes.all.freed"], (3 * KIB) as u64);
    assert_eq!(m["allocated_bytes.small_pool.current"], KIB as u64);
    assert_eq!(m["allocated_bytes.small_pool.peak"], (3 * KIB) as u64);
    assert_eq!(m["allocated_bytes.large_pool.current"], (5 * MIB) as u64);
    assert_eq!(m["allocation.all.current"], 2);
    assert_eq!(m["allocation.all.allocated"], 3);
    assert_eq!(m["allocation.small_pool.peak"], 1);
    assert_eq!(m["reserved_bytes.all.current"], (22 * MIB) as u64);
    assert_eq!(m["reserved_bytes.small_pool.current"], (2 * MIB) as u64);
    assert_eq!(m["reserved_bytes.large_pool.current"], (20 * MIB) as u64);
    assert_eq!(m["segment.all.current"], 2);
    assert_eq!(m["segment.large_pool.current"], 1);
    assert_eq!(m["active_bytes.all.current"], (5 * MIB + KIB) as u64);
    assert_eq!(m["num_device_alloc"], 2);
    assert_eq!(m["requested_bytes.all.current"], (5 * MIB + KIB) as u64);

    c.free(b).unwrap();
    c.free(d).unwrap();
    c.empty_cache();
    assert_eq!(stat(&c, "reserved_bytes.all.peak"), (22 * MIB) as u64);
    assert_eq!(stat(&c, "reserved_bytes.all.current"), 0);
    c.reset_peak_stats();
    let m = c.memory_stats();
    for (key, value) in &m {
        if key.ends_with(".peak") {
            let current = &key[..key.len() - "peak".len()];
            assert_eq!(*value, m[&format!("{current}current")], "{key}");
        }
    }
    assert_eq!(
        m["allocated_bytes.all.allocated"],
        (5 * MIB + 4 * KIB) as u64
    );
    c.reset_accumulated_stats();
    let m = c.memory_stats();
    assert_eq!(m["allocated_bytes.all.allocated"], 0);
    assert_eq!(m["num_device_alloc"], 0);
    assert_eq!(*c.stats(), MemoryStats::default());
}

// ---------------------------------------------------------------- steady state

/// Runs `rounds` rounds of "allocate `sizes` in order, free them all" and returns the device
/// malloc calls made in each round, and the pointers handed out in each.
fn run_rounds(
    c: &mut BlockCache<SimulatedDevice>,
    sizes: &[(usize, StreamId)],
    free_orders: &[Vec<usize>],
) -> (Vec<u64>, Vec<Vec<DevicePtr>>) {
    let mut mallocs = Vec::new();
    let mut ptrs = Vec::new();
    for order in free_orders {
        let before = c.device().malloc_calls();
        let handles: Vec<BlockHandle> = sizes
            .iter()
            .map(|&(bytes, stream)| c.alloc(bytes, stream).expect("fits"))
            .collect();
        ptrs.push(handles.iter().map(|h| h.ptr).collect());
        for &i in order {
            c.free(handles[i]).unwrap();
        }
        check_structure(c);
        mallocs.push(c.device().malloc_calls() - before);
    }
    (mallocs, ptrs)
}

#[test]
fn a_repeated_pattern_stops_calling_the_device_after_its_first_round() {
    let mut c = cache(512 * MIB);
    let sizes = [
        (3 * KIB, S0),
        (5 * MIB, S0),
        (700 * KIB, S0),
        (2 * MIB, S1),
        (MIB, S0),
        (9 * MIB, S0),
        (100, S1),
    ];
    let orders = vec![
        vec![0, 1, 2, 3, 4, 5, 6],
        vec![6, 5, 4, 3, 2, 1, 0],
        vec![3, 0, 5, 1, 6, 2, 4],
    ];
    let (mallocs, ptrs) = run_rounds(&mut c, &sizes, &orders);
    assert!(mallocs[0] > 0);
    assert_eq!(&mallocs[1..], &[0, 0]);
    assert!(ptrs.windows(2).all(|w| w[0] == w[1]));
}

/// Best fit is not a steady-state guarantee once requests of 10 MiB or more get segments of
/// their own (sizes differ between large segments): here round 2 places the first request in
/// the 16 MiB segment that round 1 made for the second, and needs one more segment. From round 3
/// on the pattern is steady. PyTorch behaves the same way.
#[test]
fn large_pool_steady_state_can_take_a_second_round() {
    let mut c = cache(512 * MIB);
    let sizes = [(5 * MIB, S0), (16 * MIB, S0), (14 * MIB, S0)];
    let order = vec![0, 1, 2];
    let (mallocs, _) = run_rounds(&mut c, &sizes, &vec![order; 5]);
    assert_eq!(mallocs, vec![2, 1, 0, 0, 0]);
    assert_eq!(c.device().failed_mallocs(), 0);
}

// ---------------------------------------------------------------- property tests

/// Sequence length: shorter under Miri, which interprets every step.
fn max_ops() -> usize {
    if cfg!(miri) {
        10
    } else {
        120
    }
}

fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 256 },
        failure_persistence: if cfg!(miri) {
            None
        } else {
            default.failure_persistence.clone()
        },
        ..default
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { bytes: usize, stream: u32 },
    Free { pick: usize },
    RecordUse { pick: usize, stream: u32 },
    ProcessEvents { done: [bool; 3] },
    Synchronize,
    EmptyCache,
}

fn request_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => 0..=MIB,
        1 => (MIB + 1)..=64 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (request_size(), 0..3u32).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0..3u32).prop_map(|(pick, stream)| Op::RecordUse { pick, stream }),
        2 => any::<[bool; 3]>().prop_map(|done| Op::ProcessEvents { done }),
        1 => Just(Op::Synchronize),
        1 => Just(Op::EmptyCache),
    ]
}

/// A live allocation as the model knows it.
#[derive(Debug)]
struct Live {
    handle: BlockHandle,
    requested: usize,
    stream: StreamId,
    uses: Vec<StreamId>,
}

/// A freed block waiting on streams, as the model knows it.
#[derive(Debug)]
struct Parked {
    ptr: DevicePtr,
    size: usize,
    awaiting: Vec<StreamId>,
}

#[derive(Debug, Default)]
struct Model {
    live: Vec<Live>,
    parked: Vec<Parked>,
    last_stats: BTreeMap<String, u64>,
}

impl Model {
    /// Everything that must hold after each step.
    fn check(&mut self, c: &BlockCache<SimulatedDevice>) {
        check_structure(c);
        let dev = c.device();
        // (a) no two live (or pending) blocks overlap.
        let mut ranges: Vec<(u64, usize)> = self
            .live
            .iter()
            .map(|l| (l.handle.ptr.0, l.handle.size))
            .chain(self.parked.iter().map(|p| (p.ptr.0, p.size)))
            .collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(w[0].0 + w[0].1 as u64 <= w[1].0, "overlap: {w:?}");
        }
        // (b) every live block lies inside a live device segment.
        for l in &self.live {
            dev.assert_range_live(l.handle.ptr, l.handle.size);
        }
        // The cache's allocated and pending blocks are exactly the model's.
        let mut allocated = Vec::new();
        let mut pending = Vec::new();
        for seg in c.snapshot() {
            for b in seg.blocks {
                match b.state {
                    BlockState::Allocated => allocated.push((b.ptr.0, b.size)),
                    BlockState::Pending => pending.push((b.ptr.0, b.size)),
                    BlockState::Free => {}
                }
            }
        }
        let mut model_allocated: Vec<(u64, usize)> = self
            .live
            .iter()
            .map(|l| (l.handle.ptr.0, l.handle.size))
            .collect();
        let mut model_pending: Vec<(u64, usize)> =
            self.parked.iter().map(|p| (p.ptr.0, p.size)).collect();
        for v in [
            &mut allocated,
            &mut pending,
            &mut model_allocated,
            &mut model_pending,
        ] {
            v.sort_unstable();
        }
        assert_eq!(allocated, model_allocated);
        assert_eq!(pending, model_pending);
        // (c) the statistics equal the model's sums.
        let m = c.memory_stats();
        let mut bytes = [0u64; 2];
        let mut requested = [0u64; 2];
        let mut count = [0u64; 2];
        for l in &self.live {
            let p = pool_for(round_size(l.requested).unwrap()) as usize;
            bytes[p] += l.handle.size as u64;
            requested[p] += l.requested as u64;
            count[p] += 1;
        }
        let parked_bytes: u64 = self.parked.iter().map(|p| p.size as u64).sum();
        assert_eq!(m["allocated_bytes.all.current"], bytes[0] + bytes[1]);
        assert_eq!(m["allocated_bytes.small_pool.current"], bytes[0]);
        assert_eq!(m["allocated_bytes.large_pool.current"], bytes[1]);
        assert_eq!(
            m["requested_bytes.all.current"],
            requested[0] + requested[1]
        );
        assert_eq!(m["allocation.small_pool.current"], count[0]);
        assert_eq!(m["allocation.large_pool.current"], count[1]);
        assert_eq!(
            m["active_bytes.all.current"],
            bytes[0] + bytes[1] + parked_bytes
        );
        assert_eq!(m["reserved_bytes.all.current"], dev.used_bytes() as u64);
        let segments_bytes: usize = dev.live_segments().iter().map(|s| s.1).sum();
        assert_eq!(m["reserved_bytes.all.current"], segments_bytes as u64);
        assert!(dev.used_bytes() <= dev.capacity());
        for (key, &value) in &m {
            if let Some(name) = key.strip_suffix(".peak") {
                assert!(
                    value >= m[&format!("{name}.current")],
                    "{key} below current"
                );
                if let Some(&last) = self.last_stats.get(key) {
                    assert!(value >= last, "{key} went down");
                }
            }
            if key.ends_with(".allocated") || key.ends_with(".freed") || key.starts_with("num_") {
                if let Some(&last) = self.last_stats.get(key) {
                    assert!(value >= last, "{key} went down");
                }
            }
        }
        self.last_stats = m;
    }

    fn step(&mut self, c: &mut BlockCache<SimulatedDevice>, op: &Op) {
        match *op {
            Op::Alloc { bytes, stream } => {
                let stream = StreamId(stream);
                let ooms = c.stats().num_ooms;
                match c.alloc(bytes, stream) {
                    Ok(handle) => {
                        let rounded = round_size(bytes).unwrap();
                        assert!(handle.size >= rounded);
                        assert_eq!(handle.ptr.0 % MIN_BLOCK_SIZE as u64, 0);
                        match pool_for(rounded) {
                            Pool::Small => assert_eq!(handle.size, rounded),
                            Pool::Large => assert!(handle.size - rounded <= SMALL_SIZE),
                        }
                        self.live.push(Live {
                            handle,
                            requested: bytes,
                            stream,
                            uses: Vec::new(),
                        });
                    }
                    Err(CacheError::OutOfMemory {
                        requested,
                        allocated,
                        reserved,
                    }) => {
                        assert_eq!(requested, bytes);
                        assert_eq!(allocated as u64, c.stats().allocated_bytes.all.current);
                        assert_eq!(reserved, c.device().used_bytes());
                        assert_eq!(c.stats().num_ooms, ooms + 1);
                        // Legitimate: the segment really does not fit, even after the cache
                        // gave back every idle segment.
                        let segment = segment_size(round_size(bytes).unwrap()).unwrap();
                        assert!(reserved + segment > c.device().capacity());
                        for seg in c.snapshot() {
                            assert!(
                                !(seg.blocks.len() == 1 && seg.blocks[0].state == BlockState::Free),
                                "an idle segment survived an OOM"
                            );
                        }
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::Free { pick } => {
                if self.live.is_empty() {
                    return;
                }
                let l = self.live.swap_remove(pick % self.live.len());
                c.free(l.handle).unwrap();
                if !l.uses.is_empty() {
                    self.parked.push(Parked {
                        ptr: l.handle.ptr,
                        size: l.handle.size,
                        awaiting: l.uses,
                    });
                }
                // A second free is refused and changes nothing.
                let before = c.memory_stats();
                assert_eq!(
                    c.free(l.handle),
                    Err(CacheError::UnknownBlock { id: l.handle.id })
                );
                assert_eq!(c.memory_stats(), before);
            }
            Op::RecordUse { pick, stream } => {
                if self.live.is_empty() {
                    return;
                }
                let n = self.live.len();
                let l = &mut self.live[pick % n];
                let stream = StreamId(stream);
                c.record_use(&l.handle, stream).unwrap();
                if stream != l.stream && !l.uses.contains(&stream) {
                    l.uses.push(stream);
                }
            }
            Op::ProcessEvents { done } => {
                let is_done = |s: StreamId| done[s.0 as usize];
                let before = self.parked.len();
                for p in &mut self.parked {
                    p.awaiting.retain(|&s| !is_done(s));
                }
                self.parked.retain(|p| !p.awaiting.is_empty());
                assert_eq!(c.process_events(is_done), before - self.parked.len());
            }
            Op::Synchronize => {
                assert_eq!(c.synchronize(), self.parked.len());
                self.parked.clear();
            }
            Op::EmptyCache => {
                let reserved = c.device().used_bytes();
                let freed = c.empty_cache();
                assert_eq!(c.device().used_bytes(), reserved - freed);
                for seg in c.snapshot() {
                    assert!(seg.blocks.iter().any(|b| b.state != BlockState::Free));
                }
            }
        }
    }
}

fn steady_pattern() -> impl Strategy<Value = (Vec<(usize, StreamId)>, Vec<usize>)> {
    // Below 10 MiB every large segment is 20 MiB; 24 requests need at most 480 MiB.
    let size = prop_oneof![0..=MIB, (MIB + 1)..10 * MIB];
    prop::collection::vec((size, 0..2u32), 1..24).prop_flat_map(|reqs| {
        let n = reqs.len();
        let sizes: Vec<(usize, StreamId)> =
            reqs.into_iter().map(|(b, s)| (b, StreamId(s))).collect();
        let order = Just((0..n).collect::<Vec<usize>>()).prop_shuffle();
        (Just(sizes), order)
    })
}

proptest! {
    #![proptest_config(config())]

    /// Random alloc/free/record/process sequences keep the cache consistent with a model.
    /// (Skipped under Miri: the policy has no unsafe code, and interpreting it is slow.)
    #[test]
    #[cfg_attr(miri, ignore)]
    fn random_sequences_match_the_model(ops in prop::collection::vec(op(), 1..max_ops())) {
        let mut c = cache(512 * MIB);
        let mut model = Model::default();
        model.check(&c);
        for op in &ops {
            model.step(&mut c, op);
            model.check(&c);
        }
        // (d) free everything, let the streams finish, empty the cache: nothing is held.
        for l in std::mem::take(&mut model.live) {
            c.free(l.handle).unwrap();
            if !l.uses.is_empty() {
                model.parked.push(Parked { ptr: l.handle.ptr, size: l.handle.size, awaiting: l.uses });
            }
        }
        model.check(&c);
        prop_assert_eq!(c.synchronize(), model.parked.len());
        model.parked.clear();
        model.check(&c);
        c.empty_cache();
        model.check(&c);
        c.device().assert_no_live_segments();
        let m = c.memory_stats();
        for key in ["reserved_bytes.all.current", "allocated_bytes.all.current",
                    "active_bytes.all.current", "segment.all.current", "allocation.all.current"] {
            prop_assert_eq!(m[key], 0, "{}", key);
        }
        prop_assert_eq!(m["num_device_alloc"], m["num_device_free"]);
    }

    /// (e) A repeated pattern of allocations then frees reaches a fixed point: once a round
    /// makes no device call, every segment is whole and free again at its end, so every later
    /// round repeats it exactly — no device calls and the same addresses. (Best fit may place a
    /// request differently in round two than in round one, when round one's segments were made
    /// one by one, so a rare pattern needs a segment more in round two; the deterministic test
    /// above shows the usual case, where the device is called in round one only.)
    #[test]
    #[cfg_attr(miri, ignore)]
    fn steady_pattern_reaches_a_fixed_point_without_device_calls((sizes, order) in steady_pattern()) {
        let mut c = cache(512 * MIB);
        let rounds = vec![order; 10];
        let (mallocs, ptrs) = run_rounds(&mut c, &sizes, &rounds);
        prop_assert!(mallocs[0] >= 1);
        let fixed = mallocs.iter().position(|&m| m == 0);
        prop_assert!(fixed.is_some_and(|r| r <= 3), "mallocs per round: {:?}", mallocs);
        let r = fixed.unwrap_or(0);
        prop_assert!(mallocs[r..].iter().all(|&m| m == 0), "mallocs per round: {:?}", mallocs);
        prop_assert!(ptrs[r..].iter().all(|p| *p == ptrs[r]));
        prop_assert_eq!(c.device().free_calls(), 0);
        prop_assert_eq!(c.device().failed_mallocs(), 0);
    }
}
