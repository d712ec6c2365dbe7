//! Values of a run: host tensors, or buffers an engine owns on one of its devices.
//!
//! GraphExec hands each partition its inputs as [`Value`]s. An engine that computes on the
//! host takes host tensors (the default [`Executable::run_values`](crate::Executable)); an
//! engine that keeps values in a device's memory says so ([`Engine::device_memory`]
//! (crate::Engine::device_memory)), takes its own buffers and returns buffers, and moves
//! values in and out through [`Engine::upload`](crate::Engine::upload) and
//! [`Engine::download`](crate::Engine::download) — which GraphExec calls, times and records
//! for every transfer the plan lists. A device buffer is never copied implicitly: cloning a
//! [`Value`] shares the buffer (an `Arc`), and only its engine reads it.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use xpu_ir::{DType, Tensor};

use crate::DeviceId;

/// A buffer in a device's memory, owned by the engine that made it.
pub trait DeviceBuffer: Send + Sync + fmt::Debug {
    /// The engine that owns it: only that engine runs on it or downloads it.
    fn engine(&self) -> &str;
    fn device(&self) -> DeviceId;
    fn dtype(&self) -> DType;
    fn shape(&self) -> &[usize];
    /// So the owning engine can reach its own buffer type.
    fn as_any(&self) -> &dyn Any;

    fn size_bytes(&self) -> u64 {
        (self.shape().iter().product::<usize>() * self.dtype().size_bytes()) as u64
    }
}

/// One value of a run.
#[derive(Clone, Debug)]
pub enum Value {
    /// In host memory.
    Host(Tensor),
    /// In a device's memory, owned by an engine (shared, never copied by cloning).
    Device(Arc<dyn DeviceBuffer>),
}

impl Value {
    /// Where the value lives.
    pub fn device(&self) -> DeviceId {
        match self {
            Value::Host(_) => DeviceId::HOST,
            Value::Device(b) => b.device(),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        match self {
            Value::Host(t) => t.size_bytes() as u64,
            Value::Device(b) => b.size_bytes(),
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            Value::Host(t) => t.shape(),
            Value::Device(b) => b.shape(),
        }
    }

    pub fn dtype(&self) -> xpu_ir::DType {
        match self {
            Value::Host(t) => t.dtype(),
            Value::Device(b) => b.dtype(),
        }
    }

    pub fn as_host(&self) -> Option<&Tensor> {
        match self {
            Value::Host(t) => Some(t),
            Value::Device(_) => None,
        }
    }

    /// The buffer, when it is `engine`'s on `device`: what that engine may run on directly.
    pub fn buffer_of(&self, engine: &str, device: DeviceId) -> Option<&Arc<dyn DeviceBuffer>> {
        match self {
            Value::Device(b) if b.engine() == engine && b.device() == device => Some(b),
            _ => None,
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Host(t)
    }
}
