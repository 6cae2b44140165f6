//! The repository's README shows the same example as the `arenagrad` crate's README, which is
//! compiled and run as a doctest: the two must not drift apart.

fn first_rust_block(text: &str) -> &str {
    let start = text.find("```rust").expect("a ```rust block");
    let end = start + 7 + text[start + 7..].find("```").expect("its closing fence");
    &text[start..end]
}

#[test]
fn the_readme_example_is_the_doctested_one() {
    let repo = include_str!("../README.md");
    let krate = include_str!("../crates/arenagrad/README.md");
    assert_eq!(first_rust_block(repo), first_rust_block(krate));
}

/// The README's set-up line that goes on to `then` (`cargo run`, `cargo test`), up to it: the
/// part that installs packages.
fn install_part(then: &str) -> String {
    let repo = include_str!("../README.md");
    let line = repo
        .lines()
        .find(|l| l.contains("apt-get install") && l.contains(then))
        .expect("the README's set-up line");
    let end = line
        .find(&format!("&& {then}"))
        .expect("the line goes on to cargo");
    line[..end].trim().to_string()
}

/// Runs the install part under `sh` with a PATH holding only stand-ins for `apt-get` and, when
/// asked, `sudo` (which logs and runs its arguments), beside `sh`; returns whether it succeeded
/// and what the stand-ins logged.
fn run_install(then: &str, with_sudo: bool) -> (bool, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!(
        "arenagrad-readme-{}-{}-{with_sudo}",
        std::process::id(),
        then.replace(' ', "-")
    ));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("log");
    let write = |name: &str, body: &str| {
        let p = bin.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write(
        "apt-get",
        &format!("echo \"apt-get $*\" >> {}", log.display()),
    );
    if with_sudo {
        write(
            "sudo",
            &format!("echo \"sudo $1\" >> {}; exec \"$@\"", log.display()),
        );
    }
    // A PATH of this folder alone: the stand-ins and `sh`, so `sudo` is only what the test put
    // there (the shell's `command -v` finds it or not).
    std::os::unix::fs::symlink("/bin/sh", bin.join("sh")).unwrap();
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(install_part(then))
        .env("PATH", &bin)
        .status()
        .unwrap();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    (status.success(), logged)
}

#[test]
fn the_set_up_line_works_as_root_without_sudo_and_as_a_user_with_it() {
    for (then, packages) in [
        ("cargo run", "dataset-fashion-mnist"),
        (
            "cargo test",
            "libopenmpi-dev openmpi-bin libclang-dev python3-sklearn fortunes dataset-fashion-mnist g++",
        ),
    ] {
        let want = format!("apt-get update\napt-get install -y {packages}\n");
        let (ok, log) = run_install(then, false);
        assert!(ok, "{then}: as root without sudo the line failed: {log}");
        assert_eq!(log, want);
        let (ok, log) = run_install(then, true);
        assert!(ok, "{then}: as a user with sudo the line failed: {log}");
        assert_eq!(log, format!("sudo sh\n{want}"));
    }
}

/// The Debian packages `.ci/run` installs for the test suite (its `need="… pkg"` lines).
fn ci_packages() -> Vec<String> {
    let ci = include_str!("../.ci/run");
    let mut packages = Vec::new();
    for line in ci.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let Some(start) = line.find("need=\"") else {
            continue;
        };
        let rest = &line[start + 6..];
        let list = &rest[..rest.find('"').expect("the need list's closing quote")];
        packages.extend(
            list.split_whitespace()
                .filter(|p| *p != "$need")
                .map(String::from),
        );
    }
    packages
}

/// A user who runs the README's test line from a clean clone gets what CI gets: every package a
/// test reads or runs is installed (a test without its data skips, and would pass unseen).
#[test]
fn the_test_line_installs_every_package_ci_installs_for_the_tests() {
    let ci = ci_packages();
    assert!(
        ci.len() >= 6 && ci.iter().any(|p| p == "fortunes"),
        "reading .ci/run's list: {ci:?}"
    );
    let install = install_part("cargo test");
    let readme: Vec<&str> = install
        .rsplit("apt-get install -y ")
        .next()
        .unwrap()
        .trim_end_matches('\'')
        .split_whitespace()
        .collect();
    let missing: Vec<&String> = ci
        .iter()
        .filter(|p| !readme.contains(&p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the README's test line does not install {missing:?} (.ci/run does)"
    );
}

/// The README's sections in order: each `## ` heading with the text up to the next one.
fn readme_sections() -> Vec<(&'static str, &'static str)> {
    let repo = include_str!("../README.md");
    let mut starts: Vec<usize> = repo.match_indices("\n## ").map(|(i, _)| i + 1).collect();
    starts.push(repo.len());
    starts
        .windows(2)
        .map(|w| {
            let section = &repo[w[0]..w[1]];
            let heading = section.lines().next().unwrap_or_default();
            (heading.trim_start_matches("## "), section)
        })
        .collect()
}

/// The top-level folders of the repository a clone has (ignored build output left out), as
/// `name/`, and its crates as `crates/name`.
fn repository_folders() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let ignored: Vec<String> = include_str!("../.gitignore")
        .lines()
        .filter(|l| l.starts_with('/') && !l[1..].trim_end_matches('/').contains('/'))
        .map(|l| l.trim_matches('/').to_string())
        .collect();
    let dirs = |dir: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let mut out: Vec<String> = dirs(&root.join("crates"))
        .into_iter()
        .map(|c| format!("crates/{c}"))
        .collect();
    out.extend(
        dirs(root)
            .into_iter()
            .filter(|d| d != "crates" && d != ".git" && !ignored.contains(d))
            .map(|d| format!("{d}/")),
    );
    out
}

/// The README opens with its map, one line for each crate and each top-level folder, and then
/// the set-up with the two commands: the main job and the tests.
#[test]
fn the_readme_opens_with_the_layout_map_and_the_set_up() {
    let sections = readme_sections();
    let headings: Vec<&str> = sections.iter().map(|(h, _)| *h).collect();
    assert_eq!(
        headings.get(..2),
        Some(&["Layout", "Set-up"][..]),
        "the README's first sections: {headings:?}"
    );
    let listed: Vec<String> = sections[0]
        .1
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(String::from)
        .collect();
    let mut want = repository_folders();
    assert!(
        want.contains(&"crates/graph".to_string()) && want.contains(&"docs/".to_string()),
        "reading the repository's folders: {want:?}"
    );
    let mut got = listed;
    want.sort();
    got.sort();
    assert_eq!(
        got, want,
        "the layout map's rows against the repository's folders"
    );
    let set_up = sections[1].1;
    for then in ["cargo run --release --example fashion_mnist", "cargo test"] {
        assert!(
            set_up
                .lines()
                .any(|l| l.contains("apt-get install") && l.contains(&format!("&& {then}"))),
            "the set-up section has no line that installs and runs `{then}`"
        );
    }
}
