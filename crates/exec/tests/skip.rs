//! A skipped test says so in `cargo test`'s ordinary output (libtest keeps what a passing test
//! prints with `eprintln!` to itself), and its switch turns the skip into a failure. The test
//! runs this binary again as `cargo test` would, with the output captured, and reads what shows.
// The tests start this binary again as a child process, which Miri cannot do.
#![cfg(not(miri))]

use std::process::{Command, Output};

use arenagrad_exec::testing::{skip_or_fail, REQUIRE_DATA};

/// Set in the child's environment: it runs the skipping test's body.
const CHILD: &str = "ARENAGRAD_SKIP_TEST_CHILD";
const WHY: &str = "/nowhere/data.csv is not installed (Debian: nothing)";

#[test]
fn a_test_that_skips() {
    if std::env::var_os(CHILD).is_none() {
        return; // run only as the child below
    }
    skip_or_fail(REQUIRE_DATA, WHY);
}

fn child(switch: Option<&str>) -> (Output, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "a_test_that_skips", "--test-threads", "2"])
        .env(CHILD, "1")
        .env_remove(REQUIRE_DATA);
    if let Some(v) = switch {
        cmd.env(REQUIRE_DATA, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn a_skip_shows_in_the_output_of_a_passing_test() {
    let (out, text) = child(None);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("test a_test_that_skips ... ok"), "{text}");
    let want = format!(
        "SKIPPED a_test_that_skips: {WHY}; ARENAGRAD_REQUIRE_DATA=1 makes this a failure\n"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&want),
        "{text}"
    );
    // `0` is off, as unset.
    let (out, text) = child(Some("0"));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SKIPPED a_test_that_skips"), "{text}");
}

#[test]
fn the_switch_turns_the_skip_into_a_failure() {
    let (out, text) = child(Some("1"));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("test a_test_that_skips ... FAILED"), "{text}");
    assert!(
        text.contains(&format!(
            "ARENAGRAD_REQUIRE_DATA is set, so this test may not skip: {WHY}"
        )),
        "{text}"
    );
    assert!(!text.contains("SKIPPED"), "{text}");
}
