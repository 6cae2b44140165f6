//! An LSTM layer run for inference (nothing recorded) over a long sequence makes its input
//! projections a piece of the sequence at a time, in scopes of their own: the same output and
//! final states as the whole projection, and a fraction of its memory.

use arenagrad_nn::{DType, Graph, Rng, RnnConfig, LSTM};

/// Outputs, final hidden and cell states, as bits.
fn run(lstm: &LSTM, g: &Graph, lengths: Option<&[usize]>, [t, b, f]: [usize; 3]) -> Vec<Vec<u32>> {
    let mut rng = Rng::seed(7);
    let x: Vec<f64> = (0..t * b * f)
        .map(|_| rng.uniform_range(-1.0, 1.0))
        .collect();
    let x = g.from_f64(&x, &[t, b, f], DType::F32).unwrap();
    let out = lstm.forward_with(g, x, None, lengths).unwrap();
    [out.output, out.h_n, out.c_n.unwrap()]
        .iter()
        .map(|v| {
            v.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn an_lstm_for_inference_runs_a_long_sequence_in_pieces_with_the_same_result() {
    // 16 rows of 64 units: 16 KiB of projections per position, so 600 positions are three
    // pieces of 256, 256 and 88 (4 MiB at a time).
    let shape = [600, 16, 5];
    let lengths: Vec<usize> = (0..16).map(|r| [600, 300, 257, 256, 5, 0][r % 6]).collect();
    for bidirectional in [false, true] {
        let cfg = RnnConfig {
            num_layers: 2,
            bidirectional,
            ..Default::default()
        };
        let lstm = LSTM::with_config(5, 64, cfg, &mut Rng::seed(3)).unwrap();
        for lengths in [None, Some(&lengths[..])] {
            // Recorded (grad on, parameters requiring grad): the whole projection at once.
            let g = Graph::new();
            let whole = run(&lstm, &g, lengths, shape);
            assert!(g.stats().tape_len > 0);
            // Under no_grad: in pieces.
            let g = Graph::new();
            let _no_grad = g.no_grad();
            let before = g.stats().arena.bytes_in_use;
            g.reset_peak_stats();
            let pieces = run(&lstm, &g, lengths, shape);
            assert_eq!(
                pieces,
                whole,
                "bidirectional {bidirectional}, lengths {:?}",
                lengths.is_some()
            );
            // What is made at once besides the layers' outputs (each direction's, and their
            // concatenation): one piece's projection (4 MiB), its input rows and output (1 MiB
            // each) and small companions. The whole projection of one layer and direction
            // (600 · 16 · 256 f32) is 9.4 MiB by itself, and all of them were kept.
            let dirs = if bidirectional { 2 } else { 1 };
            let y = 600 * 16 * 64 * 4;
            let outputs = 2 * dirs * y + if bidirectional { 2 * 2 * y } else { 0 };
            let peak = g.stats().arena.peak_bytes_in_use - before;
            assert!(
                peak < outputs + (8 << 20),
                "bidirectional {bidirectional}: peak {peak} B, outputs {outputs} B"
            );
        }
    }
}
