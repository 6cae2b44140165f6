//! A file's bytes through a read-only memory map: what a checkpoint is read from, so that its
//! tensors are copied once, from the page cache into their own buffers, rather than twice
//! (into a buffer the size of the file, then out of it).

use std::fs::File;
use std::io;
use std::path::Path;

/// A file's bytes, mapped read-only (or, under Miri, which cannot map files, and for an empty
/// file, read into memory).
///
/// The bytes are those of the file when it was opened as long as nothing writes the file in
/// place or truncates it meanwhile: a file replaced by renaming another over it (as
/// `arenagrad-nn`'s checkpoints are saved) keeps the mapped contents; one truncated by another
/// process while mapped makes a read past its new end fault (`SIGBUS`), as with any mapped file.
///
/// ```
/// # if cfg!(miri) { return; } // Miri isolates the file system.
/// let dir = std::env::temp_dir().join(format!("arenagrad-map-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("bytes");
/// std::fs::write(&path, b"mapped").unwrap();
/// let m = arenagrad_alloc::MappedFile::open(&path).unwrap();
/// assert_eq!(&*m, b"mapped");
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Debug)]
pub struct MappedFile {
    bytes: Bytes,
}

#[derive(Debug)]
enum Bytes {
    #[cfg_attr(miri, allow(dead_code))]
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl MappedFile {
    /// Opens and maps `path`.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if cfg!(miri) || len == 0 {
            return Ok(MappedFile {
                bytes: Bytes::Read(std::fs::read(path)?),
            });
        }
        #[cfg(not(miri))]
        {
            // SAFETY: the map is read-only and private to this process, and this type hands
            // out only shared borrows of it, which cannot outlive it. memmap2's remaining
            // condition, that the file is not changed underneath the map, is the one every
            // mapped read carries: writers that replace a file by renaming (as the
            // checkpoints of this workspace are written) leave the mapped inode as it was,
            // and the type's documentation states what an in-place writer would do.
            let map = unsafe { memmap2::Mmap::map(&file)? };
            Ok(MappedFile {
                bytes: Bytes::Mapped(map),
            })
        }
        #[cfg(miri)]
        unreachable!("Miri reads the file above")
    }
}

impl std::ops::Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped(m) => m,
            Bytes::Read(v) => v,
        }
    }
}
