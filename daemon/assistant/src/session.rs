//! The loop: ask, take the program out of the reply, parse and check it (here), lower and
//! dry-run it (the caller's [`Judge`]), and when anything fails send the diagnostics back
//! as the next message — until a program passes or a limit (attempts, tokens, time) ends
//! the ask. Every attempt is kept, with what it cost and why it failed.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::AskError;
use crate::client::{ChatClient, Message, Reply};
use crate::config::{AssistantConfig, GrammarMode};
use crate::prompt::{DataFile, Example, digest, system_prompt};

/// Where a program failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The reply: empty, cut off, not MiniLang's syntax.
    Parse,
    /// Names, types, shapes, columns, paths (checker and lowering).
    Check,
    /// The dry run on a sample of the data.
    DryRun,
}

/// One problem, structured: what the model is told, and what `explain` shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub stage: Stage,
    pub code: String,
    pub message: String,
    pub line: Option<usize>,
    pub col: Option<usize>,
    pub help: Option<String>,
}

/// What the judge found; `feedback` is the text the model gets when it is not clean.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub findings: Vec<Finding>,
    pub feedback: String,
    /// What the dry run printed, when it ran.
    pub dry_run: Option<String>,
}

impl Verdict {
    pub fn ok(&self) -> bool {
        self.findings.is_empty()
    }

    /// The first stage that failed.
    pub fn failed_at(&self) -> Option<Stage> {
        self.findings.first().map(|f| f.stage)
    }
}

/// Lowers and dry-runs a program that parsed and checked clean: the caller owns the data,
/// the policy and the engines. It must return before `deadline`.
pub trait Judge {
    fn judge(&self, program: &str, deadline: Instant) -> Verdict;
}

/// One reply and what became of it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attempt {
    pub n: u32,
    /// The user message this reply answers (the question, or the previous diagnostics).
    pub asked: String,
    pub reply: String,
    pub program: String,
    pub verdict: Verdict,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub latency_ms: u64,
    pub finish_reason: String,
    pub grammar_sent: bool,
    pub requests: u32,
}

/// How an ask ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    OutOfAttempts,
    OutOfTokens,
    OutOfTime,
    EndpointFailed,
}

/// An ask: the question, every attempt, and the accepted program if any.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Answer {
    pub question: String,
    pub endpoint: String,
    pub model: String,
    pub prompt_digest: String,
    pub outcome: Outcome,
    pub program: Option<String>,
    /// Why the ask ended without a program (endpoint errors, limits).
    pub error: Option<String>,
    pub attempts: Vec<Attempt>,
    pub tokens: u64,
    pub elapsed_ms: u64,
    /// Whether MiniLang's grammar constrained the replies (false when not sent or refused).
    pub grammar_used: bool,
}

/// What one ask is about.
pub struct Request<'a> {
    pub question: &'a str,
    pub data: &'a [DataFile],
    pub examples: &'a [Example],
}

/// Runs the loop to its end; endpoint errors end it with `EndpointFailed` (the attempts
/// before are kept), only a configuration error is an `Err`.
pub fn ask(cfg: &AssistantConfig, req: &Request, judge: &dyn Judge) -> Result<Answer, AskError> {
    let client = ChatClient::new(cfg)?;
    let system = system_prompt(req.data, req.examples);
    let start = Instant::now();
    let deadline = start + cfg.time_budget();
    let mut answer = Answer {
        question: req.question.to_string(),
        endpoint: client.url().to_string(),
        model: client.model().to_string(),
        prompt_digest: digest(&system),
        outcome: Outcome::OutOfAttempts,
        program: None,
        error: None,
        attempts: Vec::new(),
        tokens: 0,
        elapsed_ms: 0,
        grammar_used: cfg.grammar != GrammarMode::Never,
    };
    let gbnf = xpu_minilang::grammar::write(xpu_minilang::grammar::Dialect::Gbnf);
    let mut messages = vec![Message::system(system), Message::user(req.question)];
    for n in 1..=cfg.max_attempts {
        if let Some(stop) = out_of_budget(cfg, &answer, deadline) {
            answer.outcome = stop;
            break;
        }
        let grammar = answer.grammar_used.then_some(gbnf.as_str());
        let reply = match client.complete(&messages, grammar, deadline) {
            Err(AskError::GrammarRefused(why)) if cfg.grammar == GrammarMode::Auto => {
                // The endpoint does not take `grammar`: ask the same again without it.
                answer.grammar_used = false;
                answer.error =
                    Some(format!("the endpoint refused the grammar ({why}); asked without it"));
                client.complete(&messages, None, deadline)
            }
            other => other,
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                answer.outcome = Outcome::EndpointFailed;
                answer.error = Some(e.to_string());
                break;
            }
        };
        let attempt = judge_reply(
            n,
            messages.last().expect("a user message").content.clone(),
            reply,
            cfg,
            judge,
            deadline,
        );
        answer.tokens += attempt.prompt_tokens + attempt.completion_tokens;
        let accepted = attempt.verdict.ok();
        messages.push(Message::assistant(attempt.reply.clone()));
        messages.push(Message::user(feedback_message(&attempt.verdict)));
        if accepted {
            answer.program = Some(attempt.program.clone());
            answer.outcome = Outcome::Accepted;
        }
        answer.attempts.push(attempt);
        if accepted {
            break;
        }
        if Instant::now() >= deadline {
            answer.outcome = Outcome::OutOfTime;
            break;
        }
    }
    if answer.outcome == Outcome::OutOfAttempts && answer.program.is_none() {
        answer
            .error
            .get_or_insert_with(|| format!("no program passed in {} attempt(s)", cfg.max_attempts));
    }
    answer.elapsed_ms = start.elapsed().as_millis() as u64;
    Ok(answer)
}

/// Whether another request would break a limit.
fn out_of_budget(cfg: &AssistantConfig, answer: &Answer, deadline: Instant) -> Option<Outcome> {
    if answer.tokens + u64::from(cfg.max_tokens) > cfg.token_budget && !answer.attempts.is_empty() {
        return Some(Outcome::OutOfTokens);
    }
    (Instant::now() >= deadline).then_some(Outcome::OutOfTime)
}

fn judge_reply(
    n: u32,
    asked: String,
    reply: Reply,
    cfg: &AssistantConfig,
    judge: &dyn Judge,
    deadline: Instant,
) -> Attempt {
    let program = extract_program(&reply.text);
    let mut verdict = static_verdict(&program);
    if reply.finish_reason == "length" {
        verdict.findings.insert(
            0,
            Finding {
                stage: Stage::Parse,
                code: "cut_off".into(),
                message: format!("the reply was cut off at max_tokens ({})", cfg.max_tokens),
                line: None,
                col: None,
                help: Some("write a shorter program".into()),
            },
        );
        verdict.feedback = format!(
            "Your reply was cut off at {} tokens: write a shorter program.\n{}",
            cfg.max_tokens, verdict.feedback
        );
    }
    if verdict.ok() {
        verdict = judge.judge(&program, deadline);
    }
    Attempt {
        n,
        asked,
        reply: reply.text,
        program,
        verdict,
        prompt_tokens: reply.prompt_tokens,
        completion_tokens: reply.completion_tokens,
        latency_ms: reply.latency.as_millis() as u64,
        finish_reason: reply.finish_reason,
        grammar_sent: reply.grammar_sent,
        requests: reply.requests,
    }
}

/// Parses and checks; every diagnostic as a finding, rendered for the model.
pub fn static_verdict(program: &str) -> Verdict {
    if program.trim().is_empty() {
        return Verdict {
            findings: vec![Finding {
                stage: Stage::Parse,
                code: "empty".into(),
                message: "the reply holds no program".into(),
                line: None,
                col: None,
                help: None,
            }],
            feedback: "Your reply held no program. Answer with a MiniLang program only.".into(),
            dry_run: None,
        };
    }
    let (_, diags) = xpu_minilang::analyze(program);
    let errors: Vec<_> = diags.iter().filter(|d| d.is_error()).collect();
    if errors.is_empty() {
        return Verdict::default();
    }
    let findings = errors.iter().map(|d| finding(program, d)).collect();
    Verdict {
        findings,
        feedback: xpu_minilang::render("answer.ml", program, &diags),
        dry_run: None,
    }
}

/// A MiniLang diagnostic as a finding (syntax codes are below E0100).
pub fn finding(program: &str, d: &xpu_minilang::Diagnostic) -> Finding {
    let (line, col) = d.line_col(program);
    Finding {
        stage: if d.code < "E0100" { Stage::Parse } else { Stage::Check },
        code: d.code.to_string(),
        message: d.message.clone(),
        line: Some(line),
        col: Some(col),
        help: d.help.clone(),
    }
}

/// The message after a failed attempt.
fn feedback_message(v: &Verdict) -> String {
    if v.ok() {
        return "The program ran.".into();
    }
    format!(
        "That program does not work yet:\n{}\nWrite the whole corrected program, and nothing else.",
        v.feedback.trim_end()
    )
}

/// The program in a reply: the first fenced block when there is one (endpoints that do not
/// take the grammar often add prose), else the whole reply.
pub fn extract_program(reply: &str) -> String {
    if let Some(start) = reply.find("```") {
        let after = &reply[start + 3..];
        // Skip the fence's language tag line.
        let body = after.split_once('\n').map_or("", |(_, rest)| rest);
        let end = body.find("```").unwrap_or(body.len());
        return body[..end].trim_end().to_string() + "\n";
    }
    let trimmed = reply.trim();
    if trimmed.is_empty() { String::new() } else { format!("{trimmed}\n") }
}

/// Milliseconds in a duration, for records.
pub fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}
