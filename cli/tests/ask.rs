//! `xpuctl ask` against a local stand-in that speaks the OpenAI chat-completions protocol
//! with scripted replies: the feedback loop (diagnostics back to the model until a program
//! passes), the dry run on a sample, the limits, and the protocol's edge cases (429 with
//! Retry-After, 5xx, a refused grammar, a reply cut off at max_tokens, a body that is not
//! UTF-8, an endpoint that is down). `ask_llama.rs` runs the real llama.cpp server.

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use xpu_assistant::stand_in::{Scripted, StandIn, reply, reply_full, status};

/// A working directory with a small table.
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("people.csv"),
        "Name,City,Age,Fare\nAnna,Oslo,34,71.5\nBo,Lund,19,8.0\nCleo,Oslo,52,30.25\nDag,Bergen,41,12.0\n",
    )
    .unwrap();
    dir
}

/// Runs `xpuctl ask` in `dir` with no XPU_ASK_* from the environment.
fn ask(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .current_dir(dir)
        .arg("ask")
        .args(args)
        .env_remove("XPU_ASK_ENDPOINT")
        .env_remove("XPU_ASK_MODEL")
        .env_remove("XPU_ASK_API_KEY_ENV")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ask_json(dir: &Path, server: &StandIn, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["--endpoint", &server.url, "--model", "stand-in", "--format", "json"];
    args.extend_from_slice(extra);
    let (code, out, err) = ask(dir, &args);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    (code, v, err)
}

#[test]
fn without_an_endpoint_ask_says_how_to_configure_one() {
    let dir = workdir();
    let (code, _, err) = ask(dir.path(), &["how many people live in Oslo?"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--endpoint")
            && err.contains("XPU_ASK_ENDPOINT")
            && err.contains("[assistant]"),
        "{err}"
    );
}

#[test]
fn diagnostics_go_back_until_the_program_runs() {
    let dir = workdir();
    let server = StandIn::start(vec![
        reply("print load_csv(\"people.csv\") |> filter(Agee > 30)"),
        reply("print load_csv(\"people.csv\") |> filter(Age > 30) |> select([\"Name\"])\n"),
    ]);
    let (code, v, err) = ask_json(
        dir.path(),
        &server,
        &["people over 30", "--data", "people.csv", "--run", "--out", "results"],
    );
    assert_eq!(code, 0, "{v:#}\n{err}");
    assert_eq!(v["outcome"], "accepted");
    let attempts = v["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    let first = &attempts[0]["verdict"]["findings"][0];
    assert_eq!(
        (first["stage"].as_str(), first["code"].as_str()),
        (Some("check"), Some("E0208")),
        "{first}"
    );
    assert!(attempts[1]["verdict"]["dry_run"].as_str().unwrap().contains("Cleo"), "{v:#}");
    assert!(v["program"].as_str().unwrap().starts_with("print load_csv"));
    // The accepted program ran on the full data (its table printed to out/, as `run` does).
    assert_eq!(v["run"]["exit_code"], 0, "{v:#}");
    let printed = std::fs::read_to_string(dir.path().join("results/print_0.csv")).unwrap();
    assert_eq!(printed.lines().collect::<Vec<_>>(), ["Name", "Anna", "Cleo", "Dag"], "{printed}");

    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let system = reqs[0].1["messages"][0]["content"].as_str().unwrap();
    // The reference comes from the builtin table, the schema from the table engine's reader,
    // and the sample rows from the file.
    assert!(system.contains("load_csv(path: string"), "{system}");
    assert!(
        system.contains(
            "\"people.csv\" (table) columns: Name: string, City: string, Age: i64, Fare: f64"
        ),
        "{system}"
    );
    assert!(
        system.contains("Anna | Oslo | 34 | 71.5") && !system.contains("Dag"),
        "send_rows is 3: {system}"
    );
    assert!(reqs[0].1["grammar"].as_str().unwrap().contains("root ::= program"));
    // The second request carries the first reply and its diagnostics, did-you-mean included.
    let msgs = reqs[1].1["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 4);
    let feedback = msgs[3]["content"].as_str().unwrap();
    assert!(feedback.contains("E0208") && feedback.contains("Age"), "{feedback}");
}

#[test]
fn a_dry_run_past_its_limit_is_killed_and_reported() {
    let dir = workdir();
    std::fs::write(dir.path().join("ask.toml"), "[assistant]\ndry_run_s = 0.3\nmax_attempts = 1\n")
        .unwrap();
    // Lowers fine, but the product takes seconds: the dry run is stopped.
    let slow = "let a = randn([3000, 3000], seed=1)\nprint sum(a @ a @ a @ a)";
    let server = StandIn::start(vec![reply(slow)]);
    let (code, v, _) = ask_json(dir.path(), &server, &["something slow", "--config", "ask.toml"]);
    assert_eq!(code, 1);
    assert_eq!(v["outcome"], "out_of_attempts");
    let f = &v["attempts"][0]["verdict"]["findings"][0];
    assert_eq!(
        (f["stage"].as_str(), f["code"].as_str()),
        (Some("dry_run"), Some("timeout")),
        "{v:#}"
    );
}

#[test]
fn limits_end_the_loop_with_a_clear_outcome() {
    let dir = workdir();
    // Attempts: always wrong.
    let server = StandIn::start(vec![reply("print nosuch")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--max-attempts", "2"]);
    assert_eq!((code, v["outcome"].as_str()), (1, Some("out_of_attempts")));
    assert_eq!(v["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(server.requests().len(), 2);
    // Tokens: one reply spends more than the budget leaves for another.
    std::fs::write(dir.path().join("ask.toml"), "[assistant]\ntoken_budget = 3000\n").unwrap();
    let server = StandIn::start(vec![reply_full("print nosuch", "stop", 2500, 100)]);
    let (_, v, _) = ask_json(dir.path(), &server, &["q", "--config", "ask.toml"]);
    assert_eq!(v["outcome"], "out_of_tokens", "{v:#}");
    assert_eq!((v["attempts"].as_array().unwrap().len(), v["tokens"].as_u64()), (1, Some(2600)));
    // Time: a request slower than its timeout.
    std::fs::write(dir.path().join("ask.toml"), "[assistant]\ntimeout_s = 0.3\n").unwrap();
    let mut slow = reply("print 1");
    slow.delay = Duration::from_millis(1500);
    let server = StandIn::start(vec![slow]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--config", "ask.toml"]);
    assert_eq!((code, v["outcome"].as_str()), (1, Some("endpoint_failed")));
    assert!(v["error"].as_str().unwrap().contains("timed out"), "{v:#}");
}

#[test]
fn rate_limits_and_server_errors_are_retried_then_reported() {
    let dir = workdir();
    let mut limited = status(429, "{\"error\": {\"message\": \"slow down\"}}");
    limited.headers.push(("Retry-After", "0.1".into()));
    let server = StandIn::start(vec![limited, reply("print 1 + 1")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["attempts"][0]["requests"], 2);
    let dry = v["attempts"][0]["verdict"]["dry_run"].as_str().unwrap();
    assert_eq!(dry.lines().next(), Some("2"), "{dry}");

    let server = StandIn::start(vec![status(503, "{\"error\": {\"message\": \"loading model\"}}")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q"]);
    assert_eq!((code, v["outcome"].as_str()), (1, Some("endpoint_failed")));
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains("503") && error.contains("loading model") && error.contains("3 request"),
        "{error}"
    );
}

#[test]
fn protocol_edge_cases_are_named() {
    let dir = workdir();
    // A reply cut off at max_tokens is a failed attempt that says so.
    let server = StandIn::start(vec![
        reply_full("print load_csv(\"peo", "length", 10, 512),
        reply("print 2"),
    ]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q"]);
    assert_eq!(code, 0);
    assert_eq!(v["attempts"][0]["verdict"]["findings"][0]["code"], "cut_off");
    let feedback = server.requests()[1].1["messages"][3]["content"].as_str().unwrap().to_string();
    assert!(feedback.contains("cut off"), "{feedback}");
    // A body that is not UTF-8.
    let server = StandIn::start(vec![Scripted {
        status: 200,
        headers: vec![],
        body: vec![b'{', 0xff, 0xfe],
        delay: Duration::ZERO,
    }]);
    let (_, v, _) = ask_json(dir.path(), &server, &["q"]);
    assert!(v["error"].as_str().unwrap().contains("not UTF-8"), "{v:#}");
    // Garbage bodies: deeply nested, not JSON, JSON without the answer, over 16 MiB.
    for (body, want) in [
        ("[".repeat(100_000).into_bytes(), "not JSON"),
        (b"<html>busy</html>".to_vec(), "not JSON"),
        (b"{\"choices\": []}".to_vec(), "no choices[0].message.content"),
        (vec![b' '; 17 << 20], "reading the reply"),
    ] {
        let server = StandIn::start(vec![Scripted {
            status: 200,
            headers: vec![],
            body,
            delay: Duration::ZERO,
        }]);
        let (code, v, _) = ask_json(dir.path(), &server, &["q"]);
        assert_eq!((code, v["outcome"].as_str()), (1, Some("endpoint_failed")), "{want}");
        assert!(v["error"].as_str().unwrap().contains(want), "{want}: {}", v["error"]);
    }
    // A megabyte of nonsense as the program: diagnostics, bounded, and the loop goes on.
    let nonsense: String =
        (0..200_000).map(|i| ["let", "(", "]", "x", "\"", "|>", "\n"][i % 7]).collect();
    let server = StandIn::start(vec![reply(&nonsense), reply("print 4")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q"]);
    assert_eq!(code, 0, "{}", v["error"]);
    assert!(v["attempts"][0]["verdict"]["findings"].as_array().unwrap().len() <= 50);
    // An endpoint that refuses the grammar field is asked again without it.
    let server = StandIn::start(vec![
        status(
            400,
            "{\"error\": {\"message\": \"Unrecognized request argument supplied: grammar\"}}",
        ),
        // Prose and a fence, as endpoints without the grammar answer.
        reply("Here it is:\n```minilang\nprint 3\n```\nIt prints 3."),
    ]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["program"], "print 3\n");
    assert!(v["notes"][0].as_str().unwrap().contains("refused the grammar"), "{v:#}");
    assert_eq!(v["grammar_used"], false);
    let reqs = server.requests();
    assert!(reqs[0].1.get("grammar").is_some() && reqs[1].1.get("grammar").is_none());
    // --grammar always does not fall back.
    let server =
        StandIn::start(vec![status(400, "{\"error\": {\"message\": \"unknown field grammar\"}}")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--grammar", "always"]);
    assert_eq!((code, v["outcome"].as_str()), (1, Some("endpoint_failed")), "{v:#}");
    // An endpoint that is down.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let (code, out, err) = ask(dir.path(), &["q", "--endpoint", &url, "--model", "m"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("endpoint failed") && out.contains(&format!("127.0.0.1:{port}")), "{out}");
}

#[test]
fn the_api_key_is_sent_and_never_written() {
    let dir = workdir();
    std::fs::write(
        dir.path().join("ask.toml"),
        "[assistant]\napi_key_env = \"XPU_TEST_ASK_KEY\"\n",
    )
    .unwrap();
    let server = StandIn::start(vec![reply("print 1")]);
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .current_dir(dir.path())
        .args([
            "ask",
            "q",
            "--config",
            "ask.toml",
            "--endpoint",
            &server.url,
            "--model",
            "m",
            "--save",
            "answer.json",
        ])
        .env("XPU_TEST_ASK_KEY", "sk-very-secret")
        .env_remove("XPU_ASK_API_KEY_ENV")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("sk-very-secret"));
    let headers = &server.requests()[0].0;
    assert!(
        headers.iter().any(|h| h.eq_ignore_ascii_case("authorization: Bearer sk-very-secret")),
        "{headers:?}"
    );
    let saved = std::fs::read_to_string(dir.path().join("answer.json")).unwrap();
    assert!(
        !saved.contains("sk-very-secret")
            && !String::from_utf8_lossy(&out.stdout).contains("sk-very-secret")
    );
    // A variable that is not set is a configuration error naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .current_dir(dir.path())
        .args(["ask", "q", "--config", "ask.toml", "--endpoint", &server.url, "--model", "m"])
        .env_remove("XPU_TEST_ASK_KEY")
        .env_remove("XPU_ASK_API_KEY_ENV")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("XPU_TEST_ASK_KEY is not set"));
}

#[test]
fn bad_configuration_names_the_field() {
    let dir = workdir();
    for (toml, want) in [
        ("[assistant]\nmax_attempts = 0\n", "max_attempts"),
        ("[assistant]\nendpoint = \"ftp://x\"\n", "endpoint"),
        ("[assistant]\nmax_tokens = 1\n", "max_tokens"),
        ("[assistant]\nno_such_key = 1\n", "no_such_key"),
        ("[assistant\n", "ask.toml"),
    ] {
        std::fs::write(dir.path().join("ask.toml"), toml).unwrap();
        let (code, _, err) = ask(
            dir.path(),
            &["q", "--config", "ask.toml", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"],
        );
        assert!(code == 2 && err.contains(want), "{toml}: {code} {err}");
    }
}

#[test]
fn grammar_and_reference_come_from_the_language() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_xpuctl")).args(["minilang", "grammar"]).output().unwrap();
    let gbnf = String::from_utf8(out.stdout).unwrap();
    assert!(gbnf.contains("root ::= program") && gbnf.contains("stmt ::="));
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["minilang", "grammar", "--format", "lark"])
        .output()
        .unwrap();
    assert!(String::from_utf8(out.stdout).unwrap().contains("program:"));
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["minilang", "reference"])
        .output()
        .unwrap();
    let reference = String::from_utf8(out.stdout).unwrap();
    // Every builtin of the checker's table, with its signature and example.
    for b in xpu_minilang::builtins::BUILTINS {
        assert!(reference.contains(&format!("- {}: {}", b.signature(), b.summary)), "{}", b.name);
    }
}

/// `xpuctl repl` in `dir` fed `input`, its endpoint the stand-in: what it printed.
fn repl(dir: &Path, server: &StandIn, input: &str) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .current_dir(dir)
        .arg("repl")
        .env("XPU_ASK_ENDPOINT", &server.url)
        .env("XPU_ASK_MODEL", "stand-in")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn repl_ask_shows_but_does_not_run_a_program_that_writes() {
    let dir = workdir();
    let before = std::fs::read(dir.path().join("people.csv")).unwrap();
    let server = StandIn::start(vec![reply(
        "load_csv(\"people.csv\") |> head(n=1) |> write_csv(\"people.csv\")",
    )]);
    let text =
        repl(dir.path(), &server, "let t = load_csv(\"people.csv\")\n:ask keep the first row\n");
    assert!(text.contains("not run: it writes files (people.csv)"), "{text}");
    assert_eq!(std::fs::read(dir.path().join("people.csv")).unwrap(), before);
}

#[test]
fn repl_ask_uses_the_sessions_files_and_runs_the_answer() {
    let dir = workdir();
    let server = StandIn::start(vec![reply(
        "print load_csv(\"people.csv\") |> filter(City == \"Oslo\") |> agg(n = count())",
    )]);
    let text = repl(
        dir.path(),
        &server,
        "let t = load_csv(\"people.csv\")\n:ask how many people live in Oslo?\n",
    );
    assert!(text.contains("attempt 1: passed"), "{text}");
    assert!(text.contains("filter(City == \"Oslo\")"), "the program is shown: {text}");
    assert!(text.lines().any(|l| l.trim_end().ends_with(" 2")), "and run in the session: {text}");
    let system = server.requests()[0].1["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(system.contains("\"people.csv\" (table) columns: Name"), "{system}");
}

#[test]
fn the_time_budget_ends_the_ask() {
    let dir = workdir();
    std::fs::write(
        dir.path().join("ask.toml"),
        "[assistant]\ntime_budget_s = 2.0\nmax_attempts = 20\n",
    )
    .unwrap();
    let mut slow = reply("print nosuch");
    slow.delay = Duration::from_millis(300);
    let server = StandIn::start(vec![slow]);
    let started = std::time::Instant::now();
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--config", "ask.toml"]);
    assert_eq!((code, v["outcome"].as_str()), (1, Some("out_of_time")), "{v:#}");
    assert!(v["error"].as_str().unwrap().contains("time_budget_s"), "{v:#}");
    let n = v["attempts"].as_array().unwrap().len();
    assert!((1..20).contains(&n), "{n} attempts");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

#[test]
fn data_paths_stay_inside_the_working_directory() {
    let dir = workdir();
    let before = std::fs::read(dir.path().join("people.csv")).unwrap();
    // An absolute path inside the working directory is named relative to it, and the file
    // itself is never touched by the dry run's sample.
    let abs = dir.path().join("people.csv").canonicalize().unwrap();
    let server = StandIn::start(vec![reply("print load_csv(\"people.csv\") |> head(n=1)")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--data", abs.to_str().unwrap()]);
    assert_eq!(code, 0, "{v:#}");
    let system = server.requests()[0].1["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(system.contains("- \"people.csv\" (table)"), "{system}");
    assert_eq!(std::fs::read(dir.path().join("people.csv")).unwrap(), before);
    // Outside it: a usage error naming the path.
    let (code, _, err) = ask(
        dir.path(),
        &["q", "--data", "/etc/passwd", "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/etc/passwd"), "{err}");
}

#[test]
fn a_sample_is_the_files_own_prefix() {
    // Another separator and quoting survive: the sample is the file's first records, byte
    // for byte, so the program that reads the file reads the sample the same way.
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from("\"Name\";\"Note\"\n");
    for i in 0..300 {
        csv.push_str(&format!("\"p{i}\";\"a;b\"\n"));
    }
    std::fs::write(dir.path().join("semi.csv"), csv).unwrap();
    let program =
        "print load_csv(\"semi.csv\", sep=\";\") |> filter(Note == \"a;b\") |> agg(n = count())";
    let server = StandIn::start(vec![reply(program)]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--data", "semi.csv"]);
    assert_eq!(code, 0, "{v:#}");
    assert!(v["attempts"][0]["verdict"]["dry_run"].as_str().unwrap().contains("200"), "{v:#}");
}

#[test]
fn a_sample_keeps_quoted_newlines_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from("Name,Note\n");
    for i in 0..300 {
        csv.push_str(&format!("p{i},\"line one\nline two\"\n"));
    }
    std::fs::write(dir.path().join("notes.csv"), csv).unwrap();
    let server = StandIn::start(vec![reply("print load_csv(\"notes.csv\") |> agg(n = count())")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--data", "notes.csv"]);
    assert_eq!(code, 0, "{v:#}");
    // dry_run_rows (200) records, each with its quoted newline.
    assert!(v["attempts"][0]["verdict"]["dry_run"].as_str().unwrap().contains("200"), "{v:#}");
}

#[test]
fn run_writes_files_only_when_allowed() {
    let dir = workdir();
    let program = "load_csv(\"people.csv\") |> head(n=1) |> write_csv(\"people.csv\")";
    let server = StandIn::start(vec![reply(program)]);
    let before = std::fs::read(dir.path().join("people.csv")).unwrap();
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--data", "people.csv", "--run"]);
    assert_eq!(code, 1, "{v:#}");
    // The files it writes, as lowering found them (not the builtins' names).
    assert!(v["run"]["refused"].as_str().unwrap().contains("writes files (people.csv)"), "{v:#}");
    assert_eq!(std::fs::read(dir.path().join("people.csv")).unwrap(), before);
    let server = StandIn::start(vec![reply(program)]);
    let (code, v, _) =
        ask_json(dir.path(), &server, &["q", "--data", "people.csv", "--run", "--allow-writes"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(std::fs::read_to_string(dir.path().join("people.csv")).unwrap().lines().count(), 2);
    // Without --out the run's own outputs go to a scratch directory, not ./out.
    assert!(!dir.path().join("out").exists());
}

#[test]
fn a_workbook_is_described_with_its_sheets() {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    std::fs::copy(examples.join("sales.xlsx"), dir.path().join("sales.xlsx")).unwrap();
    let server =
        StandIn::start(vec![reply("print load_xlsx(\"sales.xlsx\", sheet=\"*\") |> head(n=2)")]);
    let (code, v, _) = ask_json(dir.path(), &server, &["q", "--data", "sales.xlsx"]);
    assert_eq!(code, 0, "{v:#}");
    let system = server.requests()[0].1["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(
        system.contains("\"sales.xlsx\" (table; sheets \"Q1\", \"Q2\", \"Q3\", \"Q4\", load_xlsx reads the first"),
        "{system}"
    );
}

#[test]
fn a_local_store_keeps_asks_and_learns_from_accepted_ones() {
    let dir = workdir();
    let over_30 = "print load_csv(\"people.csv\") |> filter(Age > 30) |> select([\"Name\"])\n";
    let server = StandIn::start(vec![
        reply("print load_csv(\"people.csv\") |> filter(Agee > 30)"),
        reply(over_30),
        reply("print load_csv(\"people.csv\") |> filter(Age > 40) |> select([\"Name\"])\n"),
    ]);
    let (code, v, err) = ask_json(
        dir.path(),
        &server,
        &["people over 30", "--data", "people.csv", "--store", "asks"],
    );
    assert_eq!(code, 0, "{v:#}\n{err}");
    let id = v["ask_id"].as_str().expect("stored").to_string();
    assert!(id.starts_with("ask-"), "{id}");
    // Not an example until accepted; then a similar question's prompt shows it.
    let (code, out, err) = ask(dir.path(), &["--accept", &id, "--store", "asks"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("accepted"), "{out}");
    let (code, v, _) = ask_json(
        dir.path(),
        &server,
        &["people over 40", "--data", "people.csv", "--store", "asks"],
    );
    assert_eq!((code, v["examples"][0].as_str()), (0, Some(id.as_str())), "{v:#}");
    let system = server.requests()[2].1["messages"][0]["content"].as_str().unwrap().to_string();
    assert!(system.contains("people over 30") && system.contains("filter(Age > 30)"), "{system}");
    // The loop's figures and the conversation come from the same directory.
    let (code, out, err) = ask(dir.path(), &["stats", "--store", "asks", "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let stats: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((stats[0]["asks"].as_u64(), stats[0]["first_check"].as_f64()), (Some(2), Some(0.5)));
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .current_dir(dir.path())
        .args(["explain", &id, "--store", "asks"])
        .output()
        .unwrap();
    let kept: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(kept["record"]["attempts"][0]["failed_at"], "check", "{kept:#}");
    assert_eq!(kept["accepted"], true);
    // Asking xpud and keeping a local store do not mix.
    let (code, _, err) = ask(dir.path(), &["q", "--from-server", "--store", "asks"]);
    assert_eq!(code, 2, "{err}");
}
