//! A scope's region is cleared as it is carved, not whole when it is made. Made whole, a region
//! sized for a scope four times over was resident at once however little of it was used (the
//! char LSTM's validation pass held 1.8 GB more than it used). One test per process: it reads
//! the process's resident memory.
// Not under Miri: it reads procfs and makes a 256 MiB region.
#![cfg(all(target_os = "linux", not(miri)))]

use arenagrad_alloc::Arena;

/// The size of a page (`getconf PAGESIZE`; 4 KiB where it cannot be asked).
fn page_bytes() -> usize {
    std::process::Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// The process's resident bytes (`/proc/self/statm`, in pages).
fn resident_bytes() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").expect("procfs");
    let pages: usize = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's second field");
    pages * page_bytes()
}

#[test]
fn a_region_is_resident_only_where_carved() {
    const MIB: usize = 1 << 20;
    let mut a = Arena::new();
    // A first outermost scope takes 64 MiB from outside the region: the scopes after it get a
    // region that holds this one four times over.
    let m = a.mark();
    let big = a.alloc_zeroed::<f32>(16 * MIB).unwrap();
    assert_eq!(a.slice::<f32>(big).unwrap().len(), 16 * MIB);
    let before = resident_bytes();
    a.rollback(m);
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 32 * MIB,
        "a 256 MiB region made {} MiB resident before any use",
        grown / MIB
    );
    // The next scope carves from it: cleared memory, then (after a rollback) the old values,
    // with no second clearing.
    let m = a.mark();
    let before = resident_bytes();
    let b = a.alloc_scratch::<f32>(8 * MIB).unwrap();
    assert!(a.slice::<f32>(b).unwrap().iter().all(|&v| v == 0.0));
    assert!(
        resident_bytes() - before >= 16 * MIB,
        "carved memory is written"
    );
    a.slice_mut::<f32>(b).unwrap().fill(1.5);
    a.rollback(m);
    let m = a.mark();
    let c = a.alloc_scratch::<f32>(8 * MIB).unwrap();
    assert!(a.slice::<f32>(c).unwrap().iter().all(|&v| v == 1.5));
    // A carve past what was written before is cleared only there.
    let d = a.alloc_scratch::<f32>(8 * MIB).unwrap();
    assert!(a.slice::<f32>(d).unwrap().iter().all(|&v| v == 0.0));
    // Small buffers come from the top end, cleared the same way.
    let e = a.alloc_scratch::<f64>(3).unwrap();
    assert_eq!(a.slice::<f64>(e).unwrap(), &[0.0; 3]);
    a.rollback(m);
}
