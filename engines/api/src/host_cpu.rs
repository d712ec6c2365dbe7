//! Which instruction set code generated for this machine may use: all the host has
//! (`native`, the default), or one of the x86-64 micro-architecture levels, for code that
//! must run the same on every machine of a fleet, kernels cached on one machine and loaded
//! on another, or to measure what a host without AVX-512 would get. A level the host does
//! not have is refused (its code would stop on an illegal instruction).

use std::fmt;
use std::str::FromStr;

/// The instruction set of host code (`[engines.llvm] host_cpu`, `$XPU_LLVM_HOST_CPU`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum HostCpu {
    /// The host's CPU name and every feature it reports.
    #[default]
    #[serde(rename = "native")]
    Native,
    /// SSE4.2 and POPCNT (x86-64-v2).
    #[serde(rename = "x86-64-v2")]
    X86_64V2,
    /// AVX2, FMA, BMI2 (x86-64-v3): 256-bit vectors.
    #[serde(rename = "x86-64-v3")]
    X86_64V3,
    /// AVX-512 F/BW/CD/DQ/VL (x86-64-v4): 512-bit vectors.
    #[serde(rename = "x86-64-v4")]
    X86_64V4,
}

/// The names [`HostCpu`] is written as, in order.
pub const HOST_CPU_NAMES: [&str; 4] = ["native", "x86-64-v2", "x86-64-v3", "x86-64-v4"];

impl HostCpu {
    const ALL: [HostCpu; 4] =
        [HostCpu::Native, HostCpu::X86_64V2, HostCpu::X86_64V3, HostCpu::X86_64V4];

    pub fn name(self) -> &'static str {
        HOST_CPU_NAMES[self as usize]
    }

    /// The LLVM features a level turns on (each level includes the ones before it); empty
    /// for `native`, whose features are the host's.
    pub fn x86_features(self) -> Vec<&'static str> {
        const V2: &[&str] = &["cx16", "popcnt", "sahf", "sse3", "sse4.1", "sse4.2", "ssse3"];
        const V3: &[&str] =
            &["avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"];
        const V4: &[&str] = &["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"];
        let levels: &[&[&str]] = match self {
            HostCpu::Native => &[],
            HostCpu::X86_64V2 => &[V2],
            HostCpu::X86_64V3 => &[V2, V3],
            HostCpu::X86_64V4 => &[V2, V3, V4],
        };
        levels.iter().flat_map(|l| l.iter().copied()).collect()
    }
}

impl fmt::Display for HostCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is none of [`HOST_CPU_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown host CPU {0:?} (known: native, x86-64-v2, x86-64-v3, x86-64-v4)")]
pub struct UnknownHostCpu(pub String);

impl FromStr for HostCpu {
    type Err = UnknownHostCpu;

    fn from_str(s: &str) -> Result<HostCpu, UnknownHostCpu> {
        let name = s.trim();
        HostCpu::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| UnknownHostCpu(s.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for c in HostCpu::ALL {
            assert_eq!(c.name().parse::<HostCpu>(), Ok(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.name()));
            assert_eq!(serde_json::from_str::<HostCpu>(&json).unwrap(), c);
        }
        for bad in ["", "x86-64-v5", "skylake", "NATIVE", &"v".repeat(10_000)] {
            let e = bad.parse::<HostCpu>().unwrap_err();
            assert!(e.to_string().contains("known: native"), "{e}");
            assert!(e.to_string().len() < 200, "a long name is cut in the message");
        }
    }

    #[test]
    fn each_level_includes_the_one_before() {
        let v2 = HostCpu::X86_64V2.x86_features();
        let v3 = HostCpu::X86_64V3.x86_features();
        let v4 = HostCpu::X86_64V4.x86_features();
        assert!(HostCpu::Native.x86_features().is_empty());
        assert!(v2.iter().all(|f| v3.contains(f)) && v3.iter().all(|f| v4.contains(f)));
        assert!(v3.contains(&"avx2") && !v2.contains(&"avx2"));
        assert!(v4.contains(&"avx512f") && !v3.contains(&"avx512f"));
    }
}
