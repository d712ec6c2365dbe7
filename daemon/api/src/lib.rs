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
    /// run | ask
    pub kind: String,
    /// The run's id, or the ask's (`ask-…`).
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

/// A question for the model xpud is configured with (`[assistant]`): it writes a MiniLang
/// program over the data files, which xpud checks and dry-runs on a sample of them,
/// feeding every problem back, up to `max_attempts`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AskRequest {
    /// The question, in plain language (1 to 4,000 characters).
    pub question: String,
    /// Data files the question is about, relative to one of the server's data roots (at
    /// most 16): their columns and first rows go into the prompt.
    #[serde(default)]
    pub data: Vec<String>,
    /// The policy the dry run and the run use (a name known to the server); default: the
    /// server's default policy.
    pub policy: Option<String>,
    /// Run the accepted program on the full data as a job of this caller.
    #[serde(default)]
    pub run: bool,
    /// With `run`, let a program that writes files (write_csv, write_parquet, write_npy,
    /// plot) run; without it such a program is answered but not run.
    #[serde(default)]
    pub allow_writes: bool,
    /// Fewer attempts than the server's `[assistant] max_attempts` (never more).
    pub max_attempts: Option<u32>,
    /// Labels of the run `run` starts (`ask` = the ask's id is added).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// One problem with an attempt's program.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FindingDto {
    /// parse | check | dry_run
    pub stage: String,
    pub code: String,
    pub message: String,
    pub line: Option<usize>,
    pub col: Option<usize>,
    pub help: Option<String>,
}

/// One reply of the model and what became of it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AskAttemptDto {
    pub n: u32,
    /// The message this reply answers: the question, or the previous attempt's diagnostics.
    pub asked: String,
    pub reply: String,
    pub program: String,
    /// Where it failed (parse | check | dry_run); absent when it passed.
    pub failed_at: Option<String>,
    pub findings: Vec<FindingDto>,
    /// What the dry run printed, when it ran.
    pub dry_run: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub latency_ms: u64,
    pub finish_reason: String,
    pub grammar_sent: bool,
}

/// The run an ask started.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AskRunDto {
    /// Absent when the program was not run (`refused` says why).
    pub run_id: Option<String>,
    /// queued | running | succeeded | failed | cancelled | timed_out
    pub status: Option<String>,
    pub error: Option<String>,
    pub outputs: Vec<OutputDto>,
    pub refused: Option<String>,
}

/// An ask: running, or ended with its outcome, every attempt and the program if one passed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AskDto {
    pub ask_id: String,
    /// running | accepted | out_of_attempts | out_of_tokens | out_of_time | endpoint_failed |
    /// failed (ended before the model answered: unreadable data, or it broke; see `error`)
    pub status: String,
    pub question: String,
    pub data: Vec<String>,
    pub policy: Option<String>,
    pub model: String,
    /// The endpoint, without credentials.
    pub endpoint: String,
    pub program: Option<String>,
    pub error: Option<String>,
    pub notes: Vec<String>,
    pub attempts: Vec<AskAttemptDto>,
    /// Accepted asks shown to the model as examples (their ids).
    pub examples: Vec<String>,
    pub tokens: u64,
    pub elapsed_ms: u64,
    pub grammar_used: bool,
    pub run: Option<AskRunDto>,
    /// An example for later prompts (`POST /v1/asks/{id}/accept`).
    pub accepted: bool,
    /// Microseconds since the Unix epoch.
    pub created_us: i64,
    pub finished_us: Option<i64>,
}

/// `POST /v1/asks/{id}/accept`: the ask is an example for later prompts.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AcceptedDto {
    pub ask_id: String,
    /// False when it was one already.
    pub newly: bool,
}

/// The loop's figures for one model on one day (UTC).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AskStatsDto {
    pub model: String,
    /// YYYY-MM-DD
    pub day: String,
    pub asks: u64,
    /// Shares of asks whose first reply parsed, checked, and passed the dry run.
    pub first_parse: Option<f64>,
    pub first_check: Option<f64>,
    pub first_run: Option<f64>,
    /// Share of asks that ended with a program (after feedback).
    pub answered: f64,
    pub attempts_per_answer: Option<f64>,
    pub tokens_per_answer: Option<f64>,
}

/// `GET /v1/asks/stats`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AskStatsQuery {
    /// Only asks created at or after this time (microseconds since the Unix epoch).
    pub since_us: Option<i64>,
}
