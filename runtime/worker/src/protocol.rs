//! The messages between a worker and its parent: one message per frame (`u32 LE` length,
//! then the body: postcard after a 0 byte for a run and its reply, JSON for the rest — see
//! [`Message`]), requests from the parent, one reply each. Tensor elements are not in the
//! messages: a [`Slot`] says where in the shared memory they are.

use std::io::{Read, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use xpu_engine::{Assignment, Capabilities, DeviceId, EngineError, Fact, NodeTiming, StopReason};
use xpu_ir::{DType, OpClass};

/// Largest message accepted (a partition's JSON with its constants is the largest).
pub const MAX_MESSAGE: usize = 1 << 30;

#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// What the hosted engine is and can do.
    Hello,
    /// Prepares a partition (SGR-ML JSON) under its assignment as executable `id`.
    Prepare { id: u64, partition: String, assignment: Assignment },
    /// Runs executable `id` on the inputs in shared memory; `run` numbers it (from 1) for a
    /// [`Control::Stop`].
    Run { id: u64, run: u64, inputs: Vec<Slot> },
    /// Drops executable `id`.
    Release { id: u64 },
}

/// What the parent sends on the control socket (no reply), read by a thread of its own in
/// the worker so it reaches a run in flight; requests stay on the main socket, read by the
/// thread that serves them (no hand-off between threads on the common path).
#[derive(Debug, Serialize, Deserialize)]
pub enum Control {
    /// Stop run number `run` as a cancel would, if it is the one in flight (a Stop that
    /// crossed its run's reply is ignored). The run answers [`WireError::Stopped`]; a worker
    /// that does not answer within the parent's grace time is killed.
    Stop { run: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Hello {
        version: String,
        capabilities: Capabilities,
        classes: Option<Vec<OpClass>>,
    },
    Prepared,
    /// Outputs in shared memory (after the inputs), with the run's timings and facts, and
    /// the worker's own time for it: reading the inputs, and the whole of its share (inputs,
    /// run, outputs written) — from which the parent tells what the crossing cost.
    ///
    /// An engine's facts are mostly the same run after run (ORT's options and per-node
    /// providers), and a reply's JSON is part of every call's cost: the first `facts_kept`
    /// facts are the executable's facts of its last `Ran` reply, sent again only when they
    /// change; `facts` are the rest.
    Ran {
        outputs: Vec<Slot>,
        timings: Vec<NodeTiming>,
        facts_kept: usize,
        facts: Vec<Fact>,
        inputs_read: Duration,
        served: Duration,
    },
    Released,
    Failed(WireError),
    /// `reply`, and the worker exits after sending it: its engine can take no more work in
    /// this process ([`Engine::poisoned`](xpu_engine::Engine::poisoned) says why).
    Retiring {
        reply: Box<Reply>,
        reason: String,
    },
}

/// A tensor in shared memory: its type, shape and byte range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub len: usize,
}

/// An [`EngineError`] as it crosses the socket: every variant arrives as itself (its
/// `&'static str` fields as strings). The conversions match without a wildcard, so a new
/// `EngineError` variant does not compile until the wire carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireError {
    Unavailable {
        engine: String,
        reason: String,
    },
    Unsupported {
        engine: String,
        node: String,
        what: String,
    },
    Input {
        name: String,
        message: String,
    },
    Kernel {
        node: String,
        message: String,
    },
    MemoryLimit {
        what: String,
        needed: u64,
        limit: u64,
    },
    OutOfMemory {
        device: DeviceId,
        requested: u64,
        available: u64,
        reserved: u64,
    },
    NoDevice {
        engine: String,
        device: DeviceId,
        what: String,
    },
    InvalidOption {
        engine: String,
        key: String,
        value: String,
        expected: String,
    },
    Uncapturable {
        engine: String,
        node: String,
        what: String,
    },
    Crashed {
        engine: String,
        node: String,
        cause: String,
    },
    Quarantined {
        engine: String,
        node: String,
        crashes: u32,
    },
    /// The run stopped at a [`Control::Stop`] before `node`; the parent replaces the reason
    /// with its own stop token's (supervise.rs), which knows whether it cancelled.
    Stopped {
        node: String,
        #[serde(default)]
        deadline: bool,
    },
    Other(String),
}

impl From<&EngineError> for WireError {
    fn from(e: &EngineError) -> WireError {
        match e.clone() {
            EngineError::Unavailable { engine, reason } => {
                WireError::Unavailable { engine, reason }
            }
            EngineError::Unsupported { engine, node, what } => {
                WireError::Unsupported { engine, node, what }
            }
            EngineError::Input { name, message } => WireError::Input { name, message },
            EngineError::Kernel { node, message } => WireError::Kernel { node, message },
            EngineError::MemoryLimit { what, needed, limit } => {
                WireError::MemoryLimit { what, needed, limit }
            }
            EngineError::OutOfMemory { device, requested, available, reserved } => {
                WireError::OutOfMemory { device, requested, available, reserved }
            }
            EngineError::NoDevice { engine, device, what } => {
                WireError::NoDevice { engine, device, what: what.to_string() }
            }
            EngineError::InvalidOption { engine, key, value, expected } => {
                WireError::InvalidOption {
                    engine: engine.to_string(),
                    key: key.to_string(),
                    value,
                    expected: expected.to_string(),
                }
            }
            EngineError::Uncapturable { engine, node, what } => {
                WireError::Uncapturable { engine, node, what }
            }
            EngineError::Crashed { engine, node, cause } => {
                WireError::Crashed { engine, node, cause }
            }
            EngineError::Quarantined { engine, node, crashes } => {
                WireError::Quarantined { engine, node, crashes }
            }
            EngineError::Stopped { node, reason } => {
                WireError::Stopped { node, deadline: reason == StopReason::DeadlinePassed }
            }
            EngineError::Other(m) => WireError::Other(m),
        }
    }
}

impl From<WireError> for EngineError {
    fn from(e: WireError) -> EngineError {
        match e {
            WireError::Unavailable { engine, reason } => {
                EngineError::Unavailable { engine, reason }
            }
            WireError::Unsupported { engine, node, what } => {
                EngineError::Unsupported { engine, node, what }
            }
            WireError::Input { name, message } => EngineError::Input { name, message },
            WireError::Kernel { node, message } => EngineError::Kernel { node, message },
            WireError::MemoryLimit { what, needed, limit } => {
                EngineError::MemoryLimit { what, needed, limit }
            }
            WireError::OutOfMemory { device, requested, available, reserved } => {
                EngineError::OutOfMemory { device, requested, available, reserved }
            }
            WireError::NoDevice { engine, device, what } => {
                EngineError::NoDevice { engine, device, what: what.into() }
            }
            WireError::InvalidOption { engine, key, value, expected } => {
                EngineError::InvalidOption {
                    engine: engine.into(),
                    key: key.into(),
                    value,
                    expected: expected.into(),
                }
            }
            WireError::Uncapturable { engine, node, what } => {
                EngineError::Uncapturable { engine, node, what }
            }
            WireError::Crashed { engine, node, cause } => {
                EngineError::Crashed { engine, node, cause }
            }
            WireError::Quarantined { engine, node, crashes } => {
                EngineError::Quarantined { engine, node, crashes }
            }
            WireError::Stopped { node, deadline } => EngineError::Stopped {
                node,
                reason: if deadline { StopReason::DeadlinePassed } else { StopReason::Cancelled },
            },
            WireError::Other(m) => EngineError::Other(m),
        }
    }
}

/// A frame whose body starts with this byte is postcard, not JSON (no JSON text starts
/// with it).
const COMPACT: u8 = 0;

/// Messages and how they travel. The two of every run ([`Request::Run`], [`Reply::Ran`])
/// go compact: postcard reads them with a fraction of the code JSON runs, and after a
/// long run that code is out of the caches, where every line it touches costs (JSON
/// took 3–7 µs a message here, measured). The rest go as JSON, which their types' optional
/// fields need.
pub trait Message: Serialize + for<'de> Deserialize<'de> {
    fn compact(&self) -> bool;
}

impl Message for Request {
    fn compact(&self) -> bool {
        matches!(self, Request::Run { .. })
    }
}

impl Message for Reply {
    fn compact(&self) -> bool {
        matches!(self, Reply::Ran { .. })
    }
}

impl Message for Control {
    fn compact(&self) -> bool {
        false
    }
}

/// Writes one message.
pub fn send<T: Message>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let mut frame = vec![0u8; 4];
    if msg.compact() {
        frame.push(COMPACT);
        frame = postcard::to_extend(msg, frame).map_err(std::io::Error::other)?;
    } else {
        serde_json::to_writer(&mut frame, msg).map_err(std::io::Error::other)?;
    }
    let body = frame.len() - 4;
    let len = u32::try_from(body)
        .ok()
        .filter(|&l| (l as usize) <= MAX_MESSAGE)
        .ok_or_else(|| std::io::Error::other(format!("message of {body} bytes")))?;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one message; `Ok(None)` at end of stream (the other side is gone). A compact
/// frame must carry a message that goes compact.
pub fn receive<T: Message>(r: &mut impl Read) -> std::io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!("message of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(&body).map(Some)
}

fn decode<T: Message>(body: &[u8]) -> std::io::Result<T> {
    match body.split_first() {
        Some((&COMPACT, rest)) => {
            let msg: T = postcard::from_bytes(rest).map_err(std::io::Error::other)?;
            if msg.compact() {
                Ok(msg)
            } else {
                Err(std::io::Error::other("a compact frame carried a message that goes as JSON"))
            }
        }
        _ => serde_json::from_slice(body).map_err(std::io::Error::other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_of<T: Message>(msg: &T) -> Vec<u8> {
        let mut out = Vec::new();
        send(&mut out, msg).unwrap();
        out
    }

    fn ran() -> Reply {
        Reply::Ran {
            outputs: vec![Slot {
                dtype: DType::F32,
                shape: vec![64, 10],
                offset: 200_704,
                len: 2560,
            }],
            timings: vec![NodeTiming {
                node: xpu_ir::NodeId(3),
                kernel: "ort.cpu".into(),
                nanos: 7,
            }],
            facts_kept: 12,
            facts: vec![Fact { node: None, key: "ort.run_us".into(), value: "451".into() }],
            inputs_read: Duration::from_nanos(400),
            served: Duration::from_micros(483),
        }
    }

    #[test]
    fn every_engine_error_crosses_the_socket_as_itself() {
        let cuda: DeviceId = "cuda:1".parse().unwrap();
        let errors = [
            EngineError::Unavailable { engine: "ort".into(), reason: "no library".into() },
            EngineError::Unsupported { engine: "cpu".into(), node: "n1".into(), what: "x".into() },
            EngineError::Input { name: "a".into(), message: "rank".into() },
            EngineError::Kernel { node: "n2".into(), message: "nan".into() },
            EngineError::Stopped { node: "n3".into(), reason: StopReason::Cancelled },
            EngineError::Stopped { node: "n3".into(), reason: StopReason::DeadlinePassed },
            EngineError::MemoryLimit { what: "arena".into(), needed: 9, limit: 8 },
            EngineError::OutOfMemory { device: cuda, requested: 5, available: 4, reserved: 3 },
            EngineError::NoDevice { engine: "llvm".into(), device: cuda, what: "upload".into() },
            EngineError::InvalidOption {
                engine: "cpu".into(),
                key: "threads".into(),
                value: "0".into(),
                expected: "a positive thread count".into(),
            },
            EngineError::Uncapturable {
                engine: "cuda".into(),
                node: "matmul n4".into(),
                what: "allocating a workspace".into(),
            },
            EngineError::Crashed {
                engine: "ort".into(),
                node: "n5".into(),
                cause: "SIGSEGV".into(),
            },
            EngineError::Quarantined { engine: "ort".into(), node: "n6".into(), crashes: 3 },
            EngineError::Other("anything else".into()),
        ];
        for e in errors {
            let frame = frame_of(&Reply::Failed(WireError::from(&e)));
            let Some(Reply::Failed(w)) = receive::<Reply>(&mut &frame[..]).unwrap() else {
                panic!("a failure reply");
            };
            let back = EngineError::from(w);
            assert_eq!(back, e);
            assert_eq!(back.code(), e.code());
        }
    }

    #[test]
    fn runs_and_their_replies_go_compact_and_everything_else_as_json() {
        let run = Request::Run {
            id: 7,
            run: 1 << 40,
            inputs: vec![Slot { dtype: DType::Bool, shape: vec![], offset: 0, len: 1 }],
        };
        for (frame, compact) in [
            (frame_of(&run), true),
            (frame_of(&ran()), true),
            (frame_of(&Request::Hello), false),
            (frame_of(&Request::Release { id: 3 }), false),
            (
                frame_of(&Reply::Failed(WireError::Stopped { node: "n1".into(), deadline: false })),
                false,
            ),
            (frame_of(&Control::Stop { run: 9 }), false),
        ] {
            assert_eq!(
                u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize,
                frame.len() - 4
            );
            assert_eq!(frame[4] == COMPACT, compact, "{frame:?}");
        }
        // Each comes back as it went.
        let back: Request = receive(&mut &frame_of(&run)[..]).unwrap().unwrap();
        assert_eq!(format!("{back:?}"), format!("{run:?}"));
        let back: Reply = receive(&mut &frame_of(&ran())[..]).unwrap().unwrap();
        assert_eq!(format!("{back:?}"), format!("{:?}", ran()));
        let failed = Reply::Failed(WireError::Kernel { node: "n".into(), message: "m".into() });
        let back: Reply = receive(&mut &frame_of(&failed)[..]).unwrap().unwrap();
        assert_eq!(format!("{back:?}"), format!("{failed:?}"));
        // Several frames on one stream, and its end.
        let mut stream = frame_of(&run);
        stream.extend(frame_of(&Request::Hello));
        let mut r = &stream[..];
        assert!(matches!(receive::<Request>(&mut r).unwrap(), Some(Request::Run { .. })));
        assert!(matches!(receive::<Request>(&mut r).unwrap(), Some(Request::Hello)));
        assert!(receive::<Request>(&mut r).unwrap().is_none());
        assert!(frame_of(&ran()).len() < 80, "a reply that keeps its facts is small");
    }

    #[test]
    fn bad_frames_are_errors_never_panics() {
        let framed = |body: &[u8]| {
            let mut f = (body.len() as u32).to_le_bytes().to_vec();
            f.extend_from_slice(body);
            f
        };
        // A compact frame carrying a message that goes as JSON (Hello is variant 0).
        let hello = postcard::to_stdvec(&Request::Hello).unwrap();
        let mut body = vec![COMPACT];
        body.extend(hello);
        let err = receive::<Request>(&mut &framed(&body)[..]).unwrap_err();
        assert!(err.to_string().contains("compact frame"), "{err}");
        // Truncated, cut, garbage, deeply nested, too long, and an unknown variant.
        let good = frame_of(&ran());
        for cut in 1..good.len() {
            let got = receive::<Reply>(&mut &good[..cut]);
            // Within the length: the stream's end (the other side went mid-frame).
            assert!(if cut < 4 { matches!(got, Ok(None)) } else { got.is_err() }, "cut at {cut}");
        }
        let mut seed = 0x9e37_79b9_u32;
        for n in 0..2000usize {
            let body: Vec<u8> = (0..n % 97)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            let _ = receive::<Reply>(&mut &framed(&body)[..]);
            let _ = receive::<Request>(&mut &framed(&body)[..]);
        }
        let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(receive::<Reply>(&mut &framed(nested.as_bytes())[..]).is_err());
        let mut huge = ((MAX_MESSAGE + 1) as u32).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        let err = receive::<Reply>(&mut &huge[..]).unwrap_err();
        assert!(err.to_string().contains("bytes"), "{err}");
        let mut unknown = vec![COMPACT];
        unknown.extend(postcard::to_stdvec(&200u32).unwrap());
        assert!(receive::<Reply>(&mut &framed(&unknown)[..]).is_err());
    }
}
