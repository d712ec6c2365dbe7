//! `xpu-bench daemon URL CONCURRENCY SECONDS [BODY.json]`: a closed-loop load generator for
//! xpud. Each of CONCURRENCY threads keeps one keep-alive connection and submits a job with
//! `wait` (a tiny MiniLang job, or the submit body in BODY.json), back to back, for SECONDS. The server's own account of each request comes from
//! its `Server-Timing` header (total, queue, run); the overhead is total − run − queue, the
//! time the server spent on the request itself (parse, compile, plan, store, respond).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const JOB: &str = "let x = [1.0, 2.0, 3.0]\nprint sum(x * 2.0)\n";

/// The overhead's steps xpud reports in `Server-Timing` besides total, queue and run.
const STEPS: [&str; 5] = ["prepare", "files", "plan", "outputs", "store"];

/// One request's server-side timings, in microseconds.
struct Sample {
    overhead_us: f64,
    queue_us: f64,
    client_us: f64,
    /// [`STEPS`], in order (0 when the server did not report one).
    steps_us: [f64; STEPS.len()],
}

fn timing(header: &str, name: &str) -> Option<f64> {
    header.split(',').find_map(|part| {
        let mut it = part.trim().split(';');
        (it.next()? == name)
            .then(|| it.find_map(|kv| kv.trim().strip_prefix("dur=")?.parse::<f64>().ok()))?
    })
}

fn worker(url: &str, token: Option<&str>, until: Instant, body: &[u8]) -> Result<Vec<Sample>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut samples = Vec::new();
    while Instant::now() < until {
        let start = Instant::now();
        let mut req =
            agent.post(&format!("{url}/v1/jobs")).header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let mut resp = req.send(body).context("submit")?;
        let status = resp.status().as_u16();
        let header = resp
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let text = resp.body_mut().read_to_string().context("reading the answer")?;
        let client_us = start.elapsed().as_secs_f64() * 1e6;
        if status != 200 {
            bail!("submit answered {status}: {text}");
        }
        let ms = |name| timing(&header, name).map(|v| v * 1e3);
        let (Some(total), Some(queue), Some(run)) = (ms("total"), ms("queue"), ms("run")) else {
            bail!("no Server-Timing in the answer: {header:?}");
        };
        samples.push(Sample {
            overhead_us: (total - run - queue).max(0.0),
            queue_us: queue,
            client_us,
            steps_us: STEPS.map(|name| ms(name).unwrap_or(0.0)),
        });
    }
    Ok(samples)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs the load and prints one JSON object: jobs/s and overhead percentiles.
pub fn run(url: &str, concurrency: usize, seconds: f64, body: Option<Vec<u8>>) -> Result<()> {
    let body = match body {
        Some(b) => b,
        None => serde_json::to_vec(
            &serde_json::json!({"program": {"name": "tiny.ml", "source": JOB}, "wait": true}),
        )?,
    };
    let token = std::env::var("XPU_TOKEN").ok();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let results: Vec<Result<Vec<Sample>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..concurrency)
            .map(|_| s.spawn(|| worker(url, token.as_deref(), until, &body)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| bail!("worker panicked"))).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut samples = Vec::new();
    for r in results {
        samples.extend(r?);
    }
    let mut overhead: Vec<f64> = samples.iter().map(|s| s.overhead_us).collect();
    let mut queue: Vec<f64> = samples.iter().map(|s| s.queue_us).collect();
    let mut client: Vec<f64> = samples.iter().map(|s| s.client_us).collect();
    for v in [&mut overhead, &mut queue, &mut client] {
        v.sort_by(f64::total_cmp);
    }
    let p = |v: &[f64]| serde_json::json!({"p50": percentile(v, 0.5), "p90": percentile(v, 0.9), "p99": percentile(v, 0.99)});
    // Where the overhead goes: each step's median (the rest is hand-offs between threads,
    // HTTP and JSON).
    let mut steps = serde_json::Map::new();
    for (i, name) in STEPS.iter().enumerate() {
        let mut v: Vec<f64> = samples.iter().map(|s| s.steps_us[i]).collect();
        v.sort_by(f64::total_cmp);
        steps.insert(name.to_string(), serde_json::json!(percentile(&v, 0.5)));
    }
    println!(
        "{}",
        serde_json::json!({
            "concurrency": concurrency,
            "jobs": samples.len(),
            "seconds": elapsed,
            "jobs_per_s": samples.len() as f64 / elapsed,
            "overhead_us": p(&overhead),
            "queue_us": p(&queue),
            "client_latency_us": p(&client),
            "steps_p50_us": steps,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn server_timing_is_read_by_name() {
        let h = "total;dur=0.250, queue;dur=0.010, run;dur=0.100";
        assert_eq!(super::timing(h, "queue"), Some(0.010));
        assert_eq!(super::timing(h, "run"), Some(0.1));
        assert_eq!(super::timing(h, "nope"), None);
        assert_eq!(super::timing("garbage;;,", "total"), None);
    }
}
