//! The two lists of the program format's ops that a reader meets — the table in the program
//! crate's documentation and the paragraph in docs/testing.md — held to the format's own list
//! (`op_names`: the public rows of the elementwise tables, the format's ops and the rows of its
//! op table). A new row fails here, naming itself, until both lists name it; a list that names
//! what is no op fails too.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use arenagrad::program::op_names;
use arenagrad::DType;

/// The lower-case words of at least two letters inside the code spans of `text`: the op names
/// a list spells (operands are single letters, parameters upper case; a span holding a path is
/// a pointer to a file, not an op).
fn words_in_code_spans(text: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for span in text.split('`').skip(1).step_by(2) {
        if span.contains('/') {
            continue;
        }
        for w in span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let lower = w
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit());
            if w.len() >= 2 && lower && w.starts_with(|c: char| c.is_ascii_lowercase()) {
                words.insert(w.to_string());
            }
        }
    }
    words
}

fn check(list: &str, what: &str) {
    let named = words_in_code_spans(list);
    let ops: BTreeSet<String> = op_names().iter().map(|s| s.to_string()).collect();
    let missing: Vec<_> = ops.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "{what} does not name the ops {missing:?}"
    );
    // The other words of the format: the dtypes an integer or boolean `const` names.
    let dtypes: BTreeSet<String> = [DType::I64, DType::I32, DType::U8, DType::Bool]
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    let extra: Vec<_> = named
        .difference(&ops)
        .filter(|w| !dtypes.contains(*w))
        .collect();
    assert!(
        extra.is_empty(),
        "{what} names {extra:?}, which are no ops of the format"
    );
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let at = text.find(start).unwrap_or_else(|| panic!("no `{start}`"));
    let rest = &text[at..];
    &rest[..rest
        .find(end)
        .unwrap_or_else(|| panic!("no `{end}` after `{start}`"))]
}

#[test]
fn the_program_crates_table_names_every_op() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = fs::read_to_string(root.join("crates/program/src/lib.rs")).unwrap();
    // The table's first column (the second says what each op does, in words).
    let table = between(&lib, "//! | statement | meaning |", "\n//!\n");
    let first_cells: String = table
        .lines()
        .skip(2)
        .filter_map(|l| l.trim_start_matches("//!").trim().split(" | ").next())
        .collect::<Vec<_>>()
        .join("\n");
    check(
        &first_cells,
        "crates/program/src/lib.rs's table of statements",
    );
}

#[test]
fn docs_testing_names_every_op() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("docs/testing.md")).unwrap();
    let para = between(
        &doc,
        "Every statement is `NAME = OP ARG...`",
        "The full description",
    );
    check(para, "docs/testing.md's list of ops");
}

#[test]
fn the_check_sees_a_missing_and_a_stray_op() {
    let all: Vec<String> = op_names().iter().map(|s| format!("`{s} a`")).collect();
    check(&all.join(", "), "the full list");
    let short = all[1..].join(", ");
    let missing = std::panic::catch_unwind(|| check(&short, "a short list")).unwrap_err();
    let msg = missing.downcast_ref::<String>().unwrap();
    assert!(msg.contains(op_names()[0]), "{msg}");
    let stray = format!("{}, `frobnicate a`", all.join(", "));
    let extra = std::panic::catch_unwind(|| check(&stray, "a long list")).unwrap_err();
    assert!(extra
        .downcast_ref::<String>()
        .unwrap()
        .contains("frobnicate"));
}
