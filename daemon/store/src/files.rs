//! Files a run keeps beside its record (its inputs for a replay, its small outputs): they
//! travel in the run's journal frame, so one `write(2)` acknowledges the run and its files
//! together, and the feeder writes them out under the store's directory in the background,
//! before it commits the run, so a file is on disk before its run leaves the journal (a
//! crash in between writes it again at the next open: writing one is idempotent). Until
//! then readers get the bytes from memory ([`crate::Store::kept_file`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use xpu_journal::Attachment as KeptFile;

/// Whether `path` may name a kept file: relative, `/`-separated plain names (no `.`, `..`,
/// root or prefix), so that it stays inside the store's directory.
pub fn valid_path(path: &str) -> bool {
    path.split('/').all(|part| !matches!(part, "" | "." | "..") && !part.contains(['\\', '\0']))
}

/// Writes the files of a batch of runs under `root`: each to a temporary name, then renamed
/// into place, so a reader never sees a partial file; with `sync`, data and directories
/// reach the disk before this returns. A file already there with the same length is left
/// (content-addressed blobs are written once; a run's own files are written by it alone).
pub fn write_all(root: &Path, files: &[Arc<KeptFile>], sync: bool) -> std::io::Result<()> {
    static NEXT_TMP: AtomicU64 = AtomicU64::new(0);
    let mut dirs: Vec<PathBuf> = Vec::new();
    for file in files {
        if !valid_path(&file.path) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("kept file `{}` is not a relative path inside the store", file.path),
            ));
        }
        let target = root.join(&file.path);
        if std::fs::metadata(&target).is_ok_and(|m| m.len() == file.bytes.len() as u64) {
            continue;
        }
        let dir = target.parent().unwrap_or(root).to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let n = NEXT_TMP.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".kept-{}-{n}.tmp", std::process::id()));
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(&file.bytes)?;
            if sync {
                f.sync_data()?;
            }
            Ok(())
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &target)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        if sync && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    for dir in dirs {
        std::fs::File::open(&dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_are_kept() {
        for ok in ["runs/01h/inputs/x.npy", "blobs/ab/abcd.npy", "a"] {
            assert!(valid_path(ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "runs/../../x", "./x", "a/./b", "a\\b", "a\0b"] {
            assert!(!valid_path(bad), "{bad:?}");
        }
    }

    #[test]
    fn files_are_written_whole_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = |path: &str, bytes: &[u8]| {
            Arc::new(KeptFile { path: path.into(), bytes: bytes.to_vec() })
        };
        let batch = [file("runs/r1/inputs/x.npy", b"twelve"), file("blobs/ab/cd.csv", b"a,b\n")];
        write_all(dir.path(), &batch, true).unwrap();
        assert_eq!(std::fs::read(dir.path().join("runs/r1/inputs/x.npy")).unwrap(), b"twelve");
        assert_eq!(std::fs::read(dir.path().join("blobs/ab/cd.csv")).unwrap(), b"a,b\n");
        // Again (a replay at open): nothing changes, no temporary is left.
        write_all(dir.path(), &batch, false).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path().join("runs/r1/inputs"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("x.npy")]);
        let err = write_all(dir.path(), &[file("../escape", b"x")], false).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(!dir.path().parent().unwrap().join("escape").exists());
    }
}
