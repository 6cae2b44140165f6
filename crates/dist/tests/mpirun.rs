//! Two ranks under `mpirun -np 2` (Open MPI): the test binary launches itself, each rank runs
//! the child half of the test, and the parent checks what they wrote.
//!
//! * Equivalence: two ranks of 32 examples train to the weights of one process with batch 64 —
//!   bit for bit with a rank-order all-reduce, against one process that combines the halves'
//!   gradients in that order, and within f32 rounding against one pass over all 64.
//! * Checkpoints: rank 0 alone writes one, and it loads into a model on one process.
//! * A rank that stops answering fails the other with a timeout error; one that dies ends the
//!   job, neither hangs.
//!
//! Without `mpirun` the tests skip with their reason, unless `ARENAGRAD_REQUIRE_MPI=1` (CI).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arenagrad_dist::{Communicator, DataParallel, DdpConfig, DistError, MpiConfig, ProcessGroup};
use arenagrad_graph::testing::{skip_or_fail, REQUIRE_MPI};
use arenagrad_graph::HostData;
use arenagrad_nn::checkpoint;
use arenagrad_nn::optim::Optimizer;
use arenagrad_nn::{Graph, Module};
use common::*;

/// Set in the ranks' environment: the folder they write to.
const CHILD: &str = "ARENAGRAD_DIST_CHILD";
/// Set in the ranks' environment: what the failure test's rank 1 does.
const CASE: &str = "ARENAGRAD_DIST_CASE";

/// The ranks' output and exit status, and how long the job took.
struct Job {
    ok: bool,
    code: Option<i32>,
    output: String,
    took: Duration,
}

/// Runs test `test` of this binary on `np` ranks under `mpirun`, killed after `limit`; `None`
/// (skipped) where there is no `mpirun`.
fn mpirun(test: &str, dir: &Path, env: &[(&str, &str)], limit: Duration) -> Option<Job> {
    let found = Command::new("mpirun").arg("--version").output().is_ok();
    if !found {
        skip_or_fail(
            REQUIRE_MPI,
            "no mpirun on PATH (Debian: openmpi-bin, libopenmpi-dev)",
        );
        return None;
    }
    let log = dir.join("mpirun.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", "2", "--oversubscribe", "--bind-to", "none"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD, dir)
        // Open MPI refuses root without these (a container's CI runs as root); no effect otherwise.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("mpirun starts");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Some(Job {
        ok: status.is_some_and(|s| s.success()),
        code: status.and_then(|s| s.code()),
        output: std::fs::read_to_string(&log).unwrap_or_default(),
        took: t0.elapsed(),
    })
}

fn child_dir() -> Option<PathBuf> {
    std::env::var_os(CHILD).map(PathBuf::from)
}

fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank{rank}.safetensors"))
}

fn loaded(path: &Path) -> Vec<Vec<f32>> {
    let model = cnn();
    checkpoint::load(&model, path).unwrap();
    weights(&model)
}

#[test]
fn two_ranks_of_32_train_to_the_weights_of_one_process_with_batch_64() {
    if let Some(dir) = child_dir() {
        return equivalence_rank(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(job) = mpirun(
        "two_ranks_of_32_train_to_the_weights_of_one_process_with_batch_64",
        dir.path(),
        &[],
        Duration::from_secs(300),
    ) else {
        return;
    };
    assert!(job.ok, "the ranks failed:\n{}", job.output);
    let (r0, r1) = (
        loaded(&rank_file(dir.path(), 0)),
        loaded(&rank_file(dir.path(), 1)),
    );
    assert_same(&r0, &r1, "rank 0 vs rank 1");
    assert_same(
        &r0,
        &one_process_two_halves(),
        "2 ranks vs one process's (g0 + g1) / 2",
    );
    // One pass over 64 sums its gradient in another order: the same up to f32 rounding,
    // grown over 50 steps of momentum SGD.
    let drift = max_rel_diff(&r0, &one_process_batch_64());
    eprintln!("2 ranks vs one pass over 64: largest relative weight difference {drift:e}");
    assert!(drift < 1e-4, "2 ranks vs batch 64: {drift:e}");
    assert!(
        drift > 0.0,
        "identical to batch 64: the references cannot tell them apart"
    );
    // Rank 0 alone wrote the checkpoint; it loads on one process, into a model on one rank.
    let main = dir.path().join("main.safetensors");
    let single =
        DataParallel::new(cnn(), Arc::new(arenagrad_dist::Local), DdpConfig::default()).unwrap();
    checkpoint::load(&single, &main).unwrap();
    assert_same(&weights(&single), &r0, "checkpoint vs rank 0");
    let written: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("main"))
        .collect();
    assert_eq!(written, ["main.safetensors"]);
}

fn equivalence_rank(dir: &Path) {
    let comm = Arc::new(
        ProcessGroup::mpi(MpiConfig {
            deterministic: true,
            timeout: Duration::from_secs(120),
        })
        .unwrap(),
    );
    assert_eq!(comm.world_size(), 2);
    let r = comm.rank();
    let model = cnn();
    if r == 1 {
        // Rank 1 starts from other weights: the wrapper must hand it rank 0's.
        for p in model.parameters() {
            p.update(|v, _| {
                if let arenagrad_graph::HostDataMut::F32(v) = v {
                    v.iter_mut().for_each(|x| *x += 1.0);
                }
            });
        }
    }
    // Small buckets: several all-reduces a step, started in backward's order.
    let config = DdpConfig {
        bucket_bytes: 4096,
        first_bucket_bytes: 4096,
        ..DdpConfig::default()
    };
    let model = DataParallel::new(model, comm.clone(), config).unwrap();
    assert_eq!(
        weights(&model),
        weights(&cnn()),
        "rank {r} did not get rank 0's weights"
    );
    let mut opt = sgd(&model);
    let mut g = Graph::with_threads(1);
    let mut waits = Vec::new();
    for step in 0..STEPS {
        opt.zero_grad();
        backward(&model, &mut g, step, r * 32..(r + 1) * 32);
        let stats = model.step(&mut opt).unwrap();
        assert_eq!(stats.started_in_backward, model.buckets());
        waits.push(stats.wait);
    }
    eprintln!(
        "rank {r}: {} buckets, median wait after backward {:?}",
        model.buckets(),
        {
            waits.sort();
            waits[waits.len() / 2]
        }
    );
    checkpoint::save(model.module(), rank_file(dir, r)).unwrap();
    let main = dir.join("main.safetensors");
    model
        .on_main(|| checkpoint::save(model.module(), &main))
        .unwrap();
    assert!(
        main.exists(),
        "rank {r}: on_main returned before rank 0 wrote"
    );
}

#[test]
fn a_rank_that_stops_answering_fails_the_other_within_the_timeout() {
    if child_dir().is_some() {
        return failing_rank();
    }
    let dir = tempfile::tempdir().unwrap();
    let test = "a_rank_that_stops_answering_fails_the_other_within_the_timeout";
    // Rank 1 goes silent: rank 0's all-reduce must give up after its 3 s and say so.
    let Some(job) = mpirun(test, dir.path(), &[(CASE, "hang")], Duration::from_secs(60)) else {
        return;
    };
    assert!(!job.ok, "the job succeeded:\n{}", job.output);
    assert!(
        job.output.contains(
            "rank 0: all_reduce on rank 0 of 2: no answer from the other ranks within 3.0 s"
        ),
        "{}",
        job.output
    );
    assert!(job.took < Duration::from_secs(40), "took {:?}", job.took);
    // Rank 1 dies: the job ends (MPI's launcher takes the others down), not a hang.
    let Some(job) = mpirun(test, dir.path(), &[(CASE, "die")], Duration::from_secs(60)) else {
        return;
    };
    assert!(!job.ok, "the job succeeded:\n{}", job.output);
    assert!(
        job.code.is_some(),
        "killed after a minute: it hung\n{}",
        job.output
    );
}

fn failing_rank() {
    let case = std::env::var(CASE).unwrap();
    let comm = ProcessGroup::mpi(MpiConfig {
        deterministic: false,
        timeout: Duration::from_secs(3),
    })
    .unwrap();
    if comm.rank() == 1 {
        if case == "die" {
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    let e = comm
        .all_reduce(HostData::F32(vec![1.0; 8]), arenagrad_dist::Reduce::Sum)
        .unwrap_err();
    eprintln!("rank 0: {e}");
    assert!(matches!(e, DistError::Timeout { .. }), "{e}");
    // Every later operation is refused at once, naming the first failure.
    let again = comm.barrier().unwrap_err();
    assert!(matches!(again, DistError::Poisoned { .. }), "{again}");
    // Leave as a failed rank would: the launcher takes the silent one down.
    std::process::exit(1);
}

#[test]
fn ranks_with_different_models_are_refused_on_every_rank() {
    if child_dir().is_some() {
        return mismatched_rank();
    }
    both_ranks_say(
        "ranks_with_different_models_are_refused_on_every_rank",
        "DataParallel::new: the ranks disagree",
    );
}

fn mismatched_rank() {
    let comm = Arc::new(
        ProcessGroup::mpi(MpiConfig {
            deterministic: false,
            timeout: Duration::from_secs(30),
        })
        .unwrap(),
    );
    let rank = comm.rank();
    // Rank 1's last layer has 11 outputs instead of 10.
    let model = if rank == 0 {
        cnn()
    } else {
        let mut rng = arenagrad_nn::Rng::seed(7);
        cnn().add(arenagrad_nn::Linear::new(10, 11, &mut rng).unwrap())
    };
    let e = DataParallel::new(model, comm, DdpConfig::default()).unwrap_err();
    eprintln!("rank {rank}: {e}");
    assert!(matches!(e, DistError::Mismatch { .. }), "{e}");
}

/// bf16 and f16 buffers reduce and broadcast over MPI (which has no 16-bit float type): summed
/// in f32 and rounded once, broadcast exactly.
#[test]
fn sixteen_bit_buffers_reduce_and_broadcast_over_mpi() {
    if child_dir().is_some() {
        return sixteen_bit_rank();
    }
    both_ranks_say(
        "sixteen_bit_buffers_reduce_and_broadcast_over_mpi",
        "16-bit collectives agree",
    );
}

fn sixteen_bit_rank() {
    use arenagrad_graph::{DType, HostTensor};
    let comm = ProcessGroup::mpi(MpiConfig {
        deterministic: true,
        timeout: Duration::from_secs(30),
    })
    .unwrap();
    let rank = comm.rank() as f64;
    // Rank r holds 256·(r + 1) + 1 and 0.5 + r: the sums 769 (not a bf16: 768 after one
    // rounding) and 2.
    let mine = [256.0 * (rank + 1.0) + 1.0, 0.5 + rank];
    for dtype in [DType::BF16, DType::F16] {
        let buf = HostTensor::from_f64(&mine, &[2], dtype)
            .unwrap()
            .into_data();
        let sum = comm.all_reduce(buf, arenagrad_dist::Reduce::Sum).unwrap();
        assert_eq!(sum.dtype(), dtype);
        // Each rank's values as stored, summed in f32, rounded once.
        let round = |v: f64| {
            HostTensor::from_f64(&[v], &[1], dtype)
                .unwrap()
                .to_f64_vec()[0]
        };
        let stored = |r: f64, k: usize| round([256.0 * (r + 1.0) + 1.0, 0.5 + r][k]) as f32;
        let want: Vec<f64> = (0..2)
            .map(|k| round(f64::from(stored(0.0, k) + stored(1.0, k))))
            .collect();
        assert_eq!(sum.to_f64_vec(), want, "{dtype}");
        let from_root = HostTensor::from_f64(&[3.140625 + rank, -rank], &[2], dtype)
            .unwrap()
            .into_data();
        let got = comm.broadcast(from_root, 0).unwrap();
        assert_eq!(got.to_f64_vec(), vec![3.140625, 0.0], "{dtype}");
    }
    eprintln!("rank {rank}: 16-bit collectives agree");
}

/// Runs test `test` on two ranks (skipped without `mpirun`): the job succeeds and each rank's
/// output says `phrase`.
fn both_ranks_say(test: &str, phrase: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(job) = mpirun(test, dir.path(), &[], Duration::from_secs(60)) else {
        return;
    };
    assert!(job.ok, "{}", job.output);
    assert_eq!(job.output.matches(phrase).count(), 2, "{}", job.output);
}
