//! What the examples tell a user whose data are not installed yet, and how they end on an
//! error. Each example uses part of it.
#![allow(dead_code)]

/// Whether the process runs as root (Linux: the real uid in /proc/self/status is 0).
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// The command that installs a Debian package: as it is for root (where `sudo` may not exist),
/// through sudo otherwise.
pub fn apt_install(package: &str) -> String {
    let sudo = if running_as_root() { "" } else { "sudo " };
    format!("{sudo}apt-get update && {sudo}apt-get install -y {package}")
}

/// Runs an example: its error, if any, as a sentence (with the errors beneath it) and exit
/// code 1, rather than the `Debug` form a `main` returning `Result` prints. Output piped into a
/// reader that stops early (`| head`) ends the example quietly, as a shell tool ends, instead
/// of with a panic about the broken pipe.
pub fn report<E: Into<Box<dyn std::error::Error>>>(
    run: impl FnOnce() -> Result<(), E>,
) -> std::process::ExitCode {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.contains("Broken pipe") {
            // 128 + SIGPIPE: what a shell reports for a tool its reader stopped.
            std::process::exit(141);
        }
        default(info)
    }));
    let Err(e) = run() else {
        return std::process::ExitCode::SUCCESS;
    };
    let e: Box<dyn std::error::Error> = e.into();
    for line in error_lines(e.as_ref()) {
        eprintln!("{line}");
    }
    std::process::ExitCode::FAILURE
}

/// What [`report`] prints for `e`: `error: …`, then a `caused by: …` line for each cause whose
/// words the lines before do not already carry (most errors quote their source).
pub fn error_lines(e: &dyn std::error::Error) -> Vec<String> {
    let mut said = e.to_string();
    let mut lines = vec![format!("error: {said}")];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !said.contains(&text) {
            lines.push(format!("  caused by: {text}"));
            said.push_str(&text);
        }
        source = s.source();
    }
    lines
}

/// An example's error: a sentence for the user.
pub fn fail(sentence: impl Into<String>) -> Box<dyn std::error::Error> {
    sentence.into().into()
}

/// Refuses `--until` past the run's end (`end`, given by the flag `end_flag`).
pub fn check_until(
    until: Option<usize>,
    end: usize,
    end_flag: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    match until {
        Some(until) if until > end => Err(fail(format!(
            "--until {until} is past the end of the run ({end_flag} {end})"
        ))),
        _ => Ok(()),
    }
}

/// Refuses an empty `--prompt` when text is to be generated (`generate` characters).
pub fn check_prompt(generate: usize, prompt: &str) -> Result<(), Box<dyn std::error::Error>> {
    if generate > 0 && prompt.is_empty() {
        return Err(fail(
            "--prompt is empty: generating needs at least one character to start from (or pass \
             --generate 0)",
        ));
    }
    Ok(())
}

/// What went wrong with a file, as the end of a sentence.
fn reason(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ReadOnlyFilesystem => "the file system there is read-only".into(),
        K::PermissionDenied => "permission denied".into(),
        K::NotFound => "no such folder".into(),
        K::NotADirectory => "a part of the path is a file, not a folder".into(),
        K::IsADirectory => "it is a folder".into(),
        K::StorageFull => "the disk is full".into(),
        _ => e.to_string(),
    }
}

/// Checks, before any work, that `path` (given with `--flag`, written as `what`: "the plot",
/// "the checkpoint") can be written: its folder exists and takes a new file (what an atomic
/// save writes before renaming it over `path`), and an existing file there opens for writing.
/// Nothing is left behind.
pub fn check_writable(
    what: &str,
    flag: &str,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let say = |why: String| {
        fail(format!(
            "cannot write {what} to {}: {why} (choose another path with {flag})",
            path.display()
        ))
    };
    if path.is_dir() {
        return Err(say("it is a folder".into()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(say(format!("{} is a file, not a folder", dir.display()))),
        Err(e) => return Err(say(format!("{}: {}", dir.display(), reason(&e)))),
    }
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let probe = dir.join(format!(".{name}.probe-{}", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => {
            let why = match e.kind() {
                // The folder is there (checked above) but refuses new names (as /proc does).
                std::io::ErrorKind::NotFound => "it takes no new files".into(),
                _ => reason(&e),
            };
            return Err(say(format!(
                "cannot make a file in {}: {why}",
                dir.display()
            )));
        }
    }
    if path.exists() {
        if let Err(e) = std::fs::OpenOptions::new().write(true).open(path) {
            return Err(say(reason(&e)));
        }
    }
    Ok(())
}

/// A failure to write `path` after training, as a sentence: what the file system says now
/// (the plotting library words its errors as Rust values), or else the error itself.
pub fn write_failed(
    what: &str,
    flag: &str,
    path: &std::path::Path,
    e: impl std::fmt::Display,
) -> Box<dyn std::error::Error> {
    match check_writable(what, flag, path) {
        Err(sentence) => sentence,
        Ok(()) => fail(format!("could not write {what} to {}: {e}", path.display())),
    }
}

/// A command-line count of at least 1.
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{s}` is not a whole number of at least 1")),
    }
}

/// A command-line number that is finite and above 0 (a learning rate, a norm).
pub fn positive_real(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number above 0")),
    }
}

/// A command-line number that is finite and at least 0 (a temperature, a weight decay).
pub fn non_negative_real(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of at least 0")),
    }
}

/// A command-line probability of dropping: at least 0, below 1.
pub fn drop_probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}` is not a probability from 0 up to (not including) 1"
        )),
    }
}
