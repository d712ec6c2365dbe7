//! A stand-in OpenAI chat-completions server for tests (feature `stand-in`): it answers
//! scripted replies in order (the last one repeats) and records every request, so the
//! loop's tests — `xpuctl ask`'s and xpud's — check exactly what was sent and what each
//! protocol edge case does without a model.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// One scripted answer of the stand-in.
#[derive(Clone)]
pub struct Scripted {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub delay: Duration,
}

pub fn reply(content: &str) -> Scripted {
    reply_full(content, "stop", 100, 20)
}

pub fn reply_full(
    content: &str,
    finish: &str,
    prompt_tokens: u64,
    completion_tokens: u64,
) -> Scripted {
    let body = json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    });
    Scripted {
        status: 200,
        headers: vec![],
        body: body.to_string().into_bytes(),
        delay: Duration::ZERO,
    }
}

pub fn status(code: u16, body: &str) -> Scripted {
    Scripted {
        status: code,
        headers: vec![],
        body: body.as_bytes().to_vec(),
        delay: Duration::ZERO,
    }
}

/// A stand-in chat-completions server: answers in script order (the last one repeats) and
/// records every request (headers and JSON body).
pub struct StandIn {
    pub url: String,
    requests: Arc<Mutex<Vec<(Vec<String>, Value)>>>,
}

impl StandIn {
    pub fn start(script: Vec<Scripted>) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut headers = Vec::new();
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    headers.push(line.trim_end().to_string());
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                seen.lock()
                    .unwrap()
                    .push((headers, serde_json::from_slice(&body).unwrap_or(Value::Null)));
                let s = script[i.min(script.len() - 1)].clone();
                std::thread::sleep(s.delay);
                let mut head = format!(
                    "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                    s.status,
                    s.body.len()
                );
                for (k, v) in &s.headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&s.body);
            }
        });
        StandIn { url, requests }
    }

    pub fn requests(&self) -> Vec<(Vec<String>, Value)> {
        self.requests.lock().unwrap().clone()
    }
}
