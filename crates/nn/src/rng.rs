//! A small seeded random number generator for initialisers and data shuffling.
//!
//! The generator is xoshiro256++ seeded through SplitMix64, implemented here so that the stream a
//! seed produces is part of this crate's contract: a seed gives the same weights and the same
//! batch order on every platform and with every version of the dependencies.

/// A seeded pseudo-random generator (xoshiro256++).
///
/// ```
/// use arenagrad_nn::Rng;
/// let mut a = Rng::seed(7);
/// let mut b = Rng::seed(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// let u = a.uniform();
/// assert!((0.0..1.0).contains(&u));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn seed(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Rng { s }
    }

    /// The generator's whole state: with [`Rng::from_state`], a saved run resumes the same
    /// stream (a checkpoint's data order, say).
    pub fn state(&self) -> [u64; 4] {
        self.s
    }

    /// The generator whose state is `s` (from [`Rng::state`]); `None` for the all-zero state,
    /// which xoshiro256 cannot leave.
    pub fn from_state(s: [u64; 4]) -> Option<Rng> {
        (s != [0; 4]).then_some(Rng { s })
    }

    /// A new generator seeded from this one's stream: an independent stream for a sub-task
    /// (say, one per epoch) that leaves this generator advanced by one draw.
    pub fn fork(&mut self) -> Rng {
        Rng::seed(self.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A uniform sample in `[0, 1)` with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform sample in `[low, high)`.
    pub fn uniform_range(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.uniform()
    }

    /// A standard normal sample (Box–Muller; each call draws two uniforms).
    pub fn normal(&mut self) -> f64 {
        // 1 − u lies in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A uniform integer in `0..n` (without modulo bias). `n` must be non-zero; `0` is returned
    /// for `n == 0`.
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let n = n as u64;
        // Lemire's multiply-shift with rejection of the biased low zone.
        let zone = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= zone {
                return (m >> 64) as usize;
            }
        }
    }

    /// Shuffles `items` in place (Fisher–Yates): every order is equally likely.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    /// A random permutation of `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        self.shuffle(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_fixed_by_the_seed() {
        let mut a = Rng::seed(1);
        let first: Vec<u64> = (0..3).map(|_| a.next_u64()).collect();
        let mut b = Rng::seed(1);
        assert_eq!(first, (0..3).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::seed(2).next_u64(), first[0]);
    }

    #[test]
    fn moments_are_plausible() {
        let mut r = Rng::seed(3);
        let n = 20_000;
        let (mut s, mut s2) = (0.0, 0.0);
        for _ in 0..n {
            let x = r.normal();
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
        let u: f64 = (0..n).map(|_| r.uniform()).sum::<f64>() / n as f64;
        assert!((u - 0.5).abs() < 0.01, "{u}");
    }

    #[test]
    fn permutations_are_permutations() {
        let mut r = Rng::seed(5);
        let mut p = r.permutation(100);
        assert_ne!(p, (0..100).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
        for n in 1..20 {
            assert!(r.below(n) < n);
        }
    }
}
