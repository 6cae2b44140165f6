//! bf16 products on AMX's tile unit through the graph: a layer's product rounded from each
//! thread's sums as they are made (no f32 buffer of the whole output) gives the bits of the
//! route through that buffer. A process of its own: `set_amx` is process-wide, and the other
//! tests expect the default kernel's bits.

use arenagrad_graph::exec::cpu::bf16 as bf16_exec;
use arenagrad_graph::{bf16, DType, Graph};

/// `n` values in (−2, 2), none zero (a start of −0 and one of +0 may sum to different zeros).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = ((s >> 33) as f64 / (1u64 << 31) as f64) * 4.0 - 2.0;
            if x == 0.0 {
                0.5
            } else {
                x
            }
        })
        .collect()
}

fn bits(t: arenagrad_graph::Tensor<'_>) -> Vec<u16> {
    t.to_vec::<bf16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn rounded_products_on_amx_give_the_bits_of_the_f32_route() {
    if !bf16_exec::set_amx(true) {
        arenagrad_graph::testing::skip(
            "no AMX-BF16 here, or Linux did not grant the tile registers",
        );
        return;
    }
    // Rows, `k` and columns at and off the blocks' edges, up to four times as many columns as
    // rows; `k` of 600 and five times as many columns as rows take the f32 route both ways
    // (two blocks of `k`; every thread would pack too wide a `b`), as checks on the check.
    for &(m, k, n) in &[
        (70, 48, 33),
        (256, 128, 96),
        (64, 512, 64),
        (33, 7, 1),
        (40, 64, 150),
        (32, 96, 128),
        (40, 600, 24),
        (16, 32, 80),
    ] {
        for threads in [1, 2, 3] {
            let g = Graph::new();
            g.set_threads(threads);
            let leaf = |seed, shape: &[usize]| {
                let v = values(seed, shape.iter().product());
                g.leaf(&v, shape, DType::BF16).unwrap()
            };
            let (x, w, bias) = (leaf(1, &[m, k]), leaf(2, &[n, k]), leaf(3, &[n]));
            let what = format!("{m}×{k}×{n} on {threads} threads");
            // From a bias row (rounded from the strip) against the same bias spread over every
            // row (through the f32 buffer).
            let spread = bias.reshape(&[1, n as isize]).unwrap();
            let spread = spread.add(g.zeros(&[m, n], DType::BF16).unwrap()).unwrap();
            let from_row = bias.addmm_t(x, w, false, true).unwrap();
            let from_full = spread.addmm_t(x, w, false, true).unwrap();
            assert!(bits(from_row) == bits(from_full), "{what}: from a bias");
            // From nothing against from zeros spread over the output.
            let plain = x.matmul_t(w, false, true).unwrap();
            let zeros = g.zeros(&[m, n], DType::BF16).unwrap();
            let from_zeros = zeros.addmm_t(x, w, false, true).unwrap();
            assert!(bits(plain) == bits(from_zeros), "{what}: from nothing");
        }
    }
    bf16_exec::set_amx(false);
}
