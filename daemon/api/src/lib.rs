//! xpud's REST API v1 bodies: the request and response types, with their OpenAPI schemas.
//! They are written out by hand (not the store's or the planner's types re-exported), so the
//! OpenAPI document only changes when the API does; they live in their own crate so that the
//! fuzz targets (and clients) decode request bodies exactly as the daemon does, without it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// A job: a program, its inputs, the policy to plan it under, labels.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitJob {
    pub program: ProgramSpec,
    /// Input tensors by the program's input names.
    #[serde(default)]
    pub inputs: BTreeMap<String, InputSpec>,
    /// A policy by name (`[policy] name` of a file in the policy directories). Without it
    /// (and without `policy_toml`), the policy whose `match.labels` fit the job's labels,
    /// else `default`.
    pub policy: Option<String>,
    /// An inline policy (TOML), validated like a file; `extends` resolves in the policy
    /// directories.
    pub policy_toml: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Answer when the run is complete (stored and explainable), up to the server's wait
    /// limit; otherwise answer at once with the queued run.
    #[serde(default)]
    pub wait: bool,
}

/// The program: its text, its bytes, or a file under one of the server's model roots.
/// `name` (or the path) gives the language by extension: `.ml`, `.sgr`, `.json`, `.onnx`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    pub name: Option<String>,
    pub source: Option<String>,
    /// The program's bytes, base64 (an uploaded ONNX model).
    pub source_base64: Option<String>,
    /// A file under a model root, relative to it.
    pub path: Option<String>,
}

/// One input: a `.npy` file (base64), a table as a CSV file (base64), or dtype + shape +
/// row-major numbers. Exactly one form.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    pub npy_base64: Option<String>,
    /// A table: CSV with a header row (pandas' `to_csv` form); columns are typed from their
    /// cells (integers, numbers, `True`/`False`, text).
    pub csv_base64: Option<String>,
    pub dtype: Option<String>,
    pub shape: Option<Vec<usize>>,
    pub data: Option<Vec<f64>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputDto {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub sha256: String,
    pub bytes: u64,
    /// Where to fetch it (`?format=npy|json|csv`).
    pub url: String,
}

/// A run: queued, running, or finished and stored.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunDto {
    pub run_id: String,
    /// queued | running | succeeded | failed | cancelled | timed_out
    pub status: String,
    /// Commit sequence number (0 until stored); the list cursor.
    pub seq: u64,
    pub program: String,
    pub program_kind: String,
    pub policy: String,
    pub policy_version: u32,
    pub labels: BTreeMap<String, String>,
    pub tenant: Option<String>,
    /// Microseconds since the Unix epoch.
    pub submitted_us: i64,
    pub finished_us: Option<i64>,
    pub queue_us: Option<u64>,
    pub run_us: Option<u64>,
    pub nodes: Option<u64>,
    pub fallbacks: Option<u64>,
    pub error: Option<String>,
    pub outputs: Vec<OutputDto>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<RunDto>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// succeeded | failed | cancelled | timed_out
    pub status: Option<String>,
    pub policy: Option<String>,
    /// `key=value`; repeat with commas: `team=vision,tier=batch`.
    pub label: Option<String>,
    pub cursor: Option<String>,
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExplainQuery {
    /// `json` (default) or `text`.
    pub format: Option<String>,
    /// Only this node (its id, `n3`, or its name).
    pub node: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// `npy` (tensors, default), `csv` (tables, default) or `json`.
    pub format: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// Words, "phrases", `field:value` (policy, status, label, engine, op, code, program).
    pub q: String,
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EvidenceQuery {
    /// Node signatures (16 hex digits each), comma-separated; none: every signature.
    pub signatures: Option<String>,
}

/// The evidence this daemon's store holds for its machine.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EvidenceDto {
    /// The machine's fingerprint (CPU model, features, engine versions).
    pub machine: String,
    pub rows: Vec<EvidenceRowDto>,
}

/// One candidate's figures on one node signature.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EvidenceRowDto {
    pub signature: String,
    pub engine: String,
    pub kernel: String,
    pub samples: u64,
    pub median_us: f64,
    pub p90_us: f64,
    /// Microseconds since the Unix epoch.
    pub last_seen_us: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SearchHitDto {
    pub run_id: String,
    pub score: f32,
    pub snippet: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlRequest {
    pub query: String,
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SqlResponse {
    pub columns: Vec<String>,
    #[schema(value_type = Vec<Vec<Object>>)]
    pub rows: Vec<Vec<serde_json::Value>>,
    pub truncated: bool,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// Compare the replay's outputs with the original's (SHA-256 of their files).
    #[serde(default)]
    pub verify: bool,
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OutputCheck {
    pub name: String,
    pub original: Option<String>,
    pub replay: Option<String>,
    pub same: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReplayResponse {
    pub run: RunDto,
    pub replay_of: String,
    /// Whether the policy changed since the original ran (same name, other content).
    pub policy_changed: bool,
    /// With `verify` and a finished replay: whether every output is byte-identical.
    pub verified: Option<bool>,
    pub outputs: Vec<OutputCheck>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PlanResponse {
    pub policy: String,
    pub graph_hash: String,
    pub text: String,
    #[schema(value_type = Object)]
    pub explanation: serde_json::Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyDto {
    pub name: String,
    pub version: u32,
    pub description: String,
    pub file: Option<String>,
    pub sha256: String,
    pub match_labels: BTreeMap<String, String>,
    pub priority: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyDetail {
    #[serde(flatten)]
    pub summary: PolicyDto,
    /// The effective policy (defaults and parents merged).
    #[schema(value_type = Object)]
    pub effective: serde_json::Value,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateRequest {
    pub toml: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ValidateResponse {
    pub ok: bool,
    pub name: Option<String>,
    pub diagnostics: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}
