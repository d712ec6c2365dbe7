//! Devices as typed ids. A device is a kind and an ordinal (`host`, `cuda:0`, `gpu:1`,
//! `npu:0`, `riscv64:0`): the planner places kernels on them by the kind each kernel runs on
//! (from the catalogue), GraphExec moves values between them, explanations name them. The
//! kinds are memory domains, not vendors' device names: two devices of different kinds never
//! share memory, so a value crossing between them is a transfer.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a device is, as far as where its memory lives.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The host CPU and its memory.
    Host,
    /// An NVIDIA GPU driven through CUDA (cuda engine, ONNX Runtime's CUDA/TensorRT providers).
    Cuda,
    /// Another GPU with its own memory (OpenVINO's GPU plugin).
    Gpu,
    /// A neural processing unit (OpenVINO's NPU plugin).
    Npu,
    /// A riscv64 machine (qemu-riscv64 here, a board in the field): its own process and memory.
    Riscv64,
}

impl DeviceKind {
    pub const ALL: [DeviceKind; 5] =
        [DeviceKind::Host, DeviceKind::Cuda, DeviceKind::Gpu, DeviceKind::Npu, DeviceKind::Riscv64];

    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Host => "host",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Npu => "npu",
            DeviceKind::Riscv64 => "riscv64",
        }
    }

    fn parse(text: &str) -> Option<DeviceKind> {
        DeviceKind::ALL.into_iter().find(|k| k.name() == text)
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One device: a kind and an ordinal among the devices of that kind.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub kind: DeviceKind,
    pub ordinal: u32,
}

impl DeviceId {
    pub const HOST: DeviceId = DeviceId { kind: DeviceKind::Host, ordinal: 0 };

    pub fn new(kind: DeviceKind, ordinal: u32) -> DeviceId {
        DeviceId { kind, ordinal }
    }

    pub fn is_host(self) -> bool {
        self.kind == DeviceKind::Host
    }
}

impl Default for DeviceId {
    fn default() -> DeviceId {
        DeviceId::HOST
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Host => f.write_str("host"),
            kind => write!(f, "{kind}:{}", self.ordinal),
        }
    }
}

/// A device id that does not parse, with what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {text:?}: {problem} (a device is host, cuda:N, gpu:N, npu:N or riscv64:N)")]
pub struct DeviceIdError {
    pub text: String,
    pub problem: String,
}

impl FromStr for DeviceId {
    type Err = DeviceIdError;

    fn from_str(text: &str) -> Result<DeviceId, DeviceIdError> {
        let err =
            |problem: String| DeviceIdError { text: text.chars().take(64).collect(), problem };
        let (kind_text, ordinal) = match text.split_once(':') {
            Some((k, n)) => {
                let n = n
                    .parse::<u32>()
                    .ok()
                    .filter(|_| n.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| err(format!("ordinal {n:?} is not a number")))?;
                (k, Some(n))
            }
            None => (text, None),
        };
        let kind = DeviceKind::parse(kind_text)
            .ok_or_else(|| err(format!("unknown kind {kind_text:?}")))?;
        match (kind, ordinal) {
            (DeviceKind::Host, None | Some(0)) => Ok(DeviceId::HOST),
            (DeviceKind::Host, Some(n)) => Err(err(format!("there is one host, not host:{n}"))),
            (kind, None) => Err(err(format!("say which {kind}: {kind}:0, {kind}:1, …"))),
            (kind, Some(n)) => Ok(DeviceId::new(kind, n)),
        }
    }
}

impl Serialize for DeviceId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DeviceId, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Which way a value crosses between devices.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransferDirection {
    /// Host memory to a device's.
    #[serde(rename = "h2d")]
    HostToDevice,
    /// A device's memory to the host's.
    #[serde(rename = "d2h")]
    DeviceToHost,
    /// Between two devices (through the host where they cannot reach each other).
    #[serde(rename = "d2d")]
    DeviceToDevice,
}

impl TransferDirection {
    /// The direction of a move from `from` to `to`; `None` when they are the same device.
    pub fn between(from: DeviceId, to: DeviceId) -> Option<TransferDirection> {
        match (from.is_host(), to.is_host()) {
            _ if from == to => None,
            (true, false) => Some(TransferDirection::HostToDevice),
            (false, true) => Some(TransferDirection::DeviceToHost),
            _ => Some(TransferDirection::DeviceToDevice),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TransferDirection::HostToDevice => "h2d",
            TransferDirection::DeviceToHost => "d2h",
            TransferDirection::DeviceToDevice => "d2d",
        }
    }
}

impl fmt::Display for TransferDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A device an engine can place work on, as capabilities and inventories list it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Device {
    pub id: DeviceId,
    /// What the vendor calls it (`NVIDIA H100 80GB HBM3`, OpenVINO's `GPU.0`); may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

impl Device {
    pub fn host() -> Device {
        Device { id: DeviceId::HOST, name: String::new(), memory_bytes: None }
    }
}

/// The written form of a device: `{ id = "cuda:0", name = "…", memory_bytes = … }`, or the
/// form inventories had before device ids, `{ name = "cuda:0", kind = "gpu" }`, which still
/// loads (see [`id_from_name_and_kind`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WrittenDevice {
    id: Option<DeviceId>,
    #[serde(default)]
    name: String,
    kind: Option<String>,
    memory_bytes: Option<u64>,
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Device, D::Error> {
        use serde::de::Error;
        let w = WrittenDevice::deserialize(d)?;
        let id = match (w.id, &w.kind) {
            (Some(_), Some(_)) => {
                return Err(D::Error::custom(
                    "a device has `id` (host, cuda:N, …) or the old `kind`, not both",
                ));
            }
            (Some(id), None) => id,
            (None, Some(kind)) => id_from_name_and_kind(&w.name, kind).map_err(D::Error::custom)?,
            (None, None) => {
                return Err(D::Error::custom(
                    "a device needs `id` (host, cuda:N, gpu:N, npu:N or riscv64:N)",
                ));
            }
        };
        // The old form's name was the id (`cuda:0`, `host`); keep only vendor names.
        let name = if w.kind.is_some() && w.name.parse::<DeviceId>().is_ok() {
            String::new()
        } else {
            w.name
        };
        Ok(Device { id, name, memory_bytes: w.memory_bytes })
    }
}

/// The id of a device given by a free name and kind: inventories written before device ids
/// (`name = "cuda:0", kind = "gpu"`; `name = "NPU", kind = "npu"`; `kind = "cpu"`) and
/// OpenVINO's device names (`GPU.1` of kind gpu).
pub fn id_from_name_and_kind(name: &str, kind: &str) -> Result<DeviceId, String> {
    // The ordinal from the name: `cuda:1`, `GPU.1`, else 0.
    let ordinal = name
        .rsplit([':', '.'])
        .next()
        .filter(|n| *n != name)
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    let lower = name.to_ascii_lowercase();
    let kind = match kind.to_ascii_lowercase().as_str() {
        "cpu" | "host" => DeviceKind::Host,
        "cuda" => DeviceKind::Cuda,
        "gpu" if lower.starts_with("cuda") => DeviceKind::Cuda,
        "gpu" => DeviceKind::Gpu,
        "npu" => DeviceKind::Npu,
        "riscv64" | "riscv" => DeviceKind::Riscv64,
        other => {
            return Err(format!(
                "device {name:?}: unknown kind {other:?}; write `id` instead: host, cuda:N, gpu:N, npu:N or riscv64:N"
            ));
        }
    };
    Ok(if kind == DeviceKind::Host { DeviceId::HOST } else { DeviceId::new(kind, ordinal) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text() {
        for text in ["host", "cuda:0", "cuda:7", "gpu:1", "npu:0", "riscv64:3"] {
            let id: DeviceId = text.parse().unwrap();
            assert_eq!(id.to_string(), text);
        }
        assert_eq!("host:0".parse::<DeviceId>(), Ok(DeviceId::HOST));
    }

    #[test]
    fn bad_ids_say_what_is_wrong() {
        for (text, says) in [
            ("cuda", "say which cuda"),
            ("tpu:0", "unknown kind \"tpu\""),
            ("cuda:x", "ordinal \"x\""),
            ("cuda:+1", "ordinal \"+1\""),
            ("cuda:99999999999", "ordinal"),
            ("host:1", "one host"),
            ("", "unknown kind"),
        ] {
            let e = text.parse::<DeviceId>().unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn old_inventory_devices_get_ids() {
        for (name, kind, id) in [
            ("host", "cpu", "host"),
            ("cuda:0", "gpu", "cuda:0"),
            ("cuda:1", "cuda", "cuda:1"),
            ("GPU.1", "gpu", "gpu:1"),
            ("NPU", "npu", "npu:0"),
        ] {
            assert_eq!(id_from_name_and_kind(name, kind).unwrap().to_string(), id, "{name} {kind}");
        }
        assert!(id_from_name_and_kind("x", "tpu").unwrap_err().contains("unknown kind"));
    }

    #[test]
    fn directions_follow_the_devices() {
        let cuda = DeviceId::new(DeviceKind::Cuda, 0);
        assert_eq!(
            TransferDirection::between(DeviceId::HOST, cuda),
            Some(TransferDirection::HostToDevice)
        );
        assert_eq!(
            TransferDirection::between(cuda, DeviceId::HOST),
            Some(TransferDirection::DeviceToHost)
        );
        assert_eq!(
            TransferDirection::between(cuda, DeviceId::new(DeviceKind::Cuda, 1)),
            Some(TransferDirection::DeviceToDevice)
        );
        assert_eq!(TransferDirection::between(cuda, cuda), None);
    }
}

/// Which host memory a transfer goes through (`memory.pinned_host`): the tensor's own
/// pageable pages, or page-locked staging buffers the device copies from and into by DMA.
/// An engine without pinned staging ([`crate::Engine::pinned_staging`] `None`), or a
/// transfer under the engine's threshold, takes `Pinned` as `Pageable`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum HostMemory {
    #[default]
    Pageable,
    Pinned,
}
