//! How an answer reads on a terminal: a line per attempt, the program, the outcome.

use xpu_assistant::{Answer, Outcome, Stage};

/// One line per attempt: what became of it and what it cost.
pub(super) fn attempt_lines(answer: &Answer) -> Vec<String> {
    answer
        .attempts
        .iter()
        .map(|a| {
            let what = match a.verdict.findings.first() {
                None => "passed (parse, check, dry run)".to_string(),
                Some(f) => format!(
                    "{} failed: {} {}{}",
                    stage_name(f.stage),
                    f.code,
                    f.message.lines().next().unwrap_or(""),
                    f.line.map(|l| format!(" (line {l})")).unwrap_or_default()
                ),
            };
            format!(
                "attempt {}: {what} — {} tokens, {:.1} s{}",
                a.n,
                a.prompt_tokens + a.completion_tokens,
                a.latency_ms as f64 / 1e3,
                if a.grammar_sent { ", grammar" } else { "" }
            )
        })
        .collect()
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
