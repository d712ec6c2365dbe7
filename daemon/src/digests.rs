//! SHA-256 of program files named by path (`program.path`), kept by file identity: a model
//! submitted by path again and again is hashed once while the file stays the same — same
//! device, inode, size, modification and change times, checked before and after each read —
//! instead of on every job (about 1.3 ms for a 2.6 MB ONNX model). Any write to the file
//! changes its change time, so a rewritten model is hashed again. [`FileDigests::known`]
//! gives the digest of a file unchanged since from one `stat`, so a model compiled before is
//! not even read again.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Files remembered at most; past it the map starts over (a bound, not an LRU: the files
/// named by path are a deployment's models, few).
const MAX_FILES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> std::io::Result<Stamp> {
        let m = std::fs::metadata(path)?;
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

#[derive(Default)]
pub struct FileDigests {
    known: Mutex<HashMap<PathBuf, (Stamp, String)>>,
    /// Reads whose digest came from the map (tests, diagnostics).
    pub hits: AtomicU64,
}

impl FileDigests {
    /// The SHA-256 of a file read before and unchanged since (its stamp is the one its
    /// bytes were hashed under), without reading it; `None` when unknown or changed.
    pub fn known(&self, path: &Path) -> Option<String> {
        let now = Stamp::of(path).ok()?;
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let (stamp, sha) = known.get(path)?;
        (*stamp == now).then(|| {
            self.hits.fetch_add(1, Ordering::Relaxed);
            sha.clone()
        })
    }

    /// The file's bytes and their SHA-256 (lowercase hex).
    pub fn read(&self, path: &Path) -> std::io::Result<(Vec<u8>, String)> {
        let before = Stamp::of(path)?;
        let bytes = std::fs::read(path)?;
        // Unchanged while it was read: the stamp identifies these bytes.
        let steady = Stamp::of(path)? == before;
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if steady
            && let Some((stamp, sha)) = known.get(path)
            && *stamp == before
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok((bytes, sha.clone()));
        }
        drop(known);
        let sha = crate::jobs::sha256_hex(&bytes);
        if steady {
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            if known.len() >= MAX_FILES {
                known.clear();
            }
            known.insert(path.to_path_buf(), (before, sha.clone()));
        }
        Ok((bytes, sha))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_hashed_once_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, b"first model").unwrap();
        let digests = FileDigests::default();
        let (bytes, sha) = digests.read(&path).unwrap();
        assert_eq!(
            (bytes.as_slice(), sha.as_str()),
            (&b"first model"[..], crate::jobs::sha256_hex(b"first model").as_str())
        );
        assert_eq!(digests.read(&path).unwrap().1, sha);
        assert_eq!(digests.hits.load(Ordering::Relaxed), 1);
        assert_eq!(digests.known(&path).as_deref(), Some(sha.as_str()), "known without a read");
        assert_eq!(digests.hits.load(Ordering::Relaxed), 2);
        // Rewritten with the same size: the change time moves, so it is hashed again.
        std::fs::write(&path, b"other model").unwrap();
        assert_eq!(digests.known(&path), None, "a rewritten file is not known");
        let (bytes, sha2) = digests.read(&path).unwrap();
        assert_eq!(bytes, b"other model");
        assert_eq!(sha2, crate::jobs::sha256_hex(b"other model"));
        assert_eq!(digests.hits.load(Ordering::Relaxed), 2);
        assert!(digests.read(&dir.path().join("missing.onnx")).is_err());
        assert_eq!(digests.known(&dir.path().join("missing.onnx")), None);
    }
}
