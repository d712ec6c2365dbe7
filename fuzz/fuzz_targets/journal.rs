//! The store's journal segments. Random bytes almost never carry a valid CRC, so the input
//! is read as a list of frames: each chunk (split at 0xFF) is framed with its true length
//! and checksum, except chunks starting 0xFE, appended raw (torn tails, garbage). Whatever
//! decodes must decode again, as whole frames, from the prefix it reported.
#![no_main]
use libfuzzer_sys::fuzz_target;
use xpu_journal::{Entry, decode_segment};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let mut segment = Vec::new();
    for chunk in rest.split(|&b| b == 0xFF) {
        match chunk.split_first() {
            Some((0xFE, raw)) => segment.extend_from_slice(raw),
            _ => {
                segment.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
                segment.extend_from_slice(&crc32fast::hash(chunk).to_le_bytes());
                segment.extend_from_slice(chunk);
            }
        }
    }
    let last = flags & 1 == 1;
    let mut entries: Vec<Entry<serde_json::Value>> = Vec::new();
    let Ok(whole) = decode_segment(&segment, last, &mut entries) else { return };
    assert!(whole <= segment.len());
    let mut again: Vec<Entry<serde_json::Value>> = Vec::new();
    let n = decode_segment(&segment[..whole], false, &mut again)
        .expect("the whole frames decode as a closed segment");
    assert_eq!((n, &again), (whole, &entries), "the prefix decodes to the same entries");
});
