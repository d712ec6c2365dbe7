//! One chat-completions request to an OpenAI-compatible endpoint, with the protocol's edge
//! cases turned into typed outcomes: 429 and 5xx retried as Retry-After says (within the
//! ask's time), a refused `grammar` field detected, a reply cut off at `max_tokens`
//! marked, a body that is not UTF-8 or not the expected JSON named as such.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::AskError;
use crate::config::AssistantConfig;

/// One message of the conversation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Message {
        Message { role: "system".into(), content: content.into() }
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message { role: "user".into(), content: content.into() }
    }

    pub fn assistant(content: impl Into<String>) -> Message {
        Message { role: "assistant".into(), content: content.into() }
    }
}

/// What the endpoint answered.
#[derive(Clone, Debug)]
pub struct Reply {
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `length` when the reply was cut off at `max_tokens`.
    pub finish_reason: String,
    pub latency: Duration,
    /// Whether the request carried the grammar and the endpoint took it.
    pub grammar_sent: bool,
    /// Requests made for this reply (retries after 429/5xx included).
    pub requests: u32,
}

/// A chat-completions client for one endpoint and model.
pub struct ChatClient {
    agent: ureq::Agent,
    url: String,
    /// `url` without user info and query, for records and messages.
    shown: String,
    timeout: Duration,
    model: String,
    key: Option<String>,
    max_tokens: u32,
    temperature: f64,
    seed: Option<u64>,
    retries: u32,
}

impl ChatClient {
    pub fn new(cfg: &AssistantConfig) -> Result<ChatClient, AskError> {
        let (endpoint, model) = cfg.target()?;
        let agent: ureq::Agent =
            ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let url = format!("{endpoint}/chat/completions");
        Ok(ChatClient {
            agent,
            shown: redact(&url),
            url,
            timeout: cfg.timeout(),
            model: model.to_string(),
            key: cfg.api_key()?,
            max_tokens: cfg.max_tokens,
            temperature: cfg.temperature,
            seed: cfg.seed,
            retries: cfg.retries,
        })
    }

    /// The endpoint's URL without the credentials it may carry.
    pub fn shown_url(&self) -> &str {
        &self.shown
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Asks for the next message; `grammar` is sent as llama.cpp's `grammar` field. Each
    /// request may take `timeout_s`, and no request or wait goes past `deadline`.
    pub fn complete(
        &self,
        messages: &[Message],
        grammar: Option<&str>,
        deadline: Instant,
    ) -> Result<Reply, AskError> {
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": false,
        });
        if let Some(g) = grammar {
            body["grammar"] = json!(g);
        }
        if let Some(seed) = self.seed {
            body["seed"] = json!(seed);
        }
        let payload = serde_json::to_vec(&body).expect("a JSON value serialises");
        let start = Instant::now();
        let mut requests = 0;
        loop {
            requests += 1;
            let (status, retry_after, bytes) = self.post(&payload, deadline)?;
            if status == 429 || status >= 500 {
                let wait = retry_after.unwrap_or(Duration::from_millis(500 * u64::from(requests)));
                if requests > self.retries || Instant::now() + wait > deadline {
                    return Err(AskError::Endpoint(format!(
                        "{}: {status} {} after {requests} request(s)",
                        self.shown,
                        excerpt(&bytes)
                    )));
                }
                std::thread::sleep(wait);
                continue;
            }
            if status >= 400 {
                let text = excerpt(&bytes);
                // 400 from OpenAI-style servers, 422 from FastAPI-style ones.
                let refused = matches!(status, 400 | 422) && grammar.is_some();
                if refused && names_grammar(&bytes) {
                    return Err(AskError::GrammarRefused(format!("{status} {text}")));
                }
                return Err(AskError::Endpoint(format!("{}: {status} {text}", self.shown)));
            }
            let mut reply = self.parse(&bytes)?;
            reply.latency = start.elapsed();
            reply.grammar_sent = grammar.is_some();
            reply.requests = requests;
            return Ok(reply);
        }
    }

    fn post(
        &self,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(u16, Option<Duration>, Vec<u8>), AskError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AskError::OutOfTime);
        }
        // The ask's deadline cuts a request short when it comes before the request's own
        // timeout: then running out is the ask's, not the endpoint's.
        let by_deadline = left < self.timeout;
        let mut req = self
            .agent
            .post(&self.url)
            .config()
            .timeout_global(Some(self.timeout.min(left)))
            .build()
            .header("Content-Type", "application/json");
        if let Some(k) = &self.key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let mut resp = req.send(payload).map_err(|e| match e {
            ureq::Error::Timeout(_) if by_deadline => AskError::OutOfTime,
            ureq::Error::Timeout(_) => AskError::Endpoint(format!(
                "{}: timed out after {:.1} s (timeout_s)",
                self.shown,
                self.timeout.as_secs_f64()
            )),
            other => AskError::Endpoint(format!("{}: {}", self.shown, redact(&other.to_string()))),
        })?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(600.0)));
        let bytes =
            resp.body_mut().with_config().limit(16 << 20).read_to_vec().map_err(|e| match e {
                ureq::Error::Timeout(_) if by_deadline => AskError::OutOfTime,
                e => AskError::Endpoint(format!("{}: reading the reply: {e}", self.shown)),
            })?;
        Ok((status, retry_after, bytes))
    }

    fn parse(&self, bytes: &[u8]) -> Result<Reply, AskError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            AskError::Endpoint(format!(
                "{}: the reply is not UTF-8 (invalid byte at {})",
                self.shown,
                e.valid_up_to()
            ))
        })?;
        let v: Value = serde_json::from_str(text).map_err(|e| {
            AskError::Endpoint(format!(
                "{}: the reply is not JSON ({e}): {}",
                self.shown,
                excerpt(bytes)
            ))
        })?;
        let choice = &v["choices"][0];
        let Some(content) = choice["message"]["content"].as_str() else {
            return Err(AskError::Endpoint(format!(
                "{}: the reply has no choices[0].message.content: {}",
                self.shown,
                excerpt(bytes)
            )));
        };
        Ok(Reply {
            text: content.to_string(),
            prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            finish_reason: choice["finish_reason"].as_str().unwrap_or("").to_string(),
            latency: Duration::ZERO,
            grammar_sent: false,
            requests: 0,
        })
    }
}

/// Whether an error body blames the `grammar` field: OpenAI-style `error.message`, or a
/// FastAPI-style `detail[].loc` naming it (the whole body would match any 422 that echoes
/// the request, grammar included).
fn names_grammar(bytes: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return String::from_utf8_lossy(bytes).to_lowercase().contains("grammar");
    };
    let message = v["error"]["message"].as_str().or(v["error"].as_str()).unwrap_or("");
    let in_detail = v["detail"].as_array().is_some_and(|d| {
        d.iter().any(|e| e["loc"].as_array().is_some_and(|l| l.iter().any(|p| p == "grammar")))
    });
    message.to_lowercase().contains("grammar") || in_detail
}

/// A URL (or a message holding one) without user info and query, which can carry
/// credentials: `https://user:key@host/v1?key=…` shows as `https://host/v1`.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        let end = rest.find(|c: char| c.is_whitespace() || c == '"').unwrap_or(rest.len());
        let (url, after) = rest.split_at(end);
        // User info ends at the last `@` before the query (a `/` typed inside a key must
        // not end it early); the host and path run from there to the query.
        let before_query = &url[..url.find(['?', '#']).unwrap_or(url.len())];
        let host_and_path = before_query.rsplit_once('@').map_or(before_query, |(_, h)| h);
        out.push_str(host_and_path);
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The start of a body, for messages: the server's `error.message` when it has one.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(v) = serde_json::from_str::<Value>(&text)
        && let Some(m) = v["error"]["message"].as_str().or(v["error"].as_str())
    {
        return m.chars().take(300).collect();
    }
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn credentials_in_urls_are_not_shown() {
        assert_eq!(redact("https://user:sk-1@api.example/v1?key=sk-2#x"), "https://api.example/v1");
        assert_eq!(
            redact("http://127.0.0.1:8080/v1/chat/completions"),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        assert_eq!(
            redact("error sending to http://u:p@h:1/v1?k=s: refused"),
            "error sending to http://h:1/v1 refused"
        );
        assert_eq!(redact("no url here"), "no url here");
        assert_eq!(redact("https://u:ab/cd@host/v1"), "https://host/v1");
    }
}
