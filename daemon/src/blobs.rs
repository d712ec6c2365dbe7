//! Run outputs kept by content: `blobs/<first two hex digits>/<sha256>.<ext>`, named by the
//! SHA-256 the run's record lists, so the outputs endpoint finds them from the record alone
//! and identical outputs of many runs are one file. A blob is written to a temporary name
//! and renamed into place, so a crash never leaves a partial file under a real name. A
//! program is put here at submit; a run's new output blobs travel in its journal frame and
//! the store writes them out ([`xpu_store::KeptFile`]), so an acknowledged run's outputs
//! exist (in memory, then on disk).

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The blob store's directory under the store's, as the store's kept files name it.
pub const DIR: &str = "blobs";

/// Names remembered as written; past this many the memory is dropped (a blob written again
/// is only renamed over an identical file).
const KNOWN_LIMIT: usize = 1 << 20;

pub struct Blobs {
    dir: PathBuf,
    /// `fdatasync` each new blob before it is renamed into place (durability = machine).
    sync: bool,
    /// Blobs this process has written, and fan-out directories it has made.
    known: Mutex<HashSet<String>>,
    next_tmp: AtomicU64,
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn invalid(sha: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("`{sha}` is not a SHA-256"))
}

impl Blobs {
    pub fn new(dir: PathBuf, sync: bool) -> Blobs {
        Blobs { dir, sync, known: Mutex::new(HashSet::new()), next_tmp: AtomicU64::new(0) }
    }

    fn path(&self, sha: &str, ext: &str) -> PathBuf {
        self.dir.join(&sha[..2]).join(format!("{sha}.{ext}"))
    }

    /// Where the blob of `sha` is, relative to the store's directory (this store's `dir`
    /// is its [`DIR`]), as the store's kept files name it.
    pub fn relative_path(sha: &str, ext: &str) -> std::io::Result<String> {
        if !is_sha256(sha) || ext.is_empty() || !ext.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(invalid(sha));
        }
        Ok(format!("{DIR}/{}/{sha}.{ext}", &sha[..2]))
    }

    /// Notes blobs kept through the store (their relative paths) as kept.
    pub fn remember_kept(&self, paths: &[String]) {
        for path in paths {
            if let Some(name) = path.rsplit('/').next() {
                self.remember(name.to_string());
            }
        }
    }

    fn remembers(&self, key: &str) -> bool {
        self.known.lock().is_ok_and(|k| k.contains(key))
    }

    fn remember(&self, key: String) {
        if let Ok(mut known) = self.known.lock() {
            if known.len() >= KNOWN_LIMIT {
                known.clear();
            }
            known.insert(key);
        }
    }

    /// Whether this process has kept the blob of `sha` (no disk access: a blob it has not
    /// may still be on disk from before; keeping it again is harmless).
    pub fn kept_here(&self, sha: &str, ext: &str) -> bool {
        self.remembers(&format!("{sha}.{ext}"))
    }

    /// Whether the bytes of `sha` are kept (by this process, or found on disk).
    pub fn has(&self, sha: &str, ext: &str) -> bool {
        is_sha256(sha) && (self.remembers(&format!("{sha}.{ext}")) || self.path(sha, ext).is_file())
    }

    /// Keeps `bytes`, whose SHA-256 is `sha`, unless this process already has.
    pub fn put(&self, sha: &str, ext: &str, bytes: &[u8]) -> std::io::Result<()> {
        if !is_sha256(sha) {
            return Err(invalid(sha));
        }
        let key = format!("{sha}.{ext}");
        if self.remembers(&key) {
            return Ok(());
        }
        let sub = self.dir.join(&sha[..2]);
        if !self.remembers(&sha[..2]) {
            std::fs::create_dir_all(&sub)?;
            self.remember(sha[..2].to_string());
        }
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let tmp = sub.join(format!(".{key}.{}-{n}.tmp", std::process::id()));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(bytes)?;
            if self.sync {
                f.sync_data()?;
            }
            Ok(())
        });
        let placed = written.and_then(|()| std::fs::rename(&tmp, self.path(sha, ext)));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        if self.sync {
            std::fs::File::open(&sub)?.sync_all()?;
        }
        self.remember(key);
        Ok(())
    }

    /// The bytes kept under `sha`.
    pub fn get(&self, sha: &str, ext: &str) -> std::io::Result<Vec<u8>> {
        if !is_sha256(sha) {
            return Err(invalid(sha));
        }
        std::fs::read(self.path(sha, ext))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_kept_once_by_content_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(dir.path().join("blobs"), false);
        let sha = crate::jobs::sha256_hex(b"twelve");
        blobs.put(&sha, "npy", b"twelve").unwrap();
        blobs.put(&sha, "npy", b"twelve").unwrap();
        assert_eq!(blobs.get(&sha, "npy").unwrap(), b"twelve");
        let fan = dir.path().join("blobs").join(&sha[..2]);
        let names: Vec<_> =
            std::fs::read_dir(&fan).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(format!("{sha}.npy"))], "no temporary left");
        // A fresh process (nothing remembered) writes it again over the same content.
        let again = Blobs::new(dir.path().join("blobs"), true);
        again.put(&sha, "npy", b"twelve").unwrap();
        assert_eq!(again.get(&sha, "npy").unwrap(), b"twelve");
        for bad in ["../../etc/passwd", "", &"g".repeat(64), &sha[..63]] {
            assert_eq!(blobs.get(bad, "npy").unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
            assert!(blobs.put(bad, "npy", b"x").is_err(), "{bad}");
        }
        assert_eq!(
            blobs.get(&"a".repeat(64), "npy").unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
    }
}
