//! Zeros from the allocator's zeroed memory cost no pass of their own: a large zero tensor
//! leaves its pages untouched until they are written (what a model built only to load a
//! checkpoint over its parameters relies on). Alone in its file, so that no other test's
//! memory moves the resident set while it is read.

use arenagrad_graph::{DType, HostTensor};

/// The resident set, in bytes (Linux).
fn resident() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn large_zero_tensors_leave_their_pages_untouched() {
    if cfg!(miri) || resident().is_none() {
        arenagrad_graph::testing::skip("no /proc/self/statm to read the resident set from");
        return;
    }
    const MB: usize = 1 << 20;
    // glibc serves blocks below its threshold for fresh pages from its heap, where a block
    // just released is handed out again and must be cleared, and raises the threshold to the
    // size of a large block released (up to 32 MB): release one of 16 MB first, so that the
    // smaller sizes below are heap blocks. They are kept, as a model keeps its parameters.
    drop(std::hint::black_box(vec![1u8; 16 * MB]));
    let mut kept = Vec::new();
    for mb in [2usize, 6, 12, 24, 3, 7] {
        let before = resident().unwrap();
        kept.push(HostTensor::zeros(&[mb * MB / 4], DType::F32).unwrap());
        let grown = resident().unwrap().saturating_sub(before);
        assert!(
            grown < MB,
            "{mb} MB of zeros made {:.1} MB resident",
            grown as f64 / MB as f64
        );
    }
    // They are zeros nonetheless.
    for t in &kept {
        assert!(t.to_f64_vec().iter().step_by(4099).all(|&v| v == 0.0));
    }
}
