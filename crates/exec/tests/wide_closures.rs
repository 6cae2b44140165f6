//! Every closure handed to `wide` (or to elementwise's `wide_unless`) is `#[inline(always)]`.
//!
//! `wide` runs its closure from a function compiled with AVX-512 or AVX2 enabled; a closure that
//! the compiler leaves as a call is compiled for the baseline target, and its loops run in SSE
//! registers under the wide dispatch, silently (the results are the same at every level). Sixteen
//! call sites had been so, attention's tiles and the group norm's among them. This test reads
//! the crate's source and names any call whose closure lacks the attribute. (Not under Miri,
//! whose isolation forbids reading files, and for which a source scan holds nothing to check.)
#![cfg(not(miri))]

use std::fs;
use std::path::Path;

/// The text of the call starting at `open` (the index of its `(`), up to its closing `)`.
fn call_text(src: &str, open: usize) -> &str {
    let mut depth = 0usize;
    for (i, c) in src[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &src[open..open + i + 1];
                }
            }
            _ => {}
        }
    }
    &src[open..]
}

/// Calls of `name(` in `src` (not its definition, not in comments) whose arguments hold a
/// closure (`||`) without `#[inline(always)]` before it: their line numbers.
fn bare_closures(src: &str, name: &str) -> Vec<usize> {
    let mut bad = Vec::new();
    let pat = format!("{name}(");
    let mut from = 0;
    while let Some(at) = src[from..].find(&pat) {
        let start = from + at;
        from = start + pat.len();
        let before = &src[..start];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = &src[line_start..start];
        let ident_char = before
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if ident_char || line.contains("//") || line.trim_end().ends_with("fn") {
            continue;
        }
        let call = call_text(src, start + name.len());
        if let Some(bar) = call.find("||") {
            if !call[..bar].contains("#[inline(always)]") {
                bad.push(before.matches('\n').count() + 1);
            }
        }
    }
    bad
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).expect("the crate's source is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_closure_given_to_wide_is_inline_always() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut failures = Vec::new();
    let mut calls = 0;
    for f in &files {
        let src = fs::read_to_string(f).expect("a source file");
        calls += src.matches("wide(").count();
        for name in ["wide", "wide_unless"] {
            for line in bare_closures(&src, name) {
                failures.push(format!("{}:{line}", f.display()));
            }
        }
    }
    assert!(
        calls > 20,
        "the scan found only {calls} calls: is it reading the source?"
    );
    assert!(
        failures.is_empty(),
        "closures given to wide() without #[inline(always)] (they would run as baseline code): {failures:#?}"
    );
}

/// The scan itself: it names a bare closure and passes a marked one, a function and a
/// definition.
#[test]
fn the_scan_finds_a_bare_closure() {
    let src = "fn wide<R>(len: usize, f: impl FnOnce() -> R) -> R { f() }\n\
               fn a() { wide(n, || sum(x)); }\n\
               fn b() { wide(n, #[inline(always)] move || sum(x)); }\n\
               fn c() { wide(n, f); super::wide::wide(len(x), move || { y }) }\n\
               // wide(n, || commented)\n\
               fn d() { unwide(n, || z); }\n";
    assert_eq!(bare_closures(src, "wide"), [2, 4]);
}
