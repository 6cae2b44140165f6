//! The fuzz targets' seed corpora, replayed on stable Rust through the same checks the targets
//! run (`arenagrad::program::fuzzing`), plus a deterministic sweep of pseudo-random inputs.

use std::path::PathBuf;

use arenagrad::program::fuzzing::{self, Outcome};

fn corpus_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus")
}

#[test]
fn seed_corpora_replay_cleanly() {
    let root = corpus_root();
    let mut targets = 0;
    let mut files = 0;
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let target = dir.file_name().unwrap().to_string_lossy().to_string();
        targets += 1;
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let data = std::fs::read(&path).unwrap();
            let r = fuzzing::check(&target, &data)
                .unwrap_or_else(|| panic!("unknown fuzz target directory {target}"));
            if let Err(v) = r {
                panic!("{}: {v}", path.display());
            }
            files += 1;
        }
    }
    assert_eq!(targets, 3, "expected corpora for parse, build_run and grad");
    assert!(files >= 9, "expected a few seeds per target, found {files}");
}

/// xorshift bytes, deterministic.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

#[test]
fn random_bytes_break_no_property() {
    let mut passed = [0usize; 3];
    for seed in 0..300u64 {
        let data = bytes(seed, (seed as usize * 7) % 90 + 1);
        for (k, target) in ["parse", "build_run", "grad"].iter().enumerate() {
            match fuzzing::check(target, &data).unwrap() {
                Ok(Outcome::Passed) => passed[k] += 1,
                Ok(_) => {}
                Err(v) => panic!("{target} on {data:?}: {v}"),
            }
        }
    }
    // Structured inputs mostly build; well-typed smooth programs mostly pass gradcheck.
    assert!(passed[1] > 30, "build_run passed only {}", passed[1]);
    assert!(passed[2] > 150, "grad passed only {}", passed[2]);
}

#[test]
fn program_text_fragments_break_no_property() {
    // Mutations of a valid program: truncations and byte flips.
    let base = b"x = input 2 3 : 1 2 3 4 5 6\nw = const 3\ny = mul x w\nz = softmax y -1\n\
                 s = slice z 1 0 2\nm = matmul s (x)\nt = sum s\n";
    for cut in 0..base.len() {
        if let Err(v) = fuzzing::check_parse(&base[..cut]) {
            panic!("cut {cut}: {v}");
        }
    }
    for seed in 0..400u64 {
        let mut d = base.to_vec();
        let r = bytes(seed, 4);
        let at = (usize::from(r[0]) * 7 + usize::from(r[1])) % d.len();
        d[at] = r[2];
        if let Err(v) = fuzzing::check_parse(&d) {
            panic!("{:?}: {v}", String::from_utf8_lossy(&d));
        }
    }
}

/// Replays one input (a crash artifact, say) and prints the program it stands for:
/// `ARENAGRAD_FUZZ_TARGET=build_run ARENAGRAD_FUZZ_INPUT=path cargo test -p arenagrad \
///  --test fuzz_corpus replay_one -- --ignored --nocapture`.
#[test]
#[ignore = "reads the input named by ARENAGRAD_FUZZ_INPUT"]
fn replay_one() {
    let target = std::env::var("ARENAGRAD_FUZZ_TARGET").expect("ARENAGRAD_FUZZ_TARGET");
    let path = std::env::var("ARENAGRAD_FUZZ_INPUT").expect("ARENAGRAD_FUZZ_INPUT");
    let data = std::fs::read(&path).unwrap();
    println!(
        "--- program ---\n{}",
        fuzzing::describe(&target, &data).expect("a known target")
    );
    match fuzzing::check(&target, &data).unwrap() {
        Ok(outcome) => println!("--- outcome ---\n{outcome:?}"),
        Err(v) => panic!("{v}"),
    }
}
