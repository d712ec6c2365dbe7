//! The loop: ask, take the program out of the reply, parse and check it (here), lower and
//! dry-run it (the caller's [`Judge`]), and when anything fails send the diagnostics back
//! as the next message — until a program passes or a limit (attempts, tokens, time) ends
//! the ask. Every attempt is kept, with what it cost and why it failed.

use std::time::Instant;

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

impl Finding {
    pub fn new(stage: Stage, code: &str, message: impl Into<String>) -> Finding {
        Finding {
            stage,
            code: code.into(),
            message: message.into(),
            line: None,
            col: None,
            help: None,
        }
    }
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
    /// The endpoint, without credentials a URL may carry (user info, query).
    pub endpoint: String,
    pub model: String,
    pub prompt_digest: String,
    pub outcome: Outcome,
    pub program: Option<String>,
    /// Why the ask ended without a program: the endpoint's failure or the limit reached.
    pub error: Option<String>,
    /// What happened on the way that is not an error (an endpoint refused the grammar).
    pub notes: Vec<String>,
    pub attempts: Vec<Attempt>,
    pub tokens: u64,
    pub elapsed_ms: u64,
    /// Whether MiniLang's grammar was sent with the last request (false when off or
    /// refused; an endpoint that ignores the field silently cannot be told apart).
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
        endpoint: client.shown_url().to_string(),
        model: client.model().to_string(),
        prompt_digest: digest(&system),
        outcome: Outcome::OutOfAttempts,
        program: None,
        error: None,
        notes: Vec::new(),
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
        let reply = match request(&client, cfg, &mut answer, &messages, &gbnf, deadline) {
            Ok(r) => r,
            Err(AskError::OutOfTime) => {
                answer.outcome = Outcome::OutOfTime;
                break;
            }
            Err(e) => {
                answer.outcome = Outcome::EndpointFailed;
                answer.error = Some(e.to_string());
                break;
            }
        };
        let asked = messages.last().expect("a user message").content.clone();
        let attempt = judge_reply(n, asked, reply, cfg, judge, deadline);
        answer.tokens += attempt.prompt_tokens + attempt.completion_tokens;
        let accepted = attempt.verdict.ok();
        messages.push(Message::assistant(attempt.reply.clone()));
        messages.push(Message::user(feedback_message(&attempt.verdict)));
        if accepted {
            answer.program = Some(attempt.program.clone());
            answer.outcome = Outcome::Accepted;
        }
        let no_time = attempt.verdict.findings.iter().any(|f| f.code == "out_of_time");
        answer.attempts.push(attempt);
        if accepted {
            break;
        }
        if no_time || Instant::now() >= deadline {
            answer.outcome = Outcome::OutOfTime;
            break;
        }
    }
    answer.error = answer.error.take().or_else(|| limit_reached(cfg, &answer));
    answer.elapsed_ms = start.elapsed().as_millis() as u64;
    Ok(answer)
}

/// The limit an ask without a program ended at, in words.
fn limit_reached(cfg: &AssistantConfig, answer: &Answer) -> Option<String> {
    match answer.outcome {
        Outcome::Accepted | Outcome::EndpointFailed => None,
        Outcome::OutOfAttempts => {
            Some(format!("no program passed in {} attempt(s)", cfg.max_attempts))
        }
        Outcome::OutOfTokens => Some(format!(
            "another attempt would pass token_budget ({} of {} tokens spent)",
            answer.tokens, cfg.token_budget
        )),
        Outcome::OutOfTime => Some(format!("time_budget_s ({} s) ran out", cfg.time_budget_s)),
    }
}

/// One reply, with the grammar while the endpoint takes it: under `auto`, a refusal is
/// noted and the same is asked again without it.
fn request(
    client: &ChatClient,
    cfg: &AssistantConfig,
    answer: &mut Answer,
    messages: &[Message],
    gbnf: &str,
    deadline: Instant,
) -> Result<Reply, AskError> {
    let grammar = answer.grammar_used.then_some(gbnf);
    match client.complete(messages, grammar, deadline) {
        Err(AskError::GrammarRefused(why)) if cfg.grammar == GrammarMode::Auto => {
            answer.grammar_used = false;
            answer
                .notes
                .push(format!("the endpoint refused the grammar ({why}); asked without it"));
            let mut reply = client.complete(messages, None, deadline)?;
            reply.requests += 1;
            Ok(reply)
        }
        other => other,
    }
}

/// Whether another request would break a limit. Each request sends the whole
/// conversation again, so the next one costs about the last prompt, the last reply, the
/// feedback (a token per 3 bytes) and a whole reply.
fn out_of_budget(cfg: &AssistantConfig, answer: &Answer, deadline: Instant) -> Option<Outcome> {
    if let Some(last) = answer.attempts.last() {
        let feedback = (last.verdict.feedback.len() / 3) as u64;
        let next =
            last.prompt_tokens + last.completion_tokens + feedback + u64::from(cfg.max_tokens);
        if answer.tokens + next > cfg.token_budget {
            return Some(Outcome::OutOfTokens);
        }
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
    let program = extract_program(&reply.text, reply.grammar_sent);
    let mut verdict = static_verdict(&program);
    if reply.finish_reason == "length" {
        let message = format!("the reply was cut off at max_tokens ({})", cfg.max_tokens);
        verdict.findings.insert(0, Finding::new(Stage::Parse, "cut_off", message));
        verdict.feedback = format!(
            "Your reply was cut off at {} tokens: write a shorter program.\n{}",
            cfg.max_tokens, verdict.feedback
        );
    }
    if verdict.ok() && Instant::now() >= deadline {
        // The program is not to blame: no time is left to judge it.
        let message = "the ask's time ran out before the dry run";
        verdict.findings.push(Finding::new(Stage::DryRun, "out_of_time", message));
    } else if verdict.ok() {
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
            findings: vec![Finding::new(Stage::Parse, "empty", "the reply holds no program")],
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

/// The stage a MiniLang diagnostic code belongs to: syntax codes are below E0100.
pub fn stage_of(code: &str) -> Stage {
    if code < "E0100" { Stage::Parse } else { Stage::Check }
}

/// A MiniLang diagnostic as a finding.
pub fn finding(program: &str, d: &xpu_minilang::Diagnostic) -> Finding {
    let (line, col) = d.line_col(program);
    Finding {
        stage: stage_of(d.code),
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

/// The program in a reply. Under the grammar the reply is the program. Otherwise the
/// first fenced block when there is one (endpoints without the grammar often add prose
/// around it; fences open and close at the start of a line), else the whole reply.
pub fn extract_program(reply: &str, grammar_sent: bool) -> String {
    if !grammar_sent && let Some(body) = fenced(reply) {
        return body.trim_end().to_string() + "\n";
    }
    let trimmed = reply.trim();
    if trimmed.is_empty() { String::new() } else { format!("{trimmed}\n") }
}

/// The body of the first ``` block whose fences start lines.
fn fenced(text: &str) -> Option<&str> {
    let at_line_start = |t: &str, i: usize| i == 0 || t[..i].ends_with('\n');
    let open = text.match_indices("```").find(|(i, _)| at_line_start(text, *i))?.0;
    // Past the fence's language tag line.
    let start = open + 3 + text[open + 3..].find('\n')? + 1;
    let body = &text[start..];
    let close = body
        .match_indices("```")
        .find(|(i, _)| at_line_start(body, *i))
        .map_or(body.len(), |m| m.0);
    Some(&body[..close])
}

#[cfg(test)]
mod tests {
    use super::extract_program;

    #[test]
    fn programs_come_out_of_replies() {
        let prose = "Sure:\n```minilang\nprint 1\n```\nDone.";
        assert_eq!(extract_program(prose, false), "print 1\n");
        // Under the grammar the reply is the program, fences or not.
        let s = "print \"a ``` b\"";
        assert_eq!(extract_program(s, true), "print \"a ``` b\"\n");
        // A fence inside a line is not a fence.
        assert_eq!(extract_program(s, false), "print \"a ``` b\"\n");
        assert_eq!(extract_program("  \n ", false), "");
        assert_eq!(extract_program("```\nprint 2", false), "print 2\n");
    }
}
