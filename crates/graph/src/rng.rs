//! The one seeded random number generator: `Graph::randn`/`rand`, dropout, gradcheck's weights,
//! and (through `arenagrad-nn`) initialisers and data shuffling all draw from it.
//!
//! The generator is xoshiro256++ seeded through SplitMix64, and normals come from a 256-layer
//! ziggurat whose tables are computed with `libm` (pure Rust, the same bits everywhere). Both are
//! implemented here so that the stream a seed produces is part of this crate's contract: a seed
//! gives the same samples on every platform and with every version of the dependencies (a test
//! pins the first values of each kind of draw).

use std::sync::OnceLock;

use crate::error::Result;
use crate::host::try_vec;

/// A seeded pseudo-random generator (xoshiro256++).
///
/// ```
/// use arenagrad_graph::Rng;
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
        // 53 bits fit an i64, whose conversion is one instruction (a u64's is several).
        ((self.next_u64() >> 11) as i64) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform sample in `[low, high)`.
    pub fn uniform_range(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.uniform()
    }

    /// A uniform sample in `(0, 1]` (never 0, so its logarithm is finite).
    fn uniform_open0(&mut self) -> f64 {
        1.0 - self.uniform()
    }

    /// A standard normal sample (Marsaglia and Tsang's ziggurat with 256 layers: one 64-bit draw
    /// for all but about 1.3% of samples).
    pub fn normal(&mut self) -> f64 {
        self.normal_from(ziggurat())
    }

    /// One draw of the ziggurat: the layer `i`, the signed uniform `u` and `x = u·x[i]`.
    #[inline(always)]
    fn layer_draw(&mut self, z: &Ziggurat) -> (usize, f64, f64) {
        let bits = self.next_u64();
        // The low 8 bits pick the layer; the top 52 are the mantissa of a float in [1, 2),
        // which gives a signed uniform in [−1, 1) with no integer conversion.
        let i = (bits & 0xff) as usize;
        let u = 2.0 * f64::from_bits((bits >> 12) | 0x3ff0_0000_0000_0000) - 3.0;
        (i, u, u * z.x[i])
    }

    #[inline]
    fn normal_from(&mut self, z: &Ziggurat) -> f64 {
        let (i, u, x) = self.layer_draw(z);
        if x.abs() < z.x[i + 1] {
            return x;
        }
        self.normal_slow(z, i, u, x)
    }

    /// The ~1% of draws outside the layers' rectangles, kept out of the inlined fast path.
    #[cold]
    #[inline(never)]
    fn normal_slow(&mut self, z: &Ziggurat, mut i: usize, mut u: f64, mut x: f64) -> f64 {
        loop {
            if i == 0 {
                // The tail beyond r (Marsaglia's method).
                loop {
                    let a = -libm::log(self.uniform_open0()) / ZIG_R;
                    let b = -libm::log(self.uniform_open0());
                    if 2.0 * b >= a * a {
                        return if u < 0.0 { -(ZIG_R + a) } else { ZIG_R + a };
                    }
                }
            }
            // The wedge between layers i + 1 and i.
            if z.f[i + 1] + (z.f[i] - z.f[i + 1]) * self.uniform() < libm::exp(-0.5 * x * x) {
                return x;
            }
            // Rejected: a fresh draw, as from the start.
            (i, u, x) = self.layer_draw(z);
            if x.abs() < z.x[i + 1] {
                return x;
            }
        }
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

    /// A random permutation of `0..n`, or
    /// [`GraphError::OutOfMemory`](crate::GraphError::OutOfMemory) (op `permutation`) when the
    /// host cannot hold `n` indices: a length read from a file or a header must not abort the
    /// process.
    ///
    /// ```
    /// use arenagrad_graph::{GraphError, Rng};
    /// let mut p = Rng::seed(3).permutation(5)?;
    /// p.sort_unstable();
    /// assert_eq!(p, [0, 1, 2, 3, 4]);
    /// assert!(matches!(
    ///     Rng::seed(3).permutation(1 << 60),
    ///     Err(GraphError::OutOfMemory { .. })
    /// ));
    /// # Ok::<(), GraphError>(())
    /// ```
    pub fn permutation(&mut self, n: usize) -> Result<Vec<usize>> {
        let mut v = try_vec::<usize>("permutation", &[n], n)?;
        v.extend(0..n);
        self.shuffle(&mut v);
        Ok(v)
    }
}

/// [`Rng::normal`] with the tables looked up once, for a loop of draws.
pub(crate) fn normal_sampler() -> impl Fn(&mut Rng) -> f64 {
    let z = ziggurat();
    move |r| r.normal_from(z)
}

/// The ziggurat's rightmost layer edge and the area of each layer (Marsaglia and Tsang, 2000).
const ZIG_R: f64 = 3.654_152_885_361_009;
const ZIG_V: f64 = 0.004_928_673_233_99;

/// Layer edges `x[0] > x[1] = r > … > x[256] = 0` and the density `f(x) = e^{−x²/2}` there.
struct Ziggurat {
    x: [f64; 257],
    f: [f64; 257],
}

fn ziggurat() -> &'static Ziggurat {
    static TABLES: OnceLock<Ziggurat> = OnceLock::new();
    TABLES.get_or_init(|| {
        let density = |x: f64| libm::exp(-0.5 * x * x);
        let mut x = [0.0; 257];
        x[0] = ZIG_V / density(ZIG_R);
        x[1] = ZIG_R;
        for i in 2..256 {
            // Each layer has area v: x[i−1]·(f(x[i]) − f(x[i−1])) = v.
            // sqrt from std: IEEE-754 rounds it exactly everywhere (libm's x86 version is inline
            // assembly, which Miri cannot run).
            x[i] = (-2.0 * libm::log(ZIG_V / x[i - 1] + density(x[i - 1]))).sqrt();
        }
        x[256] = 0.0;
        let f = x.map(density);
        Ziggurat { x, f }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_matches_the_reference_stream() {
        // The reference implementation's first outputs from the state [1, 2, 3, 4].
        let mut r = Rng::from_state([1, 2, 3, 4]).unwrap();
        let want: [u64; 10] = [
            41943041,
            58720359,
            3588806011781223,
            3591011842654386,
            9228616714210784205,
            9973669472204895162,
            14011001112246962877,
            12406186145184390807,
            15849039046786891736,
            10450023813501588000,
        ];
        assert_eq!((0..10).map(|_| r.next_u64()).collect::<Vec<_>>(), want);
    }

    #[test]
    fn splitmix_matches_the_reference_stream() {
        let mut x = 1234567;
        let want: [u64; 5] = [
            6457827717110365317,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        assert_eq!((0..5).map(|_| splitmix64(&mut x)).collect::<Vec<_>>(), want);
    }

    #[test]
    fn first_draws_of_a_seed_are_pinned() {
        // A seed's stream is part of the contract: these change only with a documented break.
        let mut r = Rng::seed(0);
        let u64s: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            u64s,
            [
                5987356902031041503,
                7051070477665621255,
                6633766593972829180
            ]
        );
        let mut r = Rng::seed(0);
        let u: Vec<f64> = (0..3).map(|_| r.uniform()).collect();
        assert_eq!(
            u,
            [0.3245752680314067, 0.38223929651167343, 0.3596172076473553]
        );
        let mut r = Rng::seed(0);
        let n: Vec<f64> = (0..6).map(|_| r.normal()).collect();
        let want = [
            -0.29280329860470816,
            -0.7131206168144315,
            -0.1053211603531886,
            -2.43645251565255,
            -0.006746890245517888,
            -1.3049728444939162,
        ];
        assert_eq!(n, want);
    }

    #[test]
    fn the_graph_draws_from_this_generator() {
        use crate::{DType, Graph};
        let g = Graph::new();
        g.seed(5);
        let n = g.randn(&[4], DType::F64).unwrap().to_vec::<f64>().unwrap();
        let u = g.rand(&[3], DType::F32).unwrap().to_vec::<f32>().unwrap();
        let mut r = Rng::seed(5);
        assert_eq!(n, (0..4).map(|_| r.normal()).collect::<Vec<_>>());
        assert_eq!(u, (0..3).map(|_| r.uniform() as f32).collect::<Vec<_>>());
    }

    #[test]
    fn ziggurat_tables_are_sane() {
        let z = ziggurat();
        assert!(z.x.windows(2).all(|w| w[0] > w[1]), "edges must descend");
        assert_eq!(z.x[256], 0.0);
        // The top layer's edge is small and the recurrence stayed real.
        assert!(z.x[255] > 0.0 && z.x[255] < 0.3, "{}", z.x[255]);
        // Every layer has the same area v.
        for i in 1..255 {
            let area = z.x[i] * (z.f[i + 1] - z.f[i]);
            assert!((area - ZIG_V).abs() < 1e-12, "layer {i}: {area}");
        }
    }

    #[test]
    // Statistics, not memory: hundreds of thousands of draws are minutes under Miri.
    #[cfg_attr(miri, ignore)]
    fn normals_follow_the_normal_distribution() {
        // Kolmogorov–Smirnov against Φ over 200 000 draws (critical value at α = 0.001 is
        // 1.95/√n), and the tail mass beyond the ziggurat's r against 2(1 − Φ(r)).
        let n = 200_000;
        let mut r = Rng::seed(11);
        let mut xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        xs.sort_by(f64::total_cmp);
        let phi = |x: f64| 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2);
        let d = xs
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = phi(x);
                (c - i as f64 / n as f64)
                    .abs()
                    .max(((i + 1) as f64 / n as f64 - c).abs())
            })
            .fold(0.0, f64::max);
        assert!(d < 1.95 / (n as f64).sqrt(), "KS distance {d}");
        let tail = xs.iter().filter(|x| x.abs() > ZIG_R).count() as f64;
        let want = 2.0 * (1.0 - phi(ZIG_R)) * n as f64; // ≈ 52
        assert!(
            (tail - want).abs() < 4.0 * want.sqrt() + 1.0,
            "{tail} vs {want}"
        );
    }

    #[test]
    fn streams_are_fixed_by_the_seed() {
        let mut a = Rng::seed(1);
        let first: Vec<u64> = (0..3).map(|_| a.next_u64()).collect();
        let mut b = Rng::seed(1);
        assert_eq!(first, (0..3).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::seed(2).next_u64(), first[0]);
    }

    #[test]
    // Statistics, not memory: hundreds of thousands of draws are minutes under Miri.
    #[cfg_attr(miri, ignore)]
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
        let mut p = r.permutation(100).unwrap();
        assert_ne!(p, (0..100).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
        for n in 1..20 {
            assert!(r.below(n) < n);
        }
    }

    /// A length the host cannot hold is a typed error naming the op and the length, at once
    /// (it aborted the process: the index list was collected infallibly).
    // Miri stops at an allocation it cannot make instead of reporting it.
    #[cfg_attr(miri, ignore)]
    #[test]
    fn a_permutation_too_large_to_hold_is_an_error() {
        // 2^47 bytes: the whole user address space of x86-64, refused whatever the host's
        // overcommit setting (2^40 indices could be granted and then filled).
        let n = 1usize << 44;
        let before = Rng::seed(5);
        let mut r = before.clone();
        match r.permutation(n) {
            Err(crate::GraphError::OutOfMemory { op, shape, bytes }) => {
                assert_eq!((op, shape, bytes), ("permutation", vec![n], n * 8));
            }
            other => panic!("expected OutOfMemory, got {:?}", other.map(|v| v.len())),
        }
        // Nothing drawn: the stream is where it was.
        assert_eq!(r, before);
        assert_eq!(r.permutation(0).unwrap(), Vec::<usize>::new());
    }
}
