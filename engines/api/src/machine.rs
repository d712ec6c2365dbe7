//! The host a live inventory describes: its CPU model and the instruction-set features that
//! change which kernels run and how fast. Measured evidence (lock files) records the same,
//! so a choice measured on one machine is not applied on another.

use serde::{Deserialize, Serialize};

/// The features kernels depend on, as Linux's `/proc/cpuinfo` names them.
const FEATURES: &[&str] = &[
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
    "rvv",
];

/// The host's CPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostMachine {
    /// The CPU model (`Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz`).
    pub cpu: String,
    /// The features of [`FEATURES`] it has, in that order.
    #[serde(default)]
    pub features: Vec<String>,
}

impl HostMachine {
    /// This process's host, read once.
    pub fn this() -> &'static HostMachine {
        static THIS: std::sync::OnceLock<HostMachine> = std::sync::OnceLock::new();
        THIS.get_or_init(|| {
            let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            HostMachine::from_cpuinfo(&text)
        })
    }

    /// The host described by a `/proc/cpuinfo` text (its first processor).
    pub fn from_cpuinfo(text: &str) -> HostMachine {
        let field = |names: &[&str]| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                names.contains(&k.trim()).then(|| v.trim().to_string())
            })
        };
        let cpu = field(&["model name", "uarch", "cpu model", "Hardware"])
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let flags = field(&["flags", "Features", "isa"]).unwrap_or_default();
        let have: Vec<&str> = flags.split_whitespace().collect();
        let features =
            FEATURES.iter().filter(|f| have.contains(f)).map(|f| f.to_string()).collect();
        HostMachine { cpu, features }
    }
}
