//! More threads than cores: the kernels finish and give one thread's bits.
//!
//! A graph's thread count is the caller's choice and the cores are the machine's: an application
//! may ask for 8 threads on 2 cores, or share the cores with its own busy threads and with other
//! processes. The waits between the engine's threads (the pool's hand-offs, the recurrences'
//! meetings once a step) must then neither deadlock nor change a result. One training step that
//! goes through the forking kernels (matrix products, convolution, layer norm, attention,
//! elementwise maps) and the recurrence whose threads meet every step (an LSTM over a sequence at
//! a small batch, divided between threads by hidden units) runs at 1 thread, at 8 threads, and at
//! 3 threads while another thread of the process keeps a core busy; every value and gradient must
//! have the same bits. Not a timing test: it proves the work finishes and the results do not
//! depend on the schedule.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use arenagrad_graph::{AttentionOptions, DType, Graph, LstmSequenceOptions};
use common::values;

/// The step's outputs and every input's gradient, as bits.
fn step(threads: usize) -> Vec<Vec<u32>> {
    let g = Graph::with_threads(threads);
    let (t, b, i, h) = (6, 3, 16, 96);
    let var = |shape: &[usize], seed: u64, scale: f64| {
        let n = shape.iter().product();
        let v: Vec<f64> = values(n, seed, false).iter().map(|x| x * scale).collect();
        g.leaf(&v, shape, DType::F32).unwrap()
    };
    // The recurrence: an input projection, then the fused LSTM over the sequence.
    let xs = var(&[t, b, i], 1, 1.0);
    let w_ih = var(&[i, 4 * h], 2, 0.2);
    let w_hh = var(&[4 * h, h], 3, 0.1);
    let h0 = var(&[b, h], 4, 0.5);
    let c0 = var(&[b, h], 5, 0.5);
    let z = xs.matmul(w_ih).unwrap();
    let (y, hn, _cn) = z
        .lstm_sequence(w_hh, h0, c0, LstmSequenceOptions::default())
        .unwrap();
    // Forking kernels: a large product, layer norm, attention, a convolution, elementwise maps.
    let a = var(&[192, 160], 6, 0.3);
    let w = var(&[160, 224], 7, 0.3);
    let p = a.matmul(w).unwrap().tanh().unwrap();
    let ln = p.layer_norm(1, None, None, 1e-5).unwrap();
    let q = var(&[2, 2, 48, 16], 8, 0.5);
    let k = var(&[2, 2, 48, 16], 9, 0.5);
    let v = var(&[2, 2, 48, 16], 10, 0.5);
    let att = q
        .scaled_dot_product_attention(
            k,
            v,
            AttentionOptions {
                causal: true,
                ..Default::default()
            },
        )
        .unwrap();
    let img = var(&[4, 3, 20, 20], 11, 1.0);
    let filt = var(&[8, 3, 3, 3], 12, 0.3);
    let conv = img
        .conv2d(filt, (1, 1), (1, 1), (1, 1), 1)
        .unwrap()
        .relu()
        .unwrap();
    let outs = [y, hn, ln, att, conv];
    let mut loss = None;
    for (n, o) in outs.iter().enumerate() {
        let wts = g
            .from_f64(
                &values(o.numel(), 20 + n as u64, false),
                &o.shape(),
                DType::F32,
            )
            .unwrap();
        let term = o.mul(wts).unwrap().sum().unwrap();
        loss = Some(match loss {
            None => term,
            Some(l) => term.add(l).unwrap(),
        });
    }
    loss.unwrap().backward().unwrap();
    let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let mut got: Vec<Vec<u32>> = outs
        .iter()
        .map(|o| bits(o.to_vec::<f32>().unwrap()))
        .collect();
    for x in [xs, w_ih, w_hh, h0, c0, a, w, q, k, v, img, filt] {
        got.push(bits(x.grad().unwrap().unwrap().to_vec::<f32>().unwrap()));
    }
    got
}

#[test]
fn eight_threads_give_one_threads_bits() {
    let one = step(1);
    for round in 0..3 {
        assert!(step(8) == one, "8 threads, round {round}");
    }
}

/// Stops the busy thread however the test ends (a panic too: the scope would otherwise wait
/// for it forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn three_threads_beside_a_busy_thread_give_one_threads_bits() {
    let one = step(1);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        // The application's own work, holding a core the whole time.
        s.spawn(|| {
            let mut x = 1u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
        });
        for round in 0..3 {
            assert!(step(3) == one, "3 threads beside a busy one, round {round}");
        }
    });
}

/// Run as a child under `taskset -c 0` by the test below: prints the default thread count.
const PRINT_DEFAULT: &str = "ARENAGRAD_TEST_PRINT_DEFAULT_THREADS";

#[cfg(target_os = "linux")]
#[test]
fn the_default_thread_count_follows_the_cpus_this_process_may_use() {
    if std::env::var_os(PRINT_DEFAULT).is_some() {
        println!("default threads: {}", arenagrad_graph::default_threads());
        return;
    }
    let name = "the_default_thread_count_follows_the_cpus_this_process_may_use";
    // The first CPU this process may use (CPU 0 need not be one of them).
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let first = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|l| l.trim().split([',', '-']).next())
        .expect("Cpus_allowed_list in /proc/self/status")
        .to_string();
    // One CPU allowed (the affinity a `taskset`, a container or a job scheduler sets): one
    // thread by default, not one per core of the machine.
    let out = std::process::Command::new("taskset")
        .args(["-c", &first])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(PRINT_DEFAULT, "1")
        .env_remove("ARENAGRAD_NUM_THREADS")
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            // util-linux is essential on Debian; elsewhere it may be missing.
            arenagrad_graph::testing::skip(format!("taskset could not run ({e})"));
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("default threads: 1\n"), "{text}");
}
