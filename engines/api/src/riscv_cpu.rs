//! The instruction set of riscv64 code (`xpuctl build --target riscv64 --cpu`, `[engines.llvm]
//! riscv_cpu`): the RVA20-class base every riscv64 Linux board runs (`rv64gc`), or that base
//! with the vector extension 1.0 (`rv64gcv`), which current boards implement and which LLVM
//! compiles loops for with scalable vectors (one binary for any vector length). A vector
//! build refuses, at start, a CPU without the extension instead of stopping on an illegal
//! instruction.

use std::fmt;
use std::str::FromStr;

/// The ISA of riscv64 builds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum RiscvCpu {
    /// RV64IMAFDC (`G` = IMAFD + Zicsr + Zifencei), the lp64d ABI: scalar code.
    #[default]
    #[serde(rename = "rv64gc")]
    Rv64gc,
    /// `rv64gc` plus V (RVV 1.0): loops vectorised with LLVM's scalable vectors.
    #[serde(rename = "rv64gcv")]
    Rv64gcv,
}

/// The names [`RiscvCpu`] is written as, in order.
pub const RISCV_CPU_NAMES: [&str; 2] = ["rv64gc", "rv64gcv"];

impl RiscvCpu {
    const ALL: [RiscvCpu; 2] = [RiscvCpu::Rv64gc, RiscvCpu::Rv64gcv];

    pub fn name(self) -> &'static str {
        RISCV_CPU_NAMES[self as usize]
    }

    /// Whether code for it uses the vector extension.
    pub fn has_vector(self) -> bool {
        self == RiscvCpu::Rv64gcv
    }

    /// The LLVM target features of the ISA.
    pub fn llvm_features(self) -> &'static str {
        match self {
            RiscvCpu::Rv64gc => "+m,+a,+f,+d,+c",
            RiscvCpu::Rv64gcv => "+m,+a,+f,+d,+c,+v",
        }
    }
}

impl fmt::Display for RiscvCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is none of [`RISCV_CPU_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown riscv64 CPU {0:?} (known: rv64gc, rv64gcv)")]
pub struct UnknownRiscvCpu(pub String);

impl FromStr for RiscvCpu {
    type Err = UnknownRiscvCpu;

    fn from_str(s: &str) -> Result<RiscvCpu, UnknownRiscvCpu> {
        let name = s.trim();
        RiscvCpu::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| UnknownRiscvCpu(s.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for c in RiscvCpu::ALL {
            assert_eq!(c.name().parse::<RiscvCpu>(), Ok(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.name()));
            assert_eq!(serde_json::from_str::<RiscvCpu>(&json).unwrap(), c);
            assert_eq!(c.has_vector(), c.llvm_features().ends_with(",+v"));
        }
        for bad in ["", "rv64", "rv64gcv_zvl256b", "RV64GC", "rv32gc", &"v".repeat(10_000)] {
            let e = bad.parse::<RiscvCpu>().unwrap_err();
            assert!(e.to_string().contains("known: rv64gc, rv64gcv"), "{e}");
            assert!(e.to_string().len() < 200, "a long name is cut in the message");
        }
    }
}
