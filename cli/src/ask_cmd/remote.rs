//! `xpuctl ask` against xpud: `--from-server` asks the model the daemon's `[assistant]`
//! names (the data files are paths under the daemon's data roots; the daemon checks and
//! dry-runs every program and stores the ask), `--accept ID` makes a stored ask an example
//! for later prompts, `ask stats` shows the loop's figures, and `explain ASK_ID` the
//! conversation.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use serde_json::{Value, json};

use super::AskArgs;
use super::report::{AttemptView, attempt_line};
use crate::client::{Client, print_json, table};
use crate::{Format, Reported, UsageError};

/// Longest `ask --from-server` waits for the daemon's answer (its own `time_budget_s`
/// ends an ask well before).
const WAIT_LIMIT: Duration = Duration::from_secs(3600);

/// How often an ask refused 429 (the daemon's asks all busy) is sent again.
const BUSY_TRIES: u32 = 12;

/// Asks xpud and waits for the ask to end; exit 1 without a program (or when its run
/// failed).
pub(super) fn ask(client: &Client, args: &AskArgs, question: &str) -> Result<()> {
    let local_only = [
        ("--config", args.config.is_some()),
        ("--endpoint", args.endpoint.is_some()),
        ("--model", args.model.is_some()),
        ("--grammar", args.grammar.is_some()),
        ("--out", args.out.is_some()),
    ];
    if let Some((flag, _)) = local_only.iter().find(|(_, given)| *given) {
        return Err(anyhow!(UsageError(format!(
            "{flag} is for a local ask; with --from-server the daemon's [assistant] decides"
        ))));
    }
    let data: Vec<String> = args.data.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let body = json!({
        "question": question,
        "data": data,
        "policy": args.policy,
        "run": args.run,
        "allow_writes": args.allow_writes,
        "max_attempts": args.max_attempts,
    });
    // `limits.asks_at_once` asks are running: wait as the daemon says, a few times.
    let mut tries = 0;
    let (_, started) = loop {
        match client.post("/v1/asks", &body) {
            Err(e) if tries < BUSY_TRIES => match e.downcast_ref::<crate::client::Busy>() {
                Some(busy) => {
                    tries += 1;
                    eprintln!("{busy}; asking again in {} s", busy.retry_after.clamp(1, 60));
                    std::thread::sleep(Duration::from_secs(busy.retry_after.clamp(1, 60)));
                }
                None => return Err(e),
            },
            other => break other?,
        }
    };
    let id = started["ask_id"].as_str().ok_or_else(|| anyhow!("the daemon answered no ask id"))?;
    let until = Instant::now() + WAIT_LIMIT;
    let done = loop {
        let v = client.get(&format!("/v1/asks/{id}"))?;
        if v["status"] != "running" {
            break v;
        }
        anyhow::ensure!(Instant::now() < until, "ask {id} is still running after an hour");
        std::thread::sleep(Duration::from_millis(250));
    };
    let mut done = done;
    wait_for_run(client, &mut done, until)?;
    if let Some(path) = &args.save {
        std::fs::write(path, serde_json::to_vec_pretty(&done)?)?;
    }
    match args.format {
        Format::Json => print_json(&done),
        Format::Text => print_ask(client, &done, false),
    }
    let ran = done["run"].is_null() || done["run"]["status"] == "succeeded";
    if done["status"] == "accepted" && ran { Ok(()) } else { Err(Reported.into()) }
}

/// The run an ask started may outlast the daemon's wait (`limits.wait_timeout_s`): waits
/// for it (up to `until`) and puts its final status and outputs into the answer.
fn wait_for_run(client: &Client, done: &mut Value, until: Instant) -> Result<()> {
    let Some(run_id) = done["run"]["run_id"].as_str().map(str::to_string) else { return Ok(()) };
    while matches!(done["run"]["status"].as_str(), Some("queued" | "running")) {
        anyhow::ensure!(Instant::now() < until, "run {run_id} is still running after an hour");
        std::thread::sleep(Duration::from_millis(250));
        let run = client.get(&format!("/v1/runs/{run_id}"))?;
        done["run"]["status"] = run["status"].clone();
        done["run"]["error"] = run["error"].clone();
        done["run"]["outputs"] = run["outputs"].clone();
    }
    Ok(())
}

/// Where stored asks are: xpud's store, or a store directory read here (`--store DIR`).
pub(super) enum Keeper<'a> {
    Server(&'a Client),
    Store(&'a xpu_store::Store),
}

/// `xpuctl ask --accept ID`.
pub(super) fn accept(keeper: Keeper<'_>, id: &str, format: Format) -> Result<()> {
    let v = match keeper {
        Keeper::Server(client) => client.post(&format!("/v1/asks/{id}/accept"), &json!({}))?.1,
        Keeper::Store(store) => {
            use xpu_store::Accepted;
            match store.accept_ask(id, xpu_store::Scope::All)? {
                Accepted::Now { ask_id, newly } => json!({"ask_id": ask_id, "newly": newly}),
                Accepted::NotFound => anyhow::bail!("no ask (or run of an ask) {id} in the store"),
                Accepted::NoProgram { ask_id, outcome } => {
                    anyhow::bail!(
                        "ask {ask_id} ended without a program ({outcome}): nothing to accept"
                    )
                }
            }
        }
    };
    match format {
        Format::Json => print_json(&v),
        Format::Text if v["newly"] == true => {
            println!(
                "{}: accepted; later prompts may show it as an example",
                v["ask_id"].as_str().unwrap_or(id)
            );
        }
        Format::Text => println!("{}: was accepted already", v["ask_id"].as_str().unwrap_or(id)),
    }
    Ok(())
}

/// `xpuctl ask stats`: per model and day, the share of first replies that parsed, checked
/// and ran, the share answered after feedback, attempts and tokens per answer.
pub(super) fn stats(keeper: Keeper<'_>, days: Option<u32>, format: Format) -> Result<()> {
    let since = match days {
        Some(d) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            Some(now.as_micros() as i64 - i64::from(d) * 86_400_000_000)
        }
        None => None,
    };
    let v = match keeper {
        Keeper::Server(client) => {
            let query: Vec<(&str, String)> =
                since.iter().map(|s| ("since_us", s.to_string())).collect();
            client.get_query("/v1/asks/stats", &query)?
        }
        Keeper::Store(store) => {
            serde_json::to_value(store.ask_stats(xpu_store::Scope::All, since)?)?
        }
    };
    if format == Format::Json {
        print_json(&v);
        return Ok(());
    }
    let share = |x: &Value| x.as_f64().map_or("-".into(), |f| format!("{:.0}%", f * 100.0));
    let mean = |x: &Value| x.as_f64().map_or("-".into(), |f| format!("{f:.1}"));
    let mut t = table(&[
        "day",
        "model",
        "asks",
        "1st parse",
        "1st check",
        "1st run",
        "answered",
        "attempts/answer",
        "tokens/answer",
    ]);
    for r in v.as_array().into_iter().flatten() {
        t.add_row(vec![
            r["day"].as_str().unwrap_or("").to_string(),
            r["model"].as_str().unwrap_or("").to_string(),
            r["asks"].to_string(),
            share(&r["first_parse"]),
            share(&r["first_check"]),
            share(&r["first_run"]),
            share(&r["answered"]),
            mean(&r["attempts_per_answer"]),
            mean(&r["tokens_per_answer"]),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// `xpuctl explain ASK_ID`: the conversation — every message the model got, its reply and
/// why each attempt failed.
pub fn explain(client: &Client, id: &str, format: Format) -> Result<()> {
    let v = client.get(&format!("/v1/asks/{id}"))?;
    match format {
        Format::Json => print_json(&v),
        Format::Text => print_ask(client, &v, true),
    }
    Ok(())
}

fn view(a: &Value) -> AttemptView {
    let first = &a["findings"][0];
    AttemptView {
        n: a["n"].as_u64().unwrap_or(0),
        failed: a["failed_at"].as_str().map(|stage| {
            (
                stage.replace('_', " "),
                first["code"].as_str().unwrap_or("").to_string(),
                first["message"].as_str().unwrap_or("").to_string(),
                first["line"].as_u64(),
            )
        }),
        tokens: a["prompt_tokens"].as_u64().unwrap_or(0)
            + a["completion_tokens"].as_u64().unwrap_or(0),
        latency_ms: a["latency_ms"].as_u64().unwrap_or(0),
        grammar: a["grammar_sent"] == true,
    }
}

/// An ask on a terminal; `conversation` adds each message and reply.
fn print_ask(client: &Client, v: &Value, conversation: bool) {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    println!("ask {}: {:?}", s("ask_id"), s("question"));
    for a in v["attempts"].as_array().into_iter().flatten() {
        println!("{}", attempt_line(&view(a)));
        if conversation {
            println!("  asked:\n{}", indent(a["asked"].as_str().unwrap_or("")));
            println!("  reply:\n{}", indent(a["reply"].as_str().unwrap_or("")));
            for f in a["findings"].as_array().into_iter().flatten() {
                let at = f["line"].as_u64().map(|l| format!(" at line {l}")).unwrap_or_default();
                println!(
                    "  {} {}{at}: {}",
                    f["stage"].as_str().unwrap_or(""),
                    f["code"].as_str().unwrap_or(""),
                    f["message"].as_str().unwrap_or("")
                );
            }
        }
    }
    for note in v["notes"].as_array().into_iter().flatten() {
        println!("note: {}", note.as_str().unwrap_or(""));
    }
    match v["program"].as_str() {
        Some(p) => println!("\n{}", p.trim_end()),
        None => println!("\nno program: {}", s("error")),
    }
    let examples: Vec<&str> =
        v["examples"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    println!(
        "\n{}: {} attempt(s), {} tokens, {:.1} s, model {}{}{}",
        s("status").replace('_', " "),
        v["attempts"].as_array().map_or(0, Vec::len),
        v["tokens"].as_u64().unwrap_or(0),
        v["elapsed_ms"].as_f64().unwrap_or(0.0) / 1e3,
        s("model"),
        if examples.is_empty() {
            String::new()
        } else {
            format!(", examples {}", examples.join(" "))
        },
        if v["accepted"] == true { ", accepted as an example" } else { "" },
    );
    let run = &v["run"];
    if let Some(why) = run["refused"].as_str() {
        println!("\nnot run: {why}");
    } else if let Some(id) = run["run_id"].as_str() {
        println!("\nrun {id}: {}", run["status"].as_str().unwrap_or("running"));
        print_outputs(client, id, run);
    }
}

/// The run's printed values (MiniLang's `print` outputs, `print_N`), fetched as CSV or
/// JSON.
fn print_outputs(client: &Client, run_id: &str, run: &Value) {
    for o in run["outputs"].as_array().into_iter().flatten() {
        let name = o["name"].as_str().unwrap_or("");
        if !name.starts_with("print_") {
            continue;
        }
        let fmt = if o["dtype"] == "table" { "csv" } else { "json" };
        match client.get_bytes(&format!("/v1/runs/{run_id}/outputs/{name}?format={fmt}")) {
            Ok(bytes) => println!("{}", String::from_utf8_lossy(&bytes).trim_end()),
            Err(e) => println!("{name}: {e}"),
        }
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}
