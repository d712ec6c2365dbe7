//! The record an ask leaves in a store (xpu-store's `AskRecord`), made from the loop's
//! answer — by xpud for every ask it runs, by `xpuctl ask --store DIR` for a local one.

use xpu_assistant::{Answer, DataFile, Outcome, Stage, Verdict};
use xpu_store::{AskAttemptRecord, AskRecord};

/// What is known of an ask before the model is asked.
#[derive(Clone, Debug)]
pub struct AskMeta {
    /// `ask-` and a ULID ([`new_ask_id`]).
    pub ask_id: String,
    pub tenant: Option<String>,
    pub question: String,
    /// The data files as the question named them.
    pub data: Vec<String>,
    pub policy: Option<String>,
    pub model: String,
    /// Without credentials.
    pub endpoint: String,
    /// Microseconds since the Unix epoch.
    pub created_us: i64,
}

pub fn new_ask_id() -> String {
    format!("{}{}", xpu_store::ASK_ID_PREFIX, ulid::Ulid::new().to_string().to_lowercase())
}

pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The record of an ask the loop ended: its answer (the whole conversation), the data as
/// the model saw it, the examples it was shown, the run it started or why none was.
pub fn answered(
    meta: &AskMeta,
    answer: &Answer,
    files: &[DataFile],
    examples: &[String],
    run_id: Option<String>,
    refused: Option<String>,
) -> AskRecord {
    AskRecord {
        ask_id: meta.ask_id.clone(),
        tenant: meta.tenant.clone(),
        question: meta.question.clone(),
        model: answer.model.clone(),
        endpoint: answer.endpoint.clone(),
        policy_name: meta.policy.clone(),
        data: meta.data.clone(),
        schema_text: crate::schema_text(files),
        prompt_digest: answer.prompt_digest.clone(),
        outcome: outcome_name(answer.outcome).into(),
        program: answer.program.clone(),
        error: answer.error.clone(),
        attempts: attempt_records(answer),
        elapsed_ms: answer.elapsed_ms,
        run_id,
        created_us: meta.created_us,
        finished_us: now_us(),
        answer: serde_json::json!({ "answer": answer, "examples": examples, "refused": refused }),
    }
}

/// An ask that ended before the model answered (unreadable data, a broken ask): `failed`,
/// with the reason.
pub fn failed(meta: &AskMeta, error: String) -> AskRecord {
    let now = now_us();
    AskRecord {
        ask_id: meta.ask_id.clone(),
        tenant: meta.tenant.clone(),
        question: meta.question.clone(),
        model: meta.model.clone(),
        endpoint: meta.endpoint.clone(),
        policy_name: meta.policy.clone(),
        data: meta.data.clone(),
        schema_text: String::new(),
        prompt_digest: String::new(),
        outcome: "failed".into(),
        program: None,
        error: Some(error),
        attempts: vec![],
        elapsed_ms: ((now - meta.created_us).max(0) / 1000) as u64,
        run_id: None,
        created_us: meta.created_us,
        finished_us: now,
        answer: serde_json::json!({}),
    }
}

pub fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Accepted => "accepted",
        Outcome::OutOfAttempts => "out_of_attempts",
        Outcome::OutOfTokens => "out_of_tokens",
        Outcome::OutOfTime => "out_of_time",
        Outcome::EndpointFailed => "endpoint_failed",
    }
}

pub fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Parse => "parse",
        Stage::Check => "check",
        Stage::DryRun => "dry_run",
    }
}

/// Where an attempt failed: the earliest stage among its findings (`None`: it passed).
pub fn failed_at(v: &Verdict) -> Option<&'static str> {
    let rank = |s: Stage| match s {
        Stage::Parse => 0,
        Stage::Check => 1,
        Stage::DryRun => 2,
    };
    v.findings.iter().map(|f| f.stage).min_by_key(|&s| rank(s)).map(stage_name)
}

fn attempt_records(a: &Answer) -> Vec<AskAttemptRecord> {
    a.attempts
        .iter()
        .map(|t| AskAttemptRecord {
            n: t.n,
            model: a.model.clone(),
            prompt_digest: a.prompt_digest.clone(),
            prompt_tokens: t.prompt_tokens,
            completion_tokens: t.completion_tokens,
            latency_ms: t.latency_ms,
            failed_at: failed_at(&t.verdict).map(str::to_string),
            codes: t.verdict.findings.iter().map(|f| f.code.clone()).collect(),
            finish_reason: t.finish_reason.clone(),
        })
        .collect()
}
