//! Tests of the device arena over [`SimulatedDevice`]: handle semantics, the steady loop, out of
//! memory, and a property test of random sequences against a simple model.

use proptest::prelude::*;

use super::*;
use crate::block_cache::SimulatedDevice;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
const S0: StreamId = StreamId::DEFAULT;

type Cache = BlockCache<SimulatedDevice>;

fn cache(capacity: usize) -> Cache {
    BlockCache::new(SimulatedDevice::new(capacity))
}

fn stat(cache: &Cache, key: &str) -> u64 {
    *cache
        .memory_stats()
        .get(key)
        .unwrap_or_else(|| panic!("no statistic {key}"))
}

fn is_stale<T: std::fmt::Debug>(r: Result<T, AllocError>) -> bool {
    matches!(r, Err(AllocError::StaleBuffer { .. }))
}

/// Every access through `id` fails with `StaleBuffer` (and changes nothing).
#[track_caller]
fn assert_stale(arena: &mut DeviceArena, cache: &mut Cache, id: BufId) {
    let before = arena.stats();
    assert!(is_stale(arena.ptr(id)), "ptr of {id:?}");
    assert!(is_stale(arena.bytes(id)), "bytes of {id:?}");
    assert!(is_stale(arena.retain(id)), "retain of {id:?}");
    assert!(is_stale(arena.recycle(cache, id)), "recycle of {id:?}");
    assert_eq!(arena.stats(), before);
}

/// The live buffers' ranges `[ptr, ptr + max(bytes, 1))` are disjoint and each lies inside one
/// live device segment.
#[track_caller]
fn assert_disjoint(arena: &DeviceArena, cache: &Cache, ids: &[BufId]) {
    let mut ranges: Vec<(u64, u64)> = ids
        .iter()
        .map(|&id| {
            let ptr = arena.ptr(id).unwrap();
            let len = arena.bytes(id).unwrap().max(1);
            cache.device().assert_range_live(ptr, len);
            (ptr.addr(), ptr.addr() + len as u64)
        })
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "live buffers overlap: {:#x?} and {:#x?}",
            pair[0],
            pair[1]
        );
    }
}

#[test]
fn alloc_ptr_bytes_and_recycle() {
    let mut c = cache(GIB);
    let mut a = DeviceArena::new();
    let x = a.alloc(&mut c, 100, S0).unwrap();
    let y = a.alloc(&mut c, 0, S0).unwrap();
    let z = a.alloc(&mut c, 3 * MIB, S0).unwrap();
    assert_eq!(a.bytes(x).unwrap(), 100);
    assert_eq!(a.bytes(y).unwrap(), 0);
    assert_eq!(a.bytes(z).unwrap(), 3 * MIB);
    assert_ne!(
        a.ptr(x).unwrap(),
        a.ptr(y).unwrap(),
        "a 0-byte buffer has its own block"
    );
    assert_disjoint(&a, &c, &[x, y, z]);
    assert_eq!(a.stats().live_buffers, 3);
    assert_eq!(stat(&c, "allocation.all.current"), 3);

    a.recycle(&mut c, x).unwrap();
    assert_stale(&mut a, &mut c, x);
    assert_eq!(a.stats().live_buffers, 2);
    assert_eq!(
        stat(&c, "allocation.all.current"),
        2,
        "the block went back at once"
    );
    assert_eq!(a.ptr(y).unwrap(), a.ptr(y).unwrap());
    assert_eq!(a.bytes(z).unwrap(), 3 * MIB, "other buffers are untouched");

    // The slot is reused under a new generation: the old handle stays stale.
    let w = a.alloc(&mut c, 200, S0).unwrap();
    assert_eq!(w.slot(), x.slot());
    assert_ne!(w, x);
    assert_stale(&mut a, &mut c, x);
    assert_eq!(a.bytes(w).unwrap(), 200);
    assert_disjoint(&a, &c, &[w, y, z]);
}

#[test]
fn a_recycled_block_serves_the_next_request_of_the_iteration() {
    let mut c = cache(GIB);
    let mut a = DeviceArena::new();
    let _keep = a.alloc(&mut c, 8 * KIB, S0).unwrap();
    let x = a.alloc(&mut c, 4 * KIB, S0).unwrap();
    let big = a.alloc(&mut c, 5 * MIB, S0).unwrap();
    let (px, pbig) = (a.ptr(x).unwrap(), a.ptr(big).unwrap());
    a.recycle(&mut c, x).unwrap();
    a.recycle(&mut c, big).unwrap();
    let devices = stat(&c, "num_device_alloc");
    let y = a.alloc(&mut c, 4 * KIB, S0).unwrap();
    let big2 = a.alloc(&mut c, 5 * MIB, S0).unwrap();
    assert_eq!(a.ptr(y).unwrap(), px);
    assert_eq!(a.ptr(big2).unwrap(), pbig);
    assert_eq!(stat(&c, "num_device_alloc"), devices);
}

#[test]
fn retained_buffers_live_until_the_last_holder_lets_go() {
    let mut c = cache(GIB);
    let mut a = DeviceArena::new();
    let x = a.alloc(&mut c, 4 * KIB, S0).unwrap();
    let p = a.ptr(x).unwrap();
    a.retain(x).unwrap();
    a.retain(x).unwrap();
    a.recycle(&mut c, x).unwrap();
    a.recycle(&mut c, x).unwrap();
    assert_eq!(a.ptr(x).unwrap(), p, "one holder left");
    assert_eq!(a.stats().live_buffers, 1);
    assert_eq!(stat(&c, "allocation.all.current"), 1);
    a.recycle(&mut c, x).unwrap();
    assert_stale(&mut a, &mut c, x);
    assert_eq!(a.stats().live_buffers, 0);
    assert_eq!(a.stats().bytes_in_use, 0);
    assert_eq!(stat(&c, "allocation.all.current"), 0);

    // A retained buffer still goes back at the reset.
    let y = a.alloc(&mut c, 4 * KIB, S0).unwrap();
    a.retain(y).unwrap();
    a.reset(&mut c);
    assert_stale(&mut a, &mut c, y);
    assert_eq!(stat(&c, "allocation.all.current"), 0);
    let z = a.alloc(&mut c, 4 * KIB, S0).unwrap();
    a.recycle(&mut c, z).unwrap();
    assert_stale(&mut a, &mut c, z);
}

#[test]
fn reset_returns_every_block_and_stales_every_handle() {
    let mut c = cache(GIB);
    let mut a = DeviceArena::new();
    let ids: Vec<BufId> = [1, 600, 3 * MIB, 12 * MIB, 0, 64 * KIB]
        .iter()
        .map(|&n| a.alloc(&mut c, n, S0).unwrap())
        .collect();
    a.recycle(&mut c, ids[2]).unwrap();
    assert!(a.stats().bytes_in_use > 0);
    a.reset(&mut c);
    let s = a.stats();
    assert_eq!((s.bytes_in_use, s.live_buffers, s.resets), (0, 0, 1));
    assert_eq!(stat(&c, "allocated_bytes.all.current"), 0);
    assert_eq!(stat(&c, "requested_bytes.all.current"), 0);
    for &id in &ids {
        assert_stale(&mut a, &mut c, id);
    }
    // The next iteration reuses the slots from 0 upwards, under new generations.
    let again: Vec<BufId> = (0..ids.len())
        .map(|_| a.alloc(&mut c, 256, S0).unwrap())
        .collect();
    for (old, new) in ids.iter().zip(&again) {
        assert_eq!(old.slot(), new.slot());
        assert_ne!(old, new);
        assert_stale(&mut a, &mut c, *old);
    }
    assert_disjoint(&a, &c, &again);
    a.reset(&mut c);
    c.empty_cache();
    c.device().assert_no_live_segments();
}

#[test]
fn handles_of_slots_the_arena_lacks_are_stale() {
    let mut c = cache(GIB);
    let mut other = DeviceArena::new();
    let foreign: Vec<BufId> = (0..4)
        .map(|_| other.alloc(&mut c, 512, S0).unwrap())
        .collect();
    let mut a = DeviceArena::new();
    a.alloc(&mut c, 512, S0).unwrap();
    for &id in &foreign[1..] {
        assert_eq!(
            a.ptr(id),
            Err(AllocError::StaleBuffer {
                slot: id.slot(),
                epoch: 0,
                current: 0
            })
        );
        assert_stale(&mut a, &mut c, id);
    }
}

#[test]
fn live_blocks_never_overlap() {
    let mut c = cache(GIB);
    let mut a = DeviceArena::new();
    let mut live = Vec::new();
    let sizes = [
        0,
        1,
        511,
        512,
        513,
        4 * KIB,
        MIB - 1,
        MIB,
        MIB + 1,
        3 * MIB,
        9 * MIB,
        11 * MIB,
    ];
    for round in 0..3 {
        for (i, &n) in sizes.iter().enumerate() {
            live.push(a.alloc(&mut c, n + round * 100, S0).unwrap());
            if i % 3 == 1 {
                let victim = live.remove(live.len() / 2);
                a.recycle(&mut c, victim).unwrap();
            }
            assert_disjoint(&a, &c, &live);
        }
    }
    assert_eq!(a.stats().live_buffers, live.len());
    assert_eq!(
        a.stats().bytes_in_use as u64,
        stat(&c, "allocated_bytes.all.current")
    );
}

/// The sizes of one iteration of the steady loop: small and large pool, a request with a segment
/// of its own, and 0 bytes.
const LOOP_SIZES: [usize; 20] = [
    4 * MIB,
    256,
    12,
    1536 * KIB,
    64 * KIB,
    0,
    700 * KIB,
    11 * MIB,
    KIB,
    2560 * KIB,
    40,
    300 * KIB,
    3 * MIB,
    7,
    96 * KIB,
    5 * MIB,
    512,
    MIB + 1,
    33 * KIB,
    8 * MIB,
];

#[test]
fn a_steady_loop_allocates_from_the_device_only_in_its_first_iteration() {
    let mut c = cache(4 * GIB);
    let mut a = DeviceArena::new();
    let iterations = if cfg!(miri) { 4 } else { 50 };
    let mut device_allocs = Vec::new();
    let mut peaks = Vec::new();
    for _ in 0..iterations {
        a.reset_peak();
        let mut live = Vec::new();
        for (i, &n) in LOOP_SIZES.iter().enumerate() {
            live.push(a.alloc(&mut c, n, S0).unwrap());
            // Gradients of intermediates die mid-iteration: free every third buffer once the one
            // after it exists, plus a retained view that is released twice.
            if i % 3 == 2 {
                let victim = live.remove(live.len() - 2);
                a.recycle(&mut c, victim).unwrap();
            }
            if i == 10 {
                a.retain(live[0]).unwrap();
                a.recycle(&mut c, live[0]).unwrap();
            }
        }
        assert_disjoint(&a, &c, &live);
        assert!(a.stats().bytes_in_use > 0);
        a.reset(&mut c);
        assert_eq!(a.stats().bytes_in_use, 0);
        assert_eq!(a.stats().live_buffers, 0);
        assert_eq!(stat(&c, "allocated_bytes.all.current"), 0);
        device_allocs.push(stat(&c, "num_device_alloc"));
        peaks.push(a.stats().peak_bytes);
    }
    assert!(device_allocs[0] > 0);
    assert!(
        device_allocs.iter().all(|&n| n == device_allocs[0]),
        "device allocations after the first iteration: {device_allocs:?}"
    );
    assert!(peaks.iter().all(|&p| p == peaks[0]), "peaks: {peaks:?}");
    assert_eq!(stat(&c, "num_device_free"), 0);
    let s = a.stats();
    assert_eq!(s.resets, iterations);
    assert_eq!(s.allocs, iterations * LOOP_SIZES.len() as u64);
}

#[test]
fn out_of_memory_is_an_alloc_error() {
    let mut c = cache(24 * MIB);
    let mut a = DeviceArena::new();
    let x = a.alloc(&mut c, 12 * MIB, S0).unwrap();
    let before = a.stats();
    let err = a.alloc(&mut c, 16 * MIB, S0).unwrap_err();
    assert_eq!(
        err,
        AllocError::OutOfMemory {
            requested: 16 * MIB,
            allocated: 12 * MIB,
            reserved: 12 * MIB,
        }
    );
    assert_eq!(a.stats(), before, "a failed allocation changes nothing");
    assert!(matches!(
        a.alloc(&mut c, usize::MAX, S0),
        Err(AllocError::OutOfMemory {
            requested: usize::MAX,
            ..
        })
    ));
    assert_eq!(stat(&c, "num_ooms"), 2);
    // Freeing makes room again (the cache returns its free segment and retries).
    a.recycle(&mut c, x).unwrap();
    let y = a.alloc(&mut c, 16 * MIB, S0).unwrap();
    assert_eq!(a.bytes(y).unwrap(), 16 * MIB);
    assert_eq!(stat(&c, "num_alloc_retries"), 2);
}

#[test]
fn stats_track_use_and_peak() {
    let mut c = cache(GIB);
    let mut a = DeviceArena::new();
    assert_eq!(a.stats(), DeviceArenaStats::default());
    let x = a.alloc(&mut c, 1000, S0).unwrap(); // one 1024-byte block
    let y = a.alloc(&mut c, 2 * MIB, S0).unwrap(); // a 2 MiB block of a large segment
    assert_eq!(a.stats().bytes_in_use, 1024 + 2 * MIB);
    a.recycle(&mut c, y).unwrap();
    let s = a.stats();
    assert_eq!(s.bytes_in_use, 1024);
    assert_eq!(s.peak_bytes, 1024 + 2 * MIB);
    assert_eq!((s.live_buffers, s.allocs), (1, 2));
    a.reset_peak();
    assert_eq!(a.stats().peak_bytes, 1024);
    a.recycle(&mut c, x).unwrap();
    a.reset(&mut c);
    let s = a.stats();
    assert_eq!((s.bytes_in_use, s.peak_bytes, s.live_buffers), (0, 1024, 0));
    assert_eq!((s.allocs, s.resets), (2, 1));
}

#[test]
#[should_panic(expected = "the cache its buffers came from")]
fn recycling_into_another_cache_panics() {
    let mut c = cache(GIB);
    let mut other = cache(GIB);
    let mut a = DeviceArena::new();
    let x = a.alloc(&mut c, 512, S0).unwrap();
    let _ = a.recycle(&mut other, x);
}

// ---------------------------------------------------------------- property test

#[derive(Debug, Clone)]
enum Op {
    Alloc { bytes: usize, stream: u32 },
    Retain(usize),
    Recycle(usize),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let bytes = prop_oneof![
        3 => 0..2 * KIB,
        3 => 2 * KIB..MIB + 1,
        2 => MIB + 1..12 * MIB,
        1 => Just(48 * MIB),
    ];
    prop_oneof![
        6 => (bytes, 0..2u32).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        2 => any::<usize>().prop_map(Op::Retain),
        4 => any::<usize>().prop_map(Op::Recycle),
        1 => Just(Op::Reset),
    ]
}

/// What the model knows of a handle: its requested size and its holders (0 when dead).
#[derive(Debug, Clone, Copy)]
struct Entry {
    id: BufId,
    bytes: usize,
    holders: u32,
}

/// Checks the arena against the model after an operation.
fn check(a: &DeviceArena, c: &Cache, model: &[Entry], allocs: u64, resets: u64) {
    let mut live = Vec::new();
    for e in model {
        if e.holders > 0 {
            assert_eq!(a.bytes(e.id).unwrap(), e.bytes);
            live.push(e.id);
        } else {
            assert!(is_stale(a.ptr(e.id)), "{:?} should be stale", e.id);
            assert!(is_stale(a.bytes(e.id)));
        }
    }
    assert_disjoint(a, c, &live);
    let s = a.stats();
    assert_eq!(s.live_buffers, live.len());
    assert_eq!(s.live_buffers as u64, stat(c, "allocation.all.current"));
    assert_eq!(
        s.bytes_in_use as u64,
        stat(c, "allocated_bytes.all.current")
    );
    let requested: usize = model
        .iter()
        .filter(|e| e.holders > 0)
        .map(|e| e.bytes)
        .sum();
    assert_eq!(requested as u64, stat(c, "requested_bytes.all.current"));
    assert!(s.peak_bytes >= s.bytes_in_use);
    assert_eq!((s.allocs, s.resets), (allocs, resets));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    #[cfg_attr(miri, ignore)]
    fn random_sequences_match_the_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut c = cache(64 * MIB);
        let mut a = DeviceArena::new();
        let mut model: Vec<Entry> = Vec::new();
        let (mut allocs, mut resets) = (0u64, 0u64);
        for op in ops {
            match op {
                Op::Alloc { bytes, stream } => {
                    let before = a.stats();
                    match a.alloc(&mut c, bytes, StreamId(stream)) {
                        Ok(id) => {
                            prop_assert!(
                                model.iter().all(|e| e.id != id),
                                "{id:?} was handed out before"
                            );
                            model.push(Entry { id, bytes, holders: 1 });
                            allocs += 1;
                        }
                        Err(AllocError::OutOfMemory { requested, .. }) => {
                            prop_assert_eq!(requested, bytes);
                            prop_assert_eq!(a.stats(), before);
                        }
                        Err(e) => prop_assert!(false, "unexpected error {e}"),
                    }
                }
                Op::Retain(k) if !model.is_empty() => {
                    let n = model.len();
                    let e = &mut model[k % n];
                    let r = a.retain(e.id);
                    if e.holders > 0 {
                        prop_assert!(r.is_ok());
                        e.holders += 1;
                    } else {
                        prop_assert!(is_stale(r));
                    }
                }
                Op::Recycle(k) if !model.is_empty() => {
                    let n = model.len();
                    let e = &mut model[k % n];
                    let r = a.recycle(&mut c, e.id);
                    if e.holders > 0 {
                        prop_assert!(r.is_ok());
                        e.holders -= 1;
                    } else {
                        prop_assert!(is_stale(r));
                    }
                }
                Op::Retain(_) | Op::Recycle(_) => {}
                Op::Reset => {
                    a.reset(&mut c);
                    resets += 1;
                    for e in &mut model {
                        e.holders = 0;
                    }
                    prop_assert_eq!(a.stats().bytes_in_use, 0);
                    prop_assert_eq!(stat(&c, "allocated_bytes.all.current"), 0);
                }
            }
            check(&a, &c, &model, allocs, resets);
        }
        // Everything goes back, and the cache can then give every segment to the device.
        a.reset(&mut c);
        c.empty_cache();
        c.device().assert_no_live_segments();
    }
}
