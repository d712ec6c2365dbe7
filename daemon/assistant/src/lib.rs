//! `xpuctl ask`: a question in plain language becomes a MiniLang program through any
//! OpenAI-compatible chat-completions endpoint (llama.cpp's server, vLLM, Ollama, a hosted
//! API). The prompt's language reference is rendered from MiniLang's builtin table, the
//! replies are constrained by MiniLang's GBNF grammar where the endpoint takes it, and each
//! program is parsed, checked, lowered and dry-run on a sample of the data; whatever fails
//! goes back to the model as the next message, within the configured attempts, tokens and
//! time ([`session::ask`]). Lowering, dry-running and running the programs are the
//! caller's (xpuctl's `ask` and REPL `:ask`, through a [`Judge`]).

pub mod client;
pub mod config;
pub mod prompt;
pub mod session;
#[cfg(feature = "stand-in")]
pub mod stand_in;

pub use config::{AssistantConfig, GrammarMode, HOW_TO_CONFIGURE};
pub use prompt::{DataFile, Example};
pub use session::{Answer, Attempt, Finding, Judge, Outcome, Request, Stage, Verdict, ask};

/// Why an ask could not start or a request failed.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// No endpoint or model: the message says how to configure one.
    #[error("{0}")]
    NotConfigured(String),
    #[error("assistant configuration: {0}")]
    Config(String),
    /// The endpoint could not be reached, failed, or answered something unusable.
    #[error("LLM endpoint: {0}")]
    Endpoint(String),
    /// The endpoint refused the `grammar` field.
    #[error("the endpoint refused the grammar: {0}")]
    GrammarRefused(String),
    /// The ask's time budget ran out before or during a request.
    #[error("the ask's time budget ran out")]
    OutOfTime,
}
