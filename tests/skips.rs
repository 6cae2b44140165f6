//! Every test that skips says so where `cargo test` shows it: through `testing::skip` or
//! `skip_or_fail` (arenagrad-exec), not `eprintln!`, whose output libtest keeps to itself for a
//! passing test.

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_test_reports_a_skip_with_eprintln() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    rust_files(&root.join("tests"), &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut found = Vec::new();
    for f in &files {
        // Without white space, so that a call over several lines is seen.
        let text: String = std::fs::read_to_string(f)
            .unwrap()
            .to_lowercase()
            .split_whitespace()
            .collect();
        let printed = ["eprintln!(\"skip", "println!(\"skip", "eprint!(\"skip"];
        if printed.iter().any(|p| text.contains(p)) {
            found.push(f.display().to_string());
        }
    }
    assert!(
        found.is_empty(),
        "skips printed where cargo test hides them: {found:?}"
    );
}
