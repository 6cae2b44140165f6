//! The examples' shared checks (`examples/common/setup.rs`): the paths an example will write
//! are refused before any work, in a sentence naming the path; counts of 0 and rates that are
//! not numbers are refused; an error's cause is not said twice.

#[path = "../examples/common/setup.rs"]
mod setup;

use std::path::Path;

fn refused(path: &Path) -> String {
    setup::check_writable("the plot", "--plot", path)
        .expect_err("refused")
        .to_string()
}

#[test]
fn a_path_that_cannot_be_written_is_refused_in_a_sentence_naming_it() {
    let dir = tempfile_dir("refused");
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    // Its folder is a file (as /proc/version/x).
    let e = refused(&file.join("p.png"));
    assert_eq!(
        e,
        format!(
            "cannot write the plot to {}: {} is a file, not a folder (choose another path with \
             --plot)",
            file.join("p.png").display(),
            file.display()
        )
    );
    // A folder, a folder that is not there.
    assert!(
        refused(&dir).contains("it is a folder"),
        "{}",
        refused(&dir)
    );
    let missing = dir.join("no/such/p.png");
    assert!(
        refused(&missing).contains(&format!(
            "{}: no such folder",
            dir.join("no/such").display()
        )),
        "{}",
        refused(&missing)
    );
    // A folder that takes no new files.
    if Path::new("/proc/version").exists() {
        let e = refused(Path::new("/proc/p.png"));
        assert!(e.contains("cannot make a file in /proc"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_writable_path_passes_and_nothing_is_left_behind() {
    let dir = tempfile_dir("writable");
    setup::check_writable("the plot", "--plot", &dir.join("p.png")).unwrap();
    std::fs::write(dir.join("old.png"), b"kept").unwrap();
    setup::check_writable("the plot", "--plot", &dir.join("old.png")).unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["old.png"]);
    assert_eq!(std::fs::read(dir.join("old.png")).unwrap(), b"kept");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn until_past_the_run_and_an_empty_prompt_are_refused() {
    assert!(setup::check_until(None, 5, "--steps").is_ok());
    assert!(setup::check_until(Some(5), 5, "--steps").is_ok());
    assert_eq!(
        setup::check_until(Some(6), 5, "--steps")
            .unwrap_err()
            .to_string(),
        "--until 6 is past the end of the run (--steps 5)"
    );
    assert!(setup::check_prompt(0, "").is_ok());
    assert!(setup::check_prompt(10, "The").is_ok());
    assert!(setup::check_prompt(10, "")
        .unwrap_err()
        .to_string()
        .starts_with("--prompt is empty"));
}

#[test]
fn counts_and_rates_out_of_range_are_refused() {
    assert_eq!(setup::positive("3"), Ok(3));
    for bad in ["0", "-1", "x", ""] {
        assert!(setup::positive(bad).is_err(), "{bad}");
    }
    assert_eq!(setup::positive_real("1e-3"), Ok(1e-3));
    for bad in ["0", "-1", "nan", "inf"] {
        assert!(setup::positive_real(bad).is_err(), "{bad}");
    }
    assert_eq!(setup::non_negative_real("0"), Ok(0.0));
    assert!(setup::non_negative_real("-1").is_err());
    assert_eq!(setup::drop_probability("0"), Ok(0.0));
    assert!(setup::drop_probability("1").is_err());
    assert_eq!(
        setup::positive("0").unwrap_err(),
        "`0` is not a whole number of at least 1"
    );
}

#[derive(Debug)]
struct Quoting(std::io::Error);

impl std::fmt::Display for Quoting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/tmp/x: {}", self.0)
    }
}

impl std::error::Error for Quoting {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[derive(Debug)]
struct Terse(std::io::Error);

impl std::fmt::Display for Terse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "could not save")
    }
}

impl std::error::Error for Terse {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn a_cause_the_error_already_quotes_is_not_repeated() {
    let io = || std::io::Error::new(std::io::ErrorKind::ReadOnlyFilesystem, "read-only");
    assert_eq!(
        setup::error_lines(&Quoting(io())),
        ["error: /tmp/x: read-only"]
    );
    assert_eq!(
        setup::error_lines(&Terse(io())),
        ["error: could not save", "  caused by: read-only"]
    );
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "arenagrad-example-args-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
