//! `[assistant]`: which endpoint and model, where the API key comes from, and the limits of
//! one ask, read from the file given to `xpuctl ask --config`; flags and `XPU_ASK_*`
//! variables override it. The key itself is never in the table (only the variable or file
//! that holds it), never logged and never stored.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::AskError;

/// Whether requests carry MiniLang's GBNF grammar (`grammar`, which llama.cpp's server
/// enforces while decoding).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrammarMode {
    /// Send it; when the endpoint refuses the field (400 naming `grammar`), ask again
    /// without it and leave the rest to the feedback loop.
    #[default]
    Auto,
    Always,
    Never,
}

impl std::str::FromStr for GrammarMode {
    type Err = String;

    fn from_str(s: &str) -> Result<GrammarMode, String> {
        match s {
            "auto" => Ok(GrammarMode::Auto),
            "always" => Ok(GrammarMode::Always),
            "never" => Ok(GrammarMode::Never),
            other => Err(format!("expected auto, always or never, found {other:?}")),
        }
    }
}

#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AssistantConfig {
    /// Base URL of an OpenAI-compatible API (`…/v1`): `POST {endpoint}/chat/completions`.
    pub endpoint: Option<String>,
    pub model: Option<String>,
    /// Name of the environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// A file holding the API key (first line).
    pub api_key_file: Option<PathBuf>,
    /// Seconds one request may take.
    pub timeout_s: f64,
    /// Replies asked for before giving up (the first answer included).
    pub max_attempts: u32,
    /// Tokens one reply may have (`max_tokens`).
    pub max_tokens: u32,
    /// Tokens (prompt and reply, as the endpoint counts them) one ask may spend.
    pub token_budget: u64,
    /// Seconds one ask may take, requests, retries and dry runs included.
    pub time_budget_s: f64,
    /// Sample rows of each data file shown to the model (0: only the schema).
    pub send_rows: usize,
    /// Retries of one request answered 429 or 5xx (waiting as Retry-After says).
    pub retries: u32,
    pub grammar: GrammarMode,
    pub temperature: f64,
    /// Sent as the request's `seed` (servers that take one sample reproducibly).
    pub seed: Option<u64>,
    /// Rows of each data file the dry run reads.
    pub dry_run_rows: usize,
    /// Seconds one dry run may take.
    pub dry_run_s: f64,
    /// Accepted asks most like the question shown to the model as examples (xpud, whose
    /// store keeps asks; a local `xpuctl ask` has none to show).
    pub examples: usize,
}

impl Default for AssistantConfig {
    fn default() -> Self {
        AssistantConfig {
            endpoint: None,
            model: None,
            api_key_env: None,
            api_key_file: None,
            timeout_s: 60.0,
            max_attempts: 3,
            max_tokens: 512,
            token_budget: 16_384,
            time_budget_s: 180.0,
            send_rows: 3,
            retries: 2,
            grammar: GrammarMode::Auto,
            temperature: 0.0,
            seed: None,
            dry_run_rows: 200,
            dry_run_s: 30.0,
            examples: 3,
        }
    }
}

impl std::fmt::Debug for AssistantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names where the key lives, never the key.
        f.debug_struct("AssistantConfig")
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("api_key_env", &self.api_key_env)
            .field("api_key_file", &self.api_key_file)
            .field("max_attempts", &self.max_attempts)
            .field("grammar", &self.grammar)
            .finish_non_exhaustive()
    }
}

/// How to configure an endpoint, for the error when none is.
pub const HOW_TO_CONFIGURE: &str = "no LLM endpoint is configured for `ask`. Give one:\n  \
     xpuctl ask \"QUESTION\" --endpoint http://127.0.0.1:8080/v1 --model NAME\n\
     or set XPU_ASK_ENDPOINT and XPU_ASK_MODEL (and XPU_ASK_API_KEY_ENV=VAR naming the \
     variable that holds the key, if the endpoint needs one), or write an [assistant] table \
     (endpoint, model, api_key_env …) in a file given to --config. Any \
     OpenAI-compatible chat-completions server works: llama.cpp's llama-server, vLLM, \
     Ollama, a hosted API (docs/ask.md)";

impl AssistantConfig {
    /// Reads `[assistant]` from a TOML file (other tables are left to their owners).
    pub fn from_toml_file(path: &std::path::Path) -> Result<AssistantConfig, AskError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AskError::Config(format!("{}: {e}", path.display())))?;
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            assistant: Option<toml::Value>,
        }
        let file: File = toml::from_str(&text)
            .map_err(|e| AskError::Config(format!("{}: {}", path.display(), e.message())))?;
        let Some(table) = file.assistant else {
            return Err(AskError::Config(format!("{}: no [assistant] table", path.display())));
        };
        let cfg: AssistantConfig = table.try_into().map_err(|e: toml::de::Error| {
            AskError::Config(format!("{}: [assistant]: {}", path.display(), e.message()))
        })?;
        cfg.validate().map_err(|e| AskError::Config(format!("{}: {e}", path.display())))?;
        Ok(cfg)
    }

    /// Ranges every field must be in; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |field: &str, want: &str| Err(format!("[assistant] {field}: {want}"));
        if let Some(e) = &self.endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return bad("endpoint", &format!("must be an http:// or https:// URL, found {e:?}"));
        }
        if !(self.timeout_s > 0.0 && self.timeout_s <= 3600.0) {
            return bad("timeout_s", "must be in (0, 3600]");
        }
        if !(1..=20).contains(&self.max_attempts) {
            return bad("max_attempts", "must be 1 to 20");
        }
        if !(16..=32_768).contains(&self.max_tokens) {
            return bad("max_tokens", "must be 16 to 32768");
        }
        if self.token_budget < u64::from(self.max_tokens) {
            return bad("token_budget", "must be at least max_tokens");
        }
        if !(self.time_budget_s > 0.0 && self.time_budget_s <= 86_400.0) {
            return bad("time_budget_s", "must be in (0, 86400]");
        }
        if self.send_rows > 100 {
            return bad("send_rows", "must be at most 100");
        }
        if self.retries > 10 {
            return bad("retries", "must be at most 10");
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return bad("temperature", "must be in [0, 2]");
        }
        if !(1..=1_000_000).contains(&self.dry_run_rows) {
            return bad("dry_run_rows", "must be 1 to 1000000");
        }
        if !(self.dry_run_s > 0.0 && self.dry_run_s <= 3600.0) {
            return bad("dry_run_s", "must be in (0, 3600]");
        }
        if self.examples > 10 {
            return bad("examples", "must be at most 10");
        }
        Ok(())
    }

    /// Overrides from `XPU_ASK_ENDPOINT`, `XPU_ASK_MODEL`, `XPU_ASK_API_KEY_ENV`.
    pub fn with_env(mut self) -> AssistantConfig {
        if let Ok(v) = std::env::var("XPU_ASK_ENDPOINT") {
            self.endpoint = Some(v);
        }
        if let Ok(v) = std::env::var("XPU_ASK_MODEL") {
            self.model = Some(v);
        }
        if let Ok(v) = std::env::var("XPU_ASK_API_KEY_ENV") {
            self.api_key_env = Some(v);
        }
        self
    }

    /// The endpoint and model, or how to configure them.
    pub fn target(&self) -> Result<(&str, &str), AskError> {
        match (&self.endpoint, &self.model) {
            (Some(e), Some(m)) => Ok((e.trim_end_matches('/'), m)),
            (Some(_), None) => Err(AskError::NotConfigured(format!(
                "an endpoint but no model: {HOW_TO_CONFIGURE}"
            ))),
            _ => Err(AskError::NotConfigured(HOW_TO_CONFIGURE.into())),
        }
    }

    /// The API key, read when the ask starts; `None` when no source is configured.
    /// Whether the key `api_key_env` / `api_key_file` names can be read (not the key).
    pub fn check_key(&self) -> Result<(), AskError> {
        self.api_key().map(drop)
    }

    pub(crate) fn api_key(&self) -> Result<Option<String>, AskError> {
        if let Some(var) = &self.api_key_env {
            return std::env::var(var).map(Some).map_err(|_| {
                AskError::Config(format!("[assistant] api_key_env: the variable {var} is not set"))
            });
        }
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                AskError::Config(format!("[assistant] api_key_file: {}: {e}", path.display()))
            })?;
            let key = text.lines().next().unwrap_or("").trim().to_string();
            if key.is_empty() {
                return Err(AskError::Config(format!(
                    "[assistant] api_key_file: {} is empty",
                    path.display()
                )));
            }
            return Ok(Some(key));
        }
        Ok(None)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s)
    }

    pub fn time_budget(&self) -> Duration {
        Duration::from_secs_f64(self.time_budget_s)
    }
}
