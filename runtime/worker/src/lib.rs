//! Engines in supervised worker processes (docs/daemon.md, "Isolation"). A native library
//! that segfaults, aborts or poisons its device context takes down the process it runs in;
//! run in a worker, it takes down only the worker, and only the jobs running on it fail.
//!
//! - [`WorkerEngine`] (parent side) is an [`Engine`](xpu_engine::Engine) like any other: it
//!   starts its worker at first use, forwards `capabilities`, `prepare` and `run`, and turns
//!   a worker's death into [`EngineError::Crashed`](xpu_engine::EngineError::Crashed) naming
//!   the engine, the signal (or exit status) and the partition. The next use restarts it
//!   after a backoff; a partition that crashed it [`QUARANTINE_AFTER`] times in a row is refused
//!   (`Quarantined`) instead of crash-looping; a stop (cancel, `execution.timeout`) kills a
//!   worker that does not answer.
//! - An engine has a pool of workers (`WorkerSetup::processes`), started as concurrent use
//!   needs them; each serves one request at a time.
//! - `serve` (child side, [`serve_inherited`]) hosts one engine: prepared executables live there.
//! - Tensors cross through one shared-memory file per worker (a memfd both sides map and
//!   either grows), not through the socket, which carries small messages ([`protocol`]); an
//!   engine that reads elements where they lie (ort) runs on them there.
//! - Each side watches its socket for a bounded while before blocking where the next
//!   message is due soon (`WorkerSetup::spin`): a blocked thread's idle vCPU is halted, and
//!   waking it costs more than the message.

pub mod protocol;
mod serve;
mod shm;
mod stop;
mod supervise;
mod wait;

pub use serve::{FAULT_MARKERS, serve_inherited};
pub use supervise::{
    DEFAULT_SPIN, EngineWorkerStats, QUARANTINE_AFTER, WorkerEngine, WorkerSetup, stats_snapshot,
};
