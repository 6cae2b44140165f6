//! Files written atomically (checkpoints, IDX files): a temporary file beside the target,
//! synced, renamed over it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{NnError, Result};

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> NnError + '_ {
    move |source| NnError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Follows `path` through symbolic links (each relative target read against its link's
/// directory) to the path of the file it finally names, which need not exist yet; a chain of
/// more than 40 links is a loop and an error.
fn resolve_links(path: &Path) -> Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p).map_err(io(&p))?;
                p = match p.parent() {
                    Some(d) if target.is_relative() => d.join(target),
                    _ => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(NnError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other("too many levels of symbolic links"),
    })
}

/// Writes `bytes` to `path` atomically: a temporary file beside it (created fresh), written
/// through `wrap` (which gets a handle to the temporary file), flushed, synced, renamed over
/// `path`; then the directory is synced. On any error the temporary file is removed and `path`
/// is untouched.
pub fn write_atomic<W: Write>(
    path: &Path,
    bytes: &[u8],
    wrap: impl FnOnce(File) -> W,
) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // Through symbolic links to the file they name: renaming over the link itself would
    // replace it with a plain file and leave its target stale.
    let resolved = resolve_links(path)?;
    let path = resolved.as_path();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| NnError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
        })?
        .to_string_lossy();
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    /// Removes the temporary file unless the rename happened.
    struct Cleanup<'a>(&'a Path, bool);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            if !self.1 {
                let _ = std::fs::remove_file(self.0);
            }
        }
    }
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io(&tmp))?;
    let mut guard = Cleanup(&tmp, false);
    let handle = file.try_clone().map_err(io(&tmp))?;
    {
        let mut w = wrap(handle);
        w.write_all(bytes).map_err(io(&tmp))?;
        w.flush().map_err(io(&tmp))?;
    }
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    guard.1 = true;
    sync_dir(&dir);
    Ok(())
}

/// Makes the rename durable (on Unix; elsewhere a directory cannot be opened for syncing).
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}
