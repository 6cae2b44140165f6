//! Memory: the randn-matmul loop (`x = randn(requires_grad); (x @ x).sum().backward()`) must leave the
//! arena's peak and the process's resident memory flat, with and without backward. One test in
//! this binary, so no other test's allocations share the process while RSS is read.

use arenagrad_graph::{DType, Graph};

/// Resident memory of this process in bytes (Linux), or None elsewhere.
fn rss() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn leak_check(iters: usize, n: usize, backward: bool) -> (Vec<usize>, Vec<usize>) {
    let mut g = Graph::with_threads(1);
    let mut peaks = Vec::new();
    let mut rsses = Vec::new();
    for i in 0..iters {
        let x = g
            .randn(&[n, n], DType::F32)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let y = x.matmul(x).unwrap().sum().unwrap();
        if backward {
            y.backward().unwrap();
            assert!(x.grad().unwrap().is_some());
        }
        g.reset();
        if i % 500 == 0 || i + 1 == iters {
            peaks.push(g.stats().arena.peak_bytes_bumped);
            rsses.push(rss().unwrap_or(0));
        }
    }
    (peaks, rsses)
}

fn assert_flat(label: &str, peaks: &[usize], rsses: &[usize]) {
    // The arena's peak is reached in the first iteration and never grows.
    assert!(
        peaks.iter().all(|&p| p == peaks[0]),
        "{label}: arena peak grew: {peaks:?}"
    );
    // Resident memory after warm-up stays within 4 MiB of its value at iteration 500.
    let base = rsses[1];
    for &r in &rsses[1..] {
        assert!(
            r <= base + (4 << 20),
            "{label}: RSS grew from {base} to {r}: {rsses:?}"
        );
    }
}

#[test]
#[cfg_attr(miri, ignore)]
fn leak_check_memory_is_flat_with_and_without_backward() {
    let (p, r) = leak_check(10_000, 128, true);
    assert_flat("backward", &p, &r);
    let (p, r) = leak_check(10_000, 128, false);
    assert_flat("no backward", &p, &r);
}
