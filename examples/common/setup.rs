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
    eprintln!("error: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        eprintln!("  caused by: {s}");
        source = s.source();
    }
    std::process::ExitCode::FAILURE
}
