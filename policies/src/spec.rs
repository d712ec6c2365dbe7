//! The policy file format: one Rust type per TOML section. Every section has defaults, so a
//! file sets only what it cares about and layers (built-in defaults, `extends` parents, job
//! overrides, environment) merge key by key. `deny_unknown_fields` everywhere: a typo is an
//! error, never a silently ignored key. The JSON Schema in `schemas/policy.schema.json` is
//! generated from these types.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
pub use xpu_engine::options::{
    Capture, Determinism, Fallback, GraphOptimization, PerformanceHint, Pool, PrecisionName, Reuse,
};

/// A whole policy file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySpec {
    pub policy: Meta,
    pub engines: Engines,
    /// Op class or op name → one pinned kernel, or kernels in preference order.
    pub kernels: BTreeMap<String, KernelChoice>,
    pub precision: Precision,
    pub memory: Memory,
    pub execution: Execution,
    /// Where measured choices (`choose = "measured"`) come from.
    #[serde(skip_serializing_if = "Measured::is_unset")]
    pub measured: Measured,
    /// Node-level overrides; the first matching rule wins.
    #[serde(rename = "rule", skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// Placement assertions run by `xpuctl policy test`.
    #[serde(rename = "test", skip_serializing_if = "Vec::is_empty")]
    pub tests: Vec<PolicyTest>,
}

/// `[policy]`: identity, inheritance and job matching.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Meta {
    pub name: String,
    pub version: u32,
    pub description: String,
    /// A parent policy: a name in the same directory (`base` → `base.toml`) or a path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    /// Which jobs this policy is for; the most specific match wins, then `priority`.
    #[serde(rename = "match", skip_serializing_if = "Match::is_empty")]
    pub matches: Match,
    pub priority: i32,
    /// Keys a job may override (`execution.threads`, or a whole section `precision`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overridable: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Match {
    pub labels: BTreeMap<String, String>,
}

impl Match {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// `[engines]`: preference order, denials and what happens when a node cannot be placed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Engines {
    /// Engines in preference order; engines not listed are not used. Empty: every engine
    /// of the inventory in its order.
    pub order: Vec<String>,
    pub deny: Vec<String>,
    pub fallback: Fallback,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_budget: Option<FallbackBudget>,
    /// How a node's engine and kernel are chosen among the candidates the policy allows:
    /// `static` (the order above) or `measured` (the fastest by the evidence of
    /// `[measured]`; pins, denials, precision limits and fallback rules stay absolute).
    #[serde(skip_serializing_if = "Choose::is_static")]
    pub choose: Choose,
}

/// How a node's candidate is chosen.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Choose {
    /// The first candidate in the policy's order.
    #[default]
    Static,
    /// The allowed candidate with the lowest measured median; the order where evidence is
    /// missing or too thin (the explanation says which).
    Measured,
}

impl Choose {
    pub fn is_static(&self) -> bool {
        *self == Choose::Static
    }
}

/// `[measured]`: the evidence measured choices read, and how much exploring it may cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Measured {
    /// A lock file written by `xpuctl tune` (`P.lock.toml`), relative to the policy file
    /// that sets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// Fewest timed runs behind a measured winner before it may decide; thinner evidence
    /// leaves the node to the static order.
    pub min_samples: u32,
    /// Where the evidence is a daemon's store (`[tuning] online` in xpud, no lock): the
    /// most timed runs, per node signature, that candidates other than the best measured
    /// may take while their evidence is thinner than `min_samples`. 0: never explore.
    pub explore_runs: u32,
    /// A candidate already measured slower than this many times the best one's median is
    /// not explored further.
    pub max_slowdown: f64,
}

impl Default for Measured {
    fn default() -> Measured {
        Measured { lock: None, min_samples: 3, explore_runs: 8, max_slowdown: 1.5 }
    }
}

impl Measured {
    pub fn is_unset(&self) -> bool {
        *self == Measured::default()
    }
}

/// How much of a graph may fall back before the plan fails or warns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FallbackBudget {
    /// Largest share of nodes (percent, 0–100) placed on a fallback engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nodes_pct: Option<f64>,
    /// Largest share of estimated FLOPs (percent, 0–100) run on a fallback engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_flops_pct: Option<f64>,
    #[serde(default)]
    pub on_exceeded: OnExceeded,
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExceeded {
    #[default]
    Fail,
    Warn,
}

/// One pinned kernel, or a preference list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum KernelChoice {
    Pinned(String),
    Prefer(Vec<String>),
}

impl KernelChoice {
    pub fn kernels(&self) -> &[String] {
        match self {
            KernelChoice::Pinned(k) => std::slice::from_ref(k),
            KernelChoice::Prefer(ks) => ks,
        }
    }
}

/// `[precision]`: what float nodes compute in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Precision {
    /// The precision float nodes run at; absent: each node keeps its graph dtype.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<PrecisionName>,
    /// Precisions a node may run at (the default, rules and keep_fp32 must be in it).
    pub allow: Vec<PrecisionName>,
    /// Accumulator precision passed to engines for reductions and contractions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulate: Option<PrecisionName>,
    /// Op classes or op names always computed in fp32.
    pub keep_fp32: Vec<String>,
}

impl Default for Precision {
    fn default() -> Precision {
        Precision {
            default: None,
            allow: PrecisionName::ALL.to_vec(),
            accumulate: None,
            keep_fp32: Vec::new(),
        }
    }
}

/// `[memory]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Memory {
    /// Largest peak of live tensor bytes a plan may need (`"20GiB"`, `"512MB"`, or bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<ByteSize>,
    pub pool: Pool,
    pub reuse: Reuse,
    /// Page-locked host buffers for device transfers.
    pub pinned_host: bool,
}

/// `[execution]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Execution {
    pub capture: Capture,
    pub determinism: Determinism,
    /// Worker threads per engine; absent: the engine's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// Wall-clock limit of one run (`"30s"`, `"500ms"`, `"2m"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationText>,
    /// How far engines with their own graph optimiser (ONNX Runtime) may rewrite the graph;
    /// absent: the engine's default (all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_optimization: Option<GraphOptimization>,
    /// What engines with a performance hint (OpenVINO) tune for; absent: latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub performance: Option<PerformanceHint>,
}

/// `[[rule]]`: a node-level override.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub when: RuleMatch,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionName>,
    /// `choose` for the nodes this rule matches (over `[engines] choose`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choose: Option<Choose>,
}

/// What a rule matches; every given condition must hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuleMatch {
    /// An op name (`matmul`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// An op class (`conv`, `reduction`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// A glob over node names (`encoder.*.attn`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Only nodes with at least this many estimated FLOPs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_flops: Option<f64>,
    /// Only nodes whose (first float) dtype is this (`f32`, `bf16`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

/// `[[test]]`: a placement assertion.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyTest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Program (.sgr, .json, .onnx), relative to the policy file.
    pub program: String,
    /// Declared inventory, relative to the policy file.
    pub inventory: String,
    /// Symbol bindings for dynamic dims (`{ N = 64 }`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bind: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect: Vec<Expect>,
    /// No node may be placed on a fallback engine.
    #[serde(default)]
    pub no_fallback: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_transfers: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_peak_memory: Option<ByteSize>,
    /// The plan must fail with this reason code (`EngineUnavailable`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_error: Option<String>,
}

/// The placement every node selected by `op`/`class`/`node` must get.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Expect {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionName>,
}

/// `"20 GiB"` → `(20.0, "GiB")`: a non-negative number and the unit after it.
fn number_and_unit(s: &str) -> Option<(f64, &str)> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    Some((num.parse().ok()?, unit.trim()))
}

/// A byte count written as `"20GiB"`, `"512 MB"`, `"4096"` or an integer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let (n, unit) =
            number_and_unit(s).ok_or_else(|| format!("`{s}` is not a size (e.g. \"20GiB\")"))?;
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "tib" => 1 << 40,
            u => {
                return Err(format!(
                    "unknown size unit `{u}` in `{s}` (use B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)"
                ));
            }
        };
        Ok(ByteSize((n * mult as f64).round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [(1u64 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (m, u) in units {
            if self.0 >= m && self.0.is_multiple_of((m / 1024).max(1)) {
                let v = self.0 as f64 / m as f64;
                return if v.fract() == 0.0 { write!(f, "{v}{u}") } else { write!(f, "{v:.2}{u}") };
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl ByteSize {
    /// The exact form (`"2500MiB"`, `"1029MiB"`, `"123B"`): the largest unit that divides the
    /// size, so that writing a policy out and reading it back keeps every byte (Display's
    /// two decimals are for people).
    pub fn exact(&self) -> String {
        let units = [(1u64 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (m, u) in units {
            if self.0 >= m && self.0.is_multiple_of(m) {
                return format!("{}{u}", self.0 / m);
            }
        }
        format!("{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.exact())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a size: an integer of bytes or a string like \"20GiB\"",
            )
        })? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

impl JsonSchema for ByteSize {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ByteSize".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Bytes: an integer, or a number with a unit (B, KB, KiB, MB, MiB, GB, GiB, TB, TiB).",
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*([KMGT]i?B|[KMGT]|B)?\\s*$"}
            ]
        })
    }
}

/// A duration written as `"30s"`, `"500ms"`, `"2m"`, `"1h"`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DurationText(pub std::time::Duration);

impl DurationText {
    pub fn parse(s: &str) -> Result<DurationText, String> {
        let (n, unit) =
            number_and_unit(s).ok_or_else(|| format!("`{s}` is not a duration (e.g. \"30s\")"))?;
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" | "" => n,
            "m" | "min" => n * 60.0,
            "h" => n * 3600.0,
            u => return Err(format!("unknown duration unit `{u}` in `{s}` (use ms, s, m, h)")),
        };
        Ok(DurationText(std::time::Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for DurationText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if !self.0.subsec_nanos().is_multiple_of(1_000_000) {
            // Below a millisecond: fractional milliseconds, which read back the same.
            write!(f, "{}ms", self.0.as_secs_f64() * 1e3)
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for DurationText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DurationText, D::Error> {
        let t = String::deserialize(d)?;
        DurationText::parse(&t).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for DurationText {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration: a number with unit ms, s, m or h.",
            "type": "string",
            "pattern": "^\\s*[0-9]+(\\.[0-9]+)?\\s*(ms|s|m|min|h)?\\s*$"
        })
    }
}
