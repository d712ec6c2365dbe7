//! The journal: entries (finished runs, for the explanation store) appended to a log before
//! they reach a database, so that an entry can be acknowledged after one `write(2)` instead
//! of a database commit (~10 ms here, most of it fsync). The owner feeds its database from
//! it in the background and replays it at open, so an entry the journal holds is never lost
//! and never stored twice (its sequence number decides).
//!
//! Layout: `<dir>/<first seq, 20 digits>.log` segments; a segment is deleted once every
//! entry in it is committed. A frame is `len: u32 LE, crc32: u32 LE, payload` with the
//! payload a JSON [`Entry`]. An entry may carry files ([`Attachment`]: bytes its owner keeps
//! beside the record, such as a run's inputs), so that the entry and its files are
//! acknowledged by the same single write and the owner writes the files out in the
//! background, once per entry, before it releases the segment. A torn frame can only be the last one written before a crash
//! (it was never acknowledged) and is cut off at replay; a bad frame anywhere else is
//! corruption and refuses the open rather than dropping what follows it. Segment bytes are
//! untrusted input to [`decode_segment`] (fuzzed: `make fuzz`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A new segment is started past this size.
const SEGMENT_BYTES: u64 = 32 << 20;
/// No single frame is larger (a run's explanation is a few KiB to a few MiB).
const MAX_FRAME: u32 = 1 << 30;

/// A journaled entry, as read back.
#[derive(Debug, PartialEq, Deserialize)]
pub struct Entry<T> {
    pub seq: u64,
    pub record: T,
    /// Files the entry carries (none in entries written before attachments existed).
    #[serde(default)]
    pub files: Vec<Attachment>,
}

/// An entry to journal (the same fields as [`Entry`], borrowed).
#[derive(Serialize)]
pub struct EntryRef<'a, T> {
    pub seq: u64,
    pub record: &'a T,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub files: &'a [std::sync::Arc<Attachment>],
}

/// Bytes an entry carries for its owner to keep as a file, under a path relative to the
/// owner's directory (the journal neither checks nor uses the path). In the frame's JSON
/// the bytes are base64.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub path: String,
    #[serde(with = "base64_bytes")]
    pub bytes: Vec<u8>,
}

mod base64_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}

/// The journal's directory could not be read or written, or holds a corrupt segment.
#[derive(Debug, thiserror::Error)]
#[error("{dir}: {message}")]
pub struct JournalError {
    /// The journal directory, or the segment file at fault.
    pub dir: PathBuf,
    pub message: String,
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

/// An open journal: appends go to the newest segment.
pub struct Journal {
    dir: PathBuf,
    /// The segment being appended to (none until the first append after open or release).
    file: Option<File>,
    /// First sequence number of the open segment, and its length so far.
    first: u64,
    len: u64,
    durability: Durability,
    /// First sequence numbers of the segments before the open one, oldest first.
    closed: Vec<u64>,
    /// The frames being written, kept between appends: a run's frame is tens of KB, and a
    /// fresh buffer would grow to it by reallocating and copying each time.
    frames: Vec<u8>,
}

/// What an append's buffer may keep between appends (a larger batch frees it after).
const KEPT_FRAME_BYTES: usize = 1 << 20;

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.log"))
}

fn io(dir: &Path, e: impl std::fmt::Display) -> JournalError {
    JournalError { dir: dir.to_path_buf(), message: e.to_string() }
}

impl Journal {
    /// Opens the journal in `dir`, returning it and every entry it holds, in order.
    pub fn open<T: DeserializeOwned>(
        dir: &Path,
        durability: Durability,
    ) -> Result<(Journal, Vec<Entry<T>>), JournalError> {
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
            frames: Vec::new(),
        };
        Ok((journal, entries))
    }

    /// Appends entries as one write; when this returns they survive a crash of the process
    /// (and with [`Durability::Machine`], of the machine).
    pub fn append<T: Serialize>(
        &mut self,
        entries: &[EntryRef<'_, T>],
    ) -> Result<(), JournalError> {
        let Some(head) = entries.first() else { return Ok(()) };
        if self.file.is_none() || self.len >= SEGMENT_BYTES {
            self.rotate(head.seq)?;
        }
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        let mut buf = std::mem::take(&mut self.frames);
        buf.clear();
        for e in entries {
            let start = buf.len();
            buf.extend_from_slice(&[0; 8]);
            serde_json::to_writer(&mut buf, e).map_err(|err| io(&self.dir, err))?;
            let payload = &buf[start + 8..];
            let len = u32::try_from(payload.len())
                .ok()
                .filter(|&l| l < MAX_FRAME)
                .ok_or_else(|| io(&self.dir, format!("entry {} is too large to journal", e.seq)))?;
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
        if buf.capacity() <= KEPT_FRAME_BYTES {
            self.frames = buf;
        }
        Ok(())
    }

    /// Starts a new segment whose first run is `first`.
    fn rotate(&mut self, first: u64) -> Result<(), JournalError> {
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
    pub fn release(
        &mut self,
        committed: u64,
        next_seq: u64,
        all: bool,
    ) -> Result<(), JournalError> {
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

/// Reads a segment file's frames into `out`; returns the length of its whole frames.
fn read_segment<T: DeserializeOwned>(
    path: &Path,
    last: bool,
    out: &mut Vec<Entry<T>>,
) -> Result<u64, JournalError> {
    let mut bytes = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| io(path, e))?;
    decode_segment(&bytes, last, out).map(|n| n as u64).map_err(|c| {
        io(
            path,
            format!(
                "journal segment is corrupt at byte {}: {}; the store is not opened, as the \
                 entries after it would be lost (move the file aside to start without them)",
                c.at, c.what
            ),
        )
    })
}

/// Where and how a segment is corrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// Byte offset of the bad frame.
    pub at: usize,
    pub what: String,
}

/// Decodes a segment's bytes into `out` (after what it holds: sequence numbers must rise
/// across segments too); returns the length of its whole frames. In the last segment
/// (`last`) a torn or bad-checksum frame ends the log (it was being written when the process
/// died); in an earlier one it is corruption, as is a whole frame that does not decode or a
/// sequence number that does not rise.
pub fn decode_segment<T: DeserializeOwned>(
    bytes: &[u8],
    last: bool,
    out: &mut Vec<Entry<T>>,
) -> Result<usize, Corrupt> {
    let corrupt = |at: usize, what: String| Corrupt { at, what };
    let mut at = 0usize;
    while at < bytes.len() {
        let frame = bytes.get(at..).and_then(|rest| {
            let len = u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?) as usize;
            let crc = u32::from_le_bytes(rest.get(4..8)?.try_into().ok()?);
            let payload = rest.get(8..8usize.checked_add(len)?)?;
            (crc32fast::hash(payload) == crc).then_some(payload)
        });
        match frame.map(|p| (p.len(), serde_json::from_slice::<Entry<T>>(p))) {
            Some((len, Ok(e))) => {
                if out.last().is_some_and(|prev| prev.seq >= e.seq) {
                    return Err(corrupt(at, "sequence numbers go backwards".into()));
                }
                at += 8 + len;
                out.push(e);
            }
            // A whole frame that does not decode was written by something else: stop.
            Some((_, Err(e))) => return Err(corrupt(at, e.to_string())),
            None if !last => return Err(corrupt(at, "torn or checksum mismatch".into())),
            None => break,
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn entries_carry_their_files_and_older_frames_still_decode() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, none) = Journal::open::<String>(dir.path(), Durability::Process).unwrap();
        assert!(none.is_empty());
        let files = [Arc::new(Attachment { path: "runs/r/x.npy".into(), bytes: vec![0, 255, 7] })];
        let record = "first".to_string();
        journal.append(&[EntryRef { seq: 1, record: &record, files: &files }]).unwrap();
        let second = "second".to_string();
        journal.append(&[EntryRef { seq: 2, record: &second, files: &[] }]).unwrap();
        drop(journal);
        let (_, entries) = Journal::open::<String>(dir.path(), Durability::Process).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].files, [(*files[0]).clone()]);
        assert!(entries[1].files.is_empty());
        // A frame written before entries had files (no `files` key) decodes with none.
        let payload = br#"{"seq":3,"record":"old"}"#;
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        frame.extend_from_slice(payload);
        let mut out = Vec::new();
        decode_segment::<String>(&frame, false, &mut out).unwrap();
        assert_eq!((out[0].seq, out[0].record.as_str(), out[0].files.len()), (3, "old", 0));
        // Bytes that are not base64 make the frame undecodable (corruption, not a panic).
        let payload = br#"{"seq":4,"record":"x","files":[{"path":"p","bytes":"%%"}]}"#;
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        frame.extend_from_slice(payload);
        assert!(decode_segment::<String>(&frame, false, &mut Vec::new()).is_err());
    }
}
