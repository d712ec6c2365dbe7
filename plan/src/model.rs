//! What the planner produces: the [`CapturePlan`] (the frozen execution strategy GraphExec
//! runs) and the [`Explanation`] (every decision, rejected candidate, cast and transfer,
//! with reason codes and policy locations; run-time timings and engine facts are added by
//! GraphExec). Both serialize deterministically: same inputs, byte-identical JSON.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use xpu_engine::options::{Capture, Determinism};
use xpu_engine::{Assignment, DeviceId, PrecisionName, TransferDirection};
use xpu_ir::{Graph, NodeId, ValueId};

use crate::reason::ReasonCode;

/// The policy a plan was made under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRef {
    pub name: String,
    pub version: u32,
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryRef {
    pub name: String,
    pub fingerprint: String,
}

/// Where a node runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Node of the planned graph.
    pub node: NodeId,
    /// The node it came from in the source graph (`None` for inserted casts).
    pub source: Option<NodeId>,
    /// The source node's signature ([`crate::evidence`]): what its measured times are
    /// filed under. `None` for casts and constants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<crate::evidence::Signature>,
    pub op: String,
    pub engine: Arc<str>,
    pub kernel: Arc<str>,
    /// Precision the node computes at (`None` for non-float nodes).
    pub precision: Option<PrecisionName>,
    pub device: DeviceId,
    pub partition: usize,
}

/// An engine-contiguous run of nodes, prepared and executed as one unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionPlan {
    pub id: usize,
    pub engine: String,
    pub device: DeviceId,
    /// Nodes of the planned graph, in order.
    pub nodes: Vec<NodeId>,
    /// What the engine receives: options here; GraphExec adds each node's kernel from the
    /// placements, keyed by partition-local node id.
    pub assignment: Assignment,
}

/// A tensor crossing devices at a partition boundary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// Value of the planned graph.
    pub value: ValueId,
    pub from_device: DeviceId,
    pub to_device: DeviceId,
    pub direction: TransferDirection,
    /// `None` when the size depends on unbound dims.
    pub bytes: Option<u64>,
    /// Partition that reads it (`None` for a graph output going back to the caller).
    pub to_partition: Option<usize>,
    pub reason: String,
}

/// A precision cast the planner inserted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CastPlan {
    /// The cast node in the planned graph.
    pub node: NodeId,
    pub from: String,
    pub to: String,
    /// The source-graph node it feeds (`None` for a cast back at a graph output).
    pub for_node: Option<NodeId>,
    pub reason: Arc<str>,
    /// A constant converted at plan time: `node` is the new constant, nothing runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub folded: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySummary {
    /// Largest sum of live tensor bytes; `None` when some size is unknown.
    pub peak_bytes: Option<u64>,
    pub arena_bytes: u64,
    pub limit_bytes: Option<u64>,
}

/// Execution settings from the policy, as the plan froze them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionSettings {
    pub capture: Capture,
    pub determinism: Determinism,
    pub threads: Option<u32>,
    pub timeout_ms: Option<u64>,
}

/// The frozen execution strategy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapturePlan {
    pub source_graph_hash: String,
    /// The passes run over the source graph before planning, in order (what a frozen plan's
    /// check re-runs to rebuild the planned graph).
    #[serde(default)]
    pub passes: Vec<String>,
    pub policy: PolicyRef,
    pub inventory: InventoryRef,
    pub bindings: BTreeMap<String, u64>,
    /// The graph GraphExec runs: the source graph with precision casts inserted (shared
    /// with the caller's graph when nothing was inserted).
    pub graph: Arc<Graph>,
    pub placements: Vec<Placement>,
    pub partitions: Vec<PartitionPlan>,
    pub transfers: Vec<Transfer>,
    pub casts: Vec<CastPlan>,
    pub memory: MemorySummary,
    pub execution: ExecutionSettings,
    /// The evidence measured choices read: part of what the plan depends on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<EvidenceRef>,
}

impl CapturePlan {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serializes")
    }
}

/// A candidate the planner did not choose.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub engine: String,
    pub kernel: Option<String>,
    pub precision: Option<PrecisionName>,
    pub code: ReasonCode,
    pub detail: String,
    /// The policy key behind the rejection (`engines.deny`, `kernels.matmul`, `rule[2]`),
    /// when a policy key caused it, and where it is set (`file:line`).
    pub key: Option<Arc<str>>,
    pub at: Option<Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    // Shared strings: a plan holds one choice per node in several places.
    pub engine: Arc<str>,
    pub kernel: Arc<str>,
    pub precision: Option<PrecisionName>,
    pub device: DeviceId,
}

/// The policy key that decided a node, and where it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRef {
    /// `engines.order`, `kernels.matmul`, `rule[2] "big-matmuls"`, `fallback`, `constant`.
    pub key: Arc<str>,
    pub at: Option<Arc<str>>,
}

/// A node that did not get its first choice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallbackNote {
    pub from: String,
    pub code: ReasonCode,
    pub detail: String,
}

/// The per-node decisions of a plan, shared by every explanation cloned from it (a cached
/// plan's, once per run) together with their JSON text once it has been written: a daemon
/// journals the same decisions for every run of a plan, and writing them is most of the
/// cost of storing a run (15 KB of a 22 KB record for a 14-node model). Reads like a slice
/// of [`Decision`]; serialises as a JSON array, deserialises from one.
#[derive(Clone, Default)]
pub struct Decisions(Arc<SharedDecisions>);

#[derive(Clone, Default)]
struct SharedDecisions {
    list: Vec<Decision>,
    json: std::sync::OnceLock<Box<serde_json::value::RawValue>>,
}

impl Decisions {
    /// Keeps the decisions `keep` says yes to (a copy: others may share these).
    pub fn retain(&mut self, keep: impl FnMut(&Decision) -> bool) {
        let mut list = self.0.list.clone();
        list.retain(keep);
        *self = list.into();
    }

    /// A decision to change (a copy of them all when another explanation shares them).
    pub fn get_mut(&mut self, index: usize) -> Option<&mut Decision> {
        let shared = Arc::make_mut(&mut self.0);
        shared.json = std::sync::OnceLock::new();
        shared.list.get_mut(index)
    }
}

impl From<Vec<Decision>> for Decisions {
    fn from(list: Vec<Decision>) -> Decisions {
        Decisions(Arc::new(SharedDecisions { list, json: std::sync::OnceLock::new() }))
    }
}

impl std::ops::Deref for Decisions {
    type Target = [Decision];
    fn deref(&self) -> &[Decision] {
        &self.0.list
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.list.iter()
    }
}

impl std::fmt::Debug for Decisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.list.fmt(f)
    }
}

impl PartialEq for Decisions {
    fn eq(&self, other: &Decisions) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.list == other.0.list
    }
}

std::thread_local! {
    static COMPACT_JSON: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `write`, a compact JSON writer (the store's journal), with [`Decisions`] written
/// from their kept text. Anywhere else they are written field by field, since the kept text
/// is compact JSON and nothing else (a pretty printer, another format).
pub fn writing_compact_json<R>(write: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            COMPACT_JSON.set(self.0);
        }
    }
    let _restore = Restore(COMPACT_JSON.replace(true));
    write()
}

impl Serialize for Decisions {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !COMPACT_JSON.get() {
            return self.0.list.serialize(s);
        }
        let json = match self.0.json.get() {
            Some(json) => json,
            None => {
                let text = serde_json::value::to_raw_value(&self.0.list)
                    .map_err(serde::ser::Error::custom)?;
                self.0.json.get_or_init(|| text)
            }
        };
        json.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Decisions {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Decisions, D::Error> {
        Vec::<Decision>::deserialize(d).map(Decisions::from)
    }
}

/// Everything decided about one source-graph node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub node: NodeId,
    pub name: Option<String>,
    pub op: Cow<'static, str>,
    pub class: Cow<'static, str>,
    pub flops: Option<u64>,
    pub chosen: Option<Choice>,
    pub rule: Option<RuleRef>,
    /// How the precision was decided (`precision.default`, `keep_fp32`, `graph dtype`, a rule).
    pub precision_from: Option<RuleRef>,
    pub fallback: Option<FallbackNote>,
    /// Shared between nodes with identical candidate walks (most nodes of a model).
    pub rejected: std::sync::Arc<Vec<Rejection>>,
    /// For a node its policy chooses by measurement: what the evidence said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredNote>,
}

/// What the evidence said about a node whose policy chooses by measurement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasuredNote {
    /// `None`: the evidence decided (the decision's rule names the figures); else why the
    /// static order decided.
    pub code: Option<ReasonCode>,
    pub detail: String,
    /// What the measured choice saves per run, nanoseconds: the static choice's measured
    /// median minus the chosen one's (when both were measured and they differ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_nanos: Option<u64>,
}

/// The evidence a plan's measured choices read: the lock and its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceRef {
    /// The lock file as the policy names it; `store` for a daemon's store evidence.
    pub lock: String,
    pub sha256: String,
    /// Aggregated from a daemon's stored runs (online tuning), not read from a lock.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_store: bool,
    /// Why the evidence was not used for any node (unreadable, another machine), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unused: Option<String>,
}

impl EvidenceRef {
    /// How explanations name it: `lock P.lock.toml (digest)` or `store (digest)`.
    pub fn describe(&self) -> String {
        if self.from_store {
            format!("store ({})", self.sha256)
        } else {
            format!("lock {} ({})", self.lock, self.sha256)
        }
    }
}

/// A plan-level finding (budget, memory, unplaceable nodes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub code: ReasonCode,
    pub message: String,
    pub at: Option<Arc<str>>,
}

/// Measured wall time of one node of the planned graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTime {
    pub node: NodeId,
    pub engine: String,
    pub kernel: String,
    pub nanos: u64,
    /// The node's signature (what a store's evidence files the time under).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<crate::evidence::Signature>,
}

/// A transfer a run performed, with the bytes it really moved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferDone {
    pub value: ValueId,
    pub direction: TransferDirection,
    #[serde(default)]
    pub from_device: DeviceId,
    #[serde(default)]
    pub to_device: DeviceId,
    pub bytes: u64,
    /// Time GraphExec spent moving it through the engines' upload/download; `None` when
    /// the engine reading it takes host memory and copies inside its own run (the time is
    /// then part of its node timings).
    #[serde(default)]
    pub nanos: Option<u64>,
    /// The engines that moved it (`ort` for a copy inside ONNX Runtime's run; `cuda` for
    /// an upload; `a -> b` through the host between two engines' devices).
    #[serde(default)]
    pub by: String,
    /// Staged through page-locked host memory (`memory.pinned_host` on an engine that
    /// stages that way).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned_host: bool,
}

/// Whether a run's partition was prepared for it or reused from an earlier run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrepareOutcome {
    Prepared,
    Reused,
}

impl PrepareOutcome {
    pub fn name(self) -> &'static str {
        match self {
            PrepareOutcome::Prepared => "prepared",
            PrepareOutcome::Reused => "reused",
        }
    }
}

/// How a run got its partition's executable, and what preparing it once cost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionPrepared {
    pub partition: usize,
    pub engine: String,
    pub outcome: PrepareOutcome,
    /// The time its engine took to prepare it (when it was prepared, for a reused one).
    pub prepare_nanos: u64,
}

/// A fact an engine reported (ORT provider per node, OpenVINO runtime precision).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineFact {
    pub engine: String,
    pub node: Option<NodeId>,
    pub key: String,
    pub value: String,
}

/// The explanation of a plan (and, after GraphExec, of a run).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub graph_hash: String,
    pub graph_name: String,
    pub policy: PolicyRef,
    pub policy_files: Vec<String>,
    pub inventory: InventoryRef,
    pub decisions: Decisions,
    pub casts: Vec<CastPlan>,
    pub transfers: Vec<Transfer>,
    pub memory: MemorySummary,
    pub warnings: Vec<Note>,
    pub errors: Vec<Note>,
    /// What policy settings did per partition where an engine cannot honour them as asked
    /// (`CaptureUnsupported`, `ReuseUnsupported`): decisions, not warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<Note>,
    /// Filled by GraphExec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timings: Vec<NodeTime>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers_done: Vec<TransferDone>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub facts: Vec<EngineFact>,
    /// Per partition: prepared for this run, or reused (prepare once, run many).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepared: Vec<PartitionPrepared>,
    /// The passes run before planning and what each changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passes: Vec<crate::passes::PassRecord>,
    /// Each fusion group: where it went whole, or why it was split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupDecision>,
    /// The evidence measured choices read (`choose = "measured"`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<EvidenceRef>,
}

/// What the planner did with one fusion group (nodes the `fuse` pass marked to compile as
/// one loop nest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDecision {
    pub group: u32,
    pub nodes: Vec<NodeId>,
    /// The engine, kernel and partition the whole group runs in; `None` when split.
    pub whole: Option<(String, String, usize)>,
    /// Why it was split (`FusionSplit`), with the detail.
    pub split: Option<(ReasonCode, String)>,
}

impl Explanation {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("explanation serializes")
    }

    pub fn fallbacks(&self) -> usize {
        self.decisions.iter().filter(|d| d.fallback.is_some()).count()
    }
}

/// A plan frozen to a file (`xpuctl policy resolve --plan-out`), replayed later with
/// `xpuctl run --plan`: the plan and the explanation it was made with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrozenPlan {
    /// Format version of this file.
    pub version: u32,
    pub plan: CapturePlan,
    pub explanation: Explanation,
}

impl FrozenPlan {
    /// 2: typed device ids, options and precisions (1 had free strings).
    pub const VERSION: u32 = 2;

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plan serializes")
    }

    /// Reads a frozen plan: the format version first (a file of another version is refused
    /// as such, not by the first field that changed), then the whole file, with the path of
    /// the field and `line:col` on anything malformed. [`validate`](FrozenPlan::validate)
    /// checks what the types cannot.
    pub fn from_json(text: &str) -> Result<FrozenPlan, String> {
        #[derive(Deserialize)]
        struct Version {
            version: Option<u32>,
        }
        let v: Version =
            serde_json::from_str(text).map_err(|e| format!(" not a frozen plan: {e}"))?;
        match v.version {
            Some(FrozenPlan::VERSION) => {}
            Some(other) => {
                return Err(format!(
                    " frozen plan format {other} is not supported (this build reads {}: make it again with `xpuctl policy resolve --plan-out`)",
                    FrozenPlan::VERSION
                ));
            }
            None => return Err(" not a frozen plan: no `version`".into()),
        }
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de)
            .map_err(|e| format!(" not a frozen plan: {}: {}", e.path(), e.inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(node: u32, op: &'static str) -> Decision {
        Decision {
            node: NodeId(node),
            name: Some(format!("n\"{node}")),
            op: op.into(),
            class: "elementwise".into(),
            flops: Some(7),
            chosen: None,
            rule: None,
            precision_from: None,
            fallback: None,
            rejected: Arc::new(Vec::new()),
            measured: None,
        }
    }

    /// The kept JSON text is exactly the list's, written once for every explanation that
    /// shares it, and forgotten when the decisions change.
    #[test]
    fn shared_decisions_write_the_json_of_their_list() {
        let list = vec![decision(0, "add"), decision(1, "relu")];
        let plain = serde_json::to_string(&list).unwrap();
        let shared = Decisions::from(list.clone());
        let copy = shared.clone();
        let compact = |d: &Decisions| writing_compact_json(|| serde_json::to_string(d).unwrap());
        assert_eq!(serde_json::to_string(&shared).unwrap(), plain);
        assert!(shared.0.json.get().is_none(), "kept only where a compact writer asks");
        assert_eq!(compact(&shared), plain);
        assert!(copy.0.json.get().is_some(), "a clone shares the text written for the first");
        assert_eq!(compact(&copy), plain);
        let back: Decisions = serde_json::from_str(&plain).unwrap();
        assert_eq!(back, shared);
        let mut fewer = copy.clone();
        fewer.retain(|d| d.op == "relu");
        assert_eq!(compact(&fewer), serde_json::to_string(&list[1..]).unwrap());
        let mut changed = copy.clone();
        changed.get_mut(0).unwrap().op = "mul".into();
        assert!(compact(&changed).contains("\"mul\""));
        assert_eq!(compact(&copy), plain, "the others keep theirs");
        // A pretty printer outside the journal writes them as any other value.
        let pretty = serde_json::to_string_pretty(&shared).unwrap();
        assert_eq!(pretty, serde_json::to_string_pretty(&list).unwrap());
    }
}
