//! The architecture map (`docs/architecture.md`) held to the tree: the crates' dependency table
//! to their manifests, and its list of the files that hold `unsafe` code to the files that do.
//! A map that drifts misleads the next reader more than no map.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const CRATES: &[&str] = &[
    "alloc",
    "arenagrad",
    "derive",
    "dist",
    "exec",
    "graph",
    "nn",
    "program",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn architecture() -> String {
    fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md")
}

/// The workspace crates a manifest's `[dependencies]` names, short (`graph` for
/// `arenagrad-graph`).
fn manifest_deps(manifest: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps {
            if let Some(rest) = line.strip_prefix("arenagrad-") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                deps.insert(name);
            }
        }
    }
    deps
}

/// The rows of the map's `| crate | depends on |` table.
fn map_deps(doc: &str) -> Vec<(String, BTreeSet<String>)> {
    let start = doc
        .find("| crate | depends on |")
        .expect("architecture.md has the `| crate | depends on |` table");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let deps = cells[1]
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(String::from)
                .collect();
            (cells[0].to_string(), deps)
        })
        .collect()
}

#[test]
fn the_dependency_table_is_the_manifests() {
    let rows = map_deps(&architecture());
    let named: BTreeSet<&str> = rows.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        named,
        CRATES.iter().copied().collect(),
        "the table's crates are not the workspace's"
    );
    for (krate, deps) in &rows {
        let manifest = fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("crates/{krate}/Cargo.toml: {e}"));
        assert_eq!(
            deps,
            &manifest_deps(&manifest),
            "docs/architecture.md says what crate `{krate}` depends on; its Cargo.toml says otherwise"
        );
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether a source file has `unsafe` code (a block, function, impl or extern block), not
/// counting comments and string text.
fn has_unsafe_code(src: &str) -> bool {
    src.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("");
        let code = code.trim();
        ["unsafe {", "unsafe fn", "unsafe impl", "unsafe extern"]
            .iter()
            .any(|k| code.contains(k) && !code.starts_with('"') && !code.contains("\"unsafe"))
    })
}

/// The files the map's `unsafe` paragraph names, as `crate/path` under `src/`.
fn files_the_map_names(doc: &str) -> BTreeSet<String> {
    let start = doc
        .find("`unsafe` lives only in")
        .expect("architecture.md has the paragraph on `unsafe`");
    // The list ends where the paragraph turns to the other crates.
    let para = doc[start..].split("\n\n").next().unwrap_or_default();
    let para = para.split("Every other crate").next().unwrap_or_default();
    let mut named = BTreeSet::new();
    let mut krate = "alloc";
    // Odd pieces are code spans: a crate's name starts its files, a file path ends in `.rs`.
    for piece in para.split('`').skip(1).step_by(2) {
        if piece == "exec" || piece == "alloc" {
            krate = if piece == "exec" { "exec" } else { "alloc" };
        } else if piece.ends_with(".rs") {
            named.insert(format!("{krate}/{piece}"));
        }
    }
    named
}

#[test]
fn the_unsafe_list_names_every_file_with_unsafe_code_and_no_other() {
    let doc = architecture();
    let named = files_the_map_names(&doc);
    let mut found = BTreeSet::new();
    for krate in CRATES {
        let src = root().join("crates").join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files {
            let text = fs::read_to_string(&file).expect("a source file");
            if !has_unsafe_code(&text) {
                continue;
            }
            let rel = file
                .strip_prefix(&src)
                .expect("under src")
                .display()
                .to_string();
            assert!(
                *krate == "alloc" || *krate == "exec",
                "crates/{krate}/src/{rel} has unsafe code: only alloc and exec may"
            );
            found.insert(format!("{krate}/{rel}"));
        }
    }
    let unnamed: Vec<_> = found.difference(&named).collect();
    assert!(
        unnamed.is_empty(),
        "these files hold unsafe code but docs/architecture.md's paragraph on `unsafe` does not \
         name them: {unnamed:?}"
    );
    let stale: Vec<_> = named.difference(&found).collect();
    assert!(
        stale.is_empty(),
        "docs/architecture.md names these files as holding unsafe code, and they hold none: {stale:?}"
    );
}

#[test]
fn every_crate_but_alloc_and_exec_forbids_unsafe_code() {
    for krate in CRATES {
        if *krate == "alloc" || *krate == "exec" {
            continue;
        }
        for root_file in ["lib.rs", "main.rs"] {
            let path = root()
                .join("crates")
                .join(krate)
                .join("src")
                .join(root_file);
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            assert!(
                text.contains("#![forbid(unsafe_code)]"),
                "crates/{krate}/src/{root_file} does not say #![forbid(unsafe_code)]"
            );
        }
    }
}

/// The workspace crates a source file's code names (doc comments and comments left out), short.
/// A path through a re-export counts as the crate re-exported: `arenagrad_graph::exec::…` is a
/// use of exec.
fn crates_named(src: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for line in src.lines() {
        let code = line.split("//").next().unwrap_or("");
        if code.contains("arenagrad_graph::exec") {
            named.insert("exec".to_string());
        }
        for (at, _) in code.match_indices("arenagrad_") {
            let rest = &code[at + "arenagrad_".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if CRATES.contains(&name.as_str()) {
                named.insert(name);
            }
        }
    }
    named
}

/// Layers stay layers: a crate's code names only itself and what its manifest says it depends
/// on, and never reaches a lower crate through a re-export (nn speaks only to graph, not to
/// exec's kernels behind it).
#[test]
fn every_crate_speaks_only_to_its_declared_dependencies() {
    for krate in CRATES {
        let manifest = fs::read_to_string(root().join("crates").join(krate).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("crates/{krate}/Cargo.toml: {e}"));
        let mut allowed = manifest_deps(&manifest);
        allowed.insert(krate.to_string());
        if *krate == "derive" {
            // The code derive emits names nn, the crate whose trait it implements (nn depends
            // on derive, not the other way); derive itself calls nothing of nn.
            allowed.insert("nn".to_string());
        }
        let src = root().join("crates").join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files {
            let text = fs::read_to_string(&file).expect("a source file");
            let stray: Vec<_> = crates_named(&text).difference(&allowed).cloned().collect();
            assert!(
                stray.is_empty(),
                "{} reaches {stray:?}, which crate `{krate}` does not depend on: go through its \
                 dependencies' own API",
                file.display()
            );
        }
    }
}

/// The checker catches what it is for: a file with an `unsafe` block that the paragraph leaves
/// out, and a paragraph naming a file of another crate's.
#[test]
fn the_checks_see_unsafe_code_and_read_the_paragraph() {
    assert!(has_unsafe_code("let x = unsafe { *p };"));
    assert!(has_unsafe_code("pub(crate) unsafe fn part(&self) {}"));
    assert!(!has_unsafe_code("// SAFETY: an unsafe { } block"));
    assert!(!has_unsafe_code("#![forbid(unsafe_code)]"));
    let para = "`unsafe` lives only in `alloc` (`arena.rs`: x) and `exec`: `cpu/a.rs` (y), \
                `cuda/mod.rs`.\n\nNext paragraph `cpu/b.rs`.";
    let named = files_the_map_names(para);
    let want: BTreeSet<String> = ["alloc/arena.rs", "exec/cpu/a.rs", "exec/cuda/mod.rs"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(named, want);
    let deps = manifest_deps(
        "[dependencies]\narenagrad-graph = { workspace = true }\n\
         [dev-dependencies]\narenagrad-nn = { workspace = true }\n",
    );
    assert_eq!(deps, ["graph".to_string()].into_iter().collect());
    let reached = crates_named(
        "use arenagrad_graph::Graph;\n\
         arenagrad_graph::exec::cpu::par::par_chunks_mut(p, 2, 1, f); // arenagrad_dist\n\
         /// arenagrad_program::Program",
    );
    let want: BTreeSet<String> = ["exec", "graph"].iter().map(|s| s.to_string()).collect();
    assert_eq!(reached, want);
}
