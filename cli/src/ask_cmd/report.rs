//! How an answer reads on a terminal: a line per attempt, the program, the outcome.

use xpu_assistant::{Answer, Outcome, Stage};

/// An attempt as a line shows it, from a local answer or from xpud's.
pub(super) struct AttemptView {
    pub n: u64,
    /// Stage, code, message and line of the first finding.
    pub failed: Option<(String, String, String, Option<u64>)>,
    pub tokens: u64,
    pub latency_ms: u64,
    pub grammar: bool,
}

/// What became of an attempt and what it cost.
pub(super) fn attempt_line(a: &AttemptView) -> String {
    let what = match &a.failed {
        None => "passed (parse, check, dry run)".to_string(),
        Some((stage, code, message, line)) => format!(
            "{stage} failed: {code} {}{}",
            message.lines().next().unwrap_or(""),
            line.map(|l| format!(" (line {l})")).unwrap_or_default()
        ),
    };
    format!(
        "attempt {}: {what} — {} tokens, {:.1} s{}",
        a.n,
        a.tokens,
        a.latency_ms as f64 / 1e3,
        if a.grammar { ", grammar" } else { "" }
    )
}

/// One line per attempt of a local answer.
pub(super) fn attempt_lines(answer: &Answer) -> Vec<String> {
    let view = |a: &xpu_assistant::Attempt| AttemptView {
        n: u64::from(a.n),
        failed: a.verdict.findings.first().map(|f| {
            (
                stage_name(f.stage).to_string(),
                f.code.clone(),
                f.message.clone(),
                f.line.map(|l| l as u64),
            )
        }),
        tokens: a.prompt_tokens + a.completion_tokens,
        latency_ms: a.latency_ms,
        grammar: a.grammar_sent,
    };
    answer.attempts.iter().map(|a| attempt_line(&view(a))).collect()
}

pub(super) fn print_answer(answer: &Answer, run: Option<&serde_json::Value>) {
    for line in attempt_lines(answer) {
        println!("{line}");
    }
    for note in &answer.notes {
        println!("note: {note}");
    }
    match &answer.program {
        Some(p) => println!("\n{}", p.trim_end()),
        None => println!("\nno program: {}", answer.error.as_deref().unwrap_or("")),
    }
    println!(
        "\n{}: {} attempt(s), {} tokens, {:.1} s, model {} (prompt {})",
        outcome_name(answer.outcome),
        answer.attempts.len(),
        answer.tokens,
        answer.elapsed_ms as f64 / 1e3,
        answer.model,
        answer.prompt_digest
    );
    if let Some(r) = run {
        println!("\nrun:");
        if let Some(why) = r["refused"].as_str() {
            println!("not run: {why}");
        }
        if let Some(s) = r["stdout"].as_str() {
            print!("{s}");
        }
        if let Some(s) = r["stderr"].as_str().filter(|s| !s.is_empty()) {
            eprint!("{s}");
        }
    }
}

fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Parse => "parse",
        Stage::Check => "check",
        Stage::DryRun => "dry run",
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Accepted => "accepted",
        Outcome::OutOfAttempts => "out of attempts",
        Outcome::OutOfTokens => "out of tokens",
        Outcome::OutOfTime => "out of time",
        Outcome::EndpointFailed => "endpoint failed",
    }
}
