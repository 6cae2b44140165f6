//! Test data shared by the graph's integration tests.

/// `n` deterministic values of magnitude in [0.2, 1.5) (away from the kinks of abs, relu and
/// max at 0), negative about half the time unless `positive`.
pub fn values(n: usize, seed: u64, positive: bool) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let x = 0.2 + 1.3 * u;
            if positive || s & 1 == 0 {
                x
            } else {
                -x
            }
        })
        .collect()
}
