//! The `arenagrad` binary: subcommands, help, exit codes, stdin, errors on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn arenagrad(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arenagrad"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the arenagrad binary runs");
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        // The binary may exit before reading (a usage error): a broken pipe is fine.
        let _ = input.write_all(bytes);
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A program file in a fresh temporary directory, removed with the directory when dropped.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        let dir = std::env::temp_dir().join(format!(
            "arenagrad-cli-{}-{}",
            std::process::id(),
            name.replace('.', "_")
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        TempFile { dir, path }
    }

    fn arg(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const SMOOTH: &str = "x = input 2 3 : 0.5 -1 2 0.25 1.5 -0.75\n\
                      w = const 3 : 0.5 -1 2\n\
                      y = mul x w\n\
                      z = tanh y\n\
                      s = softmax z 1\n";

#[test]
fn help_lists_the_subcommands() {
    let o = arenagrad(&["--help"], None);
    assert!(o.status.success());
    let h = stdout(&o);
    for sub in ["run", "gradcheck", "dot", "fmt"] {
        assert!(h.contains(sub), "{h}");
    }
    assert!(h.contains("Usage: arenagrad <COMMAND>"), "{h}");
    for sub in ["run", "gradcheck", "dot", "fmt"] {
        let o = arenagrad(&[sub, "--help"], None);
        assert!(o.status.success(), "{sub} --help");
        assert!(stdout(&o).contains(&format!("Usage: arenagrad {sub}")));
    }
    let run = stdout(&arenagrad(&["run", "--help"], None));
    for flag in [
        "--dtype",
        "--seed",
        "--device",
        "--json",
        "[possible values: f64, f32, bf16, f16]",
    ] {
        assert!(run.contains(flag), "{run}");
    }
    assert!(stdout(&arenagrad(&["gradcheck", "--help"], None)).contains("--order"));
    // Usage errors exit 2, as clap does.
    let o = arenagrad(&["run"], None);
    assert_eq!(o.status.code(), Some(2));
    let o = arenagrad(&["frobnicate"], None);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(arenagrad(&["--version"], None).status.code(), Some(0));
}

#[test]
fn run_reads_files_and_stdin() {
    let f = TempFile::new("smooth.ag", SMOOTH);
    let a = arenagrad(&["run", "--json", f.arg()], None);
    let b = arenagrad(&["run", "--json", "-"], Some(SMOOTH.as_bytes()));
    assert!(a.status.success() && b.status.success(), "{}", stderr(&a));
    assert_eq!(stdout(&a), stdout(&b));
    let j: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    let keys: Vec<&String> = j.as_object().unwrap().keys().collect();
    for k in ["dtype", "output", "values", "grads"] {
        assert!(keys.iter().any(|x| *x == k), "{keys:?}");
    }
    assert_eq!(j["output"]["shape"], serde_json::json!([2, 3]));
    assert_eq!(j["values"].as_object().unwrap().len(), 2);
    assert_eq!(j["grads"].as_object().unwrap().len(), 1);
    // Without --json: a readable listing.
    let h = stdout(&arenagrad(&["run", f.arg()], None));
    assert!(h.contains("output s: shape [2, 3]"), "{h}");
    assert!(h.contains("grad x: shape [2, 3]"), "{h}");
    assert!(h.contains("value w: shape [3] [0.5, -1.0, 2.0]"), "{h}");
}

#[test]
fn errors_exit_2_with_the_position_on_stderr() {
    let cases: &[(&[u8], &str)] = &[
        (b"x = input 2\ny = tanh q\n", "line 2, column 10"),
        (
            b"x = input 2 3\ny = input 4\nz = add x y\n",
            "do not broadcast",
        ),
        (
            b"x = input 99999999999 99999999999\ny = sum x\n",
            "too large",
        ),
        (b"x = input 2\ny = tanh \xff\n", "UTF-8"),
        (b"", "at least one statement"),
    ];
    for (input, what) in cases {
        let o = arenagrad(&["run", "-"], Some(input));
        assert_eq!(
            o.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(input)
        );
        assert!(stderr(&o).contains(what), "{}", stderr(&o));
        assert!(stderr(&o).contains("<stdin>"), "{}", stderr(&o));
        assert!(o.stdout.is_empty());
    }
    let o = arenagrad(&["run", "/nonexistent/program.ag"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"));
}

#[test]
fn cuda_is_a_clear_error() {
    let o = arenagrad(&["run", "--device", "cuda", "-"], Some(SMOOTH.as_bytes()));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("CUDA is not available"),
        "{}",
        stderr(&o)
    );
    let o = arenagrad(&["run", "--device", "cpu", "-"], Some(SMOOTH.as_bytes()));
    assert!(o.status.success());
}

#[test]
fn gradcheck_passes_fails_and_checks_second_order() {
    let o = arenagrad(&["gradcheck", "-"], Some(SMOOTH.as_bytes()));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("ok   x [2, 3]"), "{}", stdout(&o));
    assert!(stdout(&o).contains("gradcheck passed"));
    let o = arenagrad(&["gradcheck", "--order", "2", "-"], Some(SMOOTH.as_bytes()));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("second derivatives"));
    // A mismatch: relu at exactly 0 (subgradient 0, central difference 1/2), and detach
    // (the analytic gradient ignores the detached path, finite differences do not).
    for prog in [
        "x = input 3 : 1 0 -1\ny = relu x\n",
        "x = input 2 : 1.5 -2\nd = detach x\ny = mul x d\n",
    ] {
        let o = arenagrad(&["gradcheck", "-"], Some(prog.as_bytes()));
        assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
        assert!(stdout(&o).contains("FAIL x"), "{}", stdout(&o));
        assert!(stdout(&o).contains("gradcheck FAILED"));
    }
    let o = arenagrad(
        &["gradcheck", "--dtype", "f32", "-"],
        Some(SMOOTH.as_bytes()),
    );
    assert_eq!(o.status.code(), Some(2));
    let o = arenagrad(&["gradcheck", "--order", "3", "-"], Some(SMOOTH.as_bytes()));
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn dot_and_fmt() {
    let o = arenagrad(&["dot", "-"], Some(SMOOTH.as_bytes()));
    assert!(o.status.success());
    let d = stdout(&o);
    assert!(d.starts_with("digraph program {"), "{d}");
    assert!(d.contains("\"y\" -> \"z\";"));
    assert!(d.contains("requires_grad"));
    let o = arenagrad(
        &["fmt", "-"],
        Some(b"# c\nx=input 2:1 2   # comment\n\ny = tanh x\n"),
    );
    assert!(o.status.success());
    assert_eq!(stdout(&o), "x = input 2 : 1.0 2.0\ny = tanh x\n");
    let o = arenagrad(&["dot", "-"], Some(b"x = input 2\ny = sum x 3\n"));
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn seeds_and_dtypes() {
    let prog = b"x = input 3\ny = exp x\n";
    let a = stdout(&arenagrad(
        &["run", "--json", "--seed", "5", "-"],
        Some(prog),
    ));
    let b = stdout(&arenagrad(
        &["run", "--json", "--seed", "5", "-"],
        Some(prog),
    ));
    let c = stdout(&arenagrad(
        &["run", "--json", "--seed", "6", "-"],
        Some(prog),
    ));
    assert_eq!(a, b);
    assert_ne!(a, c);
    let f = stdout(&arenagrad(
        &["run", "--json", "--dtype", "f32", "--seed", "5", "-"],
        Some(prog),
    ));
    let j: serde_json::Value = serde_json::from_str(&f).unwrap();
    assert_eq!(j["dtype"], "f32");
    let j64: serde_json::Value = serde_json::from_str(&a).unwrap();
    // The same draws, rounded to f32.
    let x32 = j["values"]["x"]["data"].as_array().unwrap();
    let x64 = j64["values"]["x"]["data"].as_array().unwrap();
    for (p, q) in x32.iter().zip(x64) {
        assert_eq!(p.as_f64().unwrap() as f32, q.as_f64().unwrap() as f32);
    }
    // In bf16: the same draws rounded to 8 significant bits, e^x computed in f32 and rounded,
    // and the gradient (e^x again) stored in bf16.
    let h = stdout(&arenagrad(
        &["run", "--json", "--dtype", "bf16", "--seed", "5", "-"],
        Some(prog),
    ));
    let j: serde_json::Value = serde_json::from_str(&h).unwrap();
    assert_eq!(j["dtype"], "bf16");
    let round = |v: f64| arenagrad_graph::bf16::from_f64(v as f32 as f64).to_f64();
    let xs = j["values"]["x"]["data"].as_array().unwrap();
    let ys = j["output"]["data"].as_array().unwrap();
    let gs = j["grads"]["x"]["data"].as_array().unwrap();
    for ((x, y), (x64, g)) in xs.iter().zip(ys).zip(x64.iter().zip(gs)) {
        let x = x.as_f64().unwrap();
        assert_eq!(x, round(x64.as_f64().unwrap()));
        let want = round(f64::from((x as f32).exp()));
        assert_eq!((y.as_f64().unwrap(), g.as_f64().unwrap()), (want, want));
    }
}

/// Under a 2 GB address-space limit (`ulimit -v 2000000`) the programs the fuzz targets build
/// from pseudo-random bytes, and programs whose buffers pass the size checks but not the limit,
/// are answered with exit 0, 1 or 2 — a result or a typed error — never a panic (101) or an
/// abort (134, 139).
#[test]
fn under_a_memory_limit_the_cli_never_aborts() {
    let mut programs: Vec<(String, String)> = Vec::new();
    // xorshift64*: the same bytes on every run.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut byte = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
    };
    for target in ["parse", "build_run", "grad"] {
        for k in 0..5 {
            let data: Vec<u8> = (0..24 + 40 * k).map(|_| byte()).collect();
            let text = arenagrad_program::fuzzing::describe(target, &data).unwrap();
            programs.push((format!("{target}/{k}"), text));
        }
    }
    for (name, text) in [
        // Passes the size checks; its buffers and copies exceed 2 GB.
        ("large_sum", "x = input 8192 8192\ny = sum x\n"),
        // Refused by the run's element count (values, gradients, copies).
        ("largest_sum", "x = input 16384 16384\ny = sum x\n"),
        // Refused by the gradient check's work count.
        ("large_gradcheck", "x = input 1000 1000\ny = sum x\n"),
    ] {
        programs.push((name.to_string(), text.to_string()));
    }
    assert!(programs.len() >= 15);
    let bin = env!("CARGO_BIN_EXE_arenagrad");
    for (k, (name, text)) in programs.iter().enumerate() {
        let f = TempFile::new(&format!("limited{k}.ag"), text);
        for sub in ["run", "gradcheck"] {
            let o = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "ulimit -v 2000000 && exec \"$0\" {sub} \"$1\" > /dev/null"
                ))
                .arg(bin)
                .arg(f.arg())
                .output()
                .unwrap();
            let code = o.status.code();
            assert!(
                matches!(code, Some(0..=2)),
                "{name} ({sub}): exit {code:?} (signal or panic)\n{}\n{}",
                text,
                stderr(&o)
            );
        }
    }
}
