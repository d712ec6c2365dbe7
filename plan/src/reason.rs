//! Reason codes: why a candidate (engine, kernel, precision) was not chosen for a node, or
//! why a plan failed. The names are a stable contract (stored explanations, CI checks,
//! `[[test]] expect_error`); `docs/reason-codes.md` is generated from this table.

use serde::{Deserialize, Serialize};

macro_rules! reason_codes {
    ($($code:ident => $doc:literal,)*) => {
        /// Why a candidate was rejected or a plan failed.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum ReasonCode { $($code,)* }

        impl ReasonCode {
            pub const ALL: &'static [ReasonCode] = &[$(ReasonCode::$code,)*];

            pub fn name(self) -> &'static str {
                match self { $(ReasonCode::$code => stringify!($code),)* }
            }

            pub fn doc(self) -> &'static str {
                match self { $(ReasonCode::$code => $doc,)* }
            }

            pub fn from_name(s: &str) -> Option<ReasonCode> {
                ReasonCode::ALL.iter().copied().find(|c| c.name() == s)
            }
        }
    };
}

reason_codes! {
    PolicyDenied => "The engine is in `[engines] deny`.",
    NotInOrder => "`[engines] order` is set and does not list the engine.",
    RuleOverride => "A `[[rule]]` matched the node and sends it to another engine.",
    EngineUnavailable => "The engine is not in the inventory, is compiled out (SupportDisabled) or its library or device is missing (Unavailable).",
    OpUnsupported => "No kernel of the engine runs the node's op.",
    KernelNotPinned => "`[kernels]` or a rule pins the node's op class to another kernel.",
    KernelUnavailable => "The pinned kernel is not in the engine's inventory entry.",
    PrecisionNotAllowed => "The node would run at a precision `[precision] allow` does not list.",
    DtypeUnsupported => "The kernel does not accept the element type the node computes in.",
    NotDeterministic => "`[execution] determinism = \"bitwise\"` and the kernel does not guarantee bit-identical results run to run.",
    MemoryLimitExceeded => "The node's tensors do not fit the device's memory, or the plan's peak exceeds `[memory] limit`.",
    Outranked => "The candidate could run the node, but one earlier in the preference order (engine order, kernel preference) was chosen.",
    FallbackDenied => "The candidate is a fallback (not the node's first choice) and `[engines] fallback = \"deny\"`.",
    FallbackBudgetExceeded => "More nodes or FLOPs fell back than `[engines] fallback_budget` allows.",
    Unplaceable => "No candidate is left for a node: the plan fails.",
    CaptureUnsupported => "`[execution] capture = \"graph\"` and the partition's engine cannot replay a captured executable: it runs eagerly (a recorded decision, not an error).",
    ReuseUnsupported => "`[memory] reuse` asks for buffer reuse and the partition's engine does not execute xpu's memory plan: what it does instead is recorded.",
    FusionSplit => "A fusion group (nodes the `fuse` pass marked to compile as one loop nest) does not run whole on one engine and kernel: its nodes were placed on different engines, kernels or partitions, each by its own decision.",
    SettingUnsupported => "A setting the policy asks of engines (`memory.pool`, `memory.pinned_host`, `precision.accumulate`) that the partition's engine does not honour as asked: what it does instead is recorded.",
    KernelDegraded => "The kernel runs here below what the machine can do (`cpu.blas` over a BLAS that does not know the CPU): another kernel of the engine was preferred. A policy that names the kernel (`[kernels]`, a rule) still gets it.",
    MeasuredSlower => "`choose = \"measured\"`: the candidate could run the node and comes first in the static order, but the evidence (`[measured] lock`, or a daemon's store) measured another allowed candidate faster.",
    Exploring => "`choose = \"measured\"` on a daemon tuning online: this run tries another allowed candidate whose evidence is thinner than `[measured] min_samples` (within `[measured] explore_runs`, never under `execution.determinism`), so later plans can choose by measurement.",
    EvidenceMissing => "`choose = \"measured\"` and the evidence has no figures for the node's signature (another shape, op or attributes than measured): the static order decided.",
    EvidenceThin => "`choose = \"measured\"` and the measured winner has fewer timed runs than `[measured] min_samples`: the static order decided.",
    EvidenceNotApplicable => "`choose = \"measured\"` and the evidence cannot decide here: the lock is unreadable, was measured on another machine or engine version, or its winner is not a candidate the policy allows for the node. The static order decided.",
}

/// `docs/reason-codes.md`, generated so it cannot drift from the code.
pub fn reference_markdown() -> String {
    let mut s = String::from(
        "# Reason codes\n\n<!-- generated from plan/src/reason.rs; XPU_BLESS=1 cargo test -p xpu-tests regenerates -->\n\n\
         Every candidate the planner rejects, every fallback and every plan failure carries one of\n\
         these codes, with a detail sentence and the policy location (`file:line`) that caused it.\n\
         The names are stable: stored explanations, `[[test]] expect_error` and CI scripts rely on them.\n\n\
         | code | meaning |\n|---|---|\n",
    );
    for c in ReasonCode::ALL {
        s.push_str(&format!("| `{}` | {} |\n", c.name(), c.doc()));
    }
    s
}
