//! The messages between a worker and its parent: one JSON message per frame (`u32 LE`
//! length, then the JSON), requests from the parent, one reply each. Tensor elements are not
//! in the messages: a [`Slot`] says where in the shared memory they are.

use std::io::{Read, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use xpu_engine::{Assignment, Capabilities, EngineError, Fact, NodeTiming};
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
    Ran {
        outputs: Vec<Slot>,
        timings: Vec<NodeTiming>,
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

/// An [`EngineError`] as it crosses the socket (its `&'static str` fields as strings).
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
    /// The run stopped at a [`Control::Stop`] before `node`; why it was stopped (cancel or
    /// deadline) the parent knows.
    Stopped {
        node: String,
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
            EngineError::Stopped { node, .. } => WireError::Stopped { node },
            other => WireError::Other(other.to_string()),
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
            // The parent replaces the reason with its own stop token's (supervise.rs).
            WireError::Stopped { node } => {
                EngineError::Stopped { node, reason: xpu_engine::StopReason::Cancelled }
            }
            WireError::Other(m) => EngineError::Other(m),
        }
    }
}

/// Writes one message.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| (l as usize) <= MAX_MESSAGE)
        .ok_or_else(|| std::io::Error::other(format!("message of {} bytes", body.len())))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one message; `Ok(None)` at end of stream (the other side is gone).
pub fn receive<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> std::io::Result<Option<T>> {
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
    serde_json::from_slice(&body).map(Some).map_err(std::io::Error::other)
}
