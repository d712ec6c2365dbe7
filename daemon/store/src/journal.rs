//! The journal: finished runs appended to a log before they reach DuckDB, so that a run can
//! be acknowledged after one `write(2)` instead of a database commit (~10 ms here, most of
//! it fsync). The database is fed from it in the background and the journal is replayed at
//! open, so a run the journal holds is never lost and never stored twice (its sequence
//! number decides).
//!
//! Layout: `journal/<first seq, 20 digits>.log` segments; a segment is deleted once every
//! run in it is in the database. A frame is `len: u32 LE, crc32: u32 LE, payload` with the
//! payload a JSON [`Entry`]. A torn frame can only be the last one written before a crash
//! (it was never acknowledged) and is cut off at replay; a bad frame anywhere else is
//! corruption and refuses the open rather than dropping what follows it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{RunRecord, StoreError};

/// A new segment is started past this size.
const SEGMENT_BYTES: u64 = 32 << 20;
/// No single frame is larger (a run's explanation is a few KiB to a few MiB).
const MAX_FRAME: u32 = 1 << 30;

/// A journaled run, as read back.
#[derive(Deserialize)]
pub(crate) struct Entry {
    pub seq: u64,
    pub record: RunRecord,
}

/// A run to journal (the same fields as [`Entry`], borrowed).
#[derive(Serialize)]
pub(crate) struct EntryRef<'a> {
    pub seq: u64,
    pub record: &'a RunRecord,
}

/// How far an acknowledged run is protected.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Written to the operating system: survives the daemon crashing or being killed, not
    /// the machine losing power.
    #[default]
    Process,
    /// Also `fdatasync`ed before the run is acknowledged: survives power loss; each
    /// acknowledgement waits for the disk.
    Machine,
}

pub(crate) struct Journal {
    dir: PathBuf,
    /// The segment being appended to (none until the first append after open or release).
    file: Option<File>,
    /// First sequence number of the open segment, and its length so far.
    first: u64,
    len: u64,
    durability: Durability,
    /// First sequence numbers of the segments before the open one, oldest first.
    closed: Vec<u64>,
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.log"))
}

fn io(dir: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io { dir: dir.to_path_buf(), message: e.to_string() }
}

impl Journal {
    /// Opens the journal in `dir`, returning it and every entry it holds, in order.
    pub fn open(dir: &Path, durability: Durability) -> Result<(Journal, Vec<Entry>), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let mut segments: Vec<u64> = Vec::new();
        for item in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
            let path = item.map_err(|e| io(dir, e))?.path();
            let first = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(first) = first {
                segments.push(first);
            }
        }
        segments.sort();
        let mut entries = Vec::new();
        let last = segments.len().saturating_sub(1);
        for (i, &first) in segments.iter().enumerate() {
            let path = segment_path(dir, first);
            let valid = read_segment(&path, i == last, &mut entries)?;
            if i == last {
                // Cut a torn tail off so new frames follow whole ones.
                let f = OpenOptions::new().write(true).open(&path).map_err(|e| io(dir, e))?;
                f.set_len(valid).map_err(|e| io(dir, e))?;
            }
        }
        // Replayed segments are all closed: the next append starts a new one.
        let journal = Journal {
            dir: dir.to_path_buf(),
            file: None,
            first: 0,
            len: 0,
            durability,
            closed: segments,
        };
        Ok((journal, entries))
    }

    /// Appends entries as one write; when this returns they survive a crash of the process
    /// (and with [`Durability::Machine`], of the machine).
    pub fn append(&mut self, entries: &[EntryRef<'_>]) -> Result<(), StoreError> {
        let Some(head) = entries.first() else { return Ok(()) };
        if self.file.is_none() || self.len >= SEGMENT_BYTES {
            self.rotate(head.seq)?;
        }
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        let mut buf = Vec::with_capacity(512 * entries.len());
        for e in entries {
            let start = buf.len();
            buf.extend_from_slice(&[0; 8]);
            serde_json::to_writer(&mut buf, e).map_err(|err| StoreError::Io {
                dir: self.dir.clone(),
                message: err.to_string(),
            })?;
            let payload = &buf[start + 8..];
            let len =
                u32::try_from(payload.len()).ok().filter(|&l| l < MAX_FRAME).ok_or_else(|| {
                    StoreError::Io {
                        dir: self.dir.clone(),
                        message: format!("run {} is too large to journal", e.record.run_id),
                    }
                })?;
            let crc = crc32fast::hash(payload);
            buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
            buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        }
        let written = file.write_all(&buf).and_then(|()| match self.durability {
            Durability::Process => Ok(()),
            Durability::Machine => file.sync_data(),
        });
        if let Err(e) = written {
            // Whatever part of the frames reached the file must not be followed by the next
            // append: cut back to where this one began.
            let _ = file.set_len(self.len);
            return Err(io(&self.dir, e));
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    /// Starts a new segment whose first run is `first`.
    fn rotate(&mut self, first: u64) -> Result<(), StoreError> {
        let path = segment_path(&self.dir, first);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&self.dir, format!("{}: {e}", path.display())))?;
        if self.durability == Durability::Machine {
            // The new name must survive power loss too.
            File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| io(&self.dir, e))?;
        }
        if self.file.replace(file).is_some() {
            self.closed.push(self.first);
        }
        self.first = first;
        self.len = 0;
        Ok(())
    }

    /// Drops what the database now holds (every run up to `committed`): closed segments
    /// whose runs are all in it, and the open one too once it is wholly in it and `all` is
    /// set or it has grown past a quarter segment (so a busy journal does not churn files).
    pub fn release(&mut self, committed: u64, next_seq: u64, all: bool) -> Result<(), StoreError> {
        while let Some(&first) = self.closed.first() {
            // A closed segment ends where the next one begins.
            let end = match (self.closed.get(1), &self.file) {
                (Some(&next), _) => next,
                (None, Some(_)) => self.first,
                (None, None) => next_seq,
            };
            if end > committed + 1 {
                break;
            }
            std::fs::remove_file(segment_path(&self.dir, first)).map_err(|e| io(&self.dir, e))?;
            self.closed.remove(0);
        }
        let done = self.closed.is_empty() && next_seq == committed + 1;
        if done && self.file.is_some() && (all || self.len >= SEGMENT_BYTES / 4) {
            self.file = None;
            let path = segment_path(&self.dir, self.first);
            std::fs::remove_file(&path).map_err(|e| io(&self.dir, e))?;
            self.len = 0;
        }
        Ok(())
    }
}

/// Reads a segment's frames into `out`; returns the length of its whole frames. In the last
/// segment a torn or bad frame ends the log (it was being written when the process died); in
/// an earlier one it is corruption.
fn read_segment(path: &Path, last: bool, out: &mut Vec<Entry>) -> Result<u64, StoreError> {
    let corrupt = |at: u64, what: &str| StoreError::Io {
        dir: path.to_path_buf(),
        message: format!(
            "journal segment is corrupt at byte {at}: {what}; the store is not opened, as the \
             runs after it would be lost (move the file aside to start without them)"
        ),
    };
    let mut bytes = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| io(path, e))?;
    let mut at = 0usize;
    while at < bytes.len() {
        let header = bytes.get(at..at + 8);
        let frame = header.and_then(|h| {
            let len = u32::from_le_bytes(h[0..4].try_into().ok()?) as usize;
            let crc = u32::from_le_bytes(h[4..8].try_into().ok()?);
            let payload = bytes.get(at + 8..at + 8 + len)?;
            (crc32fast::hash(payload) == crc).then_some(payload)
        });
        let entry = frame.map(serde_json::from_slice::<Entry>);
        match entry {
            Some(Ok(e)) => {
                at += 8 + frame.map_or(0, <[u8]>::len);
                if out.last().is_some_and(|prev| prev.seq >= e.seq) {
                    return Err(corrupt(at as u64, "sequence numbers go backwards"));
                }
                out.push(e);
            }
            // A whole frame that does not decode was written by something else: stop.
            Some(Err(e)) => return Err(corrupt(at as u64, &e.to_string())),
            None if !last => return Err(corrupt(at as u64, "torn or checksum mismatch")),
            None => break,
        }
    }
    Ok(at as u64)
}
